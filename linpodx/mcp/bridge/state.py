"""What every part of the bridge shares: the protocol revisions it knows, its bounds, the
entry it keeps per request in flight, the closing record's counters, and `short` (a value fit
for an audit record)."""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

BATCH_REVISION = "2025-03-26"
"""The only MCP revision whose transport allows JSON-RPC batches."""

HANDSHAKE_REVISIONS = frozenset({"2024-11-05", "2025-03-26", "2025-06-18", "2025-11-25"})
"""Revisions negotiated with `initialize`; later ones name their revision in each request."""

PROTOCOL_VERSION_META = "io.modelcontextprotocol/protocolVersion"

AUDIT_TEXT_CAP = 256
"""Longer ids/method/tool names are recorded by digest (an audit line has a size bound)."""
INFLIGHT_MAX = 4096
"""Client requests forwarded or held and not yet answered, at most: more are refused. The
server's requests forwarded to the client and not yet answered, the same."""
APPROVALS_MAX = 64
"""Calls waiting for a person at once, at most: more are denied (each waits in a thread)."""


class Appender(Protocol):
    """What the bridge needs from an audit chain."""

    def append(self, type: str, data: Mapping[str, Any]) -> Any: ...


Writer = Callable[[bytes], None]


def short(value: Any) -> Any:
    """A value fit for an audit record: long strings become their sha256."""
    if isinstance(value, str) and len(value) > AUDIT_TEXT_CAP:
        return {
            "sha256": hashlib.sha256(value.encode("utf-8", "surrogatepass")).hexdigest(),
            "length": len(value),
        }
    return value


@dataclass(slots=True)
class InFlight:
    """A client request the bridge has accepted and not yet seen answered."""

    method: Any
    """The method, or its digest when long (`short`): what its records name."""
    tool: Any
    started: float
    forwarded: bool = False
    prompted: bool = False
    """Decided `prompt`: it waits for a person (APPROVALS_MAX) until it is forwarded or ends."""
    approval_id: str | None = None
    cancelled: str | None = None
    gen: int | None = None
    """The chain's `decided_gen` when the request was forwarded: its answer waits for the
    fsync up to there (None: for every decision written so far)."""


@dataclass
class Stats:
    """Counters for the closing record."""

    forwarded: int = 0
    denied: int = 0
    prompted: int = 0
    approved: int = 0
    invalid: int = 0
    dropped: int = 0
    responses: int = 0
    extra: dict[str, int] = field(default_factory=dict)
