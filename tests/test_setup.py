"""The set-up a newcomer runs: what `make serve` and `make test` install, and how pip's settings reach uv."""
import importlib.util
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def load_setup_venv():
    spec = importlib.util.spec_from_file_location("setup_venv", ROOT / "tools" / "setup_venv.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


sv = load_setup_venv()

LISTING = """\
global.cert='/etc/ssl/certs/ca.crt'
global.constraint='/etc/pip/constraints.txt'
global.extra-index-url='file:///mirror/a/simple file:///mirror/b/simple'
global.find-links='/srv/wheels'
global.index-url='https://files.example/simple'
install.index-url='https://install.example/simple'
:env:.find-links='/env/wheels /more/wheels'
:env:.default-timeout='180'
:env:.no-index='false'
"""


def test_pip_settings_follow_pips_precedence():
    settings = sv.pip_settings(LISTING)
    assert settings["find-links"] == "/env/wheels /more/wheels"        # a PIP_* variable beats the files
    assert settings["index-url"] == "https://install.example/simple"   # [install] beats [global]
    assert settings["extra-index-url"] == "file:///mirror/a/simple file:///mirror/b/simple"
    assert settings["default-timeout"] == "180"


def test_uv_gets_pips_indexes_in_its_own_syntax():
    env = sv.uv_environment(sv.pip_settings(LISTING), environ={})
    assert env == {
        "UV_DEFAULT_INDEX": "https://install.example/simple",
        "UV_INDEX": "file:///mirror/a/simple file:///mirror/b/simple",
        "UV_FIND_LINKS": "/env/wheels,/more/wheels",                    # uv separates find-links with commas
        "UV_CONSTRAINT": "/etc/pip/constraints.txt",
        "SSL_CERT_FILE": "/etc/ssl/certs/ca.crt",
        "UV_HTTP_TIMEOUT": "180",
        "UV_INDEX_STRATEGY": "unsafe-best-match",   # pip's choice among several indexes: the best version on any
    }                                                                     # no-index=false sets nothing
    one_index = sv.uv_environment({"index-url": "https://files.example/simple"}, environ={})
    assert one_index == {"UV_DEFAULT_INDEX": "https://files.example/simple"}


def test_a_uv_variable_already_set_wins():
    env = sv.uv_environment(sv.pip_settings(LISTING), environ={"UV_INDEX": "https://mine.example/simple"})
    assert "UV_INDEX" not in env and env["UV_FIND_LINKS"] == "/env/wheels,/more/wheels"


def test_setup_refuses_a_free_torch(capsys):
    with pytest.raises(SystemExit):
        sv.main(["--torch", "torch", "--extras", "site,serve"])
    assert "--torch must pin one version" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        sv.main(["--torch", "torch==2.13.0", "--extras", "site;rm -rf /"])


def make_dry_run(target: str) -> str:
    if shutil.which("make") is None:
        pytest.skip("make is not installed")
    done = subprocess.run(["make", "-n", "-B", target, f"PY={sys.executable}"], cwd=ROOT, capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return done.stdout


def installs(plan: str) -> list[tuple[str, str]]:
    """(extras, torch pin) of every setup_venv call in a `make -n` plan."""
    calls = [line for line in plan.splitlines() if "setup_venv.py" in line]
    return [(re.search(r"--extras (\S+)", c).group(1), re.search(r'--torch "?([^"\s]+)', c).group(1)) for c in calls]


def test_make_serve_installs_only_what_serving_needs():
    plan = make_dry_run("serve")
    assert installs(plan) == [("site,serve", "torch==2.13.0")]
    assert "minimega serve" in plan


def test_make_test_adds_the_test_extras_with_its_own_stamp():
    plan = make_dry_run("test")
    assert installs(plan) == [("site,serve", "torch==2.13.0"), ("test,site,serve,deepspeed", "torch==2.13.0")]
    stamps = re.findall(r"--stamp (\S+)", plan)
    assert [Path(s).name.split("-")[0] for s in stamps] == [".serve", ".test"]
    assert "pytest" in plan


def test_test_tools_stay_out_of_the_serving_extras():
    text = (ROOT / "pyproject.toml").read_text()
    serving = text[text.index("site = ["):text.index("lab = [")]
    for tool in ("playwright", "schemathesis", "hadolint", "deepspeed", "pytest"):
        assert tool not in serving


def test_ci_runs_make_test():
    lines = [ln.strip() for ln in (ROOT / ".ci" / "run").read_text().splitlines()]
    assert "make test" in lines


def test_torch_index_installs_torch_alone_first_then_the_package(monkeypatch, tmp_path):
    """--torch-index: torch from that index alone, then the package with the same pin from the usual indexes
    (the torch installed satisfies it); each step falls back from uv to pip on its own."""
    calls, codes = [], iter([0, 3, 0])                     # uv installs torch; uv fails on the package; pip does it
    monkeypatch.setattr(sv, "run", lambda cmd, env=None, hide_package_lines=False: calls.append(cmd) or next(codes))
    monkeypatch.setattr(sv.subprocess, "run", lambda *a, **k: subprocess.CompletedProcess(a, 0))   # pip is there
    cpu = "https://download.pytorch.org/whl/cpu"
    assert sv.install(tmp_path, "lab,site,serve", "torch==2.13.0", "/bin/uv", {}, torch_index=cpu) == 0
    py = str(tmp_path / "bin" / "python")
    uv = ["/bin/uv", "pip", "install", "--compile-bytecode", "--python", py]     # the .pyc written at install, as pip
    assert calls == [[*uv, "torch==2.13.0", "--index-url", cpu],
                     [*uv, "-e", ".[lab,site,serve]", "torch==2.13.0"],
                     [py, "-m", "pip", "install", "--disable-pip-version-check", "-e", ".[lab,site,serve]",
                      "torch==2.13.0"]]
    calls.clear()
    codes = iter([0])
    assert sv.install(tmp_path, "site,serve", "torch==2.13.0", "/bin/uv", {}) == 0      # no index: one step, as make
    assert calls == [[*uv, "-e", ".[site,serve]", "torch==2.13.0"]]
    calls.clear()
    codes = iter([5])
    assert sv.install(tmp_path, "x", "torch==2.13.0", None, {}, torch_index=cpu) == 5   # torch failed: stop there
    assert calls == [[py, "-m", "pip", "install", "--disable-pip-version-check", "torch==2.13.0", "--index-url", cpu]]


def test_setup_refuses_a_torch_index_that_is_no_url(capsys):
    with pytest.raises(SystemExit):
        sv.main(["--torch", "torch==2.13.0", "--torch-index", "cpu"])
    assert "--torch-index must be an index URL" in capsys.readouterr().err
