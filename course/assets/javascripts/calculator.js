/* Memory calculator: bytes per GPU by category.
 *
 * The compute half (mmMemory) mirrors minimega.estimate.memory_per_gpu term by term; the test suite
 * runs it under Node on random configurations and requires the Python numbers to 1e-9 relative.
 * The page half draws the form, the table and a plotly chart; it starts from document$ because
 * instant navigation swaps pages without re-running scripts.
 */
(function (root) {
  "use strict";

  var PRECISIONS = ["mixed", "bf16", "fp16", "fp32"];
  var RECOMPUTE = ["none", "selective", "full"];
  var SCHEDULES = ["gpipe", "1f1b", "interleaved"];
  var OFFLOAD = ["none", "optimizer", "optimizer+params"];
  var ATTENTION = ["unfused", "fused"];
  var PP_PARTITION = ["blocks", "blocks+embedding"];
  var BOOLS = ["sp", "position_embedding", "fp32_grads"];
  var INTS = ["layers", "hidden", "heads", "vocab", "seq_len", "micro_batch", "tp", "dp", "pp",
              "micro_batches", "virtual_stages"];
  var DEFAULTS = {micro_batch: 1, precision: "mixed", zero_stage: 0, tp: 1, dp: 1, pp: 1, sp: false,
                  recompute: "none", schedule: "1f1b", micro_batches: 1, virtual_stages: 1, offload: "none",
                  attention: "unfused", position_embedding: true, fp32_grads: false, pp_partition: "blocks"};

  function stateBytesPerParam(precision) {          // estimate.state_bytes_per_param
    if (precision === "mixed" || precision === "bf16" || precision === "fp16") return [2, 2, 12];
    if (precision === "fp32") return [4, 4, 8];
    throw new Error("precision " + precision + ": expected one of " + PRECISIONS.join(", "));
  }

  function modelStateBreakdown(n, dp, stage, precision, gradBytes) {   // estimate.model_state_breakdown
    var b = stateBytesPerParam(precision);
    var g = gradBytes === undefined || gradBytes === null ? b[1] : gradBytes;
    return {
      params: b[0] * n / (stage >= 3 ? dp : 1),
      grads: g * n / (stage >= 2 ? dp : 1),
      optimizer: b[2] * n / (stage >= 1 ? dp : 1)
    };
  }

  function activationBytesPerLayer(s, b, h, a, t, sp, recompute, attention, actBytes, maskBytes) {
    var sbh = s * b * h;                             // estimate.activation_bytes_per_layer
    if (recompute === "full") return actBytes * sbh / (sp ? t : 1);
    var whole = sbh * (4 * actBytes + 2 * maskBytes) / (sp ? t : 1);
    var split = sbh * 12 * actBytes / t;
    var core;
    if (recompute === "selective") core = 0;
    else if (attention === "fused") core = 4 * a * s * b / t;
    else core = a * s * s * b * (2 * actBytes + maskBytes) / t;
    return whole + split + core;
  }

  function recomputeWorkingBytes(s, b, h, a, t, sp, recompute, attention, actBytes, maskBytes) {
    if (recompute === "none") return 0;              // estimate.recompute_working_bytes
    var full = activationBytesPerLayer(s, b, h, a, t, sp, "none", attention, actBytes, maskBytes);
    if (recompute === "full") return full;
    return full - activationBytesPerLayer(s, b, h, a, t, sp, "selective", attention, actBytes, maskBytes);
  }

  function inFlightMicrobatches(p, m, schedule, v) {  // estimate.in_flight_microbatches
    if (schedule === "gpipe") return m;
    if (schedule === "1f1b") return Math.min(p, m);
    if (schedule === "interleaved") return Math.min(p, m) * (1 + (p - 1) / (p * v));
    throw new Error("schedule " + schedule + ": expected one of " + SCHEDULES.join(", "));
  }

  function check(cfg) {                               // estimate.MemoryConfig.check
    INTS.forEach(function (k) {
      if (!(Number.isInteger(cfg[k]) && cfg[k] >= 1)) throw new Error(k + " = " + cfg[k] + ": expected an integer >= 1");
    });
    if (PRECISIONS.indexOf(cfg.precision) < 0 || RECOMPUTE.indexOf(cfg.recompute) < 0 ||
        SCHEDULES.indexOf(cfg.schedule) < 0 || OFFLOAD.indexOf(cfg.offload) < 0 ||
        ATTENTION.indexOf(cfg.attention) < 0 || PP_PARTITION.indexOf(cfg.pp_partition) < 0)
      throw new Error("unknown option");
    BOOLS.forEach(function (k) {
      if (typeof cfg[k] !== "boolean") throw new Error(k + " = " + cfg[k] + ": expected true or false");
    });
    if (cfg.fp32_grads && cfg.precision === "fp32")
      throw new Error("fp32 gradients are already the default with fp32 precision; choose a 16-bit precision");
    if ([0, 1, 2, 3].indexOf(cfg.zero_stage) < 0) throw new Error("ZeRO stage must be 0, 1, 2 or 3");
    if (cfg.hidden % cfg.heads !== 0 || cfg.heads % cfg.tp !== 0)
      throw new Error("hidden = " + cfg.hidden + ", heads = " + cfg.heads + ", tp = " + cfg.tp +
                      ": heads must divide hidden and tp must divide heads");
    if (cfg.offload === "optimizer+params" && cfg.zero_stage !== 3)
      throw new Error("offloading parameters needs ZeRO stage 3 (they are offloaded as shards)");
  }

  function stageBlocks(cfg) {                         // estimate.stage_blocks
    if (cfg.pp === 1) return cfg.layers;
    if (cfg.pp_partition === "blocks+embedding") return Math.min(cfg.layers, Math.ceil((cfg.layers + 2) / cfg.pp) - 1);
    return Math.ceil(cfg.layers / cfg.pp);
  }

  function stageParams(cfg) {                         // estimate.stage_params
    var h = cfg.hidden, t = cfg.tp;
    var block = (12 * h * h + 7 * h) / t + 6 * h;
    var positions = cfg.position_embedding ? cfg.seq_len * h : 0;
    var embed = cfg.vocab * h / t + positions + (cfg.pp === 1 ? 2 * h : 0);
    return stageBlocks(cfg) * block + embed;
  }

  function memoryPerGpu(input) {                      // estimate.memory_per_gpu
    var cfg = {}, k;
    for (k in DEFAULTS) cfg[k] = DEFAULTS[k];
    for (k in input) cfg[k] = input[k];
    check(cfg);
    var n = stageParams(cfg);
    var st = modelStateBreakdown(n, cfg.dp, cfg.zero_stage, cfg.precision, cfg.fp32_grads ? 4 : null);
    var cpu = 0;
    if (cfg.offload === "optimizer" || cfg.offload === "optimizer+params") {
      cpu += st.optimizer + st.grads;
      st.optimizer = 0; st.grads = 0;
    }
    if (cfg.offload === "optimizer+params") { cpu += st.params; st.params = 0; }
    var pBytes = stateBytesPerParam(cfg.precision)[0];
    var h = cfg.hidden, t = cfg.tp;
    var gathered = cfg.zero_stage === 3 ? pBytes * ((12 * h * h + 7 * h) / t + 6 * h) * (1 - 1 / cfg.dp) : 0;
    var actBytes = cfg.precision === "fp32" ? 4 : 2;
    var sp = cfg.sp && t > 1;
    var perLayer = activationBytesPerLayer(cfg.seq_len, cfg.micro_batch, h, cfg.heads, t, sp,
                                           cfg.recompute, cfg.attention, actBytes, 1);
    var inFlight = cfg.pp > 1 ? inFlightMicrobatches(cfg.pp, cfg.micro_batches, cfg.schedule, cfg.virtual_stages) : 1;
    var out = {params: st.params, grads: st.grads, optimizer: st.optimizer, gathered: gathered,
               activations: perLayer * stageBlocks(cfg) * inFlight,
               recompute: recomputeWorkingBytes(cfg.seq_len, cfg.micro_batch, h, cfg.heads, t, sp,
                                                cfg.recompute, cfg.attention, actBytes, 1)};
    out.total = out.params + out.grads + out.optimizer + out.gathered + out.activations + out.recompute;
    out.cpu = cpu;
    out.stage_params = n;
    return out;
  }

  var api = {memoryPerGpu: memoryPerGpu, stageParams: stageParams, stageBlocks: stageBlocks,
             modelStateBreakdown: modelStateBreakdown, activationBytesPerLayer: activationBytesPerLayer,
             recomputeWorkingBytes: recomputeWorkingBytes, inFlightMicrobatches: inFlightMicrobatches};
  if (typeof module !== "undefined" && module.exports) { module.exports = api; return; }
  root.mmMemory = api;

  /* ---------------------------------------------------------------- page half */
  var scriptSrc = document.currentScript ? document.currentScript.src : "";
  var GB = 1e9;
  var CATS = [["params", "parameters"], ["grads", "gradients"], ["optimizer", "optimizer states"],
              ["gathered", "gathered block (ZeRO-3)"], ["activations", "activations"],
              ["recompute", "recomputed layer (backward)"]];
  /* Words per page language (<html lang>; the Dutch edition is "nl"); numbers in Dutch take a decimal comma. */
  var WORDS = {
    en: {cats: {}, total: "total on the GPU", cpu: "in CPU memory (offload)", cannot: "Cannot compute: ",
         status: function (total, fits, cap, params) {
           return "Total per GPU: " + total + " GB (" + (fits ? "fits in " : "does not fit in ") + cap +
             " GB). Parameters on this GPU's pipeline stage: " + params + " billion.";
         },
         stage: "stage ", chosen: " (chosen)", title: "GB per GPU for each ZeRO stage (other inputs as set)",
         decimal: "."},
    nl: {cats: {params: "parameters", grads: "gradiënten", optimizer: "optimizer states",
                gathered: "opgehaald blok (ZeRO-3)", activations: "activaties", recompute: "herberekende laag (backward)"},
         total: "totaal op de GPU", cpu: "in CPU-geheugen (offload)", cannot: "Kan niet rekenen: ",
         status: function (total, fits, cap, params) {
           return "Totaal per GPU: " + total + " GB (" + (fits ? "past in " : "past niet in ") + cap +
             " GB). Parameters op de pipeline-stage van deze GPU: " + params + " miljard.";
         },
         stage: "stage ", chosen: " (gekozen)", title: "GB per GPU voor elke ZeRO-stage (overige invoer zoals ingesteld)",
         decimal: ","}
  };
  function words() {
    var lang = (document.documentElement.lang || "en").toLowerCase().slice(0, 2);
    return WORDS[lang] || WORDS.en;
  }
  function label(c) { return words().cats[c[0]] || c[1]; }

  var COLORS = ["#4c6ef5", "#12b886", "#f59f00", "#7950f2", "#e64980", "#868e96"];

  function loadPlotly(done) {
    if (root.Plotly) return done();
    var existing = document.getElementById("mm-plotly-js");
    if (!existing) {
      existing = document.createElement("script");
      existing.id = "mm-plotly-js";
      existing.src = new URL("../vendor/plotly/plotly-basic.min.js", scriptSrc).href;
      document.head.appendChild(existing);
    }
    existing.addEventListener("load", function () { done(); });
  }

  function readForm(form) {
    var cfg = {};
    INTS.forEach(function (k) { cfg[k] = Number(form.elements[k].value); });
    cfg.zero_stage = Number(form.elements.zero_stage.value);
    ["precision", "recompute", "schedule", "offload", "attention", "pp_partition"].forEach(function (k) {
      cfg[k] = form.elements[k].value;
    });
    BOOLS.forEach(function (k) { cfg[k] = form.elements[k].checked; });
    return cfg;
  }

  function fillForm(form, preset) {
    var cfg = {}, k;
    for (k in DEFAULTS) cfg[k] = DEFAULTS[k];
    for (k in preset) cfg[k] = preset[k];
    INTS.concat(["zero_stage", "precision", "recompute", "schedule", "offload", "attention", "pp_partition"])
      .forEach(function (k) { form.elements[k].value = String(cfg[k]); });
    BOOLS.forEach(function (k) { form.elements[k].checked = !!cfg[k]; });
  }

  function fmt(bytes) { return (bytes / GB).toFixed(bytes / GB >= 100 ? 1 : 2).replace(".", words().decimal); }

  function themeColors() {
    var dark = document.body.getAttribute("data-md-color-scheme") === "slate";
    return {fg: dark ? "#e3e5ea" : "#1f2430", grid: dark ? "rgba(227,229,234,0.16)" : "rgba(31,36,48,0.12)"};
  }

  function draw(root_, cfg, capacity) {
    var status = root_.querySelector(".mm-calc-status");
    var table = root_.querySelector(".mm-calc-table tbody");
    var res;
    var w = words();
    try { res = memoryPerGpu(cfg); } catch (e) { status.textContent = w.cannot + e.message; return; }
    table.innerHTML = "";
    CATS.concat([["total", w.total], ["cpu", w.cpu]]).forEach(function (c) {
      var tr = document.createElement("tr");
      tr.innerHTML = "<th scope=\"row\"></th><td></td>";
      tr.firstChild.textContent = label(c);
      tr.lastChild.textContent = fmt(res[c[0]]);
      table.appendChild(tr);
    });
    var fits = res.total <= capacity * GB;
    status.textContent = w.status(fmt(res.total), fits, capacity, (res.stage_params / 1e9).toFixed(3).replace(".", w.decimal));
    var stages = [0, 1, 2, 3], xs = stages.map(function (s) { return w.stage + s + (s === cfg.zero_stage ? w.chosen : ""); });
    var per = stages.map(function (s) {
      var c = {}, k;
      for (k in cfg) c[k] = cfg[k];
      c.zero_stage = s;
      if (s !== 3 && c.offload === "optimizer+params") c.offload = "optimizer";
      return memoryPerGpu(c);
    });
    var col = themeColors();
    var traces = CATS.map(function (c, i) {
      return {type: "bar", name: label(c), x: xs, marker: {color: COLORS[i]},
              y: per.map(function (r) { return r[c[0]] / GB; }),
              hovertemplate: "%{y:.3g} GB<extra>" + label(c) + "</extra>"};
    });
    var layout = {barmode: "stack", paper_bgcolor: "rgba(0,0,0,0)", plot_bgcolor: "rgba(0,0,0,0)",
                  font: {color: col.fg, family: "system-ui, sans-serif"}, margin: {l: 60, r: 10, t: 40, b: 40},
                  title: {text: w.title, x: 0.01, xanchor: "left"},
                  yaxis: {title: {text: "GB per GPU"}, gridcolor: col.grid, zerolinecolor: col.grid},
                  xaxis: {gridcolor: col.grid}, legend: {orientation: "h", y: -0.15},
                  shapes: [{type: "line", xref: "paper", x0: 0, x1: 1, y0: capacity, y1: capacity,
                            line: {color: "#e03131", dash: "dash", width: 2}}],
                  annotations: [{xref: "paper", x: 1, y: capacity, xanchor: "right", yanchor: "bottom",
                                 text: capacity + " GB GPU", showarrow: false, font: {color: "#e03131"}}]};
    var plot = root_.querySelector(".mm-calc-plot");
    loadPlotly(function () {
      root.Plotly.react(plot, traces, layout, {displaylogo: false, responsive: true});
    });
  }

  function init(el) {
    if (el.dataset.ready) return;
    el.dataset.ready = "1";
    var form = el.querySelector("form");
    // The page sets window.mmCalcPresets in an inline script: instant navigation re-runs a page's inline
    // scripts as JavaScript but drops their attributes, so a <script type="application/json"> would not survive.
    var presets = root.mmCalcPresets;
    var select = form.elements.preset;
    function update() { draw(el, readForm(form), Number(form.elements.capacity.value) || 80); }
    select.addEventListener("change", function () {
      if (presets[select.value]) fillForm(form, presets[select.value]);
      update();
    });
    form.addEventListener("input", function (ev) {
      if (ev.target === select) return;
      if (ev.target.name !== "capacity") select.value = "custom";   // the inputs no longer match a preset
      update();
    });
    form.addEventListener("change", function (ev) { if (ev.target !== select) update(); });
    form.addEventListener("submit", function (ev) { ev.preventDefault(); update(); });
    var obs = new MutationObserver(function () {
      if (!document.body.contains(el)) { obs.disconnect(); return; }   // page left by instant navigation
      update();
    });
    obs.observe(document.body, {attributes: true, attributeFilter: ["data-md-color-scheme"]});
    fillForm(form, presets[select.value]);
    update();
  }

  function start() { document.querySelectorAll(".mm-calculator").forEach(init); }
  if (root.document$) root.document$.subscribe(start);
  else document.addEventListener("DOMContentLoaded", start);
})(typeof window !== "undefined" ? window : this);
