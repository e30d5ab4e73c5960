"""What a credential says, in words: the claims a verifier prints (true only once `credential.verify` says so)."""
from __future__ import annotations


def claims_of(doc: dict) -> dict:
    """The human-readable claims of an OpenBadgeCredential (as written in it; check `valid`)."""
    subject = doc.get("credentialSubject") if isinstance(doc.get("credentialSubject"), dict) else {}
    achievement = subject.get("achievement") if isinstance(subject.get("achievement"), dict) else {}
    issuer = doc.get("issuer") if isinstance(doc.get("issuer"), dict) else {"id": doc.get("issuer")}
    ids = subject.get("identifier") if isinstance(subject.get("identifier"), list) else []
    ids = [i for i in ids if isinstance(i, dict)]
    name = next((i.get("identityHash") for i in ids if i.get("identityType") == "name"), None)
    email = next((i for i in ids if i.get("identityType") == "emailAddress"), None)
    criteria = achievement.get("criteria") if isinstance(achievement.get("criteria"), dict) else {}
    others = achievement.get("otherIdentifier") if isinstance(achievement.get("otherIdentifier"), list) else []
    bank = next((o.get("identifier") for o in others
                 if isinstance(o, dict) and o.get("identifierType") == "ext:examBank"), None)
    return {
        "name": name, "achievement": achievement.get("name"),
        "description": achievement.get("description"), "criteria": criteria.get("narrative"),
        "course_version": achievement.get("version"), "exam_bank": bank, "valid_from": doc.get("validFrom"),
        "valid_until": doc.get("validUntil"), "issuer_name": issuer.get("name"),
        "issuer_id": issuer.get("id"), "issuer_url": issuer.get("url"), "credential_id": doc.get("id"),
        "email": "salted SHA-256 hash" if email else "none",
    }
