/* Checkpoint interval and goodput: minimega.analysis.goodput in JavaScript.
 *
 * A job on n GPUs fails n times as often as one GPU (Llama 3's rate by default: 419 unexpected interruptions
 * in 54 days on 16,384 GPUs). Saving every tau seconds at a stall of `save` seconds, with a failure every
 * `mtbf` seconds, loses save/tau + (tau/2 + durable + restart)/mtbf of the time, where `durable` is how long an
 * asynchronous save's background write takes to become durable (0 for a blocking save: a failure before then
 * falls back one more interval); Young's tau* = max(sqrt(2 save mtbf), durable) minimises it. The test suite runs these functions under Node against the Python to 1e-12 relative.
 * The page half fills the "How often to save" table of the calculator page.
 */
(function (root) {
  "use strict";

  var LLAMA3 = {failures: 419, days: 54, at_gpus: 16384};

  function positive(name, v) {
    if (!(typeof v === "number" && isFinite(v) && v > 0)) throw new Error(name + " must be a finite number > 0, got " + v);
  }

  function failuresPerDay(gpus, rate) {
    rate = rate || LLAMA3;
    positive("gpus", gpus); positive("failures", rate.failures); positive("days", rate.days); positive("at_gpus", rate.at_gpus);
    return rate.failures / rate.days * gpus / rate.at_gpus;
  }

  function mtbfHours(gpus, rate) { return 24.0 / failuresPerDay(gpus, rate); }

  function nonNegative(name, v) {
    if (!(typeof v === "number" && isFinite(v) && v >= 0)) throw new Error(name + " must be a finite number >= 0, got " + v);
  }

  function youngDalyInterval(saveS, mtbfS, durableS) {
    positive("save_s", saveS); positive("mtbf_s", mtbfS);
    durableS = durableS || 0; nonNegative("durable_s", durableS);
    return Math.max(Math.sqrt(2.0 * saveS * mtbfS), durableS);
  }

  function lostPerFailure(intervalS, restartS, durableS) {
    positive("interval_s", intervalS);
    restartS = restartS || 0; durableS = durableS || 0;
    nonNegative("restart_s", restartS); nonNegative("durable_s", durableS);
    if (durableS > intervalS) throw new Error("durable_s (" + durableS + ") > interval_s (" + intervalS + ")");
    return intervalS / 2.0 + durableS + restartS;
  }

  function checkpointWaste(intervalS, saveS, mtbfS, restartS, durableS) {
    positive("save_s", saveS); positive("mtbf_s", mtbfS);
    return saveS / intervalS + lostPerFailure(intervalS, restartS, durableS) / mtbfS;
  }

  function goodput(intervalS, saveS, mtbfS, restartS, durableS) {
    return Math.max(0.0, 1.0 - checkpointWaste(intervalS, saveS, mtbfS, restartS, durableS));
  }

  /* Everything the page shows for one set of inputs (the Python `goodput` module gives each number). */
  function plan(gpus, saveS, restartS, rate, durableS) {
    var mtbf = 3600 * mtbfHours(gpus, rate), tau = youngDalyInterval(saveS, mtbf, durableS);
    return {failures_per_day: failuresPerDay(gpus, rate), mtbf_hours: mtbf / 3600, interval_s: tau,
            lost_per_failure_s: lostPerFailure(tau, restartS, durableS),
            waste: checkpointWaste(tau, saveS, mtbf, restartS, durableS),
            goodput: goodput(tau, saveS, mtbf, restartS, durableS)};
  }

  var api = {LLAMA3: LLAMA3, failuresPerDay: failuresPerDay, mtbfHours: mtbfHours, youngDalyInterval: youngDalyInterval,
             lostPerFailure: lostPerFailure, checkpointWaste: checkpointWaste, goodput: goodput, plan: plan};
  if (typeof module !== "undefined" && module.exports) { module.exports = api; return; }
  root.mmGoodput = api;

  var WORDS = {
    en: {rows: ["failures per day", "mean time between failures (h)", "save every (min of work)",
                "lost per failure (min)", "time lost to saves and failures (%)", "goodput (%)"], lang: "en"},
    nl: {rows: ["storingen per dag", "gemiddelde tijd tussen storingen (h)", "opslaan elke (min werk)",
                "verlies per storing (min)", "tijd verloren aan opslaan en storingen (%)", "goodput (%)"], lang: "nl"}
  };

  function update(el) {
    var f = el.querySelector("form"), out = el.querySelector(".mm-goodput-status"), body = el.querySelector("tbody");
    var w = (document.documentElement.lang || "en").slice(0, 2) === "nl" ? WORDS.nl : WORDS.en;
    var num = function (x, d) { return x.toLocaleString(w.lang, {minimumFractionDigits: d, maximumFractionDigits: d}); };
    var r;
    try {
      r = plan(Number(f.elements.gpus.value), Number(f.elements.save_s.value), Number(f.elements.restart_s.value),
               {failures: Number(f.elements.failures.value), days: Number(f.elements.days.value),
                at_gpus: Number(f.elements.at_gpus.value)},
               f.elements.durable_s ? Number(f.elements.durable_s.value) : 0);
    } catch (e) { out.textContent = e.message; body.innerHTML = ""; return; }
    out.textContent = "";
    var cells = [num(r.failures_per_day, 2), num(r.mtbf_hours, 2), num(r.interval_s / 60, 1),
                 num(r.lost_per_failure_s / 60, 1), num(100 * r.waste, 2), num(100 * r.goodput, 2)];
    body.innerHTML = "";
    w.rows.forEach(function (label, i) {
      var tr = document.createElement("tr");
      [label, cells[i]].forEach(function (t) { var td = document.createElement("td"); td.textContent = t; tr.appendChild(td); });
      body.appendChild(tr);
    });
  }

  function init(el) {
    if (el.dataset.ready) return;
    el.dataset.ready = "1";
    el.querySelector("form").addEventListener("input", function () { update(el); });
    el.querySelector("form").addEventListener("submit", function (ev) { ev.preventDefault(); });
    update(el);
  }

  function start() { document.querySelectorAll(".mm-goodput").forEach(init); }
  if (root.document$) root.document$.subscribe(function () { setTimeout(start, 0); });
  else document.addEventListener("DOMContentLoaded", start);
})(typeof window !== "undefined" ? window : this);
