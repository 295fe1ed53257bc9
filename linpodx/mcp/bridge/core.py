"""The bridge's state and plumbing: the session's settings and tables, "record, then act"
(`_then`, through a lane when pipelined), the audit size bound, the writers to either peer,
the events, the fence that ends a direction, and the closing counters."""

from __future__ import annotations

import collections
import os
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

from linpodx import events
from linpodx.errors import AuditError
from linpodx.mcp import auditlog, bounds, jsonrpc, policy
from linpodx.mcp.bridge.lanes import Lane, Notices
from linpodx.mcp.bridge.state import Appender, InFlight, Stats, Writer
from linpodx.mcp.framing import Frame
from linpodx.mcp.grants import GrantBook
from linpodx.mcp.jsonrpc import IdKey
from linpodx.output import safe_text
from linpodx.profile.model import Decision as Action
from linpodx.profile.model import Profile

_AUTO_ALLOW = Action.AUTO_ALLOW.value  # (an Enum's `.value` is a Python call each time)


class BridgeCore:
    """State and plumbing shared by both directions of one session (see `Bridge`)."""

    def __init__(
        self,
        *,
        profile: Profile,
        session_id: str,
        chain: Appender,
        to_client: Writer,
        to_server: Writer,
        answer_server: Writer | None = None,
        log: Callable[[str], None] = lambda _m: None,
        emit: Callable[..., Any] = events.emit,
        clock: Callable[[], float] = time.monotonic,
        pipeline: bool = False,
        on_bound: Callable[[str], None] = lambda _r: None,
    ) -> None:
        self.profile = profile
        self.rules = profile.mcp_policy
        self.grants = GrantBook(session_id, self.rules)  # session grants (`mcp.grants`)
        # The rules with this session's rate counters (`policy.SessionPolicy`).
        self.policy = policy.SessionPolicy(profile.mcp_policy, clock)
        self.settings = profile.mcp
        self.session_id = session_id
        self.chain = chain
        # What the chain can do, looked up once (not per record): a chain that writes a
        # decision now and fsyncs it later (`mcp.auditlog`), or one whose every append is
        # durable (then each of these is None).
        self._append_written: Callable[..., Any] | None = getattr(chain, "append_written", None)
        self._append_deferred: Callable[..., Any] | None = getattr(chain, "append_deferred", None)
        self._barrier: Callable[..., None] | None = getattr(chain, "decisions_durable", None)
        self._tracks_gen = hasattr(chain, "decided_gen")
        self._to_client = to_client
        self._to_server = to_server
        self._answer_server = answer_server
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
        self.closing: str | None = None
        self._waiters: list[threading.Thread] = []
        # With a chain that can queue records (GroupCommitChain), each direction gets a lane.
        self._lanes: dict[str, Lane] = {}
        self._backlog: dict[str, bool] = {"client": False, "server": False}
        if pipeline and hasattr(chain, "submit") and hasattr(chain, "wait"):
            self._lanes = {d: Lane(chain, d, log) for d in ("client", "server")}
        self._notices = Notices(emit, log) if pipeline else None
        self._said: set[str] = set()  # audit errors already said on stderr (`_unrecorded`)
        # Records of refused/dropped messages, per direction and second (see `mcp.bounds`).
        self._windows = {
            d: bounds.Window(self.settings.drop_records_per_second, clock)
            for d in ("client", "server")
        }
        self.suppressed = 0
        self._said_window = bounds.Window(1, clock)
        # The server's pings, each a decision record and a forward to the client: past this
        # many a second they are refused and summarised (see `_server_request`).
        self._ping_window = bounds.Window(self.settings.drop_records_per_second, clock)
        self._on_bound = on_bound
        self.bound_hit: str | None = None
        # The fence (`fence`): frames of a direction handled at the moment, and the directions
        # closed to new frames because the session is ending.
        # (a plain lock for the per-frame count, the Condition only for `fence` to wait on)
        self._fence_lock = threading.Lock()
        self._fence_cv = threading.Condition(self._fence_lock)
        self._handling: dict[str, int] = {"client": 0, "server": 0}
        self._fenced: set[str] = set()
        self.ignored_after_end = 0

    # ---- plumbing -------------------------------------------------------------------------

    def _audit(
        self, type_: str, data: Mapping[str, Any], durable: bool = True, wake: bool = True
    ) -> None:
        """Append to the session chain (raises AuditError: the caller must not act).

        With a chain that can (see `mcp.auditlog`), a decision record (`durable`) is written
        now and fsync'd in the background, and `send_client` waits for that fsync before
        anything reaches the client; an outcome record (`durable=False`) is written now and
        fsync'd with a later one (`wake=False`: the caller makes the decision durable itself
        after acting, see `_then`). No lock here: the chain serializes appends itself, and
        concurrent callers must reach it together for group commit to batch them.
        """
        over = self._over_size()
        if over is not None:
            raise over
        if durable and self._append_written is not None:
            self._append_written(type_, data, wake)
        elif not durable and self._append_deferred is not None:
            self._append_deferred(type_, data)
        else:
            self.chain.append(type_, data)

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
        the lane's thread once the record is written, in arrival order (what reaches the client
        waits in `send_client` for the decision records' fsync).
        """

        def failed(exc: AuditError) -> None:
            self._unrecorded(exc)
            fail(exc)

        target = self._lanes.get(lane) if self._lanes else None
        if target is not None and not self._backlog[lane] and target.idle():
            # Nothing queued before it and nothing else waiting: doing it here saves two thread
            # hand-offs. With a backlog the lane is faster even for a record that is only
            # written: the reader goes on parsing and queued records share one write.
            target = None
        if target is None:
            try:
                self._audit(type_, data, durable, wake=False)
            except AuditError as exc:
                failed(exc)
                return
            ok()
            if durable and self._barrier is not None:
                # The fsync of the record, now that its action is done (the request is with
                # the server, which works meanwhile): no thread hand-off for a lone call. An
                # answer that comes first waits for it in `send_client`; a failure is said
                # there (what reaches the client is withheld).
                try:
                    self._barrier()
                except AuditError:
                    pass
            return
        over = self._over_size()
        if over is not None:
            failed(over)
            return
        mode = auditlog.WRITTEN if durable else auditlog.DEFERRED
        ticket = self.chain.submit(type_, data, mode)  # type: ignore[attr-defined]
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
        elif data.get("decision") == _AUTO_ALLOW:
            self._notices.put(data)
        else:
            self._notices.put_now(data)

    def send_client(self, obj: Any, from_server: bool = False, upto: int | None = None) -> None:
        """Write one message to the client (stdout carries protocol messages only), once every
        decision record written so far is fsync'd (`durable`): whatever the client sees, the
        server's answer or linpodx's own, follows a decision that is on disk. If that cannot
        be made so, what came from the server (`from_server`) is withheld: an answer becomes an
        error, anything else is dropped; linpodx's own refusals still go (the safe direction).
        `upto`: only the decisions up to that generation (an answer: its request's, see
        `InFlight.gen`), so an answer does not wait for the fsync of calls made after it."""
        failed = None
        if self._barrier is not None:  # (`durable`, inline: once per message to the client)
            try:
                self._barrier(upto)
            except AuditError as exc:
                self._unrecorded(exc)
                failed = exc
        if failed is not None and from_server:
            obj = self._withheld(obj, failed)
            if obj is None:
                return
        data = jsonrpc.serialize(obj)
        with self._client_lock:
            try:
                self._to_client(data)
            except OSError as exc:
                self._log(f"bridge: client output closed: {exc}")

    def durable(self, upto: int | None = None) -> AuditError | None:
        """Wait until every decision record written so far (up to generation `upto`) is
        fsync'd; the error if the chain failed (said once on stderr), None when they are on
        disk."""
        if self._barrier is None:
            return None  # (a chain whose every append is durable)
        try:
            self._barrier(upto)
        except AuditError as exc:
            self._unrecorded(exc)
            return exc
        return None

    def _withheld(self, obj: Any, exc: AuditError) -> Any:
        """What the client gets instead of a message from the server that follows a decision
        record that is not durable: an error for an answer (the call is over for the client),
        nothing for anything else (None)."""
        if not isinstance(obj, dict) or "method" in obj or "id" not in obj:
            return None
        return jsonrpc.error_response(
            obj["id"],
            jsonrpc.DENIED_BY_POLICY,
            f"linpodx could not make its audit record durable ({exc.message}); result withheld",
        )

    def answer_server(self, obj: Any) -> None:
        """Answer one of the server's own requests (a refusal, a denial) without waiting on the
        server's input: through `answer_server` (the session queues it, see
        `mcp.attach.ServerInput.answer`), or written like any message when there is none."""
        if self._answer_server is None:
            self.send_server(obj)
            return
        self._answer_server(jsonrpc.serialize(obj))

    def send_server(self, obj: Any) -> None:
        """Write one evaluated message to the server (re-serialized, never the raw bytes)."""
        data = jsonrpc.serialize(obj)
        with self._server_lock:
            self._write_server(data)

    def _write_server(self, data: bytes) -> None:
        """Write bytes to the server (the caller holds `_server_lock`)."""
        try:
            self._to_server(data)
        except (OSError, ValueError) as exc:
            self._log(f"bridge: server input closed: {exc}")

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
        with self._fence_lock:
            if direction in self._fenced:
                self.ignored_after_end += 1
                return
            self._handling[direction] += 1
        try:
            handler(frame, more)
        finally:
            with self._fence_lock:
                self._handling[direction] -= 1
                if self._fenced:  # (only `fence` waits, and only once a direction is fenced)
                    self._fence_cv.notify_all()

    def shutdown(self, reason: str, wait_seconds: float = 5.0) -> None:
        """Deny every pending approval (their waits end with `session ended`), then return."""
        self.grants.close()  # a grant ends with its session
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
