"""Web hardening: security headers on every page the service sends, redirects built on --base-url, the var folder
and database owner-only."""
import os
import stat

import pytest
from fastapi.testclient import TestClient

from classroom_support import make_config
from minimega.classroom.service import create_app
from minimega.classroom.store import StoreError

BASE = "https://course.example"


@pytest.fixture
def client(tmp_path):
    site = tmp_path / "site"
    (site / "exam").mkdir(parents=True)
    (site / "verify").mkdir()
    (site / "assets" / "figures").mkdir(parents=True)
    for page in ("index.html", "exam/index.html", "verify/index.html", "assets/figures/f.html"):
        (site / page).write_text("<html>page</html>")
    with TestClient(create_app(make_config(tmp_path, base_url=BASE))) as c:
        yield c


@pytest.mark.parametrize("path", ["/", "/exam/", "/verify/", "/api/v1/health", "/api/v1/exam", "/nope",
                                  "/.well-known/did.json", "/exam-app/exam.js"])
def test_every_page_sends_the_security_headers(client, path):
    r = client.get(path)
    assert "frame-ancestors 'none'" in r.headers["content-security-policy"], path
    assert "default-src 'self'" in r.headers["content-security-policy"] and "object-src 'none'" in \
        r.headers["content-security-policy"]
    assert r.headers["x-frame-options"] == "DENY" and r.headers["x-content-type-options"] == "nosniff"
    assert r.headers["referrer-policy"] == "no-referrer"


def test_figure_pages_may_be_framed_by_the_site_only(client):
    r = client.get("/assets/figures/f.html")
    assert r.headers["x-frame-options"] == "SAMEORIGIN" and "frame-ancestors 'self'" in r.headers["content-security-policy"]


@pytest.mark.parametrize("path", ["/exam", "/verify"])
def test_redirects_are_built_on_the_base_url_not_the_host_header(client, path):
    r = client.get(path, headers={"Host": "evil.example"}, follow_redirects=False)
    assert r.status_code in (301, 302, 307, 308), r.status_code
    assert r.headers["location"] == f"{BASE}{path}/", r.headers["location"]


def test_var_dir_and_database_are_owner_only(tmp_path):
    create_app(make_config(tmp_path))
    var = tmp_path / "var"
    assert stat.S_IMODE(var.stat().st_mode) == 0o700
    for p in var.glob("classroom.sqlite3*"):
        assert stat.S_IMODE(p.stat().st_mode) == 0o600, p


def test_a_var_dir_others_can_read_is_refused_with_the_fix(tmp_path):
    (tmp_path / "var").mkdir(mode=0o755)
    os.chmod(tmp_path / "var", 0o755)
    with pytest.raises(StoreError, match=r"chmod 700 .*var"):
        create_app(make_config(tmp_path))


@pytest.mark.parametrize("value", ["0.0.0.0/0", "::/0", "0.0.0.0/1,128.0.0.0/1", "10.0.0.0/8,0.0.0.0/0", "*",
                                   "::ffff:0:0/96", "8.8.0.0/16", "8.8.8.8", "example.org"])
def test_proxy_trust_refuses_every_address_and_public_ranges(value):
    from minimega.classroom.httpguard import ProxyTrustError, trusted_proxies

    with pytest.raises(ProxyTrustError, match="--forwarded-allow-ips"):
        trusted_proxies(value)


def test_proxy_trust_takes_private_networks_and_public_addresses_one_by_one():
    from minimega.classroom.httpguard import ProxyTrustError, trusted_proxies

    assert trusted_proxies("172.16.0.0/12, 127.0.0.1,fd00::/8") == ["172.16.0.0/12", "127.0.0.1", "fd00::/8"]
    assert trusted_proxies("8.8.8.8,2606:4700::1", public=True) == ["8.8.8.8", "2606:4700::1"]
    with pytest.raises(ProxyTrustError, match="one address at a time"):
        trusted_proxies("8.8.4.0/24", public=True)
