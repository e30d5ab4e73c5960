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
