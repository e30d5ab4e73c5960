/* Quiz progress at a glance (quiz.js keeps each answer in localStorage under "minimega.quiz.v1", keyed by
 * bank, one record for both languages: the English and Dutch quizzes are twins). The home page's summary
 * (tools/learner_hook.py progress_summary) shows, per chapter, how many of its questions this browser
 * answered correctly, in either language, with one button that clears it; each chapter with a quiz gets
 * a line under its title that links to the quiz. Records kept per language by an older version
 * ("<lang>/<bank>") are counted with their bank.
 */
(function () {
  "use strict";
  var STORE = "minimega.quiz.v1";
  var WORDS = {
    en: {line: function (r, n, t) { return r + " of " + n + " right (" + t + " tried)"; },
         chapter: function (r, n, t) { return "Your quiz progress in this chapter: " + r + " of " + n + " right (" + t + " tried)."; },
         total: function (r, n, c) { return r + " of " + n + " questions right, in " + c + (c === 1 ? " chapter." : " chapters."); },
         none: "No quiz answered yet in this browser.", go: "Go to the quiz", cleared: "Progress cleared."},
    nl: {line: function (r, n, t) { return r + " van " + n + " goed (" + t + " geprobeerd)"; },
         chapter: function (r, n, t) { return "Je quizvoortgang in dit hoofdstuk: " + r + " van " + n + " goed (" + t + " geprobeerd)."; },
         total: function (r, n, c) { return r + " van " + n + " vragen goed, in " + c + (c === 1 ? " hoofdstuk." : " hoofdstukken."); },
         none: "Nog geen quizvraag beantwoord in deze browser.", go: "Naar de quiz", cleared: "Voortgang gewist."}
  };
  function load() {
    var all;
    try { all = JSON.parse(localStorage.getItem(STORE)) || {}; } catch (e) { return {}; }
    Object.keys(all).forEach(function (k) {            // "<lang>/<bank>": counted with its bank
      var m = /^[a-z]{2}\/(.+)$/.exec(k);
      if (!m) return;
      var into = all[m[1]] = all[m[1]] || {};
      Object.keys(all[k]).forEach(function (item) { if (!into[item] || (!into[item].ok && all[k][item].ok)) into[item] = all[k][item]; });
      delete all[k];
    });
    return all;
  }
  function lang(el) { var b = el.closest("[lang]"); return (b && b.lang || "en").slice(0, 2).toLowerCase(); }
  function tally(rec) {
    var r = 0, t = 0;
    Object.keys(rec || {}).forEach(function (k) { t += 1; if (rec[k].ok) r += 1; });
    return [r, t];
  }

  function summary(box) {
    var l = lang(box), w = WORDS[l] || WORDS.en, all = load(), right = 0, n = 0, chapters = 0;
    box.querySelectorAll("li[data-bank]").forEach(function (li) {
      var c = Number(li.dataset.count), rt = tally(all[li.dataset.bank]);
      n += c;
      right += rt[0];
      if (rt[1]) chapters += 1;
      var text = li.querySelector(".mm-progress-text");
      text.textContent = rt[1] ? "— " + w.line(rt[0], c, rt[1]) : "";
      var bar = li.querySelector(".mm-progress-bar");
      if (rt[1] && !bar) {
        bar = document.createElement("span");
        bar.className = "mm-progress-bar";
        bar.setAttribute("aria-hidden", "true");
        bar.appendChild(document.createElement("span"));
        li.appendChild(bar);
      }
      if (bar) bar.firstChild.style.width = (rt[1] ? 100 * rt[0] / c : 0) + "%";
      li.dataset.right = String(rt[0]);
      li.dataset.tried = String(rt[1]);
    });
    box.querySelector(".mm-progress-total").textContent = chapters ? w.total(right, n, chapters) : w.none;
  }

  function chapterLine(quiz) {
    var article = document.querySelector("article h1");
    if (!article) return;
    var l = lang(quiz), w = WORDS[l] || WORDS.en;
    var line = document.querySelector(".mm-chapter-progress");
    if (!line) {
      line = document.createElement("p");
      line.className = "mm-chapter-progress mm-progress-summary";
      article.after(line);
    }
    var rt = tally(load()[quiz.dataset.bank]), n = Number(quiz.dataset.count);
    line.textContent = "";
    line.appendChild(document.createTextNode(w.chapter(rt[0], n, rt[1]) + " "));
    var a = document.createElement("a");
    a.href = "#quiz";
    a.textContent = w.go;
    line.appendChild(a);
  }

  function update() {
    document.querySelectorAll(".mm-progress-summary[lang]").forEach(summary);
    var quiz = document.querySelector(".mm-quiz[data-bank]");
    if (quiz && /^\d\d-/.test(quiz.dataset.bank)) chapterLine(quiz);
  }

  document.addEventListener("click", function (ev) {
    var b = ev.target.closest && ev.target.closest(".mm-progress-reset");
    if (!b) return;
    var box = b.closest(".mm-progress-summary"), l = lang(box);
    try { localStorage.removeItem(STORE); } catch (e) { /* not kept */ }
    update();
    box.querySelector(".mm-progress-total").textContent += " " + (WORDS[l] || WORDS.en).cleared;
  });
  document.addEventListener("mm-quiz-progress", update);
  document$.subscribe(update);
})();
