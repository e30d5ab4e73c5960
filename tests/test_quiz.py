"""The quiz bank schema: loading, validation errors that name the item, grading."""
import math

import pytest

from minimega.classroom.quiz import QuizError, grade, load_bank

GOOD = """
chapter: 1
title: Memory
items:
  - id: states
    type: single
    question: Which holds the most bytes under mixed-precision Adam?
    choices:
      - {text: Optimizer states, correct: true, explain: "12 bytes per parameter (fp32 master, m and v)."}
      - {text: Parameters, correct: false, explain: 2 bytes per parameter in fp16.}
  - id: pick
    type: multiple
    question: Which does ZeRO-2 shard?
    choices:
      - {text: Gradients, correct: true, explain: Stage 2 adds gradients.}
      - {text: Optimizer states, correct: true, explain: Stage 1 already shards them.}
      - {text: Parameters, correct: false, explain: That is stage 3.}
  - id: bytes
    type: numeric
    question: Bytes per parameter for mixed-precision Adam?
    answer: 16
    tolerance: 0.01
    unit: bytes
    explain: 2 + 2 + 12.
"""


def test_load_and_grade(tmp_path):
    path = tmp_path / "01-memory.yaml"
    path.write_text(GOOD)
    bank = load_bank(path)
    single, multiple, numeric = bank.items
    assert grade(single, 0).correct and not grade(single, 1).correct
    assert grade(single, 1).feedback == ("2 bytes per parameter in fp16.",)
    assert grade(multiple, [0, 1]).correct and not grade(multiple, [0]).correct
    assert grade(numeric, 16.1).correct and not grade(numeric, 17).correct
    assert not grade(numeric, "sixteen").correct and not grade(single, 7).correct


@pytest.mark.parametrize("edit, message", [
    (lambda s: s.replace("correct: true, explain: \"12", "correct: false, explain: \"12"), "exactly 1 correct choice, has 0"),
    (lambda s: s.replace("explain: 2 bytes per parameter in fp16.", "explain: ''"), "'explain' non-empty"),
    (lambda s: s.replace("type: numeric", "type: essay"), "type 'essay' is not one of"),
    (lambda s: s.replace("id: pick", "id: states"), r"duplicate item ids \['states'\]"),
    (lambda s: s.replace("tolerance: 0.01", "tolerance: 5"), "'tolerance' is relative"),
])
def test_schema_errors_name_the_item(tmp_path, edit, message):
    path = tmp_path / "bad.yaml"
    path.write_text(edit(GOOD))
    with pytest.raises(QuizError, match=message):
        load_bank(path)


# --- parametric items and precision ------------------------------------------------------------

import random  # noqa: E402
import re  # noqa: E402
from pathlib import Path  # noqa: E402

from minimega.classroom.quiz import draw_params, instantiate, load_banks, numeric_ok, round_sig  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
EXAM = ROOT / "quizzes" / "exam"

TEMPLATE = """
chapter: 3
title: ZeRO
items:
  - id: zero-stage
    type: numeric
    params:
      psi: [2, 13]
      nd: {from: 8, to: 32, step: 8}
      stage: [1, 3]
    given: {total: "psi * nd"}
    question: "Psi = {psi}B on N_d = {nd} GPUs ({total} B-GPUs), stage {stage}: GB per GPU?"
    formula: model_state_bytes(psi * 1e9, nd, stage) / GB
    tolerance: 0.01
    sig: 2
    unit: GB
    explain: "stage {stage}: {answer} GB"
"""


def test_template_draws_instantiates_and_grades(tmp_path):
    path = tmp_path / "t.yaml"
    path.write_text(TEMPLATE)
    (item,) = load_bank(path).items
    assert item.parametric and item.params["nd"] == (8.0, 16.0, 24.0, 32.0)
    concrete = instantiate(item, {"psi": 13, "nd": 16, "stage": 3})
    assert concrete.answer == pytest.approx(16 * 13e9 / 16 / 1e9)            # (2 + 2 + 12)Ψ/N_d, by hand
    assert concrete.question == "Psi = 13B on N_d = 16 GPUs (208 B-GPUs), stage 3: GB per GPU?"
    assert concrete.prompt.endswith("Answer in GB to 2 significant figures; answers within 1% of the exact value are accepted.")
    assert concrete.explain == "stage 3: 13 GB"
    assert grade(concrete, 13.1).correct and not grade(concrete, 13.2).correct
    seen = {tuple(draw_params(item, random.Random(s)).values()) for s in range(200)}
    assert len(seen) == 2 * 4 * 2                                              # every combination reachable
    with pytest.raises(ValueError, match="not one of"):
        instantiate(item, {"psi": 7.5, "nd": 16, "stage": 3})                 # a stored draw is re-checked
    with pytest.raises(ValueError, match="template"):
        grade(item, 13)


@pytest.mark.parametrize("edit, message", [
    (lambda s: s.replace("    formula: model_state_bytes(psi * 1e9, nd, stage) / GB\n", ""), "needs a 'formula'"),
    (lambda s: s.replace("{psi}B", "{psy}B"), "does not instantiate: KeyError"),
    (lambda s: s.replace("stage: [1, 3]", "stage: [1, 1]"), "repeated parameter values"),
    (lambda s: s.replace("stage: [1, 3]", "GB: [1, 3]"), "shadow estimator names"),
    (lambda s: s.replace("sig: 2", "sig: 9"), "significant figures"),
    (lambda s: s.replace("tolerance: 0.01", "tolerance: 0.01\n    answer: 3"), "drop 'answer'"),
])
def test_template_errors_name_the_item(tmp_path, edit, message):
    path = tmp_path / "bad.yaml"
    path.write_text(edit(TEMPLATE))
    with pytest.raises(QuizError, match=message):
        load_bank(path)


def test_the_value_the_course_prints_is_accepted():
    """ZeRO Figure 1 prints 1.875 GB as 1.9: two significant figures must pass even outside a 1% band."""
    from minimega.classroom.quiz import Item
    item = Item(id="z3", type="numeric", question="?", answer=1.875, tolerance=0.01, sig=2, unit="GB", explain="x")
    assert numeric_ok(item, 1.9) and numeric_ok(item, 1.875) and numeric_ok(item, 1.88)
    assert not numeric_ok(item, 1.8) and not numeric_ok(item, 2.0)
    assert round_sig(1.875, 3) == 1.88 and round_sig(31.40625, 3) == 31.4 and round_sig(0.2727, 2) == 0.27


# --- the exam banks -------------------------------------------------------------------------------

def exam_items():
    return [(b, it) for b in load_banks(EXAM) for it in b.items]


def test_every_exam_numeric_item_is_parametric_and_states_its_precision():
    numeric = [it for _, it in exam_items() if it.type == "numeric"]
    assert numeric and all(it.parametric for it in numeric)
    rng = random.Random(0)
    for it in numeric:
        for _ in range(30):
            concrete = instantiate(it, draw_params(it, rng))
            assert "significant figures" in concrete.prompt and ("accepted" in concrete.prompt or "exactly" in concrete.prompt)
            assert "{" not in concrete.question and "{" not in concrete.explain, it.id
            assert numeric_ok(concrete, round_sig(concrete.answer, concrete.sig))
            assert numeric_ok(concrete, float(f"{concrete.answer:.{concrete.sig}g}"))


def test_templates_have_room_against_replay():
    """Each template has at least 200 distinct parameter draws (a replayed answer rarely matches)."""
    for _, it in exam_items():
        if it.parametric:
            assert math.prod(len(v) for v in it.params.values()) >= 200, it.id


# Independent references: each template's answer recomputed from the paper's formula, not from estimate.py.
K = 12
REFERENCE = {
    "ddp-model-states": lambda psi, nd: 16 * psi,
    "attention-term-ratio": lambda s, h, a: 5 * a * s / h,
    "layer-activation-gb": lambda s, b, h, a: s * b * h * (34 + 5 * a * s / h) / 1e9,
    "ring-allreduce-mb": lambda size, n: 2 * (n - 1) / n * size,
    "ddp-step-gb": lambda psi, nd: 2 * (nd - 1) / nd * 2 * psi,
    "allgather-mb": lambda size, n: (n - 1) / n * size,
    "zero-stage-gb": lambda psi, nd, stage: {1: 4 * psi + K * psi / nd, 2: 2 * psi + (2 + K) * psi / nd,
                                             3: (4 + K) * psi / nd}[stage],
    "zero3-step-traffic": lambda psi, nd: 3 * (nd - 1) / nd * 2 * psi,
    "zero3-largest-model": lambda mem, nd: mem * nd / 16,
    "adam-states-gb": lambda psi: 12 * psi,
    "megatron-distopt-gb": lambda psi, d: psi * (2 + 4 + 12 / d),
    "loss-scale-after-overflows": lambda k, o: 2.0 ** k / 2 ** o,
    "offload-optimizer-split": lambda psi, side: 2 * psi if side == 0 else (4 + 12) * psi,   # fp32 grads on the CPU
    "zero3-offload-estimate": lambda psi, layer, g: (4 * layer * 1e6 + 2 * psi * 1e6 / g) / 2 ** 30,
    "zero3-full-offload-cpu": lambda psi: (2 + 4 + 12) * psi,          # chapter 5: 18Ψ with the parameters
    "full-recompute-mb": lambda s, b, h: 2 * s * b * h / 1e6,
    "selective-tp-sp-mb": lambda s, b, h, t: 34 * s * b * h / t / 1e6,
    "recompute-saving-ratio": lambda s, h, a: (34 + 5 * a * s / h) / 2,
    "tp-comm-layer-mb": lambda s, b, h, t: 8 * b * s * h * (t - 1) / t * 2 / 1e6,
    "tp-degree-for-memory": lambda h, layers, budget: next(t for t in (1, 2, 4, 8)
                                                           if 16 * 12 * h * h * layers / t / 1e9 <= budget),
    "tp-activation-mb": lambda s, b, h, a, t: s * b * h * (10 + 24 / t + 5 * a * s / (h * t)) / 1e6,
    "gpipe-bubble-fraction": lambda p, m: (p - 1) / (m + p - 1),
    "bubble-over-ideal": lambda p, m, v: (p - 1) / (v * m),
    "min-microbatches": lambda p, x: math.floor((p - 1) * (100 - x) / x) + 1,
    "dp-for-memory-budget": lambda psi, p, budget: math.ceil(12 * psi / (8 * p) / (budget - 4 * psi / (8 * p)) - 1e-9),
    "pp-depth-for-states": lambda psi, mem, frac: math.ceil(16 * psi / 8 / (mem * frac / 100) - 1e-9),
    "three-d-model-states": lambda psi, t, p, d: (4 * psi / (t * p) + K * psi / (t * p) / d),
    "checkpoint-gb": lambda psi, opt: 14 * psi if opt else 2 * psi,
    "checkpoint-shard-gb": lambda psi, n: 14 * psi / n,
    "checkpoint-seconds": lambda psi, bw: 14 * psi / bw,
    "fsdp-full-shard-gb": lambda psi, n: 16 * psi / n,
    "cp-ring-gb-per-step": lambda layers, s, h, cp, t: layers * (6 * cp - 4) * (s / cp) * (h / t) * 2 / 1e9,
    "cp-fused-layer-mb": lambda s, h, a, t, cp: ((s / cp) * h * (10 + 24 / t) + 4 * a * (s / cp) / t) / 1e6,
    "expert-capacity-slots": lambda t, e, k, cf: min(t, math.ceil(cf * k * t / e)),
    "ep-alltoall-gb-per-step": lambda layers, d, ep, e, b: (4 * layers * (ep - 1) / ep * e * b
                                                           * math.ceil(1.25 * 2 * 4096 / e) * d * 2 / 1e9),
    "hsdp-gb": lambda psi, g, nodes: 16 * psi / g,
    "gathered-block-mb": lambda h, r, k: k * 2 * (4 * h * h + 2 * r * h * h) / 1e6,
    # chapter 12: Narayanan et al. (2021) Eq. 3 and Eq. 4, and GPU-hours x price, written out again
    "log-tflops-per-gpu": lambda b, s, l, h, v, n, x: _per_gpu_tflops(
        96 * b * s * l * h ** 2 * (1 + s / (6 * h) + v / (16 * l * h)), n, x),
    "training-days": lambda psi, tokens, n, x, r: (8 if r else 6) * tokens * psi * 1e18 / (n * x * 1e12) / 86400,
    "run-cost-spares": lambda n, spare, days, price, overhead: (n + spare) * days * 24 * price
                                                               * (1 + overhead / 100) / 1e6,
    # chapter 13: the ring alpha-beta table (Thakur et al. 2005) and Korthikanti App. A's model FLOPs
    "rs-ib-time": lambda size, n, alpha, beta, r: 1e3 * ((n - 1) * alpha * 1e-6 + (n - 1) / n * size / beta),
    "mfu-from-step": lambda k, s, v, b, n, g, x: _mfu_percent(
        (24, 32, 40, 40, 48, 60, 96, 105)[k], (2048, 4096, 5120, 6144, 8192, 10240, 12288, 20480)[k],
        s, v, b, n, 989e12 if g else 312e12, x),
    # chapter 14: B = b * k * dp and N = dp * tp * pp, then the 1F1B bubble (p-1)/m
    "ds-accumulation": lambda nodes, t, b, k: (b * k * 8 * nodes / t) / (b * (8 * nodes / t)),
    "megatron-bubble": lambda d, t, p, b, m: 100 * (p - 1) / ((b * m * d) / (b * (d * t * p / (t * p)))),
    # the frontier topics (issue 46) and chapter 17's blind predictions
    "nvme-io-seconds": lambda psi, nd, stage, bw: 2 * 12 * psi * 1e9 / nd / (bw * 1e9),
    "zb-h1-points-saved": lambda p, m: 100 * ((p - 1) / (m + p - 1) - (p - 1) / (3 * m + p - 1)),
    "async-goodput-days": lambda gpus, days, sb, sa, w: days * (
        math.sqrt(2 * sb / _mtbf_s(gpus)) - math.sqrt(2 * sa / _mtbf_s(gpus)) - w / _mtbf_s(gpus)),
    "shared-expert-flop-share": lambda d, e, k, s, fh: 100 * 2 * round(fh * d) * s / (e + 2 * round(fh * d) * (k + s)),
    "capstone-predict-bubble": lambda p, dp, gb, v: 100 * (p - 1) / (v * gb / dp + p - 1),
    "capstone-predict-gpu-hours": lambda n, tok, t: n * t * (1e12 / (tok * 1e6)) / 3600 / 1e3,
    "capstone-predict-fsdp-states": lambda psi, t, d: 16 * psi * 1e9 / t / d / 1e9,
}


def _per_gpu_tflops(flops, n, x):
    """TFLOP/s per GPU from the log's time, which the question prints to 3 significant figures."""
    seconds = float(f"{flops / (n * x * 1e12):.3g}")
    return flops / seconds / n / 1e12


def _mfu_percent(l, h, s, v, b, n, peak, x):
    """MFU from the step time the question prints (3 significant figures): 72·B·l·s·h²·(1 + s/6h + V/12hl)."""
    flops = 72 * b * l * s * h ** 2 * (1 + s / (6 * h) + v / (12 * h * l))
    seconds = float(f"{flops / (n * peak * x / 100):.3g}")
    return 100 * flops / seconds / n / peak


def _mtbf_s(gpus):
    """Llama 3's rate (419 unexpected interruptions in 54 days on 16,384 GPUs), scaled to `gpus`, in seconds."""
    return 54 * 86400 / 419 * 16384 / gpus


def test_template_answers_match_the_papers_formulas():
    templates = {it.id: it for _, it in exam_items() if it.parametric}
    assert set(REFERENCE) >= set(templates), sorted(set(templates) - set(REFERENCE))
    rng = random.Random(1)
    for item_id, it in templates.items():
        for _ in range(50):
            values = draw_params(it, rng)
            expected = REFERENCE[item_id](**{k: int(v) if v.is_integer() else v for k, v in values.items()})
            assert instantiate(it, values).answer == pytest.approx(expected, rel=1e-9), (item_id, values)


def test_min_microbatches_reference_is_exact():
    """(p-1)/(m+p-1) < x/100 at the smallest m; checked against a brute force on the same inequality."""
    for p in (2, 4, 8, 16):
        for x in (5, 10, 20, 25):
            brute = next(m for m in range(1, 10_000) if (p - 1) * 100 < x * (m + p - 1))
            assert REFERENCE["min-microbatches"](p, x) == brute


def test_a_search_stops_at_its_answer():
    """`first` in a formula: the smallest candidate that satisfies the condition, as ``min`` gives, found without
    testing the rest (each candidate of a bank's search is a memory formula); none is a ValueError, which the bank
    loader reports as a template that does not instantiate."""
    from minimega.classroom.quiz import evaluate, formula_namespace
    tested = []

    def fits(d):
        tested.append(d)
        return 1000 / d <= 7
    ns = {**formula_namespace(), "fits": fits}
    assert eval("first(d for d in range(1, 100000) if fits(d))", {"__builtins__": {}, **ns}) == 143
    assert min(d for d in range(1, 1000) if 1000 / d <= 7) == 143
    assert tested == list(range(1, 144))
    with pytest.raises(ValueError, match="no candidate"):
        evaluate("first(d for d in range(1, 10) if d > 20)")
    assert (evaluate("first(m for m in range(1, 10000) if bubble_fraction(4, m) < 0.1 - 1e-9)")
            == evaluate("min(m for m in range(1, 10000) if bubble_fraction(4, m) < 0.1 - 1e-9)") == 28)


def test_exam_bank_fixes():
    items = {it.id: it for _, it in exam_items()}
    for trivia in ("torchtitan-405b", "full-recompute-overhead", "initial-scale", "deepspeed-18", "engine-order",
                   "bloom-zero-stage"):
        assert trivia not in items
    warmup = items["warmup-count"]                    # rank 0 of 1F1B, p = 4, m = 8: forwards before its first backward
    from minimega.pipeline.schedules import one_f_one_b
    order = [a.kind for a in one_f_one_b(4, 8, 1, 0)]
    assert next(c.text for c in warmup.choices if c.correct) == str(order.index("B")) == "4"


def test_attempt_sees_at_most_a_quarter_of_the_fixed_pool():
    from minimega.classroom.exam import chapter_plan, load_exam_banks
    banks = load_exam_banks(EXAM, 3)
    drawn = total = 0
    for bank in banks.values():
        n_par, n_fixed = chapter_plan(bank, 3)
        fixed = [it for it in bank.items if not it.parametric]
        assert n_par * 2 >= 3 and 4 * n_fixed <= len(fixed), bank.chapter
        drawn, total = drawn + n_fixed, total + len(fixed)
    assert 4 * drawn <= total


def _norm(text):
    return " ".join(re.sub(r"[^\w\s]", " ", text.lower()).split())


def test_options_give_nothing_away():
    single = [it for _, it in exam_items() if it.type == "single"]
    longest = sum(max(len(c.text) for c in it.choices) == len(next(c for c in it.choices if c.correct).text)
                  for it in single)
    shortest = sum(min(len(c.text) for c in it.choices) == len(next(c for c in it.choices if c.correct).text)
                   for it in single)
    assert longest <= len(single) / 3 and shortest <= len(single) / 3 + 2, (longest, shortest, len(single))
    for _, it in exam_items():
        for c in it.choices:
            assert c.explain.strip(), it.id
            if len(_norm(c.text)) < 8:                                                  # "4", "Nothing": words, not tells
                continue
            assert _norm(c.text) not in _norm(it.question), (it.id, c.text)              # no option in its question
            others = [o.text for o in it.choices if o is not c]
            assert not any(_norm(c.text) in _norm(o) for o in others), (it.id, c.text)  # none inside another


def test_practice_shares_no_item_or_fact_with_the_exam():
    from difflib import SequenceMatcher
    practice = [it for b in load_banks(ROOT / "quizzes") for it in b.items]
    exam = [it for _, it in exam_items()]
    assert not {it.id for it in practice} & {it.id for it in exam}
    fixed = [(e, _norm(e.question), {_norm(c.text) for c in e.choices if c.correct})
             for e in exam if not e.parametric]   # a template's numbers change per attempt: checked by value below
    matcher = SequenceMatcher(None)
    for p in practice:
        matcher.set_seq2(_norm(p.question))             # the matcher indexes its second text once per practice item
        keys_p = {_norm(c.text) for c in p.choices if c.correct}
        for e, question, keys_e in fixed:
            matcher.set_seq1(question)
            if matcher.quick_ratio() < 0.4:             # an upper bound of ratio(): below both bars already
                continue
            ratio = matcher.ratio()
            assert ratio < 0.6, (e.id, p.id, ratio)                  # no question asked twice
            if keys_e & keys_p:                                 # the same key is fine only for a different question
                assert ratio < 0.4, (e.id, p.id, keys_e & keys_p)
    # a template that asks what a practice item asks must rarely draw that item's numbers (same unit and value)
    for e in exam:
        if not e.parametric:
            continue
        rng = random.Random(f"2:{e.id}")          # each template its own draws: another item's edit moves none
        matcher.set_seq1(_norm(e.question))
        alike = set()
        for p in practice:
            if p.type == "numeric" and p.unit == e.unit:
                matcher.set_seq2(_norm(p.question))
                if matcher.quick_ratio() >= 0.4 and matcher.ratio() >= 0.4:
                    alike.add(round_sig(p.answer, 3))
        if not alike:                               # nothing to hit: the draws need not be made
            continue
        hits = sum(round_sig(instantiate(e, draw_params(e, rng)).answer, 3) in alike for _ in range(200))
        assert hits <= 10, (e.id, hits, alike)
