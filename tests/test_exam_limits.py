"""Limits that hold against an address pool: per-block budgets (/24, /64), overall and per-domain sign-in caps,
a minimum time per attempt; every refusal says when to retry."""
import http.client
import json

import pytest
from fastapi.testclient import TestClient

from classroom_support import free_port, make_config, served, sign_in
from minimega.classroom.errors import ExamError
from minimega.classroom.limits import RateLimiter, block_of
from minimega.classroom.service import create_app


def test_addresses_count_in_blocks():
    assert block_of("203.0.113.77") == block_of("203.0.113.1") == "203.0.113.0/24" != block_of("203.0.114.1")
    assert block_of("2001:db8:1:2:aaaa::1") == block_of("2001:db8:1:2:ffff::9") == "2001:db8:1:2::/64"
    assert block_of("2001:db8:1:3::1") != block_of("2001:db8:1:2::1")
    assert block_of("::ffff:203.0.113.9") == "203.0.113.0/24"
    assert block_of("testclient") == "testclient"
    limit = RateLimiter(3, 60)                       # 2^64 addresses of one /64 share one budget
    for i in range(3):
        limit.hit(block_of(f"2001:db8::{i:x}"), now=0)
    with pytest.raises(ExamError, match=r"retry in \d+ s"):
        limit.hit(block_of("2001:db8::ffff:1"), now=1)


def _signin_from(port: int, source: str, email: str):
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5, source_address=(source, 0))
    try:
        conn.request("POST", "/api/v1/signin", body=json.dumps({"email": email}),
                     headers={"Content-Type": "application/json"})
        r = conn.getresponse()
        return r.status, json.loads(r.read()), r.getheader("Retry-After")
    finally:
        conn.close()


def test_sixty_rotating_addresses_share_their_block_budget(tmp_path):
    """The attack that gave 60 identities in 7 s: every address of one /24 spends the same 20 sign-ins."""
    app = create_app(make_config(tmp_path, ip_signins_per_hour=20))
    port = free_port()
    with served(app, port):
        replies = [_signin_from(port, f"127.0.5.{i + 1}", f"pool{i}@example{i}.org") for i in range(60)]
        other = _signin_from(port, "127.0.6.1", "elsewhere@example.net")
    assert [s for s, _, _ in replies[:20]] == [200] * 20
    refused = replies[20:]
    assert all(s == 429 and "retry in" in body["detail"] and int(after) > 0 for s, body, after in refused), refused[:2]
    assert other[0] == 200                            # another /24 has its own budget


def test_overall_and_per_domain_sign_in_caps_slow_a_network_down(tmp_path):
    app = create_app(make_config(tmp_path, signins_per_domain_per_hour=3, signins_per_hour_total=5,
                                 signin_share_per_hour=1))
    with TestClient(app) as client:
        said = [client.post("/api/v1/signin", json={"email": f"a{i}@mail.example"}) for i in range(5)]
        assert [r.status_code for r in said] == [200, 200, 200, 200, 429]   # the cap, then this network's share
        assert "email domain" in said[-1].json()["detail"] and "retry in" in said[-1].json()["detail"]
        assert said[-1].headers["Retry-After"].isdigit()
        more = [client.post("/api/v1/signin", json={"email": f"b{i}@other{i}.example"}) for i in range(3)]
        assert [r.status_code for r in more] == [200, 200, 429]          # 5 in all this hour, then the share
        assert "for sign-ins: retry in" in more[-1].json()["detail"]
    with TestClient(app, client=("198.51.100.7", 5000)) as fresh:         # a network that took no part
        assert fresh.post("/api/v1/signin", json={"email": "new@mail.example"}).status_code == 200


def test_a_learner_signs_in_through_a_1600_sign_in_attack_from_many_networks():
    """About 1,600 sign-ins from 67 /24s (24 each, under the per-network 30) to one big domain and to throwaway
    ones spend the overall cap (2000 at default; 1200 here, so that this attack spends it) and the domain's (300):
    a learner from a fresh network, at a fresh domain or at the attacked one, still signs in."""
    from minimega.classroom.limits import ShareCap

    caps = {"all": ShareCap(RateLimiter(1200, 3600, "for sign-ins"), RateLimiter(3, 3600)),
            "domain": ShareCap(RateLimiter(300, 3600, "for this domain"), RateLimiter(3, 3600))}

    def signin(network, domain, now):
        try:
            caps["domain"].hit(domain, network, now)
            caps["all"].hit("all", network, now)
            return True
        except ExamError:
            return False

    sent = [signin(f"10.{n // 256}.{n % 256}.0/24", "mail.example" if i % 3 == 0 else f"throw{n}-{i}.example",
                   n + i / 100) for n in range(67) for i in range(24)]
    full = {name: len(cap.cap.events[key]) == cap.cap.limit for (name, cap), key in zip(caps.items(), ["all", "mail.example"])}
    assert len(sent) == 1608 and full == {"all": True, "domain": True}, full     # the attack spent both caps
    assert signin("203.0.113.0/24", "fresh.example", 100)         # a fresh network and domain
    assert signin("198.51.100.0/24", "mail.example", 100)         # a fresh network at the attacked domain
    assert not signin("10.0.66.0/24", "fresh2.example", 100)       # an attacking network has spent its share


def test_an_attempt_cannot_be_finished_before_the_minimum_time(tmp_path):
    now = [1_000_000.0]
    app = create_app(make_config(tmp_path, min_attempt_s=300), clock=lambda: now[0])
    with TestClient(app) as client:
        assert "no sooner than 5 minutes" in client.get("/api/v1/exam").json()["rules"]
        assert "pas 5 minuten na de start" in client.get("/api/v1/exam?lang=nl").json()["rules"]
        auth = sign_in(client)
        aid = client.post("/api/v1/attempts", json={"display_name": "Quick"}, headers=auth).json()["attempt_id"]
        now[0] += 10
        early = client.post(f"/api/v1/attempts/{aid}/finish", headers=auth)
        assert early.status_code == 429 and "retry in 291 s" in early.json()["detail"], early.text
        assert early.headers["Retry-After"] == "291"
        now[0] += 291
        assert client.post(f"/api/v1/attempts/{aid}/finish", headers=auth).status_code == 200
