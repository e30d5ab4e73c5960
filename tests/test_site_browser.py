"""The built course site in Debian's chromium, driven by Playwright: quizzes by keyboard, the
calculator, figures, theme, and no request leaving 127.0.0.1. Screenshots land in build/screenshots/.
"""
import re
import time
from pathlib import Path

import pytest

from minimega import estimate as est

pytestmark = pytest.mark.browser

ROOT = Path(__file__).resolve().parents[1]
CHROMIUM = "/usr/bin/chromium"
SHOTS = ROOT / "build" / "screenshots"

if not Path(CHROMIUM).exists():
    pytest.skip("needs Debian chromium at /usr/bin/chromium", allow_module_level=True)
sync_api = pytest.importorskip("playwright.sync_api")


@pytest.fixture(scope="module")
def server(site_server):
    return site_server


@pytest.fixture(scope="module")
def browser(chromium):
    return chromium


class Watch:
    """Console errors, page errors and every request that leaves the local server."""

    def __init__(self, page, base):
        self.errors, self.outside = [], []
        page.on("console", lambda m: m.type == "error" and self.errors.append(m.text))
        page.on("pageerror", lambda e: self.errors.append(str(e)))
        page.on("request", lambda r: r.url.startswith(base) or r.url.startswith("data:")
                or r.url.startswith("blob:") or self.outside.append(r.url))

    def clean(self):
        assert self.errors == [], self.errors
        assert self.outside == [], self.outside


def _page(browser, base, scheme="light"):
    ctx = browser.new_context(viewport={"width": 1280, "height": 900}, color_scheme=scheme)
    page = ctx.new_page()
    return ctx, page, Watch(page, base)


def _status(page, item):
    return page.locator(f"#q-03-zero-{item} .mm-feedback[role=status]")


def test_quiz_by_keyboard_with_feedback_and_progress(server, browser):
    ctx, page, watch = _page(browser, server)
    page.goto(f"{server}/03-zero/")
    radio = page.locator("#q-03-zero-faq-zero-stage-saves-most-0")   # "Stage 3", the right option
    radio.focus()
    page.keyboard.press("Space")
    page.keyboard.press("Tab")                                       # leaves the radio group: the Check button
    assert page.evaluate("document.activeElement.textContent") == "Check"
    page.keyboard.press("Enter")
    status = _status(page, "faq-zero-stage-saves-most")
    assert status.inner_text().startswith("Correct.")
    assert "all 16 bytes per parameter divide" in status.inner_text()
    assert status.get_attribute("aria-live") == "polite"

    page.keyboard.press("Shift+Tab")                                 # back into the group, on the checked radio
    page.keyboard.press("ArrowDown")                                 # moves the choice to the next option shown
    page.keyboard.press("Tab")
    page.keyboard.press("Enter")
    assert status.inner_text().startswith("Not correct yet.")
    picked = page.locator("#q-03-zero-faq-zero-stage-saves-most input:checked")
    label = page.locator(f"label[for='{picked.get_attribute('id')}']").inner_text()
    assert label != "Stage 3" and f"{label}: " in status.inner_text()

    page.locator("#q-03-zero-fig1-stage2-in").focus()
    page.keyboard.type("16.6")
    page.keyboard.press("Enter")                                     # submits the form from the text field
    assert _status(page, "fig1-stage2").inner_text().startswith("Correct.")
    progress = page.locator(".mm-progress")
    assert "Answered correctly: 1 of 9 (2 tried)" in progress.inner_text()

    page.reload()                                                    # progress survives in localStorage
    assert "Answered correctly: 1 of 9 (2 tried)" in page.locator(".mm-progress").inner_text()
    assert page.locator("#q-03-zero-fig1-stage2-in").input_value() == "16.6"
    page.locator(".mm-reset").focus()
    page.keyboard.press("Enter")
    assert "Answered correctly: 0 of 9 (0 tried)" in page.locator(".mm-progress").inner_text()
    assert page.evaluate("localStorage.getItem('minimega.quiz.v1')") == "{}"
    watch.clean()
    ctx.close()


def test_a_link_opens_a_chapter_whose_scripts_run(server, browser):
    ctx, page, watch = _page(browser, server)
    page.goto(f"{server}/")
    page.locator("article a[href$='08-pipeline-parallel/']").first.click()
    page.wait_for_url(re.compile(re.escape(f"{server}/08-pipeline-parallel/") + r"(#.*)?$"))
    page.wait_for_selector(".mm-quiz[data-ready='1']")
    assert page.locator(".katex").count() > 10                       # typeset when the site was built
    assert page.locator("article .arithmatex:not([data-typeset])").count() == 0
    page.locator("#fig-bubble-vs-microbatches").scroll_into_view_if_needed()    # a frame loads near the screen
    frame = page.frame_locator("#fig-bubble-vs-microbatches iframe")
    frame.locator(".main-svg").first.wait_for()
    watch.clean()
    ctx.close()


def test_a_link_opens_the_calculator_and_it_runs(server, browser):
    ctx, page, watch = _page(browser, server)
    page.goto(f"{server}/")
    page.locator("article a[href$='calculator/']").first.click()
    page.wait_for_url(re.compile(re.escape(f"{server}/calculator/") + r"(#.*)?$"))
    page.wait_for_function("(document.querySelector('.mm-calc-status')?.textContent ?? '').startsWith('Total per GPU')")
    watch.clean()
    ctx.close()


def test_calculator_updates_and_matches_python(server, browser):
    ctx, page, watch = _page(browser, server)
    page.goto(f"{server}/calculator/")
    page.wait_for_function("document.getElementById('mm-calc-plot').data !== undefined")
    page.select_option("select[name=preset]", "bloom-176b")
    cfg = dict(est.PRESETS["bloom-176b"])
    py = est.memory_per_gpu(est.MemoryConfig(**cfg))
    status = page.locator(".mm-calc-status")
    assert f"Total per GPU: {py['total'] / 1e9:.2f} GB" in status.inner_text()
    before = page.evaluate("document.getElementById('mm-calc-plot').data[4].y")   # activations per stage

    page.fill("input[name=micro_batch]", "1")                         # fires input: the plot must follow
    page.wait_for_function(f"document.getElementById('mm-calc-plot').data[4].y[1] !== {before[1]}")
    after = page.evaluate("document.getElementById('mm-calc-plot').data[4].y")
    py1 = est.memory_per_gpu(est.MemoryConfig(**{**cfg, "micro_batch": 1}))
    assert after[1] == pytest.approx(py1["activations"] / 1e9, rel=1e-9)
    assert page.locator("select[name=preset]").input_value() == "custom"
    assert f"Total per GPU: {py1['total'] / 1e9:.2f} GB" in status.inner_text()

    page.select_option("select[name=attention]", "fused")             # context parallelism: s/cp tokens per GPU
    page.fill("input[name=cp]", "4")
    py4 = est.memory_per_gpu(est.MemoryConfig(**{**cfg, "micro_batch": 1, "attention": "fused", "cp": 4}))
    page.wait_for_function("t => document.querySelector('.mm-calc-status').innerText.includes(t)",
                           arg=f"Total per GPU: {py4['total'] / 1e9:.2f} GB")
    page.select_option("select[name=recompute]", "none")             # Ulysses keeps one more activation per layer
    page.select_option("select[name=cp_attention]", "ulysses")
    shown = {a: est.memory_per_gpu(est.MemoryConfig(**{**cfg, "micro_batch": 1, "attention": "fused", "cp": 4,
                                                      "recompute": "none", "cp_attention": a}))["total"] / 1e9
             for a in ("ring", "ulysses")}
    assert f"{shown['ulysses']:.2f}" != f"{shown['ring']:.2f}"
    page.wait_for_function("t => document.querySelector('.mm-calc-status').innerText.includes(t)",
                           arg=f"Total per GPU: {shown['ulysses']:.2f} GB")
    page.select_option("select[name=cp_attention]", "ring")
    page.select_option("select[name=recompute]", "full")
    page.fill("input[name=cp]", "3")                                  # 2048 tokens do not split into 6 chunks
    assert "Cannot compute" in status.inner_text()
    page.fill("input[name=cp]", "1")
    page.select_option("select[name=attention]", "unfused")          # back to the micro-batch-1 layout above

    page.fill("input[name=tp]", "3")                                  # 112 heads do not split 3 ways
    assert "Cannot compute" in status.inner_text() and "tp must divide heads" in status.inner_text()
    # nothing from the last valid input stays next to the error: no table rows, no chart
    assert page.locator(".mm-calc-table tbody tr").count() == 0
    assert page.evaluate("document.getElementById('mm-calc-plot').data === undefined")
    assert page.locator("#mm-calc-plot .main-svg").count() == 0
    page.fill("input[name=tp]", "4")                                  # valid again: both come back
    page.wait_for_function("(document.getElementById('mm-calc-plot').data || []).length === 6")
    assert page.locator(".mm-calc-table tbody tr").count() == 8
    assert f"Total per GPU: {py1['total'] / 1e9:.2f} GB" in status.inner_text()
    watch.clean()
    ctx.close()


def test_step_time_panel_and_planner_match_python(server, browser):
    from minimega.analysis import perf, plan as perf_plan
    ctx, page, watch = _page(browser, server)
    page.goto(f"{server}/calculator/")
    page.wait_for_function("document.getElementById('mm-calc-plot').data !== undefined")
    page.select_option("select[name=preset]", "bloom-176b")
    page.select_option("#mm-perf select[name=stack]", "megatron-deepspeed")
    page.uncheck("#mm-perf input[name=dropout]")
    py = perf.step_time(perf.preset_config("bloom-176b"), "a100-80gb")
    status = page.locator(".mm-perf-status")
    assert f"{py['tflops_per_gpu']:.1f} TFLOP/s per GPU" in status.inner_text()
    page.check("#mm-perf input[name=full_only]")
    page.click("#mm-perf button[type=submit]")
    page.wait_for_function("document.querySelectorAll('.mm-plan-table tbody tr').length === 10")
    plan = perf_plan.plan(perf_plan.preset_shape("bloom-176b"), 384, 2048, "a100-80gb", recompute=("full",))
    first = page.locator(".mm-plan-table tbody tr").first.locator("td").nth(1).inner_text()
    assert first == plan["top"][0]["layout"]
    legend = page.locator(".mm-plan-table + .mm-plan-legend")                 # the CLI's legend, under the table
    assert legend.is_visible() and all(code in legend.inner_text() for code in ("dpN-tpN-ppN", "zK", "bN", "sp"))
    look = "f => { const s = getComputedStyle(document.querySelector(f)); return [s.display, s.gridTemplateColumns]; }"
    assert page.evaluate(look, "#mm-perf form") == page.evaluate(look, "#mm-calculator form")   # styled alike
    label = "f => getComputedStyle(document.querySelector(f + ' label')).fontSize"
    assert page.evaluate(label, "#mm-perf form") == page.evaluate(label, "#mm-calculator form")
    page.select_option("select[name=preset]", "llama3-8b")                      # its preset: N_d = 1
    calc = page.locator(".mm-calc-status")
    assert "With N_d = 1 (dp × cp = 1) every ZeRO stage holds the same bytes" in calc.inner_text()
    page.uncheck("#mm-perf input[name=full_only]")
    page.fill("#mm-perf input[name=gpus]", "384")
    plan_status = page.locator(".mm-plan-status")
    t0 = time.perf_counter()
    page.click("#mm-perf button[type=submit]")                                  # Llama 3 8B on 384 GPUs
    page.wait_for_function("document.querySelector('.mm-plan-status').textContent.includes('840 layouts searched')",
                           timeout=30_000)
    took = time.perf_counter() - t0
    print(f"planner, Llama 3 8B on 384 GPUs in chromium: {took:.2f} s; {plan_status.inner_text()}")
    assert took < 3.0, took
    page.fill("#mm-calculator input[name=dp]", "2")
    page.dispatch_event("#mm-calculator input[name=dp]", "input")
    assert "N_d = 1" not in calc.inner_text()                                   # the hint goes with its reason
    watch.clean()
    ctx.close()



def test_how_often_to_save_matches_python(server, browser):
    """The calculator page's goodput table: Young's interval for Llama 3's failure rate, then for 1,024 GPUs and a
    5 s save (an asynchronous save's copy), then with its 60 s write to durable, each number Python's; a bad input is named, not a blank."""
    from minimega import analysis as g
    ctx, page, watch = _page(browser, server)
    page.goto(f"{server}/calculator/")
    rows = page.locator(".mm-goodput-table tbody tr")
    page.wait_for_function("document.querySelectorAll('.mm-goodput-table tbody tr').length === 6")

    def shown(gpus, save, restart, durable=0.0):
        mtbf = 3600 * g.mtbf_hours(gpus)
        tau = g.young_daly_interval(save, mtbf, durable)
        want = [f"{g.failures_per_day(gpus):,.2f}", f"{mtbf / 3600:,.2f}", f"{tau / 60:,.1f}",
                f"{g.lost_per_failure(tau, restart, durable) / 60:,.1f}",
                f"{100 * g.checkpoint_waste(tau, save, mtbf, restart, durable):,.2f}",
                f"{100 * g.goodput(tau, save, mtbf, restart, durable):,.2f}"]
        page.wait_for_function("v => document.querySelectorAll('.mm-goodput-table tbody tr td:last-child')[2]"
                               "?.textContent === v", arg=want[2])
        assert [rows.nth(i).locator("td").last.inner_text() for i in range(6)] == want

    shown(16384, 60.0, 600.0)
    page.fill("#mm-goodput input[name=gpus]", "1024")
    page.fill("#mm-goodput input[name=save_s]", "5")
    shown(1024, 5.0, 600.0)
    page.fill("#mm-goodput input[name=durable_s]", "60")    # an asynchronous save: 5 s copy, 60 s to durable
    shown(1024, 5.0, 600.0, 60.0)
    page.fill("#mm-goodput input[name=gpus]", "0")
    page.wait_for_function("document.querySelector('.mm-goodput-status').textContent.includes('gpus must be')")
    page.goto(f"{server}/nl/calculator/")                  # the Dutch page: its labels, a decimal comma
    tau = g.young_daly_interval(60.0, 3600 * g.mtbf_hours(16384)) / 60
    page.wait_for_function("v => document.querySelectorAll('.mm-goodput-table tbody tr td:last-child')[2]"
                           "?.textContent === v", arg=f"{tau:.1f}".replace(".", ","))
    assert rows.nth(2).locator("td").first.inner_text() == "opslaan elke (min werk)"
    watch.clean()
    ctx.close()

def test_nvme_and_fp8_on_the_calculator_match_python(server, browser):
    """The states on NVMe: the table gains an "on NVMe" row and the time panel its disk part; fp8: refused on an
    A100 by name, timed on an H100; each number Python's."""
    from minimega.analysis import perf
    ctx, page, watch = _page(browser, server)
    page.goto(f"{server}/calculator/")
    page.wait_for_function("document.getElementById('mm-calc-plot').data !== undefined")
    page.select_option("select[name=preset]", "zero-7.5b")
    cfg = {**est.PRESETS["zero-7.5b"], "zero_stage": 3, "offload": "optimizer", "offload_device": "nvme"}
    page.select_option("select[name=zero_stage]", "3")
    page.select_option("select[name=offload]", "optimizer")
    page.select_option("select[name=offload_device]", "nvme")
    py = est.memory_per_gpu(est.MemoryConfig(**cfg))
    row = page.locator(".mm-calc-table tbody tr").last
    assert row.locator("th").inner_text() == "on NVMe (offload)"
    assert row.locator("td").inner_text() == f"{py['nvme'] / 1e9:.2f}"
    page.select_option("#mm-perf select[name=gpu]", "h100")
    t = perf.step_time(perf.PerfConfig(**cfg, global_batch=64), "h100")
    assert t["disk"] > 0
    page.wait_for_function("t => document.querySelector('.mm-perf-status').innerText.includes(t)",
                           arg=f"on 64 GPUs: {t['total']:.2f} s per step")
    disk = page.locator(".mm-perf-table tbody tr", has_text="NVMe reads and writes").locator("td").inner_text()
    assert disk == f"{t['disk']:.3f}"

    page.select_option("select[name=precision]", "fp8")
    page.select_option("#mm-perf select[name=gpu]", "a100-80gb")
    page.wait_for_function("document.querySelector('.mm-perf-status').innerText.includes('no fp8 tensor cores')")
    page.select_option("#mm-perf select[name=gpu]", "h100")
    t8 = perf.step_time(perf.PerfConfig(**{**cfg, "precision": "fp8"}, global_batch=64), "h100")
    page.wait_for_function("t => document.querySelector('.mm-perf-status').innerText.includes(t)",
                           arg=f"on 64 GPUs: {t8['total']:.2f} s per step")
    watch.clean()
    ctx.close()


@pytest.mark.parametrize("scheme", ["light", "dark"])
def test_screenshots_and_theme(server, browser, scheme):
    SHOTS.mkdir(parents=True, exist_ok=True)
    ctx, page, watch = _page(browser, server, scheme)
    for slug, name in (("", "home"), ("03-zero/", "zero"), ("calculator/", "calculator")):
        page.goto(f"{server}/{slug}")
        expected = "slate" if scheme == "dark" else "default"
        assert page.evaluate("document.body.getAttribute('data-md-color-scheme')") == expected
        if name == "calculator":
            page.wait_for_function("document.getElementById('mm-calc-plot').data !== undefined")
        else:
            page.locator("#fig-zero-breakdown").scroll_into_view_if_needed()
            frame = page.frame_locator("#fig-zero-breakdown iframe")
            frame.locator(".main-svg").first.wait_for()
            # the figure follows the page's scheme: light text on dark, dark text on light
            color = frame.locator(".gtitle").first.evaluate("e => getComputedStyle(e).fill")
            assert color == ("rgb(227, 229, 234)" if scheme == "dark" else "rgb(31, 36, 48)")
        page.screenshot(path=str(SHOTS / f"{name}-{scheme}.png"), full_page=name == "calculator")
    watch.clean()
    ctx.close()
