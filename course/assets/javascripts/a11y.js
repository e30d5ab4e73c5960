/* What mkdocs-material 9.8 leaves out for WCAG 2.1 AA, added once per page, after its first paint (and again after
 * each resize or new content):
 *
 * - A box that scrolls sideways (a wide table, a long formula, a step-through's grid on a phone) takes the
 *   keyboard focus, so it can be scrolled with the arrow keys (2.1.1, axe's scrollable-region-focusable): it
 *   gets tabindex="0", role="region" and a name (the table's caption or the step-through's title, else what it
 *   is). A box that fits again loses them: no tab stop that does nothing.
 */
(function () {
  "use strict";
  if (window.mmA11y) return;
  window.mmA11y = true;
  var WORDS = {
    en: {table: "Table", formula: "Formula", grid: "Grid", code: "Code", tabs: "Tabs", scrolls: "scrolls sideways"},
    nl: {table: "Tabel", formula: "Formule", grid: "Raster", code: "Code", tabs: "Tabbladen", scrolls: "schuift opzij"}
  };
  var KINDS = [
    [".md-typeset__scrollwrap, .mm-calc-table, .mm-table-scroll", "table"],
    [".tabbed-labels", "tabs"],
    ["div.arithmatex, .katex-display", "formula"],
    [".mm-anim-scroll", "grid"],
    [".md-typeset pre > code", "code"]
  ];

  function words() {
    var lang = (document.documentElement.lang || "en").slice(0, 2);
    return WORDS[lang] || WORDS.en;
  }

  function nameOf(box, kind, w) {
    var caption = box.querySelector("caption");
    var anim = box.closest(".mm-anim");
    var title = caption ? caption.textContent : anim ? anim.getAttribute("aria-label") : "";
    return (title ? title.trim() : w[kind]) + ", " + w.scrolls;
  }

  function scan() {
    // Every box is measured first, then changed: a change between two measurements would make the browser lay
    // the whole page out again for the next one (on a long chapter, seconds of a phone's CPU).
    var w = words(), seen = new Set(), found = [];
    KINDS.forEach(function (pair) {
      document.querySelectorAll(pair[0]).forEach(function (box) {
        if (seen.has(box)) return;
        seen.add(box);
        // a closed <details> is not laid out: measuring inside it would lay it out, once per box
        if (box.closest("details:not([open])")) return;
        found.push([box, pair[1], box.scrollWidth > box.clientWidth + 1 && getComputedStyle(box).overflowX !== "visible"]);
      });
    });
    found.forEach(function (f) {
      var box = f[0], scrolls = f[2];
      if (box.parentElement && box.parentElement.closest("[data-mm-scroll-region]")) return;   // inside a region
      if (scrolls && !box.hasAttribute("tabindex")) {
        box.setAttribute("tabindex", "0");
        box.setAttribute("role", "region");
        box.setAttribute("aria-label", nameOf(box, f[1], w));
        box.setAttribute("data-mm-scroll-region", "");
      } else if (!scrolls && box.hasAttribute("data-mm-scroll-region")) {
        ["tabindex", "role", "aria-label", "data-mm-scroll-region"].forEach(function (a) { box.removeAttribute(a); });
      }
    });
  }

  var pending = 0;
  function later() {
    if (pending) return;
    pending = setTimeout(function () { pending = 0; scan(); }, 150);
  }
  window.addEventListener("resize", later);
  document.addEventListener("toggle", later, true);              // a <details> opened: its boxes can be measured
  document.addEventListener("change", function (ev) {            // another tab shown
    if (ev.target.closest && ev.target.closest(".tabbed-set")) later();
  });
  new MutationObserver(function (records) {
    // only new elements matter (a step-through's frame rewrites its cells' text; that changes no box)
    for (var i = 0; i < records.length; i++)
      for (var j = 0; j < records[i].addedNodes.length; j++) if (records[i].addedNodes[j].nodeType === 1) { later(); return; }
  }).observe(document.documentElement, {childList: true, subtree: true});
  // After the first paint: the page is laid out by then, so measuring its boxes costs no extra layout.
  function afterPaint() { requestAnimationFrame(function () { setTimeout(scan, 0); }); }
  if (window.document$) window.document$.subscribe(afterPaint);
  else document.addEventListener("DOMContentLoaded", afterPaint);
  window.mmA11yScan = scan;           // the tests call it to settle a page before they measure it
})();
