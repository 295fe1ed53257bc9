"""Damaged approval files, as a person's mistake or a broken disk could leave them."""

from __future__ import annotations

import json
import os
from pathlib import Path

from linpodx.approvals import store


def valid_approval(p: store.PendingRequest) -> bytes:
    """An answer that would approve `p`, as `store.answer` writes it (fewer fields)."""
    doc = {"approval_id": p.approval_id, "digest": p.digest, "decision": store.APPROVE}
    return json.dumps(doc).encode()


def damage(where: Path, how: str, valid: bytes) -> None:
    """Put something other than a file linpodx wrote at `where` (its parent exists)."""
    if how == "deep":
        where.write_bytes(b"[" * 10_000 + b"]" * 10_000)  # within the size bounds
    elif how == "fifo":
        os.mkfifo(where)
    elif how == "huge":  # a valid document, padded past the size bound
        where.write_bytes(valid[:-1] + b" " * 300_000 + b"}")
    elif how == "symlink":  # to a valid document: a link is still not a file linpodx wrote
        target = where.with_name("elsewhere.json")
        target.write_bytes(valid)
        where.symlink_to(target.name)
    elif how == "directory":
        where.mkdir()
    elif how == "list":
        where.write_bytes(b"[]")


DAMAGES = ["deep", "fifo", "huge", "symlink", "directory", "list"]
