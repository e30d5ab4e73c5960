/* The /verify/ page: reads a credential (file, paste, or ?c=CODE from the issuing service), fetches
 * what online checks need (the issuer's did.json, the signed status list), runs MinimegaVerify and
 * renders the verdict, the reasons and every claim as text (never as HTML: names are learner input).
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

  async function onlineContext(doc) {
    const notes = [];
    const opts = { didDocuments: {}, trustedKeys: null, statusList: null };
    const issuer = doc && doc.issuer && doc.issuer.id;
    if (typeof issuer === "string" && issuer.startsWith("did:web:")) {
      try { opts.didDocuments[issuer] = await getJson(MinimegaVerify.didWebUrl(issuer)); }
      catch (e) { notes.push(`could not fetch the issuer's DID document: ${e.message}`); }
    }
    try {
      const site = await getJson(new URL("../.well-known/did.json", location.href));
      opts.trustedKeys = new Set((site.verificationMethod || []).map((m) => m.publicKeyMultibase));
    } catch (e) { notes.push("this site publishes no key list, so the issuer key was not compared with it"); }
    const url = doc && doc.credentialStatus && doc.credentialStatus.statusListCredential;
    if (typeof url === "string" && /^https?:\/\//.test(url)) {
      try { opts.statusList = await getJson(url); }
      catch (e) { notes.push(`revocation not checked: the status list is unreachable (${e.message})`); }
    }
    return { opts, notes };
  }

  function render(box, result, notes, source) {
    box.replaceChildren();
    const verdict = el("p", result.valid ? "Valid certificate: the signature checks out and every claim below is signed."
      : "Not valid: do not trust the claims below.", "mm-verify-verdict " + (result.valid ? "is-valid" : "is-invalid"));
    verdict.id = "mm-verify-verdict";
    verdict.dataset.valid = String(result.valid);
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
    const details = el("details");
    details.append(el("summary", "All checks"));
    const ul = el("ul");
    result.checks.forEach((c) => ul.append(el("li", c.check + (c.detail ? `: ${c.detail}` : ""), c.ok ? "mm-check-ok" : "mm-check-fail")));
    ul.append(el("li", "eddsa-rdfc-2022 proof: not checked in the browser (needs JSON-LD); `minimega cert verify` checks it"));
    details.append(ul);
    box.append(details);
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
    const { opts, notes } = doc ? await onlineContext(doc) : { opts: {}, notes: [] };
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

  function init() {
    const root = document.getElementById("mm-verify");
    if (!root || root.dataset.ready) return;
    root.dataset.ready = "1";
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
