/* Step-through animations (tools/learner_hook.py embeds each one's frames, computed at build time by
 * minimega.figures.animations, as JSON in the data-frames attribute of <div class="mm-anim">).
 *
 * A frame is a grid of cells, each with a state (a CSS class: mm-s-full, mm-s-shard, ...) and a short
 * label, plus a caption in the page's language. Controls are native buttons (first, back, play/pause,
 * forward) and a range slider; the box itself takes the keys: ← and → step, space plays or pauses,
 * Home and End jump. The caption is a polite live region, so a screen reader hears each step's words.
 * The grid scrolls inside its own box when it is wider than the page (the pipeline grids at 390 px), and
 * each step scrolls it to the frame's active cells, so a phone follows the active column.
 * A meter under the grid runs with the frames (where memory is the point, the bytes on one rank): its words
 * come with each frame, its bar is the value over the animation's largest. With `prefers-reduced-motion`,
 * nothing moves by itself: no smooth scrolling, no transitions (animate.css), and Play steps only when asked.
 * The hook puts every caption in an ordered list inside the box (the text alternative); it stays last.
 * With prefers-reduced-motion the Play button is hidden and the list of captions open: steps by hand only.
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
    function reduced() {                            // asked each time: the reader may change it while reading
      return !!(window.matchMedia && window.matchMedia("(prefers-reduced-motion: reduce)").matches);
    }
    var steps = box.querySelector(".mm-anim-text");

    box.appendChild(el("p", "mm-anim-title", data.title));
    var scroller = el("div", "mm-anim-scroll");
    scroller.tabIndex = 0;                          // a region that may scroll sideways is reachable by keyboard
    scroller.setAttribute("role", "region");
    scroller.setAttribute("aria-label", data.title);
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

    var meter = null, meterValue = null, bar = null, top = 0;
    if (data.meter_label) {
      frames.forEach(function (f) { if (f.meter) top = Math.max(top, Math.abs(f.meter.value)); });
      meter = el("p", "mm-anim-meter");
      meter.appendChild(el("span", "mm-anim-meter-label", data.meter_label + ": "));
      meterValue = el("span", "mm-anim-meter-value");
      meter.appendChild(meterValue);
      var track = el("span", "mm-anim-bar");
      track.setAttribute("aria-hidden", "true");
      bar = el("span", "mm-anim-bar-fill");
      track.appendChild(bar);
      meter.appendChild(track);
      box.appendChild(meter);
    }

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
    if (steps) box.appendChild(steps);             // the captions as a list, after the controls
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
      var shown = [];
      (f.active || []).forEach(function (rc) {
        var td = cells[rc[0]] && cells[rc[0]][rc[1]];
        if (td) { td.classList.add("mm-active"); shown.push(td); }
      });
      follow(shown);
      caption.textContent = f.caption;
      if (meter && f.meter) {
        meterValue.textContent = f.meter.text;
        bar.style.width = (top ? 100 * Math.abs(f.meter.value) / top : 0) + "%";
        box.dataset.meter = String(f.meter.value);
      }
      slider.value = i;
      count.textContent = w.frame + " " + (i + 1) + " " + w.of + " " + frames.length;
      box.dataset.frame = String(i);
      back.disabled = i === 0;
      fwd.disabled = i === frames.length - 1;
      if (i === frames.length - 1) stop();
    }
    /* Scroll the grid sideways so the active cells are in view (only when it is wider than its box). */
    function follow(tds) {
      if (!tds.length || scroller.scrollWidth <= scroller.clientWidth) return;
      var x = scroller.scrollLeft, origin = scroller.getBoundingClientRect().left - x;
      var left = Math.min.apply(null, tds.map(function (td) { return td.getBoundingClientRect().left - origin; }));
      var right = Math.max.apply(null, tds.map(function (td) { return td.getBoundingClientRect().right - origin; }));
      var head = table.querySelector("tbody th"), fixed = head ? head.getBoundingClientRect().width : 0;
      var width = scroller.clientWidth, target = x;
      if (right - left > width - fixed || left < x + fixed) target = left - fixed;     // sticky row labels cover `fixed`
      else if (right > x + width) target = right - width;
      if (target !== x) scroller.scrollTo({left: Math.max(0, target), behavior: reduced() ? "auto" : "smooth"});
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
