"""What keeps one process standing through a flood of slow or idle connections (the slowloris attack).

- `guarded_protocol`: uvicorn's h11 protocol with two read deadlines. A request whose headers have not arrived in
  full within `header_s` of the connection (or of the previous response), or whose body has not arrived within
  `body_s` of its headers, gets ``408 Request Timeout`` and its connection is closed. uvicorn alone waits forever.
  It also caps what one address holds open (`per_address`): a client's own connections, the surplus closed at
  once; through a proxy named in ``--forwarded-allow-ips`` (whose connections carry every client), the requests
  in flight per forwarded client address (`forwarded_client`), the surplus answered 429. X-Forwarded-For from
  any other peer is never read: that peer is the address counted.
- `RepeatFilter`: one log line per kind of message per interval, the next one saying how many were held back,
  so a flood cannot fill the disk with "Too many open files" tracebacks.
- `raise_open_files_limit`: the soft limit on open files up to the hard one (a server holds one per connection).

``limit_concurrency`` (uvicorn's own: 503 beyond it) bounds the rest. A reverse proxy in front (compose.yaml)
absorbs floods before they reach the process; these are the second line.
"""
from __future__ import annotations

import ipaddress
import logging
import threading
import time
from collections import Counter
from urllib.parse import urlsplit

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

from .limits import block_of

LOG = logging.getLogger("minimega.classroom.guard")
def _reply(detail: str) -> bytes:
    body = detail.encode()
    return (b"HTTP/1.1 408 Request Timeout\r\ncontent-type: text/plain; charset=utf-8\r\nconnection: close\r\n"
            b"content-length: " + str(len(body)).encode() + b"\r\n\r\n" + body)


def _host(entry: str) -> str:
    """One X-Forwarded-For entry's host: ``[v6]:port`` and ``v4:port`` lose the port (as uvicorn reads them)."""
    entry = entry.strip()
    if entry.startswith("[") and "]" in entry:
        return entry[1:entry.index("]")]
    return entry.split(":")[0] if entry.count(":") == 1 else entry


def forwarded_client(header: str, is_proxy) -> str | None:
    """The client a chain of trusted proxies forwarded for: the rightmost X-Forwarded-For entry that is not itself
    a trusted proxy (uvicorn's ProxyHeadersMiddleware rule, so the cap counts the address the limits see);
    None when every entry is a trusted proxy or the header is empty."""
    for entry in reversed(header.split(",")):
        host = _host(entry)
        if host and not is_proxy(host):
            return host[:64]
    return None


class ProxyTrustError(ValueError):
    """A ``--forwarded-allow-ips`` value that would let clients pick the address the limits count."""


def trusted_proxies(value: str | None, *, public: bool = False) -> list[str]:
    """The proxies ``--forwarded-allow-ips`` names, each an address or network, checked: never ``*`` nor ranges
    that together cover every address (``0.0.0.0/0``, ``::/0``, ``0.0.0.0/1,128.0.0.0/1``), and a public address
    only when `public` (``--trust-public-proxy``) and named one by one (a /32 or /128): a public range trusts
    whoever rents an address in it. Raises `ProxyTrustError` saying what to change."""
    entries = [a.strip() for a in (value or "").split(",") if a.strip()]
    nets = []
    for entry in entries:
        if entry == "*":
            raise ProxyTrustError("--forwarded-allow-ips '*' would trust X-Forwarded-For from every client, so any "
                                  "client could pick the address the per-address limits count; name the proxy's "
                                  "address or network instead (compose.yaml passes 172.16.0.0/12)")
        try:
            net = ipaddress.ip_network(entry, strict=False)
        except ValueError:
            raise ProxyTrustError(f"--forwarded-allow-ips {entry[:60]!r}: not an address or network (a socket's "
                                  "peer is an address; name the proxy's)") from None
        if net.version == 6 and net.prefixlen <= 96 and net.supernet_of(ipaddress.ip_network("::ffff:0:0/96")):
            raise ProxyTrustError(f"--forwarded-allow-ips {entry}: covers every IPv4-mapped address")
        private = net.is_private or net.is_loopback or net.is_link_local
        if not private and not (public and net.num_addresses == 1):
            raise ProxyTrustError(f"--forwarded-allow-ips {entry}: a public {'address' if net.num_addresses == 1 else 'range'}; "
                                  "trust public proxies one address at a time (a /32 or /128) with "
                                  "--trust-public-proxy, or name the proxy's private address")
        nets.append(net)
    for version, everything in ((4, "0.0.0.0/0"), (6, "::/0")):
        mine = list(ipaddress.collapse_addresses(n for n in nets if n.version == version))
        if mine == [ipaddress.ip_network(everything)]:
            raise ProxyTrustError(f"--forwarded-allow-ips {','.join(entries)[:120]}: together these cover every "
                                  f"IPv{version} address, so any client could pick the address the limits count")
    return entries


def guarded_protocol(header_s: float, body_s: float, per_address: int, proxies=(), per_network: int | None = None,
                     unfinished_per_network: int | None = None) -> type:
    """A uvicorn ``http`` protocol class with these deadlines and caps; `proxies` (addresses or networks,
    ``--forwarded-allow-ips``) are the peers whose X-Forwarded-For names the client counted.

    Caps, each counted per sender (the socket's peer, or the forwarded client behind a trusted proxy):
    `per_address` connections (requests in flight through a proxy) per address; `per_network` per network (IPv4 /24,
    IPv6 /64, `limits.block_of`), so that one rented block cannot fill ``limit_concurrency``; and
    `unfinished_per_network`, a smaller budget for requests whose headers or body are still arriving, so slow
    clients never take the slots that finished requests need. None: no network cap."""
    held: Counter = Counter()
    nets: Counter = Counter()
    """Connections (or requests through a proxy) per network."""
    unfinished: Counter = Counter()
    """Connections in their header or body phase (through a proxy: requests whose body is still arriving)."""
    per_network = per_network or 1 << 62
    unfinished_per_network = unfinished_per_network or 1 << 62

    def drop(counter: Counter, key) -> None:
        counter[key] -= 1
        if counter[key] <= 0:
            del counter[key]
    networks = []
    for entry in proxies:
        try:
            networks.append(ipaddress.ip_network(entry, strict=False))
        except ValueError:
            pass                                          # a host name: never a socket's peer address

    def is_proxy(address: str) -> bool:
        try:
            ip = ipaddress.ip_address(address)
        except ValueError:
            return False
        return any(ip in net for net in networks)

    def capped(app):
        """`app` behind the cap on requests in flight per forwarded client, for connections from a proxy."""
        async def guarded_app(scope, receive, send):
            address = None
            if scope["type"] == "http":
                xff = b",".join(v for k, v in scope["headers"] if k == b"x-forwarded-for").decode("latin-1")
                address = forwarded_client(xff, is_proxy)
            if address is None:                           # the proxy's own request: not a client's
                return await app(scope, receive, send)
            network = block_of(address)
            headers = dict(scope["headers"])
            has_body = headers.get(b"content-length", b"0") not in (b"", b"0") or b"transfer-encoding" in headers
            over = ("per-address" if held[address] >= per_address else "per-network" if nets[network] >= per_network
                    else "unfinished" if has_body and unfinished[network] >= unfinished_per_network else None)
            if over is not None:
                LOG.warning("429: %s is at its %s cap of requests in flight through the proxy", network, over)
                body = (f"{address} ({network}) is at its {over} cap of requests in flight through the proxy; "
                        "retry in 5 s").encode()
                await send({"type": "http.response.start", "status": 429, "headers": [
                    (b"content-type", b"text/plain; charset=utf-8"), (b"retry-after", b"5"),
                    (b"content-length", str(len(body)).encode())]})
                return await send({"type": "http.response.body", "body": body})
            held[address] += 1
            nets[network] += 1
            arriving = has_body
            if arriving:
                unfinished[network] += 1

            async def counted_receive():
                nonlocal arriving
                message = await receive()
                if arriving and not message.get("more_body", False):
                    arriving = False
                    drop(unfinished, network)
                return message
            try:
                return await app(scope, counted_receive, send)
            finally:
                drop(held, address)
                drop(nets, network)
                if arriving:
                    drop(unfinished, network)
        return guarded_app

    class Guarded(H11Protocol):
        _timer = None
        _phase = None
        _counted = None
        _arriving = False

        def connection_made(self, transport):
            super().connection_made(transport)
            address = self.client[0] if self.client else "unknown"
            if is_proxy(address):                         # every client's connection: count its requests instead
                self.app = capped(self.app)
            else:
                network = block_of(address)
                over = ("per-address" if held[address] >= per_address else
                        "per-network" if nets[network] >= per_network else
                        "unfinished" if unfinished[network] >= unfinished_per_network else None)
                if over is not None:
                    LOG.warning("connection refused: %s (%s) is at its %s cap of connections", address, network, over)
                    transport.abort()
                    return
                held[address] += 1
                nets[network] += 1
                self._counted = (address, network)
            self._arm()

        def connection_lost(self, exc):
            self._cancel()
            self._unfinished(False)
            if self._counted is not None:
                drop(held, self._counted[0])
                drop(nets, self._counted[1])
                self._counted = None
            super().connection_lost(exc)

        def _unfinished(self, now: bool):
            """Count this connection in its network's unfinished budget while a request is arriving."""
            if self._counted is None or now == self._arriving:
                return
            self._arriving = now
            if now:
                unfinished[self._counted[1]] += 1
            else:
                drop(unfinished, self._counted[1])

        def data_received(self, data):
            super().data_received(data)
            self._arm()

        def on_response_complete(self):
            super().on_response_complete()
            self._arm()

        def _cancel(self):
            if self._timer is not None:
                self._timer.cancel()
                self._timer = None

        def _arm(self):
            """Header phase while the peer is IDLE, body phase while it SENDs_BODY, no deadline otherwise
            (the request is in: the app's time is its own)."""
            if self.transport.is_closing():
                return self._cancel()
            their = self.conn.their_state
            phase = "header" if their is h11.IDLE else "body" if their is h11.SEND_BODY else None
            self._unfinished(phase is not None)
            if phase == self._phase:
                return
            self._cancel()
            self._phase = phase
            if phase is not None:
                self._timer = self.loop.call_later(header_s if phase == "header" else body_s, self._expire, phase)

        def _expire(self, phase):
            self._timer = None
            if self.transport.is_closing():
                return
            if self.cycle is not None and self.cycle.response_started:     # answering already: let it finish
                return
            limit = header_s if phase == "header" else body_s
            LOG.warning("408: request %s not received within %g s; connection closed", phase, limit)
            if self.cycle is not None:                                   # the app waiting for the body ends
                self.cycle.disconnected = True                            # quietly; nothing more is sent
                self.cycle.message_event.set()
            self.transport.write(_reply(f"request {phase} not received within {limit:g} s"))
            self.transport.close()

    Guarded.held, Guarded.nets, Guarded.unfinished = held, nets, unfinished
    return Guarded


class RepeatFilter(logging.Filter):
    """At most one record per (logger, level, message template, exception type) per `interval_s`; the first
    record after a quiet spell says how many like it were held back."""

    def __init__(self, interval_s: float = 10.0, clock=time.monotonic):
        super().__init__()
        self.interval, self.clock = interval_s, clock
        self.last: dict[tuple, float] = {}
        self.held: Counter = Counter()
        self.lock = threading.Lock()

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[0].__name__ if record.exc_info and record.exc_info[0] else None
        key = (record.name, record.levelno, str(record.msg)[:120], exc)
        now = self.clock()
        with self.lock:
            if now - self.last.get(key, -1e18) < self.interval:
                self.held[key] += 1
                return False
            self.last[key] = now
            n = self.held.pop(key, 0)
            if len(self.last) > 10_000:
                self.last = {k: t for k, t in self.last.items() if now - t < self.interval}
        if n:
            record.msg = f"{record.msg} ({n} more like this held back in the last {self.interval:g} s)"
        return True


LOGGERS = ("uvicorn", "uvicorn.error", "uvicorn.access", "asyncio", "minimega.classroom.guard")


def install_repeat_filter(interval_s: float = 10.0) -> RepeatFilter:
    """Rate-limit the loggers a flood writes to (their own records; filters do not apply to children)."""
    f = RepeatFilter(interval_s)
    for name in LOGGERS:
        logging.getLogger(name).addFilter(f)
    return f


def raise_open_files_limit(target: int = 65536) -> int:
    """Soft RLIMIT_NOFILE up to min(hard, target); returns the limit in force."""
    try:
        import resource
    except ImportError:                                   # not POSIX
        return -1
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = target if hard == resource.RLIM_INFINITY else min(hard, target)
    if soft < want:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))
            soft = want
        except (ValueError, OSError):
            pass
    return soft


def server_options(config, forwarded_allow_ips: str | None = None) -> dict:
    """uvicorn options for `config`'s deadlines and caps (the service's and the tests' one source)."""
    proxies = [a.strip() for a in (forwarded_allow_ips or "").split(",") if a.strip() and a.strip() != "*"]
    return {"http": guarded_protocol(config.header_timeout_s, config.body_timeout_s,
                                     config.connections_per_address, proxies, config.connections_per_network,
                                     config.unfinished_per_network),
            "limit_concurrency": config.limit_concurrency, "timeout_keep_alive": 5,
            "h11_max_incomplete_event_size": 16 * 1024}


CSP = ("default-src 'self'; script-src 'self' 'unsafe-inline'; style-src 'self' 'unsafe-inline'; "
       "img-src 'self' data:; font-src 'self' data:; connect-src 'self' https:; frame-src 'self'; "
       "object-src 'none'; base-uri 'self'; form-action 'self'; frame-ancestors {ancestors}")
"""Every page: scripts, styles and frames from this origin only (mkdocs-material and the figure pages inline a
few scripts); fetches to https anywhere (the verify page reads other issuers' status lists)."""
FRAMABLE = "/assets/figures/"
"""The site's figure pages, which its own chapters show in iframes: same-origin framing only."""


class SecurityHeaders:
    """ASGI middleware: CSP, X-Frame-Options (DENY; SAMEORIGIN for the figure pages), nosniff and Referrer-Policy
    on every response that does not set its own; a redirect's Location built on `base_url`, never on the Host
    header a client sent."""

    def __init__(self, app, base_url: str):
        self.app, self.base = app, base_url.rstrip("/").encode()

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        framable = scope.get("path", "").startswith(FRAMABLE)
        defaults = [(b"content-security-policy", CSP.format(ancestors="'self'" if framable else "'none'").encode()),
                    (b"x-frame-options", b"SAMEORIGIN" if framable else b"DENY"),
                    (b"x-content-type-options", b"nosniff"), (b"referrer-policy", b"no-referrer")]

        async def guarded_send(message):
            if message["type"] == "http.response.start":
                headers = list(message.get("headers") or [])
                have = {k.lower() for k, _ in headers}
                headers += [(k, v) for k, v in defaults if k not in have]
                if 300 <= message["status"] < 400:
                    headers = [(k, self._local(v) if k.lower() == b"location" else v) for k, v in headers]
                message = {**message, "headers": headers}
            await send(message)

        await self.app(scope, receive, guarded_send)

    def _local(self, location: bytes) -> bytes:
        """A Location re-rooted on the base URL (Starlette builds absolute ones from the request's Host)."""
        parts = urlsplit(location.decode("latin-1"))
        if not parts.scheme and not parts.netloc and not parts.path.startswith("/"):
            return location                                 # relative to the page: stays on this origin
        path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
        return self.base + path.encode("latin-1")
