/* Practice quizzes rendered by the build hook (minimega.classroom.sitebuild.render_quiz).
 *
 * Each question is a <form> with a <fieldset>/<legend>, native radio/checkbox/text inputs, a Check
 * button and a role="status" live region. Feedback starts with words ("Correct." / "Not correct
 * yet."), then the explanation of every option picked; colour only repeats it. Progress lives in
 * localStorage under "minimega.quiz.v1" and each quiz has a reset button. The grading rule is
 * minimega.classroom.quiz.grade: exact set for choices, relative tolerance for numbers.
 * Practice keys are public by design; the graded exam never ships its key to the browser.
 * Options are shuffled at every render (values stay bank indices, so grading and saved progress
 * do not depend on the order shown); numeric answers are also accepted rounded to data-sig
 * significant figures, as quiz.numeric_ok does.
 * Numeric items teach before they tell: a wrong answer says whether it is too high or too low and
 * roughly by how much (less than 10 %, more than 10 %, more than 50 %, a factor of 10 or more), never
 * the exact difference, and offers a retry and a hint (data-hint, or the worked answer's formula when it
 * is written in symbols); the worked answer comes only when the learner asks for it. Units are accepted
 * ("16.6 GB", "16600 MB" where the unit is GB; "251 elements"), and where the unit counts things
 * (parameters, tokens, GPUs, dollars) the suffixes K, M, B, T ("5B" for 5 billion parameters).
 * Numbers are read the page's way: English "2,869.5" (comma thousands), Dutch "2.869,5" (decimal comma).
 * Progress is one record per bank for both languages (the items are twins): the store's key is the bank
 * (progress.js sums it up); records an older version kept as "<lang>/<bank>" are merged into it.
 * Words follow the quiz box's lang attribute (sitebuild.render_quiz sets it from the bank's
 * language), so a Dutch page's quiz answers in Dutch.
 */
(function () {
  "use strict";
  var STORE = "minimega.quiz.v1";
  var WORDS = {
    en: {number: function (ex) { return "Type a number first, for example " + ex + "."; }, or: " or ",
         one: "Pick one option first.",
         some: "Pick at least one option first.", right: "Correct.", wrong: "Not correct yet.",
         set: " The right set of options is different; try again.", earlier: "Earlier answer: ",
         progress: function (n, right, tried) {
           return n + " questions. Answered correctly: " + right + " of " + n + " (" + tried + " tried).";
         },
         reset: " Progress reset.",
         high: "too high", low: "too low",
         band: ["by less than 10 %.", "by more than 10 %.", "by more than 50 %.",
                "by a factor of 10 or more: check the unit and the powers of ten."],
         retry: "Try again", hint: "Hint", worked: "Show the worked answer", hintLead: "Hint: ",
         fromFormula: function (f) { return "start from " + f + "."; },
         generic: "re-read what the question asks for, in which unit, and redo the chapter's formula step by step.",
         workedLead: "Worked answer: ", unit: function (u) { return "The unit " + u + " is not the one asked for."; }},
    nl: {number: function (ex) { return "Vul eerst een getal in, bijvoorbeeld " + ex + "."; }, or: " of ",
         one: "Kies eerst een optie.",
         some: "Kies eerst minstens één optie.", right: "Goed.", wrong: "Nog niet goed.",
         set: " De juiste combinatie van opties is anders; probeer het nog eens.", earlier: "Eerder antwoord: ",
         progress: function (n, right, tried) {
           return n + " vragen. Goed beantwoord: " + right + " van " + n + " (" + tried + " geprobeerd).";
         },
         reset: " Voortgang gewist.",
         high: "te hoog", low: "te laag",
         band: ["met minder dan 10 %.", "met meer dan 10 %.", "met meer dan 50 %.",
                "met een factor 10 of meer: kijk naar de eenheid en de machten van tien."],
         retry: "Probeer opnieuw", hint: "Hint", worked: "Toon de uitwerking", hintLead: "Hint: ",
         fromFormula: function (f) { return "begin bij " + f + "."; },
         generic: "lees opnieuw wat de vraag vraagt en in welke eenheid, en doe de formule uit het hoofdstuk stap voor stap.",
         workedLead: "Uitwerking: ", unit: function (u) { return "De eenheid " + u + " is niet de gevraagde."; }}
  };

  function words(el) {
    var box = el.closest("[lang]");
    var lang = (box && box.lang || "en").toLowerCase().slice(0, 2);
    return WORDS[lang] || WORDS.en;
  }

  function load() {
    var all;
    try { all = JSON.parse(localStorage.getItem(STORE)) || {}; } catch (e) { return {}; }
    Object.keys(all).forEach(function (k) {            // "<lang>/<bank>" from before progress was shared
      var m = /^[a-z]{2}\/(.+)$/.exec(k);
      if (!m) return;
      var into = all[m[1]] = all[m[1]] || {};
      Object.keys(all[k]).forEach(function (item) {
        if (!into[item] || (!into[item].ok && all[k][item].ok)) into[item] = all[k][item];
      });
      delete all[k];
    });
    return all;
  }
  function save(all) {
    try { localStorage.setItem(STORE, JSON.stringify(all)); } catch (e) { /* private mode: progress is not kept */ }
  }

  function langOf(el) {
    var box = el.closest("[lang]");
    return (box && box.lang || "en").toLowerCase().slice(0, 2);
  }
  function key(quiz) { return quiz.dataset.bank; }

  function typeset(el) {
    if (window.mmTypeset) window.mmTypeset(el);
  }

  var PREFIX = {"": 1, k: 1e3, K: 1e3, M: 1e6, G: 1e9, T: 1e12, P: 1e15, m: 1e-3, "µ": 1e-6, u: 1e-6, n: 1e-9};
  var SCALED = ["B", "FLOP", "FLOP/s", "FLOPs", "s", "B/s", "W", "Hz"];

  var SUFFIX = {k: 1e3, K: 1e3, M: 1e6, B: 1e9, T: 1e12};
  var WORD_SCALE = {thousand: 1e3, million: 1e6, billion: 1e9, trillion: 1e12,
                    duizend: 1e3, miljoen: 1e6, miljard: 1e9, biljoen: 1e12};

  /* Whether the unit counts things (parameters, tokens, GPUs, dollars), so that "5B" means 5 billion of them;
   * not for bytes or SI units (there B is a byte, M a prefix), shares or ratios. */
  function countUnit(unit) {
    return !/%|ratio|share|verhouding|deel van|byte|\bper\b/i.test(unit) && !siBase(unit);
  }
  /* A unit written "billion tokens" ("miljard tokens") is counted in billions: "964B" there is 964. */
  function unitScale(unit) {
    var w = /^(thousand|million|billion|trillion|duizend|miljoen|miljard|biljoen)\b/i.exec(unit);
    return w ? WORD_SCALE[w[1].toLowerCase()] : 1;
  }
  function siBase(u) {
    for (var i = 0; i < SCALED.length; i++) {
      var b = SCALED[i];
      if (u.slice(-b.length) === b && PREFIX.hasOwnProperty(u.slice(0, -b.length))) return [PREFIX[u.slice(0, -b.length)], b];
    }
    return null;
  }

  /* {value, bad}: a number (in the page's language), optionally with a K/M/B/T suffix where the unit counts
   * things, followed by nothing, the item's unit or the same base unit with another SI prefix (converted to the
   * asked unit); bad names a unit that is neither. */
  function parseAnswer(text, unit, lang) {
    var t = String(text).trim().replace(/\u00a0|\u2009|\u202f/g, " ");
    var m = /^([-+]?[\d\s.,]*\d(?:[eE][-+]?\d+)?|[-+]?[.,]\d+)\s*(.*)$/.exec(t);
    if (!m) return {value: NaN};
    var value = parseNumber(m[1], lang), given = m[2].trim();
    var s = /^([kKMBT])(?![A-Za-z])\s*(.*)$/.exec(given);
    if (s && countUnit(unit)) {
      value = value * SUFFIX[s[1]] / unitScale(unit);
      given = s[2].trim();
    }
    if (!given || !unit) return {value: given ? NaN : value};
    if (given.toLowerCase() === unit.toLowerCase()) return {value: value};
    var g = siBase(given), w = siBase(unit);
    if (g && w && g[1] === w[1]) return {value: value * g[0] / w[0]};
    return {value: NaN, bad: given};
  }

  /* English: "2,869" is 2869 (comma thousands), "2,869.5" and "16.6" as written; a lone comma that does not group
   * thousands ("16,6") is read as a decimal comma. Dutch: "2.869" is 2869 (point thousands), "16,6" is 16.6,
   * "2.869,5" is 2869.5; a lone point that does not group thousands ("16.6") is read as a decimal point. */
  function parseNumber(text, lang) {
    var t = String(text).trim().replace(/\s+/g, "");
    var group = lang === "nl" ? "." : ",", dec = lang === "nl" ? "," : ".";
    var grouped = new RegExp("^[-+]?\\d{1,3}(\\" + group + "\\d{3})+(\\" + dec + "\\d*)?([eE][-+]?\\d+)?$");
    if (grouped.test(t)) t = t.split(group).join("");
    else if (t.indexOf(group) >= 0 && t.indexOf(dec) >= 0) return NaN;    // "1,2.3": not a number either way
    t = t.replace(/,/g, ".");
    if (!/^[-+]?(\d+\.?\d*|\.\d+)(e[-+]?\d+)?$/i.test(t)) return NaN;
    return Number(t);
  }

  /* An example of an answer in the item's own unit and the page's language: "12.5 GB", "12,5 GB", "12.5 or 5B". */
  function example(form) {
    var unit = form.dataset.unit || "", nl = langOf(form) === "nl", w = words(form);
    var ex = (nl ? "12,5" : "12.5") + (unit ? " " + unit : "");
    if (unit && countUnit(unit)) ex += w.or + "5B" + (unitScale(unit) === 1 ? " " + unit : "");
    else if (!unit) ex += w.or + "5B";
    return ex;
  }

  function roundSig(x, sig) {
    if (x === 0 || !isFinite(x)) return x;
    return Number(x.toPrecision(sig));
  }

  function shuffle(form) {
    var fieldset = form.querySelector("fieldset");
    var choices = Array.prototype.slice.call(fieldset.querySelectorAll(".mm-choice"));
    for (var i = choices.length - 1; i > 0; i--) {
      var j = Math.floor(Math.random() * (i + 1));
      var t = choices[i]; choices[i] = choices[j]; choices[j] = t;
    }
    choices.forEach(function (c) { fieldset.appendChild(c); });
  }

  function grade(form) {
    var type = form.dataset.type;
    if (type === "numeric") {
      var input = form.querySelector("input");
      var parsed = parseAnswer(input.value, form.dataset.unit || "", langOf(form));
      var value = parsed.value;
      var answer = Number(form.dataset.answer), tol = Number(form.dataset.tolerance);
      if (parsed.bad) return {answered: false, message: words(form).unit(parsed.bad) + " " + words(form).number(example(form))};
      if (!isFinite(value)) return {answered: false, message: words(form).number(example(form))};
      var sig = Number(form.dataset.sig || 3);
      var ok = Math.abs(value - answer) <= tol * Math.abs(answer) + 1e-12 ||
        Math.abs(value - roundSig(answer, sig)) <= 1e-9 * Math.max(1, Math.abs(answer));
      return {answered: true, ok: ok, response: input.value, explains: [form.dataset.explain], value: value,
              answer: answer};
    }
    var picked = [], explains = [];
    form.querySelectorAll("input").forEach(function (inp) {
      if (inp.checked) {
        picked.push(Number(inp.value));
        var label = form.querySelector('label[for="' + inp.id + '"]');
        explains.push("<strong>" + label.innerHTML + "</strong>: " + inp.dataset.explain);
      }
    });
    if (!picked.length) return {answered: false, message: type === "single" ? words(form).one : words(form).some};
    var key = form.dataset.key.split(",").map(Number);
    var ok = picked.length === key.length && picked.every(function (i) { return key.indexOf(i) >= 0; });
    return {answered: true, ok: ok, response: picked, explains: explains};
  }

  /* How far off, in words and never in numbers (the exact difference would give the answer away):
   * 0 within 10 %, 1 more than 10 %, 2 more than 50 %, 3 a factor of 10 or more. */
  function band(value, answer) {
    if (!answer) return value ? 3 : 0;
    var ratio = value / answer, rel = Math.abs(ratio - 1);
    if (ratio >= 10 || (ratio > 0 && ratio <= 0.1)) return 3;
    return rel > 0.5 ? 2 : rel > 0.1 ? 1 : 0;
  }

  /* The hint: the bank's own (data-hint), else the worked answer's first formula when it is written in symbols
   ("2(n-1)/n x S"), else a general nudge. */
  function hintText(form) {
    var w = words(form);
    if (form.dataset.hint) return w.hintLead + form.dataset.hint;
    var tmp = document.createElement("div");
    tmp.innerHTML = form.dataset.explain || "";
    var first = tmp.textContent.split(" = ")[0];
    var letters = (first.match(/[A-Za-zΨα-ω]/g) || []).length, digits = (first.match(/\d/g) || []).length;
    // a formula in symbols is a hint; the worked numbers (4 x 12 x 8) would be the answer itself
    if (first !== tmp.textContent && first.length >= 4 && first.length < 120 && letters >= 2 * digits)
      return w.hintLead + w.fromFormula(first.trim());
    return w.hintLead + w.generic;
  }

  function button(cls, text, onClick) {
    var b = document.createElement("button");
    b.type = "button";
    b.className = "md-button " + cls;
    b.textContent = text;
    b.addEventListener("click", onClick);
    return b;
  }

  /* tries: wrong numeric answers so far (this one included); the worked answer waits until it is asked for. */
  function show(form, result, restored, tries) {
    var box = form.querySelector(".mm-feedback");
    form.classList.remove("mm-ok", "mm-bad");
    if (!result.answered) { box.textContent = result.message; return; }
    form.classList.add(result.ok ? "mm-ok" : "mm-bad");
    var w = words(form);
    var head = result.ok ? w.right : w.wrong;
    if (!result.ok && form.dataset.type === "multiple") head += w.set;
    var numeric = form.dataset.type === "numeric";
    if (!result.ok && numeric) {
      var d = result.value - result.answer;
      head += " " + (d > 0 ? w.high : w.low).replace(/^./, function (c) { return c.toUpperCase(); }) + ", " +
        w.band[band(result.value, result.answer)];
    }
    if (restored) head = w.earlier + head;
    box.innerHTML = "<p class=\"mm-verdict\">" + head + "</p>";
    var worked = function () {
      var p = document.createElement("p");
      p.className = "mm-worked";
      p.innerHTML = (numeric ? w.workedLead : "") + result.explains.join("</p><p>");
      box.appendChild(p);
      typeset(p);
    };
    if (!numeric || result.ok) { worked(); typeset(box); return; }
    var bar = document.createElement("p");
    var input = form.querySelector("input");
    bar.appendChild(button("mm-retry", w.retry, function () { input.focus(); input.select(); }));
    bar.appendChild(button("mm-hint-btn", w.hint, function (ev) {
      ev.target.disabled = true;
      var h = document.createElement("p");
      h.className = "mm-hintbox";
      h.textContent = hintText(form);
      bar.after(h);
      typeset(h);
    }));
    bar.appendChild(button("mm-worked-btn", w.worked, function (ev) { ev.target.disabled = true; worked(); }));
    box.appendChild(bar);
    typeset(box);
  }

  function progress(quiz) {
    var all = load()[key(quiz)] || {};
    var n = Number(quiz.dataset.count), right = 0, tried = 0;
    Object.keys(all).forEach(function (k) { tried += 1; if (all[k].ok) right += 1; });
    quiz.querySelector(".mm-progress").textContent = words(quiz).progress(n, right, tried);
    document.dispatchEvent(new CustomEvent("mm-quiz-progress"));
  }

  function restore(form, rec) {
    if (form.dataset.type === "numeric") {             // the value, written the way this page's language reads it
      var v = rec.value;
      form.querySelector("input").value = typeof v === "number" && isFinite(v) ?
        (langOf(form) === "nl" ? String(v).replace(".", ",") : String(v)) : rec.response;
    }
    else form.querySelectorAll("input").forEach(function (inp) {
      inp.checked = rec.response.indexOf(Number(inp.value)) >= 0;
    });
    show(form, grade(form), true, rec.tries || 2);
  }

  function init(quiz) {
    if (quiz.dataset.ready) return;
    quiz.dataset.ready = "1";
    var bank = key(quiz);
    var saved = load()[bank] || {};
    quiz.querySelectorAll("form.mm-item").forEach(function (form) {
      if (form.dataset.type !== "numeric") shuffle(form);
      if (saved[form.dataset.item]) restore(form, saved[form.dataset.item]);
      form.addEventListener("submit", function (ev) {
        ev.preventDefault();
        var result = grade(form);
        var all = load();
        var rec = (all[bank] || {})[form.dataset.item] || {};
        var tries = result.answered && !result.ok ? (rec.ok ? 0 : rec.tries || 0) + 1 : 0;
        show(form, result, false, tries);
        if (result.answered) {
          all[bank] = all[bank] || {};
          all[bank][form.dataset.item] = {ok: result.ok, response: result.response, tries: tries};
          if (result.value !== undefined) all[bank][form.dataset.item].value = result.value;
          save(all);
          progress(quiz);
        }
      });
    });
    quiz.querySelector(".mm-reset").addEventListener("click", function () {
      var all = load();
      delete all[bank];
      save(all);
      quiz.querySelectorAll("form.mm-item").forEach(function (form) {
        form.reset();
        form.classList.remove("mm-ok", "mm-bad");
        form.querySelector(".mm-feedback").textContent = "";
      });
      progress(quiz);
      quiz.querySelector(".mm-progress").textContent += words(quiz).reset;
    });
    progress(quiz);
  }

  window.mmQuizStore = {key: STORE, load: load, save: save};
  document$.subscribe(function () { document.querySelectorAll(".mm-quiz").forEach(init); });
})();
