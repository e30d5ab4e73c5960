/* minimega certificate verifier: the eddsa-jcs-2022 proof with WebCrypto Ed25519, no dependencies.
 *
 * Same checks as `minimega cert verify` (src/minimega/classroom/credential.py) for the JCS proof:
 *   hashData = SHA-256(JCS(proof config)) || SHA-256(JCS(credential without proof))
 *   Ed25519.verify(key of proof.verificationMethod, base58btc(proofValue), hashData)
 * plus: the key's controller is the issuer, the dates, and, when given, the signed status list
 * (BitstringStatusList: gzip, base64url, bit 0 = most significant bit of byte 0).
 * The eddsa-rdfc-2022 proof needs JSON-LD processing; the CLI checks it.
 * Runs in browsers (Chrome 137+, Firefox 129+, Safari 17+) and in Node >= 20 (used by the tests).
 */
(function (root) {
  "use strict";
  const VC_V2 = "https://www.w3.org/ns/credentials/v2";
  const OB_V3 = "https://purl.imsglobal.org/spec/ob/v3p0/context-3.0.3.json";
  const B58 = "123456789ABCDEFGHJKLMNPQRSTUVWXYZabcdefghijkmnopqrstuvwxyz";
  const subtle = root.crypto.subtle;

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

  function publicKeyBytes(multikey) {
    const raw = multibase(multikey);
    if (raw.length !== 34 || raw[0] !== 0xed || raw[1] !== 0x01)
      throw new Error(`${String(multikey).slice(0, 24)}… is not an Ed25519 Multikey`);
    return raw.slice(2);
  }

  /* Key bytes behind a verification method: did:key offline, anything else from didDocuments. */
  function resolveKey(vm, didDocuments) {
    if (typeof vm !== "string" || !vm.includes("#")) throw new Error("verification method has no '#key' fragment");
    const [did, frag] = [vm.slice(0, vm.indexOf("#")), vm.slice(vm.indexOf("#") + 1)];
    if (did.startsWith("did:key:")) {
      const fp = did.slice(8);
      if (frag !== fp) throw new Error(`unknown key id #${frag.slice(0, 24)}: a did:key only holds #${fp.slice(0, 24)}…`);
      return { raw: publicKeyBytes(fp), multikey: fp };
    }
    const doc = (didDocuments || {})[did];
    if (!doc) throw new Error(`no DID document for ${did}`);
    if (!(doc.assertionMethod || []).includes(vm)) throw new Error(`unknown key id ${vm}: not an assertion method of ${did}`);
    const m = (doc.verificationMethod || []).find((x) => x.id === vm && x.controller === did);
    if (!m) throw new Error(`unknown key id ${vm}`);
    return { raw: publicKeyBytes(m.publicKeyMultibase), multikey: m.publicKeyMultibase };
  }

  /* null when `proof` is a valid eddsa-jcs-2022 signature on `unsecured` by raw key `raw`, else why not. */
  async function verifyJcsProof(unsecured, proof, raw) {
    if (proof.type !== "DataIntegrityProof" || proof.cryptosuite !== "eddsa-jcs-2022")
      return "not an eddsa-jcs-2022 DataIntegrityProof";
    if (proof.proofPurpose !== "assertionMethod") return `proofPurpose is ${JSON.stringify(proof.proofPurpose)}`;
    const config = Object.assign({}, proof);
    delete config.proofValue;
    if ("@context" in config && jcs(config["@context"]) !== jcs(unsecured["@context"]))
      return "the proof's @context differs from the document's";
    let sig;
    try { sig = multibase(proof.proofValue); } catch (e) { return `proofValue: ${e.message}`; }
    if (sig.length !== 64) return `proofValue holds ${sig.length} bytes, an Ed25519 signature has 64 (truncated?)`;
    const data = new Uint8Array(64);
    data.set(await sha256(jcs(config)), 0);
    data.set(await sha256(jcs(unsecured)), 32);
    const key = await subtle.importKey("raw", raw, { name: "Ed25519" }, false, ["verify"]);
    const ok = await subtle.verify({ name: "Ed25519" }, key, sig, data);
    return ok ? null : "signature does not match the document (edited, or signed by another key)";
  }

  function claimsOf(doc) {
    const subject = doc && typeof doc.credentialSubject === "object" && doc.credentialSubject || {};
    const ach = typeof subject.achievement === "object" && subject.achievement || {};
    const issuer = typeof doc.issuer === "object" && doc.issuer || { id: doc.issuer };
    const ids = Array.isArray(subject.identifier) ? subject.identifier.filter((x) => x && typeof x === "object") : [];
    const name = ids.find((i) => i.identityType === "name");
    const email = ids.find((i) => i.identityType === "emailAddress");
    return {
      name: name ? name.identityHash : null, achievement: ach.name ?? null, description: ach.description ?? null,
      criteria: ach.criteria && ach.criteria.narrative || null, course_version: ach.version ?? null,
      valid_from: doc.validFrom ?? null, valid_until: doc.validUntil ?? null, issuer_name: issuer.name ?? null,
      issuer_id: issuer.id ?? null, issuer_url: issuer.url ?? null, credential_id: doc.id ?? null,
      email: email ? "salted SHA-256 hash" : "none", email_identity: email || null,
    };
  }

  function newResult() {
    const r = { valid: false, errors: [], checks: [], claims: {}, revocation: "not checked (offline)" };
    r.check = (name, ok, detail) => {
      r.checks.push({ check: name, ok, detail: detail || "" });
      if (!ok) r.errors.push(detail ? `${name}: ${detail}` : name);
      return ok;
    };
    return r;
  }

  async function verifyProofs(doc, r, didDocuments, trustedKeys, label) {
    let proofs = doc.proof;
    if (proofs && !Array.isArray(proofs)) proofs = [proofs];
    if (!Array.isArray(proofs) || !proofs.length) { r.check(`${label} proofs`, false, "no Data Integrity proof"); return null; }
    const jcsProof = proofs.find((p) => p && p.cryptosuite === "eddsa-jcs-2022");
    if (!jcsProof) { r.check(`${label} eddsa-jcs-2022 proof`, false, "missing"); return null; }
    const unsecured = Object.assign({}, doc);
    delete unsecured.proof;
    const issuerId = typeof doc.issuer === "object" && doc.issuer ? doc.issuer.id : doc.issuer;
    let key;
    try { key = resolveKey(jcsProof.verificationMethod, didDocuments); } catch (e) {
      r.check(`${label} eddsa-jcs-2022 proof`, false, e.message); return null;
    }
    if (String(jcsProof.verificationMethod).split("#")[0] !== issuerId) {
      r.check(`${label} eddsa-jcs-2022 proof`, false, "the signing key is not controlled by the issuer"); return null;
    }
    const why = await verifyJcsProof(unsecured, jcsProof, key.raw);
    if (!r.check(`${label} eddsa-jcs-2022 proof`, why === null, why || `signed by ${key.multikey.slice(0, 16)}…`)) return null;
    if (trustedKeys) r.check(`${label} issuer key`, trustedKeys.has(key.multikey),
      trustedKeys.has(key.multikey) ? "published by this site" : "not a key this site publishes");
    return key.multikey;
  }

  function checkDates(doc, r, now, label) {
    const from = Date.parse(doc.validFrom);
    if (!r.check(`${label} validFrom`, Number.isFinite(from), "missing or not a date")) return;
    r.check(`${label} validFrom`, from <= now + 300000, `not valid before ${doc.validFrom}`);
    if ("validUntil" in doc) {
      const until = Date.parse(doc.validUntil);
      r.check(`${label} validUntil`, Number.isFinite(until) && now <= until,
        `${label === "status list" ? "stale: it expired" : "expired"} on ${doc.validUntil}`);
    }
  }

  async function gunzip(bytes) {
    const stream = new Blob([bytes]).stream().pipeThrough(new DecompressionStream("gzip"));
    return new Uint8Array(await new Response(stream).arrayBuffer());
  }

  function base64url(text) {
    const b64 = text.replace(/-/g, "+").replace(/_/g, "/") + "=".repeat((4 - text.length % 4) % 4);
    const bin = atob(b64);
    return Uint8Array.from(bin, (c) => c.charCodeAt(0));
  }

  async function checkStatus(doc, statusDoc, r, didDocuments, now) {
    const entry = doc.credentialStatus;
    if (!entry || entry.type !== "BitstringStatusListEntry" || entry.statusPurpose !== "revocation" ||
        !/^\d+$/.test(String(entry.statusListIndex))) {
      r.check("credentialStatus", false, "not a BitstringStatusListEntry for revocation"); return;
    }
    const sub = newResult();
    if (!statusDoc || typeof statusDoc !== "object") { r.check("status list", false, "not a JSON object"); return; }
    await verifyProofs(statusDoc, sub, didDocuments, null, "status list");
    sub.check("status list issuer", statusDoc.issuer === (doc.issuer && doc.issuer.id), "not the credential's issuer");
    sub.check("status list id", statusDoc.id === entry.statusListCredential, "does not match credentialStatus");
    checkDates(statusDoc, sub, now, "status list");
    if (sub.errors.length) {
      r.checks.push(...sub.checks);
      r.errors.push(...sub.errors.map((e) => `status list rejected (stale or forged): ${e}`));
      r.revocation = "unknown: the status list was rejected";
      return;
    }
    const cs = statusDoc.credentialSubject || {};
    let bits;
    try {
      if (cs.type !== "BitstringStatusList" || typeof cs.encodedList !== "string" || cs.encodedList[0] !== "u")
        throw new Error("not a revocation BitstringStatusList");
      bits = await gunzip(base64url(cs.encodedList.slice(1)));
    } catch (e) { r.check("status list", false, e.message); return; }
    const index = Number(entry.statusListIndex);
    if (!r.check("status list", index < bits.length * 8, "index outside the list")) return;
    const revoked = (bits[index >> 3] & (0x80 >> (index & 7))) !== 0;
    r.checks.push(...sub.checks);
    r.revocation = revoked ? `revoked (status list of ${statusDoc.validFrom})` : `not revoked (as of ${statusDoc.validFrom})`;
    r.check("revocation", !revoked, revoked ? `revoked by the issuer (status list of ${statusDoc.validFrom})`
      : `not revoked as of ${statusDoc.validFrom}`);
  }

  /* Verify a credential given as JSON text or object. Never throws for bad input: reports it. */
  async function verifyCredential(input, opts) {
    opts = opts || {};
    const r = newResult();
    const now = opts.now !== undefined ? opts.now : Date.now();
    let doc = input;
    if (typeof input === "string") {
      try { doc = JSON.parse(input); } catch (e) { r.check("JSON", false, `not valid JSON (${e.message})`); return r; }
    }
    if (!doc || typeof doc !== "object" || Array.isArray(doc)) { r.check("JSON", false, "a credential is a JSON object"); return r; }
    r.claims = claimsOf(doc);
    const ctx = doc["@context"];
    let ok = r.check("@context", Array.isArray(ctx) && ctx[0] === VC_V2 && ctx.includes(OB_V3),
      `must start with ${VC_V2} and include ${OB_V3}`);
    const types = Array.isArray(doc.type) ? doc.type : [];
    ok = r.check("type", types.includes("VerifiableCredential") && types.includes("OpenBadgeCredential"),
      "must include VerifiableCredential and OpenBadgeCredential") && ok;
    ok = r.check("issuer", !!(doc.issuer && typeof doc.issuer.id === "string"), "needs an issuer profile with an id") && ok;
    if (ok) {
      try {
        await verifyProofs(doc, r, opts.didDocuments, opts.trustedKeys || null, "credential");
        checkDates(doc, r, now, "credential");
        if (opts.statusList !== undefined && opts.statusList !== null)
          await checkStatus(doc, opts.statusList, r, opts.didDocuments, now);
      } catch (e) {
        r.check("verification", false, e.message);
      }
    }
    r.valid = r.errors.length === 0;
    delete r.check;
    return r;
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

  const api = { verifyCredential, verifyJcsProof, jcs, b58decode, resolveKey, claimsOf, emailMatches, unbakeSvg, didWebUrl };
  root.MinimegaVerify = api;
  if (typeof module !== "undefined" && module.exports) module.exports = api;
})(typeof globalThis !== "undefined" ? globalThis : this);
