"""Group commit on the real session chain, deferred outcome records, and the bridge's lanes."""

from __future__ import annotations

import json
import os
import threading
import time
from typing import Any

import pytest

from linpodx.audit import chain as audit_chain
from linpodx.audit.core import MAX_LINE
from linpodx.errors import AuditError
from linpodx.mcp.auditlog import GroupCommitChain
from linpodx.mcp.bridge import Bridge
from linpodx.mcp.framing import Line
from linpodx.profile.model import Decision as A
from linpodx.profile.model import McpRule, Profile

GENESIS = "ab" * 32


def test_concurrent_appends_form_one_valid_chain() -> None:
    ch = audit_chain.session_chain("sess_group", GENESIS)
    g = GroupCommitChain(ch)

    def work(k: int) -> None:
        for i in range(40):
            rec = g.append("mcp.request", {"k": k, "i": i})
            assert rec.data == {"k": k, "i": i}

    threads = [threading.Thread(target=work, args=(k,)) for k in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    # Someone else appends in between: the next batch resynchronizes from the file.
    ch.append("session.close", {"by": "other"})
    g.append("mcp.request", {"after": True})
    g.close()
    report = audit_chain.verify_file(ch.path, GENESIS)
    assert report.ok and report.events == 242
    assert g.batches <= g.records  # several records share an fsync when callers overlap


def test_unrecordable_data_fails_only_that_record() -> None:
    g = GroupCommitChain(audit_chain.session_chain("sess_float", GENESIS))
    with pytest.raises(AuditError):
        g.append("mcp.request", {"x": 1.5})
    assert g.append("mcp.request", {"x": 1}).seq == 0


def test_an_unrecordable_first_record_of_a_batch_fails_only_itself() -> None:
    """The first batch of a fresh session, for which the writer reads the tail from the file: a
    call whose arguments cannot be recorded must not deny the other calls that share its batch."""
    g = GroupCommitChain(audit_chain.session_chain("sess_batch", GENESIS))
    bad = g.submit("mcp.request", {"x": 1.5})
    also_bad = g.submit("mcp.request", {"x": "a" * MAX_LINE})
    good = g.submit("mcp.request", {"x": 1})
    later = g.submit("mcp.request", {"x": 2})
    assert g.wait(good).seq == 0
    assert g.wait(later).seq == 1
    for item in (bad, also_bad):
        with pytest.raises(AuditError):
            g.wait(item)
    g.close()
    assert audit_chain.verify_file(g.path, GENESIS).events == 2


UNRECORDABLE: dict[str, tuple[str, dict[str, Any], str, str]] = {
    # kind: (event type, data, what the message says, what the hint advises)
    "event type": ("Mcp.Request", {"x": 1}, "invalid event type", "this is a bug in linpodx"),
    "float": ("mcp.request", {"x": 1.5}, "the event data cannot be recorded",
              "set record_arguments to false"),
    "too large": ("mcp.request", {"x": "a" * MAX_LINE}, f"record larger than {MAX_LINE} bytes",
                  "set record_arguments to false"),
}  # fmt: skip


@pytest.mark.parametrize("later", [False, True], ids=["first record", "later record"])
@pytest.mark.parametrize("kind", sorted(UNRECORDABLE))
def test_a_record_that_cannot_be_written_says_what_to_do(kind: str, later: bool) -> None:
    """Every AuditError of a record refused for its own content carries a hint: the first
    record of a group goes through `Chain.append`, later ones through the group's encoder."""
    typ, data, what, advice = UNRECORDABLE[kind]
    g = GroupCommitChain(audit_chain.session_chain(f"sess_hint{len(kind)}{later}", GENESIS))
    if later:
        g.append("mcp.request", {"x": 0})
    with pytest.raises(AuditError) as ei:
        g.append(typ, data)
    assert what in ei.value.message
    assert ei.value.hint is not None and advice in ei.value.hint, ei.value.hint
    assert "what could not be recorded was not done" in ei.value.hint
    assert g.append("mcp.request", {"x": 2}).seq == (1 if later else 0)  # only that record
    g.close()


def test_write_failure_raises_audit_error(monkeypatch: pytest.MonkeyPatch) -> None:
    g = GroupCommitChain(audit_chain.session_chain("sess_full", GENESIS))
    g.append("mcp.request", {"x": 1})

    def full(_fd: int) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr("linpodx.mcp.auditlog.os.fsync", full)
    with pytest.raises(AuditError):
        g.append("mcp.request", {"x": 2})
    monkeypatch.undo()
    g.close()
    assert audit_chain.verify_file(g.path, GENESIS).events == 1  # nothing half-written


def test_pipelined_bridge_records_before_acting() -> None:
    ch = audit_chain.session_chain("sess_pipe", GENESIS)
    g = GroupCommitChain(ch)
    sent: list[dict[str, Any]] = []
    seen_at_send: list[int] = []
    lock = threading.Lock()

    def to_server(data: bytes) -> None:
        msg = json.loads(data)
        with lock:
            sent.append(msg)
            # The request's record must already be on disk when it is forwarded.
            seen_at_send.append(len(audit_chain.read_records(ch.path)))

    profile = Profile(name="p", mcp_policy=(McpRule("tools/call", A.AUTO_ALLOW, "echo"),))
    bridge = Bridge(
        profile=profile,
        session_id="sess_pipe",
        chain=g,
        to_client=lambda _b: None,
        to_server=to_server,
        emit=lambda *_a, **_k: None,
        pipeline=True,
    )
    for i in range(50):
        bridge.on_client_frame(
            Line(
                json.dumps(
                    {
                        "jsonrpc": "2.0",
                        "id": i,
                        "method": "tools/call",
                        "params": {"name": "echo", "arguments": {"i": i}},
                    }
                ).encode()
            ),
            more=i % 10 != 9,  # backlog for most frames (queued in the lane), none for some
        )
    bridge.drain()
    g.close()
    assert [m["id"] for m in sent] == list(range(50))  # arrival order kept
    assert all(n >= k + 1 for k, n in enumerate(seen_at_send))
    assert audit_chain.verify_file(ch.path, GENESIS).ok


class Syncs:
    """Stands in for os.fsync: counts calls and remembers the file size each one covered."""

    def __init__(self, fail: bool = False) -> None:
        self.sizes: list[int] = []
        self.fail = fail
        self.real = os.fsync

    def __call__(self, fd: int) -> None:
        if self.fail:
            raise OSError(5, "Input/output error")
        self.real(fd)
        self.sizes.append(os.fstat(fd).st_size)


def test_deferred_record_is_written_at_once_and_synced_by_the_next_decision(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    g = GroupCommitChain(audit_chain.session_chain("sess_defer", GENESIS), flush_delay=3600)
    g.append("mcp.request", {"i": 0})
    syncs = Syncs()
    monkeypatch.setattr("linpodx.mcp.auditlog.os.fsync", syncs)
    g.append_deferred("mcp.response", {"i": 0})
    # Written (readable, survives the process) before append_deferred returned; not yet synced.
    assert [r.type for r in audit_chain.read_records(g.path)][-1] == "mcp.response"
    assert syncs.sizes == []
    g.append("mcp.request", {"i": 1})
    assert syncs.sizes == [g.path.stat().st_size]  # one fsync covered both records
    g.close()
    assert audit_chain.verify_file(g.path, GENESIS).events == 3


def test_flusher_syncs_a_lone_deferred_record(monkeypatch: pytest.MonkeyPatch) -> None:
    g = GroupCommitChain(audit_chain.session_chain("sess_flusher", GENESIS), flush_delay=0.01)
    g.append("mcp.request", {"i": 0})
    syncs = Syncs()
    monkeypatch.setattr("linpodx.mcp.auditlog.os.fsync", syncs)
    g.append_deferred("mcp.response", {"i": 0})
    size = g.path.stat().st_size
    deadline = time.monotonic() + 30  # a bound for a stuck flusher, not a timing claim
    while size not in syncs.sizes and time.monotonic() < deadline:
        time.sleep(0.01)
    assert size in syncs.sizes  # nobody else appended: the flusher made it durable
    g.close()


def test_close_makes_deferred_records_durable(monkeypatch: pytest.MonkeyPatch) -> None:
    g = GroupCommitChain(audit_chain.session_chain("sess_closing", GENESIS), flush_delay=3600)
    g.append("mcp.request", {"i": 0})
    syncs = Syncs()
    monkeypatch.setattr("linpodx.mcp.auditlog.os.fsync", syncs)
    for i in range(3):
        g.append_deferred("mcp.response", {"i": i})
    assert syncs.sizes == []
    g.close()
    assert syncs.sizes == [g.path.stat().st_size]
    assert g.failure is None


def test_failed_sync_fails_the_chain_for_good(monkeypatch: pytest.MonkeyPatch) -> None:
    g = GroupCommitChain(audit_chain.session_chain("sess_eio", GENESIS), flush_delay=3600)
    g.append("mcp.request", {"i": 0})
    durable = g.path.stat().st_size
    g.append_deferred("mcp.response", {"i": 0})
    monkeypatch.setattr("linpodx.mcp.auditlog.os.fsync", Syncs(fail=True))
    with pytest.raises(AuditError, match="fsync failed"):
        g.append("mcp.request", {"i": 1})
    monkeypatch.undo()
    # Later writes might succeed, but what the failed fsync covered may be gone: refuse all.
    with pytest.raises(AuditError, match="fsync failed"):
        g.append("mcp.request", {"i": 2})
    with pytest.raises(AuditError, match="fsync failed"):
        g.append_deferred("mcp.response", {"i": 2})
    assert g.failure is not None
    g.close()
    # What was not known durable is cut off; the chain still verifies.
    assert g.path.stat().st_size == durable
    assert audit_chain.verify_file(g.path, GENESIS).events == 1


def test_pipelined_bridge_writes_the_outcome_before_delivering() -> None:
    ch = audit_chain.session_chain("sess_outcome", GENESIS)
    g = GroupCommitChain(ch, flush_delay=3600)
    seen: list[list[str]] = []
    profile = Profile(name="p", mcp_policy=(McpRule("tools/call", A.AUTO_ALLOW, "echo"),))
    bridge = Bridge(
        profile=profile,
        session_id="sess_outcome",
        chain=g,
        to_client=lambda _b: seen.append([r.type for r in audit_chain.read_records(ch.path)]),
        to_server=lambda _b: None,
        emit=lambda *_a, **_k: None,
        pipeline=True,
    )
    call = {"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {"name": "echo"}}
    bridge.on_client_frame(Line(json.dumps(call).encode()))
    answer = {"jsonrpc": "2.0", "id": 1, "result": {"content": []}}
    bridge.on_server_frame(Line(json.dumps(answer).encode()))
    bridge.drain()
    g.close()
    assert seen == [["mcp.request", "mcp.response"]]
    assert audit_chain.verify_file(ch.path, GENESIS).ok


def test_pipelined_events_keep_call_order_and_refusals_go_out_at_once() -> None:
    seen: list[str] = []
    profile = Profile(
        name="p",
        mcp_policy=(
            McpRule("tools/call", A.AUTO_ALLOW, "echo"),
            McpRule("tools/call", A.DENY, "run_shell"),
        ),
    )
    g = GroupCommitChain(audit_chain.session_chain("sess_events", GENESIS))
    bridge = Bridge(
        profile=profile,
        session_id="sess_events",
        chain=g,
        to_client=lambda _b: None,
        to_server=lambda _b: None,
        emit=lambda _t, **d: seen.append(f"{d['tool']} {d['decision']}"),
        pipeline=True,
    )
    for i, tool in enumerate(("echo", "run_shell")):
        call = {"jsonrpc": "2.0", "id": i, "method": "tools/call", "params": {"name": tool}}
        bridge.on_client_frame(Line(json.dumps(call).encode()))
    # The refusal was written before on_client_frame returned, after the allow queued before it.
    assert seen == ["echo auto_allow", "run_shell deny"]
    bridge.drain()
    g.close()


def test_foreign_append_between_batches_does_not_fork_the_chain() -> None:
    """The writer keeps the lock for a whole batch, so another process can append only between
    two batches; its record must not be overlooked: our in-memory tail is then stale, and
    chaining onto it would leave two records with the same seq beside each other (a fork)."""
    ch = audit_chain.session_chain("sess_race", GENESIS)
    g = GroupCommitChain(ch)
    assert g.append("mcp.request", {"i": 0}).seq == 0
    # A second writer (its own open file, so its own flock), e.g. another process.
    audit_chain.Chain(ch.path, ch.genesis).append("test.other", {"by": "other"})
    assert g.append("mcp.request", {"i": 1}).seq == 2  # after the other's seq 1, not a second 1
    g.append("mcp.request", {"i": 2})
    g.close()
    report = audit_chain.verify_file(ch.path, GENESIS)
    assert report.ok, report.reason
    assert report.events == 4
    seqs = [json.loads(line)["seq"] for line in ch.path.read_bytes().splitlines()]
    assert seqs == [0, 1, 2, 3]


def test_a_same_size_rewrite_between_batches_is_seen_as_the_plain_writer_sees_it() -> None:
    """The file's size alone does not prove our cached tail: someone who rewrites the last
    record in place (same size) must be caught as `Chain.append` catches it, by the bytes."""
    ch = audit_chain.session_chain("sess_inplace", GENESIS)
    g = GroupCommitChain(ch)
    g.append("mcp.request", {"tool": "wwww"})
    raw = ch.path.read_bytes()
    edited = raw.replace(b'"wwww"', b'"xxxx"')  # same size, same inode, hash now wrong
    assert len(edited) == len(raw) and edited != raw
    with open(ch.path, "r+b") as f:
        f.write(edited)
    with pytest.raises(AuditError, match="last record is damaged"):
        g.append("mcp.request", {"i": 1})
    g.close()
    assert ch.path.read_bytes() == edited


class BlockingSync:
    """Stands in for os.fsync: each call waits until `release` is set (a slow disk), and says
    when it started."""

    def __init__(self, fail: bool = False) -> None:
        self.real = os.fsync
        self.started = threading.Event()
        self.release = threading.Event()
        self.fail = fail

    def __call__(self, fd: int) -> None:
        self.started.set()
        assert self.release.wait(30), "the test never released the fsync"
        if self.fail:
            self.fail = False  # once, as Linux reports a writeback error
            raise OSError(5, "Input/output error")
        self.real(fd)


def _echo_bridge(
    sid: str, g: GroupCommitChain
) -> tuple[Bridge, list[dict[str, Any]], list[dict[str, Any]], threading.Event]:
    """A pipelined bridge with an auto-allowed `echo`; (it, what the server got, what the
    client got, set when the server got something)."""
    to_server: list[dict[str, Any]] = []
    to_client: list[dict[str, Any]] = []
    forwarded = threading.Event()

    def server(data: bytes) -> None:
        to_server.append(json.loads(data))
        forwarded.set()

    profile = Profile(name="p", mcp_policy=(McpRule("tools/call", A.AUTO_ALLOW, "echo"),))
    bridge = Bridge(
        profile=profile,
        session_id=sid,
        chain=g,
        to_client=lambda data: to_client.append(json.loads(data)),
        to_server=server,
        emit=lambda *_a, **_k: None,
        pipeline=True,
    )
    return bridge, to_server, to_client, forwarded


def _feed(handler: Any, msg: dict[str, Any]) -> threading.Thread:
    t = threading.Thread(target=handler, args=(Line(json.dumps(msg).encode()),), daemon=True)
    t.start()
    return t


CALL = {"jsonrpc": "2.0", "id": 7, "method": "tools/call", "params": {"name": "echo"}}
ANSWER = {"jsonrpc": "2.0", "id": 7, "result": {"content": [{"type": "text", "text": "hi"}]}}


def test_a_request_is_forwarded_once_written_and_its_answer_waits_for_the_fsync(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The durability rule: the decision record is written (in the file) when the request
    reaches the server, while its fsync is still running; the server's answer is held until
    that fsync ends, then delivered."""
    g = GroupCommitChain(audit_chain.session_chain("sess_overlap", GENESIS), flush_delay=3600)
    bridge, to_server, to_client, forwarded = _echo_bridge("sess_overlap", g)
    g.append("session.start", {})  # (a new log's first write also syncs its directory)
    sync = BlockingSync()
    monkeypatch.setattr("linpodx.mcp.auditlog.os.fsync", sync)
    reader = _feed(bridge.on_client_frame, CALL)
    assert forwarded.wait(10), "the request was not forwarded while its fsync ran"
    assert sync.started.is_set() and not sync.release.is_set()
    assert to_server[0]["id"] == 7
    written = [r.type for r in audit_chain.read_records(g.path)]
    assert written == ["session.start", "mcp.request"]
    answering = _feed(bridge.on_server_frame, ANSWER)
    answering.join(0.5)
    assert to_client == [], "the answer reached the client before its call's record was durable"
    sync.release.set()
    answering.join(10)
    reader.join(10)
    assert [m.get("id") for m in to_client] == [7] and "result" in to_client[0]
    bridge.drain()
    g.close()
    assert audit_chain.verify_file(g.path, GENESIS).events == 3


def test_a_failed_fsync_withholds_the_answer_and_fails_the_session_closed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The request went to the server once written; its fsync fails: the client gets an error
    instead of the server's answer, the chain tells its owner (the session ends), and no
    later call is forwarded."""
    g = GroupCommitChain(audit_chain.session_chain("sess_eio2", GENESIS), flush_delay=3600)
    told: list[AuditError] = []
    g.on_failure = told.append
    bridge, to_server, to_client, forwarded = _echo_bridge("sess_eio2", g)
    g.append("session.start", {})
    sync = BlockingSync(fail=True)
    monkeypatch.setattr("linpodx.mcp.auditlog.os.fsync", sync)
    reader = _feed(bridge.on_client_frame, CALL)
    assert forwarded.wait(10)
    answering = _feed(bridge.on_server_frame, ANSWER)
    sync.release.set()
    answering.join(10)
    reader.join(10)
    assert len(told) == 1 and "fsync failed" in told[0].message
    [got] = to_client
    assert got["id"] == 7 and "result" not in got and "result withheld" in got["error"]["message"]
    later = {**CALL, "id": 8}
    _feed(bridge.on_client_frame, later).join(10)
    assert [m["id"] for m in to_server] == [7]  # nothing more forwarded
    assert to_client[-1]["id"] == 8 and to_client[-1]["result"]["isError"] is True
    bridge.drain()
    g.close()
    # What the failed fsync covered is cut off: the log still verifies.
    assert audit_chain.verify_file(g.path, GENESIS).ok


def test_an_answer_waits_for_its_own_calls_record_not_for_later_ones(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Call 7's record is on disk; call 8's fsync is still running when 7's answer comes:
    the answer goes out at once (waiting for every later decision's fsync cost one fsync per
    answer with many calls in flight)."""
    g = GroupCommitChain(audit_chain.session_chain("sess_own", GENESIS), flush_delay=3600)
    bridge, to_server, to_client, _forwarded = _echo_bridge("sess_own", g)
    g.append("session.start", {})
    _feed(bridge.on_client_frame, CALL).join(10)  # forwarded, its record fsync'd
    sync = BlockingSync()
    monkeypatch.setattr("linpodx.mcp.auditlog.os.fsync", sync)
    later = _feed(bridge.on_client_frame, {**CALL, "id": 8})
    assert sync.started.wait(10) and [m["id"] for m in to_server] == [7, 8]
    _feed(bridge.on_server_frame, ANSWER).join(10)
    assert [m["id"] for m in to_client] == [7], "7's answer waited for 8's fsync"
    assert not sync.release.is_set()
    sync.release.set()
    later.join(10)
    _feed(bridge.on_server_frame, {**ANSWER, "id": 8}).join(10)
    assert [m["id"] for m in to_client] == [7, 8]
    bridge.drain()
    g.close()
