"""Client → server: the gate. Each request is parsed, decided (policy or a person), recorded
and only then forwarded or answered; batches, cancellations, the client's answers to the
server's requests, and the wait for an approval."""

from __future__ import annotations

import threading
from typing import Any

from linpodx.approvals import store as approvals
from linpodx.errors import AuditError, LinpodxError
from linpodx.mcp import grants, jsonrpc, policy
from linpodx.mcp.bridge.drops import Drops
from linpodx.mcp.bridge.state import (
    APPROVALS_MAX,
    BATCH_REVISION,
    HANDSHAKE_REVISIONS,
    INFLIGHT_MAX,
    PROTOCOL_VERSION_META,
    InFlight,
    short,
)
from linpodx.mcp.framing import Frame, Oversize
from linpodx.mcp.jsonrpc import Batch, IdKey, Message, ProtocolError
from linpodx.output import safe_text
from linpodx.profile.model import Decision as Action


def _modern(msg: Message) -> bool:
    """True for a request in the per-request-envelope era (MCP 2026-07-28 and later)."""
    meta = (msg.params or {}).get("_meta")
    if not isinstance(meta, dict):
        return False
    version = meta.get(PROTOCOL_VERSION_META)
    return isinstance(version, str) and version not in HANDSHAKE_REVISIONS


class ClientSide(Drops):
    """What the client sends: requests through the gate, notifications, answers."""

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
        decision = self._decide(msg, msg.method)
        if msg.kind == "notification":
            self._client_notification(msg, decision)
            return
        key = msg.id_key
        if key is None:  # parse() guarantees a string or integer id for requests
            return
        tool_name = msg.tool_name
        method, tool = short(msg.method), short(tool_name)
        with self._lock:
            recycled = key in self._cancelled
            reused = key in self.inflight or recycled
            crowded = not reused and len(self.inflight) >= INFLIGHT_MAX
            if not reused and not crowded:
                # (bounded: a method or tool name may be megabytes long, 4,096 times over)
                self.inflight[key] = InFlight(method, tool, self._clock())
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
        # A prompt that a session grant covers passes, naming the grant (`mcp.grants`).
        grant_id = None
        if decision.action is Action.PROMPT:
            decision, grant_id = self.grants.apply(decision, msg.method, tool_name)
        if decision.action is Action.PROMPT and not reused:
            # Counted here, as decided: its approval is made only once its record is written
            # (later, with a backlog), and a burst decided before any had one all prompted.
            with self._lock:
                waiting = sum(1 for e in self.inflight.values() if e.prompted and not e.forwarded)
                entry = self.inflight.get(key)
                full = entry is None or waiting >= APPROVALS_MAX
                if not full and entry is not None:
                    entry.prompted = True
            if full:
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
        action = decision.action
        value = action._value_  # (`.value` is a Python-level property on an Enum)
        record = {
            "dir": "client",
            "kind": "request",
            "id": short(msg.id),
            "method": method,
            "tool": tool,
            "decision": value,
            "rule": decision.rule_index,
            "reason": decision.reason,
        }
        if msg.method == "tools/call" and msg.params is not None:
            self._add_args_fields(record, msg.params)
        if grant_id is not None:
            record["grant"] = grant_id
        if msg.method == "tools/call" and tool_name is None:
            name = (msg.params or {}).get("name")
            record["tool_type"] = "missing" if name is None else type(name).__name__

        def act() -> None:
            allow = action is Action.AUTO_ALLOW
            if allow:
                self._forward(msg, key)  # the event is a notice: the call does not wait for it
            if decision.rule_index is not None or not allow:
                self._decision_event(
                    session=self.session_id,
                    method=method,
                    tool=tool,
                    decision=value,
                    rule=decision.rule_index,
                )
            if action is Action.PROMPT:
                self._prompt(msg, decision)
            elif not allow:
                self._deny(msg, decision.reason)

        def unrecorded(exc: AuditError) -> None:
            self._deny(msg, f"the audit log could not record this call ({exc.message})")

        self._then("client", "mcp.request", record, act, unrecorded)

    def _decide(self, msg: Message, method: str) -> policy.Decision:
        """The gate's decision for one request or notification from the client, before it is
        recorded: what no rule may see (`policy.refusal`), then the profile's rules, first
        match wins. The one place a decision is made: checks that refine it (argument
        matchers, rate limits, grants for the session) belong here, each a call into its own
        module."""
        return policy.refusal(
            msg.kind, method, msg.params, msg.may_hold_proto
        ) or self.policy.decide(method, msg.tool_name, msg.params)

    def _forward(self, msg: Message, key: IdKey | None = None) -> bool:
        """Forward an allowed request unless the client has cancelled it; whether it went.

        One step under the server's writer lock: whether the call was cancelled, marking it
        forwarded, and writing it. A cancellation that comes before the mark withdraws the
        call (`_cancel_pending`: absorbed, never forwarded); one that comes after finds it
        forwarded and goes to the server behind it (the writer lock keeps that order), and its
        slot is released (`_release`). Checked apart, a cancellation that came between the
        check and the mark was absorbed and the call forwarded all the same.
        """
        if key is None:
            key = msg.id_key
        data = jsonrpc.serialize(msg.raw)
        with self._server_lock:
            with self._lock:
                entry = self.inflight.get(key) if key is not None else None
                if entry is not None:
                    if entry.cancelled is not None:
                        self.inflight.pop(key, None)  # type: ignore[arg-type]  # (an entry: a key)
                        return False
                    entry.forwarded = True
                    entry.started = self._clock()
                    # Its decision record is written: the answer waits for the fsync up to here.
                    if self._tracks_gen:
                        entry.gen = self.chain.decided_gen  # type: ignore[attr-defined]
                self.stats.forwarded += 1
            self._write_server(data)
        return True

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
            with self._lock:
                known = cancelled is not None and cancelled in self.inflight
            if not known:
                # Nothing to cancel (answered already, denied, or never sent): the server may
                # ignore it, so it is not forwarded, and it is counted like other dropped
                # messages. Forwarded, each was a record of its own: a storm of bogus ids was
                # a flood of the session log that no per-second bound held.
                self._dropped("client", "cancellation of no request in flight", None)
                return
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
            "method": short(msg.method),
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
        """A cancellation for a request not yet forwarded withdraws it: it is never forwarded
        (`_forward` checks under the same lock), a wait for a person ends, and the cancellation
        itself goes nowhere (the server never saw the call). True if it was absorbed so."""
        rid = jsonrpc.id_key((msg.params or {}).get("requestId"))
        if rid is None:
            return False
        with self._lock:
            entry = self.inflight.get(rid)
            if entry is None or entry.forwarded:
                return False
            entry.cancelled = "cancelled by the client"
            approval_id = entry.approval_id
        record = {
            "dir": "client",
            "method": "notifications/cancelled",
            "decision": "absorbed",
            "id": short((msg.params or {}).get("requestId")),
            "approval_id": approval_id,
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
            "id": short(msg.id),
            "method": short(method),
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

    def _add_args_fields(self, record: dict[str, Any], params: dict[str, Any]) -> None:
        """A `tools/call`'s arguments in its record: their digest, and themselves when
        `mcp.record_arguments` says so."""
        args = params.get("arguments", {})
        record["args_sha256"] = approvals.request_digest(args)
        if self.settings.record_arguments:
            record["arguments"] = args

    # ---- approvals ------------------------------------------------------------------------

    def _prompt(self, msg: Message, decision: policy.Decision) -> None:
        if msg.method is None:  # parse() guarantees a method for requests/notifications
            return
        key = msg.id_key
        with self._lock:
            entry = self.inflight.get(key) if key is not None else None
            if entry is not None and entry.cancelled is not None:
                # Cancelled before its approval was asked for: nobody is asked.
                self.inflight.pop(key, None)  # type: ignore[arg-type]  # (an entry: a key)
                return
        # A person sees the call from here on: its decision record is on disk first.
        failed = self.durable()
        if failed is not None:
            self._deny(msg, f"the audit log could not record this call ({failed.message})")
            return
        try:
            pending = approvals.create(
                self.session_id,
                msg.method,
                msg.tool_name,
                request=msg.raw,
                params=msg.params,
                timeout_seconds=self.settings.approval_timeout_seconds,
                first=decision.matched,
                reason=decision.reason,
                grantable=grants.refusal(self.rules, decision, msg.method, msg.tool_name)
                is None,
            )
        except (OSError, LinpodxError) as exc:
            self._deny(msg, f"the approval request could not be recorded ({exc})")
            return
        with self._lock:
            entry = self.inflight.get(key) if key is not None else None
            if entry is not None:
                entry.approval_id = pending.approval_id
            self.stats.prompted += 1
        self._event(
            "approval.pending",
            session=self.session_id,
            approval_id=pending.approval_id,
            method=short(msg.method),
            tool=short(msg.tool_name),
            digest=pending.digest,
            payload=pending.payload,
            fields=[f.to_list() for f in pending.fields],
            fields_more=pending.fields_more,
            reason=pending.reason,
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
            args=(msg, pending, decision),
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

    def _await_approval(
        self, msg: Message, pending: approvals.PendingRequest, rule: policy.Decision
    ) -> None:
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
        grant, scope = self._session_grant(msg, pending, rule, outcome)
        try:
            self._audit(
                "approval.decided",
                {
                    "approval_id": pending.approval_id,
                    "id": short(msg.id),
                    "method": short(msg.method),
                    "tool": short(msg.tool_name),
                    "digest": pending.digest,
                    "decision": decision,
                    "reason": outcome.reason,
                    "by": by,
                    **scope,
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
            **scope,
        )
        if grant is not None and outcome.approved:
            self._record_grant(grant, by)
        if outcome.approved:
            # (`_forward` checks for a cancellation and marks the call forwarded in one step:
            # the client withdrew a call it cancelled, and expects no answer)
            if self._forward(msg):
                with self._lock:
                    self.stats.approved += 1
            return
        with self._lock:
            entry = self.inflight.get(key) if key is not None else None
            cancelled = entry is not None and entry.cancelled is not None
            if cancelled and key is not None:
                self.inflight.pop(key, None)
        if not cancelled:
            self._deny(msg, f"not approved: {outcome.reason}")

    # ---- session grants (`mcp.grants`) ----------------------------------------------------

    def _session_grant(
        self,
        msg: Message,
        pending: approvals.PendingRequest,
        rule: policy.Decision,
        outcome: approvals.Outcome,
    ) -> tuple[grants.Grant | None, dict[str, Any]]:
        """For an approval answered "for the session": the grant to make (not yet in force)
        and what `approval.decided` says of it; a grant that may not be made is said, and the
        call is approved alone."""
        if not (outcome.approved and outcome.answer is not None and outcome.answer.for_session):
            return None, {}
        try:
            grant = self.grants.make(
                rule, msg.method or "", msg.tool_name, pending.approval_id
            )
        except ValueError as exc:
            return None, {"scope": "session", "grant": None, "grant_refused": str(exc)}
        return grant, {"scope": "session", "grant": grant.grant_id}

    def _record_grant(self, grant: grants.Grant, by: dict[str, Any]) -> None:
        """Record the grant, then put it in force: no call passes under a grant whose record
        is not in the chain. Unrecorded, there is no grant (its own call was approved and
        recorded already, and goes on alone)."""
        data = {**grants.record(grant, short), "by": by}
        try:
            self._audit("mcp.grant", data)
        except AuditError as exc:
            self._unrecorded(exc)
            return
        if self.grants.add(grant):
            self._event("approval.granted", session=self.session_id, **data)
