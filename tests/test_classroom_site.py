"""The verify page inside a built mkdocs site: no exam answer published; the verifier under Node.
(The browser run through the exam and the verify page is in test_exam_browser.py.)"""
import html
import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from classroom_support import BANKS, ROOT, make_config
from minimega.classroom.quiz import load_banks

TEXT_FILES = {".html", ".js", ".json", ".xml", ".txt", ".md", ".yaml", ".yml", ".css", ".svg"}


def secrets_of_exam() -> list[str]:
    """Texts that would give answers away: explanations, correct options, numeric answers' worked text."""
    out = []
    for bank in load_banks(BANKS):
        for item in bank.items:
            out += [item.explain] if item.explain else []
            out += [c.explain for c in item.choices]
            out += [c.text for c in item.choices if c.correct and len(c.text) >= 24]
    return [" ".join(s.split()) for s in out if len(s.strip()) >= 24]


def find_leaks(site: Path) -> list[str]:
    needles = secrets_of_exam()
    leaks = []
    for path in site.rglob("*"):
        if "exam" in path.name and path.suffix in {".yaml", ".yml"}:
            leaks.append(f"{path}: an exam bank file")
        if not path.is_file() or path.suffix not in TEXT_FILES:
            continue
        text = path.read_text("utf-8", errors="replace")
        flat = " ".join(html.unescape(re.sub(r"<[^>]+>", " ", text)).split())
        raw = " ".join(text.split())
        leaks += [f"{path}: {n[:60]}…" for n in needles if n in flat or n in raw or json.dumps(n)[1:-1] in raw]
    return leaks


@pytest.fixture(scope="module")
def site(site_build):
    """The session's build of the course site (`site_support.site_build`): what `make site` publishes."""
    return site_build.out


def test_no_exam_answer_in_the_built_site(site, tmp_path):
    assert (site / "verify" / "index.html").exists()
    assert find_leaks(site) == []
    if (ROOT / "site").is_dir():                       # a site built by `make site` / `minimega serve`
        assert find_leaks(ROOT / "site") == []
    planted = tmp_path / "planted"                     # the scanner does find a leak
    shutil.copytree(site / "verify", planted)
    (planted / "page.html").write_text("<p>" + html.escape(secrets_of_exam()[5]) + "</p>")
    assert len(find_leaks(planted)) == 1


def test_verify_core_under_node(tmp_path):
    """The page's verifier, run by Node's WebCrypto: W3C jcs vector, a service credential, tampering, revocation."""
    if not shutil.which("node"):
        pytest.skip("node not installed")
    from fastapi.testclient import TestClient

    from classroom_support import W3C, pass_exam
    from minimega.classroom.service import create_app

    app = create_app(make_config(tmp_path))
    with TestClient(app) as client:
        code = pass_exam(client)["credential"]["code"]
        cred = client.get(f"/api/v1/credentials/{code}").json()
        path = cred["credentialStatus"]["statusListCredential"].replace("http://127.0.0.1:8000", "")
        fresh = client.get(path).json()
        app.state.issuer.revoke(code)
        revoked = client.get(path).json()
    script = tmp_path / "check.js"
    script.write_text("""
const V = require(process.argv[2]);
const fs = require("fs");
(async () => {
  const w3c = JSON.parse(fs.readFileSync(process.argv[3])); const proof = w3c.proof; delete w3c.proof;
  const key = V.resolveKey("did:key:" + proof.verificationMethod.split("#")[1] + "#" + proof.verificationMethod.split("#")[1]);
  const [cred, fresh, revoked] = JSON.parse(fs.readFileSync(process.argv[4]));
  const edited = JSON.parse(JSON.stringify(cred)); edited.credentialSubject.identifier[0].identityHash = "Mallory";
  const out = {
    w3c: await V.verifyJcsProof(w3c, proof, key.raw),
    ok: await V.verifyCredential(JSON.stringify(cred), { statusList: fresh }),
    edited: await V.verifyCredential(edited, { statusList: fresh }),
    revoked: await V.verifyCredential(cred, { statusList: revoked }),
    malformed: await V.verifyCredential("{oops", {}),
  };
  console.log(JSON.stringify(out));
})();
""")
    data = tmp_path / "data.json"
    data.write_text(json.dumps([cred, fresh, revoked]))
    run = subprocess.run(["node", str(script), str(ROOT / "course/assets/verify/verify-core.js"),
                          str(W3C / "alumni-jcs.json"), str(data)], capture_output=True, text=True, timeout=60)
    out = json.loads(run.stdout)
    assert out["w3c"] is None
    assert out["ok"]["valid"] and out["ok"]["claims"]["name"] == "Ada Lovelace", out["ok"]["errors"]
    assert out["ok"]["revocation"].startswith("not revoked")
    assert not out["edited"]["valid"] and any("signature does not match" in e for e in out["edited"]["errors"])
    assert not out["revoked"]["valid"] and out["revoked"]["revocation"].startswith("revoked")
    assert not out["malformed"]["valid"] and "not valid JSON" in out["malformed"]["errors"][0]


def test_page_claims_match_what_the_cli_prints():
    """Every claim `minimega cert verify` prints (the exam bank among them) is a row of the verify page, with a
    label in English and in Dutch."""
    from minimega.classroom.cli_cert import LABELS

    js = (ROOT / "course/assets/verify/verify-page.js").read_text(encoding="utf-8")
    rows = json.loads(re.search(r"const CLAIMS = (\[.*?\]);", js, re.S).group(1))
    assert [k for k, _ in LABELS if k not in rows] == []
    for lang in ("en", "nl"):
        labels = re.search(lang + r": \{\s*labels: \{(.*?)\},", js, re.S).group(1)
        assert [k for k in rows if not re.search(rf"\b{k}: \"[^\"]+\"", labels)] == [], lang


def test_page_reads_the_exam_bank_as_the_cli_does(tmp_path):
    """verify-core.js's claimsOf names the bank that graded a credential exactly as claims.py does (the line the
    CLI prints), for the sample bank, a deployment bank and malformed entries."""
    if not shutil.which("node"):
        pytest.skip("node not installed")
    from minimega.classroom.claims import claims_of

    def doc(other):
        return {"credentialSubject": {"achievement": {"name": "x", "otherIdentifier": other}}}
    entry = {"type": ["IdentifierEntry"], "identifierType": "ext:examBank"}
    docs = [doc([{**entry, "identifier": "minimega-sample@sha256:" + "ab" * 32}]),
            doc([{"identifier": "u", "identifierType": "url"}, {**entry, "identifier": "acme-2027@sha256:" + "cd" * 32}]),
            doc([{"identifier": "acme", "identifierType": "ext:other"}]), doc("acme"), doc([None, 3]), doc(None)]
    script = tmp_path / "claims.js"
    script.write_text("const V = require(process.argv[2]);\n"
                      "const docs = JSON.parse(require('fs').readFileSync(process.argv[3]));\n"
                      "console.log(JSON.stringify(docs.map((d) => V.claimsOf(d).exam_bank)));\n")
    (tmp_path / "docs.json").write_text(json.dumps(docs))
    run = subprocess.run(["node", str(script), str(ROOT / "course/assets/verify/verify-core.js"),
                          str(tmp_path / "docs.json")], capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stderr
    got = json.loads(run.stdout)
    assert got == [claims_of(d)["exam_bank"] for d in docs]
    assert got[:3] == ["minimega-sample@sha256:" + "ab" * 32, "acme-2027@sha256:" + "cd" * 32, None]
