"""Markers: `gpu` tests skip without CUDA; `browser` tests skip without Debian's chromium."""
import os

import pytest
import torch


def pytest_collection_modifyitems(config, items):
    no_gpu = pytest.mark.skip(reason="needs CUDA")
    no_browser = pytest.mark.skip(reason="needs /usr/bin/chromium (apt-get install -y chromium)")
    for item in items:
        if "gpu" in item.keywords and not torch.cuda.is_available():
            item.add_marker(no_gpu)
        if "browser" in item.keywords and not os.path.exists("/usr/bin/chromium"):
            item.add_marker(no_browser)


from postgres_support import postgres_server  # noqa: E402,F401  (one PostgreSQL server for the whole session)
from site_support import site_build  # noqa: E402,F401  (one build of the course site for the whole session)
