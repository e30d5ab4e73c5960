/* The language switcher (material's extra.alternate, set up by mkdocs-static-i18n) under instant
 * navigation. Instant navigation swaps a page's content but keeps the header, so the switcher's
 * links would still point at the first page loaded, and <html lang> (which the quiz, exam and verify
 * scripts read) would keep that page's language. So: after every page swap each switcher link is
 * rewritten to the current page in its language (English at the site root, Dutch under nl/), and a
 * click on one is a full page load, which brings the other language's header, search and lang.
 */
(function () {
  "use strict";
  var PREFIX = { en: "", nl: "nl/" };

  function siteRoot() {
    return typeof __md_scope !== "undefined" ? new URL(__md_scope) : new URL(".", location.href);
  }

  /* The current page's path below the site root without its language prefix ("03-zero/"). */
  function pagePath(root) {
    var path = decodeURI(location.pathname).slice(decodeURI(root.pathname).length);
    Object.keys(PREFIX).forEach(function (lang) {
      if (PREFIX[lang] && path.indexOf(PREFIX[lang]) === 0) path = path.slice(PREFIX[lang].length);
    });
    return path;
  }

  function alternate(lang) {
    var root = siteRoot();
    return new URL((PREFIX[lang] || "") + pagePath(root), root).href + location.hash;
  }

  function update() {
    document.querySelectorAll("a.md-select__link[hreflang]").forEach(function (a) {
      if (a.hreflang in PREFIX) a.href = alternate(a.hreflang);
    });
  }

  document.addEventListener("click", function (ev) {
    var a = ev.target.closest && ev.target.closest("a.md-select__link[hreflang]");
    if (!a || !(a.hreflang in PREFIX) || ev.button !== 0 || ev.metaKey || ev.ctrlKey || ev.shiftKey) return;
    ev.preventDefault();
    ev.stopImmediatePropagation();        // not instant navigation: the other language needs its own header
    location.assign(alternate(a.hreflang));
  }, true);

  if (typeof document$ !== "undefined") document$.subscribe(update);
  else update();
})();
