/* Chapter figures: each figure's page (an iframe) says how tall it needs to be at its current width
 * (wrapped title, tick labels, legend below the plot); this sets the frame to that height.
 *
 * Messages come from any window, so only a frame of this page, on this origin, may set a height, and
 * only a plausible one. The listener is installed once: instant navigation keeps the window.
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

  // a frame that loaded before this script ran has already reported; ask again
  function ask() {
    document.querySelectorAll(".mm-figure iframe").forEach(function (frame) {
      if (frame.contentWindow) frame.contentWindow.postMessage({type: "mm-figure-measure"}, window.location.origin);
    });
  }
  if (window.document$) window.document$.subscribe(ask);
  else document.addEventListener("DOMContentLoaded", ask);
})();
