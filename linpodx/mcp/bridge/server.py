"""Server → client: the server's responses (matched to the client's requests in flight, the
`initialize` result naming the revision), its own requests (pings bounded), its
notifications, and an oversize response answered as an error to the call it names."""

from __future__ import annotations

import re
from typing import Any

from linpodx.errors import AuditError
from linpodx.mcp import jsonrpc, policy
from linpodx.mcp.bridge.drops import Drops
from linpodx.mcp.bridge.state import BATCH_REVISION, INFLIGHT_MAX, short
from linpodx.mcp.framing import Frame, Oversize
from linpodx.mcp.jsonrpc import Batch, Message, ProtocolError

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


class ServerSide(Drops):
    """What the server sends: responses, its own requests, notifications."""

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
                self.send_client(msg.raw, from_server=True)
                if msg.method == "notifications/cancelled":
                    # The server gave up on one of its requests: a conformant client never
                    # answers it, and its slot would be taken for good (INFLIGHT_MAX). A late
                    # answer is then one to no request the server made: dropped, recorded.
                    rid = jsonrpc.id_key((msg.params or {}).get("requestId"))
                    with self._lock:
                        if rid is not None:
                            self.server_inflight.pop(rid, None)
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
            crowded = not reused and len(self.server_inflight) >= INFLIGHT_MAX
            flooding = False
            if not reused and not crowded and msg.method in policy.SERVER_HOUSEKEEPING:
                flooding = not self._ping_window.admit("ping")[0]
        if crowded or flooding:
            # Crowded: a client that does not answer the server's pings (or answers slowly)
            # let the table grow for as long as the server sent them: megabyte ids, gigabytes
            # of RSS. Flooding: with a client that answers, each ping was a decision record
            # and an answer record (~700 bytes), as fast as the client answered: the session
            # log's whole bound in minutes. A liveness check needs neither.
            why = (
                f"more than {INFLIGHT_MAX} server requests in flight"
                if crowded
                else f"more than {self.settings.drop_records_per_second} server pings a second"
            )
            answer = jsonrpc.error_response(
                msg.id, jsonrpc.INVALID_REQUEST, f"refused by linpodx: {why}"
            )
            self._invalid(
                "server", why, msg.id, 0, then=lambda: self.answer_server(answer), lane="server"
            )
            return
        record = {
            "dir": "server",
            "kind": "request",
            "id": short(msg.id),
            "method": short(msg.method),
            "decision": "deny" if reused else decision.action._value_,
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
            self.answer_server(
                jsonrpc.error_response(
                    msg.id, jsonrpc.DENIED_BY_POLICY, f"denied by linpodx policy: {reason}"
                )
            )

        def act() -> None:
            self._decision_event(
                session=self.session_id,
                direction="server",
                method=short(method),
                decision=record["decision"],
            )
            if allowed:
                self.send_client(msg.raw, from_server=True)
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
            "id": short(msg.id),
            "method": entry.method,  # (both already `short`, see `InFlight`)
            "tool": entry.tool,
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
                record["protocol_version"] = short(pv)

        def deliver() -> None:
            with self._lock:
                self.stats.responses += 1
            self.send_client(msg.raw, from_server=True, upto=entry.gen)

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
