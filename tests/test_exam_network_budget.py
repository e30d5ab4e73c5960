"""One /24 cannot take the exam offline: 2,500 slow connections (headers never finished, plus a fifth as many
with slow bodies) against --limit-concurrency 2000 (here scaled down
1:10 with the same ratios, 250 against 200, to keep the test cheap) from 60 addresses of one /24 leave a learner on
another network served at least 27 times in 30, directly and through the Caddy of compose.yaml (Debian's `caddy`,
started from that Caddyfile with the upstream, the listening port and the admin endpoint rewritten)."""
import re
import shutil
import socket
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
import yaml

from classroom_support import free_port, make_config, served
from minimega.classroom.httpguard import server_options
from minimega.classroom.service import create_app

ROOT = Path(__file__).resolve().parents[1]
FLOOD, LIMIT = 250, 200                        # 2,500 against 2,000, scaled 1:10
CADDY = shutil.which("caddy")


def _slow(port: int, source: str, data: bytes):
    s = socket.socket()
    s.bind((source, 0))
    s.settimeout(2)
    try:
        s.connect(("127.0.0.1", port))
        s.sendall(data)
    except OSError:
        pass
    return s


def _served(port: int, n: int = 30) -> int:
    ok = 0
    for _ in range(n):
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/api/v1/health", timeout=3) as r:
                ok += r.status == 200
        except (urllib.error.URLError, OSError):
            pass
    return ok


def _flood(port: int) -> list:
    heads = [_slow(port, f"127.0.20.{i % 60 + 1}", b"GET /api/v1/health HTTP/1.1\r\nHost: x\r\nX-Slow: ")
             for i in range(FLOOD)]
    bodies = [_slow(port, f"127.0.20.{i % 60 + 1}", b"POST /api/v1/signin HTTP/1.1\r\nHost: x\r\nContent-Type: "
                    b"application/json\r\nContent-Length: 1000\r\n\r\n{\"email\": ") for i in range(FLOOD // 5)]
    time.sleep(0.5)
    return heads + bodies


def _config(tmp_path):
    return make_config(tmp_path, header_timeout_s=30, body_timeout_s=30, limit_concurrency=LIMIT)


def test_a_flood_from_one_network_leaves_another_served(tmp_path):
    config = _config(tmp_path)
    port = free_port()
    with served(create_app(config), port, **server_options(config)):
        sockets = _flood(port)
        try:
            ok = _served(port)
        finally:
            for s in sockets:
                s.close()
    print(f"\n[budget] direct: {FLOOD} slow headers + {FLOOD // 5} slow bodies from one /24 (limit {LIMIT}): learner served {ok}/30")
    assert ok >= 27


def caddyfile(upstream: str, listen: int) -> str:
    """The Caddyfile of compose.yaml, with only its upstream, listening port and admin endpoint rewritten."""
    text = yaml.safe_load((ROOT / "compose.yaml").read_text())["configs"]["caddyfile"]["content"]
    assert text.count("web:8000") == 1 and len(re.findall(r"^:8000 \{", text, re.M)) == 1
    text = re.sub(r"^:8000 \{", f":{listen} {{", text.replace("web:8000", upstream), flags=re.M)
    return re.sub(r"^\{\n", "{\n  admin off\n", text, count=1)


@pytest.mark.skipif(CADDY is None, reason="Debian's caddy is not installed (apt-get install caddy)")
def test_the_compose_caddyfile_validates_and_holds_the_flood_in_front_of_serve(tmp_path):
    original = tmp_path / "Caddyfile.compose"
    original.write_text(yaml.safe_load((ROOT / "compose.yaml").read_text())["configs"]["caddyfile"]["content"])
    check = subprocess.run([CADDY, "validate", "--adapter", "caddyfile", "--config", str(original)],
                           capture_output=True, text=True, timeout=60)
    assert check.returncode == 0, check.stderr[-2000:]
    config = _config(tmp_path)
    port, front = free_port(), free_port()
    (tmp_path / "Caddyfile").write_text(caddyfile(f"127.0.0.1:{port}", front))
    with served(create_app(config), port, proxy_headers=True, forwarded_allow_ips="127.0.0.1",
                **server_options(config, "127.0.0.1")):
        proxy = subprocess.Popen([CADDY, "run", "--adapter", "caddyfile", "--config", str(tmp_path / "Caddyfile")],
                                 stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, cwd=tmp_path,
                                 env={"HOME": str(tmp_path), "XDG_DATA_HOME": str(tmp_path), "PATH": "/usr/bin"})
        try:
            for _ in range(100):
                if _served(front, 1):
                    break
                time.sleep(0.1)
            sockets = _flood(front)
            try:
                ok = _served(front)
            finally:
                for s in sockets:
                    s.close()
        finally:
            proxy.terminate()
            proxy.wait(timeout=10)
    print(f"\n[budget] through caddy: {FLOOD} slow headers + {FLOOD // 5} slow bodies from one /24: learner served {ok}/30")
    assert ok >= 27
