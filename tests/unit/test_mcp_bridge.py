"""The bridge in-process, with a recording fake chain (the real chain is used in integration)."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Mapping
from typing import Any

import pytest

from linpodx.approvals import store as approvals
from linpodx.errors import AuditError
from linpodx.mcp.bridge import Bridge
from linpodx.mcp.framing import Line, Oversize
from linpodx.profile.model import Decision as A
from linpodx.profile.model import McpRule, McpSettings, Profile
from tests.unit.approval_damage import damage, valid_approval


class FakeChain:
    """Records appends; `fail` makes the next appends raise AuditError."""

    def __init__(self) -> None:
        self.records: list[tuple[str, dict[str, Any]]] = []
        self.fail = False

    def append(self, type: str, data: Mapping[str, Any]) -> None:
        if self.fail:
            raise AuditError("disk full")
        self.records.append((type, dict(data)))


class Harness:
    def __init__(self, **settings: Any) -> None:
        self.profile = Profile(
            name="t",
            mcp_policy=(
                McpRule("tools/call", A.AUTO_ALLOW, "read_file"),
                McpRule("tools/call", A.PROMPT, "write_file"),
                McpRule("tools/call", A.DENY, "run_shell"),
            ),
            mcp=McpSettings(**{"approval_timeout_seconds": 5, **settings}),
        )
        self.chain = FakeChain()
        self.client: list[dict[str, Any]] = []
        self.server: list[dict[str, Any]] = []
        self.events: list[tuple[str, dict[str, Any]]] = []
        self.bridge = Bridge(
            profile=self.profile,
            session_id="sess_T",
            chain=self.chain,
            to_client=lambda b: self.client.append(json.loads(b)),
            to_server=lambda b: self.server.append(json.loads(b)),
            emit=lambda t, **d: self.events.append((t, d)),
        )

    def c(self, line: bytes | str | dict[str, Any]) -> None:
        if isinstance(line, dict):
            line = json.dumps(line)
        if isinstance(line, str):
            line = line.encode()
        self.bridge.on_client_frame(Line(line))

    def s(self, obj: dict[str, Any] | bytes) -> None:
        data = obj if isinstance(obj, bytes) else json.dumps(obj).encode()
        self.bridge.on_server_frame(Line(data))


def call(i: int, tool: str, **args: Any) -> dict[str, Any]:
    return {
        "jsonrpc": "2.0",
        "id": i,
        "method": "tools/call",
        "params": {"name": tool, "arguments": args},
    }


def test_auto_allow_forwards_and_records_before() -> None:
    h = Harness()
    h.c(call(1, "read_file", path="a"))
    assert h.server == [call(1, "read_file", path="a")]
    typ, rec = h.chain.records[0]
    assert typ == "mcp.request" and rec["decision"] == "auto_allow" and rec["tool"] == "read_file"
    assert "arguments" not in rec and len(rec["args_sha256"]) == 64
    h.s({"jsonrpc": "2.0", "id": 1, "result": {"content": []}})
    assert h.client == [{"jsonrpc": "2.0", "id": 1, "result": {"content": []}}]
    typ, rec = h.chain.records[1]
    assert typ == "mcp.response" and rec["status"] == "ok" and rec["duration_ms"] >= 0


def test_record_arguments_in_full_when_profile_says_so() -> None:
    h = Harness(record_arguments=True)
    h.c(call(1, "read_file", path="a"))
    assert h.chain.records[0][1]["arguments"] == {"path": "a"}


def test_denied_tool_call_is_a_tool_error_and_never_forwarded() -> None:
    h = Harness()
    h.c(call(2, "run_shell", cmd="id"))
    h.c(call(3, "unknown_tool"))
    assert h.server == []
    for resp in h.client:
        assert resp["result"]["isError"] is True
        assert resp["result"]["content"][0]["text"].startswith("denied by linpodx policy")
    assert [e[1]["decision"] for e in h.events] == ["deny", "deny"]


def test_other_denied_request_is_jsonrpc_error() -> None:
    h = Harness()
    h.c({"jsonrpc": "2.0", "id": 5, "method": "resources/read", "params": {"uri": "x"}})
    assert h.server == [] and h.client[0]["error"]["code"] == -32090


def test_escaped_method_is_gated_as_tools_call() -> None:
    h = Harness()
    h.c('{"jsonrpc":"2.0","id":1,"method":"tools\\u002fcall","params":{"name":"run_shell"}}')
    assert h.server == [] and h.client[0]["result"]["isError"] is True
    h.c('{"jsonrpc":"2.0","id":2,"method":"tools\\u002fcall","params":{"name":"read_file"}}')
    assert h.server == [
        {"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": {"name": "read_file"}}
    ]


@pytest.mark.parametrize(
    "line",
    [
        b'{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"read_file","name":"run_shell"}}',
        b'{"jsonrpc":"2.0","id":1,"method":"tools/list","method":"tools/call","params":{"name":"run_shell"}}',
        b'{"jsonrpc":"2.0","id":1,"method":"tools/list","Method":"tools/call"}',
        b'{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"read_file","a":NaN}}',
        b'{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"read\xff"}}',
        b"[]",
        b'[{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"run_shell"}}]',
        b'[{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"read_file"}}]',
    ],
)
def test_refused_frames_never_reach_the_server(line: bytes) -> None:
    h = Harness()
    h.c(line)
    assert h.server == []
    assert len(h.client) == 1 and "error" in h.client[0]
    assert h.chain.records[-1][0] == "mcp.invalid"


def test_oversize_from_client_answered_with_null_id() -> None:
    h = Harness()
    h.bridge.on_client_frame(Oversize(10**8, b'{"id":1'))
    assert h.server == [] and h.client[0]["id"] is None and "error" in h.client[0]


def test_batch_allowed_only_in_2025_03_26_and_each_element_gated() -> None:
    h = Harness()
    h.c(
        {
            "jsonrpc": "2.0",
            "id": 0,
            "method": "initialize",
            "params": {"protocolVersion": "2025-03-26"},
        }
    )
    h.s({"jsonrpc": "2.0", "id": 0, "result": {"protocolVersion": "2025-03-26"}})
    h.server.clear()
    h.client.clear()
    batch = [call(1, "read_file"), call(2, "run_shell"), {"jsonrpc": "2.0", "id": 3, "X": 1}]
    h.c(json.dumps(batch))
    assert h.server == [call(1, "read_file")]
    assert h.client[0]["result"]["isError"] is True and "error" in h.client[1]


def test_id_reuse_in_flight_refused() -> None:
    h = Harness()
    h.c(call(1, "read_file"))
    h.c(call(1, "read_file", path="other"))
    assert len(h.server) == 1
    assert h.client[0]["error"]["code"] == -32600
    # A null id: an answer with id 1 would settle the request still in flight for the client.
    assert h.client[0]["id"] is None
    h.s({"jsonrpc": "2.0", "id": 1, "result": {}})
    h.c(call(1, "read_file", path="again"))  # free again once answered
    assert len(h.server) == 2


def test_unknown_response_ids_dropped_both_ways() -> None:
    h = Harness()
    h.s({"jsonrpc": "2.0", "id": 99, "result": {}})
    h.c({"jsonrpc": "2.0", "id": 98, "result": {}})
    assert h.client == [] and h.server == []
    assert [r[0] for r in h.chain.records] == ["mcp.drop", "mcp.drop"]
    h.s({"jsonrpc": "2.0", "id": "1", "result": {}})  # "1" is not 1
    h.c(call(1, "read_file"))
    h.s({"jsonrpc": "2.0", "id": "1", "result": {}})
    assert h.client == []


def test_server_requests_denied_unless_allowed() -> None:
    h = Harness()
    for i, m in enumerate(("sampling/createMessage", "elicitation/create", "roots/list")):
        h.s({"jsonrpc": "2.0", "id": i, "method": m, "params": {}})
    assert h.client == []
    assert [r["id"] for r in h.server] == [0, 1, 2] and all("error" in r for r in h.server)
    h2 = Harness(allow_server_requests=("roots/list",))
    h2.s({"jsonrpc": "2.0", "id": 7, "method": "roots/list"})
    assert h2.client[0]["method"] == "roots/list"
    h2.c({"jsonrpc": "2.0", "id": 7, "result": {"roots": []}})
    assert h2.server == [{"jsonrpc": "2.0", "id": 7, "result": {"roots": []}}]


def test_invalid_server_output_dropped() -> None:
    h = Harness()
    h.s(b'{"jsonrpc":"2.0","id":1,"result":{},"result":{}}')
    h.bridge.on_server_frame(Oversize(10**8, b""))
    assert h.client == [] and [r[0] for r in h.chain.records] == ["mcp.invalid", "mcp.invalid"]


def test_audit_failure_denies_the_call() -> None:
    h = Harness()
    h.chain.fail = True
    h.c(call(1, "read_file"))
    assert h.server == []
    assert h.client[0]["result"]["isError"] is True
    assert "audit" in h.client[0]["result"]["content"][0]["text"]


def test_audit_failure_withholds_the_result() -> None:
    h = Harness()
    h.c(call(1, "read_file"))
    h.chain.fail = True
    h.s({"jsonrpc": "2.0", "id": 1, "result": {"content": [{"type": "text", "text": "secret"}]}})
    assert "error" in h.client[0] and "secret" not in json.dumps(h.client)


def _wait_for(cond: Any, timeout: float = 5.0) -> None:
    end = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > end:
            raise AssertionError("condition not met in time")
        time.sleep(0.01)


def test_prompt_approved_forwards() -> None:
    h = Harness()
    h.c(call(4, "write_file", path="a", content="y"))
    _wait_for(lambda: any(e[0] == "approval.pending" for e in h.events))
    ev = next(e[1] for e in h.events if e[0] == "approval.pending")
    assert h.server == []
    p = approvals.load(ev["approval_id"])
    assert approvals.answer(p.approval_id, p.digest, approvals.APPROVE)
    _wait_for(lambda: h.server)
    assert h.server == [call(4, "write_file", path="a", content="y")]
    assert any(
        r[0] == "approval.decided" and r[1]["decision"] == "approve" for r in h.chain.records
    )


def test_prompt_times_out_to_deny() -> None:
    h = Harness(approval_timeout_seconds=1)
    h.c(call(4, "write_file"))
    _wait_for(lambda: h.client, timeout=5)
    assert h.server == [] and h.client[0]["result"]["isError"] is True
    assert "timeout" in h.client[0]["result"]["content"][0]["text"]


def test_shutdown_denies_pending() -> None:
    h = Harness()
    h.c(call(4, "write_file"))
    _wait_for(lambda: any(e[0] == "approval.pending" for e in h.events))
    t = threading.Thread(target=h.bridge.shutdown, args=("client closed",))
    t.start()
    t.join(5)
    assert h.server == [] and "session ended" in h.client[0]["result"]["content"][0]["text"]


def test_prompt_does_not_block_other_calls() -> None:
    h = Harness()
    h.c(call(4, "write_file"))
    h.c(call(5, "read_file"))
    assert h.server == [call(5, "read_file")]
    h.bridge.shutdown("end")


def test_cancel_of_pending_prompt_withdraws_it() -> None:
    h = Harness()
    h.c(call(4, "write_file"))
    _wait_for(lambda: any(e[0] == "approval.pending" for e in h.events))
    h.c({"jsonrpc": "2.0", "method": "notifications/cancelled", "params": {"requestId": 4}})
    _wait_for(lambda: any(e[0] == "approval.decided" for e in h.events))
    time.sleep(0.1)
    assert h.server == [] and h.client == []


CANCEL_4 = {"jsonrpc": "2.0", "method": "notifications/cancelled", "params": {"requestId": 4}}


def test_a_cancellation_just_before_an_approved_call_is_forwarded_withdraws_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A cancellation that came after the approval's wait had checked for one, and before the
    call was marked forwarded, was absorbed (not forwarded), and the call went to the server
    all the same: the server ran a call the client had withdrawn."""
    h = Harness()
    forward = h.bridge._forward

    def cancel_first(msg: Any) -> Any:
        # The client's reader thread handles the cancellation in that window.
        h.c(CANCEL_4)
        return forward(msg)

    monkeypatch.setattr(h.bridge, "_forward", cancel_first)
    h.c(call(4, "write_file", path="a"))
    _wait_for(lambda: any(e[0] == "approval.pending" for e in h.events))
    p = approvals.load(next(e[1] for e in h.events if e[0] == "approval.pending")["approval_id"])
    assert approvals.answer(p.approval_id, p.digest, approvals.APPROVE)
    _wait_for(lambda: any(r[0] == "approval.decided" for r in h.chain.records))
    h.bridge.shutdown("end")
    assert h.server == [] and h.client == []  # withdrawn: no forward, no answer
    absorbed = [r[1] for r in h.chain.records if r[1].get("decision") == "absorbed"]
    assert absorbed == [
        {"dir": "client", "method": "notifications/cancelled", "decision": "absorbed", "id": 4,
         "approval_id": p.approval_id}
    ]  # fmt: skip
    assert h.bridge.summary()["in_flight"] == 0 and h.bridge.summary()["forwarded"] == 0


def test_a_cancellation_before_the_approval_is_asked_for_withdraws_the_call(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Before its approval existed, a call's cancellation was forwarded to a server that never
    saw the call, and the call then waited for a person and, approved, was forwarded."""
    h = Harness()
    create = approvals.create

    def cancel_first(*args: Any, **kwargs: Any) -> Any:
        h.c(CANCEL_4)
        return create(*args, **kwargs)

    monkeypatch.setattr(approvals, "create", cancel_first)
    h.c(call(4, "write_file", path="a"))
    pending = [e[1] for e in h.events if e[0] == "approval.pending"]
    for ev in pending:  # (a person who answers yes, if anyone was asked)
        p = approvals.load(ev["approval_id"])
        approvals.answer(p.approval_id, p.digest, approvals.APPROVE)
    h.bridge.shutdown("end")
    assert h.server == [] and h.client == []
    assert h.bridge.summary()["in_flight"] == 0


def test_denied_notification_dropped_and_recorded() -> None:
    h = Harness()
    h.c({"jsonrpc": "2.0", "method": "notifications/something"})
    assert h.server == [] and h.client == []
    assert h.chain.records[0][1]["decision"] == "deny"


def test_modern_requests_get_result_type_on_denial() -> None:
    h = Harness()
    meta = {"io.modelcontextprotocol/protocolVersion": "2026-07-28"}
    h.c(
        {
            "jsonrpc": "2.0",
            "id": 1,
            "method": "tools/call",
            "params": {"name": "run_shell", "_meta": meta},
        }
    )
    h.c(call(2, "run_shell"))
    assert h.client[0]["result"]["resultType"] == "complete"
    assert "resultType" not in h.client[1]["result"]


@pytest.mark.parametrize("how", ["deep", "fifo", "huge", "symlink"])
def test_unreadable_answer_denies_audits_and_the_bridge_goes_on(how: str) -> None:
    h = Harness(approval_timeout_seconds=30)
    h.c(call(4, "write_file"))
    _wait_for(lambda: any(e[0] == "approval.pending" for e in h.events))
    p = approvals.load(next(e[1] for e in h.events if e[0] == "approval.pending")["approval_id"])
    damage(approvals.approvals_dir() / p.approval_id / "answer.json", how, valid_approval(p))
    _wait_for(lambda: h.client, timeout=3)  # at once, not at the window's end
    assert h.server == [] and h.client[0]["result"]["isError"] is True
    assert "answer file is unreadable" in h.client[0]["result"]["content"][0]["text"]
    decided = [r[1] for r in h.chain.records if r[0] == "approval.decided"]
    assert [(d["decision"], d["reason"].split(" (")[0]) for d in decided] == [
        ("deny", "the answer file is unreadable")
    ]
    h.c(call(5, "read_file"))
    assert h.server == [call(5, "read_file")]
    t0 = time.monotonic()
    h.bridge.shutdown("end")
    assert time.monotonic() - t0 < 2


def test_unexpected_error_while_waiting_denies(monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(*_args: Any, **_kwargs: Any) -> approvals.Outcome:
        raise RecursionError("maximum recursion depth exceeded")

    monkeypatch.setattr(approvals, "wait", broken)
    h = Harness()
    h.c(call(4, "write_file"))
    _wait_for(lambda: h.client, timeout=3)
    assert h.server == [] and "RecursionError" in h.client[0]["result"]["content"][0]["text"]
    decided = [r[1] for r in h.chain.records if r[0] == "approval.decided"]
    assert [d["decision"] for d in decided] == ["deny"]


def test_a_fenced_direction_takes_no_more_frames_and_records_nothing() -> None:
    """Once the session ends, a request the client still sends is neither forwarded nor
    recorded: nothing may follow the session's closing record."""
    h = Harness()
    h.c(call(1, "read_file", path="a"))
    before = list(h.chain.records)
    h.bridge.fence("client")
    h.c(call(2, "read_file", path="b"))
    h.bridge.fence("server")
    h.s({"jsonrpc": "2.0", "id": 1, "result": {"content": []}})
    assert h.server == [call(1, "read_file", path="a")] and h.client == []
    assert h.chain.records == before
    assert h.bridge.summary()["ignored_after_end"] == 2


def test_an_oversize_response_is_answered_with_an_error_for_its_call() -> None:
    """The response line crossed mcp.max_line_bytes and was dropped: the call it answers (its
    id read from the line's first bytes) gets an error, not silence until the session ends."""
    h = Harness()
    h.c(call(6, "read_file", path="big"))
    h.bridge.on_server_frame(Oversize(6_000_123, b'{"jsonrpc":"2.0","id":6,"result":{"content'))
    (answer,) = h.client
    assert answer["id"] == 6 and "exceeds mcp.max_line_bytes" in answer["error"]["message"]
    types = [(t, r.get("status")) for t, r in h.chain.records]
    assert types[-2:] == [("mcp.invalid", None), ("mcp.response", "error")]
    # An id nobody is waiting for, or none to be found, answers nothing.
    h.bridge.on_server_frame(Oversize(6_000_123, b'{"jsonrpc":"2.0","id":7,"result":{'))
    h.bridge.on_server_frame(Oversize(6_000_123, b'{"result":{"id":6},"id":6,'))
    assert len(h.client) == 1


def test_a_batch_of_more_than_batch_max_messages_is_refused_whole() -> None:
    """One line `[1,1,1,…]` of 500,000 elements was as many records and hundreds of MB."""
    from linpodx.mcp import jsonrpc

    h = Harness()
    h.bridge.protocol_version = "2025-03-26"  # the one revision with batches
    h.c(json.dumps([call(i, "read_file") for i in range(jsonrpc.BATCH_MAX + 1)]))
    assert h.server == []
    assert len(h.client) == 1 and h.client[0]["error"]["code"] == -32600
    assert "at most" in h.client[0]["error"]["message"]
    h.c(json.dumps([call(i, "read_file") for i in range(jsonrpc.BATCH_MAX)]))
    assert len(h.server) == jsonrpc.BATCH_MAX


def test_requests_in_flight_and_calls_waiting_for_a_person_are_bounded(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Each prompted call waits in a thread, each request in flight is remembered: a client
    sending thousands of them made the bridge spend the machine's CPU and memory."""
    from linpodx.mcp.bridge import client as client_side

    # (the gate reads both bounds in `client`, where they are looked up)
    monkeypatch.setattr(client_side, "INFLIGHT_MAX", 5)
    monkeypatch.setattr(client_side, "APPROVALS_MAX", 2)
    monkeypatch.setattr(Bridge, "_prompt", lambda self, msg, *_: self._held(msg))

    def held(self: Any, msg: Any) -> None:  # as `_prompt` marks a call waiting for a person
        with self._lock:
            self.inflight[msg.id_key].approval_id = f"apr_{msg.id}"

    monkeypatch.setattr(Bridge, "_held", held, raising=False)
    h = Harness()
    for i in range(3):
        h.c(call(i, "write_file"))
    third = [r for t, r in h.chain.records if t == "mcp.request"][2]
    assert third["decision"] == "deny" and "waiting for a person" in third["reason"]
    for i in (10, 11, 12, 13):  # two waiting for a person (the denied one is gone) + four
        h.c(call(i, "read_file"))
    assert [m["id"] for m in h.server] == [10, 11, 12]
    refused = h.client[-1]
    assert refused["id"] == 13 and "requests in flight" in refused["error"]["message"]


def test_calls_waiting_for_a_person_are_bounded_when_their_records_are_queued(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """With a backlog the decision records go through a lane and each call's approval is made
    only once its record is written: a burst of prompted calls in one write was decided while
    none of them had an approval yet, so all of them prompted (4,096 approvals, as many threads,
    a person asked 4,096 times). And a call approved and forwarded, its answer not back yet,
    waits for the server, not for a person: it no longer takes one of the places."""
    from linpodx.mcp.bridge import client as client_side

    monkeypatch.setattr(client_side, "APPROVALS_MAX", 2)
    prompted: list[Any] = []

    def prompt(self: Any, msg: Any, *_: Any) -> None:  # as `_prompt` marks a call waiting
        with self._lock:
            self.inflight[msg.id_key].approval_id = f"apr_{msg.id}"
        prompted.append(msg.id)

    monkeypatch.setattr(Bridge, "_prompt", prompt)
    queued: list[Any] = []
    real_then = Bridge._then
    monkeypatch.setattr(Bridge, "_then", lambda self, *a, **k: queued.append((self, a, k)))
    h = Harness()
    for i in range(3):
        h.c(call(i, "write_file"))
    for self_, a, k in queued:  # the lane writes the records, then acts
        real_then(self_, *a, **k)
    assert prompted == [0, 1]
    assert "waiting for a person" in h.client[-1]["result"]["content"][0]["text"]
    monkeypatch.setattr(Bridge, "_then", real_then)
    from linpodx.mcp import jsonrpc

    for i in (0, 1):  # approved and forwarded: the server has them now
        msg = jsonrpc.parse(json.dumps(call(i, "write_file")).encode())
        assert isinstance(msg, jsonrpc.Message)
        h.bridge._forward(msg)
    h.c(call(5, "write_file"))
    assert prompted == [0, 1, 5]


def test_a_full_lane_makes_its_reader_wait() -> None:
    """Backpressure: a lane blocked on a peer that does not read holds at most
    LANE_BACKLOG_MAX steps; the next `put` waits for room instead of queueing without end."""
    import threading

    from linpodx.mcp.bridge import lanes

    release = threading.Event()

    class Chain:
        def wait(self, ticket: Any) -> None:
            release.wait(10)

    lane = lanes.Lane(Chain(), "t", lambda m: None)
    for _ in range(lanes.LANE_BACKLOG_MAX + 1):  # one is taken by the (blocked) thread
        lane.put(None, lambda: None, lambda e: None)
    extra = threading.Thread(target=lane.put, args=(None, lambda: None, lambda e: None))
    extra.start()
    extra.join(1.0)
    assert extra.is_alive() and len(lane.queue) == lanes.LANE_BACKLOG_MAX
    release.set()
    extra.join(10)
    assert not extra.is_alive()
    lane.drain(10)
