"""Applied profiles: every revision kept, each recorded in the admin audit chain first.

Layout under `profiles_dir()` (dirs 0700, files 0600, every write atomic):

    .lock                    flock held by apply/remove, so concurrent applies serialize
    revisions/<prof_ID>.json one file per revision, never changed or deleted afterwards
    names/<NAME>.json        the name's pointer: current revision id (null once removed) and the
                             last revision number (kept, so a re-applied name continues counting)

Order of an apply (under the lock): load and normalize → digest → compare with the current
revision (equal: nothing is written or audited) → stage, as fsynced temp files, everything that
needs disk space: the revision file (a same-length placeholder where the record's hash goes),
the final pointer, the old pointer (to take the note back) and the pointer with the apply noted
as *pending* (its new id and revision number) → rename the noted pointer into place → append
`profile.apply` to the admin chain (AuditError or a failed write before it: the note is taken
back, nothing stored) → write the record's hash over the placeholder, in place → rename the
revision file, then the final pointer, into place. After the record nothing needs new disk
space, so a full disk stops a change before its record or not at all; `remove` and the
settling below are staged the same way. A new revision number is one more than every number
of the name in its pointer, its revision files and the audit log.

A pointer file is exactly `{name, pending}` (a first apply under way) or `{name,
last_revision, current?, removed_at?, pending? | removing?}` with `current` an existing
revision of the name; anything else is damage (ChainBroken), never "not applied".

A removal marks the pointer `removing` (its current id and number) before its `profile.rm`
record and clears `current` after it. A pointer found marked belongs to an interrupted
removal: nobody uses that profile until the next apply or remove settles it, by the admin
log: removed if the log's last `profile.*` record of the name is that `profile.rm`, else kept
as it was.

A crash (kill -9, power loss) can stop an apply between any two of those steps. The next apply
or remove of that name finishes or closes it first (`_settle`): if the pending revision file
was written (so its audit record was too), the pointer is moved to it, as the interrupted
apply would have done; if not, a `profile.apply.abandoned` record says that revision (id and
number) was never stored, whether or not its `profile.apply` record made it into the chain.
Either way its number is never given to another revision. Until then, runs use the revision
that was current before the interrupted apply.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import re
from collections.abc import Iterator
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from linpodx import paths
from linpodx.canonical import CanonicalError, canonical_bytes
from linpodx.errors import (
    EXIT_TAMPERED,
    AuditError,
    ChainBroken,
    InvalidInput,
    LinpodxError,
    NotFound,
    ProfileError,
)
from linpodx.fsutil import discard, fsync_dir, is_dir
from linpodx.fsutil import stage as stage_file
from linpodx.ids import is_id, new_id
from linpodx.output import safe_text
from linpodx.profile import pointer as pointer_file
from linpodx.profile.loader import load_file, profile_from_dict, schema, schema_digest
from linpodx.profile.model import Profile

APPLY_HINT = "run `linpodx sandbox apply --profile FILE` to apply it (see `linpodx sandbox list`)"
REVISION_FORMAT = 1
MAX_RECORD_BYTES = pointer_file.MAX_BYTES
WRITE_HINT = (
    "check that linpodx's state directory is writable and the disk is not full (df -h); "
    "nothing was changed or recorded"
)
_HASH_PLACEHOLDER = "?" * 64
"""Stands in the staged revision file for the audit hash, which exists only once the record
is written; replaced in place (same length, so no new disk space) after the record."""
_HEX64 = re.compile(r"[0-9a-f]{64}")


@dataclass(frozen=True)
class ApplyResult:
    """What `apply` did."""

    name: str
    profile_id: str
    """`prof_<ULID>` of the current revision (the new one, or the unchanged one)."""
    revision: int
    audit_hash: str
    """Hash of the `profile.apply` audit record of that revision."""
    changed: bool
    """False when the file normalized to the current revision: nothing written or audited."""
    digest: str = ""
    """sha256 of the canonical JSON of the normalized profile."""

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form."""
        return {
            "name": self.name,
            "profile_id": self.profile_id,
            "revision": self.revision,
            "audit_hash": self.audit_hash,
            "changed": self.changed,
            "digest": self.digest,
        }


@dataclass(frozen=True)
class StoredProfile:
    """One applied revision of a profile."""

    profile: Profile
    name: str
    profile_id: str
    revision: int
    audit_hash: str
    applied_at: str
    """UTC time of the apply, ISO 8601 with `Z`."""
    digest: str = ""
    source: str = ""
    """The file it was applied from (as an absolute path)."""
    current: bool = True
    """False for an older revision, or one of a removed profile."""
    removing: bool = False
    """True while a `sandbox rm` of it that was interrupted awaits settling: `list` shows it,
    `get` and every run refuse it (module doc)."""

    @property
    def state(self) -> str:
        """`applied`, or `removing` (see `removing`)."""
        return "removing" if self.removing else "applied"

    def summary(self) -> dict[str, Any]:
        """The fields `sandbox list` shows; `hint` says how to settle a profile not `applied`."""
        return {
            "name": self.name,
            "revision": self.revision,
            "profile_id": self.profile_id,
            "applied_at": self.applied_at,
            "audit_hash": self.audit_hash,
            "state": self.state,
            "hint": interrupted_rm_hint(self.name) if self.removing else None,
        }


def interrupted_rm_hint(name: str) -> str:
    """What to do about a profile whose `sandbox rm` was interrupted (pointer marked)."""
    return (
        f"run `linpodx sandbox rm {name}` to finish it, or `linpodx sandbox apply` to keep "
        "the profile"
    )


def digest_of(profile: Profile) -> str:
    """sha256 hex of the canonical JSON of the normalized profile (`Profile.digest_form`)."""
    try:
        return hashlib.sha256(canonical_bytes(profile.digest_form())).hexdigest()
    except CanonicalError as exc:  # the loader keeps floats out; fail closed if one slips in
        raise InvalidInput(f"profile {profile.name} has no canonical form: {exc}") from None


def _admin_chain() -> Any:
    """The admin audit chain (a function so tests can swap in a failing one)."""
    from linpodx.audit.chain import admin_chain

    return admin_chain()


def _revisions_dir() -> Path:
    return paths.profiles_dir() / "revisions"


def _names_dir() -> Path:
    return paths.profiles_dir() / "names"


@contextlib.contextmanager
def locked() -> Iterator[None]:
    """Exclusive flock on the store, held by apply and remove (readers rely on atomic files),
    and by whoever must see no other apply until it is done (the egress push after an apply)."""
    # The state dir first: mkdir(parents=True) would create it with the umask's mode.
    paths.ensure_dir(paths.state_dir())
    base = paths.ensure_dir(paths.profiles_dir())
    paths.ensure_dir(base / "revisions")
    paths.ensure_dir(base / "names")
    fd = os.open(base / ".lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW,
                 paths.FILE_MODE)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _read_json(path: Path) -> dict[str, Any] | None:
    # Non-blocking and no links: a FIFO or a device in the store's place must not hang a
    # command that holds the store's lock (`pointer.read_regular`).
    try:
        raw = pointer_file.read_regular(str(path), MAX_RECORD_BYTES)
    except pointer_file.NotRegularFile:
        raise InvalidInput(
            f"{path} is not a regular file",
            "linpodx writes its store as regular files; move this one aside",
        ) from None
    except OSError as exc:
        raise InvalidInput(f"cannot read {path}: {exc.strerror}",
                           "check the permissions of linpodx's state directory") from None
    if raw is None:
        return None
    doc = pointer_file.parse_object(raw, MAX_RECORD_BYTES)
    if doc is None:
        raise ChainBroken(
            f"profile store file {path} is damaged",
            "restore it from a backup, or re-apply the profile with "
            "`linpodx sandbox apply --profile FILE`",
        )
    return doc


def _encode(doc: dict[str, Any]) -> bytes:
    return json.dumps(doc, ensure_ascii=False, indent=2, sort_keys=True).encode()


def _stage(path: Path, data: bytes) -> str:
    """Write `data` to a fsynced temp file beside `path`: the one step of a store change that
    needs disk space (tests make it fail as a full disk would)."""
    return stage_file(path, data)


def _rename(tmp: str, path: Path) -> None:
    """Move a staged file into place: a rename, which needs no new disk space (the steps after
    an audit record are only these; tests stop here as a kill would)."""
    os.replace(tmp, path)


class _Staged:
    """Files staged beside their destinations for one change. Everything the change needs disk
    space for is staged before its audit record; after the record only `put`s (renames) are
    left. Whatever was not put is removed on exit."""

    def __init__(self) -> None:
        self._temps: list[str] = []

    def __enter__(self) -> _Staged:
        return self

    def __exit__(self, *_exc: object) -> None:
        for tmp in self._temps:
            discard(tmp)

    def stage(self, path: Path, data: bytes) -> str:
        tmp = _stage(path, data)
        self._temps.append(tmp)
        return tmp

    def put(self, tmp: str, path: Path, *, recorded: bool = False) -> None:
        """Rename `tmp` into place. `recorded` (after the audit record): the rename is what
        counts; a failed fsync of the directory after it does not undo it, so it is not
        reported as if the change failed."""
        self._temps.remove(tmp)
        try:
            _rename(tmp, path)
        except BaseException:
            self._temps.append(tmp)
            raise
        try:
            fsync_dir(path.parent)
        except OSError:
            if not recorded:
                raise

    def put_recorded(self, tmp: str, path: Path) -> None:
        self.put(tmp, path, recorded=True)


@contextlib.contextmanager
def _state_writes() -> Iterator[None]:
    """A store change that fails for lack of space (or permission) before its audit record
    changed nothing: say so cleanly (exit 6), not as an internal error."""
    try:
        yield
    except OSError as exc:
        raise AuditError(
            f"could not write linpodx's profile store ({paths.profiles_dir()}): "
            f"{exc.strerror or exc}",
            WRITE_HINT,
        ) from None


def _recorded_but_not_done(what: str, exc: OSError, hint: str) -> AuditError:
    return AuditError(f"{what} was recorded in the audit log, but {exc.strerror or exc}", hint)


def valid_name(name: object) -> bool:
    """True for a well-formed profile name (the schema's pattern)."""
    pattern = schema()["properties"]["name"]["pattern"]
    return isinstance(name, str) and re.fullmatch(pattern, name) is not None


def _pointer_path(name: str) -> Path:
    # Loaded profiles passed the schema, but a name from the command line did not: refuse
    # anything that is not a valid name before it becomes part of a path.
    if not valid_name(name):
        raise NotFound(f"profile not found: {safe_text(str(name), 80)}", APPLY_HINT)
    return _names_dir() / f"{name}.json"


def _damaged_pointer(path: Path, problem: str) -> ChainBroken:
    return ChainBroken(
        f"profile store file {path} is damaged: {problem}",
        f"move it aside (`mv {path} {path}.damaged`), then apply the profile again: its "
        "revisions are kept, and the new one gets a number after every number already used "
        "(or restore the file from a backup)",
    )


def _pointer(name: str) -> dict[str, Any] | None:
    """The name's pointer, None if there is none; a file that is not exactly a pointer is
    damage (ChainBroken), never "not applied": that would hand out used revision numbers."""
    path = _pointer_path(name)
    try:
        doc = _read_json(path)
    except ChainBroken:
        raise _damaged_pointer(path, "not a JSON object") from None
    if doc is not None:
        problem = _pointer_problem(name, doc)
        if problem:
            raise _damaged_pointer(path, problem)
    return doc


def _pointer_problem(name: str, doc: dict[str, Any]) -> str | None:
    """What makes `doc` not a pointer of `name`, or None (`pointer.problem`, the rule the fast
    run path applies too)."""
    return pointer_file.problem(name, doc, _load_revision)


def _stored_from(doc: dict[str, Any], where: Path, current: bool) -> StoredProfile:
    try:
        validated = doc.get("schema_digest")
        profile = profile_from_dict(
            doc["profile"],
            str(where),
            validated_with=validated if isinstance(validated, str) else None,
        )
        digest = str(doc["digest"])
        stored = StoredProfile(
            profile=profile,
            name=str(doc["name"]),
            profile_id=str(doc["profile_id"]),
            revision=int(doc["revision"]),
            audit_hash=str(doc["audit_hash"]),
            applied_at=str(doc["applied_at"]),
            digest=digest,
            source=str(doc.get("source", "")),
            current=current,
        )
    except (KeyError, TypeError, ValueError, AttributeError, ProfileError):
        # AttributeError too: without the schema pass (see profile_from_dict), a hand-edited
        # file of the wrong shape can reach the semantic checks; it is refused all the same.
        raise ChainBroken(
            f"profile store file {where} is damaged",
            "re-apply the profile with `linpodx sandbox apply --profile FILE`",
        ) from None
    try:
        actual = digest_of(profile)
    except InvalidInput:  # no canonical form: not what apply stored
        actual = ""
    if actual != digest or profile.name != stored.name:
        raise ChainBroken(
            f"profile revision {stored.profile_id} does not match its digest: the stored file "
            "was changed",
            "run `linpodx audit verify`, then re-apply the profile",
        )
    return stored


def _load_revision(profile_id: str) -> dict[str, Any] | None:
    if not is_id(profile_id, "prof"):
        return None
    return _read_json(_revisions_dir() / f"{profile_id}.json")


def apply(path: Path | str) -> ApplyResult:
    """Load, validate and store `path` as the next revision of its profile (see module doc)."""
    profile = load_file(path)
    digest = digest_of(profile)
    source = os.path.abspath(path)
    name = profile.name
    with _state_writes(), locked():
        pointer = _pointer(name)
        before = (pointer or {}).get("current")
        if pointer is not None:
            pointer = _settle(name, pointer)
        current_id = (pointer or {}).get("current")
        if isinstance(current_id, str):
            doc = _load_revision(current_id)
            if doc is not None and doc.get("digest") == digest:
                stored = _stored_from(doc, _revisions_dir() / f"{current_id}.json", True)
                return ApplyResult(
                    name=name,
                    profile_id=stored.profile_id,
                    revision=stored.revision,
                    audit_hash=stored.audit_hash,
                    # This file's revision may have become current only now, by finishing an
                    # interrupted apply of it: then it is news to the running containers
                    # (the CLI pushes a changed revision's allowlist to their guards).
                    changed=current_id != before,
                    digest=digest,
                )
        revision = _next_revision(name, pointer)
        profile_id = new_id("prof")
        pointer_path = _pointer_path(name)
        revision_path = _revisions_dir() / f"{profile_id}.json"
        revision_data = _encode(
            {
                "format": REVISION_FORMAT,
                "name": name,
                "profile_id": profile_id,
                "revision": revision,
                "digest": digest,
                "audit_hash": _HASH_PLACEHOLDER,
                "applied_at": _now(),
                "source": source,
                "schema_digest": schema_digest(),
                "profile": profile.to_dict(),
            }
        )
        pending = {"profile_id": profile_id, "revision": revision}
        with _Staged() as staged:
            # Everything that needs disk space, before the audit record.
            revision_tmp = staged.stage(revision_path, revision_data)
            final = {"name": name, "current": profile_id, "last_revision": revision}
            final_tmp = staged.stage(pointer_path, _encode(final))
            back_tmp = None if pointer is None else staged.stage(pointer_path, _encode(pointer))
            note = {**(pointer or {}), "name": name, "pending": pending}
            note_tmp = staged.stage(pointer_path, _encode(note))
            try:
                # The pending note, so that a kill after the record is settled by the next
                # apply or remove (module doc).
                staged.put(note_tmp, pointer_path)
                # Audit first: if the record cannot be written, nothing is stored.
                record = _admin_chain().append(
                    "profile.apply",
                    {
                        "name": name,
                        "profile_id": profile_id,
                        "revision": revision,
                        "digest": digest,
                        "source": source,
                    },
                )
            except (AuditError, OSError):
                # Not recorded: take the note back (a new name gets no pointer at all). Should
                # that fail too, the next apply closes the note as abandoned.
                with contextlib.suppress(OSError):
                    if back_tmp is not None:
                        staged.put(back_tmp, pointer_path)
                    else:
                        pointer_path.unlink(missing_ok=True)
                raise
            audit_hash = str(record.hash)
            try:
                _fill_hash(revision_tmp, revision_data, audit_hash)
                staged.put_recorded(revision_tmp, revision_path)
                staged.put_recorded(final_tmp, pointer_path)
            except OSError as exc:
                raise _recorded_but_not_done(
                    f"the apply of {name} (revision {revision})",
                    exc,
                    "fix the state directory (df -h, permissions), then run `linpodx sandbox "
                    "apply --profile FILE` again: it first settles this interrupted apply (its "
                    "number is not reused)",
                ) from None
    return ApplyResult(name, profile_id, revision, audit_hash, True, digest)


def _fill_hash(tmp: str, data: bytes, audit_hash: str) -> None:
    """Write the record's hash over the placeholder of a staged revision file, in place."""
    if not _HEX64.fullmatch(audit_hash):
        raise OSError(f"the audit record's hash {audit_hash[:80]!r} is not a sha256 hex digest")
    marker = f'\n  "audit_hash": "{_HASH_PLACEHOLDER}"'.encode()
    offset = data.index(marker) + len(marker) - len(_HASH_PLACEHOLDER) - 1
    fd = os.open(tmp, os.O_WRONLY | os.O_CLOEXEC | os.O_NOFOLLOW)
    try:
        if os.pwrite(fd, audit_hash.encode(), offset) != len(audit_hash):
            raise OSError("short write of the audit hash")
        os.fsync(fd)
    finally:
        os.close(fd)


def _next_revision(name: str, pointer: dict[str, Any] | None) -> int:
    """One more than every revision number `name` has used: in its pointer, in stored revision
    files, and in the audit log. A pointer moved aside or restored from an old backup must not
    make a number be given twice."""
    used = pointer.get("last_revision", 0) if pointer is not None else 0
    base = _revisions_dir()
    for entry in sorted(base.glob("prof_*.json")) if base.is_dir() else ():
        try:
            doc = _read_json(entry)
        except (ChainBroken, InvalidInput):
            continue  # its number is in the audit log: every revision is recorded before stored
        number = doc.get("revision") if doc and doc.get("name") == name else None
        if type(number) is int:
            used = max(used, number)
    return max(used, _audited_revision(name)) + 1


def _profile_records(name: str, purpose: str) -> Iterator[tuple[str, dict[str, Any], str]]:
    """(type, data, hash) of each complete `profile.*` record of `name` in the admin log, in
    order. Read leniently (a line that does not parse is skipped: verifying is `audit
    verify`'s job), but bounded and only from a regular file (`chain.iter_lines`); a log that
    cannot be read is an AuditError, since `purpose` needs all of it."""
    from linpodx.audit.chain import BadRecord, NotALog, admin_chain, iter_lines

    log = admin_chain().path
    needle = f'"name":{json.dumps(name)}'.encode()
    try:
        for _offset, line, complete in iter_lines(log):
            if not complete or b'"type":"profile.' not in line or needle not in line:
                continue
            try:
                rec = json.loads(line)
            except ValueError:
                continue
            data = rec.get("data") if isinstance(rec, dict) else None
            kind = str(rec.get("type", "")) if isinstance(rec, dict) else ""
            if isinstance(data, dict) and kind.startswith("profile.") and data.get("name") == name:
                yield kind, data, str(rec.get("hash"))
    except FileNotFoundError:
        return
    except (OSError, NotALog, BadRecord) as exc:
        why = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        raise AuditError(
            f"could not read the audit log {log}: {why}",
            f"{purpose}; run `linpodx audit verify` to see what is wrong with the log",
        ) from None


def _audited_revision(name: str) -> int:
    """Highest revision number of `name` in the admin audit log's `profile.*` records (0 if
    none)."""
    numbers = (
        data["revision"]
        for _kind, data, _hash in _profile_records(
            name, "a new revision number must not repeat one recorded there"
        )
        if type(data.get("revision")) is int
    )
    return max(numbers, default=0)


def _settle(name: str, pointer: dict[str, Any]) -> dict[str, Any]:
    """Finish or close an apply or a removal of `name` that a crash interrupted (see the module
    doc); returns the pointer as it is now. Under the lock."""
    if "removing" in pointer:
        return _settle_removal(name, pointer)
    pending = pointer.get("pending")
    if pending is None:
        return pointer
    last = pointer.get("last_revision", 0)
    last = last if isinstance(last, int) else 0
    pid = pending.get("profile_id") if isinstance(pending, dict) else None
    rev = pending.get("revision") if isinstance(pending, dict) else None
    if not (isinstance(pid, str) and is_id(pid, "prof") and type(rev) is int and rev > 0):
        raise _damaged_pointer(
            _pointer_path(name), "its pending apply is not a revision id and number"
        )
    path = _pointer_path(name)
    doc = _load_revision(pid)
    with _Staged() as staged:
        if doc is not None and doc.get("name") == name and doc.get("revision") == rev:
            # Stored, hence audited before: do what the interrupted apply would have done last.
            settled = {"name": name, "current": pid, "last_revision": max(last, rev)}
            staged.put(staged.stage(path, _encode(settled)), path)
            return settled
        settled = {k: v for k, v in pointer.items() if k != "pending"}
        settled["last_revision"] = max(last, rev)
        tmp = staged.stage(path, _encode(settled))
        _admin_chain().append(
            "profile.apply.abandoned",
            {
                "name": name,
                "profile_id": pid,
                "revision": rev,
                "reason": "the apply was interrupted before its revision was stored",
            },
        )
        try:
            staged.put_recorded(tmp, path)
        except OSError as exc:
            raise _recorded_but_not_done(
                f"closing the interrupted apply of {name} (revision {rev})",
                exc,
                "fix the state directory (df -h, permissions) and run the command again",
            ) from None
    return settled


def _settle_removal(name: str, pointer: dict[str, Any]) -> dict[str, Any]:
    """A `sandbox rm` marks the pointer `removing` before its record and removes the revision
    after it. Found marked, the removal was interrupted: if its `profile.rm` record is in the
    admin log it happened (finish it), else it never did (drop the mark)."""
    removing = pointer["removing"]
    path = _pointer_path(name)
    last = _last_profile_record(name)
    recorded = last is not None and last[:2] == ("profile.rm", removing["profile_id"])
    if recorded:
        settled = dict(pointer, current=None, removed_at=_now())
    else:
        settled = dict(pointer)
    del settled["removing"]
    with _Staged() as staged:
        staged.put_recorded(staged.stage(path, _encode(settled)), path)
    return settled


def _last_profile_record(name: str) -> tuple[str, Any, str] | None:
    """(type, profile_id, hash) of the last `profile.*` record of `name` in the admin log."""
    last = None
    for kind, data, h in _profile_records(
        name, f"an interrupted removal of {name} is settled by what the log says"
    ):
        last = (kind, data.get("profile_id"), h)
    return last


def get(name: str) -> StoredProfile:
    """The current revision of an applied profile; NotFound if never applied or removed."""
    pointer = _pointer(name)
    if pointer is not None and "removing" in pointer:
        # Maybe removed (its record written), maybe not: used by nobody until settled.
        raise LinpodxError(
            f"profile {name}: a `sandbox rm` of it was interrupted",
            interrupted_rm_hint(name),
            exit_code=EXIT_TAMPERED,
        )
    return _current_of(name, pointer)


def _current_of(name: str, pointer: dict[str, Any] | None) -> StoredProfile:
    """The revision `pointer` (checked by `_pointer`) names as current; NotFound if none."""
    current = pointer.get("current") if pointer else None
    if not isinstance(current, str):
        raise NotFound(f"profile not found: {safe_text(name, 80)}", APPLY_HINT)
    doc = _load_revision(current)
    if doc is None:  # removed since the pointer was checked
        raise _damaged_pointer(
            _pointer_path(name), f"it points at revision {current}, which is missing from the store"
        )
    stored = _stored_from(doc, _revisions_dir() / f"{current}.json", True)
    if pointer is not None and "removing" in pointer:
        return replace(stored, removing=True)
    return stored


def get_by_id(profile_id: str) -> StoredProfile:
    """Any revision by id, also older ones and those of removed profiles."""
    doc = _load_revision(profile_id)
    if doc is None:
        raise NotFound(
            f"profile revision not found: {safe_text(profile_id, 80)}",
            "revision ids look like prof_01J…; see `linpodx sandbox list`",
        )
    name = doc.get("name")
    pointer = _pointer(name) if isinstance(name, str) and valid_name(name) else None
    current = pointer is not None and pointer.get("current") == profile_id
    return _stored_from(doc, _revisions_dir() / f"{profile_id}.json", current)


def list_profiles() -> list[StoredProfile]:
    """The current revision of every applied (not removed) profile, by name. One whose
    `sandbox rm` was interrupted is listed too, with `removing` set: `get` refuses it, but
    it is neither gone nor to be hidden until the next `rm` or `apply` settles it."""
    base = _names_dir()
    if not is_dir(base):
        return []
    out = []
    for entry in sorted(base.glob("*.json")):
        name = entry.name[: -len(".json")]
        with contextlib.suppress(NotFound):
            out.append(_current_of(name, _pointer(name)))
    return out


def history(name: str) -> list[StoredProfile]:
    """Every stored revision of `name`, oldest first (also after `remove`)."""
    _pointer_path(name)  # refuses invalid names
    base = _revisions_dir()
    if not base.is_dir():
        return []
    pointer = _pointer(name) or {}
    out = []
    for entry in sorted(base.glob("prof_*.json")):
        doc = _read_json(entry)
        if doc and doc.get("name") == name:
            out.append(_stored_from(doc, entry, pointer.get("current") == doc.get("profile_id")))
    return sorted(out, key=lambda s: s.revision)


@dataclass(frozen=True)
class RemoveResult:
    """What `remove` did."""

    name: str
    profile_id: str
    revision: int
    audit_hash: str
    """Hash of the `profile.rm` audit record."""


def remove(name: str) -> RemoveResult:
    """Forget `name` as an applied profile (audited `profile.rm`); its revisions stay readable
    by id so containers started under them keep working."""
    with _state_writes(), locked():
        pointer = _pointer(name)
        removing = pointer.get("removing") if pointer is not None else None
        if pointer is not None:
            pointer = _settle(name, pointer)
        current = pointer.get("current") if pointer else None
        if isinstance(removing, dict) and current is None:
            # This finished an interrupted removal whose record was written: it is done now.
            last = _last_profile_record(name)
            return RemoveResult(
                name, removing["profile_id"], removing["revision"], last[2] if last else ""
            )
        if pointer is None or not isinstance(current, str):
            raise NotFound(f"profile not found: {name}", APPLY_HINT)
        doc = _load_revision(current) or {}
        revision = int(doc.get("revision", pointer.get("last_revision", 0)))
        path = _pointer_path(name)
        with _Staged() as staged:
            # Everything is staged first: after the record only a rename is left. Before the
            # record the pointer is marked `removing`, so that a crash between the record and
            # that rename is found and settled (`_settle_removal`), not left as a log saying
            # "removed" beside a profile still in use.
            marked = staged.stage(
                path, _encode(dict(pointer, removing={"profile_id": current, "revision": revision}))
            )
            unmarked = staged.stage(path, _encode(pointer))
            tmp = staged.stage(path, _encode(dict(pointer, current=None, removed_at=_now())))
            staged.put(marked, path)
            try:
                record = _admin_chain().append(
                    "profile.rm", {"name": name, "profile_id": current, "revision": revision}
                )
            except BaseException:
                staged.put(unmarked, path)  # not recorded: not removed
                raise
            try:
                staged.put_recorded(tmp, path)
            except OSError as exc:
                raise _recorded_but_not_done(
                    f"the removal of {name}",
                    exc,
                    "fix the state directory (df -h, permissions) and run `linpodx sandbox rm` "
                    "again",
                ) from None
    return RemoveResult(name, current, revision, str(record.hash))


__all__ = [
    "APPLY_HINT",
    "ApplyResult",
    "AuditError",
    "RemoveResult",
    "StoredProfile",
    "apply",
    "digest_of",
    "get",
    "get_by_id",
    "history",
    "list_profiles",
    "remove",
]
