"""The list of mutants (`tools/mutants.py`, `make mutants`) applies to the current source, so it cannot rot."""
import importlib.util
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def mutants():
    spec = importlib.util.spec_from_file_location("mutants_tool", ROOT / "tools" / "mutants.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_every_mutant_applies_exactly_once(mutants):
    listed = mutants.load()
    assert len(listed) >= 30
    assert mutants.problems(listed) == []


def test_a_rotten_entry_is_reported(mutants, tmp_path):
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "a.py").write_text("x = 1\nx = 1\n")
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / "test_a.py").write_text("")
    entry = {"name": "m", "file": "src/a.py", "new": "x = 2", "tests": ["tests/test_a.py"]}
    assert mutants.problems([{**entry, "old": "x = 1"}], tmp_path) == [
        "m: old string found 2 times in src/a.py (expected once)"]
    assert mutants.problems([{**entry, "old": "y = 1"}], tmp_path) == [
        "m: old string found 0 times in src/a.py (expected once)"]
    assert mutants.problems([{**entry, "old": "x = 1\nx"}], tmp_path) == []
    assert mutants.problems([{**entry, "old": "x", "file": "src/b.py"}], tmp_path) == ["m: src/b.py does not exist"]


def test_the_list_refuses_bad_entries(mutants, tmp_path):
    bad = tmp_path / "m.toml"
    bad.write_text('[[mutant]]\nname = "m"\nfile = "../etc/passwd"\nold = "a"\nnew = "b"\ntests = []\n')
    with pytest.raises(ValueError, match="not under src/"):
        mutants.load(bad)
    bad.write_text('[[mutant]]\nname = "m"\nfile = "src/a.py"\nold = "a"\nnew = "b"\n')
    with pytest.raises(ValueError, match="missing"):
        mutants.load(bad)
