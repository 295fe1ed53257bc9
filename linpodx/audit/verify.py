"""Verification beyond one file: sealed checkpoints and cross-anchors between chains.

A hash chain alone proves only that a file is internally consistent. Someone with the user's
rights can rewrite a whole log into a fresh, valid chain, or cut records off its end. What we
detect, and how:

- **Seals** (`linpodx audit seal`) print `SEQ:HASH` of the current last record. Kept somewhere
  the user's account cannot rewrite (a ticket, another machine, paper), a seal lets
  `linpodx audit verify --anchor SEQ:HASH` prove the log still holds that exact record, and
  therefore (through `prev`) every record before it. Rewriting, replacing or truncating the
  log at or before the sealed record is detected. Records after the last seal are protected
  only by the cross-anchors below.
- **Cross-anchors**: a session chain starts from the `audit_hash` of the profile revision it
  runs under, which is the hash of a `profile.apply` record in the admin chain; the admin chain
  records `session.open` (head and first hash) and `session.close` (tail hash and record count)
  for each session. Rewriting or truncating a closed session's log no longer matches the admin
  chain; replacing the admin chain loses the `profile.apply` records the sessions start from.
  Rewriting BOTH logs consistently (and the profile store) is not detected without a seal.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from linpodx.audit.chain import (
    NotALog,
    Record,
    VerifyReport,
    admin_chain,
    check_regular,
    first_record,
    session_path,
    verify_file,
)
from linpodx.audit.core import ZERO_HASH
from linpodx.errors import AuditError, ChainBroken, LinpodxError, NotFound, UsageError
from linpodx.fsutil import present
from linpodx.output import safe_text
from linpodx.paths import sessions_audit_dir

BUILTIN_PROFILE_ID = "builtin"
"""profile_id of the built-in default profile (`linpodx.profile.model.BUILTIN_ID`; the audit
package does not import the profile package, `linpodx.integrity` holds the two equal)."""
_ANCHOR_RE = re.compile(r"^([0-9]{1,15}):([0-9a-f]{64})\Z")


def log_present(path: Path) -> bool:
    """Is anything at a log's path? A file where its directory belongs (`sessions/` replaced
    by a file) means no log there, as `verify --all` and the admin chain's checks say: the
    log is missing, not the state dir unusable. Other errors (EACCES) are raised."""
    try:
        return present(path)
    except NotADirectoryError:
        return False


def _q(value: str, limit: int = 80) -> str:
    """A value read from a log or the store, as a message may quote it: escaped (a newline in
    a forged `profile_id` must not print a line of its own on the terminal), capped."""
    return safe_text(value, limit)


def parse_anchor(text: str) -> tuple[int, str]:
    """`SEQ:HASH` (as printed by `linpodx audit seal`) -> (seq, hash)."""
    m = _ANCHOR_RE.fullmatch(text.strip().lower())
    if not m:
        raise UsageError(
            f"invalid anchor {text!r}: expected SEQ:HASH",
            "use the `anchor:` value printed by `linpodx audit seal`, e.g. 41:3fa9…(64 hex)",
        )
    return int(m.group(1)), m.group(2)


def anchors_map(anchors: Iterable[tuple[int, str]]) -> dict[int, str]:
    """Merge anchors; two different hashes for one seq cannot both hold."""
    out: dict[int, str] = {}
    for seq, h in anchors:
        if out.get(seq, h) != h:
            raise UsageError(
                f"two different anchors for seq {seq}", "give each sealed checkpoint once"
            )
        out[seq] = h
    return out


STORE_CHANGED = "the stored revision was changed after it was applied"
"""How a store/record mismatch ends (`raise_broken` gives it its own hint)."""
NOT_CLOSED = "no session.close yet: records after the last seal are not anchored"
"""The note of a session the admin chain has not seen closed (the bridge still runs, or it
ended without its closing record); `audit verify --session` also says it as a warning."""


class ProfileChecks(Protocol):
    """The cross-checks against the profile store and the built-in profile: what the records
    say is judged against what the store holds. Implemented above both packages
    (`linpodx.integrity`); the audit package alone uses `NO_PROFILES`."""

    def store(self, applies: Mapping[str, Record]) -> tuple[list[str], list[str]]:
        """(problems, notes): every stored revision against the profile.apply records, by hash."""
        ...

    def revision(self, profile_id: str, audit_hash: str) -> tuple[list[str], list[str]]:
        """(problems, notes): the revision a session names against the store's copy."""
        ...

    def builtin_note(self, audit_hash: str | None) -> str:
        """What to say of a session under the built-in profile with this audit_hash."""
        ...


class _NoProfiles:
    """The checks when no profile store is wired in: nothing cross-checked, and said so."""

    def store(self, applies: Mapping[str, Record]) -> tuple[list[str], list[str]]:
        return [], ["profile store not available: profile revisions not cross-checked"]

    def revision(self, profile_id: str, audit_hash: str) -> tuple[list[str], list[str]]:
        return [], ["profile store not available: revision not cross-checked"]

    def builtin_note(self, audit_hash: str | None) -> str:
        return "runs under the built-in default profile"


NO_PROFILES: ProfileChecks = _NoProfiles()


@dataclass(frozen=True)
class ChainCheck:
    """The outcome of verifying one chain with everything that anchors it."""

    report: VerifyReport
    """The file's own verification (with anchors applied)."""
    problems: tuple[str, ...] = ()
    """Cross-anchor failures, each a sentence; any of them means tampering."""
    notes: tuple[str, ...] = ()
    """What was checked against what, and what could not be (for people)."""
    session_id: str | None = None
    profile_id: str | None = None
    unreadable: str | None = None
    """Why the log could not be read at all (then nothing in it was verified; `report.reason`
    repeats it and `report.hint` says what to do); None when it was read."""

    @property
    def ok(self) -> bool:
        """True when the file verifies and no cross-anchor failed."""
        return self.report.ok and not self.problems and self.unreadable is None

    def to_dict(self) -> dict[str, Any]:
        """Plain data for `--json`."""
        d = self.report.to_dict()
        d.update(
            ok=self.ok,
            session_id=self.session_id,
            profile_id=self.profile_id,
            problems=list(self.problems),
            notes=list(self.notes),
            unreadable=None
            if self.unreadable is None
            else {"message": self.unreadable, "hint": self.report.hint},
        )
        return d


@dataclass
class AdminIndex:
    """What the admin chain says about profiles and sessions."""

    applies: dict[str, Record] = field(default_factory=dict)
    opens: dict[str, Record] = field(default_factory=dict)
    closes: dict[str, Record] = field(default_factory=dict)

    def before(self, seq: int) -> AdminIndex:
        """Only what the records before `seq` say."""
        return AdminIndex(
            applies={k: r for k, r in self.applies.items() if r.seq < seq},
            opens={k: r for k, r in self.opens.items() if r.seq < seq},
            closes={k: r for k, r in self.closes.items() if r.seq < seq},
        )

    def collect(self, rec: Record) -> None:
        if rec.seq == 0:  # verify_file starts over (a second look under the lock)
            self.applies.clear()
            self.opens.clear()
            self.closes.clear()
        if rec.type == "profile.apply":
            self.applies[rec.hash] = rec
        elif rec.type in ("session.open", "session.close"):
            sid = rec.data.get("session_id")
            if isinstance(sid, str):
                (self.opens if rec.type == "session.open" else self.closes)[sid] = rec


def _admin_scan() -> tuple[VerifyReport | None, AdminIndex]:
    index = AdminIndex()
    path = admin_chain().path
    if not present(path):
        return None, index
    return verify_file(path, collect=index.collect), index


def verify_admin(
    anchors: Mapping[int, str] | None = None, *, checks: ProfileChecks = NO_PROFILES
) -> ChainCheck:
    """Verify the admin chain, its seals, and (`checks`) that the profile store's revisions are
    in it."""
    path = admin_chain().path
    if not present(path) and not anchors:
        gone = _admin_log_deleted(str(path), checks)
        if gone is not None:
            return gone
        raise NotFound(
            f"no admin audit log yet ({path})",
            "it is created by the first recorded action, "
            "e.g. `linpodx sandbox apply --profile FILE`",
        )
    index = AdminIndex()
    if present(path):
        report = verify_file(path, anchors=anchors, collect=index.collect)
    else:
        # Sealed, yet gone: the log was deleted. Report it as the broken chain it is.
        report = _missing(
            path, "the admin log is missing but an anchor names a record in it: deleted"
        )
    problems: list[str] = []
    notes: list[str] = []
    if report.ok:
        problems, notes = checks.store(index.applies)
        for sid, rec in sorted(index.opens.items(), key=lambda kv: kv[1].seq):
            try:
                spath = session_path(sid)
                check_regular(spath)
            except NotALog as exc:
                problems.append(
                    f"session {_q(sid)} was opened at admin seq {rec.seq} but its audit log is "
                    f"{exc.kind}, not a regular file: it is not a log linpodx wrote"
                )
            except (AuditError, FileNotFoundError, NotADirectoryError):
                problems.append(
                    f"session {_q(sid)} was opened at admin seq {rec.seq} but its audit log is "
                    "missing: the session log was deleted"
                )
            except OSError as exc:
                problems.append(
                    f"session {_q(sid)} was opened at admin seq {rec.seq} but its audit log cannot "
                    f"be looked at: {exc.strerror or exc}"
                )
        if index.opens:
            notes.append(f"{len(index.opens)} session log(s) opened in this chain are present")
    return ChainCheck(report=report, problems=tuple(problems), notes=tuple(notes))


def _missing(path: Path | str, reason: str, hint: str | None = None) -> VerifyReport:
    """The report of a log that is not there although it should be: broken at seq 0."""
    return VerifyReport(
        ok=False,
        events=0,
        head=ZERO_HASH,
        tail=ZERO_HASH,
        first_bad_seq=0,
        reason=reason,
        torn_tail=False,
        log_id=None,
        path=str(path),
        hint=hint,
    )


def _admin_log_deleted(path: str, checks: ProfileChecks) -> ChainCheck | None:
    """With no admin log: the broken chain it is if anything exists that it should have
    recorded (a profile revision is stored only after its profile.apply record, a session log
    only next to its session.open); None on a fresh install."""
    problems, _notes = checks.store({})
    try:
        sessions = session_ids()
    except OSError:
        sessions = []
    what = []
    if problems:
        what.append(f"{len(problems)} stored profile revision(s)")
    if sessions:
        what.append(f"{len(sessions)} session log(s)")
    if not what:
        return None
    report = _missing(
        path,
        f"the admin log is missing, but {' and '.join(what)} exist that it recorded: "
        "the admin log was deleted",
        hint="keep the profile store and the session logs as evidence; linpodx cannot "
        "restore the admin log, and the sessions can no longer be anchored",
    )
    return ChainCheck(report=report, problems=tuple(problems))


def verify_session(
    session_id: str,
    anchors: Mapping[int, str] | None = None,
    *,
    admin_scan: tuple[VerifyReport | None, AdminIndex] | None = None,
    recheck: bool = True,
    checks: ProfileChecks = NO_PROFILES,
) -> ChainCheck:
    """Verify one session chain against its profile anchor, the admin chain, seals and
    (`checks`) the profile store.

    `admin_scan` reuses one scan of the admin chain across many sessions (verify --all);
    `recheck=False` trusts it even when the session seems never opened (no second scan).
    """
    try:
        path = session_path(session_id)
    except AuditError:
        path = None
    problems: list[str] = []
    notes: list[str] = []
    admin_report, index = _read_admin(admin_scan, problems)
    path = _session_log(session_id, path, index)
    index, admin_whole = _admin_standing(admin_report, index, problems)
    claim = _first_claim(session_id, path, problems)
    admin = _SessionInAdmin.of(session_id, index, claim, anchors, problems)
    report = verify_file(path, admin.genesis, check_genesis=admin.genesis is not None,
                         anchors=admin.anchors)  # fmt: skip
    _check_profile_anchor(claim, admin, index, admin_report, admin_whole, checks, report,
                          problems, notes)  # fmt: skip
    if admin.opened is None and report.events > 1 and recheck and admin_whole:
        # The admin chain was read before this log: a session opened meanwhile has its
        # session.open there now. Look once more before calling it forged.
        try:
            fresh = _admin_scan()
        except AuditError:
            fresh = None
        if fresh is not None and session_id in fresh[1].opens:
            return verify_session(
                session_id, anchors, admin_scan=fresh, recheck=False, checks=checks
            )
    _check_open_close(session_id, admin, admin_whole, report, problems, notes)
    return ChainCheck(
        report=report,
        problems=tuple(problems),
        notes=tuple(notes),
        session_id=session_id,
        profile_id=claim.profile_id,
    )


def _read_admin(
    admin_scan: tuple[VerifyReport | None, AdminIndex] | None, problems: list[str]
) -> tuple[VerifyReport | None, AdminIndex]:
    """The admin chain's scan (the one given, else a fresh one); an unreadable admin chain is a
    problem and an empty index."""
    try:
        return admin_scan if admin_scan is not None else _admin_scan()
    except AuditError as exc:
        problems.append(f"admin chain unreadable ({exc.message}): session not cross-checked")
        return None, AdminIndex()


def _session_log(session_id: str, path: Path | None, index: AdminIndex) -> Path:
    """The session's log, if it is there: ChainBroken if the admin chain opened the session
    (its log was deleted), else NotFound."""
    if path is not None and log_present(path):
        return path
    opened_rec = index.opens.get(session_id)
    if path is not None and opened_rec is not None:
        # The admin chain says this session existed: its log is gone, not unknown.
        raise ChainBroken(
            f"the audit log of session {session_id} is missing, but admin seq "
            f"{opened_rec.seq} recorded that it was opened: the session log was deleted",
            "keep the admin log as evidence; the session's records cannot be recovered "
            "by linpodx",
            details={"session_id": session_id, "admin_seq": opened_rec.seq},
        )
    raise NotFound(
        f"no audit log for session {session_id}",
        "session ids are listed by `linpodx audit show` (session.open records)",
    )


def _admin_standing(
    admin_report: VerifyReport | None, index: AdminIndex, problems: list[str]
) -> tuple[AdminIndex, bool]:
    """(what of the admin chain's index can be trusted, whether the admin chain is whole): a
    missing or broken admin chain is a problem, and only a whole one can vouch that something
    is NOT in it."""
    if admin_report is None and not problems:
        problems.append(
            "there is no admin log, so the profile revision this session claims to run under "
            "is recorded nowhere: the admin log was deleted or the session log forged"
        )
    if admin_report is not None and not admin_report.ok:
        problems.append(
            f"the admin chain that anchors this session is broken at seq "
            f"{admin_report.first_bad_seq}: {admin_report.reason}"
        )
        # What the admin chain says from its break on proves nothing about this session: the
        # record before the first bad one may be the edited one (its hash recomputed, the
        # break then shows at the next record's prev). Anchors from there would blame an
        # intact session log for the admin chain's damage.
        index = index.before(max(0, (admin_report.first_bad_seq or 0) - 1))
    return index, admin_report is not None and admin_report.ok


@dataclass(frozen=True)
class _Claim:
    """What the session log's first record says it runs under."""

    profile_id: str | None
    audit_hash: str | None


def _first_claim(session_id: str, path: Path, problems: list[str]) -> _Claim:
    """The first record's profile id and audit_hash; a first record that names another
    session (or none) is a problem."""
    first = first_record(path)
    if first is None:
        return _Claim(None, None)
    pid, ah = first.data.get("profile_id"), first.data.get("audit_hash")
    named = first.data.get("session_id")
    if named != session_id:
        # A log copied or renamed from another session (or forged without one): its
        # records are someone else's, whatever its chain says.
        problems.append(
            "the session's first record names no session id"
            if not isinstance(named, str)
            else f"the session's first record names session {_q(named)}, not "
            f"{session_id}: this log was copied or renamed from another session"
        )
    return _Claim(pid if isinstance(pid, str) else None, ah if isinstance(ah, str) else None)


@dataclass(frozen=True)
class _SessionInAdmin:
    """What the admin chain (and the seals given) say of one session."""

    opened: Record | None
    closed: Record | None
    close_events: int | None
    """The record count session.close gives, if it gives a usable one."""
    genesis: str | None
    """What the session started from: session.open's head, else the first record's claim
    (then checked against the admin chain's profile.apply records)."""
    anchors: dict[int, str]
    """seq -> hash the session log must hold: session.open's first, session.close's tail,
    the seals."""

    @classmethod
    def of(
        cls,
        session_id: str,
        index: AdminIndex,
        claim: _Claim,
        seals: Mapping[int, str] | None,
        problems: list[str],
    ) -> _SessionInAdmin:
        opened = index.opens.get(session_id)
        closed = index.closes.get(session_id)
        genesis = None
        if opened is not None and isinstance(opened.data.get("head"), str):
            genesis = str(opened.data["head"])
        elif claim.audit_hash is not None:
            genesis = claim.audit_hash
        cross: dict[int, str] = {}
        if opened is not None and isinstance(opened.data.get("first"), str):
            cross[0] = str(opened.data["first"])
        close_events: int | None = None
        if closed is not None:
            ev, tail = closed.data.get("events"), closed.data.get("tail")
            if isinstance(ev, int) and isinstance(tail, str) and ev > 0:
                close_events = ev
                if cross.get(ev - 1, tail) != tail:
                    problems.append("the admin chain's session.open and session.close disagree")
                cross[ev - 1] = tail
        merged = dict(cross)
        for seq, h in (seals or {}).items():
            if merged.get(seq, h) != h:
                problems.append(f"the anchor for seq {seq} disagrees with the admin chain's")
            merged.setdefault(seq, h)
        return cls(opened, closed, close_events, genesis, merged)


def _check_profile_anchor(
    claim: _Claim,
    admin: _SessionInAdmin,
    index: AdminIndex,
    admin_report: VerifyReport | None,
    admin_whole: bool,
    checks: ProfileChecks,
    report: VerifyReport,
    problems: list[str],
    notes: list[str],
) -> None:
    """The profile revision the session claims: named at all, the one the admin chain opened
    it from, applied in the admin chain (or the built-in profile, opened there), and (`checks`)
    what the profile store holds."""
    profile_id, audit_hash, genesis = claim.profile_id, claim.audit_hash, admin.genesis
    if audit_hash is None:
        if report.ok or report.first_bad_seq != 0:  # else the report already says why
            problems.append("the session's first record names no profile audit_hash")
    elif genesis is not None and audit_hash != genesis:
        problems.append(
            f"the session's first record names audit_hash {_q(audit_hash[:12])}…, but the "
            f"admin chain opened it from {_q(genesis[:12])}…"
        )
    if profile_id == BUILTIN_PROFILE_ID:
        # The built-in default profile is never applied, so no profile.apply record exists:
        # its audit_hash is the digest of its canonical form, and the session is anchored by
        # session.open/session.close alone.
        if admin.opened is None and admin_whole:
            problems.append(
                "a session under the built-in profile must be opened in the admin chain "
                "(session.open), and this one is not: the session log was forged"
            )
        notes.append(checks.builtin_note(audit_hash))
    elif audit_hash is not None and admin_report is not None:
        apply = index.applies.get(audit_hash)
        if apply is None and not admin_whole:
            notes.append(
                "the profile revision's profile.apply record is not in the admin chain before "
                "its break: not cross-checked"
            )
        elif apply is None:
            problems.append(
                f"no profile.apply record with hash {_q(audit_hash[:12])}… in the admin chain: "
                "the session log was forged or the admin log rewritten"
            )
        else:
            apid = apply.data.get("profile_id")
            if profile_id is not None and isinstance(apid, str) and apid != profile_id:
                problems.append(
                    f"the session names profile {_q(profile_id)}, but admin seq {apply.seq} "
                    f"applied {_q(apid)}"
                )
            else:
                notes.append(f"profile revision anchored at admin seq {apply.seq}")
    if profile_id is not None and audit_hash is not None and profile_id != BUILTIN_PROFILE_ID:
        found, said = checks.revision(profile_id, audit_hash)
        problems.extend(found)
        notes.extend(said)


def _check_open_close(
    session_id: str,
    admin: _SessionInAdmin,
    admin_whole: bool,
    report: VerifyReport,
    problems: list[str],
    notes: list[str],
) -> None:
    """The session's session.open and session.close in the admin chain: a log with records
    the admin chain never opened, or more records than its close counted, is a problem."""
    opened, closed, close_events = admin.opened, admin.closed, admin.close_events
    if opened is None and not admin_whole:
        notes.append(
            "no session.open in what could be read of the admin chain: not cross-checked"
        )
    elif opened is None:
        if report.events > 1:
            # open_session writes session.start, then session.open, and the session records
            # nothing more unless both went in: more than the first record without session.open
            # is a log the admin chain never opened (copied, renamed or forged).
            problems.append(
                f"no session.open for {session_id} in the admin chain, yet its log holds "
                f"{report.events} records: a session log nobody opened (forged, copied or "
                "renamed)"
            )
        else:
            notes.append(
                "no session.open in the admin chain: the session was never opened (a crash "
                "between its first record and the admin chain's?); anchored only by its profile"
            )
    else:
        notes.append(f"opened at admin seq {opened.seq}")
    if closed is None:
        notes.append(NOT_CLOSED)
    else:
        notes.append(f"closed at admin seq {closed.seq} with {close_events} record(s)")
        if report.ok and close_events is not None and report.events > close_events:
            problems.append(
                f"{report.events - close_events} record(s) after the session was closed "
                f"(admin seq {closed.seq} says {close_events})"
            )


def session_ids() -> list[str]:
    """Ids of the session logs present on disk, oldest first (ids are ULID-based)."""
    base = sessions_audit_dir()
    if not base.is_dir():
        return []
    out = []
    for entry in sorted(base.glob("*.jsonl")):
        sid = entry.name[: -len(".jsonl")]
        try:
            session_path(sid)
        except AuditError:
            continue
        out.append(sid)
    return out


def verify_all(
    anchors: Mapping[int, str] | None = None, *, checks: ProfileChecks = NO_PROFILES
) -> tuple[ChainCheck, list[ChainCheck]]:
    """The admin chain (with `anchors`) and every session log against it. A session log that
    cannot be read (permissions, an I/O error, gone since it was listed) is reported as such
    (`ChainCheck.unreadable`) and the others are verified all the same."""
    admin = verify_admin(anchors, checks=checks)
    scan = _admin_scan()
    sessions = []
    for sid in session_ids():
        try:
            sessions.append(verify_session(sid, admin_scan=scan, checks=checks))
        except ChainBroken as exc:  # gone since listed, though the admin chain opened it
            sessions.append(_failed(sid, exc, first_bad_seq=0))
        except LinpodxError as exc:  # AuditError (could not read it), NotFound (gone)
            sessions.append(_failed(sid, exc, first_bad_seq=None))
    return admin, sessions


def _failed(session_id: str, exc: LinpodxError, *, first_bad_seq: int | None) -> ChainCheck:
    """The verdict on a session log that could not be verified at all: damage (`first_bad_seq`
    0) or unreadable (None)."""
    try:
        path = str(session_path(session_id))
    except AuditError:
        path = ""
    report = VerifyReport(
        ok=False,
        events=0,
        head=ZERO_HASH,
        tail=ZERO_HASH,
        first_bad_seq=first_bad_seq,
        reason=exc.message,
        torn_tail=False,
        log_id=None,
        path=path,
        hint=exc.hint
        if first_bad_seq is not None
        else f"{exc.hint or 'check the file'}; then verify it alone with "
        f"`linpodx audit verify --session {session_id}` (the other logs were verified)",
    )
    unreadable = None if first_bad_seq is not None else exc.message
    return ChainCheck(report=report, session_id=session_id, unreadable=unreadable)


@dataclass(frozen=True)
class Seal:
    """A checkpoint to keep outside this account: the last record's seq and hash."""

    path: str
    seq: int
    hash: str
    log_id: str | None
    events: int

    @property
    def anchor(self) -> str:
        """`SEQ:HASH`, the form `linpodx audit verify --anchor` takes."""
        return f"{self.seq}:{self.hash}"

    def to_dict(self) -> dict[str, Any]:
        """Plain data for `--json`."""
        return {
            "log": self.path,
            "log_id": self.log_id,
            "seq": self.seq,
            "hash": self.hash,
            "events": self.events,
            "anchor": self.anchor,
        }


def seal(session_id: str | None = None, *, checks: ProfileChecks = NO_PROFILES) -> Seal:
    """Verify a chain and return a checkpoint of its last record (refuses a broken chain)."""
    check = (
        verify_session(session_id, checks=checks) if session_id else verify_admin(checks=checks)
    )
    r = check.report
    if not check.ok:
        raise_broken(check)
    if r.events == 0:
        raise NotFound(
            f"the audit log {r.path} has no records to seal",
            "a seal names the last record, so seal after the first recorded action "
            "(e.g. `linpodx sandbox apply --profile FILE`)",
        )
    return Seal(path=r.path, seq=r.events - 1, hash=r.tail, log_id=r.log_id, events=r.events)


def raise_broken(check: ChainCheck) -> None:
    """Raise ChainBroken describing the first failure of `check`."""
    r = check.report
    hint = (
        "the log was changed after it was written; keep the file as evidence and compare it "
        "with your last seal (`linpodx audit seal`)"
    )
    if not r.ok:
        msg = f"audit chain broken at seq {r.first_bad_seq}: {r.reason}"
        hint = r.hint or hint
    else:
        msg = f"audit chain does not match its anchors: {check.problems[0]}"
        if STORE_CHANGED in check.problems[0]:
            # The chain is intact; what changed is the profile store's copy of a revision.
            hint = (
                "the stored profile revision was changed after it was applied; keep the "
                "profile store and the admin log as evidence, and apply the profile again from "
                "a file you trust (`linpodx sandbox apply --profile FILE`)"
            )
    raise ChainBroken(msg, hint, details=check.to_dict())
