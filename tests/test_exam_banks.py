"""Graded banks are deployment data: the white-box route (everything in the repository) fails on a private bank
and passes on the sample; `exam check-bank` names each fault; credentials name their bank; the service refuses
the sample bank outside --dev."""
import json
import shutil

import pytest
from fastapi.testclient import TestClient

from bank_support import SAMPLE, WhiteBox, write_private_bank
from classroom_support import make_config, sign_in
from minimega.classroom import banks, checkbank
from minimega.classroom.banks import CHAPTERS
from minimega.classroom.errors import ExamError
from minimega.classroom.service import create_app


def _take_exam(client, script) -> dict:
    auth = sign_in(client)
    attempt = client.post("/api/v1/attempts", json={"display_name": "White Box"}, headers=auth).json()
    for q in attempt["questions"]:
        r = client.post(f"/api/v1/attempts/{attempt['attempt_id']}/answers/{q['number']}", json=script.answer(q),
                        headers=auth)
        assert r.status_code == 200, r.text
    return client.post(f"/api/v1/attempts/{attempt['attempt_id']}/finish", headers=auth).json()


def test_the_repository_answers_the_sample_bank_but_not_a_private_one(tmp_path):
    """The script reads the sample bank's keys and formulas: every question on --dev with the sample bank (so it works),
    below the pass mark on a service graded on a private bank the test writes."""
    config = dict(questions_per_chapter=3, fail_cooldown_s=0, attempts_per_day=100)
    with TestClient(create_app(make_config(tmp_path / "dev", **config))) as client:
        script = WhiteBox()
        fin = _take_exam(client, script)
    assert fin["passed"] and fin["score"] == fin["total"] == 3 * len(CHAPTERS) and script.known == 3 * len(CHAPTERS), fin
    private = write_private_bank(tmp_path / "bank")
    app = create_app(make_config(tmp_path / "prod", banks_dir=private, allow_sample_bank=False, **config))
    with TestClient(app) as client:
        script = WhiteBox()
        scores = [_take_exam(client, script) for _ in range(3)]
    assert script.known == 0
    assert all(not f["passed"] and f["score"] < f["pass_mark"] for f in scores), scores
    print(f"white-box on the private bank: {[f['score'] for f in scores]} of {3 * len(CHAPTERS)} (pass mark {scores[0]['pass_mark']})")


def test_credentials_name_the_bank_they_were_graded_on(tmp_path):
    from classroom_support import pass_exam
    from minimega.classroom.credential import claims_of

    private = write_private_bank(tmp_path / "bank", bank_id="acme-2027")
    bank_set = banks.open_bank_set(private, 1)
    for folder, sample in ((private, False), (None, True)):
        app = create_app(make_config(tmp_path / str(sample), banks_dir=folder))
        with TestClient(app) as client:
            if folder is not None:                       # answer from the private bank's own keys
                import classroom_support
                classroom_support.BANKS, saved = private, classroom_support.BANKS
                try:
                    fin = pass_exam(client)
                finally:
                    classroom_support.BANKS = saved
            else:
                fin = pass_exam(client)
            doc = client.get(f"/api/v1/credentials/{fin['credential']['code']}").json()
        claims = claims_of(doc)
        narrative = claims["criteria"]
        if sample:
            assert claims["exam_bank"].startswith("minimega-sample@sha256:") and "PUBLIC SAMPLE" in narrative
        else:
            assert claims["exam_bank"] == f"acme-2027@sha256:{bank_set.sha256}" and "SAMPLE" not in narrative
            assert bank_set.label in narrative


def test_the_service_refuses_the_sample_bank_outside_dev(tmp_path):
    with pytest.raises(ExamError, match="--exam-banks"):
        create_app(make_config(tmp_path, dev=False, allow_sample_bank=False, smtp_host="127.0.0.1"))
    with pytest.raises(ExamError, match="--allow-sample-bank"):
        create_app(make_config(tmp_path, dev=False, allow_sample_bank=False, smtp_host="127.0.0.1",
                               banks_dir=SAMPLE))
    copied = tmp_path / "copy"                       # a copy of the sample without its bank.json is still the sample
    copied.mkdir()
    for p in SAMPLE.glob("*.yaml"):
        shutil.copy(p, copied / p.name)
    (copied / "bank.json").write_text(json.dumps({"id": "totally-private"}))
    with pytest.raises(ExamError, match="sample"):
        create_app(make_config(tmp_path, dev=False, allow_sample_bank=False, smtp_host="127.0.0.1", banks_dir=copied))


def test_check_bank_passes_a_private_bank(tmp_path, capsys):
    from minimega.tools.cli import main

    folder = write_private_bank(tmp_path / "bank")
    assert main(["exam", "check-bank", str(folder), "--draws", "20"]) == 0
    assert "ok. bank acme-private@sha256:" in capsys.readouterr().out


def _break(folder, how):
    en, nl = folder / "05-private.yaml", folder / "nl" / "05-private.yaml"
    if how == "sample-copy":
        shutil.copy(SAMPLE / "03-zero.yaml", folder / "03-private.yaml")
        (folder / "nl" / "03-private.yaml").unlink()
        shutil.copy(SAMPLE.parent / "nl" / "exam" / "03-zero.yaml", folder / "nl" / "03-private.yaml")
    elif how == "formula":                           # divides by zero at one end of a range
        for p in (en, nl):
            p.write_text(p.read_text().replace("a * 6 + b / 3", "a * 6 + b / (b - 30)"))
    elif how == "no-twins":
        shutil.rmtree(folder / "nl")
    elif how == "untranslated":
        nl.write_text(en.read_text().replace("Chapter 5", "Hoofdstuk 5"))
    elif how == "tells":                             # every key the longest option
        for p in folder.glob("*.yaml"):
            p.write_text(p.read_text().replace("correct: true", "correct: true\n  # longest"))
        for p in [*folder.glob("*.yaml"), *(folder / "nl").glob("*.yaml")]:
            import yaml
            raw = yaml.safe_load(p.read_text())
            for it in raw["items"]:
                for c in it.get("choices", []):
                    if c["correct"]:
                        c["text"] += " (the well-qualified one)"
            p.write_text(yaml.safe_dump(raw, allow_unicode=True, sort_keys=False))
    elif how == "overlap":                           # a practice question, reworded a little
        import yaml
        practice = yaml.safe_load((SAMPLE.parent / "05-offload.yaml").read_text())["items"][0]["question"]
        for p in (en, nl):
            raw = yaml.safe_load(p.read_text())
            raw["items"][2]["question"] = practice + " " if p == en else "Vertaald: " + practice
            p.write_text(yaml.safe_dump(raw, allow_unicode=True, sort_keys=False))
    elif how == "review-names-key":                  # the idea the review shows quotes the right option
        import yaml
        for p in (en, nl):
            raw = yaml.safe_load(p.read_text())
            pick = raw["items"][2]
            pick["explain"] = "Because " + next(c["text"] for c in pick["choices"] if c["correct"]) + " holds."
            p.write_text(yaml.safe_dump(raw, allow_unicode=True, sort_keys=False))
    elif how == "no-manifest":
        (folder / "bank.json").unlink()
    elif how == "uncovered":                         # an anchor chapter 5's page does not have
        for p in (en, nl):
            p.write_text(p.read_text().replace("- why", "- no-such-section", 1))


@pytest.mark.parametrize("how, check", [("sample-copy", "schema"), ("formula", "formula"), ("no-twins", "twins"),
                                        ("untranslated", "twins"), ("tells", "tells"), ("overlap", "overlap"),
                                        ("review-names-key", "review"), ("no-manifest", "schema"),
                                        ("uncovered", "coverage")])
def test_check_bank_names_each_fault(tmp_path, how, check):
    folder = write_private_bank(tmp_path / "bank")
    _break(folder, how)
    problems, _ = checkbank.check_bank(folder, draws=40)
    assert check in {p.check for p in problems}, problems
    if how == "uncovered":
        assert any("no-such-section" in p.message for p in problems if p.check == "coverage"), problems


def _near_copy(folder):
    """The sample bank disguised: comment lines, renamed ids, items in reverse order, a private-looking id."""
    import yaml
    folder.mkdir()
    for p in SAMPLE.glob("*.yaml"):
        raw = yaml.safe_load(p.read_text())
        for it in raw["items"]:
            it["id"] = "totally-" + it["id"][::-1]
        raw["items"].reverse()
        text = yaml.safe_dump(raw, allow_unicode=True, sort_keys=False, width=60)
        (folder / p.name.replace(".yaml", "-priv.yaml")).write_text("# our own private items\n" + text + "\n# end\n")
    (folder / "bank.json").write_text(json.dumps({"id": "totally-private"}))
    return folder


def test_serve_refuses_the_sample_in_disguise_naming_the_items(tmp_path):
    copied = _near_copy(tmp_path / "copy")
    prod = dict(dev=False, smtp_host="127.0.0.1", banks_dir=copied, questions_per_chapter=1)
    with pytest.raises(ExamError, match="public sample bank's in disguise") as err:
        create_app(make_config(tmp_path / "refused", allow_sample_bank=False, **prod))
    assert "chapter 1 totally-" in str(err.value) and "(sample 01-memory-anatomy.yaml " in str(err.value), str(err.value)
    app = create_app(make_config(tmp_path / "allowed", allow_sample_bank=True, **prod))   # the one way past:
    assert app.state.issuer.bank.sample                                               # certificates say PUBLIC SAMPLE
    private = write_private_bank(tmp_path / "bank")                                   # a bank of new items starts
    assert not create_app(make_config(tmp_path / "ok", allow_sample_bank=False, **(prod | {"banks_dir": private}))
                          ).state.issuer.bank.sample
    named = checkbank.sample_overlap(banks.open_bank_set(copied, 1))     # what check-bank reports too
    assert len(named) == sum(len(b.items) for b in banks.open_bank_set(SAMPLE, 1).banks.values())   # every one


def test_serve_refuses_a_bank_inside_the_source_tree(tmp_path):
    with pytest.raises(ExamError, match="inside the source tree"):
        create_app(make_config(tmp_path, dev=False, allow_sample_bank=False, smtp_host="127.0.0.1",
                               banks_dir=SAMPLE.parent))
    root = SAMPLE.parents[1]
    assert "private-bank/" in (root / ".gitignore").read_text().split()
    assert "private-bank" in (root / ".dockerignore").read_text().split()
