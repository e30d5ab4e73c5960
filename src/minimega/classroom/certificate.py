"""The printable certificate: an HTML page and an SVG image, each with a QR code to the verify URL.

Both are views of the signed credential, not the credential: they carry the verification code and
a QR code so that a reader of the paper goes to ``/verify/?c=CODE`` and sees the signed claims. The
SVG also *bakes* the credential (Open Badges 3.0 §5.3: an ``openbadges:credential`` element holding
the JSON), so the image file alone can be verified. Every claim is escaped: names are learner input.
"""
from __future__ import annotations

import json
from html import escape

import segno

from .credential import claims_of

W, H = 1100, 780


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
    path, _ = qr_path(verify_url, 180)
    desc = "".join(f'<tspan x="{W/2}" dy="24">{escape(line)}</tspan>' for line in _wrap(c["achievement"] or "", 70))
    baked = json.dumps(doc, ensure_ascii=False, indent=1).replace("]]>", "]]]]><![CDATA[>")
    return f"""<svg xmlns="http://www.w3.org/2000/svg" xmlns:openbadges="https://purl.imsglobal.org/ob/v3p0" viewBox="0 0 {W} {H}" width="{W}" height="{H}" role="img" aria-label="Certificate for {escape(c['name'] or '')}">
<openbadges:credential><![CDATA[{baked}]]></openbadges:credential>
<rect x="0" y="0" width="{W}" height="{H}" fill="#fbfaf7"/>
<rect x="24" y="24" width="{W-48}" height="{H-48}" fill="none" stroke="#3f51b5" stroke-width="3"/>
<g font-family="Georgia, 'DejaVu Serif', serif" text-anchor="middle" fill="#1d1d1f">
<text x="{W/2}" y="120" font-size="22" letter-spacing="6">CERTIFICATE OF COMPLETION</text>
<text x="{W/2}" y="190" font-size="18">This certifies that</text>
<text x="{W/2}" y="260" font-size="48" font-weight="bold">{escape(c['name'] or '')}</text>
<text x="{W/2}" y="320" font-size="18">passed the graded exam of</text>
<text x="{W/2}" y="340" font-size="26" font-weight="bold">{desc}</text>
<text x="{W/2}" y="440" font-size="16">Course version {escape(str(c['course_version']))} · issued {escape(str(c['valid_from'])[:10])} by {escape(str(c['issuer_name']))}</text>
</g>
<g font-family="'DejaVu Sans Mono', monospace" fill="#1d1d1f" font-size="16">
<text x="60" y="600">Verification code</text>
<text x="60" y="632" font-size="26" font-weight="bold">{escape(code)}</text>
<text x="60" y="670" font-size="13">{escape(verify_url)}</text>
<text x="60" y="694" font-size="11">Issuer {escape(str(c['issuer_id'])[:90])}</text>
</g>
<g transform="translate({W-240},{H-240})"><rect width="180" height="180" fill="#fff"/><path d="{path}" fill="#000"/></g>
</svg>
"""


def html(doc: dict, code: str, verify_url: str) -> str:
    c = claims_of(doc)
    path, _ = qr_path(verify_url, 160)
    rows = [("Name", c["name"]), ("Achievement", c["achievement"]), ("Course version", c["course_version"]),
            ("Issued", c["valid_from"]), ("Issuer", f"{c['issuer_name']} ({c['issuer_id']})"),
            ("Credential", c["credential_id"]), ("Verification code", code)]
    table = "".join(f"<tr><th scope=row>{escape(k)}</th><td>{escape(str(v))}</td></tr>" for k, v in rows)
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>Certificate · {escape(c['name'] or '')}</title>
<meta name="viewport" content="width=device-width, initial-scale=1">
<style>
body{{font-family:Georgia,'DejaVu Serif',serif;margin:0;background:#eee;color:#1d1d1f}}
main{{max-width:900px;margin:2rem auto;background:#fbfaf7;border:3px solid #3f51b5;padding:3rem}}
h1{{font-size:1.2rem;letter-spacing:.3em;text-align:center;font-weight:normal}}
.name{{font-size:2.6rem;text-align:center;margin:1.5rem 0}} .ach{{font-size:1.4rem;text-align:center}}
table{{margin-top:2rem;border-collapse:collapse;font-family:system-ui,sans-serif;font-size:.9rem}}
th{{text-align:left;padding:.2rem 1rem .2rem 0;font-weight:600}} td{{padding:.2rem 0;word-break:break-all}}
.foot{{display:flex;justify-content:space-between;align-items:flex-end;gap:2rem}}
.actions{{font-family:system-ui,sans-serif;text-align:center;margin:1rem}}
@media print{{body{{background:#fff}} main{{margin:0;border-width:2px}} .actions{{display:none}}}}
</style></head><body>
<main>
<h1>CERTIFICATE OF COMPLETION</h1>
<p style="text-align:center">This certifies that</p>
<p class="name">{escape(c['name'] or '')}</p>
<p style="text-align:center">passed the graded exam of</p>
<p class="ach">{escape(c['achievement'] or '')}</p>
<div class="foot">
<table>{table}</table>
<figure style="margin:0;text-align:center"><svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 160 160" width="160" height="160" role="img" aria-label="QR code to {escape(verify_url)}"><rect width="160" height="160" fill="#fff"/><path d="{path}"/></svg>
<figcaption style="font-family:system-ui,sans-serif;font-size:.75rem">Scan to verify</figcaption></figure>
</div>
<p style="font-family:system-ui,sans-serif;font-size:.8rem">Check it at <a href="{escape(verify_url)}">{escape(verify_url)}</a>:
the verify page checks the issuer's signature and shows the signed claims. This page alone proves nothing.</p>
</main>
<p class="actions"><a href="{escape(verify_url)}">Verify</a> · <a href="{escape(code)}.svg" download>SVG image (with the credential inside)</a> · <a href="/api/v1/credentials/{escape(code)}" download="minimega-credential.json">Credential (JSON)</a></p>
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
