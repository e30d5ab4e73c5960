/* minimega certificate verifier: both Data Integrity proofs, issuer trust, dates and revocation.
 *
 * The same checks, in the same order, with the same statuses ("pass", "fail", "n/a") and words as
 * `minimega cert verify` (src/minimega/classroom/credential.py, CHECKS); the shared tamper cases in
 * tests/verify_cases.py run against both. Each proof of the set:
 *   hashData = SHA-256(canonical(proof config)) || SHA-256(canonical(credential without proof))
 *   Ed25519.verify(key of proof.verificationMethod, base58btc(proofValue), hashData)
 * where canonical is RFC 8785 JSON for eddsa-jcs-2022 and RDFC-1.0 N-Quads for eddsa-rdfc-2022
 * (jsonld.js, vendored, over the contexts the site bundles: nothing is fetched). A valid signature
 * counts only when the issuer is one of `opts.trustedIssuers` (the site pins them at build time).
 * Runs in browsers (Chrome 137+, Firefox 129+, Safari 17+) and in Node >= 20 (used by the tests).
 */
(function (root) {
  "use strict";
  const VC_V2 = "https://www.w3.org/ns/credentials/v2";
  const OB_V3 = "https://purl.imsglobal.org/spec/ob/v3p0/context-3.0.3.json";
  const SUITES = ["eddsa-rdfc-2022", "eddsa-jcs-2022"];
  const B58 = "123456789ABCDEFGHJKLMNPQRSTUVWXYZabcdefghijkmnopqrstuvwxyz";
  const DATETIME = /^(\d{4})-(\d{2})-(\d{2})T(\d{2}):(\d{2}):(\d{2})(\.\d{1,9})?(Z|[+-]\d{2}:\d{2})$/;
  const NOT_TRUSTED = "signature valid, issuer not trusted";
  const LIST_BITS = 131072, MAX_LIST_BYTES = 16 * LIST_BITS / 8;
  const CHECKS = ["JSON", "@context", "type", "credentialSubject", "issuer",
    "proof set", "eddsa-rdfc-2022 proof", "eddsa-jcs-2022 proof", "issuer trusted",
    "validFrom", "validUntil", "credentialStatus",
    "status list proof set", "status list eddsa-rdfc-2022 proof", "status list eddsa-jcs-2022 proof",
    "status list issuer", "status list id", "status list validFrom", "status list validUntil",
    "status list contents", "revocation"];
  const STATUS_LIST_CHECKS = CHECKS.slice(CHECKS.indexOf("status list proof set"));
  const subtle = root.crypto.subtle;
  const isObject = (v) => v !== null && typeof v === "object" && !Array.isArray(v);

  /* The value as compact JSON cut at `limit` characters (credential.show in Python). */
  function show(value, limit) {
    limit = limit || 60;
    const text = value === undefined || value === null ? "missing" : JSON.stringify(value);
    return text.length <= limit ? text : text.slice(0, limit) + "…";
  }

  function b58decode(text) {
    let n = 0n;
    for (const ch of text) {
      const i = B58.indexOf(ch);
      if (i < 0) throw new Error(`'${ch}' is not a base58btc character`);
      n = n * 58n + BigInt(i);
    }
    const bytes = [];
    while (n > 0n) { bytes.unshift(Number(n & 255n)); n >>= 8n; }
    let zeros = 0;
    while (zeros < text.length && text[zeros] === "1") zeros++;
    return new Uint8Array([...new Array(zeros).fill(0), ...bytes]);
  }

  function multibase(value) {
    if (typeof value !== "string" || value[0] !== "z" || value.length < 2)
      throw new Error("expected a base58btc multibase value starting with 'z'");
    return b58decode(value.slice(1));
  }

  /* RFC 8785: JSON.stringify already writes strings and numbers the way JCS wants;
   * only the member order (UTF-16 code units, which is what Array.prototype.sort compares) is added. */
  function jcs(value) {
    if (value === null || typeof value === "boolean" || typeof value === "string") return JSON.stringify(value);
    if (typeof value === "number") {
      if (!Number.isFinite(value)) throw new Error("non-finite number");
      return JSON.stringify(value);
    }
    if (Array.isArray(value)) return "[" + value.map(jcs).join(",") + "]";
    if (typeof value === "object")
      return "{" + Object.keys(value).sort().map((k) => JSON.stringify(k) + ":" + jcs(value[k])).join(",") + "}";
    throw new Error(`${typeof value} is not JSON`);
  }

  async function sha256(text) {
    return new Uint8Array(await subtle.digest("SHA-256", new TextEncoder().encode(text)));
  }

  /* RDFC-1.0 canonical N-Quads, with contexts only from `contexts` (URL -> context document). */
  function jsonldLib() {
    if (root.jsonld) return root.jsonld;
    if (typeof require === "function") return require(require("path").join(__dirname, "../vendor/jsonld/jsonld.min.js"));
    throw new Error("jsonld.js is not loaded");
  }

  /* Under Node (the tests), the contexts bundled with the Python package, when none are given. */
  function nodeContexts() {
    if (typeof require !== "function") return null;
    const fs = require("fs"), path = require("path");
    const dir = path.join(__dirname, "../../../src/minimega/classroom/contexts");
    const files = { [VC_V2]: "credentials-v2.json", [OB_V3]: "ob-v3p0-context-3.0.3.json",
      "https://w3id.org/security/data-integrity/v2": "data-integrity-v2.json" };
    const out = {};
    for (const [url, name] of Object.entries(files)) out[url] = JSON.parse(fs.readFileSync(path.join(dir, name), "utf8"));
    return out;
  }

  async function rdfc(doc, contexts) {
    contexts = contexts || nodeContexts();
    const documentLoader = async (url) => {
      if (!contexts || !Object.prototype.hasOwnProperty.call(contexts, url)) throw new Error(`context ${url} is not bundled`);
      return { contextUrl: null, documentUrl: url, document: contexts[url] };
    };
    return jsonldLib().canonize(doc, { algorithm: "RDFC-1.0", format: "application/n-quads", documentLoader, safe: false });
  }

  function parsePublicMultikey(value) {
    const raw = multibase(value);
    if (raw.length !== 34 || raw[0] !== 0xed || raw[1] !== 0x01) throw new Error("not an Ed25519 Multikey");
    return raw.slice(2);
  }

  /* Key bytes behind a verification method: did:key offline, anything else from didDocuments
   * (keys.resolve_verification_method in Python, with the same messages). */
  function resolveKey(vm, didDocuments) {
    if (typeof vm !== "string" || !vm.includes("#")) throw new Error("verification method has no '#key' fragment");
    const did = vm.slice(0, vm.indexOf("#")), frag = vm.slice(vm.indexOf("#") + 1);
    if (did.startsWith("did:key:")) {
      const fp = did.slice(8);
      if (frag !== fp) throw new Error(`unknown key id #${frag.slice(0, 24)}: a did:key only holds #${fp.slice(0, 24)}…`);
      try { return { raw: parsePublicMultikey(fp), multikey: fp }; } catch (e) {
        throw new Error(`did:key ${fp.slice(0, 24)}… is not an Ed25519 Multikey`);
      }
    }
    const doc = (didDocuments || {})[did];
    if (!isObject(doc)) throw new Error(`no DID document for ${did.slice(0, 80)} (pass one, or verify online)`);
    if (!(Array.isArray(doc.assertionMethod) ? doc.assertionMethod : []).includes(vm))
      throw new Error(`unknown key id ${vm.slice(0, 120)}: not an assertion method of ${did.slice(0, 80)}`);
    for (const m of Array.isArray(doc.verificationMethod) ? doc.verificationMethod : []) {
      if (isObject(m) && m.id === vm && m.controller === did) {
        try { return { raw: parsePublicMultikey(m.publicKeyMultibase), multikey: m.publicKeyMultibase }; } catch (e) {
          throw new Error(`key ${vm.slice(0, 120)} is not an Ed25519 Multikey`);
        }
      }
    }
    throw new Error(`unknown key id ${vm.slice(0, 120)}: not in the verificationMethod of ${did.slice(0, 80)}`);
  }

  /* The instant a dateTime names (ms), or null: only DATETIME strings, real calendar dates. */
  function parseTime(value) {
    const m = typeof value === "string" ? DATETIME.exec(value) : null;
    if (!m) return null;
    const [y, mo, d, h, mi, s] = m.slice(1, 7).map(Number);
    const days = new Date(Date.UTC(y, mo, 0)).getUTCDate();          // days in month `mo`
    if (mo < 1 || mo > 12 || d < 1 || d > days || h > 23 || mi > 59 || s > 59) return null;
    if (m[8] !== "Z" && (Number(m[8].slice(1, 3)) > 23 || Number(m[8].slice(4)) > 59)) return null;
    const t = Date.parse(value.slice(0, 19) + (m[8] === "Z" ? "Z" : m[8]));
    return Number.isFinite(t) ? t : null;
  }
  const badTime = (name, value) => `${name} is missing or not an XML Schema dateTime with a time zone: ${show(value)}`;

  /* null when `proof` is a valid signature on `unsecured` by raw key `raw`, else why not (verify_proof). */
  async function verifyProof(unsecured, proof, raw, contexts) {
    const suite = proof.cryptosuite;
    if (proof.type !== "DataIntegrityProof" || !SUITES.includes(suite))
      return `unsupported proof type ${show(proof.type)} / cryptosuite ${show(suite)}`;
    if (proof.proofPurpose !== "assertionMethod") return `proofPurpose is ${show(proof.proofPurpose)}, expected "assertionMethod"`;
    const config = Object.assign({}, proof);
    delete config.proofValue;
    if ("@context" in config && jcs(config["@context"]) !== jcs(unsecured["@context"] ?? null))
      return "the proof's @context differs from the document's";
    if (suite === "eddsa-rdfc-2022") config["@context"] = unsecured["@context"];
    if (parseTime(proof.created) === null) return badTime("created", proof.created);
    let sig;
    try { sig = multibase(proof.proofValue); } catch (e) { return "proofValue is not a base58btc multibase string"; }
    if (sig.length !== 64) return `proofValue holds ${sig.length} bytes, an Ed25519 signature has 64 (truncated?)`;
    let configBytes, docBytes;
    try {
      if (suite === "eddsa-jcs-2022") [configBytes, docBytes] = [jcs(config), jcs(unsecured)];
      else [configBytes, docBytes] = [await rdfc(config, contexts), await rdfc(unsecured, contexts)];
    } catch (e) {
      return `cannot canonicalize the document for ${suite} with the bundled contexts`;
    }
    const data = new Uint8Array(64);
    data.set(await sha256(configBytes), 0);
    data.set(await sha256(docBytes), 32);
    const key = await subtle.importKey("raw", raw, { name: "Ed25519" }, false, ["verify"]);
    const ok = await subtle.verify({ name: "Ed25519" }, key, sig, data);
    return ok ? null : "signature does not match the document (edited, or signed by another key)";
  }

  function claimsOf(doc) {
    const subject = isObject(doc.credentialSubject) ? doc.credentialSubject : {};
    const ach = isObject(subject.achievement) ? subject.achievement : {};
    const issuer = isObject(doc.issuer) ? doc.issuer : { id: doc.issuer };
    const ids = Array.isArray(subject.identifier) ? subject.identifier.filter(isObject) : [];
    const name = ids.find((i) => i.identityType === "name");
    const email = ids.find((i) => i.identityType === "emailAddress");
    const criteria = isObject(ach.criteria) ? ach.criteria : {};
    /* The bank that graded it, as claims.py reads it: "<id>@sha256:<hex>" (ext:examBank). */
    const others = Array.isArray(ach.otherIdentifier) ? ach.otherIdentifier.filter(isObject) : [];
    const bank = others.find((o) => o.identifierType === "ext:examBank");
    return {
      name: name ? name.identityHash ?? null : null, achievement: ach.name ?? null, description: ach.description ?? null,
      criteria: criteria.narrative ?? null, course_version: ach.version ?? null,
      exam_bank: bank ? bank.identifier ?? null : null,
      valid_from: doc.validFrom ?? null, valid_until: doc.validUntil ?? null, issuer_name: issuer.name ?? null,
      issuer_id: issuer.id ?? null, issuer_url: issuer.url ?? null, credential_id: doc.id ?? null,
      email: email ? "salted SHA-256 hash" : "none", email_identity: email || null,
    };
  }

  function newResult() {
    const r = { valid: false, verdict: "invalid", errors: [], checks: [], claims: {}, revocation: "not checked (offline)" };
    r.add = (check, ok, passed, failed) => { r.checks.push({ check, status: ok ? "pass" : "fail", detail: ok ? passed : failed }); return ok; };
    r.skip = (check, why) => r.checks.push({ check, status: "n/a", detail: why });
    r.status = (check) => (r.checks.find((c) => c.check === check) || {}).status;
    return r;
  }

  const issuerIdOf = (doc) => isObject(doc.issuer) ? doc.issuer.id : doc.issuer;

  /* The proof-set checks (_check_proof_set): exactly one proof of each suite, each valid and by the
   * issuer's key. Returns the signer's Multikey when every proof passes. */
  async function checkProofSet(doc, r, opts, label) {
    const proofs = doc.proof;
    const expected = `one ${SUITES[0]} proof and one ${SUITES[1]} proof`;
    if (!Array.isArray(proofs)) {
      const found = isObject(proofs) ? "an object" : (proofs === undefined || proofs === null ? "no proof" : show(proofs));
      r.add(`${label}proof set`, false, "", `proof must be an array holding ${expected}; found ${found}`);
      for (const s of SUITES) r.skip(`${label}${s} proof`, "not checked: the proof set is malformed");
      return null;
    }
    const suites = proofs.map((q) => isObject(q) ? q.cryptosuite ?? null : null);
    const wellFormed = proofs.length === 2 && proofs.every(isObject) &&
      jcs(suites.map(String).sort()) === jcs([...SUITES].sort());
    r.add(`${label}proof set`, wellFormed, expected, `expected ${expected}; found ${proofs.length}: ${show(suites, 120)}`);
    const unsecured = Object.assign({}, doc);
    delete unsecured.proof;
    const issuerId = issuerIdOf(doc);
    const signers = [];
    for (const suite of SUITES) {
      const name = `${label}${suite} proof`;
      const mine = proofs.filter((q) => isObject(q) && q.cryptosuite === suite);
      if (mine.length !== 1) {
        r.add(name, false, "", mine.length ? `${mine.length} proofs of this cryptosuite, expected one` : "missing");
        continue;
      }
      const vm = mine[0].verificationMethod;
      let key;
      try { key = resolveKey(vm, opts.didDocuments); } catch (e) { r.add(name, false, "", e.message); continue; }
      if (vm.split("#")[0] !== issuerId) {
        r.add(name, false, "", `key ${show(vm, 80)} is not controlled by the issuer ${show(issuerId, 80)}`);
        continue;
      }
      const why = await verifyProof(unsecured, mine[0], key.raw, opts.contexts);
      if (r.add(name, why === null, `signature valid, by the issuer's key ${key.multikey.slice(0, 16)}…`, why || ""))
        signers.push(key.multikey);
    }
    return wellFormed && signers.length === 2 && signers[0] === signers[1] ? signers[0] : null;
  }

  function checkShape(doc, r) {
    const ctx = doc["@context"];
    let ok = r.add("@context", Array.isArray(ctx) && ctx[0] === VC_V2 && ctx.includes(OB_V3),
      "VC 2.0 and Open Badges 3.0.3", `must start with ${VC_V2} and include ${OB_V3}; found ${show(ctx)}`);
    const types = Array.isArray(doc.type) ? doc.type.map(String) : [];
    ok = r.add("type", types.includes("VerifiableCredential") && types.includes("OpenBadgeCredential"),
      "VerifiableCredential, OpenBadgeCredential",
      `must include VerifiableCredential and OpenBadgeCredential; found ${show(doc.type)}`) && ok;
    const subject = doc.credentialSubject;
    ok = r.add("credentialSubject", isObject(subject) && isObject(subject.achievement),
      "an achievement subject", "needs an object with an achievement") && ok;
    ok = r.add("issuer", isObject(doc.issuer) && typeof doc.issuer.id === "string",
      String(issuerIdOf(doc)).slice(0, 100), "needs an issuer profile with an id") && ok;
    return ok;
  }

  function checkDates(doc, r, now, label) {
    const from = parseTime(doc.validFrom);
    if (from === null) r.add(`${label}validFrom`, false, "", badTime("validFrom", doc.validFrom).slice("validFrom ".length));
    else r.add(`${label}validFrom`, from <= now + 300000, `valid since ${doc.validFrom}`, `not valid before ${doc.validFrom}`);
    if (!("validUntil" in doc)) {
      if (label) r.add(`${label}validUntil`, false, "", "missing: a status list without one could be replayed for ever");
      else r.skip("validUntil", "no expiry date");
      return;
    }
    const until = parseTime(doc.validUntil);
    if (until === null) r.add(`${label}validUntil`, false, "", badTime("validUntil", doc.validUntil).slice("validUntil ".length));
    else r.add(`${label}validUntil`, now <= until, `${label ? "fresh" : "valid"} until ${doc.validUntil}`,
      `${label ? "stale: it expired" : "expired"} on ${doc.validUntil}`);
  }

  async function gunzip(bytes) {
    const reader = new Blob([bytes]).stream().pipeThrough(new DecompressionStream("gzip")).getReader();
    const chunks = [];
    let total = 0;
    for (;;) {
      const { done, value } = await reader.read();
      if (done) break;
      total += value.length;
      if (total > MAX_LIST_BYTES) { reader.cancel(); throw new Error(`encodedList decodes to more than ${MAX_LIST_BYTES} bytes`); }
      chunks.push(value);
    }
    const out = new Uint8Array(total);
    let at = 0;
    for (const c of chunks) { out.set(c, at); at += c.length; }
    return out;
  }

  async function decodeList(encoded) {
    if (typeof encoded !== "string" || encoded[0] !== "u") throw new Error("encodedList must be multibase base64url (prefix 'u')");
    const body = encoded.slice(1);
    const bad = new Error("encodedList does not decode (base64url, then gzip)");
    if (!/^[A-Za-z0-9_-]*$/.test(body) || body.length % 4 === 1) throw bad;
    const bin = atob(body.replace(/-/g, "+").replace(/_/g, "/") + "=".repeat((4 - body.length % 4) % 4));
    try { return await gunzip(Uint8Array.from(bin, (c) => c.charCodeAt(0))); } catch (e) {
      if (e.message.startsWith("encodedList decodes")) throw e;
      throw bad;
    }
  }

  function parseEntry(status) {
    if (!isObject(status)) throw new Error("credentialStatus is missing or not an object");
    if (status.type !== "BitstringStatusListEntry" || status.statusPurpose !== "revocation")
      throw new Error("credentialStatus is not a BitstringStatusListEntry for revocation");
    const index = status.statusListIndex;
    if (typeof index !== "string" || !/^[0-9]{1,9}$/.test(index))
      throw new Error(`statusListIndex must be a decimal string, got ${show(index)}`);
    const url = status.statusListCredential;
    if (typeof url !== "string" || !(url.startsWith("https://") || url.startsWith("http://")))
      throw new Error(`statusListCredential must be a URL, got ${show(url)}`);
    return [url, Number(index)];
  }

  async function checkStatus(doc, statusDoc, r, opts, now) {
    let url, index;
    try {
      [url, index] = parseEntry(doc.credentialStatus);
      r.add("credentialStatus", true, `revocation entry ${index} of ${url}`, "");
    } catch (e) {
      r.add("credentialStatus", false, "", e.message);
      for (const name of STATUS_LIST_CHECKS) r.skip(name, "not checked: the credential has no usable status entry");
      r.revocation = "unknown: no usable status entry";
      return;
    }
    if (statusDoc === undefined || statusDoc === null) {
      for (const name of STATUS_LIST_CHECKS) r.skip(name, "not checked: no status list (offline or unreachable)");
      return;
    }
    if (!isObject(statusDoc)) {
      r.add("status list proof set", false, "", "the status list is not a JSON object");
      for (const name of STATUS_LIST_CHECKS.slice(1)) r.skip(name, "not checked: the status list is not a JSON object");
      r.revocation = "unknown: the status list was rejected";
      return;
    }
    const n = r.checks.length;
    const signer = await checkProofSet(statusDoc, r, opts, "status list ");
    r.add("status list issuer", statusDoc.issuer === issuerIdOf(doc), "the credential's issuer",
      `issued by ${show(statusDoc.issuer, 80)}, not by the credential's issuer`);
    r.add("status list id", statusDoc.id === url, url, `is ${show(statusDoc.id, 80)}, expected ${url}`);
    checkDates(statusDoc, r, now, "status list ");
    let revoked = null;
    const subject = statusDoc.credentialSubject;
    try {
      if (!isObject(subject) || subject.type !== "BitstringStatusList" || subject.statusPurpose !== "revocation")
        throw new Error("not a revocation BitstringStatusList");
      const bits = await decodeList(subject.encodedList);
      if (index >= bits.length * 8) throw new Error(`statusListIndex ${index} outside a list of ${bits.length * 8} bits`);
      revoked = (bits[index >> 3] & (0x80 >> (index & 7))) !== 0;
      r.add("status list contents", true, `a revocation list of ${bits.length * 8} bits`, "");
    } catch (e) { r.add("status list contents", false, "", e.message); }
    const asOf = statusDoc.validFrom;
    if (r.checks.slice(n).some((c) => c.status === "fail") || signer === null) {
      r.skip("revocation", "unknown: the status list was rejected");
      r.revocation = "unknown: the status list was rejected";
      return;
    }
    r.revocation = revoked ? `revoked (status list of ${asOf})` : `not revoked (as of ${asOf})`;
    r.add("revocation", !revoked, `not revoked as of ${asOf}`, `revoked by the issuer (status list of ${asOf})`);
  }

  function finish(r) {
    r.errors = r.checks.filter((c) => c.status === "fail").map((c) => `${c.check}: ${c.detail}`);
    r.valid = r.errors.length === 0;
    const signatureValid = ["proof set", "eddsa-rdfc-2022 proof", "eddsa-jcs-2022 proof"].every((n) => r.status(n) === "pass");
    r.verdict = r.valid ? "valid" : (r.status("issuer trusted") === "fail" && signatureValid && r.errors.length === 1
      ? NOT_TRUSTED : "invalid");
    delete r.add; delete r.skip; delete r.status;
    return r;
  }

  /* Verify a credential given as JSON text or object. Never throws for bad input: reports it.
   * opts: trustedIssuers (Set or array of DIDs; omitted: the trust check is n/a), contexts (URL ->
   * JSON-LD context), didDocuments (DID -> document), statusList (the fetched list), now (ms). */
  async function verifyCredential(input, opts) {
    opts = Object.assign({}, opts || {});
    const r = newResult();
    const now = opts.now !== undefined ? opts.now : Date.now();
    let doc = input, parsed = true;
    if (typeof input === "string") {
      try { doc = JSON.parse(input); } catch (e) { parsed = false; }
    }
    if (!parsed || !isObject(doc)) {
      r.add("JSON", false, "", parsed ? "a credential is a JSON object" : "not valid JSON");
      for (const name of CHECKS.slice(1)) r.skip(name, "not checked: no credential to check");
      r.revocation = "not checked: no credential";
      return finish(r);
    }
    r.add("JSON", true, "a JSON object", "");
    r.claims = claimsOf(doc);
    if (!checkShape(doc, r)) {
      for (const name of CHECKS.slice(CHECKS.indexOf("proof set")))
        r.skip(name, "not checked: the credential is not an Open Badges 3.0 credential");
      r.revocation = "not checked: not an Open Badges credential";
      return finish(r);
    }
    const signer = await checkProofSet(doc, r, opts, "");
    const issuer = issuerIdOf(doc);
    if (opts.trustedIssuers === undefined || opts.trustedIssuers === null) {
      r.skip("issuer trusted", "not checked: no list of trusted issuers given");
    } else {
      const trusted = new Set(opts.trustedIssuers);
      r.add("issuer trusted", trusted.has(issuer), "a trusted issuer",
        `${show(issuer, 80)} is not one of the ${trusted.size} trusted issuers` + (signer ? ` (${NOT_TRUSTED})` : ""));
    }
    checkDates(doc, r, now, "");
    await checkStatus(doc, opts.statusList, r, opts, now);
    return finish(r);
  }

  /* Does `email` match the salted hash in the credential? (An employer who knows the email can check.) */
  async function emailMatches(identity, email) {
    if (!identity || typeof identity.identityHash !== "string" || !identity.identityHash.startsWith("sha256$")) return false;
    const digest = await sha256(email.trim().toLowerCase() + (identity.salt || ""));
    const hex = Array.from(digest, (b) => b.toString(16).padStart(2, "0")).join("");
    return identity.identityHash === "sha256$" + hex;
  }

  function unbakeSvg(text) {
    const m = /<openbadges:credential[^>]*>\s*(?:<!\[CDATA\[([\s\S]*)\]\]>|([\s\S]*?))\s*<\/openbadges:credential>/.exec(text);
    if (!m) throw new Error("no openbadges:credential element in this SVG");
    return (m[1] !== undefined ? m[1].split("]]]]><![CDATA[>").join("]]>") : m[2]);
  }

  function didWebUrl(did) {
    const parts = did.slice("did:web:".length).split(":").map(decodeURIComponent);
    const host = parts[0];
    const scheme = /^(localhost|127\.0\.0\.1)(:|$)/.test(host) ? "http" : "https";
    return `${scheme}://${host}/` + (parts.length > 1 ? parts.slice(1).join("/") + "/did.json" : ".well-known/did.json");
  }

  /* Verify a proof on its own (the W3C test vectors): null if valid, else why not. */
  async function verifyJcsProof(unsecured, proof, raw) { return verifyProof(unsecured, proof, raw, null); }

  const api = { verifyCredential, verifyProof, verifyJcsProof, jcs, rdfc, b58decode, resolveKey, claimsOf,
    emailMatches, unbakeSvg, didWebUrl, parseTime, CHECKS, NOT_TRUSTED };
  root.MinimegaVerify = api;
  if (typeof module !== "undefined" && module.exports) module.exports = api;
})(typeof globalThis !== "undefined" ? globalThis : this);
