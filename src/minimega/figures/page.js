/* Runs inside a figure's page (`minimega.figures.plots.figure_html`), usually inside an iframe of a course page.
 *
 * 1. Theme: follow the course page's palette (mkdocs-material sets data-md-color-scheme on <body>:
 *    "default" or "slate"), else the reader's preferred scheme.
 * 2. Fit: rewrap the title and the category tick labels to the width the figure has, so nothing is
 *    clipped and no label has to be rotated into its neighbour, at 390 px as at 1280 px.
 * 3. Height: tell the parent page how tall the frame must be for the plot area to keep a legible
 *    height under the wrapped title, tick labels and legend (figures.js on the course page listens).
 */
(function () {
  "use strict";
  var gd = document.getElementById("{plot_id}");
  var meta = gd.layout.meta || {};
  var fullTitle = meta.title || (gd.layout.title && gd.layout.title.text) || "";
  var categories = {};                  // axis name -> its categories as Python wrote them
  var titles = {}, baseSize = {};       // axis name -> its title, its tick font size, as Python wrote them
  Object.keys(gd.layout).forEach(function (k) {
    if (/^[xy]axis[0-9]*$/.test(k)) categories[k] = null;
  });

  function scheme() {
    try { var s = window.parent.document.body.getAttribute("data-md-color-scheme"); if (s) return s; } catch (e) {}
    return window.matchMedia("(prefers-color-scheme: dark)").matches ? "slate" : "default";
  }

  function theme() {
    var dark = scheme() === "slate";
    var fg = dark ? "#e3e5ea" : "#1f2430", grid = dark ? "rgba(227,229,234,0.16)" : "rgba(31,36,48,0.12)";
    var upd = {"font.color": fg, "title.font.color": fg, "legend.font.color": fg};
    Object.keys(categories).forEach(function (k) {
      upd[k + ".gridcolor"] = grid; upd[k + ".zerolinecolor"] = grid; upd[k + ".linecolor"] = grid;
    });
    document.documentElement.style.colorScheme = dark ? "dark" : "light";
    return Plotly.relayout(gd, upd);
  }

  var ctx = document.createElement("canvas").getContext("2d");
  function textWidth(text, font) {
    ctx.font = font.size + "px " + font.family;
    return ctx.measureText(text).width;
  }

  /* Greedy word wrap of `text` into lines at most `width` px wide; an authored <br> stays a break. With
   * `label`, a text that does not fit on one line breaks before its parenthesis first ("DDP / (stage 0)"). */
  function wrap(text, width, font, label) {
    return String(text).split(/<br\s*\/?>/i).map(function (part) {
      var pieces = label && textWidth(part, font) > width ? part.split(/ (?=\()/) : [part];
      return pieces.map(function (piece) {
        var lines = [], line = "";
        piece.split(/\s+/).filter(Boolean).forEach(function (w) {
          var next = line ? line + " " + w : w;
          if (line && textWidth(next, font) > width) { lines.push(line); line = w; } else line = next;
        });
        if (line) lines.push(line);
        return lines.join("<br>");
      }).join("<br>");
    }).join("<br>");
  }

  function wider(text, width, font) {
    return String(text).split(/<br\s*\/?>/i).some(function (l) { return textWidth(l, font) > width; });
  }

  var names = gd.data.map(function (t) { return t.name; });    // legend entries as Python wrote them

  /* The update that fits the current width ({data, layout}), or null when the figure already fits. */
  function fitting() {
    var fl = gd._fullLayout, size = fl._size, upd = {}, changed = false;
    var title = wrap(fullTitle, Math.max(120, fl.width - 24), fl.title.font);
    if (title !== fl.title.text) { upd["title.text"] = title; changed = true; }
    Object.keys(categories).forEach(function (k) {
      var ax = fl[k];
      if (!ax) return;
      var span = (ax.domain[1] - ax.domain[0]) * (k[0] === "x" ? size.w : size.h);
      var axisTitle = ax.title && ax.title.text;
      if (axisTitle) {            // centred on its axis; a y title wraps at the plot's least height, not its current one
        if (!(k in titles)) titles[k] = axisTitle;
        var t = wrap(titles[k], k[0] === "x" ? Math.max(80, span) : Math.max(200, span), ax.title.font);
        if (t !== axisTitle) { upd[k + ".title.text"] = t; changed = true; }
      }
      if (ax.type !== "category") return;
      if (categories[k] === null) categories[k] = (ax._categories || []).slice();
      var cats = categories[k];
      if (!cats.length) return;
      // x: each label gets its slot; y: labels may take up to a third of the figure's width
      var limit = k[0] === "x" ? Math.max(40, span / cats.length - 2) : Math.max(80, fl.width / 3);
      var font = {family: ax.tickfont.family, size: baseSize[k] || (baseSize[k] = ax.tickfont.size)};
      var text = cats.map(function (c) { return wrap(c, limit, font, true); });
      var tooWide = function () { return text.some(function (t) { return wider(t, limit, font); }); };
      if (k[0] === "x" && tooWide()) {                // a long word: try a smaller font first
        font.size = Math.max(10, Math.round(font.size * 0.85));
        text = cats.map(function (c) { return wrap(c, limit, font, true); });
      }
      // a word still wider than its slot stands upright rather than slanting into the next label
      var angle = k[0] === "x" && tooWide() ? -90 : 0;
      if (angle) text = cats.slice();                 // upright labels need no wrapping
      var same = ax.ticktext && ax.ticktext.length === text.length && ax.tickfont.size === font.size &&
                 ax.tickangle === angle && ax.ticktext.every(function (t, i) { return t === text[i]; });
      if (!same) {
        upd[k + ".tickmode"] = "array"; upd[k + ".tickvals"] = cats; upd[k + ".ticktext"] = text;
        upd[k + ".tickfont.size"] = font.size; upd[k + ".tickangle"] = angle;
        changed = true;
      }
    });
    // a legend entry is its symbol (~50 px) and its text: wrap the text to the figure's width
    var legendFont = fl.showlegend && fl.legend ? fl.legend.font : fl.font;
    var wrapped = names.map(function (n) { return n ? wrap(n, Math.max(120, fl.width - 70), legendFont) : n; });
    var data = {name: [], idx: []};
    wrapped.forEach(function (n, i) { if (n !== gd.data[i].name) { data.name.push(n); data.idx.push(i); } });
    if (data.idx.length) changed = true;
    return changed ? {data: data, layout: upd} : null;
  }

  var asked = {width: 0, times: 0};
  function reportHeight() {
    var fl = gd._fullLayout;
    // a layout whose margins follow its height could make the frame grow and shrink for ever: at one
    // width the figure asks a few times at most
    if (asked.width !== fl.width) { asked.width = fl.width; asked.times = 0; }
    if (++asked.times > 6) return;
    // the plot area keeps at least ~0.6 of the width (220 to 320 px) below the title, above ticks and legend
    var plot = Math.min(320, Math.max(220, 0.6 * fl.width));
    var need = Math.ceil(fl._size.t + fl._size.b + plot);
    document.body.setAttribute("data-mm-height", need);
    // settled: this page fits its width and already has the height it asks for (tests wait for this)
    document.body.setAttribute("data-mm-fit", Math.abs(window.innerHeight - need) <= 1 ? "settled" : "asking");
    if (window.parent !== window)
      window.parent.postMessage({type: "mm-figure-height", height: need}, window.location.origin);
  }

  var busy = null, again = false;
  function fit() {
    if (busy) { again = true; return busy; }         // a resize while fitting: fit once more after
    var passes = 0;
    function step() {
      var upd = passes++ < 4 ? fitting() : null;      // margins follow the labels: settle in a few passes
      if (!upd) return null;
      var done = upd.data.idx.length ? Plotly.update(gd, {name: upd.data.name}, upd.layout, upd.data.idx)
                                     : Plotly.relayout(gd, upd.layout);
      return done.then(step);
    }
    busy = Promise.resolve().then(step).catch(function (e) { console.error("figure fit failed:", e); }).then(function () {
      busy = null;
      if (again) { again = false; return fit(); }
      reportHeight();
    });
    return busy;
  }

  theme().then(fit);
  try {
    new MutationObserver(theme).observe(window.parent.document.body,
      {attributes: true, attributeFilter: ["data-md-color-scheme"]});
  } catch (e) {}
  window.addEventListener("resize", function () { Plotly.Plots.resize(gd).then(fit); });
  window.addEventListener("message", function (ev) {
    if (ev.source === window.parent && ev.data && ev.data.type === "mm-figure-measure") fit().then(reportHeight);
  });
})();
