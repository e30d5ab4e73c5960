"""`minimega cert verify` on the shared tamper cases (tests/verify_cases.py): the verdict, the exit
status, and every check's status and words; issuer trust from --trust, the environment, a trust file
and --issuer-url."""
import json
import os
import subprocess
import sys
import time

import pytest

import verify_cases
from verify_cases import assert_truthful
from minimega.classroom import credential, trust
from minimega.classroom.cli import main

BASE = "https://course.example"
CASES = verify_cases.make_cases(BASE)
EXIT = {"valid": 0, "invalid": 1, credential.NOT_TRUSTED: 3}
def run_cli(capsys, *args):
    capsys.readouterr()
    try:
        code = main(["cert", "verify", *map(str, args)])
    except SystemExit as exit_:
        code = exit_.code if isinstance(exit_.code, int) else 2
        print(exit_.code, file=sys.stderr)
    out = capsys.readouterr()
    return code, out.out, out.err


def case_files(case, tmp_path):
    cred = case["credential"]
    path = tmp_path / "credential.json"
    path.write_text(json.dumps(cred) if isinstance(cred, dict) else cred)
    args = [path]
    url = (cred.get("credentialStatus") or {}).get("statusListCredential") if isinstance(cred, dict) else None
    if isinstance(url, str) and url in case["lists"]:
        (tmp_path / "list.json").write_text(json.dumps(case["lists"][url]))
        args += ["--status-list", tmp_path / "list.json"]
    if case["did_document"]:
        (tmp_path / "did.json").write_text(json.dumps(case["did_document"]))
        args += ["--did-document", tmp_path / "did.json"]
    return args


def test_the_shared_list_is_big_enough():
    rejected = [c["name"] for c in CASES if c["verdict"] != "valid"]
    assert len(rejected) >= 40
    assert {"attacker-resigned", "rdfc-proof-flipped", "rdfc-proof-removed", "duplicate-jcs-proof", "proof-as-object",
            "extra-proof", "validFrom-without-zone"} <= set(rejected)


@pytest.mark.parametrize("case", CASES, ids=[c["name"] for c in CASES])
def test_cli_on_shared_case(case, tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))                 # no personal trust file
    monkeypatch.delenv(trust.ENV, raising=False)
    trusted = [a for did in verify_cases.trusted_dids(BASE) for a in ("--trust", did)]
    code, out, err = run_cli(capsys, *case_files(case, tmp_path), "--offline", "--json", *trusted)
    result = json.loads(out)
    assert (result["verdict"], code) == (case["verdict"], EXIT[case["verdict"]]), (case["name"], result["errors"])
    assert_truthful(result["checks"], case)


def test_genuine_lines_in_words(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))
    genuine = CASES[0]
    code, out, _ = run_cli(capsys, *case_files(genuine, tmp_path), "--offline", "--trust", verify_cases.genuine_did)
    assert code == 0 and out.startswith("VALID")
    cred = genuine["credential"]
    key = verify_cases.genuine_did.removeprefix("did:key:")[:16]
    expected = [
        "pass JSON: a JSON object", "pass @context: VC 2.0 and Open Badges 3.0.3",
        "pass type: VerifiableCredential, OpenBadgeCredential", "pass credentialSubject: an achievement subject",
        f"pass issuer: {verify_cases.genuine_did}",
        "pass proof set: one eddsa-rdfc-2022 proof and one eddsa-jcs-2022 proof",
        f"pass eddsa-rdfc-2022 proof: signature valid, by the issuer's key {key}…",
        f"pass eddsa-jcs-2022 proof: signature valid, by the issuer's key {key}…",
        "pass issuer trusted: a trusted issuer", f"pass validFrom: valid since {cred['validFrom']}",
        "n/a  validUntil: no expiry date",
        "pass credentialStatus: revocation entry 4242 of https://course.example/status/main",
        "pass status list validUntil: fresh until ", "pass revocation: not revoked as of "]
    lines = [line.strip() for line in out.splitlines()]
    for want in expected:
        assert any(line.startswith(want) for line in lines), (want, out)


def test_trust_sources_and_bad_trust_input(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.delenv(trust.ENV, raising=False)
    attacker = next(c for c in CASES if c["name"] == "attacker-resigned")
    args = case_files(attacker, tmp_path) + ["--offline"]
    code, out, err = run_cli(capsys, *args)
    assert code == 3 and out.startswith("NOT TRUSTED (signature valid, issuer not trusted)")
    assert "no trusted issuer is configured" in out
    # each source of trust, alone, makes the attacker's credential valid
    assert run_cli(capsys, *args, "--trust", verify_cases.ATTACKER.did)[0] == 0
    monkeypatch.setenv(trust.ENV, f"{verify_cases.genuine_did}, {verify_cases.ATTACKER.did}")
    assert run_cli(capsys, *args)[0] == 0
    monkeypatch.delenv(trust.ENV)
    pin = tmp_path / "pin.json"
    pin.write_text(trust.to_json({verify_cases.ATTACKER.did: "a test issuer"}))
    assert run_cli(capsys, *args, "--trust-file", pin)[0] == 0
    default = tmp_path / ".config" / "minimega" / "trusted-issuers.json"
    default.parent.mkdir(parents=True)
    default.write_text(pin.read_text())
    assert run_cli(capsys, *args)[0] == 0
    default.unlink()
    # refused, by name, before anything is verified
    for bad in ("did:key:z6MkNOTAKEY", "https://course.example", "did:web:evil.example/path"):
        code, _, err = run_cli(capsys, *args, "--trust", bad)
        assert code == 2 and "is not an issuer DID; use did:key:z6Mk… or did:web:<host>" in err, err
    pin.write_text('{"issuers": "did:web:course.example"}')
    code, _, err = run_cli(capsys, *args, "--trust-file", pin)
    assert code == 2 and "expected {\"issuers\"" in err
    pin.write_text("x" * (trust.MAX_FILE_BYTES + 1))
    assert "larger than" in run_cli(capsys, *args, "--trust-file", pin)[2]


def test_site_pin_and_serve_rebuilds_when_its_keys_change(tmp_path, monkeypatch):
    from minimega.classroom import canonical, cli

    web, key = "did:web:course.example", verify_cases.genuine_did
    pinned = trust.write_site_files(tmp_path / "site", env={trust.ENV: f"{web} {key}"})
    assert list(pinned) == [web, key] == list(trust.load_file(tmp_path / "site" / trust.SITE_FILE))
    contexts = json.loads((tmp_path / "site" / "verify" / "contexts.json").read_text())
    assert contexts == {url: canonical.bundled_context(url) for url in canonical.CONTEXT_FILES}
    with pytest.raises(trust.TrustError, match="is not an issuer DID"):
        trust.write_site_files(tmp_path / "bad", env={trust.ENV: "did:key:z6MkTypo"})

    # `minimega serve` pins its own DIDs: a site pinned for other keys is stale, and the build gets the pin
    (tmp_path / "site" / "index.html").write_text("<html>")
    monkeypatch.chdir(tmp_path)
    assert not cli.site_is_stale(tmp_path / "site", tmp_path, pin=f"{key} {web}")
    assert cli.site_is_stale(tmp_path / "site", tmp_path, pin=verify_cases.ATTACKER.did)
    (tmp_path / "mkdocs.yml").write_text("site_name: x\n")
    os.utime(tmp_path / "site" / "index.html", (time.time() + 60, time.time() + 60))     # built after it
    seen = {}
    monkeypatch.setattr(cli.subprocess, "run", lambda argv, env: seen.update(env=env) or
                        subprocess.CompletedProcess(argv, 0))
    monkeypatch.setattr(cli.shutil, "which", lambda name: sys.executable)
    cli.build_site(tmp_path / "site", [key, web])
    assert seen == {}                                    # same pin, fresh site: no rebuild
    cli.build_site(tmp_path / "site", [verify_cases.ATTACKER.did])
    assert seen["env"][trust.ENV] == verify_cases.ATTACKER.did
    assert trust.service_issuers(None, [verify_cases.GENUINE.private.public_key()]) == [key]
    assert trust.service_issuers(web, [verify_cases.GENUINE.private.public_key()]) == [web]


def test_issuer_url_speaks_only_for_its_own_host(tmp_path, capsys, monkeypatch):
    from minimega.classroom import cli_cert as cli, keys

    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.delenv(trust.ENV, raising=False)
    attacker = next(c for c in CASES if c["name"] == "attacker-resigned")
    pub = verify_cases.ATTACKER.private.public_key()
    evil = keys.did_document("did:web:evil.example", [pub], [verify_cases.ATTACKER.did])
    served = {"https://evil.example/.well-known/did.json": evil,              # honest about itself
              "https://course.example/.well-known/did.json": evil}           # a course URL serving evil's document
    monkeypatch.setattr(cli, "_fetch_json", lambda url, timeout=5.0: served[url])
    args = case_files(attacker, tmp_path)
    code, out, _ = run_cli(capsys, *args, "--issuer-url", "https://evil.example", "--json")
    assert code == 0 and json.loads(out)["trusted_issuers"] == {
        "did:web:evil.example": "published by https://evil.example",
        verify_cases.ATTACKER.did: "published by https://evil.example"}
    code, out, _ = run_cli(capsys, *args, "--issuer-url", "https://course.example", "--json")
    result = json.loads(out)
    assert code == 3 and result["trusted_issuers"] == {}
    assert any("describes 'did:web:evil.example', not did:web:course.example" in n for n in result["notes"])


# --- trust before any fetch; did:web hosts; the INVALID layout; a closed pipe ---------------------------------

def test_nothing_an_untrusted_credential_names_is_fetched(tmp_path, capsys, monkeypatch):
    from minimega.classroom import cli_cert

    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.delenv(trust.ENV, raising=False)
    fetched = []
    monkeypatch.setattr(cli_cert, "_fetch_json", lambda url, timeout=5.0: fetched.append(url) or {})
    case = next(c for c in CASES if c["name"] == "attacker-resigned")
    cred_path = tmp_path / "credential.json"
    cred_path.write_text(json.dumps(case["credential"]))
    code, out, _ = run_cli(capsys, cred_path)                          # online, nobody trusted
    assert code != 0 and fetched == [], fetched
    assert "not trusted: nothing the credential names was fetched" in out
    trusted = [a for did in verify_cases.trusted_dids(BASE) for a in ("--trust", did)]
    run_cli(capsys, cred_path, *trusted)                               # the attacker is still not among them
    assert fetched == []


@pytest.mark.parametrize("did", ["did:web:evil.example%40course.example", "did:web:course.example%2Fevil",
                                 "did:web:course.example%3Fx%3D1", "did:web:course.example%3A8443",
                                 "did:web:course.example%23frag", "did:web:10.0.0.1%3A6379", "did:web:a:b%2F..",
                                 "did:web:", "did:web:-bad-.example"])
def test_did_web_hosts_that_decode_elsewhere_are_refused(did):
    from minimega.classroom import keys

    with pytest.raises(keys.KeyringError):
        keys.did_web_url(did)


def test_plain_did_web_hosts_resolve():
    from minimega.classroom import keys

    assert keys.did_web_url("did:web:course.example") == "https://course.example/.well-known/did.json"
    assert keys.did_web_url("did:web:course.example:users:ada") == "https://course.example/users/ada/did.json"
    assert keys.did_web_url("did:web:localhost%3A8000") == "http://localhost:8000/.well-known/did.json"


def test_invalid_output_leads_with_the_verdict_and_marks_every_claim(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.delenv(trust.ENV, raising=False)
    case = next(c for c in CASES if c["verdict"] == "invalid" and isinstance(c["credential"], dict)
                and c["name"] != "attacker-resigned")
    trusted = [a for did in verify_cases.trusted_dids(BASE) for a in ("--trust", did)]
    code, out, _ = run_cli(capsys, *case_files(case, tmp_path), "--offline", *trusted)
    lines = out.splitlines()
    assert code == 1 and lines[0].startswith("INVALID") and lines[1].startswith("  because: "), out
    claims = [ln for ln in lines if ln.startswith("  ") and not ln.startswith(("  because", "  pass", "  FAIL",
                                                                                 "  n/a", "  note", "  Revocation"))]
    assert claims and all(ln.endswith("(not verified)") for ln in claims), claims


def test_a_closed_pipe_ends_the_output_quietly(tmp_path):
    case = next(c for c in CASES if c["verdict"] == "valid")
    args = case_files(case, tmp_path)
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = {**os.environ, "HOME": str(tmp_path),
           "PYTHONPATH": os.pathsep.join(filter(None, [os.path.join(root, "src"), os.environ.get("PYTHONPATH")]))}
    trusted = [a for did in verify_cases.trusted_dids(BASE) for a in ("--trust", did)]
    cmd = [sys.executable, "-m", "minimega.classroom.cli", "cert", "verify", *map(str, args), "--offline", *trusted]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
    proc.stdout.close()                                   # the reader is gone before a line is written (`| head -0`)
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=60) == 0 and "BrokenPipe" not in err and "Traceback" not in err, err
