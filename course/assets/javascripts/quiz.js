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
         reset: " Progress reset."},
    nl: {number: "Vul eerst een getal in, bijvoorbeeld 16,6.", one: "Kies eerst een optie.",
         some: "Kies eerst minstens één optie.", right: "Goed.", wrong: "Nog niet goed.",
         set: " De juiste combinatie van opties is anders; probeer het nog eens.", earlier: "Eerder antwoord: ",
         progress: function (n, right, tried) {
           return n + " vragen. Goed beantwoord: " + right + " van " + n + " (" + tried + " geprobeerd).";
         },
         reset: " Voortgang gewist."}
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

  function typeset(el) {
    if (window.mmTypeset) window.mmTypeset(el);
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
      var value = parseNumber(input.value);
      var answer = Number(form.dataset.answer), tol = Number(form.dataset.tolerance);
      if (!isFinite(value)) return {answered: false, message: words(form).number};
      var sig = Number(form.dataset.sig || 3);
      var ok = Math.abs(value - answer) <= tol * Math.abs(answer) + 1e-12 ||
        Math.abs(value - roundSig(answer, sig)) <= 1e-9 * Math.max(1, Math.abs(answer));
      return {answered: true, ok: ok, response: input.value, explains: [form.dataset.explain]};
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

  function show(form, result, restored) {
    var box = form.querySelector(".mm-feedback");
    form.classList.remove("mm-ok", "mm-bad");
    if (!result.answered) { box.textContent = result.message; return; }
    form.classList.add(result.ok ? "mm-ok" : "mm-bad");
    var w = words(form);
    var head = result.ok ? w.right : w.wrong;
    if (!result.ok && form.dataset.type === "multiple") head += w.set;
    if (restored) head = w.earlier + head;
    var html = "<p class=\"mm-verdict\">" + head + "</p>";
    result.explains.forEach(function (e) { html += "<p>" + e + "</p>"; });
    box.innerHTML = html;
    typeset(box);
  }

  function progress(quiz) {
    var all = load()[quiz.dataset.bank] || {};
    var n = Number(quiz.dataset.count), right = 0, tried = 0;
    Object.keys(all).forEach(function (k) { tried += 1; if (all[k].ok) right += 1; });
    quiz.querySelector(".mm-progress").textContent = words(quiz).progress(n, right, tried);
  }

  function restore(form, rec) {
    if (form.dataset.type === "numeric") form.querySelector("input").value = rec.response;
    else form.querySelectorAll("input").forEach(function (inp) {
      inp.checked = rec.response.indexOf(Number(inp.value)) >= 0;
    });
    show(form, grade(form), true);
  }

  function init(quiz) {
    if (quiz.dataset.ready) return;
    quiz.dataset.ready = "1";
    var bank = quiz.dataset.bank;
    var saved = load()[bank] || {};
    quiz.querySelectorAll("form.mm-item").forEach(function (form) {
      if (form.dataset.type !== "numeric") shuffle(form);
      if (saved[form.dataset.item]) restore(form, saved[form.dataset.item]);
      form.addEventListener("submit", function (ev) {
        ev.preventDefault();
        var result = grade(form);
        show(form, result, false);
        if (result.answered) {
          var all = load();
          all[bank] = all[bank] || {};
          all[bank][form.dataset.item] = {ok: result.ok, response: result.response};
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

  document$.subscribe(function () { document.querySelectorAll(".mm-quiz").forEach(init); });
})();
