"""The certificate's QR codes, as a phone would read them: the HTML page and the SVG image of a real
certificate, issued by the service for an English and a Dutch attempt, are rendered by Debian's
chromium; a screenshot of each QR code is decoded by ZXing (zxing-cpp), and what it reads must be the
certificate's verify URL, character for character."""
import pytest
from fastapi.testclient import TestClient

from classroom_support import make_config, pass_exam
from minimega.classroom.certificate import WORDS
from minimega.classroom.service import create_app
from png_pixels import grey

zxingcpp = pytest.importorskip("zxingcpp")
pytestmark = pytest.mark.browser

ORIGIN = "http://127.0.0.1:8000"          # make_config's base_url: the service's links start with it


@pytest.fixture(scope="module")
def certificates(tmp_path_factory):
    """lang -> (code, verify URL the service returned, HTML page response, SVG response)."""
    app = create_app(make_config(tmp_path_factory.mktemp("cert"), attempts_per_day=5, fail_cooldown_s=0))
    out = {}
    with TestClient(app) as client:
        for lang, name in (("en", "Ada Lovelace"), ("nl", "Annie M. G. Schmidt")):
            fin = pass_exam(client, name=name, email=f"{lang}@example.org", lang=lang)
            assert fin["passed"], fin
            code = fin["credential"]["code"]
            out[lang] = (code, fin["credential"]["verify_url"],
                         client.get(f"/certificates/{code}"), client.get(f"/certificates/{code}.svg"))
    return out


def decode(png: bytes) -> list[str]:
    """Every QR code ZXing finds in the screenshot `png`."""
    found = zxingcpp.read_barcodes(grey(png), formats=zxingcpp.BarcodeFormat.QRCode)
    return [b.text for b in found if b.valid]


def served(page, response, url):
    """Open `url` in `page`, answered with the service's `response` (its body, type and CSP headers)."""
    headers = {k: v for k, v in response.headers.items() if k.lower() in ("content-type", "content-security-policy")}
    page.route(url, lambda route: route.fulfill(status=response.status_code, headers=headers, body=response.content))
    page.goto(url)


@pytest.mark.parametrize("lang", ["en", "nl"])
@pytest.mark.parametrize("view", ["html", "svg"])
def test_the_qr_code_reads_as_the_verify_url(chromium, certificates, lang, view):
    code, verify_url, html, svg = certificates[lang]
    assert verify_url == f"{ORIGIN}/verify/?c={code}"
    page = chromium.new_page(viewport={"width": 1200, "height": 900})
    try:
        if view == "html":
            served(page, html, f"{ORIGIN}/certificates/{code}")
            assert page.locator("html").get_attribute("lang") == lang
            qr = page.locator("figure svg")
        else:
            assert WORDS[lang]["title"] in svg.text
            served(page, svg, f"{ORIGIN}/certificates/{code}.svg")
            qr = page.locator("svg > g[transform]")           # the QR code's white square and its modules
        box = qr.bounding_box()
        assert box["width"] >= 150 and box["height"] >= 150, box      # drawn, at the size the layout gives it
        shot = qr.screenshot()
    finally:
        page.close()
    assert decode(shot) == [verify_url]



VALUE_WIDTH = """() => {
  const probe = document.createElement("span");
  probe.textContent = "000000000000";                       // 12 characters of the values' font
  const td = document.querySelector("td");
  probe.style.font = getComputedStyle(td).font;
  probe.style.whiteSpace = "nowrap";
  document.body.append(probe);
  const twelve = probe.getBoundingClientRect().width;
  probe.remove();
  return [twelve, [...document.querySelectorAll("td")].map((td) => td.getBoundingClientRect().width)];
}"""


@pytest.mark.parametrize("width", [390, 1280])
@pytest.mark.parametrize("view", ["html", "svg"])
def test_the_certificate_lays_out_on_a_phone_and_a_desktop(chromium, certificates, view, width):
    """No sideways scrolling at either width; on the page no value is squeezed narrower than 12 characters (the
    old layout wrapped every value letter by letter at 390 px, 3,611 px tall)."""
    code, _, html, svg = certificates["nl"]
    page = chromium.new_page(viewport={"width": width, "height": 900})
    try:
        served(page, html if view == "html" else svg, f"{ORIGIN}/certificates/{code}" + ("" if view == "html" else ".svg"))
        scroll_w = page.evaluate("() => document.documentElement.scrollWidth")
        assert scroll_w <= width, (view, width, scroll_w)
        if view == "html":
            twelve, cells = page.evaluate(VALUE_WIDTH)
            assert cells and min(cells) >= twelve, (twelve, cells)
            assert page.evaluate("() => document.documentElement.scrollHeight") < 2600
        else:
            box = page.locator("svg").first.bounding_box()
            assert box["width"] <= width and box["width"] >= min(width, 1100) * 0.9, box
    finally:
        page.close()
