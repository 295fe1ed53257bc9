"""The egress policy a rollback keeps: the newest one the container had been given.

A container's guard enforces `containers/NAME/egress/policy.json`. A re-apply of its profile
rewrites that file with the newer revision (`guard.update_profile`), and `linpodx start` never
writes an older one over it (`guard._write_policy`). A rollback removes the container's state
along the way (the guard's detach, or the removal of the container it made when it is undone),
and then creates the container under its *creation* revision: without this module the newer
allowlist is lost and names the re-apply took away resolve again.

So the policy file is read before anything changes, kept in the rollback journal (a killed
rollback is recovered from it) and put back wherever the rollback takes it away: right after
the guard is detached, and before the new container's guard is launched (which then keeps it,
as a start does). The newest stored revision of the profile is not used instead: the profile
may have been removed since (`sandbox rm`), and a stop/start keeps what the container was
given, not what the store holds now.
"""

from __future__ import annotations

import contextlib
import json
from pathlib import Path
from typing import Any

from linpodx.egress.launch import policy_bytes
from linpodx.egress.state import EgressState, policy_revision
from linpodx.errors import LinpodxError
from linpodx.fsutil import NotRegularFile, atomic_write, read_regular

MAX_BYTES = 1 << 20  # a policy is a few KiB; anything this large is not ours

_FIELDS: dict[str, tuple[type, ...]] = {
    "profile": (str,),
    "profile_id": (str,),
    "revision": (int,),
    "allowlist": (list,),
    "upstream_dns": (list,),
    "allow_private_answers": (bool,),
    "wildcard_budget": (int,),
    "max_connections": (int,),
    "max_new_connections_per_second": (int,),
    "helper_max_files": (int,),
    "helper_max_memory_mib": (int,),
}
"""Exactly what `guard.policy_doc` writes."""
_LATER = frozenset({"wildcard_budget", "max_connections", "max_new_connections_per_second",
                    "helper_max_files", "helper_max_memory_mib"})
"""Fields a policy file written by an earlier linpodx lacks (the guard takes the default)."""


def check(doc: object) -> dict[str, Any]:
    """`doc` if it is a policy document as `guard.policy_doc` writes it; ValueError otherwise."""
    if not isinstance(doc, dict) or not set(_FIELDS) - _LATER <= set(doc) <= set(_FIELDS):
        raise ValueError("not an egress policy document")
    for key, kinds in _FIELDS.items():
        if key not in doc:
            continue
        value = doc[key]
        if not isinstance(value, kinds) or (bool not in kinds and isinstance(value, bool)):
            raise ValueError(f"egress policy field {key!r} has the wrong type")
    if doc["revision"] < 0:
        raise ValueError("egress policy revision is negative")
    for key in ("allowlist", "upstream_dns"):
        if not all(isinstance(v, str) for v in doc[key]):
            raise ValueError(f"egress policy field {key!r} holds a non-string")
    return doc


def _file(name: str) -> Path:
    return EgressState(name).policy_file


def current(name: str) -> dict[str, Any] | None:
    """Container `name`'s policy file, None if it has none. A file linpodx would not have
    written is refused (LinpodxError): what the container was given cannot be told, so the
    rollback must not go ahead and guess."""
    path = _file(name)
    try:
        # No links, no FIFOs: a swapped-in special file must not hang or redirect us.
        raw = read_regular(path, MAX_BYTES)
        if raw is None:
            return None
        if len(raw) > MAX_BYTES:
            raise ValueError("too large")
        return check(json.loads(raw.decode("utf-8")))
    except (NotRegularFile, ValueError) as exc:
        why = "not a regular file" if isinstance(exc, NotRegularFile) else str(exc)
        raise LinpodxError(
            f"the egress policy of {name} ({path}) is damaged: {why}",
            "re-apply its profile (`linpodx sandbox apply`), which rewrites it, then roll back "
            "again; nothing was changed",
        ) from None
    except OSError as exc:
        raise LinpodxError(
            f"cannot read the egress policy of {name} ({path}): {exc.strerror or exc}",
            "check the permissions of linpodx's state directory; nothing was changed",
        ) from None


def current_or_none(name: str) -> dict[str, Any] | None:
    """`current`, with a damaged or unreadable file taken as none (for an undo, which puts
    back what the journal kept rather than stop half way)."""
    with contextlib.suppress(LinpodxError):
        return current(name)
    return None


def newer(a: dict[str, Any], b: dict[str, Any]) -> bool:
    """`a` is a newer revision of the same profile than `b` (what `guard._write_policy` keeps)."""
    return bool(a["profile"] == b["profile"] and a["revision"] > b["revision"])


def newest(kept: dict[str, Any] | None, now: dict[str, Any] | None) -> dict[str, Any] | None:
    """The one of two policies a container should keep: `now` only if it is newer."""
    if kept is None:
        return now
    if now is not None and newer(now, kept):
        return now
    return kept


def put_back(name: str, doc: dict[str, Any] | None) -> None:
    """Make `doc` container `name`'s policy file, unless the file already holds the same or a
    newer revision of that profile. Durable (atomic replace with fsync): a crash right after
    must not bring back an older allowlist."""
    if doc is None:
        return
    now = current_or_none(name)
    if now is not None and (now == doc or newer(now, doc)):
        return
    st = EgressState(name)
    st.ensure()
    atomic_write(st.policy_file, policy_bytes(doc))


def summary(doc: dict[str, Any] | None) -> dict[str, Any] | None:
    """What the audit records say of a policy: its profile revision."""
    if doc is None:
        return None
    return {"profile": doc["profile"], "profile_id": doc["profile_id"],
            "revision": doc["revision"]}


def enforced_revision(name: str) -> int | None:
    """The policy revision container `name`'s running guard reports it enforces (guard.json),
    None if it reports none."""
    return policy_revision(name)
