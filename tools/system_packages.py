"""The Debian packages the test suite drives, checked before `make test` starts (and by `.ci/run`).

    python3 tools/system_packages.py            # as root: install what is missing; else name the command and stop

    chromium       the browser tests (Playwright drives /usr/bin/chromium)
    postgresql     the exam store's PostgreSQL tests (each session starts a throwaway cluster with initdb)
    caddy          the reverse proxy of compose.yaml, run in front of `minimega serve` by the flood tests
    slurm-wlm      a one-host Slurm cluster for the srun, preemption and requeue tests
    munge          Slurm's authentication daemon
    libaio-dev     DeepSpeed's async I/O op, built by the NVMe side-by-side bench
    nodejs         the site's build (KaTeX typesets the formulas) and the calculators' JavaScript checked under Node
                   (any `node` on PATH will do)

Without them those tests would be skipped, and a run that ends "1894 passed, 77 skipped" reads as done. So as root
this installs them (apt-get), as `.ci/run` always did; as another user it stops at once with the one command to run.
``MINIMEGA_SKIP_SYSTEM_CHECK=1`` skips the check (the suite then names every skipped test and why at its end).
"""
from __future__ import annotations

import glob
import os
import shutil
import subprocess
import sys

PACKAGES = {                       # package -> a path that exists once it is installed
    "chromium": "/usr/bin/chromium",
    "postgresql": "/usr/lib/postgresql/*/bin/initdb",
    "caddy": "/usr/bin/caddy",
    "slurm-wlm": "/usr/sbin/slurmctld",
    "munge": "/usr/sbin/munged",
    "libaio-dev": "/usr/include/libaio.h",
    "nodejs": "node",                  # a command on PATH
}


def missing() -> list[str]:
    return [name for name, path in PACKAGES.items()
            if not (glob.glob(path) if path.startswith("/") else shutil.which(path))]


def main() -> int:
    if os.environ.get("MINIMEGA_SKIP_SYSTEM_CHECK") == "1":
        return 0
    need = missing()
    if not need:
        return 0
    command = ["apt-get", "install", "-y", "-q", *need]
    if os.geteuid() != 0 or not shutil.which("apt-get"):
        print(f"make test needs the Debian packages {' '.join(need)}: run `sudo apt-get update && sudo "
              f"{' '.join(command)}` (or `sudo make test`), or set MINIMEGA_SKIP_SYSTEM_CHECK=1 to run without them",
              file=sys.stderr)
        return 2
    print(f"==> installing the Debian packages the tests drive: {' '.join(need)}", flush=True)
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    subprocess.run(["apt-get", "update", "-q"], check=True, env=env, stdout=subprocess.DEVNULL)
    subprocess.run(command, check=True, env=env, stdout=subprocess.DEVNULL)
    still = missing()
    if still:
        print(f"apt-get installed, but {' '.join(still)} still missing: check the package sources", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
