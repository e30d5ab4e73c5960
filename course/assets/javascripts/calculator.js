/* Memory calculator: bytes per GPU by category.
 *
 * The compute half (mmMemory) mirrors minimega.estimate.memory_per_gpu term by term; the test suite
 * runs it under Node on random configurations and requires the Python numbers to 1e-9 relative.
 * The page half draws the form, the table and a plotly chart; it starts from document$ (theme.js), once the
 * page is parsed.
 */
(function (root) {
  "use strict";

  var PRECISIONS = ["mixed", "bf16", "fp16", "fp32", "fp8"];
  var RECOMPUTE = ["none", "selective", "full"];
  var SCHEDULES = ["gpipe", "1f1b", "interleaved", "zb_h1"];
  var OFFLOAD = ["none", "optimizer", "optimizer+params"];
  var OFFLOAD_DEVICES = ["cpu", "nvme"];
  var ATTENTION = ["unfused", "fused"];
  var PP_PARTITION = ["blocks", "blocks+embedding"];
  var CP_ATTENTION = ["ring", "ulysses"];
  var BOOLS = ["sp", "position_embedding", "fp32_grads", "tied", "bias"];
  var MLPS = ["gelu", "swiglu"];
  var INTS = ["layers", "hidden", "heads", "vocab", "seq_len", "micro_batch", "tp", "dp", "pp", "cp",
              "micro_batches", "virtual_stages"];
  var DEFAULTS = {micro_batch: 1, precision: "mixed", zero_stage: 0, tp: 1, dp: 1, pp: 1, cp: 1, sp: false,
                  recompute: "none", schedule: "1f1b", micro_batches: 1, virtual_stages: 1, offload: "none", offload_device: "cpu",
                  attention: "unfused", position_embedding: true, fp32_grads: false, pp_partition: "blocks",
                  experts: 0, top_k: 2, capacity_factor: 1.25, ep: 1, expert_ffn: 0, shared_experts: 0, moe_dispatch: "capacity",
                  cp_attention: "ring", kv_heads: 0, ffn: 0, mlp: "gelu", tied: true, bias: true};

  /* Block shapes (minimega.analysis.shapes): GQA's k = kv_heads · h/a, the MLP's width f, GELU or SwiGLU. */
  function kvWidth(c) { return c.kv_heads ? c.kv_heads * Math.floor(c.hidden / c.heads) : c.hidden; }
  function ffnWidth(c) { return c.ffn || 4 * c.hidden; }
  function blockMatmulParams(c) {                    // shapes.block_matmul_params
    var h = c.hidden, k = kvWidth(c), f = ffnWidth(c);
    return 2 * h * h + 2 * h * k + (c.mlp === "swiglu" ? 3 : 2) * h * f;
  }
  function blockSplitParams(c) {                     // shapes.block_split_params
    var h = c.hidden, k = kvWidth(c), f = ffnWidth(c);
    return blockMatmulParams(c) + (c.bias ? h + 2 * k + (c.mlp === "swiglu" ? 2 : 1) * f : 0);
  }
  function blockWholeParams(c) { return c.bias ? 6 * c.hidden : 2 * c.hidden; }
  function splitWidth(h, a, kvHeads, ffn, mlp) {     // activations._split_width
    var k = (kvHeads || a) * Math.floor(h / a), f = ffn || 4 * h;
    return 2 * h + 2 * k + (mlp === "swiglu" ? 4 : 2) * f;
  }

  function stateBytesPerParam(precision) {          // estimate.state_bytes_per_param
    if (precision === "mixed" || precision === "fp16") return [2, 2, 12];
    if (precision === "bf16" || precision === "fp8") return [2, 4, 12];     // fp32 main grads (Megatron's bf16 row, minimega's bf16)
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

  function modelStatePlacement(n, dp, stage, precision, offload, gradBytes) {   // estimate.model_state_placement
    var out = modelStateBreakdown(n, dp, stage, precision, gradBytes);
    out.cpu = 0;
    if (offload === "none") return out;
    var shard = n / (stage >= 1 ? dp : 1);             // this rank's part of the optimizer's work
    var separateMaster = precision === "fp32" ? 4 * shard : 0;   // K = 8 has no master; the host needs one
    out.cpu = out.optimizer + separateMaster + 4 * shard;          // + the gradient shard, summed in fp32 on the host
    out.optimizer = 0;
    if (stage >= 2) out.grads = 0;                    // each unit's shard leaves when reduced; stages 0-1 keep theirs
    if (offload === "optimizer+params") { out.cpu += out.params; out.params = 0; }
    return out;
  }

  function activationBytesPerLayer(s, b, h, a, t, sp, recompute, attention, actBytes, maskBytes, shape) {
    var sbh = s * b * h;                             // estimate.activation_bytes_per_layer
    if (recompute === "full") return actBytes * sbh / (sp ? t : 1);
    var whole = sbh * (4 * actBytes + 2 * maskBytes) / (sp ? t : 1);
    shape = shape || {};
    var split = s * b * splitWidth(h, a, shape.kv_heads, shape.ffn, shape.mlp) * actBytes / t;
    var core;
    if (recompute === "selective") core = 0;
    else if (attention === "fused") core = 4 * a * s * b / t;
    else core = a * s * s * b * (2 * actBytes + maskBytes) / t;
    return whole + split + core;
  }

  function recomputeWorkingBytes(s, b, h, a, t, sp, recompute, attention, actBytes, maskBytes, shape) {
    if (recompute === "none") return 0;              // estimate.recompute_working_bytes
    var full = activationBytesPerLayer(s, b, h, a, t, sp, "none", attention, actBytes, maskBytes, shape);
    if (recompute === "full") return full;
    return full - activationBytesPerLayer(s, b, h, a, t, sp, "selective", attention, actBytes, maskBytes, shape);
  }

  function moeCapacity(s, E, k, cf) {                 // estimate.moe_capacity
    return Math.max(1, Math.min(s, Math.ceil(cf * k * s / E)));
  }

  function moeActivationDelta(s, b, h, E, k, cf, t, e, f, S, dispatch) {   // estimate.moe_activation_delta
    var N = s * b, dense = e * s * b * h * (1 + 8 / t);           // f: each expert's width, S: shared experts
    var routing = N * h + N * E + (k > 1 ? N * (k + 1) : 0) + b * E;
    if (dispatch === "dropless")                     // estimate.dropless_mlp_activation_bytes: no slots, no one-hot
      return e * (routing + N * k * (2 * h + 2 * f) + N * k + 2 * N * S * f) + 8 * 3 * N * k + 4 * E - dense;
    var C = moeCapacity(s, E, k, cf), R = b * E * C;
    return e * (routing + N * E * C * (k + 2) + R * (2 * h + 2 * f) + 2 * N * S * f) + 8 * N * k - dense;
  }

  function inFlightMicrobatches(p, m, schedule, v) {  // estimate.in_flight_microbatches
    if (schedule === "gpipe") return m;
    if (schedule === "1f1b" || schedule === "zb_h1") return Math.min(p, m);
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
    if (cfg.fp32_grads && (cfg.precision === "fp32" || cfg.precision === "bf16" || cfg.precision === "fp8"))
      throw new Error("fp32 gradients are already the default with " + cfg.precision +
                      " precision; choose mixed or fp16, or untick fp32 gradients");
    if ([0, 1, 2, 3].indexOf(cfg.zero_stage) < 0) throw new Error("ZeRO stage must be 0, 1, 2 or 3");
    if (cfg.hidden % cfg.heads !== 0 || cfg.heads % cfg.tp !== 0)
      throw new Error("hidden = " + cfg.hidden + ", heads = " + cfg.heads + ", tp = " + cfg.tp +
                      ": heads must divide hidden and tp must divide heads");
    if (cfg.offload !== "none" && cfg.zero_stage === 0)
      throw new Error("offload moves ZeRO's optimizer shards: choose ZeRO stage 1 or higher, or no offload");
    if (cfg.offload === "optimizer+params" && cfg.zero_stage !== 3)
      throw new Error("offloading parameters needs ZeRO stage 3 (they are offloaded as shards)");
    if (OFFLOAD_DEVICES.indexOf(cfg.offload_device) < 0)
      throw new Error("offload device " + cfg.offload_device + ": expected cpu or nvme");
    if (cfg.offload_device === "nvme" && cfg.offload === "none")
      throw new Error("NVMe holds what offload moves off the GPU: choose an offload, or keep the states in CPU memory");
    if (cfg.cp > 1 && cfg.attention !== "fused")
      throw new Error("context parallelism runs ring attention, which never stores the scores: choose fused attention");
    if (CP_ATTENTION.indexOf(cfg.cp_attention) < 0) throw new Error("cp attention " + cfg.cp_attention + ": expected ring or ulysses");
    if (cfg.cp > 1 && cfg.cp_attention === "ulysses" && cfg.heads % (cfg.tp * cfg.cp) !== 0)
      throw new Error("Ulysses: heads = " + cfg.heads + " is not divisible by tp × cp = " + cfg.tp * cfg.cp);
    if (cfg.cp > 1 && cfg.seq_len % (2 * cfg.cp) !== 0)
      throw new Error("seq_len = " + cfg.seq_len + " is not divisible by 2 × cp = " + 2 * cfg.cp);
    checkShape(cfg);
    ["experts", "expert_ffn", "shared_experts"].forEach(function (k) {
      if (!(Number.isInteger(cfg[k]) && cfg[k] >= 0)) throw new Error(k + " = " + cfg[k] + ": expected an integer >= 0");
    });
    if (!(Number.isInteger(cfg.ep) && cfg.ep >= 1)) throw new Error("ep = " + cfg.ep + ": expected an integer >= 1");
    if (cfg.moe_dispatch !== "capacity" && cfg.moe_dispatch !== "dropless")
      throw new Error("moe dispatch " + cfg.moe_dispatch + ": expected capacity or dropless");
    if (cfg.experts === 0) {
      if (cfg.ep > 1 || cfg.expert_ffn || cfg.shared_experts || cfg.moe_dispatch !== "capacity")
        throw new Error("ep = " + cfg.ep + ", expert ffn, shared experts and dropless dispatch need experts > 0");
      return;
    }
    if (!(Number.isInteger(cfg.top_k) && cfg.top_k >= 1 && cfg.top_k <= cfg.experts))
      throw new Error("top_k = " + cfg.top_k + ": expected an integer from 1 to experts = " + cfg.experts);
    if (!(typeof cfg.capacity_factor === "number" && isFinite(cfg.capacity_factor) && cfg.capacity_factor > 0))
      throw new Error("capacity factor = " + cfg.capacity_factor + ": expected a number > 0");
    if (cfg.experts % cfg.ep !== 0 || cfg.dp % cfg.ep !== 0)
      throw new Error("ep = " + cfg.ep + " must divide experts = " + cfg.experts + " and dp = " + cfg.dp);
    if (cfg.sp && cfg.tp > 1) throw new Error("sequence parallelism with experts: use sp = false");
    if (cfg.cp > 1 && cfg.moe_dispatch === "capacity")
      throw new Error("context parallelism with capacity-routed experts: use dropless dispatch or cp = 1");
  }

  function checkShape(cfg) {                          // estimate.MemoryConfig._check_shape
    ["kv_heads", "ffn"].forEach(function (k) {
      if (!(Number.isInteger(cfg[k]) && cfg[k] >= 0)) throw new Error(k + " = " + cfg[k] + ": expected an integer >= 0 (0 for GPT's default)");
    });
    if (MLPS.indexOf(cfg.mlp) < 0) throw new Error("mlp " + cfg.mlp + ": expected gelu or swiglu");
    var kv = cfg.kv_heads || cfg.heads;
    if (cfg.heads % kv !== 0 || kv % cfg.tp !== 0)
      throw new Error("kv heads = " + kv + ", heads = " + cfg.heads + ", tp = " + cfg.tp +
                      ": kv heads must divide heads and tp must divide kv heads");
    if (cfg.cp > 1 && cfg.cp_attention === "ulysses" && kv % (cfg.tp * cfg.cp) !== 0)
      throw new Error("Ulysses: kv heads = " + kv + " is not divisible by tp × cp = " + cfg.tp * cfg.cp);
    if (cfg.experts && (cfg.kv_heads || cfg.ffn || cfg.mlp !== "gelu" || !cfg.bias))
      throw new Error("experts model GPT's block: leave kv heads, ffn, mlp and biases at their defaults");
  }

  function ulyssesActivationBytes(cfg) {            // estimate.ulysses_activation_bytes
    if (cfg.cp === 1 || cfg.cp_attention !== "ulysses") return [0, 0];
    var rows = (cfg.precision === "fp32" ? 4 : 2) * cfg.micro_batch * Math.floor(cfg.seq_len / cfg.cp);
    var one = rows * cfg.hidden / cfg.tp, kv = rows * kvWidth(cfg) / cfg.tp;
    return [cfg.recompute === "none" ? one : 0, {none: 0, full: one, selective: 2 * one + 2 * kv}[cfg.recompute]];
  }

  function stageBlocks(cfg) {                         // estimate.stage_blocks
    if (cfg.pp === 1) return cfg.layers;
    if (cfg.pp_partition === "blocks+embedding") return Math.min(cfg.layers, Math.ceil((cfg.layers + 2) / cfg.pp) - 1);
    return Math.ceil(cfg.layers / cfg.pp);
  }

  function blockParams(cfg) {                         // estimate.block_params
    var h = cfg.hidden, t = cfg.tp;
    if (!cfg.experts) return [blockSplitParams(cfg) / t + blockWholeParams(cfg), 0];
    var f = cfg.expert_ffn || 4 * h;                  // each expert's width; the shared ones are whole over tp
    return [(4 * h * h + 3 * h) / t + 5 * h + h * cfg.experts + 2 * h * (cfg.shared_experts || 0) * f,
            cfg.experts / cfg.ep * 2 * h * f];
  }

  function stageParamSplit(cfg) {                     // estimate.stage_param_split
    var h = cfg.hidden, t = cfg.tp, bp = blockParams(cfg);
    var positions = cfg.position_embedding ? cfg.seq_len * h : 0;
    var embed = cfg.vocab * h / t + positions + (cfg.pp === 1 ? (cfg.bias ? 2 * h : h) : 0);
    if (!cfg.tied && cfg.pp === 1) embed += cfg.vocab * h / t;   // the untied head; with pp > 1 on the last stage
    return [stageBlocks(cfg) * bp[0] + embed, stageBlocks(cfg) * bp[1]];
  }

  function stageParams(cfg) {                         // estimate.stage_params
    var sp = stageParamSplit(cfg);
    return sp[0] + sp[1];
  }

  function memoryPerGpu(input) {                      // estimate.memory_per_gpu
    var cfg = {}, k;
    for (k in DEFAULTS) cfg[k] = DEFAULTS[k];
    for (k in input) cfg[k] = input[k];
    check(cfg);
    var split = stageParamSplit(cfg), n = split[0] + split[1];
    var replicas = cfg.dp * cfg.cp;                   // ZeRO shards over every rank holding the same parameters
    var st = modelStatePlacement(split[0], replicas, cfg.zero_stage, cfg.precision, cfg.offload,
                                 cfg.fp32_grads ? 4 : null);
    var cpu = st.cpu;
    var nvme = cfg.offload_device === "nvme" ? 12 * split[0] / replicas : 0;   // estimate.nvme_bytes_per_step: K·Ψ/N_d
    cpu -= nvme;
    if (split[1]) {                                   // experts: whole on each rank of their edp group, on the GPU;
      var ex = modelStateBreakdown(split[1], cfg.dp / cfg.ep * cfg.cp, Math.min(cfg.zero_stage, 1), cfg.precision,
                                   cfg.fp32_grads ? 4 : null);   // Adam's states sharded over it from stage 1
      st.params += ex.params; st.grads += ex.grads; st.optimizer += ex.optimizer;
    }
    var pBytes = stateBytesPerParam(cfg.precision)[0];
    var h = cfg.hidden, t = cfg.tp;
    var gathered = cfg.zero_stage === 3 ? pBytes * blockParams(cfg)[0] * (1 - 1 / replicas) : 0;
    var actBytes = cfg.precision === "fp32" ? 4 : 2;
    var sp = cfg.sp && t > 1;
    var sLocal = Math.floor(cfg.seq_len / cfg.cp);   // this rank's tokens of each sequence
    var moe = cfg.experts ? moeActivationDelta(sLocal, cfg.micro_batch, h, cfg.experts, cfg.top_k,
                                               cfg.capacity_factor, t, actBytes, cfg.expert_ffn || 4 * h,
                                               cfg.shared_experts, cfg.moe_dispatch) : 0;
    var uly = ulyssesActivationBytes(cfg);
    var perLayer = activationBytesPerLayer(sLocal, cfg.micro_batch, h, cfg.heads, t, sp,
                                           cfg.recompute, cfg.attention, actBytes, 1, cfg) + (cfg.recompute === "full" ? 0 : moe) + uly[0];
    var inFlight = cfg.pp > 1 ? inFlightMicrobatches(cfg.pp, cfg.micro_batches, cfg.schedule, cfg.virtual_stages) : 1;
    var out = {params: st.params, grads: st.grads, optimizer: st.optimizer, gathered: gathered,
               activations: perLayer * stageBlocks(cfg) * inFlight,
               recompute: recomputeWorkingBytes(sLocal, cfg.micro_batch, h, cfg.heads, t, sp,
                                                cfg.recompute, cfg.attention, actBytes, 1, cfg) + (cfg.recompute === "full" ? moe : 0) + uly[1]};
    out.total = out.params + out.grads + out.optimizer + out.gathered + out.activations + out.recompute;
    out.cpu = cpu;
    out.nvme = nvme;
    out.stage_params = n;
    return out;
  }

  var api = {memoryPerGpu: memoryPerGpu, stageParams: stageParams, stageBlocks: stageBlocks,
             stageParamSplit: stageParamSplit, blockParams: blockParams, moeCapacity: moeCapacity,
             readExperts: function (form, cfg) { return readExperts(form, cfg); },
             modelStateBreakdown: modelStateBreakdown, activationBytesPerLayer: activationBytesPerLayer,
             recomputeWorkingBytes: recomputeWorkingBytes, inFlightMicrobatches: inFlightMicrobatches,
             kvWidth: kvWidth, ffnWidth: ffnWidth, blockMatmulParams: blockMatmulParams, blockSplitParams: blockSplitParams};
  if (typeof module !== "undefined" && module.exports) { module.exports = api; return; }
  root.mmMemory = api;

  /* ---------------------------------------------------------------- page half */
  var scriptSrc = document.currentScript ? document.currentScript.src : "";
  var GB = 1e9;
  // The memory categories' labels and colours come from minimega.figures.palette, written into the page at
  // build time (palette_json, labels in the page's language), so the chart and table use the chapter
  // figures' colours and words.
  var GPU_CATS = ["params", "grads", "optimizer", "gathered", "activations", "recompute"];
  /* Words per page language (<html lang>; the Dutch edition is "nl"); numbers in Dutch take a decimal comma. */
  var WORDS = {
    en: {total: "total on the GPU", cpu: "in CPU memory (offload)", cannot: "Cannot compute: ", change: ". Change that input to see the table and the chart.",
         status: function (total, fits, cap, params) {
           return "Total per GPU: " + total + " GB (" + (fits ? "fits in " : "does not fit in ") + cap +
             " GB). Parameters on this GPU's pipeline stage: " + params + " billion.";
         },
         stage: "stage ", chosen: "<br>(chosen)", title: "GB per GPU by ZeRO stage",
         oneReplica: " With N_d = 1 (dp × cp = 1) every ZeRO stage holds the same bytes: ZeRO shards the states over " +
           "the data-parallel ranks, and here there is one. Raise dp to see the stages differ.",
         decimal: "."},
    nl: {total: "totaal op de GPU", cpu: "in CPU-geheugen (offload)", cannot: "Kan niet rekenen: ", change: ". Pas die invoer aan om de tabel en de grafiek te zien.",
         status: function (total, fits, cap, params) {
           return "Totaal per GPU: " + total + " GB (" + (fits ? "past in " : "past niet in ") + cap +
             " GB). Parameters op de pipeline-stage van deze GPU: " + params + " miljard.";
         },
         stage: "stage ", chosen: "<br>(gekozen)", title: "GB per GPU per ZeRO-stage",
         oneReplica: " Met N_d = 1 (dp × cp = 1) houdt elke ZeRO-stage evenveel bytes: ZeRO verdeelt de states over " +
           "de data-parallelle ranks, en hier is er één. Verhoog dp om de stages te zien verschillen.",
         decimal: ","}
  };
  function words() {
    var lang = (document.documentElement.lang || "en").toLowerCase().slice(0, 2);
    return WORDS[lang] || WORDS.en;
  }
  function label(key, c) { return c ? c.label : words().total; }   // the palette JSON is in the page's language

  // plotly.js (about 1 MB) is fetched and run when the plot comes within a screen's height of view: on a phone the
  // form and the table come first, and the page is ready to use before the plot is drawn.
  // Until then only the latest drawing waits (el.mmWaiting).
  function whenNear(el, fn) {
    if (el.mmNear || !("IntersectionObserver" in root)) return fn();
    el.mmWaiting = fn;
    if (el.mmObserver) return;
    el.mmObserver = new IntersectionObserver(function (entries) {
      if (!entries.some(function (e) { return e.isIntersecting; })) return;
      el.mmObserver.disconnect();
      el.mmNear = true;
      el.mmWaiting();
    }, {rootMargin: "100% 0px"});
    el.mmObserver.observe(el);
  }

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
    ["precision", "recompute", "schedule", "offload", "offload_device", "attention", "cp_attention", "pp_partition"].forEach(function (k) {
      cfg[k] = form.elements[k].value;
    });
    BOOLS.forEach(function (k) { cfg[k] = form.elements[k].checked; });
    ["kv_heads", "ffn"].forEach(function (k) { cfg[k] = Number(form.elements[k].value); });
    cfg.mlp = form.elements.mlp.value;
    readExperts(form, cfg);
    return cfg;
  }

  function readExperts(form, cfg) {                   // experts 0: a dense MLP, the other three ignored
    ["experts", "top_k", "ep"].forEach(function (k) { cfg[k] = Number(form.elements[k].value); });
    cfg.capacity_factor = Number(form.elements.capacity_factor.value);
    if (!cfg.experts) { cfg.ep = 1; cfg.top_k = DEFAULTS.top_k; cfg.capacity_factor = DEFAULTS.capacity_factor; }
    return cfg;
  }

  function fillForm(form, preset) {
    var cfg = {}, k;
    for (k in DEFAULTS) cfg[k] = DEFAULTS[k];
    for (k in preset) cfg[k] = preset[k];
    INTS.concat(["zero_stage", "precision", "recompute", "schedule", "offload", "offload_device", "attention", "cp_attention", "pp_partition",
                 "experts", "top_k", "ep", "capacity_factor", "kv_heads", "ffn", "mlp"])
      .forEach(function (k) { form.elements[k].value = String(cfg[k]); });
    BOOLS.forEach(function (k) { form.elements[k].checked = !!cfg[k]; });
  }

  function fmt(bytes) { return (bytes / GB).toFixed(bytes / GB >= 100 ? 1 : 2).replace(".", words().decimal); }

  function themeColors() {
    var dark = document.body.getAttribute("data-md-color-scheme") === "slate";
    return {fg: dark ? "#e3e5ea" : "#1f2430", grid: dark ? "rgba(227,229,234,0.16)" : "rgba(31,36,48,0.12)"};
  }

  function draw(root_, cfg, capacity, palette) {
    var status = root_.querySelector(".mm-calc-status");
    var table = root_.querySelector(".mm-calc-table tbody");
    var plot = root_.querySelector(".mm-calc-plot");
    var seq = (root_.mmDrawn || 0) + 1;                // a chart still loading plotly.js for an older input is dropped
    root_.mmDrawn = seq;
    var res;
    var res;
    var w = words();
    try { res = memoryPerGpu(cfg); } catch (e) {
      // no numbers from an earlier input may stay next to the error
      table.innerHTML = "";
      if (root.Plotly) root.Plotly.purge(plot);
      root_.classList.add("mm-calc-invalid");
      status.textContent = w.cannot + e.message + w.change;
      return;
    }
    root_.classList.remove("mm-calc-invalid");
    table.innerHTML = "";
    // the disk's row only when the states are on it
    GPU_CATS.concat(["total", "cpu"], cfg.offload_device === "nvme" ? ["nvme"] : []).forEach(function (key) {
      var tr = document.createElement("tr"), c = palette[key];
      tr.innerHTML = "<th scope=\"row\"></th><td></td>";
      if (c) {
        var swatch = document.createElement("span");
        swatch.className = "mm-swatch";
        swatch.style.background = c.colour;
        tr.firstChild.appendChild(swatch);
      }
      tr.firstChild.appendChild(document.createTextNode(label(key, c)));
      tr.lastChild.textContent = fmt(res[key]);
      table.appendChild(tr);
    });
    var fits = res.total <= capacity * GB;
    status.textContent = w.status(fmt(res.total), fits, capacity, (res.stage_params / 1e9).toFixed(3).replace(".", w.decimal)) +
      (cfg.dp * (cfg.cp || 1) === 1 ? w.oneReplica : "");     // why changing the stage changes nothing
    var stages = [0, 1, 2, 3], xs = stages.map(function (s) { return w.stage + s + (s === cfg.zero_stage ? w.chosen : ""); });
    var per = stages.map(function (s) {
      var c = {}, k;
      for (k in cfg) c[k] = cfg[k];
      c.zero_stage = s;
      if (s !== 3 && c.offload === "optimizer+params") c.offload = "optimizer";
      if (s === 0) { c.offload = "none"; c.offload_device = "cpu"; }
      return memoryPerGpu(c);
    });
    var col = themeColors();
    var traces = GPU_CATS.map(function (key) {
      var c = palette[key];
      return {type: "bar", name: label(key, c), x: xs, marker: {color: c.colour},
              y: per.map(function (r) { return r[key] / GB; }),
              hovertemplate: "%{y:.3g} GB<extra>" + label(key, c) + "</extra>"};
    });
    // as minimega.figures.plots._layout: margins follow the title, labels and legend, the legend sits below all
    var layout = {barmode: "stack", paper_bgcolor: "rgba(0,0,0,0)", plot_bgcolor: "rgba(0,0,0,0)",
                  font: {color: col.fg, family: "system-ui, sans-serif", size: 13}, margin: {l: 10, r: 10, t: 10, b: 10},
                  title: {text: w.title, x: 0, xref: "container", xanchor: "left", y: 1, yref: "paper",
                          yanchor: "bottom", automargin: true, pad: {l: 10, b: 12}, font: {size: 15}},
                  yaxis: {title: {text: "GB per GPU"}, gridcolor: col.grid, zerolinecolor: col.grid, automargin: true},
                  xaxis: {gridcolor: col.grid, automargin: true, tickangle: 0},
                  legend: {orientation: "h", x: 0, xanchor: "left", xref: "container", y: 0, yanchor: "bottom", yref: "container"},
                  shapes: [{type: "line", xref: "paper", x0: 0, x1: 1, y0: capacity, y1: capacity,
                            line: {color: "#e03131", dash: "dash", width: 2}}],
                  annotations: [{xref: "paper", x: 1, y: capacity, xanchor: "right", yanchor: "bottom",
                                 text: capacity + " GB GPU", showarrow: false, font: {color: "#e03131"}}]};
    whenNear(plot, function () { loadPlotly(function () {
      if (root_.mmDrawn !== seq) return;
      root.Plotly.react(plot, traces, layout, {displaylogo: false, responsive: true});
    }); });
  }

  function init(el) {
    if (el.dataset.ready) return;
    el.dataset.ready = "1";
    var form = el.querySelector("form");
    // The page sets window.mmCalcPresets in an inline script (sitebuild's presets_json).
    var presets = root.mmCalcPresets;
    var palette = {};
    (root.mmCalcPalette || []).forEach(function (c) { palette[c.key] = c; });
    var select = form.elements.preset;
    function update() { draw(el, readForm(form), Number(form.elements.capacity.value) || 80, palette); }
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
      if (!document.body.contains(el)) { obs.disconnect(); return; }   // the calculator was taken off the page
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
