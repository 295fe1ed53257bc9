"""The integrity of linpodx's records as a whole: audit chains, the profile store and the
built-in profile, checked against each other.

`linpodx.audit.verify` proves what the chains say (hashes, links, seals, cross-anchors between
the admin chain and the session chains); it does not know the profile package. This module sits
above both: it hands the audit verifier the checks that need the store (`StoreChecks`), so a
stored revision must be a `profile.apply` record of the admin chain and hold what that record
says was applied, a session must start from a revision the store still has, and a session under
the built-in profile is told apart from one under another linpodx version's built-in profile.
`linpodx audit verify` and `seal` call the functions here.
"""

from __future__ import annotations

from collections.abc import Mapping

from linpodx.audit import verify as audit_verify
from linpodx.audit.chain import Record, VerifyReport
from linpodx.audit.verify import STORE_CHANGED, AdminIndex, ChainCheck, Seal
from linpodx.errors import LinpodxError, NotFound
from linpodx.output import safe_text
from linpodx.profile import store
from linpodx.profile.model import builtin_ref

__all__ = ["StoreChecks", "seal", "verify_admin", "verify_all", "verify_session"]

def _q(value: str, limit: int = 80) -> str:
    """A value read from a log or the store, escaped and capped (it may be forged)."""
    return safe_text(value, limit)


class StoreChecks:
    """`audit.verify.ProfileChecks` against the profile store and this linpodx's built-in
    profile."""

    def store(self, applies: Mapping[str, Record]) -> tuple[list[str], list[str]]:
        """Every stored profile revision's audit_hash must be a profile.apply record of the
        chain (`applies`, by hash), and the revision must be what that record says."""
        problems: list[str] = []
        try:
            # Every revision of every applied profile (older ones too: replacing the admin log
            # and re-applying the same file would otherwise pass).
            stored = [rev for sp in store.list_profiles() for rev in store.history(sp.name)]
        except LinpodxError as exc:
            return [], [f"profile store not readable ({exc.message}): not cross-checked"]
        for sp in stored:
            ah, name, rev = sp.audit_hash, sp.name, sp.revision
            applied = applies.get(ah)
            if applied is None:
                problems.append(
                    f"profile {name!r} revision {_q(str(rev))} was applied with audit_hash "
                    f"{_q(ah[:12])}…, which "
                    "is not a profile.apply record of the admin chain: the admin log was "
                    "rewritten or replaced"
                )
                continue
            # The store's own digest check only says the file matches the digest written in
            # it, which whoever edits the file can recompute; the record says what was applied.
            differs = [
                key
                for key, value in (
                    ("digest", sp.digest),
                    ("profile_id", sp.profile_id),
                    ("revision", rev),
                    ("name", name),
                )
                if applied.data.get(key) != value
            ]
            if differs:
                problems.append(
                    f"profile {name!r} revision {_q(str(rev))} in the profile store is not what "
                    f"its profile.apply record (admin seq {applied.seq}) says was applied "
                    f"({', '.join(differs)} differ): {STORE_CHANGED}"
                )
        if stored:
            return problems, [f"{len(stored)} profile revision(s) found in the admin chain"]
        return problems, []

    def revision(self, profile_id: str, audit_hash: str) -> tuple[list[str], list[str]]:
        """The revision a session names must be in the store, with the hash it starts from."""
        try:
            sp = store.get_by_id(profile_id)
        except NotFound:
            return [f"profile revision {_q(profile_id)} is not in the profile store"], []
        except LinpodxError as exc:
            return [], [f"profile store not readable ({exc.message})"]
        if sp.audit_hash != audit_hash:
            return [
                f"the profile store says {_q(profile_id)} has audit_hash "
                f"{_q(str(sp.audit_hash)[:12])}…, the session starts from {_q(audit_hash[:12])}…"
            ], []
        return [], [f"profile {_q(profile_id)} matches the profile store"]

    def builtin_note(self, audit_hash: str | None) -> str:
        """Whether a built-in-profile session ran under this linpodx's built-in profile."""
        if audit_hash == builtin_ref().audit_hash:
            return "runs under the built-in default profile (digest matches this linpodx)"
        return (
            "runs under the built-in default profile of another linpodx version (digest differs)"
        )


CHECKS = StoreChecks()


def verify_admin(anchors: Mapping[int, str] | None = None) -> ChainCheck:
    """The admin chain, its seals, and the profile store against it."""
    return audit_verify.verify_admin(anchors, checks=CHECKS)


def verify_session(
    session_id: str,
    anchors: Mapping[int, str] | None = None,
    *,
    admin_scan: tuple[VerifyReport | None, AdminIndex] | None = None,
    recheck: bool = True,
) -> ChainCheck:
    """One session chain against its profile anchor, the admin chain, seals and the store
    (`admin_scan` and `recheck` as for `audit.verify.verify_session`)."""
    return audit_verify.verify_session(
        session_id, anchors, admin_scan=admin_scan, recheck=recheck, checks=CHECKS
    )


def verify_all(anchors: Mapping[int, str] | None = None) -> tuple[ChainCheck, list[ChainCheck]]:
    """The admin chain and every session log, each with the store's cross-checks."""
    return audit_verify.verify_all(anchors, checks=CHECKS)


def seal(session_id: str | None = None) -> Seal:
    """A checkpoint of a chain's last record, after verifying it with the store's checks."""
    return audit_verify.seal(session_id, checks=CHECKS)
