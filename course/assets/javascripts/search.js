/* Search, in the header's search box (material's markup and styles). The index mkdocs' search plugin writes,
 * split per language by tools/learner_hook.py (English at search/search_index.json, Dutch at
 * nl/search/search_index.json), is fetched the first time the box opens, not with the page.
 *
 * A page or section matches when every word of the query starts a word in its title or text ("grad" finds
 * "gradients"; accents are ignored, so "gradient" finds "gradiënt"). Matches in the title count ten times
 * those in the text. Results are links; ArrowDown and ArrowUp move through them, Escape closes the box.
 */
(function () {
  "use strict";
  if (window.mmSearch) return;
  var MAX = 30, SNIPPET = 160;
  var toggle = document.getElementById("__search");
  var input = document.querySelector(".md-search__input");
  var meta = document.querySelector(".md-search-result__meta");
  var list = document.querySelector(".md-search-result__list");
  if (!toggle || !input || !meta || !list) return;
  var words = window.mmThemeWords || {};
  var docs = null, loading = null;

  function fold(s) {           // lower case, no accents, words separated by single spaces
    return " " + s.toLowerCase().normalize("NFD").replace(/[\u0300-\u036f]/g, "")
      .replace(/[^a-z0-9]+/g, " ").trim() + " ";
  }
  function plain(html) {       // the index holds HTML; its text, never parsed as markup into the page
    return html.replace(/<[^>]*>/g, " ").replace(/&lt;/g, "<").replace(/&gt;/g, ">").replace(/&quot;/g, '"')
      .replace(/&#39;/g, "'").replace(/&amp;/g, "&").replace(/\s+/g, " ").trim();
  }
  function root() { return typeof __md_scope !== "undefined" ? __md_scope : new URL("/", location.href); }
  function indexUrl() {
    var lang = (document.documentElement.lang || "en").slice(0, 2).toLowerCase();
    return new URL((lang === "en" ? "" : lang + "/") + "search/search_index.json", root()).href;
  }

  function load() {
    if (!loading) {
      loading = fetch(indexUrl()).then(function (r) {
        if (!r.ok) throw new Error("search index: HTTP " + r.status);
        return r.json();
      }).then(function (index) {
        // a location must stay on this site: a "javascript:" or foreign one would become a link in the results
        var all = (index.docs || []).filter(function (d) {
          if (!d || typeof d.location !== "string") return false;
          try { return new URL(d.location, root()).origin === location.origin; } catch (e) { return false; }
        });
        var pages = {};          // a section's result names its page: "3. ZeRO stages 1, 2 and 3 › Code"
        all.forEach(function (d) { if (d.location.indexOf("#") < 0) pages[d.location] = plain(String(d.title || "")); });
        docs = all.map(function (d) {
          var text = plain(String(d.text || "")), title = plain(String(d.title || ""));
          var page = pages[d.location.split("#")[0]];
          return {href: new URL(d.location, root()).href, title: title, text: text,
                  shown: d.location.indexOf("#") >= 0 && page ? page + " › " + title : title,
                  ftitle: fold(title), ftext: fold(text)};
        });
      });
      loading.catch(function () { meta.textContent = words["search.result.none"] || "No matching documents"; });
    }
    return loading;
  }

  function count(hay, needle) {
    var n = 0, i = hay.indexOf(needle);
    while (i >= 0 && n < 50) { n += 1; i = hay.indexOf(needle, i + needle.length); }
    return n;
  }
  function query(q) {
    var terms = fold(q).trim().split(" ").filter(Boolean);
    if (!terms.length) return [];
    var hits = [];
    docs.forEach(function (d) {
      var score = 0;
      for (var i = 0; i < terms.length; i++) {
        var t = " " + terms[i], inTitle = count(d.ftitle, t), inText = count(d.ftext, t);
        if (!inTitle && !inText) return;
        score += 10 * inTitle + inText;
      }
      hits.push([score, d]);
    });
    hits.sort(function (a, b) { return b[0] - a[0]; });
    return hits.map(function (h) { return h[1]; });
  }
  function snippet(d, q) {
    var first = fold(q).trim().split(" ")[0] || "";
    var at = d.text.toLowerCase().normalize("NFD").replace(/[\u0300-\u036f]/g, "").indexOf(first);
    var start = Math.max(0, (at < 0 ? 0 : at) - 40);
    var s = d.text.slice(start, start + SNIPPET);
    return (start ? "… " : "") + s + (start + SNIPPET < d.text.length ? " …" : "");
  }
  function plural(n) {
    if (!n) return words["search.result.none"] || "No matching documents";
    if (n === 1) return words["search.result.one"] || "1 matching document";
    return (words["search.result.other"] || "# matching documents").replace("#", String(n));
  }

  function render() {
    var q = input.value;
    list.textContent = "";
    if (!q.trim()) { meta.textContent = words["search.result.placeholder"] || "Type to start searching"; return; }
    if (!docs) return;
    var found = query(q);
    meta.textContent = plural(found.length);
    var frag = document.createDocumentFragment();
    found.slice(0, MAX).forEach(function (d) {
      var li = document.createElement("li"), a = document.createElement("a");
      var article = document.createElement("article"), h = document.createElement(d.href.indexOf("#") < 0 ? "h1" : "h2");
      var p = document.createElement("p");
      li.className = "md-search-result__item";
      a.className = "md-search-result__link";
      a.href = d.href;
      article.className = "md-search-result__article md-typeset";
      h.textContent = d.shown;
      p.textContent = snippet(d, q);
      article.append(h, p);
      a.appendChild(article);
      li.appendChild(a);
      frag.appendChild(li);
    });
    list.appendChild(frag);
  }

  function open() {
    if (!toggle.checked) { toggle.checked = true; }
    input.focus();
    load().then(render, function () {});
  }
  function close() {
    toggle.checked = false;
    input.blur();
  }
  input.addEventListener("focus", function () { if (!toggle.checked) toggle.checked = true; load().then(render, function () {}); });
  input.addEventListener("input", function () { if (docs) render(); else load().then(render, function () {}); });
  toggle.addEventListener("change", function () { if (toggle.checked) open(); else input.blur(); });
  input.form.addEventListener("submit", function (ev) {        // Enter: the first result
    ev.preventDefault();
    var first = list.querySelector("a");
    if (first) first.click();
  });
  input.form.addEventListener("reset", function () { setTimeout(function () { render(); input.focus(); }, 0); });

  document.addEventListener("keydown", function (ev) {
    if (!toggle.checked) return;
    if (ev.key === "Escape") { ev.preventDefault(); close(); return; }
    if (ev.key !== "ArrowDown" && ev.key !== "ArrowUp") return;
    var links = Array.prototype.slice.call(list.querySelectorAll("a"));
    if (!links.length) return;
    var at = links.indexOf(document.activeElement);
    var next = ev.key === "ArrowDown" ? at + 1 : at - 1;
    ev.preventDefault();
    if (next < 0) input.focus();
    else links[Math.min(next, links.length - 1)].focus();
  });

  window.mmSearch = {open: open, close: close};
})();
