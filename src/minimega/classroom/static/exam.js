/* Exam UI: starts an attempt, renders each question as a fieldset, sends one answer per "Check",
 * shows the server's feedback in words (a live region), locks the question, then finishes.
 * All text from the server goes in through textContent. The answer key never reaches this page. */
(function () {
  "use strict";
  const api = "/api/v1";
  let attempt = null;

  function el(tag, text, attrs) {
    const e = document.createElement(tag);
    if (text !== undefined && text !== null) e.textContent = text;
    for (const [k, v] of Object.entries(attrs || {})) e.setAttribute(k, v);
    return e;
  }

  async function call(method, path, body) {
    const resp = await fetch(api + path, { method, headers: { "Content-Type": "application/json" },
      body: body === undefined ? undefined : JSON.stringify(body) });
    let data = null;
    try { data = await resp.json(); } catch (e) { /* empty */ }
    if (!resp.ok) {
      const detail = data && data.detail;
      throw new Error(typeof detail === "string" ? detail : `HTTP ${resp.status}`);
    }
    return data;
  }

  function progress() {
    const done = document.querySelectorAll("fieldset[data-locked]").length;
    document.getElementById("progress").textContent =
      `${done} of ${attempt.total} answered; ${attempt.pass_mark} correct answers pass.`;
  }

  function renderQuestion(q) {
    const fs = el("fieldset", null, { id: `q${q.number}`, "data-number": q.number, "aria-describedby": `fb${q.number}` });
    fs.append(el("legend", `Question ${q.number}: ${q.question}`));
    fs.append(el("p", `Chapter ${q.chapter}: ${q.chapter_title}`, { class: "chapter" }));
    if (q.type === "numeric") {
      const id = `q${q.number}-value`;
      fs.append(el("label", `Your answer${q.unit ? ` (${q.unit})` : ""}`, { for: id }));
      fs.append(el("br"));
      fs.append(el("input", null, { id, type: "text", inputmode: "decimal", autocomplete: "off", class: "value" }));
    } else {
      q.choices.forEach((text, i) => {
        const id = `q${q.number}-c${i}`;
        const label = el("label", null, { for: id, class: "choice" });
        const input = el("input", null, { id, type: q.type === "single" ? "radio" : "checkbox", name: `q${q.number}`, value: i });
        label.append(input, " ", document.createTextNode(text));
        fs.append(label);
      });
    }
    const check = el("button", "Check", { type: "button", class: "check" });
    const fb = el("div", null, { id: `fb${q.number}`, role: "status", "aria-live": "polite", class: "feedback-region" });
    check.addEventListener("click", () => submit(q, fs, fb, check));
    fs.append(el("p"), check, fb);
    return fs;
  }

  async function submit(q, fs, fb, button) {
    let body;
    if (q.type === "numeric") {
      const raw = fs.querySelector(".value").value.trim().replace(/,/g, "");
      const value = Number(raw);
      if (!raw || !Number.isFinite(value)) { fb.textContent = "Enter a number first."; return; }
      body = { value };
    } else {
      const picked = [...fs.querySelectorAll("input:checked")].map((i) => Number(i.value));
      if (!picked.length) { fb.textContent = "Choose an option first."; return; }
      body = q.type === "single" ? { choice: picked[0] } : { choices: picked };
    }
    button.disabled = true;
    try {
      const res = await call("POST", `/attempts/${attempt.attempt_id}/answers/${q.number}`, body);
      fb.replaceChildren(el("strong", res.correct ? "Correct." : "Not quite."));
      res.feedback.forEach((f) => fb.append(el("p", f)));
      fb.className = "feedback " + (res.correct ? "correct" : "wrong");
      fs.dataset.locked = "1";
      fs.dataset.correct = String(res.correct);
      fs.querySelectorAll("input").forEach((i) => { i.disabled = true; });
      progress();
    } catch (e) {
      fb.textContent = `Not recorded: ${e.message}`;
      button.disabled = /locked|finished|expired/.test(e.message);
    }
  }

  async function start(ev) {
    ev.preventDefault();
    const status = document.getElementById("start-status");
    const body = { display_name: document.getElementById("display-name").value };
    const email = document.getElementById("email").value.trim();
    if (email) body.email = email;
    status.textContent = "Starting…";
    try {
      attempt = await call("POST", "/attempts", body);
    } catch (e) { status.textContent = `Could not start: ${e.message}`; return; }
    status.textContent = `Attempt started: ${attempt.total} questions, open until ${attempt.expires_at}. ` +
      `${attempt.attempts_left_today} attempt(s) left today.`;
    document.getElementById("start-form").hidden = true;
    const box = document.getElementById("questions");
    attempt.questions.forEach((q) => box.append(renderQuestion(q)));
    box.hidden = false;
    document.getElementById("finish-box").hidden = false;
    progress();
  }

  async function finish() {
    const box = document.getElementById("result");
    box.hidden = false;
    const unanswered = attempt.total - document.querySelectorAll("fieldset[data-locked]").length;
    if (unanswered && !confirm(`${unanswered} question(s) unanswered count as wrong. Finish anyway?`)) return;
    try {
      const res = await call("POST", `/attempts/${attempt.attempt_id}/finish`);
      document.getElementById("finish").disabled = true;
      box.replaceChildren(el("h2", res.passed ? "Passed" : "Not passed"),
        el("p", `Score: ${res.score} of ${res.total} (${res.percent}%). ${res.pass_mark} were needed.`, { id: "score" }));
      if (res.credential) {
        const c = res.credential;
        box.append(el("p", `Verification code: ${c.code}`, { id: "code" }));
        const ul = el("ul");
        const links = [["Download the credential (JSON)", `/api/v1/credentials/${c.code}`, "download-credential", "minimega-certificate.json"],
          ["Printable certificate", `/certificates/${c.code}`, "certificate-link", null],
          ["Certificate image (SVG, carries the credential)", `/certificates/${c.code}.svg`, "svg-link", `minimega-certificate.svg`],
          ["Verify it", `/verify/?c=${encodeURIComponent(c.code)}`, "verify-link", null]];
        for (const [text, href, id, download] of links) {
          const a = el("a", text, { href, id });
          if (download) a.setAttribute("download", download);
          const li = el("li"); li.append(a); ul.append(li);
        }
        box.append(ul);
      }
    } catch (e) { box.replaceChildren(el("p", `Could not finish: ${e.message}`)); }
  }

  document.getElementById("start-form").addEventListener("submit", start);
  document.getElementById("finish").addEventListener("click", finish);
})();
