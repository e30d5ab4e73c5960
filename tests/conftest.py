"""Markers: `gpu` tests skip without CUDA; `browser` tests skip without Debian's chromium.

Browser tests share one built site (`site_server`, built once per session) and one chromium (`chromium`).
"""
import functools
import http.server
import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
CHROMIUM = "/usr/bin/chromium"
CHROMIUM_FLAGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update", "--disable-sync"]


def pytest_collection_modifyitems(config, items):
    no_gpu = pytest.mark.skip(reason="needs CUDA")
    no_browser = pytest.mark.skip(reason="needs /usr/bin/chromium (apt-get install -y chromium)")
    for item in items:
        if "gpu" in item.keywords and not torch.cuda.is_available():
            item.add_marker(no_gpu)
        if "browser" in item.keywords and not os.path.exists(CHROMIUM):
            item.add_marker(no_browser)


class _Quiet(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args):
        pass


@pytest.fixture(scope="session")
def site_server(tmp_path_factory):
    """The course site, built with --strict once for the session and served on 127.0.0.1; yields its base URL."""
    out = tmp_path_factory.mktemp("browser-site")
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(_Quiet, directory=str(out)))
    base = f"http://127.0.0.1:{httpd.server_address[1]}"
    # instant navigation only intercepts links under site_url, so build for the port just bound
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1", "MINIMEGA_SITE_URL": base + "/"}
    proc = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-d", str(out)], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    yield base
    httpd.shutdown()


@pytest.fixture(scope="session")
def chromium():
    """One Debian chromium for the session, driven by Playwright."""
    sync_api = pytest.importorskip("playwright.sync_api")
    with sync_api.sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_FLAGS)
        yield b
        b.close()


from postgres_support import postgres_server  # noqa: E402,F401  (one PostgreSQL server for the whole session)
