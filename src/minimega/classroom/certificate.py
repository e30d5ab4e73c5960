"""The printable certificate: an HTML page and an SVG image, each with a QR code to the verify URL.

Both are views of the signed credential, not the credential: they carry the verification code and
a QR code so that a reader of the paper goes to ``/verify/?c=CODE`` and sees the signed claims. The
SVG also *bakes* the credential (Open Badges 3.0 §5.3: an ``openbadges:credential`` element holding
the JSON), so the image file alone can be verified. Every claim is escaped: names are learner input.

The words around the claims follow the language the credential's achievement is written in
(``inLanguage``, set by the issuer from the attempt's language): a Dutch attempt prints a Dutch page.
The claims themselves are printed as signed, never translated.
"""
from __future__ import annotations

import json
from html import escape

import segno

from .credential import claims_of

W, H = 1100, 780

WORDS = {
    "en": {"title": "CERTIFICATE OF COMPLETION", "certifies": "This certifies that", "passed": "passed the graded exam of",
           "footer": "Course version {version} · issued {date} by {issuer}", "code": "Verification code",
           "issuer": "Issuer", "aria": "Certificate for {name}", "page_title": "Certificate",
           "rows": ("Name", "Achievement", "Course version", "Issued", "Issuer", "Credential", "Verification code"),
           "qr": "QR code to {url}", "scan": "Scan to verify",
           "check": "Check it at {link}: the verify page checks the issuer's signature and shows the signed claims. "
                    "This page alone proves nothing.",
           "verify": "Verify", "svg": "SVG image (with the credential inside)", "json": "Credential (JSON)"},
    "nl": {"title": "CERTIFICAAT", "certifies": "Hierbij wordt verklaard dat", "passed": "geslaagd is voor het beoordeelde examen van",
           "footer": "Cursusversie {version} · uitgereikt op {date} door {issuer}", "code": "Verificatiecode",
           "issuer": "Uitgever", "aria": "Certificaat voor {name}", "page_title": "Certificaat",
           "rows": ("Naam", "Prestatie", "Cursusversie", "Uitgereikt", "Uitgever", "Credential", "Verificatiecode"),
           "qr": "QR-code naar {url}", "scan": "Scan om te verifiëren",
           "check": "Controleer het op {link}: de verificatiepagina controleert de handtekening van de uitgever en "
                    "toont de ondertekende gegevens. Deze pagina alleen bewijst niets.",
           "verify": "Verifiëren", "svg": "SVG-afbeelding (met de credential erin)", "json": "Credential (JSON)"},
}
"""The words around the signed claims, per language of the achievement."""


def language(doc: dict) -> str:
    """The language the credential's achievement text is written in: its ``inLanguage`` when this page
    has words for it, else English."""
    subject = doc.get("credentialSubject") if isinstance(doc.get("credentialSubject"), dict) else {}
    achievement = subject.get("achievement") if isinstance(subject.get("achievement"), dict) else {}
    lang = achievement.get("inLanguage")
    return lang if isinstance(lang, str) and lang in WORDS else "en"


def qr_path(url: str, size: int) -> tuple[str, float]:
    """An SVG path drawing the QR code of `url` in a `size`-px square (with its quiet zone)."""
    qr = segno.make(url, error="m")
    rows = [list(r) for r in qr.matrix]
    n = len(rows) + 8                       # 4-module quiet zone each side
    cell = size / n
    d = []
    for y, row in enumerate(rows):
        for x, dark in enumerate(row):
            if dark:
                d.append(f"M{(x + 4) * cell:.2f} {(y + 4) * cell:.2f}h{cell:.2f}v{cell:.2f}h-{cell:.2f}z")
    return "".join(d), cell


def _wrap(text: str, width: int) -> list[str]:
    lines, line = [], ""
    for word in (text or "").split():
        if len(line) + len(word) + 1 > width and line:
            lines.append(line)
            line = word
        else:
            line = f"{line} {word}".strip()
    return lines + ([line] if line else [])


def svg(doc: dict, code: str, verify_url: str) -> str:
    c = claims_of(doc)
    w = WORDS[language(doc)]
    path, _ = qr_path(verify_url, 180)
    desc = "".join(f'<tspan x="{W/2}" dy="24">{escape(line)}</tspan>' for line in _wrap(c["achievement"] or "", 70))
    baked = json.dumps(doc, ensure_ascii=False, indent=1).replace("]]>", "]]]]><![CDATA[>")
    return f"""<svg xmlns="http://www.w3.org/2000/svg" xmlns:openbadges="https://purl.imsglobal.org/ob/v3p0" viewBox="0 0 {W} {H}" width="100%" height="100%" role="img" aria-label="{escape(w['aria'].format(name=c['name'] or ''))}">
<openbadges:credential><![CDATA[{baked}]]></openbadges:credential>
<rect x="0" y="0" width="{W}" height="{H}" fill="#fbfaf7"/>
<rect x="24" y="24" width="{W-48}" height="{H-48}" fill="none" stroke="#3f51b5" stroke-width="3"/>
<g font-family="Georgia, 'DejaVu Serif', serif" text-anchor="middle" fill="#1d1d1f">
<text x="{W/2}" y="120" font-size="22" letter-spacing="6">{w['title']}</text>
<text x="{W/2}" y="190" font-size="18">{w['certifies']}</text>
<text x="{W/2}" y="260" font-size="48" font-weight="bold">{escape(c['name'] or '')}</text>
<text x="{W/2}" y="320" font-size="18">{w['passed']}</text>
<text x="{W/2}" y="340" font-size="26" font-weight="bold">{desc}</text>
<text x="{W/2}" y="440" font-size="16">{escape(w['footer'].format(version=c['course_version'], date=str(c['valid_from'])[:10], issuer=c['issuer_name']))}</text>
</g>
<g font-family="'DejaVu Sans Mono', monospace" fill="#1d1d1f" font-size="16">
<text x="60" y="600">{w['code']}</text>
<text x="60" y="632" font-size="26" font-weight="bold">{escape(code)}</text>
<text x="60" y="670" font-size="13">{escape(verify_url)}</text>
<text x="60" y="694" font-size="11">{w['issuer']} {escape(str(c['issuer_id'])[:90])}</text>
</g>
<g transform="translate({W-240},{H-240})"><rect width="180" height="180" fill="#fff"/><path d="{path}" fill="#000"/></g>
</svg>
"""


def html(doc: dict, code: str, verify_url: str) -> str:
    c = claims_of(doc)
    lang = language(doc)
    w = WORDS[lang]
    path, _ = qr_path(verify_url, 160)
    values = (c["name"], c["achievement"], c["course_version"], c["valid_from"],
              f"{c['issuer_name']} ({c['issuer_id']})", c["credential_id"], code)
    rows = list(zip(w["rows"], values))
    table = "".join(f"<tr><th scope=row>{escape(k)}</th><td>{escape(str(v))}</td></tr>" for k, v in rows)
    return f"""<!doctype html>
<html lang="{lang}"><head><meta charset="utf-8"><title>{w['page_title']} · {escape(c['name'] or '')}</title>
<meta name="viewport" content="width=device-width, initial-scale=1">
<style>
body{{font-family:Georgia,'DejaVu Serif',serif;margin:0;background:#eee;color:#1d1d1f}}
main{{max-width:900px;margin:2rem auto;background:#fbfaf7;border:3px solid #3f51b5;padding:3rem}}
h1{{font-size:1.2rem;letter-spacing:.3em;text-align:center;font-weight:normal}}
.name{{font-size:2.6rem;text-align:center;margin:1.5rem 0}} .ach{{font-size:1.4rem;text-align:center}}
table{{margin-top:2rem;border-collapse:collapse;font-family:system-ui,sans-serif;font-size:.9rem;flex:1 1 24rem;
  min-width:0}}
th{{text-align:left;padding:.2rem 1rem .2rem 0;font-weight:600;white-space:nowrap;vertical-align:top}}
td{{padding:.2rem 0;overflow-wrap:anywhere}}
.foot{{display:flex;flex-wrap:wrap;justify-content:space-between;align-items:flex-end;gap:2rem}}
@media (max-width:640px){{main{{margin:0;padding:1.2rem;border-width:2px}} .name{{font-size:1.8rem}}
  .ach{{font-size:1.15rem}} h1{{letter-spacing:.15em}} table,tbody,tr,th,td{{display:block}}
  th{{padding:.6rem 0 0}} td{{padding:0 0 .2rem}} .foot{{justify-content:center}}}}
.actions{{font-family:system-ui,sans-serif;text-align:center;margin:1rem}}
@media print{{body{{background:#fff}} main{{margin:0;border-width:2px}} .actions{{display:none}}}}
</style></head><body>
<main>
<h1>{w['title']}</h1>
<p style="text-align:center">{w['certifies']}</p>
<p class="name">{escape(c['name'] or '')}</p>
<p style="text-align:center">{w['passed']}</p>
<p class="ach">{escape(c['achievement'] or '')}</p>
<div class="foot">
<table>{table}</table>
<figure style="margin:0;text-align:center"><svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 160 160" width="160" height="160" role="img" aria-label="{escape(w['qr'].format(url=verify_url))}"><rect width="160" height="160" fill="#fff"/><path d="{path}"/></svg>
<figcaption style="font-family:system-ui,sans-serif;font-size:.75rem">{w['scan']}</figcaption></figure>
</div>
<p style="font-family:system-ui,sans-serif;font-size:.8rem">{w['check'].format(link=f'<a href="{escape(verify_url)}">{escape(verify_url)}</a>')}</p>
</main>
<p class="actions"><a href="{escape(verify_url)}">{w['verify']}</a> · <a href="{escape(code)}.svg" download>{w['svg']}</a> · <a href="/api/v1/credentials/{escape(code)}" download="minimega-credential.json">{w['json']}</a></p>
</body></html>
"""


def unbake_svg(text: str) -> dict:
    """The credential baked into an SVG by `svg` (or any OB 3.0 baked SVG)."""
    start = text.find("<openbadges:credential")
    if start < 0:
        raise ValueError("no openbadges:credential element in this SVG")
    body_start = text.find(">", start) + 1
    end = text.find("</openbadges:credential>", body_start)
    body = text[body_start:end].strip()
    if body.startswith("<![CDATA["):
        body = body[len("<![CDATA["):]
        body = body[: body.rfind("]]>")].replace("]]]]><![CDATA[>", "]]>")
    return json.loads(body)
