"""A profile name's pointer file: how store files are read, and what makes a pointer damaged.

One rule in one place for the two readers of a pointer: the profile store
(`linpodx.profile.store`, every command that uses a profile by name) and the fast run path's
plan check (`linpodx.fastpath.plan`). If they each had their own, a pointer the store refuses
(exit 7) could still be run by the fast path.

Standard library only, and only cheap modules: the fast path (`linpodx.fastpath.plan`) imports
this.
"""

from __future__ import annotations

import json

# The store's way of reading its files is the generic one; its callers know it by these names.
from linpodx.fsutil import NotRegularFile, read_regular
from linpodx.ids import is_id
from linpodx.output import safe_text

TYPE_CHECKING = False  # not typing's: see linpodx/fastpath/__init__.py
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any

MAX_BYTES = 4 * 1024 * 1024
"""The most a store file (a pointer or a revision) may hold."""
__all__ = ["MAX_BYTES", "NotRegularFile", "parse_object", "problem", "read_regular"]
KEYS = frozenset({"name", "current", "last_revision", "removed_at", "pending", "removing"})


def parse_object(raw: bytes, limit: int = MAX_BYTES) -> dict[str, Any] | None:
    """The JSON object `raw` holds; None if it is too long or not one (damage)."""
    if len(raw) > limit:
        return None
    try:
        doc = json.loads(raw)
    except ValueError:
        return None
    return doc if isinstance(doc, dict) else None


def problem(
    name: str, doc: dict[str, Any], load_revision: Callable[[str], dict[str, Any] | None]
) -> str | None:
    """What makes `doc` not a pointer of `name`, or None. Two forms: `{name, pending}` while a
    name's first apply is under way, else `{name, last_revision, current?, removed_at?,
    pending? | removing?}` (`current` is absent after a first apply that was abandoned), with
    `current` a revision of `name` numbered up to `last_revision`. `load_revision(id)` gives a
    revision's document, None if there is none."""
    extra = sorted(set(doc) - KEYS)
    if extra:
        return f"unknown key {safe_text(extra[0], 40)!r}"
    if "name" not in doc:
        return "it has no name"
    if doc["name"] != name:
        return f"it names {safe_text(str(doc['name']), 80)!r}, not {name}"
    if "pending" in doc:
        pending = doc["pending"]
        if not (
            isinstance(pending, dict)
            and set(pending) == {"profile_id", "revision"}
            and isinstance(pending["profile_id"], str)
            and is_id(pending["profile_id"], "prof")
            and type(pending["revision"]) is int
            and pending["revision"] > 0
        ):
            return "its pending apply is not a revision id and number"
    if "last_revision" not in doc:
        return None if set(doc) == {"name", "pending"} else "it has no last revision number"
    last = doc["last_revision"]
    if type(last) is not int or last < 1:
        return "its last revision number is not a positive integer"
    if "pending" in doc and doc["pending"]["revision"] <= last:
        return "its pending apply has a revision number already used"
    if not isinstance(doc.get("removed_at", ""), str):
        return "its removed_at is not a time"
    current = doc.get("current")
    if "removing" in doc:
        removing = doc["removing"]
        if "pending" in doc or not (
            isinstance(removing, dict)
            and set(removing) == {"profile_id", "revision"}
            and removing["profile_id"] == current
            and type(removing["revision"]) is int
            and removing["revision"] > 0
        ):
            return "its removal under way is not of its current revision"
    if current is None:
        return None
    if not (isinstance(current, str) and is_id(current, "prof")):
        return "its current revision is not a revision id"
    rev = load_revision(current)
    if rev is None:
        return f"it points at revision {current}, which is missing from the store"
    number = rev.get("revision")
    if rev.get("name") != name or type(number) is not int or not 1 <= number <= last:
        return f"it points at revision {current}, which is not a revision of {name} up to {last}"
    return None
