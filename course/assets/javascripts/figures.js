/* Chapter figures: each figure's page (an iframe) says how tall it needs to be at its current width
 * (wrapped title, tick labels, legend below the plot); this sets the frame to that height.
 *
 * Messages come from any window, so only a frame of this page, on this origin, may set a height, and
 * only a plausible one. The listener is installed once per window.
 */
(function () {
  "use strict";
  if (window.mmFigureFrames) return;
  window.mmFigureFrames = true;
  var MIN = 200, MAX = 1600;

  window.addEventListener("message", function (ev) {
    var d = ev.data;
    if (ev.origin !== window.location.origin || !d || d.type !== "mm-figure-height") return;
    var h = Number(d.height);
    if (!isFinite(h) || h < MIN || h > MAX) return;
    document.querySelectorAll(".mm-figure iframe").forEach(function (frame) {
      if (frame.contentWindow === ev.source && Math.abs(frame.offsetHeight - h) > 1) frame.style.height = Math.ceil(h) + "px";
    });
  });

  // A figure's frame is loaded when it comes within 100 px of view (its data-src becomes its src):
  // a page opens without running plotly for charts below the fold. Printing loads them all.
  function load(frame) {
    // resolved against the page's address when the page was shown
    var src = frame.mmSrc || frame.dataset.src;
    if (!src || !frame.isConnected || frame.getAttribute("src")) return;
    frame.addEventListener("load", function () { frame.removeAttribute("tabindex"); }, {once: true});
    frame.src = src;
  }
  var near = "IntersectionObserver" in window ? new IntersectionObserver(function (entries) {
    entries.forEach(function (e) {
      if (e.isIntersecting) { near.unobserve(e.target); load(e.target); }
    });
  }, {rootMargin: "100px 0px"}) : null;
  window.addEventListener("beforeprint", function () {
    document.querySelectorAll(".mm-figure iframe").forEach(load);
  });

  // a frame that loaded before this script ran has already reported; ask again
  function start() {
    document.querySelectorAll(".mm-figure iframe").forEach(function (frame) {
      if (!frame.getAttribute("src")) {
        frame.mmSrc = new URL(frame.dataset.src, document.baseURI).href;
        return near ? near.observe(frame) : load(frame);
      }
      if (frame.contentWindow) frame.contentWindow.postMessage({type: "mm-figure-measure"}, window.location.origin);
    });
  }
  if (window.document$) window.document$.subscribe(start);
  else document.addEventListener("DOMContentLoaded", start);
})();
