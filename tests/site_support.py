"""One strict build of the course site for the whole test session, served on 127.0.0.1.

The build holds both editions (English at /, Dutch at /nl/, mkdocs-static-i18n). It is built for
the port it will be served on (``site_url``: the sitemap and canonical links name it), so
the file checks (test_site.py, test_site_dutch.py) and the browser checks (test_site_browser.py)
read the same output. It is built with ``$MINIMEGA_TRUSTED_ISSUERS`` set to `PINNED` (the build pins the verify
page's issuers); tests that pin their own service's issuer (the exam, a11y and verify browser tests) copy it and
pin again with `trust.write_site_files`, the build hook's own call.
"""
from __future__ import annotations

import functools
import http.server
import os
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PINNED = "did:web:courses.example.org"
"""The issuer the session's build pins in ``verify/trusted-issuers.json``."""


class _Quiet(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args):
        pass


@dataclass(frozen=True)
class BuiltSite:
    out: Path          # the site folder
    took: float        # seconds the build took
    log: str           # mkdocs' stderr
    base: str          # where it is served, without a trailing slash


@pytest.fixture(scope="session")
def site_build(tmp_path_factory):
    out = tmp_path_factory.mktemp("site")
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(_Quiet, directory=str(out)))
    base = f"http://127.0.0.1:{httpd.server_address[1]}"
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1", "MINIMEGA_SITE_URL": base + "/", "MINIMEGA_TRUSTED_ISSUERS": PINNED}
    t0 = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-d", str(out)], cwd=ROOT,
                          env=env, capture_output=True, text=True, timeout=180)
    took = time.monotonic() - t0
    assert proc.returncode == 0, proc.stderr[-3000:]
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    yield BuiltSite(out, took, proc.stderr, base)
    httpd.shutdown()
