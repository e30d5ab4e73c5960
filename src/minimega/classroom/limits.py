"""Limits that hold against an address pool.

An attacker rarely has one address: a cloud account rents a /24 of IPv4 or a whole IPv6 /64 (2^64 addresses)
for the price of one. So every per-address budget is counted per *block* (`block_of`): IPv4 /24, IPv6 /64 (an
IPv4-mapped IPv6 address counts as its IPv4 /24). Sign-ins also have an overall cap per hour and a cap per email
domain per hour, which no pool of addresses or mailboxes at one provider escapes; both are shares (`ShareCap`):
once a cap is spent, each network still has a small budget of its own (per domain, for the domain's cap), so an
attack that spends a cap slows the attacker's networks down and never locks out a learner from another network.
Every refusal says when to retry (in its text and in ``Retry-After``).

`RateLimiter` counts in memory (one SQLite instance); `SharedRateLimiter` in the store, so that every instance
on one PostgreSQL database counts the same events.
"""
from __future__ import annotations

import ipaddress
import threading
import time
from collections import defaultdict, deque

from .errors import ExamError


def block_of(address: str) -> str:
    """The block a client address is counted in: ``203.0.113.0/24``, ``2001:db8:1:2::/64``; else the text."""
    try:
        ip = ipaddress.ip_address(address)
    except ValueError:
        return str(address)[:64]
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    prefix = 24 if ip.version == 4 else 64
    return str(ipaddress.ip_network(f"{ip}/{prefix}", strict=False))


def refusal(what: str, retry_s: float) -> ExamError:
    retry = max(1, int(retry_s) + 1)
    err = ExamError(f"too many requests {what}: retry in {retry} s", 429)
    err.retry_after = retry
    return err


class RateLimiter:
    """At most `limit` events per `window_s` seconds per key (sliding window)."""

    def __init__(self, limit: int, window_s: float, what: str = "from this network"):
        self.limit, self.window, self.what = limit, window_s, what
        self.events: dict[str, deque] = defaultdict(deque)
        self.lock = threading.Lock()

    def hit(self, key: str, now: float | None = None) -> None:
        now = time.monotonic() if now is None else now
        with self.lock:
            q = self.events[key]
            while q and q[0] <= now - self.window:
                q.popleft()
            if len(q) >= self.limit:
                raise refusal(self.what, q[0] + self.window - now)
            q.append(now)
            if len(self.events) > 100_000:                 # forget idle keys
                for k in [k for k, v in self.events.items() if not v or v[-1] <= now - self.window]:
                    del self.events[k]


class SharedRateLimiter:
    """`RateLimiter`'s sliding window kept in the store (`Store.rate_hit`), so that every service instance
    on one PostgreSQL database counts the same events. Wall-clock time: instances on other hosts agree
    on it to within their clock skew, which is small against these windows (a minute, an hour)."""

    def __init__(self, store, bucket: str, limit: int, window_s: float, clock=time.time,
                 what: str = "from this network"):
        self.store, self.bucket, self.limit, self.window, self.clock = store, bucket, limit, window_s, clock
        self.what = what

    def hit(self, key: str, now: float | None = None) -> None:
        retry = self.store.rate_hit(self.bucket, key, limit=self.limit, window_s=self.window,
                                    now=self.clock() if now is None else now)
        if retry is not None:
            raise refusal(self.what, retry)


def limiter(store, bucket: str, limit: int, window_s: float, what: str = "from this network"):
    """A shared limiter when several instances use the store, else an in-memory one."""
    if store.shared:
        return SharedRateLimiter(store, bucket, limit, window_s, what=what)
    return RateLimiter(limit, window_s, what=what)


class ShareCap:
    """A cap shared by everyone (overall, or per email domain) that slows down instead of locking out: while the
    cap has room, every event counts against it; once it is spent, a sender's network may still spend `share`
    events per window of its own (keyed on the cap's key and the network), so a flood from many networks spends
    the cap but a network that has not taken part still gets its share."""

    def __init__(self, cap, share):
        self.cap, self.share = cap, share

    def hit(self, key: str, network: str, now: float | None = None) -> None:
        try:
            self.cap.hit(key, now)
        except ExamError as spent:
            try:
                self.share.hit(f"{key}|{network}", now)
            except ExamError:
                raise spent from None
