"""Create or refresh .venv for one purpose (serving, testing, the labs), saying what it does at each step.

    python3 tools/setup_venv.py --extras site,serve --torch torch==2.13.0 --stamp .venv/.serve-<hash>

The Makefile calls this, and so does the Dockerfile (into /opt/venv), so `make` and the image install the
same way; ``make -n serve`` shows the call without running it. Installs go through
uv (github.com/astral-sh/uv: parallel downloads, a shared cache) when it can be had: a ``uv`` on the PATH,
or one bootstrapped into the venv from the package index with pip. pip is the fallback.

uv does not read pip's configuration, so the index settings pip would use here (its config files and
``PIP_*`` variables, as ``pip config list`` reports them) are handed to uv as the matching ``UV_*``
variables; a ``UV_*`` variable already set wins. Nothing machine-specific lives in the repository.

torch is pinned in every install command (``--torch``): left free, the resolver takes the newest torch,
which on Linux is a multi-GB CUDA build. ``--torch-index`` picks the build: torch is installed first from
that index alone (https://download.pytorch.org/whl/cpu: the CPU wheel, as the Dockerfile does), then the
package and its extras from the usual indexes, where the torch already installed satisfies the pin.

uv installs with ``--compile-bytecode``: the ``.pyc`` files are written at install, as pip writes them by
default. Without them, where the environment sets ``PYTHONDONTWRITEBYTECODE`` (the Dockerfile does, and so do
many machines' images), every process compiles everything it imports, every time it starts.
"""
from __future__ import annotations

import argparse
import os
import re
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path

UV = "uv==0.13.9"
"""The uv release bootstrapped into the venv when none is on the PATH."""

# pip setting -> (uv variable, separator uv expects between several values)
PIP_TO_UV = {
    "index-url": ("UV_DEFAULT_INDEX", None),
    "extra-index-url": ("UV_INDEX", " "),
    "find-links": ("UV_FIND_LINKS", ","),
    "constraint": ("UV_CONSTRAINT", " "),
    "no-index": ("UV_NO_INDEX", None),
    "trusted-host": ("UV_INSECURE_HOST", " "),
    "cert": ("SSL_CERT_FILE", None),
    "timeout": ("UV_HTTP_TIMEOUT", None),
    "default-timeout": ("UV_HTTP_TIMEOUT", None),
    "proxy": ("HTTPS_PROXY", None),
}


def say(text: str) -> None:
    print(f"==> {text}", file=sys.stderr, flush=True)


def pip_settings(listing: str) -> dict[str, str]:
    """pip's effective install settings from ``pip config list`` output.

    Each line is ``<section>.<key>='<value>'`` with section ``global``, ``install`` or ``:env:`` (a ``PIP_*``
    variable). pip lets a variable beat a file and the ``install`` section beat ``global``; so does this.
    """
    rank = {"global": 0, "install": 1, ":env:": 2}
    found: dict[str, tuple[int, str]] = {}
    for line in listing.splitlines():
        m = re.fullmatch(r"(global|install|:env:)\.([a-z0-9-]+)=(.*)", line.strip())
        if not m:
            continue
        section, key, raw = m.groups()
        try:
            value = " ".join(shlex.split(raw))        # pip quotes values as Python reprs: '...'
        except ValueError:
            continue
        if key not in found or rank[section] >= found[key][0]:
            found[key] = (rank[section], value)
    return {key: value for key, (_, value) in found.items()}


def uv_environment(settings: dict[str, str], environ: dict[str, str]) -> dict[str, str]:
    """The ``UV_*`` variables that make uv use the indexes, links and constraints pip would use.

    A variable the caller already set is kept as it is.
    """
    out: dict[str, str] = {}
    for key, value in settings.items():
        if key not in PIP_TO_UV or not value:
            continue
        name, sep = PIP_TO_UV[key]
        if name in environ or name in out:
            continue
        if key == "no-index":
            if value.lower() in ("1", "true", "yes", "on"):
                out[name] = "1"
            continue
        out[name] = sep.join(value.split()) if sep else value
    # pip takes the best version found on any of its indexes; uv by default only looks at the first index
    # that has the package at all. With several indexes, ask uv for pip's behaviour (uv calls it "unsafe":
    # it is as open to a look-alike package on another index as pip is with the same settings).
    if settings.get("extra-index-url") and "UV_INDEX_STRATEGY" not in environ:
        out["UV_INDEX_STRATEGY"] = "unsafe-best-match"
    return out


def pip_config_listing(python: str) -> str:
    """``pip config list`` as the given interpreter's pip sees it ('' if it has no pip)."""
    try:
        done = subprocess.run([python, "-m", "pip", "config", "list"], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return ""
    return done.stdout if done.returncode == 0 else ""


def run(cmd: list[str], env: dict[str, str] | None = None, hide_package_lines: bool = False) -> int:
    """Run `cmd`, streaming its output; uv's one line per installed package is counted, not shown."""
    if not hide_package_lines or sys.stderr.isatty():
        return subprocess.run(cmd, env=env).returncode
    listed = 0
    with subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) as proc:
        for line in proc.stdout:
            if re.match(r"\s[+\-~] \S", line):
                listed += 1
            else:
                print(f"    {line.rstrip()}", file=sys.stderr, flush=True)
    if listed:
        print(f"    ({listed} package lines not shown; `uv pip list --python .venv` lists them)", file=sys.stderr)
    return proc.returncode


def find_uv(venv: Path) -> str | None:
    for candidate in (shutil.which("uv"), venv / "bin" / "uv"):
        if candidate and Path(candidate).is_file() and os.access(candidate, os.X_OK):
            return str(candidate)
    return None


def uv_env(python: str) -> dict[str, str]:
    """This process's environment plus pip's index settings as ``UV_*`` variables (said aloud)."""
    mapped = uv_environment(pip_settings(pip_config_listing(python)), os.environ)
    if mapped:
        say("uv takes pip's index settings: " + ", ".join(sorted(mapped)))
    return {**os.environ, **mapped}


def create_venv(venv: Path, python: str, uv: str | None, env: dict[str, str]) -> None:
    if uv:
        say(f"creating {venv} with {uv} (Python from {python})")
        if run([uv, "venv", "--quiet", "--seed", "--python", python, str(venv)], env=env) == 0:
            return
        say("uv could not create it; falling back to python -m venv")
    say(f"creating {venv} with {python} -m venv (about 5 s)")
    if run([python, "-m", "venv", str(venv)]) != 0:
        raise SystemExit(f"setup_venv: {python} -m venv {venv} failed; install python3-venv, or set PY=<a python>")


def bootstrap_uv(venv: Path) -> str | None:
    """uv into the venv with its own pip (a single wheel, about 20 MB), or None if the index has none."""
    say(f"installing {UV} into {venv} (a fast installer; pip is the fallback)")
    done = subprocess.run([str(venv / "bin" / "python"), "-m", "pip", "install", "--quiet",
                           "--disable-pip-version-check", UV], capture_output=True, text=True)
    if done.returncode != 0:                     # pip's warnings are shown only when it fails
        print(done.stdout + done.stderr, file=sys.stderr)
        say("could not install uv; installing with pip instead (slower, the same result)")
        return None
    return str(venv / "bin" / "uv")


def pip_install(target: str, args: list[str], what: str, uv: str | None, env: dict[str, str]) -> int:
    """``pip install <args>`` into the venv of `target`: with uv when there is one, else (or when it fails) pip."""
    if uv:
        say(f"installing {what} with uv (torch is about 200 MB the first time; then cached)")
        code = run([uv, "pip", "install", "--compile-bytecode", "--python", target, *args], env=env,
                   hide_package_lines=True)
        if code == 0:
            return 0
        say(f"uv failed (exit {code}); trying pip")
    if subprocess.run([target, "-m", "pip", "--version"], capture_output=True).returncode != 0:
        run([target, "-m", "ensurepip", "--upgrade"])
    say(f"installing {what} with pip (a few minutes the first time)")
    return run([target, "-m", "pip", "install", "--disable-pip-version-check", *args])


def install(venv: Path, extras: str, torch: str, uv: str | None, env: dict[str, str],
            torch_index: str | None = None) -> int:
    spec = f".[{extras}]" if extras else "."
    target = str(venv / "bin" / "python")
    if torch_index:
        code = pip_install(target, [torch, "--index-url", torch_index], f"{torch} from {torch_index} alone", uv, env)
        if code != 0:
            return code
    return pip_install(target, ["-e", spec, torch], f"{spec} and {torch}", uv, env)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--venv", type=Path, default=Path(".venv"))
    p.add_argument("--python", default=sys.executable, help="interpreter for a new venv (default: this one)")
    p.add_argument("--extras", default="", help="comma-separated extras of pyproject.toml, e.g. site,serve")
    p.add_argument("--torch", required=True, help="the pinned torch requirement, e.g. torch==2.13.0")
    p.add_argument("--torch-index", help="the index torch alone comes from, installed first "
                   "(https://download.pytorch.org/whl/cpu: the CPU build)")
    p.add_argument("--stamp", type=Path, help="file to create on success; older files with its prefix are removed")
    p.add_argument("--no-uv", action="store_true", help="install with pip only")
    args = p.parse_args(argv)
    if not re.fullmatch(r"torch==\d+(\.\d+)+(\+\w+)?", args.torch):
        p.error(f"--torch must pin one version (torch==X.Y.Z), got {args.torch!r}: a free torch is a CUDA build")
    if not re.fullmatch(r"([a-z0-9-]+(,[a-z0-9-]+)*)?", args.extras):
        p.error(f"--extras must be comma-separated extra names, got {args.extras!r}")
    if args.torch_index is not None and not re.fullmatch(r"(https?|file)://\S+", args.torch_index):
        p.error(f"--torch-index must be an index URL (https://…, file://…), got {args.torch_index!r}")

    start = time.monotonic()
    venv = args.venv
    uv = None if args.no_uv else find_uv(venv)
    env = uv_env(args.python) if not args.no_uv else dict(os.environ)
    if not (venv / "bin" / "python").exists():
        create_venv(venv, args.python, uv, env)
    if uv is None and not args.no_uv:
        uv = bootstrap_uv(venv)
    code = install(venv, args.extras, args.torch, uv, env, args.torch_index)
    if code != 0:
        raise SystemExit(f"setup_venv: installing .[{args.extras}] failed (exit {code}); the messages above say why")
    if args.stamp:
        prefix = args.stamp.name.rsplit("-", 1)[0] + "-"
        for old in args.stamp.parent.glob(prefix + "*"):
            old.unlink()
        args.stamp.touch()
    say(f"{venv} ready for [{args.extras}] in {time.monotonic() - start:.0f} s. The `minimega` command is "
        f"{venv}/bin/minimega: `. {venv}/bin/activate` puts it on your PATH")
    return 0


if __name__ == "__main__":
    sys.exit(main())
