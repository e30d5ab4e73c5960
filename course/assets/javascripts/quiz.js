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
 * Numeric items teach before they tell: a first wrong answer says whether it is too high or too low
 * and by how much, and offers a retry and a hint (data-hint, or the worked answer's formula when it is
 * written in symbols); the worked answer comes after a second wrong try or when asked for. Units are
 * accepted ("16.6 GB", "16600 MB" where the unit is GB; "251 elements").
 * Progress is kept per language: the store's key is "<lang>/<bank>" (progress.js sums it up).
 * Words follow the quiz box's lang attribute (sitebuild.render_quiz sets it from the bank's
 * language), so a Dutch page's quiz answers in Dutch; a comma is read as the decimal point.
 */
(function () {
  "use strict";
  var STORE = "minimega.quiz.v1";
  var WORDS = {
    en: {number: "Type a number first, for example 16.6.", one: "Pick one option first.",
         some: "Pick at least one option first.", right: "Correct.", wrong: "Not correct yet.",
         set: " The right set of options is different; try again.", earlier: "Earlier answer: ",
         progress: function (n, right, tried) {
           return n + " questions. Answered correctly: " + right + " of " + n + " (" + tried + " tried).";
         },
         reset: " Progress reset.",
         high: "too high", low: "too low", by: function (d, pct) { return " by " + d + " (" + pct + " %)."; },
         retry: "Try again", hint: "Hint", worked: "Show the worked answer", hintLead: "Hint: ",
         fromFormula: function (f) { return "start from " + f + "."; },
         generic: "re-read what the question asks for, in which unit, and redo the chapter's formula step by step.",
         workedLead: "Worked answer: ", unit: function (u) { return "The unit " + u + " is not the one asked for."; }},
    nl: {number: "Vul eerst een getal in, bijvoorbeeld 16,6.", one: "Kies eerst een optie.",
         some: "Kies eerst minstens één optie.", right: "Goed.", wrong: "Nog niet goed.",
         set: " De juiste combinatie van opties is anders; probeer het nog eens.", earlier: "Eerder antwoord: ",
         progress: function (n, right, tried) {
           return n + " vragen. Goed beantwoord: " + right + " van " + n + " (" + tried + " geprobeerd).";
         },
         reset: " Voortgang gewist.",
         high: "te hoog", low: "te laag", by: function (d, pct) { return ", " + d + " ernaast (" + pct + " %)."; },
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
    try { return JSON.parse(localStorage.getItem(STORE)) || {}; } catch (e) { return {}; }
  }
  function save(all) {
    try { localStorage.setItem(STORE, JSON.stringify(all)); } catch (e) { /* private mode: progress is not kept */ }
  }

  function langOf(el) {
    var box = el.closest("[lang]");
    return (box && box.lang || "en").toLowerCase().slice(0, 2);
  }
  function key(quiz) { return langOf(quiz) + "/" + quiz.dataset.bank; }

  function typeset(el) {
    if (window.mmTypeset) window.mmTypeset(el);
  }

  var PREFIX = {"": 1, k: 1e3, K: 1e3, M: 1e6, G: 1e9, T: 1e12, P: 1e15, m: 1e-3, "µ": 1e-6, u: 1e-6, n: 1e-9};
  var SCALED = ["B", "FLOP", "FLOP/s", "FLOPs", "s", "B/s", "W", "Hz"];

  /* {value, bad}: a number, or a number followed by the item's unit or the same base unit with another
   * SI prefix (converted to the asked unit); bad names a unit that is neither. */
  function parseAnswer(text, unit) {
    var t = String(text).trim().replace(/\u00a0|\u2009/g, " ");
    var m = /^([-+]?[\d\s.,]*\d(?:[eE][-+]?\d+)?|[-+]?[.,]\d+)\s*(.*)$/.exec(t);
    if (!m) return {value: NaN};
    var value = parseNumber(m[1]), given = m[2].trim();
    if (!given || !unit) return {value: given ? NaN : value};
    if (given.toLowerCase() === unit.toLowerCase()) return {value: value};
    var base = function (u) {
      for (var i = 0; i < SCALED.length; i++) {
        var b = SCALED[i];
        if (u.slice(-b.length) === b && PREFIX.hasOwnProperty(u.slice(0, -b.length))) return [PREFIX[u.slice(0, -b.length)], b];
      }
      return null;
    };
    var g = base(given), w = base(unit);
    if (g && w && g[1] === w[1]) return {value: value * g[0] / w[0]};
    return {value: NaN, bad: given};
  }

  function parseNumber(text) {
    var t = String(text).trim().replace(/\s+/g, "").replace(/,/g, ".");
    if (!/^[-+]?(\d+\.?\d*|\.\d+)(e[-+]?\d+)?$/i.test(t)) return NaN;
    return Number(t);
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
      var parsed = parseAnswer(input.value, form.dataset.unit || "");
      var value = parsed.value;
      var answer = Number(form.dataset.answer), tol = Number(form.dataset.tolerance);
      if (parsed.bad) return {answered: false, message: words(form).unit(parsed.bad) + " " + words(form).number};
      if (!isFinite(value)) return {answered: false, message: words(form).number};
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

  function fmt(x) {
    var a = Math.abs(x);
    return a !== 0 && (a >= 1e6 || a < 1e-3) ? x.toPrecision(3) : String(Number(x.toPrecision(3)));
  }

  /* A number in the page's language: a decimal comma in Dutch. */
  function local(form, text) { return langOf(form) === "nl" ? text.replace(".", ",") : text; }

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

  /* tries: wrong numeric answers so far (this one included); the worked answer waits for the second. */
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
      head += " " + (d > 0 ? w.high : w.low).replace(/^./, function (c) { return c.toUpperCase(); }) +
        w.by(local(form, fmt(Math.abs(d))) + (form.dataset.unit ? " " + form.dataset.unit : ""),
             result.answer ? local(form, fmt(Math.abs(100 * d / result.answer))) : "∞");
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
    if (!numeric || result.ok || tries >= 2) { worked(); typeset(box); return; }
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
    if (form.dataset.type === "numeric") form.querySelector("input").value = rec.response;
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
