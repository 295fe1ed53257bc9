"""An audit record as the rest of linpodx sees it: `Record`, parsed from a stored line by the
codec (`linpodx.audit.core`: fast stage, strict fallback)."""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from linpodx.audit import core
from linpodx.audit.core import DOMAIN
from linpodx.canonical import canonical_bytes


@dataclass(frozen=True)
class Record:
    """One audit record as stored."""

    seq: int
    """Position in the chain, from 0, without gaps."""
    ts: str
    """UTC time of the append, `YYYY-MM-DDTHH:MM:SS.ffffffZ`; never decreases along a chain."""
    type: str
    """Dotted event type, e.g. `profile.apply`, `session.close`, `audit.repair`."""
    prev: str
    """Hash of the previous record (the genesis for seq 0)."""
    hash: str
    """sha256 hex over the domain prefix and the canonical record without `hash`."""
    data: Mapping[str, Any]
    """What happened (canonical-JSON values only: no floats)."""
    log_id: str | None = None
    """The log's random id; set on the first record only."""

    def to_dict(self) -> dict[str, Any]:
        """The record as it is stored (with `hash`; `log` only on the first record)."""
        d: dict[str, Any] = {
            "seq": self.seq,
            "ts": self.ts,
            "type": self.type,
            "prev": self.prev,
            "hash": self.hash,
            "data": dict(self.data),
        }
        if self.log_id is not None:
            d["log"] = self.log_id
        return d


_new = object.__new__


def record_of(fields: core.Fields) -> Record:
    """Record(*fields), built at a third of its cost: the frozen dataclass's __init__ sets
    each field through object.__setattr__, and nothing else (no __post_init__, no defaults
    left to fill: `fields` has all seven). A lone append returns one (`Chain.append`)."""
    rec = _new(Record)
    d = rec.__dict__
    d["seq"], d["ts"], d["type"], d["prev"], d["hash"], d["data"], d["log_id"] = fields
    return rec


BadRecord = core.BadRecord
torn_problem = core.torn_problem


def record_hash(body: Mapping[str, Any]) -> str:
    """sha256 hex of DOMAIN + canonical bytes of a record without its `hash`."""
    return hashlib.sha256(DOMAIN + canonical_bytes(body)).hexdigest()


def torn_reason(offset: int, length: int) -> str:
    """The words used everywhere for a torn last line."""
    return (
        f"torn last line at byte {offset} ({length} bytes without newline): "
        "crash during append, not tampering; the next append repairs it"
    )


def parse_line(line: bytes) -> Record:
    """Parse and check one stored line (without its newline) on its own with the strict
    reference parser (`core.parse_strict`); BadRecord with the reason."""
    return Record(*core.parse_strict(line))


def _fast_record(line: bytes) -> Record | None:
    """The Record `parse_line` would return, computed at C speed, or None if unsure (then the
    strict parser decides). See `core.fast_fields` for why the two agree."""
    fields = core.fast_fields(line)
    return None if fields is None else Record(*fields)


def check_line(line: bytes) -> Record:
    """parse_line, with the fast stage first (same result: `core.parse`)."""
    return Record(*core.parse(line))


