"""The harvesting attack, replayed: unlimited identities (the development mailer hands out sign-in links), each
spends an attempt only to read its review, collecting every key, worked value and explanation; then a script
with no estimator of its own answers fresh attempts from what it collected. It must stay below the pass mark."""
import random
import re
from difflib import SequenceMatcher

from fastapi.testclient import TestClient

from classroom_support import make_config, sign_in
from minimega.classroom.service import create_app

HARVEST_ATTEMPTS = 25
EXAMS = 4


def _stem(text):
    return re.sub(r"\s+", " ", text).strip()


def most_similar(seen: list[str], text: str) -> str:
    """The first of `seen` with the highest SequenceMatcher(None, seen, text).ratio(); quick_ratio, an upper bound
    of ratio, skips the ones that cannot beat the best so far."""
    matcher = SequenceMatcher(None, b=text)                     # indexes `text` once
    best, best_ratio = None, -1.0
    for candidate in seen:
        matcher.set_seq1(candidate)
        if matcher.quick_ratio() > best_ratio and matcher.ratio() > best_ratio:
            best, best_ratio = candidate, matcher.ratio()
    return best


class Harvester:
    """Everything an attacker can read in reviews: question text -> right option texts, or -> worked value."""

    def __init__(self):
        self.keys: dict[str, set[str]] = {}
        self.values: dict[str, float] = {}
        self.explanations = self.numeric_seen = 0

    def collect(self, review):
        for item in review["items"]:
            q = _stem(item["question"])
            if item["type"] == "numeric":
                self.values[q] = item["answer"]
                self.numeric_seen += 1
                self.explanations += bool(item["explain"])
            else:
                self.keys[q] = {item["choices"][i] for i in item["key"]}
                self.explanations += len(item["explains"])

    def answer(self, q):
        text = _stem(q["question"])
        if q["type"] == "numeric":
            if text in self.values:                               # seen with these very numbers
                return {"value": self.values[text]}
            if not self.values:
                return {"value": 1.0}
            # no estimator: reuse the worked value of the most similar question seen (the first of the best)
            return {"value": self.values[most_similar(self.values, text)]}
        known = self.keys.get(text)
        if known:
            picked = [i for i, c in enumerate(q["choices"]) if c in known]
            if picked:
                return {"choice": picked[0]} if q["type"] == "single" else {"choices": picked}
        return {"choice": 0} if q["type"] == "single" else {"choices": [0]}


def test_harvesting_with_unlimited_identities_stays_below_the_pass_mark(tmp_path, capsys):
    app = create_app(make_config(tmp_path, questions_per_chapter=3))
    app.state.exam.rng = random.Random(20260101)     # reproducible draws (the service uses SystemRandom)
    thief = Harvester()
    with TestClient(app) as client:
        for _ in range(HARVEST_ATTEMPTS):                          # a new address each time: limits never bite
            auth = sign_in(client)
            attempt = client.post("/api/v1/attempts", json={"display_name": "Harvest"}, headers=auth).json()
            aid = attempt["attempt_id"]
            client.post(f"/api/v1/attempts/{aid}/finish", headers=auth)
            thief.collect(client.get(f"/api/v1/attempts/{aid}/review", headers=auth).json())

        scores, fixed_right, fixed_total, numeric_right = [], 0, 0, 0
        for _ in range(EXAMS):
            auth = sign_in(client)
            attempt = client.post("/api/v1/attempts", json={"display_name": "Harvest"}, headers=auth).json()
            aid = attempt["attempt_id"]
            for q in attempt["questions"]:
                client.post(f"/api/v1/attempts/{aid}/answers/{q['number']}", json=thief.answer(q), headers=auth)
            fin = client.post(f"/api/v1/attempts/{aid}/finish", headers=auth).json()
            review = client.get(f"/api/v1/attempts/{aid}/review", headers=auth).json()
            scores.append(fin["score"])
            fixed_right += sum(i["correct"] for i in review["items"] if i["type"] != "numeric")
            fixed_total += sum(i["type"] != "numeric" for i in review["items"])
            numeric_right += sum(i["correct"] for i in review["items"] if i["type"] == "numeric")
            assert not fin["passed"] and fin["credential"] is None
    total, pass_mark = fin["total"], fin["pass_mark"]
    with capsys.disabled():
        print(f"\n[harvest] {HARVEST_ATTEMPTS} harvested reviews: {len(thief.keys)} choice keys, "
              f"{len(thief.values)} worked values, {thief.explanations} explanations; "
              f"then {EXAMS} exams scored {scores} of {total} (pass mark {pass_mark}); "
              f"choice items right {fixed_right}/{fixed_total}, numeric right {numeric_right}")
    assert len(thief.values) >= 0.9 * thief.numeric_seen     # the reviews' numbers differ attempt to attempt
    assert fixed_right >= 0.9 * fixed_total          # the attack works where it can: every choice key is known
    assert max(scores) < pass_mark                   # and still fails: the numbers are new in every attempt
    numeric_total = EXAMS * total - fixed_total
    assert numeric_right <= 0.1 * numeric_total      # replayed or borrowed values rarely match a fresh draw
