"""Graded exam banks are deployment data: a folder the operator keeps private (``--exam-banks DIR``).

The repository holds a *sample* bank (``quizzes/exam/``, its ``bank.json`` says ``"sample": true``): every key
and formula in it is public, so a script that reads the repository answers it perfectly. It serves tests,
development and the docs; outside ``--dev`` the service refuses it unless ``--allow-sample-bank`` (`choose`).

A bank folder::

    DIR/bank.json               {"id": "acme-2027-spring"}   (optional; "sample": true marks a public bank)
    DIR/NN-slug.yaml            one English bank per chapter (schema: `quiz`)
    DIR/nl/NN-slug.yaml         its Dutch twins (``quizzes/nl/exam/`` for the sample bank, `quiz.twin_path`)

`BankSet` names what a credential was graded on: the bank's id and a SHA-256 over every bank file (names and
bytes, twins included), so a verifier can tell a sample-bank certificate from one graded on a private bank,
and an operator can tell which version of a bank graded whom.
"""
from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass, field
from pathlib import Path

from . import quiz
from .errors import ExamError

CHAPTERS = tuple(range(1, 18))
"""Chapters that must have an exam bank (and that each attempt draws from)."""

SAMPLE_BANKS = Path(__file__).resolve().parents[3] / "quizzes" / "exam"
"""The repository's public sample bank (present in a source checkout)."""
MANIFEST = "bank.json"
BANK_ID = re.compile(r"[a-z0-9][a-z0-9._-]{0,63}")
ALLOW_FLAG = "--allow-sample-bank"
BANKS_FLAG = "--exam-banks"
BANKS_ENV = "MINIMEGA_EXAM_BANKS"


def load_exam_banks(folder: str | Path, per_chapter: int, lang: str = "en") -> dict[int, quiz.Bank]:
    """Chapter -> bank; every chapter of `CHAPTERS` must have a bank that can fill `per_chapter` questions.

    `folder` is the English one; another `lang` reads its words from the twins (`quiz.twin_path`)."""
    folder = Path(folder)
    if not folder.is_dir():
        raise ExamError(f"exam banks folder {folder} does not exist (expected quizzes/exam/NN-slug.yaml)")
    banks = {}
    for b in quiz.load_banks(folder, lang):
        if b.chapter in banks:
            raise ExamError(f"{folder}: two exam banks for chapter {b.chapter}")
        banks[b.chapter] = b
    missing = [c for c in CHAPTERS if c not in banks]
    if missing:
        raise ExamError(f"{folder}: no exam bank for chapters {missing}")
    small = {c: len(b.items) for c, b in banks.items() if len(b.items) < per_chapter}
    if small:
        raise ExamError(f"{folder}: banks with fewer than {per_chapter} items: {small}")
    return banks


def load_translations(folder: str | Path, per_chapter: int) -> dict[str, dict[int, quiz.Bank]]:
    """Language -> its exam banks, for every language but English whose twin folder exists
    (``quizzes/nl/exam`` for ``quizzes/exam``). A twin folder that lacks a bank, or whose structure
    differs from the English, raises: the service refuses to start rather than serve half a language."""
    out = {}
    for lang in quiz.LANGUAGES:
        if lang != "en" and quiz.twin_path(Path(folder) / "x.yaml", lang).parent.is_dir():
            out[lang] = load_exam_banks(folder, per_chapter, lang)
    return out




def bank_files(folder: Path) -> list[Path]:
    """Every file that decides grading or wording: the English banks, the manifest, each language's twins."""
    folder = Path(folder)
    files = sorted(folder.glob("*.yaml")) + ([folder / MANIFEST] if (folder / MANIFEST).is_file() else [])
    for lang in quiz.LANGUAGES[1:]:
        twins = quiz.twin_path(folder / "x.yaml", lang).parent
        files += sorted(twins.glob("*.yaml")) if twins.is_dir() else []
    return files


def content_hash(folder: Path) -> str:
    """SHA-256 over the bank's files: each file's path relative to the folder's parent, then its bytes."""
    folder = Path(folder).resolve()
    h = hashlib.sha256()
    for p in bank_files(folder):
        rel = p.resolve().relative_to(folder.parent).as_posix() if p.resolve().is_relative_to(folder.parent) \
            else p.name
        data = p.read_bytes()
        h.update(f"{rel}\0{len(data)}\0".encode())
        h.update(data)
    return h.hexdigest()


def read_manifest(folder: Path) -> dict:
    path = Path(folder) / MANIFEST
    if not path.is_file():
        return {}
    try:
        raw = json.loads(path.read_text(encoding="utf-8")[:10_000])
    except ValueError as err:
        raise ExamError(f"{path}: not JSON ({err})") from None
    if not isinstance(raw, dict) or set(raw) - {"id", "sample", "note"}:
        raise ExamError(f"{path}: an object with 'id' (and optionally 'sample', 'note'), nothing else")
    if "id" in raw and not (isinstance(raw["id"], str) and BANK_ID.fullmatch(raw["id"])):
        raise ExamError(f"{path}: id {str(raw['id'])[:40]!r}: 1-64 of a-z 0-9 . _ -, starting with a letter or digit")
    if not isinstance(raw.get("sample", False), bool):
        raise ExamError(f"{path}: 'sample' is true or false")
    return raw


def _sample_file_hashes() -> set[str]:
    if not SAMPLE_BANKS.is_dir():
        return set()
    return {hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(SAMPLE_BANKS.glob("*.yaml"))}


@dataclass(frozen=True)
class BankSet:
    """The graded banks one service runs on, in every language it offers, and what names them."""
    folder: Path
    id: str
    sha256: str
    sample: bool
    """Public material (the manifest says so, or a chapter file is a byte copy of the repository's sample)."""
    banks: dict[int, quiz.Bank] = field(repr=False)
    translations: dict[str, dict[int, quiz.Bank]] = field(repr=False)

    @property
    def label(self) -> str:
        """``<id>@sha256:<first 16 hex>``, as certificates and logs print it."""
        return f"{self.id}@sha256:{self.sha256[:16]}"


def open_bank_set(folder: str | Path, per_chapter: int) -> BankSet:
    """Load a bank folder (every language) and name it; `ExamError` / `quiz.QuizError` say what is wrong."""
    folder = Path(folder)
    banks = load_exam_banks(folder, per_chapter)
    translations = load_translations(folder, per_chapter)
    manifest = read_manifest(folder)
    copied = {hashlib.sha256(p.read_bytes()).hexdigest() for p in folder.glob("*.yaml")} & _sample_file_hashes()
    bank_id = manifest.get("id") or re.sub(r"[^a-z0-9._-]", "-", folder.resolve().name.lower())[:64] or "bank"
    return BankSet(folder=folder, id=bank_id, sha256=content_hash(folder),
                   sample=bool(manifest.get("sample")) or bool(copied), banks=banks, translations=translations)


def choose(folder: Path | None, *, dev: bool, allow_sample: bool) -> Path:
    """The bank folder a service may grade on, or `ExamError` saying in one line which flag to pass.

    `folder` None means none was given: development falls back to the sample bank, a deployment must name one.
    A private bank inside the source tree is refused: it would be committed, or baked into an image."""
    if folder is None:
        if dev or allow_sample:
            return SAMPLE_BANKS
        raise ExamError(f"no graded exam bank: pass {BANKS_FLAG} DIR (or set {BANKS_ENV}), a private bank checked "
                        f"with `minimega exam check-bank DIR`; the repository's quizzes/exam is the public sample "
                        f"bank, served only with --dev or {ALLOW_FLAG}")
    folder = Path(folder)
    tree = SAMPLE_BANKS.parents[1]
    if (not (dev or allow_sample) and (tree / "pyproject.toml").is_file() and folder.resolve() != SAMPLE_BANKS
            and folder.resolve().is_relative_to(tree.resolve())):
        raise ExamError(f"{folder}: a graded bank inside the source tree ({tree}) ends up in commits and images; "
                        "keep it outside (mount it read-only, OPERATING.md)")
    return folder


def refuse_sample(bank_set: BankSet, *, dev: bool, allow_sample: bool) -> None:
    if bank_set.sample and not (dev or allow_sample):
        raise ExamError(f"{bank_set.folder} is a public sample bank (its keys and formulas are in the repository, so "
                        f"its certificates prove nothing): pass {BANKS_FLAG} with a private bank, or {ALLOW_FLAG} "
                        "to grade on it anyway")
