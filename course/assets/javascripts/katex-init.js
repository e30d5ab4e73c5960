/* Typeset math with the self-hosted KaTeX. pymdownx.arithmatex (generic mode) leaves
 * <span class="arithmatex">\( … \)</span> and <div class="arithmatex">\[ … \]</div>; so do the quiz
 * questions. Runs on every page swap (document$) and on demand (window.mmTypeset). */
(function () {
  "use strict";
  function typeset(root) {
    root.querySelectorAll(".arithmatex").forEach(function (el) {
      if (el.dataset.typeset) return;
      var tex = el.textContent.trim();
      var display = el.tagName === "DIV" || tex.indexOf("\\[") === 0;
      tex = tex.replace(/^\\[([]/, "").replace(/\\[)\]]$/, "");
      katex.render(tex, el, {displayMode: display, throwOnError: false, strict: "ignore"});
      el.dataset.typeset = "1";
    });
  }
  window.mmTypeset = typeset;
  document$.subscribe(function () { typeset(document.body); });
})();
