"""The quiz bank schema: loading, validation errors that name the item, grading."""
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
