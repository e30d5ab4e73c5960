/* The /verify/ page: reads a credential (file, paste, or ?c=CODE from the issuing service), loads
 * what the site pinned at build time (trusted-issuers.json, contexts.json), fetches what online checks
 * need (a did:web issuer's did.json, the signed status list), runs MinimegaVerify and renders the
 * verdict, every check with its status, and every claim as text (never as HTML: names are learner input).
 * Starts from the theme's document$ when it is there (theme.js), else once the page is parsed; safe to load twice. */
(function () {
  "use strict";
  const CLAIMS = ["name", "achievement", "description", "course_version", "exam_bank", "valid_from", "valid_until",
    "issuer_name", "issuer_id", "issuer_url", "credential_id", "email", "criteria"];
  /* The page's words per <html lang> (the Dutch edition at nl/verify/ sets "nl"). The checks'
     names and details come from verify-core.js, in the words `minimega cert verify` prints; the Dutch
     page shows each check's Dutch name (checkNames) and keeps the verifier's name in data-check. */
  const WORDS = {
    en: {
      labels: { name: "Name", achievement: "Achievement", description: "Description", course_version: "Course version",
        exam_bank: "Exam bank",
        valid_from: "Issued", valid_until: "Expires", issuer_name: "Issuer", issuer_id: "Issuer DID",
        issuer_url: "Issuer URL", credential_id: "Credential ID", email: "Email", criteria: "Criteria" },
      noList: (m) => `the list of trusted issuers did not load (${m}): no issuer is trusted`,
      noPin: "this site pins no trusted issuer, so no certificate can be valid here (see below)",
      noContexts: (m) => `the JSON-LD contexts did not load (${m}): the eddsa-rdfc-2022 proof cannot be checked`,
      noDid: (m) => `could not fetch the issuer's DID document: ${m}`,
      noStatus: (m) => `revocation not checked: the status list is unreachable (${m})`,
      valid: "Valid certificate: both signatures check out, the issuer is one this site trusts, and every claim below is signed.",
      invalid: "Not valid: do not trust the claims below.",
      untrusted: (id) => `Signature valid, issuer not trusted: ${id} is not an issuer this site trusts, so the claims below are not vouched for by this course.`,
      marks: { pass: "✓ pass", fail: "✗ fail", "n/a": "– n/a" },
      reasons: "Reasons:", source: (s) => `Source: ${s}`, never: "never",
      signed: "Signed claims", unsigned: "Claims as written (not verified)", revocation: "Revocation",
      checks: "Every check: pass, fail, or n/a (could not apply, and why)", note: (n) => `Note: ${n}`,
      checking: "Checking…",
      match: "Match: the certificate was issued to this email address.",
      noMatch: "No match: the certificate was not issued to this address (or it was typed differently).",
      trusts: (n, list) => `This site trusts ${n} issuer${n > 1 ? "s" : ""}: ${list}.`,
      trustsNone: "This site pins no issuer: every certificate will be reported as not trusted.",
      pasted: "pasted JSON", code: (c) => `code ${c}`,
      chooseFirst: "Choose a file or paste a credential first.",
      noCode: "no certificate has this code",
      erased: "the course erased this certificate at its holder's request; the holder's own file still verifies here",
      fetchFailed: (c, m) => `Could not fetch the certificate for code ${c}: ${m}`,
    },
    nl: {
      labels: { name: "Naam", achievement: "Behaald", description: "Beschrijving", course_version: "Cursusversie",
        exam_bank: "Examenbank",
        valid_from: "Uitgegeven", valid_until: "Verloopt", issuer_name: "Uitgever", issuer_id: "DID van de uitgever",
        issuer_url: "URL van de uitgever", credential_id: "Credential-ID", email: "E-mail", criteria: "Criteria" },
      noList: (m) => `de lijst met vertrouwde uitgevers laadde niet (${m}): geen enkele uitgever wordt vertrouwd`,
      noPin: "deze site pint geen vertrouwde uitgever, dus hier kan geen certificaat geldig zijn (zie hieronder)",
      noContexts: (m) => `de JSON-LD-contexten laadden niet (${m}): het eddsa-rdfc-2022-bewijs kan niet gecontroleerd worden`,
      noDid: (m) => `het DID-document van de uitgever kon niet opgehaald worden: ${m}`,
      noStatus: (m) => `intrekking niet gecontroleerd: de statuslijst is niet bereikbaar (${m})`,
      valid: "Geldig certificaat: beide handtekeningen kloppen, de uitgever wordt door deze site vertrouwd en elke claim hieronder is ondertekend.",
      invalid: "Niet geldig: vertrouw de claims hieronder niet.",
      untrusted: (id) => `Handtekening geldig, uitgever niet vertrouwd: ${id} is geen uitgever die deze site vertrouwt, dus deze cursus staat niet in voor de claims hieronder.`,
      marks: { pass: "✓ goed", fail: "✗ fout", "n/a": "– n.v.t." },
      reasons: "Redenen:", source: (s) => `Bron: ${s}`, never: "nooit",
      signed: "Ondertekende claims", unsigned: "Claims zoals ze er staan (niet geverifieerd)", revocation: "Intrekking",
      checks: "Elke controle: goed, fout of n.v.t. (niet van toepassing, en waarom)", note: (n) => `Let op: ${n}`,
      checking: "Bezig met controleren…",
      /* Each check's name, keyed on the name both verifiers report (verify-core.js CHECKS, which stays
         in data-check); tests/test_verify_names.py holds this list to credential.CHECKS. */
      checkNames: {
        "JSON": "JSON-object",
        "@context": "@context (contexten)",
        "type": "type (soort credential)",
        "credentialSubject": "credentialSubject (ontvanger)",
        "issuer": "issuer (uitgever)",
        "proof set": "set van bewijzen",
        "eddsa-rdfc-2022 proof": "eddsa-rdfc-2022-bewijs",
        "eddsa-jcs-2022 proof": "eddsa-jcs-2022-bewijs",
        "issuer trusted": "uitgever vertrouwd",
        "validFrom": "validFrom (geldig vanaf)",
        "validUntil": "validUntil (geldig tot)",
        "credentialStatus": "credentialStatus (intrekkingsstatus)",
        "status list proof set": "statuslijst: set van bewijzen",
        "status list eddsa-rdfc-2022 proof": "statuslijst: eddsa-rdfc-2022-bewijs",
        "status list eddsa-jcs-2022 proof": "statuslijst: eddsa-jcs-2022-bewijs",
        "status list issuer": "statuslijst: uitgever",
        "status list id": "statuslijst: id",
        "status list validFrom": "statuslijst: validFrom (geldig vanaf)",
        "status list validUntil": "statuslijst: validUntil (geldig tot)",
        "status list contents": "statuslijst: inhoud",
        "revocation": "intrekking",
      },
      match: "Klopt: het certificaat is aan dit e-mailadres uitgegeven.",
      noMatch: "Klopt niet: het certificaat is niet aan dit adres uitgegeven (of het is anders getypt).",
      trusts: (n, list) => `Deze site vertrouwt ${n} uitgever${n > 1 ? "s" : ""}: ${list}.`,
      trustsNone: "Deze site pint geen uitgever: elk certificaat wordt als niet vertrouwd gemeld.",
      pasted: "geplakte JSON", code: (c) => `code ${c}`,
      chooseFirst: "Kies eerst een bestand of plak een credential.",
      noCode: "er is geen certificaat met deze code",
      erased: "de cursus heeft dit certificaat op verzoek van de houder gewist; het eigen bestand van de houder is hier nog te controleren",
      fetchFailed: (c, m) => `Het certificaat voor code ${c} kon niet opgehaald worden: ${m}`,
    },
  };
  function t() {
    return (document.documentElement.lang || "en").toLowerCase().startsWith("nl") ? WORDS.nl : WORDS.en;
  }
  /* The site's root: the Dutch page lives one folder deeper (nl/verify/) but shares the root's pins. */
  function siteUrl(path) {
    const root = typeof __md_scope !== "undefined" ? __md_scope : new URL("../", location.href);
    return new URL(path, root);
  }

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
      const file = await getJson(siteUrl("verify/trusted-issuers.json"));
      trusted = (Array.isArray(file.issuers) ? file.issuers : []).map((i) => i && i.id).filter((d) => typeof d === "string");
    } catch (e) { notes.push(t().noList(e.message)); }
    if (!trusted.length) notes.push(t().noPin);
    try { contexts = await getJson(siteUrl("verify/contexts.json")); }
    catch (e) { notes.push(t().noContexts(e.message)); }
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
      catch (e) { notes.push(t().noDid(e.message)); }
    }
    const url = doc && doc.credentialStatus && doc.credentialStatus.statusListCredential;
    if (typeof url === "string" && /^https?:\/\//.test(url)) {
      try { opts.statusList = await getJson(url); }
      catch (e) { notes.push(t().noStatus(e.message)); }
    }
    return { opts, notes };
  }

  function render(box, result, notes, source) {
    const w = t();
    box.replaceChildren();
    const text = { valid: w.valid, invalid: w.invalid }[result.verdict] || w.untrusted(String(result.claims.issuer_id).slice(0, 100));
    const verdict = el("p", text, "mm-verify-verdict " + (result.valid ? "is-valid" : "is-invalid"));
    verdict.id = "mm-verify-verdict";
    verdict.dataset.valid = String(result.valid);
    verdict.dataset.verdict = result.verdict;
    box.append(verdict);
    if (!result.valid) {
      box.append(el("p", w.reasons));
      const ul = el("ul");
      ul.id = "mm-verify-reasons";
      result.errors.forEach((e) => ul.append(el("li", e)));
      box.append(ul);
    }
    if (source) box.append(el("p", w.source(source)));
    const table = el("table");
    table.id = "mm-verify-claims";
    const caption = el("caption", result.valid ? w.signed : w.unsigned);
    table.append(caption);
    for (const key of CLAIMS) {
      const label = w.labels[key];
      let value = result.claims[key];
      if (key === "valid_until" && (value === null || value === undefined) && Object.keys(result.claims).length) value = w.never;
      if (value === null || value === undefined) continue;
      const tr = el("tr");
      tr.dataset.claim = key;
      tr.append(el("th", label), el("td", String(value)));
      table.append(tr);
    }
    const rev = el("tr");
    rev.dataset.claim = "revocation";
    rev.append(el("th", w.revocation), el("td", result.revocation));
    table.append(rev);
    box.append(table);
    const checks = el("table");
    checks.id = "mm-verify-checks";
    checks.append(el("caption", w.checks));
    for (const c of result.checks) {
      const tr = el("tr", undefined, `mm-check-${c.status === "n/a" ? "na" : c.status}`);
      tr.dataset.check = c.check;
      tr.dataset.status = c.status;
      const name = (w.checkNames && w.checkNames[c.check]) || c.check;    // English: the verifier's own name
      tr.append(el("td", w.marks[c.status], "mm-check-status"), el("th", name), el("td", c.detail, "mm-check-detail"));
      checks.append(tr);
    }
    box.append(checks);
    notes.forEach((n) => box.append(el("p", w.note(n))));
  }

  async function verifyText(root, text, source) {
    const box = root.querySelector("#mm-verify-result");
    box.replaceChildren(el("p", t().checking));
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
      root.querySelector("#mm-verify-email-result").textContent = ok ? t().match : t().noMatch;
    };
  }

  async function showPinned() {
    const box = document.getElementById("mm-verify-pinned");
    if (!box) return;
    const { trusted } = await sitePins();
    box.textContent = trusted.length ? t().trusts(trusted.length, trusted.join(", ")) : t().trustsNone;
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
      else if (pasted.trim()) await verifyText(root, pasted, t().pasted);
      else root.querySelector("#mm-verify-result").replaceChildren(el("p", t().chooseFirst));
    });
    root.querySelector("#mm-verify-file").addEventListener("change", () => form.requestSubmit());
    const code = new URLSearchParams(location.search).get("c");
    if (code) {
      const url = siteUrl(`api/v1/credentials/${encodeURIComponent(code)}`);
      fetch(url, { cache: "no-store" }).then(async (resp) => {
        if (!resp.ok) throw new Error(resp.status === 404 ? t().noCode : resp.status === 410 ? t().erased : `HTTP ${resp.status}`);
        await verifyText(root, await resp.text(), t().code(code));
      }).catch((e) => root.querySelector("#mm-verify-result").replaceChildren(
        el("p", t().fetchFailed(code, e.message), "mm-verify-verdict is-invalid")));
    }
  }

  if (typeof document$ !== "undefined" && document$.subscribe) document$.subscribe(init);
  else if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", init);
  else init();
})();
