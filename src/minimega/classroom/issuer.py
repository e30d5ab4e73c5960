"""The issuer: signs certificates and status lists, publishes keys, revokes.

Identity: ``did:web:<host>`` when configured (the DID document at ``/.well-known/did.json`` lists
every key, old and new), else the active key's ``did:key`` (development: self-describing, nothing to
host). Key ids are ``<did>#<Multikey fingerprint>``.

Revocation: one status list per signing key, at ``/status/<fingerprint>``, signed by that key as the
same issuer the credential names. Rotating keys therefore never strands an old credential: its list
is still signed by its own (retained) key. A signed list is cached and re-signed when a bit flips or
half its `status_list_ttl_s` has passed.
"""
from __future__ import annotations

import json
import secrets
import threading
import time
from datetime import datetime, timedelta, timezone
from urllib.parse import urlparse

from . import credential, keys, status_list
from .banks import CHAPTERS, BankSet
from .keys import Keyring, SigningKey
from .settings import ClassroomConfig
from .store import Duplicate, Store
from .verification_code import new_code


class Issuer:
    def __init__(self, config: ClassroomConfig, keyring: Keyring, store: Store, clock=time.time,
                 bank: BankSet | None = None):
        self.config, self.keyring, self.store, self.clock = config, keyring, store, clock
        self.bank = bank
        """What attempts are graded on; every achievement names it (id and content hash)."""
        self._lists: dict[str, tuple[int, float, dict]] = {}
        self._lock = threading.Lock()

    # --- identity ----------------------------------------------------------------------------

    def did_for(self, key: SigningKey) -> str:
        return self.config.issuer_did or keys.did_key(key.public)

    def method_for(self, key: SigningKey) -> str:
        return f"{self.did_for(key)}#{key.fingerprint}"

    def profile(self, key: SigningKey) -> dict:
        return {"id": self.did_for(key), "type": ["Profile"], "name": self.config.issuer_name,
                "url": self.config.base_url + "/"}

    def achievement(self, lang: str = "en") -> dict:
        """`_achievement` plus the bank it was graded on: an ``otherIdentifier`` (``<id>@sha256:<hex>``) and a
        sentence of the criteria, which says so plainly when the bank is the public sample."""
        out = self._achievement(lang)
        if self.bank is None:
            return out
        b = self.bank
        out["otherIdentifier"] = [{"type": ["IdentifierEntry"], "identifier": f"{b.id}@sha256:{b.sha256}",
                                   "identifierType": "ext:examBank"}]
        if lang == "nl":
            said = (f" Beoordeeld op de examenbank {b.label}." if not b.sample else
                    f" Beoordeeld op de OPENBARE VOORBEELDBANK {b.label}: de antwoorden staan in de repository, dus "
                    "dit certificaat bewijst niets.")
        else:
            said = (f" Graded on exam bank {b.label}." if not b.sample else
                    f" Graded on the PUBLIC SAMPLE bank {b.label}: its answers are in the repository, so this "
                    "certificate proves nothing.")
        out["criteria"] = {"narrative": out["criteria"]["narrative"] + said}
        return out

    def _achievement(self, lang: str = "en") -> dict:
        """The OB 3.0 Achievement, its human-readable text in `lang` (``inLanguage``, BCP 47). The id, type,
        version and every other machine-readable field are the same in every language: one achievement,
        described in the learner's language."""
        c = self.config
        n = len(CHAPTERS) * c.questions_per_chapter
        if lang == "nl":
            return {
                "id": f"{c.base_url}/achievements/{c.course_version}",
                "type": ["Achievement"],
                "achievementType": "Certificate",
                "name": "minimega: frontiermodellen trainen over veel GPU's",
                "description": ("Geslaagd voor het beoordeelde examen van minimega, een cursus die gedistribueerd "
                                "trainen in het klein nabouwt: geheugenboekhouding, collectives en DDP, ZeRO-stages "
                                "1-3, mixed precision, offload, activation checkpointing, tensor, pipeline en 3D "
                                "parallelism, checkpoints en fouttolerantie, FSDP, een trainingsstack kiezen en "
                                "begroten, staptijd voorspellen, dezelfde run in DeepSpeed en Megatron-LM, lange "
                                "context met context parallelism, en mixtures of experts met expert parallelism."),
                "criteria": {"narrative": (
                    f"Minstens {round(100 * c.pass_fraction)}% gehaald op een online examen zonder toezicht met "
                    f"{n} willekeurig getrokken vragen, {c.questions_per_chapter} uit elk van de hoofdstukken "
                    f"{_chapter_list(CHAPTERS)}, elke vraag één keer beantwoord zonder herkansing. De naam is "
                    "die welke de cursist zelf intypte; het examen bevestigt kennis, geen identiteit.")},
                "inLanguage": "nl",
                "version": c.course_version,
            }
        if lang != "en":
            raise ValueError(f"no achievement text in {lang!r}; languages: en, nl")
        return {
            "id": f"{c.base_url}/achievements/{c.course_version}",
            "type": ["Achievement"],
            "achievementType": "Certificate",
            "name": "minimega: training frontier models across many GPUs",
            "description": ("Passed the graded exam of minimega, a course that rebuilds distributed "
                            "training small: memory accounting, collectives and DDP, ZeRO stages 1-3, "
                            "mixed precision, offload, activation checkpointing, tensor, pipeline and 3D "
                            "parallelism, checkpoints and fault tolerance, FSDP, choosing and costing a "
                            "training stack, predicting step time, the same run in DeepSpeed and "
                            "Megatron-LM, long context with context parallelism, and mixtures of experts "
                            "with expert parallelism."),
            "criteria": {"narrative": (
                f"Scored at least {round(100 * c.pass_fraction)}% on an unproctored online exam of {n} "
                f"questions drawn at random, {c.questions_per_chapter} from each of chapters "
                f"{_chapter_list(CHAPTERS)}, each "
                "answered once with no retry. The name is the one the learner typed; the exam attests "
                "knowledge, not identity.")},
            "inLanguage": "en",
            "version": c.course_version,
        }

    def did_document(self) -> dict:
        """did:web document of this host, listing every key (the did:key of each, when in development)."""
        host = urlparse(self.config.base_url).netloc
        did = self.config.issuer_did or keys.did_web(host)
        aka = [] if self.config.issuer_did else [keys.did_key(p) for p in self.keyring.publics]
        return keys.did_document(did, self.keyring.publics, aka)

    def trusted_keys(self) -> set[str]:
        return {keys.public_multikey(p) for p in self.keyring.publics}

    # --- issuing -----------------------------------------------------------------------------

    def list_url(self, fingerprint: str) -> str:
        return f"{self.config.base_url}/status/{fingerprint}"

    def links(self, code: str) -> dict:
        base = self.config.base_url
        return {"code": code, "credential_url": f"{base}/api/v1/credentials/{code}",
                "certificate_url": f"{base}/certificates/{code}",
                "certificate_svg_url": f"{base}/certificates/{code}.svg",
                "verify_url": f"{base}/verify/?c={code}"}

    def issue(self, attempt_id: str) -> dict:
        """Sign and store the certificate of a passed attempt (once); returns its links."""
        existing = self.store.credential_by_attempt(attempt_id)
        if existing is not None:
            return self.links(existing["code"])
        attempt = self.store.attempt(attempt_id)
        if attempt is None or not attempt["passed"]:
            raise ValueError(f"attempt {attempt_id!r} has not passed")
        key = self.keyring.active
        now = self.clock()
        valid_from = datetime.fromtimestamp(int(now), timezone.utc)
        until = (valid_from + timedelta(days=self.config.credential_valid_days)
                 if self.config.credential_valid_days else None)
        email_id = json.loads(attempt["email_id"]) if attempt["email_id"] else None
        for _ in range(20):      # a random index (herd privacy) and code; retry on the rare collision
            index = secrets.randbelow(status_list.LIST_BITS)
            code = new_code()
            doc = credential.build_credential(
                issuer=self.profile(key), display_name=attempt["display_name"],
                achievement=self.achievement(attempt["lang"] or "en"), status=status_list.entry(self.list_url(key.fingerprint), index),
                valid_from=valid_from, valid_until=until, email_id=email_id)
            signed = credential.add_proofs(doc, key.private, self.method_for(key), created=valid_from)
            try:
                self.store.store_credential(credential_id=doc["id"], code=code, attempt_id=attempt_id,
                                            status_list=key.fingerprint, status_index=index,
                                            document=signed, now=now)
                return self.links(code)
            except Duplicate:
                if self.store.credential_by_attempt(attempt_id) is not None:   # a concurrent finish won
                    return self.links(self.store.credential_by_attempt(attempt_id)["code"])
        raise RuntimeError("could not allocate a free status index and code in 20 tries")

    # --- status lists --------------------------------------------------------------------------

    def status_list_credential(self, fingerprint: str) -> dict:
        key = next((k for k in self.keyring.keys if k.fingerprint == fingerprint), None)
        if key is None:
            raise LookupError(f"no status list {fingerprint!r:.60}")
        version, revoked = self.store.revocation_state(fingerprint)
        now = self.clock()
        with self._lock:
            cached = self._lists.get(fingerprint)
            if cached and cached[0] == version and now < cached[1] + self.config.status_list_ttl_s / 2:
                return cached[2]
            start = datetime.fromtimestamp(int(now), timezone.utc)
            doc = status_list.list_credential(
                list_url=self.list_url(fingerprint), issuer=self.did_for(key), revoked=revoked,
                valid_from=credential.iso(start),
                valid_until=credential.iso(start + timedelta(seconds=self.config.status_list_ttl_s)))
            signed = credential.add_proofs(doc, key.private, self.method_for(key), created=start)
            self._lists[fingerprint] = (version, now, signed)
            return signed

    def revoke(self, code: str, reason: str = "") -> bool:
        changed = self.store.revoke(code, reason, self.clock())
        with self._lock:
            self._lists.clear()
        return changed


def _chapter_list(chapters) -> str:
    """'1-14, 16': runs of consecutive chapters as ranges (a chapter may land before the one it follows)."""
    runs, out = [], []
    for c in sorted(chapters):
        if runs and c == runs[-1][1] + 1:
            runs[-1][1] = c
        else:
            runs.append([c, c])
    for a, b in runs:
        out.append(f"{a}-{b}" if b > a else f"{a}")
    return ", ".join(out)
