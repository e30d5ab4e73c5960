"""The harvesting attack, replayed: 40 identities (the development mailer hands out sign-in links), each spends an
attempt guessing every choice item and reading its review; then a script with no estimator of its own answers fresh
attempts from what it collected. Reviews name no choice key (right or wrong, and the idea tested); what the thief
learns is only what its own guesses earned, and it stays far below the pass mark."""
import random
import re

from bank_support import write_private_bank
from classroom_support import make_config
from minimega.classroom.api_models import ReviewOut
from minimega.classroom.service import create_app

IDENTITIES = 40
EXAMS = 3


def _stem(text):
    return re.sub(r"\s+", " ", text).strip()


def shape(text: str) -> str:
    """A question with its numbers blanked: the template it was drawn from."""
    return re.sub(r"\d+(?:[.,]\d+)?(?:e-?\d+)?", "#", text)


class Harvester:
    """What an attacker can learn: worked values of numeric questions, and for each choice item the options its own
    guesses proved right (the key) or wrong (eliminated); a single-choice item with one option left is known too."""

    def __init__(self, rng):
        self.rng = rng
        self.keys: dict[str, set[str]] = {}
        self.wrong: dict[str, set[str]] = {}
        self.values: dict[str, float] = {}
        self.by_shape: dict[str, float] = {}
        self.named = set()                       # choice items whose review itself showed the key
        self.choice_seen = set()

    def guess(self, q):
        """A single option not yet proved wrong (or the known key); multiple: a random non-empty subset."""
        text = _stem(q["question"])
        if q["type"] == "numeric":
            if text in self.values:
                return {"value": self.values[text]}
            # no estimator: the worked value of the last question seen from the same template
            return {"value": self.by_shape.get(shape(text), 1.0)}
        known = self.keys.get(text)
        if known:
            picked = [i for i, c in enumerate(q["choices"]) if c in known]
            return {"choice": picked[0]} if q["type"] == "single" else {"choices": picked}
        if q["type"] == "single":
            left = [i for i, c in enumerate(q["choices"]) if c not in self.wrong.get(text, ())]
            return {"choice": self.rng.choice(left or [0])}
        n = len(q["choices"])
        return {"choices": self.rng.sample(range(n), self.rng.randint(1, n))}

    def collect(self, review, asked, bank):
        for item in review["items"]:
            q = _stem(item["question"])
            if item["type"] == "numeric":
                if item["answer"] is not None:
                    self.values[q] = self.by_shape[shape(q)] = item["answer"]
                continue
            self.choice_seen.add((item["chapter"], q))
            right = {c.text for c in bank[(item["chapter"], q)].choices if c.correct}    # the test's view, not the thief's
            shown = " ".join([item["explain"] or "", *item["explains"]])
            if item["key"] or any(r in shown for r in right):
                self.named.add((item["chapter"], q))
            response = asked[item["number"]]
            picked = {item["choices"][i] for i in ([response["choice"]] if "choice" in response else response["choices"])}
            if item["correct"]:
                self.keys[q] = picked
            elif item["type"] == "single":
                self.wrong.setdefault(q, set()).update(picked)
                left = [c for c in item["choices"] if c not in self.wrong[q]]
                if len(left) == 1:
                    self.keys[q] = set(left)


def test_forty_identities_harvest_no_named_key_and_stay_far_below_the_pass_mark(tmp_path, capsys):
    folder = write_private_bank(tmp_path / "private-bank")
    app = create_app(make_config(tmp_path, questions_per_chapter=3, banks_dir=folder, allow_sample_bank=False))
    app.state.exam.rng = random.Random(20260101)     # reproducible draws (the service uses SystemRandom)
    thief = Harvester(random.Random(5))
    n_choice = sum(not it.parametric and it.type != "numeric" for b in app.state.exam.banks.values() for it in b.items)

    exam = app.state.exam                 # the service's own calls, without HTTP (the API returns these dicts)
    by_question = {(b.chapter, _stem(it.question)): it for b in exam.banks.values() for it in b.items}

    def sit(n):
        link = exam.request_signin(f"thief{n}@example.org")["dev_link"]
        session = exam.redeem_signin(link.split("#signin=")[1])["session"]
        attempt = exam.start(session, "Harvest", f"198.51.{n % 7}.{n}")
        aid = attempt["attempt_id"]
        asked = {q["number"]: thief.guess(q) for q in attempt["questions"]}
        for number, response in asked.items():
            exam.answer(aid, number, dict(response), session)
        fin = exam.finish(aid, session)
        return fin, ReviewOut.model_validate(exam.review(aid, session)).model_dump(), asked

    for n in range(IDENTITIES):                                    # a new identity each time: limits never bite
        _, review, asked = sit(n)
        thief.collect(review, asked, by_question)
    learnt = len(thief.keys)
    scores = []
    for n in range(IDENTITIES, IDENTITIES + EXAMS):
        fin, review, _ = sit(n)
        scores.append(fin["score"])
        assert not fin["passed"] and fin["credential"] is None
    total = fin["total"]
    with capsys.disabled():
        print(f"\n[harvest] {IDENTITIES} identities saw {len(thief.choice_seen)} of {n_choice} choice items; reviews "
              f"named {len(thief.named)} keys; the thief's own guesses proved {learnt} keys; "
              f"{len(thief.values)} worked values; then {EXAMS} exams scored {scores} of {total}")
    assert len(thief.choice_seen) >= 0.9 * n_choice            # the harvest covered the bank
    assert len(thief.named) <= n_choice // 4                    # reviews never hand out a key
    assert max(scores) < 20                                    # the solver from that harvest: below 20 of 48
