/* The theme's behaviour, in place of mkdocs-material's bundle: a page is ready to read and to use as soon as it
 * is parsed, because nothing here measures the page while it starts. Material's bundle (instant navigation,
 * its palette and code-block components) made a phone recalculate the style of a whole chapter four times
 * and lay it out once per code block before a reader could scroll (bench/lighthouse.md). What it did that the
 * course needs is here, each part small:
 *
 * - `document$`: the course's scripts subscribe to it; it calls them once, on the page just parsed.
 * - the colour scheme: the toggle in the header switches light and dark and is remembered (material's own
 *   `__palette` record, so the inline script in the header applies it before the page paints).
 * - code blocks: a copy button on each (`content.code.copy`), and a short "copied" notice.
 * - keyboard: "/", "s" or "f" opens search (search.js), Escape closes it.
 * - the table of contents marks the section being read (an IntersectionObserver: nothing is measured here).
 *
 * Every page link is an ordinary link: each page loads in full, so each page's scripts start fresh.
 */
(function () {
  "use strict";
  if (window.mmTheme) return;
  window.mmTheme = true;

  // One emission, on the page that was just parsed (deferred scripts run after parsing, in order).
  window.document$ = {
    subscribe: function (fn) { fn(document); return {unsubscribe: function () {}}; }
  };

  var config = {};
  try { config = JSON.parse(document.getElementById("__config").textContent); } catch (e) { /* none */ }
  var words = config.translations || {};
  var features = config.features || [];
  window.mmThemeWords = words;

  // ---------------------------------------------------------------------------------------------------
  // Colour scheme: each option's label switches to the next option; only the current option's label shows.
  function palette() {
    var form = document.querySelector("[data-md-component=palette]");
    if (!form) return;
    var inputs = Array.prototype.slice.call(form.querySelectorAll("input[name=__palette]"));
    var body = document.body;
    var current = inputs.filter(function (input) {
      return input.dataset.mdColorScheme === body.getAttribute("data-md-color-scheme");
    })[0] || inputs[0];
    function show(input) {
      input.checked = true;
      inputs.forEach(function (other) {
        var label = other.nextElementSibling;
        if (label && label.tagName === "LABEL") label.hidden = other !== input;
      });
    }
    function apply(input) {
      ["media", "scheme", "primary", "accent"].forEach(function (key) {
        body.setAttribute("data-md-color-" + key, input.getAttribute("data-md-color-" + key));
      });
      show(input);
    }
    show(current);
    form.addEventListener("change", function (ev) {
      var input = ev.target;
      if (inputs.indexOf(input) < 0) return;
      apply(input);
      __md_set("__palette", {index: inputs.indexOf(input), color: {
        media: input.dataset.mdColorMedia, scheme: input.dataset.mdColorScheme,
        primary: input.dataset.mdColorPrimary, accent: input.dataset.mdColorAccent}});
    });
    // no choice made here yet: follow the system's light or dark setting as it changes
    inputs.forEach(function (input) {
      var media = input.dataset.mdColorMedia;
      if (!media || !window.matchMedia) return;
      window.matchMedia(media).addEventListener("change", function (ev) {
        if (ev.matches && !__md_get("__palette")) apply(input);
      });
    });
  }

  // ---------------------------------------------------------------------------------------------------
  // A short notice at the bottom of the screen (material's dialog element, its styles).
  var notice = 0;
  function say(text) {
    var dialog = document.querySelector(".md-dialog");
    if (!dialog) return;
    dialog.firstElementChild.textContent = text;
    dialog.setAttribute("role", "status");
    dialog.classList.add("md-dialog--active");
    clearTimeout(notice);
    notice = setTimeout(function () { dialog.classList.remove("md-dialog--active"); }, 2000);
  }

  // Code blocks: one copy button each, added in one pass of writes (nothing is measured).
  function copyButtons() {
    if (features.indexOf("content.code.copy") < 0) return;
    var label = words["clipboard.copy"] || "Copy to clipboard";
    document.querySelectorAll(".md-typeset div.highlight > pre > code").forEach(function (code) {
      if (code.parentElement.querySelector(".md-clipboard")) return;
      var button = document.createElement("button");
      button.type = "button";
      button.className = "md-clipboard md-icon";
      button.title = label;
      button.setAttribute("aria-label", label);
      code.parentElement.insertBefore(button, code);
    });
  }
  function copy(text) {
    if (navigator.clipboard && window.isSecureContext) return navigator.clipboard.writeText(text);
    var area = document.createElement("textarea");             // plain http: the older way
    area.value = text;
    area.setAttribute("readonly", "");
    area.style.position = "fixed";
    area.style.opacity = "0";
    document.body.appendChild(area);
    area.select();
    var ok = document.execCommand("copy");
    area.remove();
    return ok ? Promise.resolve() : Promise.reject(new Error("copy refused"));
  }
  document.addEventListener("click", function (ev) {
    var button = ev.target.closest && ev.target.closest(".md-clipboard");
    if (!button) return;
    var code = button.parentElement.querySelector("code");
    copy(code ? code.innerText : "").then(function () {
      say(words["clipboard.copied"] || "Copied to clipboard");
    }, function () { /* the browser refused; nothing copied, nothing claimed */ });
  });

  // ---------------------------------------------------------------------------------------------------
  // Keyboard: "/", "s" or "f" opens search unless the reader is typing somewhere.
  document.addEventListener("keydown", function (ev) {
    if (ev.ctrlKey || ev.metaKey || ev.altKey || ev.defaultPrevented) return;
    var t = ev.target;
    if (t && (t.isContentEditable || /^(INPUT|TEXTAREA|SELECT)$/.test(t.tagName))) return;
    if (ev.key === "/" || ev.key === "s" || ev.key === "f") {
      var input = document.querySelector(".md-search__input");
      if (input && window.mmSearch) { ev.preventDefault(); window.mmSearch.open(); }
    }
  });

  // ---------------------------------------------------------------------------------------------------
  // Table of contents: the link of the topmost heading in the top third of the screen is active (with none there,
  // the last one marked stays, as its section is still being read).
  function tocFollow() {
    if (!("IntersectionObserver" in window)) return;
    var links = {};
    document.querySelectorAll(".md-sidebar--secondary a.md-nav__link[href^='#']").forEach(function (a) {
      links[decodeURIComponent(a.hash.slice(1))] = a;
    });
    var heads = Object.keys(links).map(function (id) { return document.getElementById(id); }).filter(Boolean);
    if (!heads.length) return;
    var active = null;
    function mark(head) {
      var link = links[head.id];
      if (link === active) return;
      if (active) active.classList.remove("md-nav__link--active");
      link.classList.add("md-nav__link--active");
      active = link;
    }
    var band = new Set();
    var observer = new IntersectionObserver(function (entries) {
      entries.forEach(function (e) { if (e.isIntersecting) band.add(e.target); else band.delete(e.target); });
      var first = heads.filter(function (h) { return band.has(h); })[0];
      if (first) return mark(first);                                        // the topmost heading in the band
      entries.forEach(function (e) {                                        // the active one left it downwards:
        if (e.boundingClientRect.top > 0 && links[e.target.id] === active) {  // the section before is being read
          var i = heads.indexOf(e.target);
          if (i > 0) mark(heads[i - 1]);
        }
      });
    }, {rootMargin: "0px 0px -66% 0px"});
    heads.forEach(function (h) { observer.observe(h); });
  }

  palette();
  copyButtons();
  tocFollow();
})();
