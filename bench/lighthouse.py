"""Lighthouse 12.2.3 (mobile: Moto G Power viewport, simulated slow 4G and 4x CPU slowdown, its defaults) on the
home page, chapter 3 and the calculator, served the way learners get them: by `minimega serve`'s app (the site's
files gzipped, `minimega.classroom.service`). Records each page's performance and accessibility scores, its
page weight (Lighthouse's total-byte-weight: bytes on the wire) and its paint and blocking times; then every
chapter page's transfer size in chromium at the same viewport (the budget: under 1.5 MB each), English and Dutch.

    npm i -E --prefix bench/.lighthouse lighthouse@12.2.3       # once; bench/.lighthouse is not committed
    python bench/lighthouse.py [--site DIR] [--out bench/lighthouse.json] [--runs 3]

Without --site the course is built first (mkdocs build --strict into a temporary folder). Not part of `make test`.
Each page is measured --runs times (a score moves by a few points between runs on the same machine); the table shows
the run with the median performance score and lists every run's.
Writes the JSON and a markdown table beside it (bench/lighthouse.md).
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LIGHTHOUSE = ROOT / "bench" / ".lighthouse" / "node_modules" / "lighthouse" / "cli" / "index.js"
CHROMIUM = os.environ.get("CHROME_PATH", "/usr/bin/chromium")
PAGES = {"home": "/", "chapter 3": "/03-zero/", "calculator": "/calculator/"}
BUDGET = 1.5e6                         # bytes a chapter page may move over the wire
METRICS = ("first-contentful-paint", "largest-contentful-paint", "total-blocking-time", "cumulative-layout-shift",
           "speed-index", "total-byte-weight")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def build(out: Path) -> None:
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1", "PYTHONPATH": str(ROOT / "src")}
    subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-q", "-d", str(out)], cwd=ROOT, env=env,
                   check=True, timeout=900)


def serve(site: Path, var: Path):
    """`minimega serve`'s app on the site, development mode, on a thread; returns (base, server)."""
    import uvicorn
    from minimega.classroom.service import create_app
    from minimega.classroom.settings import ClassroomConfig

    port = free_port()
    base = f"http://127.0.0.1:{port}"
    app = create_app(ClassroomConfig(var_dir=var, site_dir=site, base_url=base, dev=True, allow_sample_bank=True,
                                     banks_dir=ROOT / "quizzes" / "exam"))
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    threading.Thread(target=server.run, daemon=True).start()
    for _ in range(400):
        if server.started:
            return base, server
        time.sleep(0.05)
    raise SystemExit("the service did not start in 20 s")


def lighthouse(url: str, out: Path) -> dict:
    if not LIGHTHOUSE.exists():
        raise SystemExit(f"{LIGHTHOUSE} is missing: npm i -E --prefix bench/.lighthouse lighthouse@12.2.3")
    cmd = ["node", str(LIGHTHOUSE), url, "--quiet", "--output=json", f"--output-path={out}",
           "--only-categories=performance,accessibility",
           "--chrome-flags=--headless=new --no-sandbox --disable-gpu --disable-dev-shm-usage"]
    subprocess.run(cmd, check=True, timeout=600, env={**os.environ, "CHROME_PATH": CHROMIUM})
    lhr = json.loads(out.read_text())
    audits = lhr["audits"]
    failed = sorted(a["id"] for a in audits.values()
                    if a.get("scoreDisplayMode") == "binary" and a.get("score") == 0
                    and a["id"] in {r["id"] for r in lhr["categories"]["accessibility"]["auditRefs"]})
    return {"url": url, "lighthouse": lhr["lighthouseVersion"], "form_factor": lhr["configSettings"]["formFactor"],
            "performance": round(lhr["categories"]["performance"]["score"] * 100),
            "accessibility": round(lhr["categories"]["accessibility"]["score"] * 100),
            "accessibility_failed": failed,
            **{m: round(audits[m]["numericValue"], 3) for m in METRICS}}


def median_run(url: str, out: Path, runs: int) -> dict:
    """The run with the median performance score of `runs` (an odd count gives a run that happened), with every
    run's score under "runs", in the order they ran."""
    if runs < 1:
        raise SystemExit(f"--runs {runs}: give at least 1")
    done = [lighthouse(url, out) for _ in range(runs)]
    median = sorted(done, key=lambda r: r["performance"])[(runs - 1) // 2]
    return {**median, "runs": [r["performance"] for r in done]}


def transfer_sizes(base: str, paths: list[str]) -> dict[str, int]:
    """Bytes on the wire (headers + encoded bodies) for each page's load in chromium, mobile viewport, until the
    network is idle: what the page pulls in by itself (lazy figures below the fold stay unloaded, as for a reader
    who has not scrolled)."""
    from playwright.sync_api import sync_playwright

    sizes = {}
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox", "--disable-gpu"])
        for path in paths:
            ctx = browser.new_context(viewport={"width": 412, "height": 823}, is_mobile=True, device_scale_factor=1.75)
            page = ctx.new_page()
            got = []
            page.on("requestfinished", lambda r: got.append(r.sizes()))
            page.goto(base + path, wait_until="networkidle")
            sizes[path] = sum(s["responseBodySize"] + s["responseHeadersSize"] for s in got)
            ctx.close()
        browser.close()
    return sizes


def markdown(result: dict) -> str:
    rows = ["| page | performance (median; every run) | accessibility | page weight (kB) | FCP (s) | LCP (s) | TBT (ms) | CLS |",
            "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for name, r in result["lighthouse"].items():
        runs = ", ".join(str(s) for s in r.get("runs", [r["performance"]]))
        rows.append(f"| {name} | {r['performance']} ({runs}) | {r['accessibility']} | {r['total-byte-weight'] / 1e3:.0f} | "
                    f"{r['first-contentful-paint'] / 1e3:.2f} | {r['largest-contentful-paint'] / 1e3:.2f} | "
                    f"{r['total-blocking-time']:.0f} | {r['cumulative-layout-shift']:.3f} |")
    sizes = result["chapter_transfer_bytes"]
    worst = max(sizes, key=sizes.get)
    return (f"# Lighthouse, mobile\n\n`python bench/lighthouse.py` ({result['when']}, {result['machine']}): Lighthouse "
            f"{next(iter(result['lighthouse'].values()))['lighthouse']} with its mobile defaults (simulated slow 4G, "
            "4x CPU slowdown), Debian's chromium, the site served by `minimega serve`'s app (its files gzipped).\n\n"
            + "\n".join(rows) + "\n\n"
            f"Every chapter page's transfer size in chromium (412 px, until the network is idle), English and Dutch: "
            f"at most {sizes[worst] / 1e6:.2f} MB ({worst}), budget {BUDGET / 1e6:.1f} MB; "
            f"median {sorted(sizes.values())[len(sizes) // 2] / 1e6:.2f} MB.\n")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--site", type=Path, help="a built site (default: build one)")
    ap.add_argument("--out", type=Path, default=ROOT / "bench" / "lighthouse.json")
    ap.add_argument("--runs", type=int, default=3, help="Lighthouse runs per page (the median is reported)")
    args = ap.parse_args(argv)
    sys.path.insert(0, str(ROOT / "src"))
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        site = args.site
        if site is None:
            site = tmp / "site"
            build(site)
        base, server = serve(site, tmp / "var")
        try:
            result = {"when": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
                      "machine": f"{platform.machine()}, {os.cpu_count()} cores, load {os.getloadavg()[0]:.1f}",
                      "lighthouse": {name: median_run(base + path, tmp / f"lh-{k}.json", args.runs)
                                     for k, (name, path) in enumerate(PAGES.items())}}
            chapters = sorted(p.parent.name for p in site.glob("[0-9][0-9]-*/index.html"))
            paths = [f"{lang}{c}/" for lang in ("/", "/nl/") for c in chapters]
            result["chapter_transfer_bytes"] = transfer_sizes(base, paths)
        finally:
            server.should_exit = True
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    args.out.with_suffix(".md").write_text(markdown(result))
    print(markdown(result))
    over = {p: b for p, b in result["chapter_transfer_bytes"].items() if b > BUDGET}
    low = {n: (r["performance"], r["accessibility"]) for n, r in result["lighthouse"].items()
           if r["performance"] < 90 or r["accessibility"] < 100}
    if over or low:
        print(f"over budget: {over}; below performance 90 or accessibility 100: {low}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
