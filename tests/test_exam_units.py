"""Numeric answers with a unit: the question's unit is accepted, a wrong one refused by name, through the API;
Dutch questions print decimal commas."""
import random

import pytest
from fastapi.testclient import TestClient

from classroom_support import answer_key, make_config, sign_in
from minimega.classroom import units
from minimega.classroom.quiz import draw_params, instantiate, load_banks, precision_note, show
from minimega.classroom.service import create_app

from bank_support import SAMPLE


@pytest.mark.parametrize("text, unit, value", [("31.4 GB", "GB", 31.4), ("31,4 GB", "GB", 31.4), ("31.4GB", "GB", 31.4),
                                               ("12 %", "%", 12), ("12 procent", "%", 12), ("950 ms", "ms", 950),
                                               ("2.5 GiB", "GiB", 2.5), ("7", "GB", 7), ("1e3 MB", "MB", 1000),
                                               ("3 days", "days", 3), ("4 dagen", "dagen", 4),
                                               ("2 million USD", "million USD", 2)])
def test_a_matching_unit_is_accepted(text, unit, value):
    assert units.parse(text, unit) == pytest.approx(value)


@pytest.mark.parametrize("text, unit, said", [("31.4 GiB", "GB", "asks for GB, not GiB"),
                                              ("0.95 s", "ms", "asks for ms, not s"),
                                              ("12 GB", "%", "asks for %, not GB"),
                                              ("5 bananas", "GB", "'bananas' is not that unit"),
                                              ("1,000.5 GB", "GB", "thousands separators"),
                                              ("GB", "GB", "not a number in GB")])
def test_a_wrong_unit_is_refused_by_name(text, unit, said):
    with pytest.raises(units.UnitError, match=said):
        units.parse(text, unit)


def test_the_api_grades_a_value_with_its_unit_and_refuses_a_wrong_one(tmp_path):
    with TestClient(create_app(make_config(tmp_path))) as client:
        auth = sign_in(client)
        attempt = client.post("/api/v1/attempts", json={"display_name": "Unit"}, headers=auth).json()
        aid = attempt["attempt_id"]
        key = answer_key(client.app.state.store, aid)
        numeric = [q for q in attempt["questions"] if q["type"] == "numeric" and q["unit"] in ("GB", "MB", "GiB")]
        assert len(numeric) >= 2
        q, other = numeric[0], numeric[1]
        wrong = "GiB" if q["unit"] != "GiB" else "GB"
        r = client.post(f"/api/v1/attempts/{aid}/answers/{q['number']}",
                        json={"value": f"{key[q['number']][0]['value']} {wrong}"}, headers=auth)
        assert r.status_code == 422 and f"asks for {q['unit']}, not {wrong}" in r.json()["detail"], r.text
        r = client.post(f"/api/v1/attempts/{aid}/answers/{q['number']}",       # refused, so not locked: retry
                        json={"value": f"{key[q['number']][0]['value']:.6g} {q['unit']}"}, headers=auth)
        assert r.status_code == 200, r.text
        dutch = f"{key[other['number']][0]['value']:.6g}".replace(".", ",")
        client.post(f"/api/v1/attempts/{aid}/answers/{other['number']}", json={"value": f"{dutch} {other['unit']}"},
                    headers=auth)
        client.post(f"/api/v1/attempts/{aid}/finish", headers=auth)
        review = {i["number"]: i for i in client.get(f"/api/v1/attempts/{aid}/review", headers=auth).json()["items"]}
        assert review[q["number"]]["correct"] and review[other["number"]]["correct"]
        assert isinstance(review[q["number"]]["response"]["value"], float)          # stored as the number


def test_dutch_questions_print_decimal_commas():
    rng = random.Random(3)
    seen = 0
    for en, nl in zip(load_banks(SAMPLE), load_banks(SAMPLE, "nl")):
        for a, b in zip(en.items, nl.items):
            if not a.parametric:
                continue
            values = draw_params(a, rng)
            q_en, q_nl = instantiate(a, values), instantiate(b, values)
            for v in values.values():
                if not float(v).is_integer():
                    assert show(v) in q_en.question and show(v, "nl") in q_nl.question, (a.id, v)
                    seen += 1
    assert seen >= 3 and show(69.5, "nl") == "69,5" and show(64, "nl") == "64"
    from dataclasses import replace
    some = next(it for it in load_banks(SAMPLE, "nl")[0].items if it.type == "numeric")
    assert "0,5%" in precision_note(replace(some, tolerance=0.005))
