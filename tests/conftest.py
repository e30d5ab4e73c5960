"""Markers: `gpu` tests skip without CUDA; `browser` tests skip without Debian's chromium.

Browser tests share one built site (`site_server`, built once per session) and one chromium (`chromium`).
"""
import http.server
import os
from pathlib import Path

import pytest
import torch

from minimega.launch import CPUS_ENV

ROOT = Path(__file__).resolve().parents[1]
CHROMIUM = "/usr/bin/chromium"
CHROMIUM_FLAGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update", "--disable-sync"]


def pytest_configure(config):
    """Under `make test`'s workers each gets its share of the cores, for its own torch ops and the jobs it launches
    (`launch.cpu_share`): two workers with every core each would spin four threads on two cores."""
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    if workers > 1:
        share = max(1, (os.cpu_count() or 1) // workers)
        os.environ.setdefault(CPUS_ENV, str(share))
        torch.set_num_threads(int(os.environ[CPUS_ENV]))


@pytest.hookimpl(tryfirst=True)               # before pytest-xdist reads the groups
def pytest_collection_modifyitems(config, items):
    """Skips what this machine cannot run, and groups the tests for `make test`'s two workers (pytest-xdist,
    ``--dist loadgroup``): a file's tests share its module fixtures, so a file runs on one worker; the labs
    (each notebook its own process tree) spread over both."""
    for item in items:
        path = item.nodeid.split("::")[0]
        group = item.nodeid if path.endswith("test_labs.py") else path
        item.add_marker(pytest.mark.xdist_group(group))
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
def site_server(site_build):
    """The session's one build of the course site (`site_support.site_build`), served; its base URL."""
    return site_build.base


@pytest.fixture(scope="session")
def playwright():
    """Playwright's sync API, started once: a thread may hold only one at a time, so every browser test uses this."""
    sync_api = pytest.importorskip("playwright.sync_api")
    with sync_api.sync_playwright() as p:
        yield p


@pytest.fixture(scope="session")
def chromium(playwright):
    """One Debian chromium for the session, driven by Playwright."""
    b = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_FLAGS)
    yield b
    b.close()


from postgres_support import postgres_server  # noqa: E402,F401  (one PostgreSQL server for the whole session)
from site_support import site_build  # noqa: E402,F401  (one build of the course site for the whole session)
