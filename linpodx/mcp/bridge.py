"""The proxy loop's brain: every frame in either direction goes through `Bridge`.

`Bridge` owns no file descriptors and spawns no process: it gets frames (from `framing`) and
writes bytes through two callables, which keeps it testable in-process and lets `attach` own the
`podman exec` child. Per frame it parses strictly, decides (policy engine or approval), records
the decision in the session chain (written and fsync'd), and only then forwards the
re-serialized message or answers. An answer's outcome record (`mcp.response`) is written before
the answer is passed on and fsync'd with the next record: the durability rule is spelled out in
`mcp.auditlog`.

Threads: one reader per direction calls `on_client_frame` / `on_server_frame`; each `prompt`
decision waits in its own thread so other traffic (and other approvals) keep flowing. Shared
state is behind one lock; the two writers have their own locks.
"""

from __future__ import annotations

import collections
import hashlib
import os
import re
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from linpodx import events
from linpodx.approvals import store as approvals
from linpodx.errors import AuditError, LinpodxError
from linpodx.mcp import bounds, jsonrpc, policy
from linpodx.mcp.framing import Frame, Oversize
from linpodx.mcp.jsonrpc import Batch, IdKey, Message, ProtocolError
from linpodx.output import safe_text
from linpodx.profile.model import Decision as Action
from linpodx.profile.model import Profile

BATCH_REVISION = "2025-03-26"
"""The only MCP revision whose transport allows JSON-RPC batches."""

HANDSHAKE_REVISIONS = frozenset({"2024-11-05", "2025-03-26", "2025-06-18", "2025-11-25"})
"""Revisions negotiated with `initialize`; later ones name their revision in each request."""

PROTOCOL_VERSION_META = "io.modelcontextprotocol/protocolVersion"

AUDIT_TEXT_CAP = 256
"""Longer ids/method/tool names are recorded by digest (an audit line has a size bound)."""

LANE_BACKLOG_MAX = 256
"""Steps one direction may have queued before its reader waits (see `_Lane.put`)."""
INFLIGHT_MAX = 4096
"""Client requests forwarded or held and not yet answered, at most: more are refused."""
APPROVALS_MAX = 64
"""Calls waiting for a person at once, at most: more are denied (each waits in a thread)."""
EVENT_LINGER = 0.02
"""Seconds the event writer lets a burst of `mcp.decision` events gather into one write."""


class Appender(Protocol):
    """What the bridge needs from an audit chain."""

    def append(self, type: str, data: Mapping[str, Any]) -> Any: ...


class _Lane:
    """Runs "record, then act" steps of one direction in arrival order, off the reader thread.

    The reader submits each record at once and goes on parsing; this thread waits for each
    record to be durable (only written, for an outcome record) and then performs its action.
    Records of many in-flight messages thus share one fsync (group commit), and no action ever
    runs before its record is on disk.
    """

    def __init__(self, chain: Any, name: str, log: Callable[[str], None]) -> None:
        self.chain = chain
        self.log = log
        self.queue: collections.deque[Any] = collections.deque()
        self.cv = threading.Condition()
        self.closed = False
        self.busy = False
        self.thread = threading.Thread(target=self._run, name=f"lane-{name}", daemon=True)
        self.thread.start()

    def put(self, ticket: Any, ok: Callable[[], None], fail: Callable[[AuditError], None]) -> None:
        """Queue a step; with LANE_BACKLOG_MAX steps waiting, wait for room first. That is the
        backpressure: a peer that does not read (a client ignoring stdout, a server ignoring
        stdin) blocks this lane, and then the reader feeding it, and so the other peer's
        writes, instead of the queue growing without bound (hundreds of MB in seconds)."""
        with self.cv:
            if threading.current_thread() is not self.thread:  # (never wait for ourselves)
                while len(self.queue) >= LANE_BACKLOG_MAX and not self.closed:
                    self.cv.wait(0.5)
            self.queue.append((ticket, ok, fail))
            self.cv.notify_all()

    def _run(self) -> None:
        while True:
            with self.cv:
                while not self.queue and not self.closed:
                    self.cv.wait()
                if not self.queue:
                    return
                ticket, ok, fail = self.queue.popleft()
                self.busy = True
            try:
                try:
                    self.chain.wait(ticket)
                except AuditError as exc:
                    fail(exc)
                else:
                    ok()
            except Exception as exc:  # one bad step must not stop the whole session
                self.log(
                    f"bridge: internal error in {self.thread.name}: {type(exc).__name__}: {exc}"
                )
            finally:
                with self.cv:
                    self.busy = False
                    self.cv.notify_all()

    def idle(self) -> bool:
        """Nothing queued and nothing running."""
        with self.cv:
            return not self.queue and not self.busy

    def settle(self, timeout: float) -> None:
        """Wait until every step queued so far ran (the thread keeps running)."""
        deadline = time.monotonic() + timeout
        with self.cv:
            while (self.queue or self.busy) and time.monotonic() < deadline:
                self.cv.wait(0.05)

    def drain(self, timeout: float) -> None:
        """Wait until every queued step ran, then stop the thread."""
        deadline = time.monotonic() + timeout
        self.settle(timeout)
        with self.cv:
            self.closed = True
            self.cv.notify_all()
        self.thread.join(max(0.0, deadline - time.monotonic()))


class _Notices:
    """`mcp.decision` events, written off the call's path by one thread.

    The first event of a burst wakes the thread, which lets the burst gather for `linger`
    seconds and writes it at once: busy sessions pay one wake-up and one write per burst, not
    per call. A `prompt` or `deny` is written at once by the caller (`put_now`), after whatever
    is pending, so a person watching sees it before the approval it leads to, in call order.
    Events are notices for people, never records: a failed write is only logged.
    """

    def __init__(
        self, emit: Callable[..., Any], log: Callable[[str], None], linger: float = EVENT_LINGER
    ) -> None:
        self.emit = emit
        self.log = log
        self.linger = linger
        self.cv = threading.Condition()
        self.writing = threading.Lock()  # batches are taken and written in order
        self.pending: list[dict[str, Any]] = []
        self.stopping = False
        self.thread = threading.Thread(target=self._run, name="events", daemon=True)
        self.thread.start()

    def put(self, data: dict[str, Any]) -> None:
        with self.cv:
            self.pending.append(data)
            if len(self.pending) == 1:
                self.cv.notify()

    def put_now(self, data: dict[str, Any]) -> None:
        """Write what is pending and `data` now, on the caller's thread."""
        with self.writing:
            with self.cv:
                batch, self.pending = [*self.pending, data], []
            self._write(batch)

    def close(self, timeout: float) -> None:
        """Write what is pending, then stop the thread."""
        with self.cv:
            self.stopping = True
            self.cv.notify()
        self.thread.join(timeout)

    def _run(self) -> None:
        while True:
            with self.cv:
                while not self.pending and not self.stopping:
                    self.cv.wait()
                if not self.pending:
                    return
                stopping = self.stopping
            if not stopping:
                time.sleep(self.linger)
            with self.writing:
                with self.cv:
                    batch, self.pending = self.pending, []
                if batch:
                    self._write(batch)

    def _write(self, batch: list[dict[str, Any]]) -> None:
        items = [("mcp.decision", d) for d in batch]
        try:
            if self.emit is events.emit:
                events.emit_many(items)
            else:
                for t, d in items:
                    self.emit(t, **d)
        except OSError as exc:
            self.log(f"bridge: could not emit mcp.decision: {exc}")


Writer = Callable[[bytes], None]


def _short(value: Any) -> Any:
    """A value fit for an audit record: long strings become their sha256."""
    if isinstance(value, str) and len(value) > AUDIT_TEXT_CAP:
        return {
            "sha256": hashlib.sha256(value.encode("utf-8", "surrogatepass")).hexdigest(),
            "length": len(value),
        }
    return value


_HEAD_ID = re.compile(
    rb'\A\s*\{\s*(?:"jsonrpc"\s*:\s*"2\.0"\s*,\s*)?"id"\s*:\s*'
    rb'(-?(?:0|[1-9][0-9]{0,15})|"[^"\\\x00-\x1f]{0,128}")\s*,'
)
"""A response's id when it is the object's first member, or follows `"jsonrpc":"2.0"` (how
the SDKs write it): nothing nested comes before it, so it is the top-level id."""


def _head_id(head: bytes) -> int | str | None:
    """The id at the start of an oversize line's first bytes (`_HEAD_ID`), or None."""
    m = _HEAD_ID.match(head)
    if m is None:
        return None
    token = m.group(1)
    if token.startswith(b'"'):
        return token[1:-1].decode("utf-8", "replace")
    value = int(token)
    return value if abs(value) <= 2**53 else None


def _modern(msg: Message) -> bool:
    """True for a request in the per-request-envelope era (MCP 2026-07-28 and later)."""
    meta = (msg.params or {}).get("_meta")
    if not isinstance(meta, dict):
        return False
    version = meta.get(PROTOCOL_VERSION_META)
    return isinstance(version, str) and version not in HANDSHAKE_REVISIONS


@dataclass
class InFlight:
    """A client request the bridge has accepted and not yet seen answered."""

    method: str
    tool: str | None
    started: float
    forwarded: bool = False
    approval_id: str | None = None
    cancelled: str | None = None


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


class Bridge:
    """Gate between an MCP client and a server for one session."""

    def __init__(
        self,
        *,
        profile: Profile,
        session_id: str,
        chain: Appender,
        to_client: Writer,
        to_server: Writer,
        log: Callable[[str], None] = lambda _m: None,
        emit: Callable[..., Any] = events.emit,
        clock: Callable[[], float] = time.monotonic,
        pipeline: bool = False,
        on_bound: Callable[[str], None] = lambda _r: None,
    ) -> None:
        self.profile = profile
        self.rules = profile.mcp_policy
        self.settings = profile.mcp
        self.session_id = session_id
        self.chain = chain
        self._to_client = to_client
        self._to_server = to_server
        self._log = log
        self._emit = emit
        self._clock = clock
        self._lock = threading.Lock()
        self._client_lock = threading.Lock()
        self._server_lock = threading.Lock()
        self.inflight: dict[IdKey, InFlight] = {}
        self.server_inflight: dict[IdKey, str] = {}
        self._cancelled: collections.OrderedDict[IdKey, None] = collections.OrderedDict()
        self.protocol_version: str | None = None
        self.stats = Stats()
        self.records = 0
        self.last_record: Any = None
        self.closing: str | None = None
        self._waiters: list[threading.Thread] = []
        # With a chain that can queue records (GroupCommitChain), each direction gets a lane.
        self._lanes: dict[str, _Lane] = {}
        self._backlog: dict[str, bool] = {"client": False, "server": False}
        if pipeline and hasattr(chain, "submit") and hasattr(chain, "wait"):
            self._lanes = {d: _Lane(chain, d, log) for d in ("client", "server")}
        self._notices = _Notices(emit, log) if pipeline else None
        self._said: set[str] = set()  # audit errors already said on stderr (`_unrecorded`)
        # Records of refused/dropped messages, per direction and second (see `mcp.bounds`).
        self._windows = {
            d: bounds.Window(self.settings.drop_records_per_second, clock)
            for d in ("client", "server")
        }
        self.suppressed = 0
        self._said_window = bounds.Window(1, clock)
        self._on_bound = on_bound
        self.bound_hit: str | None = None
        # The fence (`fence`): frames of a direction handled at the moment, and the directions
        # closed to new frames because the session is ending.
        self._fence_cv = threading.Condition()
        self._handling: dict[str, int] = {"client": 0, "server": 0}
        self._fenced: set[str] = set()
        self.ignored_after_end = 0

    # ---- plumbing -------------------------------------------------------------------------

    def _audit(self, type_: str, data: Mapping[str, Any], durable: bool = True) -> None:
        """Append to the session chain (raises AuditError: the caller must not act).

        `durable=False` is for outcome records only: with a chain that can defer (see
        `mcp.auditlog`), the record is written now and fsync'd with the next one.
        No lock here: the chain serializes appends itself, and concurrent callers must reach
        it together for group commit to batch them.
        """
        over = self._over_size()
        if over is not None:
            raise over
        deferred = None if durable else getattr(self.chain, "append_deferred", None)
        rec = self.chain.append(type_, data) if deferred is None else deferred(type_, data)
        with self._lock:
            self.records += 1
            self.last_record = rec

    def _then(
        self,
        lane: str,
        type_: str,
        data: Mapping[str, Any],
        ok: Callable[[], None],
        fail: Callable[[AuditError], None],
        durable: bool = True,
    ) -> None:
        """Record `data`, then run `ok` (or `fail` if it could not be recorded).

        Synchronous without lanes; with lanes the record is queued now and the action runs in
        the lane's thread once the record is durable (only written, for `durable=False`), in
        arrival order.
        """

        def failed(exc: AuditError) -> None:
            self._unrecorded(exc)
            fail(exc)

        target = self._lanes.get(lane)
        if target is not None and target.idle() and not self._backlog.get(lane):
            # Nothing queued before it and nothing else waiting: doing it here saves two thread
            # hand-offs. With a backlog the lane is faster even for a record that is only
            # written: the reader goes on parsing and queued records share one write.
            target = None
        if target is None:
            try:
                self._audit(type_, data, durable)
            except AuditError as exc:
                failed(exc)
                return
            ok()
            return
        over = self._over_size()
        if over is not None:
            failed(over)
            return
        ticket = self.chain.submit(type_, data, durable)  # type: ignore[attr-defined]
        with self._lock:
            self.records += 1
        target.put(ticket, ok, failed)

    def _over_size(self) -> AuditError | None:
        """The error for a record past `mcp.audit_max_bytes` (None below it). The first one
        ends the session (`on_bound`): its closing record is written past the bound, by
        `attach`, so the log says why it ends."""
        size = getattr(self.chain, "size", None)
        limit = self.settings.audit_max_bytes
        if not isinstance(size, int) or size < limit:
            return None
        reason = f"audit log size bound reached (mcp.audit_max_bytes = {limit} bytes)"
        with self._lock:
            first = self.bound_hit is None
            self.bound_hit = reason
        if first:
            self._on_bound(reason)
        return AuditError(
            f"the session's audit log reached mcp.audit_max_bytes ({limit} bytes); "
            "the session ends and nothing more is forwarded",
            "start a new session; if this one was legitimate, raise mcp.audit_max_bytes in "
            "the profile",
        )

    def _admit(self, direction: str, reason: str, lane: str) -> bool:
        """Whether a refused/dropped message gets its own record and stderr line, under
        `mcp.drop_records_per_second`; a window that ended with messages held back is
        summarised now (`mcp.suppressed`)."""
        with self._lock:
            admitted, ended = self._windows[direction].admit(reason)
            if not admitted:
                self.suppressed += 1
        if ended is not None:
            self._summarise(direction, ended, lane)
        return admitted

    def _summarise(self, direction: str, held: bounds.Summary, lane: str) -> None:
        limit = self.settings.drop_records_per_second
        self._log(
            f"bridge: {held.count} refused or dropped messages from the {direction} were not "
            f"recorded one by one (over mcp.drop_records_per_second = {limit}); "
            "one mcp.suppressed record counts them"
        )
        record = {
            "dir": direction,
            "limit": limit,
            "window_ms": int(max(0.0, self._clock() - held.since) * 1000),
            **held.to_record(),
        }

        def unrecorded(exc: AuditError) -> None:
            self._log(f"bridge: could not record a summary of dropped messages: {exc.message}")

        self._then(lane, "mcp.suppressed", record, lambda: None, unrecorded)

    def record_notice(self, type_: str, data: Mapping[str, Any]) -> None:
        """Record something the session did that is no message (`mcp.stderr_suppressed`), on
        the server's side; nothing once that side is fenced (no record after the last)."""

        def unrecorded(exc: AuditError) -> None:
            self._log(f"bridge: could not record {type_}: {exc.message}")

        with self._fence_cv:
            if "server" in self._fenced:
                return
            self._handling["server"] += 1
        try:
            self._then("server", type_, data, lambda: None, unrecorded)
        finally:
            with self._fence_cv:
                self._handling["server"] -= 1
                self._fence_cv.notify_all()

    def flush_summaries(self) -> None:
        """Record what the per-second windows still hold back (the session ends)."""
        for direction, window in self._windows.items():
            with self._lock:
                held = window.take()
            if held is not None:
                self._summarise(direction, held, direction)

    def _unrecorded(self, exc: AuditError) -> None:
        """Say on stderr, as `error:` and `hint:`, that a record could not be written: the
        client sees only a denial, and the person running the bridge must see why and what to
        do. Once per distinct error (a log that failed for good refuses every record after)."""
        with self._lock:
            if exc.message in self._said:
                return
            self._said.add(exc.message)
        text = f"error: {safe_text(exc.message, 1000)}"
        if exc.hint:
            text += f"\nhint: {safe_text(exc.hint, 1000)}"
        self._log(text)

    def settle_client(self, timeout: float = 10.0) -> None:
        """Let the client's queued steps finish (before the server's input is closed: a request
        the client sent just before its EOF is still forwarded)."""
        lane = self._lanes.get("client")
        if lane is not None:
            lane.settle(timeout)

    def drain(self, timeout: float = 10.0) -> None:
        """Let every queued "record, then act" step finish (before the session's last record)."""
        for lane in self._lanes.values():
            lane.drain(timeout)
        if self._notices is not None:
            self._notices.close(timeout)

    def _event(self, event_type: str, **data: Any) -> None:
        # Events are notifications for people; failing to emit one must not stop the bridge.
        try:
            self._emit(event_type, **data)
        except OSError as exc:
            self._log(f"bridge: could not emit {event_type}: {exc}")

    def _decision_event(self, **data: Any) -> None:
        """`mcp.decision`: off the call's path when pipelined (it is a notice, not a record),
        except for a refusal or a prompt, which a person may be waiting to see."""
        if self._notices is None:
            self._event("mcp.decision", **data)
        elif data.get("decision") == Action.AUTO_ALLOW.value:
            self._notices.put(data)
        else:
            self._notices.put_now(data)

    def send_client(self, obj: Any) -> None:
        """Write one message to the client (stdout carries protocol messages only)."""
        data = jsonrpc.serialize(obj)
        with self._client_lock:
            try:
                self._to_client(data)
            except OSError as exc:
                self._log(f"bridge: client output closed: {exc}")

    def send_server(self, obj: Any) -> None:
        """Write one evaluated message to the server (re-serialized, never the raw bytes)."""
        data = jsonrpc.serialize(obj)
        with self._server_lock:
            try:
                self._to_server(data)
            except (OSError, ValueError) as exc:
                self._log(f"bridge: server input closed: {exc}")

    def _args_fields(self, msg: Message) -> dict[str, Any]:
        if msg.method != "tools/call" or msg.params is None:
            return {}
        args = msg.params.get("arguments", {})
        out: dict[str, Any] = {"args_sha256": approvals.request_digest(args)}
        if self.settings.record_arguments:
            out["arguments"] = args
        return out

    # ---- the fence ------------------------------------------------------------------------

    def fence(self, direction: str, timeout: float = 5.0) -> None:
        """Take no more frames from `direction` ("client" or "server"), and wait (at most
        `timeout`) for those being handled. The session is ending: a frame that comes later
        is neither acted on nor recorded (it is counted, `ignored_after_end`), so no record
        can follow the session's closing one."""
        deadline = time.monotonic() + timeout
        with self._fence_cv:
            self._fenced.add(direction)
            while self._handling[direction] and time.monotonic() < deadline:
                self._fence_cv.wait(max(0.0, deadline - time.monotonic()))

    def _handle(
        self, direction: str, handler: Callable[[Frame, bool], None], frame: Frame, more: bool
    ) -> None:
        """`handler(frame, more)`, unless `direction` is fenced (then the frame is counted)."""
        with self._fence_cv:
            if direction in self._fenced:
                self.ignored_after_end += 1
                return
            self._handling[direction] += 1
        try:
            handler(frame, more)
        finally:
            with self._fence_cv:
                self._handling[direction] -= 1
                self._fence_cv.notify_all()

    # ---- client → server ------------------------------------------------------------------

    def on_client_frame(self, frame: Frame, more: bool = False) -> None:
        """Handle one frame the client sent (`more`: further frames are already waiting)."""
        self._handle("client", self._client_frame, frame, more)

    def _client_frame(self, frame: Frame, more: bool) -> None:
        self._backlog["client"] = more
        if isinstance(frame, Oversize):
            answer = jsonrpc.error_response(
                None,
                jsonrpc.INVALID_REQUEST,
                f"message larger than {self.settings.max_line_bytes} bytes refused by linpodx",
            )
            self._invalid(
                "client",
                f"line of {frame.size} bytes exceeds mcp.max_line_bytes "
                f"({self.settings.max_line_bytes})",
                None,
                frame.size,
                then=lambda: self.send_client(answer),
            )
            return
        try:
            parsed = jsonrpc.parse(frame.data)
        except ProtocolError as exc:
            self._client_protocol_error(exc, len(frame.data))
            return
        if isinstance(parsed, Batch):
            self._client_batch(parsed, len(frame.data))
        else:
            self._client_message(parsed)

    def _client_protocol_error(self, exc: ProtocolError, size: int) -> None:
        answer = jsonrpc.error_response(exc.msg_id, exc.code, f"refused by linpodx: {exc}")
        self._invalid("client", str(exc), exc.msg_id, size, then=lambda: self.send_client(answer))

    def _client_batch(self, batch: Batch, size: int) -> None:
        with self._lock:
            revision = self.protocol_version
        if revision != BATCH_REVISION:
            # Outside 2025-03-26 a batch is not MCP; nothing in it goes anywhere.
            answer = jsonrpc.error_response(
                None,
                jsonrpc.INVALID_REQUEST,
                f"refused by linpodx: batches are only allowed in MCP {BATCH_REVISION}",
            )
            self._invalid(
                "client",
                f"batch refused (protocol revision {revision or 'not negotiated'})",
                None,
                size,
                then=lambda: self.send_client(answer),
            )
            return
        # Each element crosses the gate on its own, exactly as if it had come alone.
        for item in batch.items:
            if isinstance(item, ProtocolError):
                self._client_protocol_error(item, 0)
            else:
                self._client_message(item)

    def _client_message(self, msg: Message) -> None:
        if msg.kind in ("response", "error"):
            self._client_response(msg)
            return
        if msg.method is None:  # parse() guarantees a method for requests/notifications
            return
        decision = policy.refusal(msg.kind, msg.method, msg.params) or policy.evaluate(
            self.rules, msg.method, msg.tool_name
        )
        if msg.kind == "notification":
            self._client_notification(msg, decision)
            return
        key = msg.id_key
        if key is None:  # parse() guarantees a string or integer id for requests
            return
        with self._lock:
            recycled = key in self._cancelled
            reused = key in self.inflight or recycled
            crowded = not reused and len(self.inflight) >= INFLIGHT_MAX
            waiting = sum(1 for e in self.inflight.values() if e.approval_id is not None)
            if not reused and not crowded:
                self.inflight[key] = InFlight(msg.method, msg.tool_name, self._clock())
        if crowded:
            answer = jsonrpc.error_response(
                msg.id,
                jsonrpc.INVALID_REQUEST,
                f"refused by linpodx: more than {INFLIGHT_MAX} requests in flight",
            )
            self._invalid(
                "client",
                f"more than {INFLIGHT_MAX} requests in flight",
                msg.id,
                0,
                then=lambda: self.send_client(answer),
            )
            return
        if decision.action is Action.PROMPT and waiting >= APPROVALS_MAX:
            decision = policy.Decision(
                Action.DENY,
                decision.rule_index,
                f"more than {APPROVALS_MAX} calls are waiting for a person",
            )
        if recycled:
            # The server may still answer the cancelled call under this id: that answer would
            # be taken (and recorded) as this call's.
            answer = jsonrpc.error_response(
                msg.id,
                jsonrpc.INVALID_REQUEST,
                "refused by linpodx: request id of a cancelled request reused",
            )
            self._invalid(
                "client",
                "request id of a cancelled request reused",
                msg.id,
                0,
                then=lambda: self.send_client(answer),
            )
            return
        if reused:
            # Answered with a null id: an answer carrying the reused id would settle the
            # request still in flight under it for the client, whose real answer then follows.
            answer = jsonrpc.error_response(
                None,
                jsonrpc.INVALID_REQUEST,
                "refused by linpodx: request id already in flight (this answer has a null id)",
            )
            self._invalid(
                "client",
                "request id reused while in flight",
                msg.id,
                0,
                then=lambda: self.send_client(answer),
            )
            return
        record = {
            "dir": "client",
            "kind": "request",
            "id": _short(msg.id),
            "method": _short(msg.method),
            "tool": _short(msg.tool_name),
            "decision": decision.action.value,
            "rule": decision.rule_index,
            "reason": decision.reason,
            **self._args_fields(msg),
        }
        if msg.method == "tools/call" and msg.tool_name is None:
            name = (msg.params or {}).get("name")
            record["tool_type"] = "missing" if name is None else type(name).__name__

        def act() -> None:
            allow = decision.action is Action.AUTO_ALLOW
            if allow:
                self._forward(msg)  # the event is a notice: the call does not wait for it
            if decision.rule_index is not None or not allow:
                self._decision_event(
                    session=self.session_id,
                    method=_short(msg.method),
                    tool=_short(msg.tool_name),
                    decision=decision.action.value,
                    rule=decision.rule_index,
                )
            if decision.action is Action.PROMPT:
                self._prompt(msg)
            elif not allow:
                self._deny(msg, decision.reason)

        def unrecorded(exc: AuditError) -> None:
            self._deny(msg, f"the audit log could not record this call ({exc.message})")

        self._then("client", "mcp.request", record, act, unrecorded)

    def _forward(self, msg: Message) -> None:
        key = msg.id_key
        with self._lock:
            entry = self.inflight.get(key) if key is not None else None
            if entry is not None:
                entry.forwarded = True
                entry.started = self._clock()
            self.stats.forwarded += 1
        self.send_server(msg.raw)

    def _deny(self, msg: Message, reason: str) -> None:
        with self._lock:
            if msg.id_key is not None:
                self.inflight.pop(msg.id_key, None)
            self.stats.denied += 1
        text = f"denied by linpodx policy: {reason}"
        if msg.method == "tools/call":
            result = jsonrpc.tool_error_result(msg.id, text)
            if _modern(msg):
                # 2026-07-28 results carry resultType (and SDK clients require it).
                result["result"]["resultType"] = "complete"
            self.send_client(result)
        else:
            self.send_client(jsonrpc.error_response(msg.id, jsonrpc.DENIED_BY_POLICY, text))

    def _client_notification(self, msg: Message, decision: policy.Decision) -> None:
        if msg.method is None:  # parse() guarantees a method for requests/notifications
            return
        cancelled = None
        if msg.method == "notifications/cancelled":
            if self._cancel_pending(msg):
                return
            cancelled = jsonrpc.id_key((msg.params or {}).get("requestId"))
        if msg.method in policy.REQUEST_METHODS:
            # Refused (`policy.refusal`) and recorded below; said without ids or names (this
            # is the client's pipe), and at most once a second (a flood of them is no flood
            # of lines).
            with self._lock:
                say, _ = self._said_window.admit("notification")
            if say:
                self._log("bridge: dropped a request the client sent without an id")

        def act() -> None:
            if decision.action is Action.AUTO_ALLOW:
                with self._lock:
                    self.stats.forwarded += 1
                self.send_server(msg.raw)
                if cancelled is not None:
                    self._release(cancelled)
            else:
                # A notification has no answer; `prompt` for one is a deny (nobody waits).
                with self._lock:
                    self.stats.dropped += 1

        record = {
            "dir": "client",
            "method": _short(msg.method),
            "decision": decision.action.value,
            "rule": decision.rule_index,
            "reason": decision.reason,
        }
        # Not recorded => not forwarded.
        self._then("client", "mcp.notification", record, act, lambda _exc: None)

    def _release(self, key: IdKey) -> None:
        """A forwarded request the client has cancelled no longer counts as in flight: a
        conformant server never answers it, and its slot would be taken for good (4,096
        cancellations and the session refused everything). A late answer is then an answer
        to no request in flight: dropped and recorded."""
        with self._lock:
            entry = self.inflight.get(key)
            if entry is not None and entry.forwarded:
                del self.inflight[key]
                self.stats.extra["cancelled"] = self.stats.extra.get("cancelled", 0) + 1
                # Remembered (the last INFLIGHT_MAX) so that a new request cannot take the id
                # while the server may still answer the old one.
                self._cancelled[key] = None
                while len(self._cancelled) > INFLIGHT_MAX:
                    self._cancelled.popitem(last=False)

    def _cancel_pending(self, msg: Message) -> bool:
        """A cancellation for a request still waiting for a person ends that wait (no forward)."""
        rid = jsonrpc.id_key((msg.params or {}).get("requestId"))
        if rid is None:
            return False
        with self._lock:
            entry = self.inflight.get(rid)
            if entry is None or entry.forwarded or entry.approval_id is None:
                return False
            entry.cancelled = "cancelled by the client"
        record = {
            "dir": "client",
            "method": "notifications/cancelled",
            "decision": "absorbed",
            "approval_id": entry.approval_id,
        }
        self._then("client", "mcp.notification", record, lambda: None, lambda _exc: None)
        return True

    def _client_response(self, msg: Message) -> None:
        key = msg.id_key
        with self._lock:
            method = self.server_inflight.pop(key, None) if key is not None else None
        if method is None:
            self._dropped("client", "response to no request the server made", msg.id)
            return
        record = {
            "dir": "client",
            "id": _short(msg.id),
            "method": _short(method),
            "status": "ok" if msg.kind == "response" else "error",
        }
        refusal = jsonrpc.error_response(
            msg.id, jsonrpc.DENIED_BY_POLICY, "linpodx could not record the client's answer"
        )
        self._then(
            "client",
            "mcp.response",
            record,
            lambda: self.send_server(msg.raw),
            lambda _exc: self.send_server(refusal),
            durable=False,
        )

    # ---- approvals ------------------------------------------------------------------------

    def _prompt(self, msg: Message) -> None:
        if msg.method is None:  # parse() guarantees a method for requests/notifications
            return
        try:
            pending = approvals.create(
                self.session_id,
                msg.method,
                msg.tool_name,
                request=msg.raw,
                params=msg.params,
                timeout_seconds=self.settings.approval_timeout_seconds,
            )
        except (OSError, LinpodxError) as exc:
            self._deny(msg, f"the approval request could not be recorded ({exc})")
            return
        key = msg.id_key
        with self._lock:
            entry = self.inflight.get(key) if key is not None else None
            if entry is not None:
                entry.approval_id = pending.approval_id
            self.stats.prompted += 1
        self._event(
            "approval.pending",
            session=self.session_id,
            approval_id=pending.approval_id,
            method=_short(msg.method),
            tool=_short(msg.tool_name),
            digest=pending.digest,
            payload=pending.payload,
            fields=[f.to_list() for f in pending.fields],
            fields_more=pending.fields_more,
            expires=pending.to_dict()["expires"],
        )
        # Without its id: this stderr is the MCP client's pipe, and a client with a shell tool
        # that reads an id there can answer its own call (`linpodx approve ID`).
        self._log(
            f"approval: a {safe_text(msg.method, 80)} waits for a person "
            f"(linpodx events --filter approval), {self.settings.approval_timeout_seconds}s"
        )
        t = threading.Thread(
            target=self._await_approval,
            args=(msg, pending),
            name=f"approval-{pending.approval_id}",
            daemon=True,
        )
        with self._lock:
            self._waiters.append(t)
        t.start()

    def _stop_reason(self, key: IdKey | None) -> str | None:
        with self._lock:
            entry = self.inflight.get(key) if key is not None else None
            if entry is not None and entry.cancelled:
                return entry.cancelled
            return f"session ended ({self.closing})" if self.closing else None

    def _await_approval(self, msg: Message, pending: approvals.PendingRequest) -> None:
        key = msg.id_key
        try:
            outcome = approvals.wait(pending, cancelled=lambda: self._stop_reason(key))
        except (OSError, LinpodxError) as exc:
            outcome = approvals.Outcome(False, f"approval could not be read ({exc})", None)
        except Exception as exc:
            # A bug here must not end this thread with the call unanswered and unaudited: the
            # client would wait forever. Whatever went wrong, the call is denied (fail closed).
            outcome = approvals.Outcome(
                False, f"approval could not be read ({type(exc).__name__})", None
            )
        by = outcome.answer.by if outcome.answer is not None else {}
        decision = "approve" if outcome.approved else "deny"
        try:
            self._audit(
                "approval.decided",
                {
                    "approval_id": pending.approval_id,
                    "id": _short(msg.id),
                    "method": _short(msg.method),
                    "tool": _short(msg.tool_name),
                    "digest": pending.digest,
                    "decision": decision,
                    "reason": outcome.reason,
                    "by": by,
                },
            )
        except AuditError as exc:
            self._unrecorded(exc)
            outcome = approvals.Outcome(
                False,
                f"the audit log could not record the approval ({exc.message})",
                outcome.answer,
            )
            decision = "deny"
        self._event(
            "approval.decided",
            session=self.session_id,
            approval_id=pending.approval_id,
            decision=decision,
            reason=outcome.reason,
            by=by,
        )
        with self._lock:
            entry = self.inflight.get(key) if key is not None else None
            cancelled = entry is not None and entry.cancelled is not None
        if cancelled:
            with self._lock:
                if key is not None:
                    self.inflight.pop(key, None)
            return  # the client withdrew the request: it expects no answer
        if outcome.approved:
            with self._lock:
                self.stats.approved += 1
            self._forward(msg)
        else:
            self._deny(msg, f"not approved: {outcome.reason}")

    # ---- server → client ------------------------------------------------------------------

    def on_server_frame(self, frame: Frame, more: bool = False) -> None:
        """Handle one frame the server sent (`more`: further frames are already waiting)."""
        self._handle("server", self._server_frame, frame, more)

    def _server_frame(self, frame: Frame, more: bool) -> None:
        self._backlog["server"] = more
        if isinstance(frame, Oversize):
            if self._invalid(
                "server",
                f"line of {frame.size} bytes exceeds mcp.max_line_bytes",
                None,
                frame.size,
                lane="server",
            ):
                self._log(
                    f"bridge: dropped a {frame.size}-byte line from the server (over the bound)"
                )
            self._answer_oversize(frame)
            return
        try:
            parsed = jsonrpc.parse(frame.data)
        except ProtocolError as exc:
            if self._invalid("server", str(exc), exc.msg_id, len(frame.data), lane="server"):
                self._log(f"bridge: dropped an invalid message from the server: {exc}")
            return
        if isinstance(parsed, Batch):
            with self._lock:
                revision = self.protocol_version
            if revision != BATCH_REVISION:
                if self._invalid("server", "batch refused", None, len(frame.data), lane="server"):
                    self._log("bridge: dropped a JSON-RPC batch from the server")
                return
            for item in parsed.items:
                if isinstance(item, ProtocolError):
                    self._invalid("server", str(item), item.msg_id, 0, lane="server")
                else:
                    self._server_message(item)
            return
        self._server_message(parsed)

    def _answer_oversize(self, frame: Oversize) -> None:
        """The call whose response crossed the bound gets an error instead of no answer at all,
        when the line's first bytes name a request in flight (see `_head_id`). A server could
        name another call's id here, but it can answer any call with an error anyway."""
        msg_id = _head_id(frame.head)
        key = jsonrpc.id_key(msg_id)
        with self._lock:
            entry = self.inflight.get(key) if key is not None else None
        if entry is None or not entry.forwarded:
            return
        error = jsonrpc.error_response(
            msg_id,
            jsonrpc.DENIED_BY_POLICY,
            f"the server's response ({frame.size} bytes) exceeds mcp.max_line_bytes "
            f"({self.settings.max_line_bytes}); linpodx dropped it",
        )
        parsed = jsonrpc.parse(jsonrpc.serialize(error))
        if isinstance(parsed, Message):
            self._server_message(parsed)  # recorded and delivered as the server's own error

    def _server_message(self, msg: Message) -> None:
        if msg.kind in ("response", "error"):
            self._server_response(msg)
        elif msg.kind == "notification":
            if msg.method is None:  # parse() guarantees a method for notifications
                return
            decision = policy.evaluate_server_notification(msg.method)
            if decision.allowed:
                # Progress/log/list-changed traffic is frequent and carries no decision: it is
                # forwarded without a record each (the session's records stay about calls).
                self.send_client(msg.raw)
            else:
                self._dropped(
                    "server", f"notification {msg.method!r} not forwarded", None, lane="server"
                )
        else:
            self._server_request(msg)

    def _server_request(self, msg: Message) -> None:
        if msg.method is None or msg.id_key is None:  # parse() guarantees both for requests
            return
        decision = policy.evaluate_server_request(self.settings.allow_server_requests, msg.method)
        with self._lock:
            reused = msg.id_key in self.server_inflight
        record = {
            "dir": "server",
            "kind": "request",
            "id": _short(msg.id),
            "method": _short(msg.method),
            "decision": "deny" if reused else decision.action.value,
            "reason": "request id reused while in flight" if reused else decision.reason,
        }
        key, method = msg.id_key, msg.method
        allowed = decision.allowed and not reused
        if allowed:
            with self._lock:
                self.server_inflight[key] = method  # reserved now: a reuse is refused

        def refuse(reason: str) -> None:
            with self._lock:
                self.stats.denied += 1
                if allowed:
                    self.server_inflight.pop(key, None)
            self.send_server(
                jsonrpc.error_response(
                    msg.id, jsonrpc.DENIED_BY_POLICY, f"denied by linpodx policy: {reason}"
                )
            )

        def act() -> None:
            self._decision_event(
                session=self.session_id,
                direction="server",
                method=_short(method),
                decision=record["decision"],
            )
            if allowed:
                self.send_client(msg.raw)
            else:
                refuse(str(record["reason"]))

        self._then(
            "server",
            "mcp.request",
            record,
            act,
            lambda _exc: refuse("the audit log could not record it"),
        )

    def _server_response(self, msg: Message) -> None:
        key = msg.id_key
        with self._lock:
            entry = self.inflight.get(key) if key is not None else None
            if entry is None or not entry.forwarded:
                entry = None
            elif key is not None:
                del self.inflight[key]
        if entry is None:
            with self._lock:
                late = key is not None and key in self._cancelled
                if late and key is not None:
                    del self._cancelled[key]  # (answered: the id may be used again)
            reason = (
                "response to a cancelled request" if late else "response to no request in flight"
            )
            self._dropped("server", reason, msg.id, lane="server")
            return
        status = "ok" if msg.kind == "response" else "error"
        record: dict[str, Any] = {
            "dir": "server",
            "kind": "response",
            "id": _short(msg.id),
            "method": _short(entry.method),
            "tool": _short(entry.tool),
            "status": status,
            "duration_ms": int((self._clock() - entry.started) * 1000),
        }
        result = msg.raw.get("result")
        if isinstance(result, dict) and result.get("isError") is True:
            record["is_error"] = True
        if entry.method == "initialize" and isinstance(result, dict):
            pv = result.get("protocolVersion")
            if isinstance(pv, str):
                with self._lock:
                    self.protocol_version = pv
                record["protocol_version"] = _short(pv)

        def deliver() -> None:
            with self._lock:
                self.stats.responses += 1
            self.send_client(msg.raw)

        def withhold(exc: AuditError) -> None:
            # Not recorded => not delivered; the client learns why.
            self.send_client(
                jsonrpc.error_response(
                    msg.id,
                    jsonrpc.DENIED_BY_POLICY,
                    f"linpodx could not record the result ({exc.message}); result withheld",
                )
            )

        self._then("server", "mcp.response", record, deliver, withhold, durable=False)

    # ---- drops and the end ----------------------------------------------------------------

    def _invalid(
        self,
        direction: str,
        reason: str,
        msg_id: Any,
        size: int,
        *,
        then: Callable[[], None] = lambda: None,
        lane: str = "client",
    ) -> bool:
        """Record a refused frame, then `then()` (the refusal is sent even if unrecorded).
        Past `mcp.drop_records_per_second` the frame is counted into a summary instead: the
        refusal is the safe direction and needs no record of its own before it is sent."""
        with self._lock:
            self.stats.invalid += 1
        if not self._admit(direction, reason[:160], lane):
            then()
            return False

        def unrecorded(exc: AuditError) -> None:
            self._log(f"bridge: could not record an invalid message: {exc.message}")
            then()

        record = {"dir": direction, "reason": _short(reason), "id": _short(msg_id), "size": size}
        self._then(lane, "mcp.invalid", record, then, unrecorded)
        return True

    def _dropped(self, direction: str, reason: str, msg_id: Any, *, lane: str = "client") -> None:
        with self._lock:
            self.stats.dropped += 1
        if not self._admit(direction, reason[:160], lane):
            return
        self._log(f"bridge: dropped a message from the {direction}: {reason}")

        def unrecorded(exc: AuditError) -> None:
            self._log(f"bridge: could not record a dropped message: {exc.message}")

        record = {"dir": direction, "reason": _short(reason), "id": _short(msg_id)}
        self._then(lane, "mcp.drop", record, lambda: None, unrecorded)

    def shutdown(self, reason: str, wait_seconds: float = 5.0) -> None:
        """Deny every pending approval (their waits end with `session ended`), then return."""
        with self._lock:
            self.closing = reason
            waiters = list(self._waiters)
        deadline = time.monotonic() + wait_seconds
        for t in waiters:
            t.join(max(0.0, deadline - time.monotonic()))

    def summary(self) -> dict[str, Any]:
        """Counters for the session's closing record."""
        with self._lock:
            s = self.stats
            return {
                "forwarded": s.forwarded,
                "denied": s.denied,
                "prompted": s.prompted,
                "approved": s.approved,
                "invalid": s.invalid,
                "dropped": s.dropped,
                "responses": s.responses,
                "in_flight": len(self.inflight),
                "suppressed": self.suppressed,
                "ignored_after_end": self.ignored_after_end,
                "pid": os.getpid(),
            }
