/* Math that a script writes into the page (the practice quiz's questions): typeset in the browser with the
 * self-hosted KaTeX, which is fetched the first time such a formula needs it (window.mmTypeset(root)). The
 * page's own formulas were typeset when the site was built (tools/math_hook.py), so a page that writes none never
 * loads KaTeX's script. pymdownx.arithmatex's markup: <span class="arithmatex">\( … \)</span> and
 * <div class="arithmatex">\[ … \]</div>; a typeset one carries data-typeset="1". */
(function () {
  "use strict";
  var script = document.currentScript && document.currentScript.src;
  var KATEX = new URL("../vendor/katex/katex.min.js", script || location.href).href;
  var loading = null;

  function withKatex(fn) {
    if (window.katex) return fn();
    if (!loading) {
      loading = new Promise(function (resolve, reject) {
        var tag = document.createElement("script");
        tag.src = KATEX;
        tag.onload = resolve;
        tag.onerror = function () { loading = null; reject(new Error("KaTeX did not load: " + KATEX)); };
        document.head.appendChild(tag);
      });
    }
    loading.then(fn, function () { /* the formulas stay as TeX source */ });
  }

  function one(el) {
    if (el.dataset.typeset) return;
    var tex = el.textContent.trim();
    var display = el.tagName === "DIV" || tex.indexOf("\\[") === 0;
    tex = tex.replace(/^\\[([]/, "").replace(/\\[)\]]$/, "");
    window.katex.render(tex, el, {displayMode: display, throwOnError: false, strict: "ignore"});
    el.dataset.typeset = "1";
  }
  function typeset(root) {
    var todo = Array.prototype.filter.call(root.querySelectorAll(".arithmatex"), function (el) {
      return !el.dataset.typeset;
    });
    if (todo.length) withKatex(function () { todo.forEach(one); });
  }

  window.mmTypeset = typeset;
  document$.subscribe(function () { typeset(document.body); });   // any formula the build left (none, as built)
})();
