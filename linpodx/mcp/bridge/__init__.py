"""The proxy loop's brain: every frame in either direction goes through `Bridge`.

`Bridge` owns no file descriptors and spawns no process: it gets frames (from `framing`) and
writes bytes through two callables, which keeps it testable in-process and lets `attach` own the
`podman exec` child. Per frame it parses strictly, decides (policy engine or approval), writes
the decision's record to the session chain, and only then forwards the re-serialized message
or answers; nothing reaches the client before the decision records written so far are
fsync'd (`BridgeCore.send_client`). An answer's outcome record (`mcp.response`) is written
before the answer is passed on and fsync'd with a later one: the durability rule is spelled
out in `mcp.auditlog`.

Threads: one reader per direction calls `on_client_frame` / `on_server_frame`; each `prompt`
decision waits in its own thread so other traffic (and other approvals) keep flowing. Shared
state is behind one lock; the two writers have their own locks.

The package, by job:

- `state`: the revisions, the bounds, the entry per request in flight, the closing counters,
  `short` (a value fit for an audit record);
- `lanes`: the writer threads (a lane per direction, the `mcp.decision` events);
- `core`: the session's state, "record, then act", the writers to either peer, the fence;
- `drops`: refused and dropped messages, their records bounded per second;
- `client`: client → server, the gate (requests, batches, cancellations, approvals);
- `server`: server → client (responses, the server's requests and notifications).
"""

from __future__ import annotations

from linpodx.mcp.bridge.client import ClientSide
from linpodx.mcp.bridge.lanes import EVENT_LINGER, LANE_BACKLOG_MAX
from linpodx.mcp.bridge.server import ServerSide
from linpodx.mcp.bridge.state import (
    APPROVALS_MAX,
    AUDIT_TEXT_CAP,
    BATCH_REVISION,
    HANDSHAKE_REVISIONS,
    INFLIGHT_MAX,
    PROTOCOL_VERSION_META,
    Appender,
    InFlight,
    Stats,
    Writer,
)

__all__ = [
    "APPROVALS_MAX",
    "AUDIT_TEXT_CAP",
    "BATCH_REVISION",
    "EVENT_LINGER",
    "HANDSHAKE_REVISIONS",
    "INFLIGHT_MAX",
    "LANE_BACKLOG_MAX",
    "PROTOCOL_VERSION_META",
    "Appender",
    "Bridge",
    "InFlight",
    "Stats",
    "Writer",
]


class Bridge(ClientSide, ServerSide):
    """Gate between an MCP client and a server for one session."""
