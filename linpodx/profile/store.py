"""Applied profiles: every revision kept, each recorded in the admin audit chain first.

Layout under `profiles_dir()` (dirs 0700, files 0600, every write atomic):

    .lock                    flock held by apply/remove, so concurrent applies serialize
    revisions/<prof_ID>.json one file per revision, never changed or deleted afterwards
    names/<NAME>.json        the name's pointer: current revision id (null once removed) and the
                             last revision number (kept, so a re-applied name continues counting)

Order of an apply (under the lock): load and normalize → digest → compare with the current
revision (equal: nothing is written or audited) → note the apply as *pending* in the name's
pointer (its new id and revision number) → append `profile.apply` to the admin chain
(AuditError: the pending note is taken back, nothing stored) → write the revision file with
the record's hash → move the name's pointer (and drop the note).

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
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from linpodx import paths
from linpodx.canonical import CanonicalError, canonical_bytes
from linpodx.errors import AuditError, ChainBroken, InvalidInput, NotFound, ProfileError
from linpodx.fsutil import atomic_write
from linpodx.ids import is_id, new_id
from linpodx.output import safe_text
from linpodx.profile.loader import load_file, profile_from_dict, schema, schema_digest
from linpodx.profile.model import Profile

APPLY_HINT = "run `linpodx sandbox apply --profile FILE` to apply it (see `linpodx sandbox list`)"
REVISION_FORMAT = 1
MAX_RECORD_BYTES = 4 * 1024 * 1024


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

    def summary(self) -> dict[str, Any]:
        """The fields `sandbox list` shows."""
        return {
            "name": self.name,
            "revision": self.revision,
            "profile_id": self.profile_id,
            "applied_at": self.applied_at,
            "audit_hash": self.audit_hash,
        }


def digest_of(profile: Profile) -> str:
    """sha256 hex of the canonical JSON of the normalized profile."""
    try:
        return hashlib.sha256(canonical_bytes(profile.to_dict())).hexdigest()
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
def _locked() -> Iterator[None]:
    """Exclusive flock on the store (apply and remove; readers rely on atomic files)."""
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
    try:
        with open(path, "rb") as f:
            raw = f.read(MAX_RECORD_BYTES + 1)
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise InvalidInput(f"cannot read {path}: {exc.strerror}",
                           "check the permissions of linpodx's state directory") from None
    try:
        doc = json.loads(raw)
        if len(raw) > MAX_RECORD_BYTES or not isinstance(doc, dict):
            raise ValueError("not a JSON object")
    except ValueError:
        raise ChainBroken(
            f"profile store file {path} is damaged",
            "restore it from a backup, or re-apply the profile with "
            "`linpodx sandbox apply --profile FILE`",
        ) from None
    return doc


def _write_json(path: Path, doc: dict[str, Any]) -> None:
    atomic_write(path, json.dumps(doc, ensure_ascii=False, indent=2, sort_keys=True).encode())


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


def _pointer(name: str) -> dict[str, Any] | None:
    return _read_json(_pointer_path(name))


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
    if digest_of(profile) != digest or profile.name != stored.name:
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
    with _locked():
        pointer = _settle(profile.name, _pointer(profile.name) or {})
        current_id = pointer.get("current")
        if isinstance(current_id, str):
            doc = _load_revision(current_id)
            if doc is not None and doc.get("digest") == digest:
                stored = _stored_from(doc, _revisions_dir() / f"{current_id}.json", True)
                return ApplyResult(
                    name=profile.name,
                    profile_id=stored.profile_id,
                    revision=stored.revision,
                    audit_hash=stored.audit_hash,
                    changed=False,
                    digest=digest,
                )
        last = pointer.get("last_revision", 0)
        revision = (last if isinstance(last, int) else 0) + 1
        profile_id = new_id("prof")
        pointer_path = _pointer_path(profile.name)
        pending = {"profile_id": profile_id, "revision": revision}
        _write_json(pointer_path, {**pointer, "name": profile.name, "pending": pending})
        # Audit first: if the record cannot be written, nothing is stored.
        try:
            record = _admin_chain().append(
                "profile.apply",
                {
                    "name": profile.name,
                    "profile_id": profile_id,
                    "revision": revision,
                    "digest": digest,
                    "source": source,
                },
            )
        except AuditError:
            # Not applied: take the pending note back (a new name gets no pointer at all).
            if pointer:
                _write_json(pointer_path, pointer)
            else:
                pointer_path.unlink(missing_ok=True)
            raise
        audit_hash = str(record.hash)
        _write_json(
            _revisions_dir() / f"{profile_id}.json",
            {
                "format": REVISION_FORMAT,
                "name": profile.name,
                "profile_id": profile_id,
                "revision": revision,
                "digest": digest,
                "audit_hash": audit_hash,
                "applied_at": _now(),
                "source": source,
                "schema_digest": schema_digest(),
                "profile": profile.to_dict(),
            },
        )
        _write_json(
            pointer_path, {"name": profile.name, "current": profile_id, "last_revision": revision}
        )
    return ApplyResult(profile.name, profile_id, revision, audit_hash, True, digest)


def _settle(name: str, pointer: dict[str, Any]) -> dict[str, Any]:
    """Finish or close an apply of `name` that a crash interrupted (see the module doc); returns
    the pointer as it is now. Under the lock."""
    pending = pointer.get("pending")
    if pending is None:
        return pointer
    last = pointer.get("last_revision", 0)
    last = last if isinstance(last, int) else 0
    settled = {k: v for k, v in pointer.items() if k != "pending"}
    pid = pending.get("profile_id") if isinstance(pending, dict) else None
    rev = pending.get("revision") if isinstance(pending, dict) else None
    if not (isinstance(pid, str) and is_id(pid, "prof") and type(rev) is int and rev > 0):
        raise ChainBroken(
            f"profile store file {_pointer_path(name)} is damaged (its pending apply)",
            "restore it from a backup, or remove it and re-apply the profile",
        )
    doc = _load_revision(pid)
    if doc is not None and doc.get("name") == name and doc.get("revision") == rev:
        # Stored, hence audited before: do what the interrupted apply would have done last.
        settled = {"name": name, "current": pid, "last_revision": max(last, rev)}
    else:
        _admin_chain().append(
            "profile.apply.abandoned",
            {
                "name": name,
                "profile_id": pid,
                "revision": rev,
                "reason": "the apply was interrupted before its revision was stored",
            },
        )
        settled["last_revision"] = max(last, rev)
    _write_json(_pointer_path(name), settled)
    return settled


def get(name: str) -> StoredProfile:
    """The current revision of an applied profile; NotFound if never applied or removed."""
    pointer = _pointer(name)
    current = pointer.get("current") if pointer else None
    if not isinstance(current, str):
        raise NotFound(f"profile not found: {safe_text(name, 80)}", APPLY_HINT)
    doc = _load_revision(current)
    if doc is None:
        raise ChainBroken(
            f"profile {name} points at revision {current}, which is missing from the store",
            "re-apply the profile with `linpodx sandbox apply --profile FILE`",
        )
    return _stored_from(doc, _revisions_dir() / f"{current}.json", True)


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
    """The current revision of every applied (not removed) profile, by name."""
    base = _names_dir()
    if not base.is_dir():
        return []
    out = []
    for entry in sorted(base.glob("*.json")):
        name = entry.name[: -len(".json")]
        with contextlib.suppress(NotFound):
            out.append(get(name))
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
    with _locked():
        pointer = _pointer(name)
        if pointer is not None:
            pointer = _settle(name, pointer)
        current = pointer.get("current") if pointer else None
        if pointer is None or not isinstance(current, str):
            raise NotFound(f"profile not found: {name}", APPLY_HINT)
        doc = _load_revision(current) or {}
        revision = int(doc.get("revision", pointer.get("last_revision", 0)))
        record = _admin_chain().append(
            "profile.rm", {"name": name, "profile_id": current, "revision": revision}
        )
        pointer = dict(pointer, current=None, removed_at=_now())
        _write_json(_pointer_path(name), pointer)
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
