/* The /verify/ page: reads a credential (file, paste, or ?c=CODE from the issuing service), loads
 * what the site pinned at build time (trusted-issuers.json, contexts.json), fetches what online checks
 * need (a did:web issuer's did.json, the signed status list), runs MinimegaVerify and renders the
 * verdict, every check with its status, and every claim as text (never as HTML: names are learner input).
 * Hooks mkdocs-material's document$ so instant navigation re-initialises it; safe to load twice. */
(function () {
  "use strict";
  const LABELS = [["name", "Name"], ["achievement", "Achievement"], ["description", "Description"],
    ["course_version", "Course version"], ["valid_from", "Issued"], ["valid_until", "Expires"],
    ["issuer_name", "Issuer"], ["issuer_id", "Issuer DID"], ["issuer_url", "Issuer URL"],
    ["credential_id", "Credential ID"], ["email", "Email"], ["criteria", "Criteria"]];

  function el(tag, text, cls) {
    const e = document.createElement(tag);
    if (text !== undefined) e.textContent = text;
    if (cls) e.className = cls;
    return e;
  }

  async function getJson(url) {
    const resp = await fetch(url, { headers: { Accept: "application/json" }, cache: "no-store" });
    if (!resp.ok) throw new Error(`HTTP ${resp.status} from ${url}`);
    return resp.json();
  }

  /* What the site pinned when it was built: the issuers it trusts and the JSON-LD contexts. */
  let pinned = null;
  async function sitePins() {
    if (pinned) return pinned;
    const notes = [];
    let trusted = [], contexts = {};
    try {
      const file = await getJson(new URL("trusted-issuers.json", location.href));
      trusted = (Array.isArray(file.issuers) ? file.issuers : []).map((i) => i && i.id).filter((d) => typeof d === "string");
    } catch (e) { notes.push(`the list of trusted issuers did not load (${e.message}): no issuer is trusted`); }
    if (!trusted.length) notes.push("this site pins no trusted issuer, so no certificate can be valid here (see below)");
    try { contexts = await getJson(new URL("contexts.json", location.href)); }
    catch (e) { notes.push(`the JSON-LD contexts did not load (${e.message}): the eddsa-rdfc-2022 proof cannot be checked`); }
    pinned = { trusted, contexts, notes };
    return pinned;
  }

  async function onlineContext(doc) {
    const pins = await sitePins();
    const notes = [...pins.notes];
    const opts = { didDocuments: {}, trustedIssuers: pins.trusted, contexts: pins.contexts, statusList: null };
    const issuer = doc && doc.issuer && doc.issuer.id;
    if (typeof issuer === "string" && issuer.startsWith("did:web:")) {
      try { opts.didDocuments[issuer] = await getJson(MinimegaVerify.didWebUrl(issuer)); }
      catch (e) { notes.push(`could not fetch the issuer's DID document: ${e.message}`); }
    }
    const url = doc && doc.credentialStatus && doc.credentialStatus.statusListCredential;
    if (typeof url === "string" && /^https?:\/\//.test(url)) {
      try { opts.statusList = await getJson(url); }
      catch (e) { notes.push(`revocation not checked: the status list is unreachable (${e.message})`); }
    }
    return { opts, notes };
  }

  const VERDICTS = {
    valid: "Valid certificate: both signatures check out, the issuer is one this site trusts, and every claim below is signed.",
    invalid: "Not valid: do not trust the claims below.",
  };
  const MARKS = { pass: "✓ pass", fail: "✗ fail", "n/a": "– n/a" };

  function render(box, result, notes, source) {
    box.replaceChildren();
    const text = VERDICTS[result.verdict] || `Signature valid, issuer not trusted: ${String(result.claims.issuer_id).slice(0, 100)} ` +
      "is not an issuer this site trusts, so the claims below are not vouched for by this course.";
    const verdict = el("p", text, "mm-verify-verdict " + (result.valid ? "is-valid" : "is-invalid"));
    verdict.id = "mm-verify-verdict";
    verdict.dataset.valid = String(result.valid);
    verdict.dataset.verdict = result.verdict;
    box.append(verdict);
    if (!result.valid) {
      box.append(el("p", "Reasons:"));
      const ul = el("ul");
      ul.id = "mm-verify-reasons";
      result.errors.forEach((e) => ul.append(el("li", e)));
      box.append(ul);
    }
    if (source) box.append(el("p", `Source: ${source}`));
    const table = el("table");
    table.id = "mm-verify-claims";
    const caption = el("caption", result.valid ? "Signed claims" : "Claims as written (not verified)");
    table.append(caption);
    for (const [key, label] of LABELS) {
      let value = result.claims[key];
      if (key === "valid_until" && (value === null || value === undefined) && Object.keys(result.claims).length) value = "never";
      if (value === null || value === undefined) continue;
      const tr = el("tr");
      tr.dataset.claim = key;
      tr.append(el("th", label), el("td", String(value)));
      table.append(tr);
    }
    const rev = el("tr");
    rev.dataset.claim = "revocation";
    rev.append(el("th", "Revocation"), el("td", result.revocation));
    table.append(rev);
    box.append(table);
    const checks = el("table");
    checks.id = "mm-verify-checks";
    checks.append(el("caption", "Every check: pass, fail, or n/a (could not apply, and why)"));
    for (const c of result.checks) {
      const tr = el("tr", undefined, `mm-check-${c.status === "n/a" ? "na" : c.status}`);
      tr.dataset.check = c.check;
      tr.dataset.status = c.status;
      tr.append(el("td", MARKS[c.status], "mm-check-status"), el("th", c.check), el("td", c.detail, "mm-check-detail"));
      checks.append(tr);
    }
    box.append(checks);
    notes.forEach((n) => box.append(el("p", `Note: ${n}`)));
  }

  async function verifyText(root, text, source) {
    const box = root.querySelector("#mm-verify-result");
    box.replaceChildren(el("p", "Checking…"));
    let input = text;
    if (/^\s*</.test(text)) {
      try { input = MinimegaVerify.unbakeSvg(text); } catch (e) { input = text; }
    }
    let doc = null;
    try { doc = JSON.parse(input); } catch (e) { /* reported by verifyCredential */ }
    const { opts, notes } = await onlineContext(doc);
    const result = await MinimegaVerify.verifyCredential(input, opts);
    render(box, result, notes, source);
    const emailForm = root.querySelector("#mm-verify-email");
    emailForm.hidden = !(result.valid && result.claims.email_identity);
    emailForm.onsubmit = async (ev) => {
      ev.preventDefault();
      const email = root.querySelector("#mm-verify-email-input").value;
      const ok = await MinimegaVerify.emailMatches(result.claims.email_identity, email);
      root.querySelector("#mm-verify-email-result").textContent = ok
        ? "Match: the certificate was issued to this email address."
        : "No match: the certificate was not issued to this address (or it was typed differently).";
    };
  }

  async function showPinned() {
    const box = document.getElementById("mm-verify-pinned");
    if (!box) return;
    const { trusted } = await sitePins();
    box.textContent = trusted.length ? `This site trusts ${trusted.length} issuer${trusted.length > 1 ? "s" : ""}: ${trusted.join(", ")}.`
      : "This site pins no issuer: every certificate will be reported as not trusted.";
  }

  function init() {
    const root = document.getElementById("mm-verify");
    if (!root || root.dataset.ready) return;
    root.dataset.ready = "1";
    showPinned();
    const form = root.querySelector("#mm-verify-form");
    form.addEventListener("submit", async (ev) => {
      ev.preventDefault();
      const file = root.querySelector("#mm-verify-file").files[0];
      const pasted = root.querySelector("#mm-verify-text").value;
      if (file) await verifyText(root, await file.text(), file.name);
      else if (pasted.trim()) await verifyText(root, pasted, "pasted JSON");
      else root.querySelector("#mm-verify-result").replaceChildren(el("p", "Choose a file or paste a credential first."));
    });
    root.querySelector("#mm-verify-file").addEventListener("change", () => form.requestSubmit());
    const code = new URLSearchParams(location.search).get("c");
    if (code) {
      const url = new URL(`../api/v1/credentials/${encodeURIComponent(code)}`, location.href);
      fetch(url, { cache: "no-store" }).then(async (resp) => {
        if (!resp.ok) throw new Error(resp.status === 404 ? "no certificate has this code" : `HTTP ${resp.status}`);
        await verifyText(root, await resp.text(), `code ${code}`);
      }).catch((e) => root.querySelector("#mm-verify-result").replaceChildren(
        el("p", `Could not fetch the certificate for code ${code}: ${e.message}`, "mm-verify-verdict is-invalid")));
    }
  }

  if (typeof document$ !== "undefined" && document$.subscribe) document$.subscribe(init);
  else if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", init);
  else init();
})();
