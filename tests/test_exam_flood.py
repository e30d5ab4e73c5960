"""A service that stands a flood: 500 connections that send part of their headers and stop, plus one that sends
part of its body, while /api/v1/health keeps answering within 1 s; the slow ones get 408 and are closed at their
deadline; the log gains a few lines, not one per connection. All traffic on loopback, bounded in count and time."""
import logging
import socket
import time
import urllib.request

from classroom_support import free_port, make_config, served
from minimega.classroom.httpguard import RepeatFilter, install_repeat_filter, server_options
from minimega.classroom.service import create_app

FLOOD = 500
DEADLINE_S = 2.0


def _open_from(port: int, source: str, data: bytes) -> socket.socket:
    s = socket.socket()
    s.bind((source, 0))
    s.settimeout(5)
    s.connect(("127.0.0.1", port))
    s.sendall(data)
    return s


def _health_s(port: int) -> float:
    t = time.monotonic()
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/api/v1/health", timeout=5) as r:
        assert r.status == 200
    return time.monotonic() - t


def _read_all(s: socket.socket, limit_s: float) -> tuple[bytes, float]:
    """Everything the server sends until it closes; (data, seconds until the close)."""
    t, data = time.monotonic(), b""
    s.settimeout(limit_s)
    while True:
        chunk = s.recv(4096)
        if not chunk:
            return data, time.monotonic() - t
        data += chunk


class Lines(logging.Handler):
    def __init__(self):
        super().__init__()
        self.records = []

    def emit(self, record):
        self.records.append(self.format(record))


def test_partial_headers_and_a_partial_body_do_not_take_the_service_down(tmp_path):
    config = make_config(tmp_path, header_timeout_s=DEADLINE_S, body_timeout_s=DEADLINE_S,
                         connections_per_address=50, limit_concurrency=2000)
    app = create_app(config)
    port = free_port()
    lines = Lines()
    watched = [logging.getLogger(n) for n in ("uvicorn", "uvicorn.access", "asyncio", "minimega.classroom.guard")]
    for logger in watched:
        logger.addHandler(lines)
    repeat = install_repeat_filter(interval_s=60)
    sockets = []
    try:
        with served(app, port, **server_options(config)):
            assert _health_s(port) < 1
            t0 = time.monotonic()
            for i in range(FLOOD):                       # 500 addresses of 127.0.0.0/8, 10 per address at most
                source = f"127.0.{10 + i // 200}.{i % 200 + 1}"
                sockets.append(_open_from(port, source, b"GET /api/v1/health HTTP/1.1\r\nHost: x\r\nX-Slow: "))
            body = _open_from(port, "127.0.9.9", b"POST /api/v1/signin HTTP/1.1\r\nHost: x\r\n"
                              b"Content-Type: application/json\r\nContent-Length: 1000\r\n\r\n{\"email\": ")
            opened = time.monotonic() - t0
            worst = max(_health_s(port) for _ in range(8))        # throughout: while all 501 are held
            reply, closed_after = _read_all(body, DEADLINE_S + 3)
            first, _ = _read_all(sockets[0], DEADLINE_S + 3)
            worst = max(worst, _health_s(port))
            late = [s for s in sockets[1:] if _read_all(s, 3)[0][:12] != b"HTTP/1.1 408"]
    finally:
        for s in sockets:
            s.close()
        for logger in watched:
            logger.removeHandler(lines)
        for name in ("uvicorn", "uvicorn.error", "uvicorn.access", "asyncio", "minimega.classroom.guard"):
            logging.getLogger(name).removeFilter(repeat)
    print(f"{FLOOD} partial headers + 1 partial body opened in {opened:.2f} s; health worst {worst * 1000:.0f} ms; "
          f"partial body closed {closed_after:.2f} s after the flood was open; log lines {len(lines.records)}")
    assert worst < 1.0
    assert reply.startswith(b"HTTP/1.1 408") and b"body" in reply and closed_after < DEADLINE_S + 1
    assert first.startswith(b"HTTP/1.1 408") and b"header" in first
    assert not late                                   # every one of the 500 got its 408 and a close
    assert len(lines.records) <= 4, lines.records     # one line per kind per interval, not 501


def test_one_address_holds_at_most_its_cap_of_connections(tmp_path):
    config = make_config(tmp_path, connections_per_address=20)
    port = free_port()
    sockets = []
    with served(create_app(config), port, **server_options(config)):
        try:
            for _ in range(30):
                sockets.append(_open_from(port, "127.0.8.1", b"GET / HTTP/1.1\r\n"))
            time.sleep(0.2)
            closed = 0
            for s in sockets:
                s.settimeout(0.05)
                try:
                    closed += s.recv(1) == b""
                except socket.timeout:
                    pass
                except ConnectionResetError:
                    closed += 1
            assert closed == 10, closed                   # the 10 over the cap, at once
            assert _health_s(port) < 1                    # from another address
        finally:
            for s in sockets:
                s.close()


def test_repeated_log_lines_are_held_back_and_counted():
    now = [0.0]
    f = RepeatFilter(10, clock=lambda: now[0])
    rec = lambda: logging.LogRecord("asyncio", logging.ERROR, "x", 1, "accept failed: %s", ("EMFILE",), None)
    assert f.filter(rec()) and not any(f.filter(rec()) for _ in range(999))
    now[0] = 11
    r = rec()
    assert f.filter(r) and "999 more like this" in r.getMessage()


def _hold_app(release):
    """A tiny ASGI app: /hold answers once `release` is set, anything else at once; each says whom it served."""
    import asyncio

    async def app(scope, receive, send):
        if scope["type"] != "http":
            return
        while scope["path"] == "/hold" and not release.is_set():
            await asyncio.sleep(0.01)
        body = scope["client"][0].encode()
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"%d" % len(body))]})
        await send({"type": "http.response.body", "body": body})
    return app


def test_the_cap_counts_the_forwarded_client_only_behind_a_trusted_proxy(tmp_path):
    """Through the trusted proxy (127.0.0.1) the cap counts each X-Forwarded-For client's requests in flight: its
    third gets 429 with a retry time, another client and the proxy itself go on. From any other peer
    (127.0.9.1) X-Forwarded-For is ignored: that peer is whom the app sees and whom the cap counts."""
    import threading
    from types import SimpleNamespace

    config = SimpleNamespace(header_timeout_s=5, body_timeout_s=5, connections_per_address=2, limit_concurrency=100,
                             connections_per_network=50, unfinished_per_network=10)
    release, port, sockets = threading.Event(), free_port(), []

    def request(source, path, forwarded):
        s = _open_from(port, source, f"GET {path} HTTP/1.1\r\nHost: x\r\nX-Forwarded-For: {forwarded}\r\n"
                                     "Connection: close\r\n\r\n".encode())
        sockets.append(s)
        return s

    with served(_hold_app(release), port, proxy_headers=True, forwarded_allow_ips="127.0.0.1",
                **server_options(config, "127.0.0.1")):
        try:
            held = [request("127.0.0.1", "/hold", "203.0.113.7") for _ in range(2)]
            time.sleep(0.2)
            over, _ = _read_all(request("127.0.0.1", "/hold", "198.51.100.1, 203.0.113.7"), 2)
            assert over.startswith(b"HTTP/1.1 429") and b"retry-after: 5" in over and b"203.0.113.7" in over, over
            other, _ = _read_all(request("127.0.0.1", "/", "203.0.113.8"), 2)
            assert other.startswith(b"HTTP/1.1 200") and other.endswith(b"203.0.113.8"), other
            proxy, _ = _read_all(request("127.0.0.1", "/", "127.0.0.1"), 2)          # the proxy's own request
            assert proxy.startswith(b"HTTP/1.1 200"), proxy
            spoofed, _ = _read_all(request("127.0.9.1", "/", "203.0.113.7"), 2)       # not a proxy: header ignored
            assert spoofed.startswith(b"HTTP/1.1 200") and spoofed.endswith(b"127.0.9.1"), spoofed
            direct = [request("127.0.9.1", "/hold", f"203.0.113.{i}") for i in (20, 21, 22)]
            t = time.monotonic()
            try:
                third = _read_all(direct[2], 2)[0]
            except ConnectionResetError:                                             # aborted
                third = b""
            assert third == b"" and time.monotonic() - t < 1                         # closed at once: the peer's 3rd
            release.set()
            for s in held + direct[:2]:
                assert _read_all(s, 2)[0].startswith(b"HTTP/1.1 200")
        finally:
            release.set()
            for s in sockets:
                s.close()


def test_forwarded_client_is_the_address_uvicorn_gives_the_app():
    """The cap's client is uvicorn's (ProxyHeadersMiddleware's rule: the rightmost entry that is not a trusted
    proxy), so the cap and the per-address limits count one address; '*' (trust every peer) is refused."""
    import ipaddress
    from types import SimpleNamespace

    import pytest
    from uvicorn.middleware.proxy_headers import _TrustedHosts

    from minimega.classroom.cli import uvicorn_options
    from minimega.classroom.httpguard import forwarded_client

    trusted = "127.0.0.1, 10.0.0.0/8"
    nets = [ipaddress.ip_network(n.strip()) for n in trusted.split(",")]

    def is_proxy(h):
        try:
            return any(ipaddress.ip_address(h) in n for n in nets)
        except ValueError:
            return False
    for header in ["203.0.113.7", "198.51.100.1, 203.0.113.7", "203.0.113.7, 10.1.2.3", "203.0.113.7:4431",
                   "[2001:db8::1]:80, 10.0.0.9", "2001:db8::2", "evil, 203.0.113.9 ,10.9.9.9"]:
        assert forwarded_client(header, is_proxy) == _TrustedHosts(trusted).get_trusted_client_address(header)[0]
    assert forwarded_client("10.0.0.1, 127.0.0.1", is_proxy) is None and forwarded_client("", is_proxy) is None
    with pytest.raises(SystemExit, match=r"--forwarded-allow-ips '\*'"):
        uvicorn_options(SimpleNamespace(forwarded_allow_ips="10.0.0.1, *", host="0.0.0.0", port=8000,
                                        trust_public_proxy=False))
