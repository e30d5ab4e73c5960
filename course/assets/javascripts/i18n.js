/* The language switcher (material's extra.alternate, set up by mkdocs-static-i18n): each of its links is pointed
 * at the page shown in that language (English at the site root, Dutch under nl/), at the same section
 * (location.hash), so switching language keeps the reader's place.
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

  window.addEventListener("hashchange", update);
  if (typeof document$ !== "undefined") document$.subscribe(update);
  else update();
})();
