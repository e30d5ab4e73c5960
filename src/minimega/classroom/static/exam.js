/* Graded exam page: sign in with an email link, start (or resume) an attempt, record one locked
 * answer per question (the server says only "recorded"), finish, then review every item with its
 * key, worked value and explanations.
 *
 * The session token lives in localStorage, so a reload (or the mailed link opened later) resumes the
 * open attempt from GET /api/v1/me and /api/v1/attempts/{id}?questions=true, answers given shown
 * locked. Text from the server goes in through textContent; the key never reaches this page before
 * the attempt is over. The same script serves the course page (course/exam/index.md) and the bare
 * page of a service without a site (bare_page.py, at the same /exam/ and /nl/exam/).
 */
(function () {
  "use strict";
  const api = "/api/v1";
  const SESSION = "minimega.exam.session";
  let attempt = null;
  let root = null;

  /* The page's words, per page language (pageLang). Text from the server (questions, rules, errors)
     comes in the attempt's language already. */
  const WORDS = {
    en: {
      sending: "Sending…",
      mailed: (min) => `Check your mail: the link signs you in once, within ${min} minutes.`,
      devLink: "Development mode: open the sign-in link",
      notSent: (m) => `Could not send the link: ${m}`,
      signinFailed: (m) => `Sign-in failed: ${m}`,
      left: (n, of) => `${n} of ${of} attempts left today (UTC).`,
      cooldown: (t) => `After a failed attempt the next one opens at ${t}.`,
      starting: "Starting…",
      notStarted: (m) => `Could not start: ${m}`,
      status: (name, total, until) => `${name}: ${total} questions, open until ${until} (your time). ` +
        "Answers are recorded and locked; results come after you finish.",
      left_s: (h, m, s) => `${h} h ${m} min ${s} s left`, expired: "Time is up: this attempt has expired.",
      locale: "en-GB",
      mineIssued: (c, when) => `${c} (issued ${when})`, revoked: "revoked",
      question: (n) => `Question ${n}`,
      chapter: (n, title) => `Chapter ${n}: ${title}`,
      yourAnswer: "Your answer",
      all: "Choose all that apply.",
      save: "Save answer",
      recorded: "Recorded.",
      numberFirst: "Enter a number first (its unit may follow, as the question asks it).",
      optionFirst: "Choose an option first.",
      notRecorded: (m) => `Not recorded: ${m}`,
      progress: (done, total, pass) => `${done} of ${total} answered; ${pass} correct answers pass.`,
      unanswered: (n) => `${n} question(s) unanswered count as wrong. Finish anyway?`,
      notFinished: (m) => `Could not finish: ${m}`,
      passed: "Passed", failed: "Not passed",
      score: (r) => `Score: ${r.score} of ${r.total} (${number(r.percent, "en-GB")}%). ${r.pass_mark} were needed.`,
      code: (c) => `Verification code: ${c}`,
      download: "Download the credential (JSON)", printable: "Printable certificate",
      svg: "Certificate image (SVG, carries the credential)", verify: "Verify it",
      notAnswered: "not answered",
      noReview: (m) => `No review yet: ${m}`,
      review: (r) => `Review: ${r.score} of ${r.total}`,
      reviewItem: (q, title) => `Question ${q.number} (chapter ${q.chapter}: ${title}): ${q.correct ? "correct" : "not correct"}`,
      given: (a) => `Your answer: ${a}`,
      answer: (a) => `Answer: ${a}`,
      right: "Right", wrong: "Wrong",
      num: (x, sig) => number(x, "en-GB", sig),
      early: (s) => s > 0 ? `Too early to finish: you can finish in ${s} s (your answers are kept).` : "You can finish now.",
    },
    nl: {
      sending: "Bezig met versturen…",
      mailed: (min) => `Kijk in je mail: met de link log je één keer in, binnen ${min} minuten.`,
      devLink: "Ontwikkelmodus: open de inloglink",
      notSent: (m) => `De link kon niet verstuurd worden: ${m}`,
      signinFailed: (m) => `Inloggen mislukt: ${m}`,
      left: (n, of) => `Je hebt vandaag (UTC) nog ${n} van ${of} pogingen.`,
      cooldown: (t) => `Na een mislukte poging gaat de volgende open om ${t}.`,
      starting: "Bezig met starten…",
      notStarted: (m) => `Starten lukte niet: ${m}`,
      status: (name, total, until) => `${name}: ${total} vragen, open tot ${until} (jouw tijd). ` +
        "Antwoorden worden vastgelegd en vergrendeld; de uitslag krijg je als je klaar bent.",
      left_s: (h, m, s) => `nog ${h} u ${m} min ${s} s`, expired: "De tijd is om: deze poging is verlopen.",
      locale: "nl-NL",
      mineIssued: (c, when) => `${c} (uitgereikt ${when})`, revoked: "ingetrokken",
      question: (n) => `Vraag ${n}`,
      chapter: (n, title) => `Hoofdstuk ${n}: ${title}`,
      yourAnswer: "Jouw antwoord",
      all: "Kies alle juiste opties.",
      save: "Antwoord opslaan",
      recorded: "Vastgelegd.",
      numberFirst: "Vul eerst een getal in (de eenheid mag erachter, zoals de vraag die noemt).",
      optionFirst: "Kies eerst een optie.",
      notRecorded: (m) => `Niet vastgelegd: ${m}`,
      progress: (done, total, pass) => `${done} van ${total} beantwoord; met ${pass} goede antwoorden ben je geslaagd.`,
      unanswered: (n) => `${n} vraag/vragen zonder antwoord tellen als fout. Toch afronden?`,
      notFinished: (m) => `Afronden lukte niet: ${m}`,
      passed: "Geslaagd", failed: "Niet geslaagd",
      score: (r) => `Score: ${r.score} van ${r.total} (${number(r.percent, "nl-NL")} %). Nodig waren er ${r.pass_mark}.`,
      code: (c) => `Verificatiecode: ${c}`,
      download: "Download de credential (JSON)", printable: "Certificaat om af te drukken",
      svg: "Certificaat als afbeelding (SVG, met de credential erin)", verify: "Verifieer het",
      notAnswered: "niet beantwoord",
      noReview: (m) => `Nog geen nabespreking: ${m}`,
      review: (r) => `Nabespreking: ${r.score} van ${r.total}`,
      reviewItem: (q, title) => `Vraag ${q.number} (hoofdstuk ${q.chapter}: ${title}): ${q.correct ? "goed" : "niet goed"}`,
      given: (a) => `Jouw antwoord: ${a}`,
      answer: (a) => `Antwoord: ${a}`,
      right: "Goed", wrong: "Fout",
      num: (x, sig) => number(x, "nl-NL", sig),
      early: (s) => s > 0 ? `Te vroeg om af te ronden: dat kan over ${s} s (je antwoorden blijven bewaard).` : "Je kunt nu afronden.",
    },
  };
  function t() { return WORDS[pageLang()]; }

  /* A number in the page's language (a decimal comma in Dutch), to `sig` significant figures when the question
     asks for them (1.1 asked to 3 is shown 1.10); no thousands grouping, so it reads back as typed. */
  function number(x, locale, sig) {
    if (typeof x !== "number" || !Number.isFinite(x)) return String(x);
    const digits = sig ? { minimumSignificantDigits: sig, maximumSignificantDigits: sig } : { maximumSignificantDigits: 15 };
    return new Intl.NumberFormat(locale, { useGrouping: false, ...digits }).format(x);
  }
  /* The site's pages in the page's language live under nl/ for Dutch (the verify page). */
  function sitePath(path) { return pageLang() === "nl" ? `/nl${path}` : path; }

  function $(id) { return document.getElementById(id); }

  function el(tag, text, attrs) {
    const e = document.createElement(tag);
    if (text !== undefined && text !== null) e.textContent = text;
    for (const [k, v] of Object.entries(attrs || {})) e.setAttribute(k, v);
    return e;
  }

  function session() { try { return localStorage.getItem(SESSION); } catch (e) { return null; } }
  function setSession(s) {
    try { if (s) localStorage.setItem(SESSION, s); else localStorage.removeItem(SESSION); } catch (e) { /* private mode */ }
  }

  async function call(method, path, body) {
    const headers = { "Content-Type": "application/json" };
    const s = session();
    if (s) headers.Authorization = `Bearer ${s}`;
    const resp = await fetch(api + path, { method, headers, body: body === undefined ? undefined : JSON.stringify(body) });
    let data = null;
    try { data = await resp.json(); } catch (e) { /* empty */ }
    if (resp.status === 401 && path !== "/signin/confirm") { setSession(null); show("signin"); }
    if (!resp.ok) {
      const detail = data && data.detail;
      const err = new Error(typeof detail === "string" ? detail : `HTTP ${resp.status}`);
      err.retryAfter = Number(resp.headers.get("Retry-After")) || 0;      // seconds, when the service names them
      throw err;
    }
    return data;
  }

  /* One view at a time; the learner's certificates stay listed in every signed-in view. No control is shown
     that cannot act: "Finish" only while an open attempt is on the page. */
  function show(which) {
    for (const id of ["signin", "start", "exam", "after"]) {
      const section = $(`mm-exam-${id}`);
      if (section) section.hidden = id !== which;
    }
    const mine = $("mm-exam-mine");
    if (mine) mine.hidden = which === "signin" || !$("mm-exam-mine-list").children.length;
    const fin = $("mm-exam-finish");
    if (fin) fin.hidden = !(which === "exam" && attempt && !attempt.finished && !attempt.expired);
    if (which !== "exam") stopCountdown();
  }

  /* A moment from the server (ISO UTC) in the reader's own time zone and language. */
  function local(iso) {
    const d = new Date(iso);
    return isNaN(d) ? iso : d.toLocaleString(t().locale, { dateStyle: "medium", timeStyle: "short" });
  }

  let ticker = null;
  function stopCountdown() { if (ticker) { clearInterval(ticker); ticker = null; } }
  function countdown(iso) {
    stopCountdown();
    const box = $("mm-exam-countdown");
    const end = new Date(iso).getTime();
    const tick = () => {
      const left = Math.max(0, Math.round((end - Date.now()) / 1000));
      box.textContent = left ? t().left_s(Math.floor(left / 3600), Math.floor(left / 60) % 60, left % 60) : t().expired;
      if (!left) { stopCountdown(); const fin = $("mm-exam-finish"); if (fin) fin.hidden = true; }
    };
    tick();
    ticker = setInterval(tick, 1000);
  }

  /* The learner's certificates, from GET /me: code, download, print, image, verify; at any time. */
  function renderMine(creds) {
    const list = $("mm-exam-mine-list");
    if (!list) return;
    list.replaceChildren(...(creds || []).map((c) => {
      const li = el("li", null, { class: "mm-exam-mine-item", "data-code": c.code });
      li.append(el("span", t().mineIssued(c.code, local(c.issued_at)) + (c.revoked ? ` (${t().revoked})` : ""),
        { class: "mm-exam-mine-code" }), " ");
      credentialAnchors(c.code).forEach((a, i) => { if (i) li.append(" · "); li.append(a); });
      return li;
    }));
  }

  async function refreshMine() {
    try { renderMine((await call("GET", "/me")).credentials); } catch (e) { /* keeps the list it has */ }
    const mine = $("mm-exam-mine");
    if (mine) mine.hidden = !session() || !$("mm-exam-mine-list").children.length;
  }

  function chapterTitle(q) {
    let titles = {};
    try { titles = JSON.parse(($("mm-exam") || { dataset: {} }).dataset.chapters || "{}"); } catch (e) { /* built without */ }
    return titles[String(q.chapter)] || q.chapter_title;
  }

  /* --- rules from the server (the page's static text states the defaults) --- */
  async function rules() {
    try {
      const info = await call("GET", `/exam?lang=${pageLang()}`);
      const box = $("mm-exam-rules");
      if (box) box.textContent = info.rules;
    } catch (e) { /* the page keeps the built text */ }
  }

  /* --- sign-in --- */
  async function requestLink(ev) {
    ev.preventDefault();
    const status = $("mm-exam-signin-status");
    status.textContent = t().sending;
    try {
      const res = await call("POST", "/signin", { email: $("mm-exam-email").value.trim(), lang: pageLang() });
      status.replaceChildren(el("span", t().mailed(Math.round(res.expires_in_s / 60))));
      if (res.dev_link) {
        const a = el("a", t().devLink, { href: res.dev_link, id: "mm-exam-dev-link" });
        status.append(" ", a);
        a.addEventListener("click", (e) => { e.preventDefault(); history.replaceState(null, "", res.dev_link); boot(); });
      }
    } catch (e) { status.textContent = t().notSent(e.message); }
  }

  async function redeemFromHash() {
    const m = /[#&]signin=([A-Za-z0-9_-]{16,128})/.exec(location.hash);
    if (!m) return;
    history.replaceState(null, "", location.pathname + location.search);   // the token is spent: drop it
    // the same link opened twice (a second tab, the back button) redeems once
    const mark = `minimega.exam.redeemed.${m[1].slice(0, 16)}`;
    try { if (sessionStorage.getItem(mark)) return; sessionStorage.setItem(mark, "1"); } catch (e) { /* private mode */ }
    try {
      const res = await call("POST", "/signin/confirm", { token: m[1] });
      setSession(res.session);
    } catch (e) { $("mm-exam-signin-status").textContent = t().signinFailed(e.message); }
  }

  /* --- start or resume --- */
  async function home() {
    const me = await call("GET", "/me");
    renderMine(me.credentials);
    if (me.open_attempt) return resume(me.open_attempt);
    attempt = null;
    show("start");
    const parts = [t().left(me.attempts_left_today, me.attempts_per_day)];
    if (me.cooldown_until) parts.push(t().cooldown(local(me.cooldown_until)));
    $("mm-exam-limits").textContent = parts.join(" ");
    const last = $("mm-exam-last");
    last.hidden = !me.last_attempt;
    last.onclick = () => review(me.last_attempt);
  }

  /* The page's language (the Dutch site sets <html lang="nl">) picks the attempt's: questions, review
     and certificate text. A resumed attempt keeps the language it was started in. */
  function pageLang() {
    return (document.documentElement.lang || "en").toLowerCase().startsWith("nl") ? "nl" : "en";
  }

  async function start(ev) {
    ev.preventDefault();
    const status = $("mm-exam-start-status");
    status.textContent = t().starting;
    try {
      attempt = await call("POST", "/attempts", { display_name: $("mm-exam-name").value, lang: pageLang() });
    } catch (e) { status.textContent = t().notStarted(e.message); return; }
    status.textContent = "";
    render();
  }

  async function resume(id) {
    attempt = await call("GET", `/attempts/${encodeURIComponent(id)}?questions=true`);
    render();
  }

  function render() {
    show("exam");
    $("mm-exam-status").replaceChildren(el("span", t().status(attempt.display_name, attempt.total, local(attempt.expires_at))),
      " ", el("strong", null, { id: "mm-exam-countdown" }));
    countdown(attempt.expires_at);
    const box = $("mm-exam-questions");
    box.replaceChildren(...attempt.questions.map(renderQuestion));
    progress();
  }

  function renderQuestion(q) {
    const fs = el("fieldset", null, { id: `q${q.number}`, "data-number": q.number, class: "mm-exam-q" });
    fs.append(el("legend", t().question(q.number)));
    fs.append(el("p", t().chapter(q.chapter, chapterTitle(q)), { class: "mm-exam-chapter" }));
    fs.append(el("p", q.question, { class: "mm-exam-text" }));
    if (q.type === "numeric") {
      const id = `q${q.number}-value`;
      fs.append(el("label", `${t().yourAnswer}${q.unit ? ` (${q.unit})` : ""}`, { for: id }), " ");
      fs.append(el("input", null, { id, type: "text", inputmode: "decimal", autocomplete: "off", class: "value" }));
    } else {
      if (q.type === "multiple") fs.append(el("p", t().all, { class: "mm-exam-hint" }));
      q.choices.forEach((text, i) => {
        const id = `q${q.number}-c${i}`;
        const row = el("div", null, { class: "mm-exam-choice" });
        row.append(el("input", null, { id, type: q.type === "single" ? "radio" : "checkbox", name: `q${q.number}`, value: i }),
          el("label", text, { for: id }));
        fs.append(row);
      });
    }
    const save = el("button", t().save, { type: "button", class: "md-button mm-exam-save" });
    const fb = el("p", null, { id: `fb${q.number}`, role: "status", "aria-live": "polite", class: "mm-exam-recorded" });
    save.addEventListener("click", () => submit(q, fs, fb, save));
    fs.append(save, fb);
    const given = (attempt.responses || {})[String(q.number)];
    if (given) lock(fs, fb, save, given);
    return fs;
  }

  function lock(fs, fb, button, given) {
    if ("value" in given) fs.querySelector(".value").value = t().num(given.value);
    const picked = "choice" in given ? [given.choice] : (given.choices || []);
    fs.querySelectorAll("input[value]").forEach((i) => { if (picked.includes(Number(i.value))) i.checked = true; });
    fs.querySelectorAll("input").forEach((i) => { i.disabled = true; });
    button.disabled = true;
    fs.dataset.locked = "1";
    fb.textContent = t().recorded;
  }

  async function submit(q, fs, fb, button) {
    let body;
    if (q.type === "numeric") {
      const text = fs.querySelector(".value").value.trim();
      let raw = text.replace(/[\s\u2009]/g, "");
      if (pageLang() === "nl") raw = raw.replace(/,/g, ".");          // Dutch writes a decimal comma
      const value = Number(raw);
      if (!text) { fb.textContent = t().numberFirst; return; }
      // a plain number goes as a number; "31.4 GB" as text, and the service checks its unit (naming a wrong one)
      body = raw && Number.isFinite(value) ? { value } : { value: text };
    } else {
      const picked = [...fs.querySelectorAll("input:checked")].map((i) => Number(i.value));
      if (!picked.length) { fb.textContent = t().optionFirst; return; }
      body = q.type === "single" ? { choice: picked[0] } : { choices: picked };
    }
    button.disabled = true;
    try {
      await call("POST", `/attempts/${attempt.attempt_id}/answers/${q.number}`, body);
      attempt.responses = attempt.responses || {};
      attempt.responses[String(q.number)] = body;
      lock(fs, fb, button, body);
      progress();
    } catch (e) {
      fb.textContent = t().notRecorded(e.message);
      button.disabled = /locked|finished|expired/.test(e.message);
    }
  }

  function progress() {
    const done = document.querySelectorAll("fieldset.mm-exam-q[data-locked]").length;
    $("mm-exam-progress").textContent = t().progress(done, attempt.total, attempt.pass_mark);
  }

  async function finish() {
    if (!attempt || attempt.finished) return;                  // nothing open to finish
    const box = $("mm-exam-result");
    const unanswered = attempt.total - document.querySelectorAll("fieldset.mm-exam-q[data-locked]").length;
    if (unanswered && !confirm(t().unanswered(unanswered))) return;
    let res;
    try {
      res = await call("POST", `/attempts/${attempt.attempt_id}/finish`);
    } catch (e) {
      if (e.retryAfter && /finished within/.test(e.message)) { tooEarly(e.retryAfter); return; }   // the minimum time
      finishStatus().textContent = t().notFinished(e.message);
      return;
    }
    finishStatus().textContent = "";
    const id = attempt.attempt_id;
    attempt.finished = true;
    box.replaceChildren(el("h2", res.passed ? t().passed : t().failed), el("p", t().score(res), { id: "mm-exam-score" }));
    if (res.credential) credentialLinks(box, res.credential);
    await refreshMine();
    await review(id, true);
    box.scrollIntoView({ block: "start" });                   // the result at the top, above the review
  }

  /* Messages about finishing sit next to the button (the result section is hidden while the exam is open). */
  function finishStatus() {
    let box = $("mm-exam-finish-status");
    if (!box) {
      box = el("span", null, { id: "mm-exam-finish-status", role: "status", "aria-live": "polite" });
      $("mm-exam-finish").after(" ", box);
    }
    return box;
  }

  /* "Finish" within the minimum time: say when it will work, counting down to it. */
  let earlyTimer = null;
  function tooEarly(seconds) {
    const end = Date.now() + seconds * 1000;
    clearInterval(earlyTimer);
    const tick = () => {
      const left = Math.max(0, Math.ceil((end - Date.now()) / 1000));
      finishStatus().textContent = t().early(left);
      if (!left) clearInterval(earlyTimer);
    };
    tick();
    earlyTimer = setInterval(tick, 1000);
  }

  function credentialAnchors(code, ids) {
    const links = [[t().download, `/api/v1/credentials/${code}`, "mm-exam-download", "minimega-certificate.json"],
      [t().printable, `/certificates/${code}`, "mm-exam-certificate", null],
      [t().svg, `/certificates/${code}.svg`, "mm-exam-svg", "minimega-certificate.svg"],
      [t().verify, sitePath(`/verify/?c=${encodeURIComponent(code)}`), "mm-exam-verify", null]];
    return links.map(([text, href, id, download]) => {
      const a = el("a", text, ids ? { href, id } : { href, class: id });
      if (download) a.setAttribute("download", download);
      return a;
    });
  }

  function credentialLinks(box, c) {
    box.append(el("p", t().code(c.code), { id: "mm-exam-code" }));
    const ul = el("ul");
    for (const a of credentialAnchors(c.code, true)) { const li = el("li"); li.append(a); ul.append(li); }
    box.append(ul);
  }

  function describe(q, response) {
    if (!response) return t().notAnswered;
    if ("value" in response) return `${t().num(response.value)}${q.unit ? ` ${q.unit}` : ""}`;
    const picked = "choice" in response ? [response.choice] : response.choices;
    return picked.map((i) => q.choices[i]).join("; ");
  }

  async function review(id, keepResult) {
    const box = $("mm-exam-review");
    if (!keepResult) $("mm-exam-result").replaceChildren();
    show("after");
    let res;
    try { res = await call("GET", `/attempts/${encodeURIComponent(id)}/review`); }
    catch (e) { box.replaceChildren(el("p", t().noReview(e.message))); return; }
    box.replaceChildren(el("h2", t().review(res)));
    for (const q of res.items) {
      const item = el("section", null, { class: `mm-exam-review-item ${q.correct ? "mm-ok" : "mm-bad"}`, "data-number": q.number });
      item.append(el("h3", t().reviewItem(q, chapterTitle(q))));
      item.append(el("p", q.question));
      item.append(el("p", t().given(describe(q, q.response))));
      if (q.type === "numeric") {
        item.append(el("p", t().answer(`${t().num(q.answer, q.sig)}${q.unit ? ` ${q.unit}` : ""}`)), el("p", q.explain));
      } else {                    // right or wrong and the idea tested: the key stays secret (later attempts reuse it)
        item.append(el("p", `${q.correct ? t().right : t().wrong}. ${q.explain || ""}`));
      }
      box.append(item);
    }
    $("mm-exam-again").hidden = false;
  }

  async function boot() {
    root = $("mm-exam");
    if (!root) return;
    await redeemFromHash();
    if (!session()) { show("signin"); return; }
    try { await home(); } catch (e) { if (session()) $("mm-exam-start-status").textContent = e.message; }
  }

  function init() {
    const r = $("mm-exam");
    if (!r || r.dataset.ready) return;
    r.dataset.ready = "1";
    $("mm-exam-signin-form").addEventListener("submit", requestLink);
    $("mm-exam-start-form").addEventListener("submit", start);
    $("mm-exam-finish").addEventListener("click", finish);
    $("mm-exam-again").addEventListener("click", () => { $("mm-exam-again").hidden = true; home(); });
    $("mm-exam-signout").addEventListener("click", async () => {
      try { await call("POST", "/signout"); } catch (e) { /* signed out anyway */ }
      setSession(null); attempt = null; renderMine([]); show("signin");
    });
    window.addEventListener("hashchange", () => { if (/signin=/.test(location.hash)) boot(); });
    rules();
    boot().then(() => { r.dataset.booted = "1"; });
  }

  if (typeof document$ !== "undefined") document$.subscribe(init);
  else if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", init);
  else init();
})();
