/* Typeset math with the self-hosted KaTeX. pymdownx.arithmatex (generic mode) leaves
 * <span class="arithmatex">\( … \)</span> and <div class="arithmatex">\[ … \]</div>; so do the quiz
 * questions. A formula is typeset when it comes within a screen's height of view (a chapter opens without
 * typesetting the forty formulas below it; one below the screen changes size where no one sees it move),
 * all of them before printing, and on demand (window.mmTypeset(root), the quiz's questions). */
(function () {
  "use strict";
  function one(el) {
    if (el.dataset.typeset) return;
    var tex = el.textContent.trim();
    var display = el.tagName === "DIV" || tex.indexOf("\\[") === 0;
    tex = tex.replace(/^\\[([]/, "").replace(/\\[)\]]$/, "");
    katex.render(tex, el, {displayMode: display, throwOnError: false, strict: "ignore"});
    el.dataset.typeset = "1";
  }
  function typeset(root) { root.querySelectorAll(".arithmatex").forEach(one); }

  var near = "IntersectionObserver" in window ? new IntersectionObserver(function (entries) {
    entries.forEach(function (e) {
      if (e.isIntersecting) { near.unobserve(e.target); one(e.target); }
    });
  }, {rootMargin: "100% 0px"}) : null;
  function watch(root) {
    root.querySelectorAll(".arithmatex").forEach(function (el) {
      if (!el.dataset.typeset) { if (near) near.observe(el); else one(el); }
    });
  }

  window.mmTypeset = typeset;
  window.addEventListener("beforeprint", function () { typeset(document.body); });
  document$.subscribe(function () { watch(document.body); });
})();
