/* Step-through animations (tools/learner_hook.py embeds each one's frames, computed at build time by
 * minimega.figures.animations, as JSON in the data-frames attribute of <div class="mm-anim">).
 *
 * A frame is a grid of cells, each with a state (a CSS class: mm-s-full, mm-s-shard, ...) and a short
 * label, plus a caption in the page's language. Controls are native buttons (first, back, play/pause,
 * forward) and a range slider; the box itself takes the keys: ← and → step, space plays or pauses,
 * Home and End jump. The caption is a polite live region, so a screen reader hears each step's words.
 * The grid scrolls inside its own box when it is wider than the page (the pipeline grids at 390 px).
 * Every caption is also in the page as a list (the build writes it: the text alternative); with
 * prefers-reduced-motion nothing advances by itself: no play button, the list open, steps by hand.
 */
(function () {
  "use strict";
  var DELAY = 1100;
  var STILL = window.matchMedia && window.matchMedia("(prefers-reduced-motion: reduce)");

  function el(tag, cls, text) {
    var e = document.createElement(tag);
    if (cls) e.className = cls;
    if (text !== undefined) e.textContent = text;
    return e;
  }

  function button(label, text, onClick) {
    var b = el("button", "md-button mm-anim-btn", text);
    b.type = "button";
    b.setAttribute("aria-label", label);
    b.title = label;
    b.addEventListener("click", onClick);
    return b;
  }

  function init(box) {
    if (box.dataset.ready) return;
    box.dataset.ready = "1";
    var data = JSON.parse(box.dataset.frames);
    var w = JSON.parse(box.dataset.words);
    var frames = data.frames, i = 0, timer = null;

    box.appendChild(el("p", "mm-anim-title", data.title));
    var scroller = el("div", "mm-anim-scroll");
    var table = el("table", "mm-anim-grid" + (data.compact ? " mm-anim-compact" : ""));
    var thead = el("thead"), hr = el("tr");
    hr.appendChild(el("td", ""));                 // the corner: no header cell without a header
    data.cols.forEach(function (c) { var th = el("th", "", c); th.scope = "col"; hr.appendChild(th); });
    thead.appendChild(hr);
    table.appendChild(thead);
    var tbody = el("tbody"), cells = [];
    data.rows.forEach(function (r) {
      var tr = el("tr"), th = el("th", "", r), row = [];
      th.scope = "row";
      tr.appendChild(th);
      data.cols.forEach(function () { var td = el("td"); tr.appendChild(td); row.push(td); });
      tbody.appendChild(tr);
      cells.push(row);
    });
    table.appendChild(tbody);
    scroller.appendChild(table);
    box.appendChild(scroller);

    var legend = el("p", "mm-anim-legend");
    Object.keys(data.legend).forEach(function (k) {
      var item = el("span", "mm-anim-key");
      item.appendChild(el("span", "mm-anim-swatch mm-s-" + k));
      item.appendChild(document.createTextNode(" " + data.legend[k]));
      legend.appendChild(item);
    });
    box.appendChild(legend);

    var caption = el("p", "mm-anim-caption");
    caption.setAttribute("role", "status");
    caption.setAttribute("aria-live", "polite");
    var controls = el("div", "mm-anim-controls");
    var first = button(w.first, "|◀", function () { stop(); go(0); });
    var back = button(w.back, "◀", function () { stop(); go(i - 1); });
    var play = button(w.play, "▶", function () { timer ? stop() : start(); });
    var fwd = button(w.forward, "▶|", function () { stop(); go(i + 1); });
    fwd.textContent = "▶▶";
    var slider = el("input", "mm-anim-slider");
    slider.type = "range"; slider.min = 0; slider.max = frames.length - 1; slider.value = 0;
    slider.setAttribute("aria-label", w.frame);
    slider.addEventListener("input", function () { stop(); go(Number(slider.value)); });
    var count = el("span", "mm-anim-count");
    [first, back, play, fwd, slider, count].forEach(function (c) { controls.appendChild(c); });
    box.appendChild(controls);
    box.appendChild(caption);
    box.appendChild(el("p", "mm-anim-keys", w.keys));
    var steps = box.querySelector(".mm-anim-steps");
    if (steps) box.appendChild(steps);                 // the captions as a list, below the controls
    function motion() {
      var still = !!(STILL && STILL.matches);
      play.hidden = still;
      if (steps && still) steps.open = true;
      if (still) stop();
    }
    motion();
    if (STILL && STILL.addEventListener) STILL.addEventListener("change", motion);
    box.tabIndex = 0;
    box.setAttribute("role", "group");
    box.setAttribute("aria-label", data.title);

    function go(n) {
      i = Math.max(0, Math.min(frames.length - 1, n));
      var f = frames[i];
      f.cells.forEach(function (row, r) {
        row.forEach(function (c, k) {
          var td = cells[r][k];
          td.className = "mm-s-" + c.s;
          td.textContent = c.t;
        });
      });
      (f.active || []).forEach(function (rc) {
        var td = cells[rc[0]] && cells[rc[0]][rc[1]];
        if (td) td.classList.add("mm-active");
      });
      caption.textContent = f.caption;
      slider.value = i;
      count.textContent = w.frame + " " + (i + 1) + " " + w.of + " " + frames.length;
      box.dataset.frame = String(i);
      back.disabled = i === 0;
      fwd.disabled = i === frames.length - 1;
      if (i === frames.length - 1) stop();
    }
    function start() {
      if (STILL && STILL.matches) return;               // prefers-reduced-motion: by hand only
      if (i === frames.length - 1) go(0);
      play.textContent = "❚❚"; play.setAttribute("aria-label", w.pause); play.title = w.pause;
      timer = setInterval(function () { go(i + 1); }, DELAY);
    }
    function stop() {
      if (timer) clearInterval(timer);
      timer = null;
      play.textContent = "▶"; play.setAttribute("aria-label", w.play); play.title = w.play;
    }
    box.addEventListener("keydown", function (ev) {
      if (ev.target.tagName === "INPUT" && (ev.key === "ArrowLeft" || ev.key === "ArrowRight")) return;
      var keys = {ArrowRight: function () { stop(); go(i + 1); }, ArrowLeft: function () { stop(); go(i - 1); },
                  Home: function () { stop(); go(0); }, End: function () { stop(); go(frames.length - 1); },
                  " ": function () { timer ? stop() : start(); }};
      if (ev.target.tagName === "BUTTON" && ev.key === " ") return;     // a button's own activation
      if (keys[ev.key]) { ev.preventDefault(); keys[ev.key](); }
    });
    go(0);
  }

  document$.subscribe(function () { document.querySelectorAll(".mm-anim").forEach(init); });
})();
