"""Approvals: files, first answer wins, digest binding, used once, timeout."""

from __future__ import annotations

import json
import threading
import time
from typing import Any

import pytest

from linpodx.approvals import store
from linpodx.errors import InvalidInput, NotFound
from tests.unit.approval_damage import DAMAGES, damage, valid_approval

REQ = {
    "jsonrpc": "2.0",
    "id": 3,
    "method": "tools/call",
    "params": {"name": "write_file", "arguments": {"path": "a", "content": "y"}},
}


def make(timeout: float = 5) -> store.PendingRequest:
    return store.create("sess_X", "tools/call", "write_file", REQ, REQ["params"], timeout)


def test_create_and_load_roundtrip() -> None:
    p = make()
    assert p.approval_id.startswith("apr_")
    assert store.load(p.approval_id) == p
    assert p.digest == store.request_digest(REQ)
    assert store.status(p.approval_id) == "pending"
    assert [x.approval_id for x in store.pending_requests()] == [p.approval_id]


def test_timeout_without_listener_denies() -> None:
    p = make(timeout=0.3)
    t0 = time.monotonic()
    out = store.wait(p, poll=0.02)
    assert not out.approved and out.reason == "timeout"
    assert time.monotonic() - t0 >= 0.25
    assert store.status(p.approval_id) == "denied"
    # A late approval cannot change it.
    assert store.answer(p.approval_id, p.digest, store.APPROVE) is False


def test_first_answer_wins() -> None:
    p = make()
    assert store.answer(p.approval_id, p.digest, store.DENY) is True
    assert store.answer(p.approval_id, p.digest, store.APPROVE) is False
    out = store.wait(p)
    assert not out.approved and store.status(p.approval_id) == "denied"


def test_concurrent_answers_exactly_one_wins() -> None:
    p = make()
    results: list[bool] = []
    lock = threading.Lock()

    def go(decision: str) -> None:
        ok = store.answer(p.approval_id, p.digest, decision)
        with lock:
            results.append(ok)

    threads = [
        threading.Thread(target=go, args=(store.APPROVE if i % 2 else store.DENY,))
        for i in range(8)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert results.count(True) == 1


def test_answer_for_another_digest_is_refused() -> None:
    p = make()
    other = store.request_digest({**REQ, "id": 4})
    assert other != p.digest
    assert store.answer(p.approval_id, other, store.APPROVE) is True  # the file is taken…
    out = store.wait(p)
    assert not out.approved and "digest" in out.reason  # …but it approves nothing


def test_answer_replayed_from_another_approval_is_refused() -> None:
    p1, p2 = make(), make()
    assert p1.digest == p2.digest  # identical requests
    assert store.answer(p1.approval_id, p1.digest, store.APPROVE)
    # Copy p1's answer file into p2's directory (a replay).
    src = store.approvals_dir() / p1.approval_id / "answer.json"
    (store.approvals_dir() / p2.approval_id / "answer.json").write_bytes(src.read_bytes())
    out = store.wait(p2)
    assert not out.approved and "another approval" in out.reason
    assert store.wait(p1).approved


def test_answer_used_once() -> None:
    p = make()
    assert store.answer(p.approval_id, p.digest, store.APPROVE)
    assert store.wait(p).approved
    again = store.wait(p)
    assert not again.approved and again.reason == "answer already used"


def test_cancelled_wait_denies_unless_already_answered() -> None:
    p = make()
    out = store.wait(p, cancelled=lambda: "session ended")
    assert not out.approved and out.reason == "session ended"
    p2 = make()
    store.answer(p2.approval_id, p2.digest, store.APPROVE)
    assert store.wait(p2, cancelled=lambda: "session ended").approved


def test_malformed_answer_reads_as_deny() -> None:
    p = make()
    (store.approvals_dir() / p.approval_id / "answer.json").write_bytes(b"{not json")
    assert not store.wait(p).approved


def test_unknown_or_bad_ids() -> None:
    with pytest.raises(NotFound):
        store.load("apr_01KB0000000000000000000000")
    with pytest.raises(NotFound):
        store.load("../../etc")


def test_payload_is_capped() -> None:
    big = {"x": "a" * 10000}
    p = store.create("sess_X", "tools/call", "w", {"id": 1, "params": big}, big, 5)
    assert len(p.payload) < store.PAYLOAD_CAP + 50


def test_meta_is_shown_and_the_whole_request_is_kept_under_its_digest() -> None:
    """Issue 23 #3: `_meta` is forwarded after an approval, so the approver sees it (payload,
    fields, and the whole request that `approvals show` prints)."""
    params = {"name": "w", "arguments": {"a": 1}, "_meta": {"progressToken": 5, "x": "M"}}
    req = {"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": params}
    p = store.create("sess_X", "tools/call", "w", req, params, 5)
    assert '"_meta":{"progressToken":5,"x":"M"}' in p.payload
    keys = [f.key for f in store.load(p.approval_id).fields]
    assert keys == ["name", "arguments.a", "_meta.progressToken", "_meta.x"]
    pending, whole = store.load_request(p.approval_id)
    assert whole == req and pending == p
    other = {**req, "params": {**params, "_meta": {"progressToken": 6}}}
    assert store.request_digest(other) != p.digest


def test_request_copy_that_does_not_match_the_digest_is_refused() -> None:
    p = make()
    (store.approvals_dir() / p.approval_id / "request.raw").write_bytes(b'{"id":3}')
    with pytest.raises(InvalidInput, match="does not match the digest"):
        store.load_request(p.approval_id)
    (store.approvals_dir() / p.approval_id / "request.raw").unlink()
    with pytest.raises(InvalidInput, match="no readable copy"):
        store.load_request(p.approval_id)


def test_padding_cannot_hide_an_argument() -> None:
    """Issue 23 #4: each value is cut on its own with its size, every key is listed."""
    params = {
        "name": "write_file",
        "arguments": {"content": "harmless " * 300, "path": "/home/agent/.bashrc"},
    }
    req = {"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": params}
    p = store.load(store.create("sess_X", "tools/call", "write_file", req, params, 5).approval_id)
    by_key = {f.key: f for f in p.fields}
    assert by_key["arguments.path"].value == '"/home/agent/.bashrc"'
    assert by_key["arguments.path"].size is None
    content = by_key["arguments.content"]
    assert content.value.startswith('"harmless harmless') and content.value.endswith("…")
    assert len(content.value) == store.VALUE_CAP + 1 and content.size == 2700


def test_arguments_a_rule_matched_on_come_first_and_many_keys_are_counted() -> None:
    args = {f"k{i:04d}": i for i in range(store.FIELDS_MAX + 10)}
    fields, more = store.display_fields({"name": "t", "arguments": {**args, "zz": 1}}, ("zz",))
    assert [f.key for f in fields[:3]] == ["name", "arguments.zz", "arguments.k0000"]
    assert len(fields) == store.FIELDS_MAX and more == 12


def _within(seconds: float, fn: Any) -> Any:
    """fn() run in a thread; fails (instead of hanging the suite) if it does not return in time."""
    box: list[Any] = []
    t = threading.Thread(target=lambda: box.append(fn()), daemon=True)
    t.start()
    t.join(seconds)
    assert box, f"no return within {seconds}s (blocked, or raised)"
    return box[0]


@pytest.mark.parametrize("how", DAMAGES)
def test_damaged_answer_denies_at_once_with_its_reason(how: str) -> None:
    p = make(timeout=30)
    damage(store.approvals_dir() / p.approval_id / "answer.json", how, valid_approval(p))
    out = _within(5, lambda: store.wait(p, poll=0.01))  # at once: it can never become valid
    assert not out.approved and out.reason.startswith("the answer file is unreadable (")
    assert how != "deep" or "nesting deeper than" in out.reason  # the parser's bound, no crash
    assert _within(5, lambda: store.status(p.approval_id)) == "denied"
    assert _within(5, store.pending_requests) == []


@pytest.mark.parametrize("how", [*DAMAGES, "stray_file"])
def test_damaged_request_is_refused_alone(how: str) -> None:
    good = make()
    bad_id = make().approval_id
    entry = store.approvals_dir() / bad_id
    if how == "stray_file":  # a file where the approval's directory belongs
        for f in entry.iterdir():
            f.unlink()
        entry.rmdir()
        entry.write_bytes(b"")
    else:
        (entry / "request.json").unlink()
        damage(entry / "request.json", how, json.dumps(good.to_dict()).encode())

    def load_bad() -> str:
        with pytest.raises(InvalidInput) as exc:
            store.load(bad_id)
        return exc.value.message

    assert f"approval request is unreadable: {bad_id} (" in _within(5, load_bad)
    assert [p.approval_id for p in _within(5, store.pending_requests)] == [good.approval_id]


def test_long_method_and_tool_are_capped_and_still_readable() -> None:
    long = "t" * (store.PAYLOAD_CAP * 10)
    p = store.create("sess_X", long, "\x1b" * (store.PAYLOAD_CAP * 10), REQ, REQ["params"], 5)
    assert len(p.method) < store.PAYLOAD_CAP + 50 and p.tool is not None
    assert len(p.tool) < store.PAYLOAD_CAP + 50
    assert store.load(p.approval_id) == p


def test_approvals_dir_that_is_a_file_is_the_state_dirs_problem() -> None:
    base = store.approvals_dir()
    base.parent.mkdir(parents=True, exist_ok=True)
    base.write_bytes(b"")
    with pytest.raises(NotADirectoryError):  # the CLI reports it as the state dir's
        store.load("apr_01M8Q50RSSHGZYNDRRHMFW6H6K")
    with pytest.raises(NotADirectoryError):
        store.read_answer("apr_01M8Q50RSSHGZYNDRRHMFW6H6K")


@pytest.mark.parametrize("value", ["nan", "inf", "1e30", True, None, float("nan")])
def test_a_request_whose_times_are_not_finite_numbers_is_damaged(value: object) -> None:
    """`float()` takes the strings "nan" and "inf": a request expiring at NaN would never
    look expired to `approve` or `status`."""
    p = make()
    path = store.approvals_dir() / p.approval_id / "request.json"
    doc = json.loads(path.read_text())
    doc["expires_unix"] = value
    path.write_text(json.dumps(doc))
    with pytest.raises(InvalidInput) as exc:
        store.load(p.approval_id)
    assert "approval request is unreadable" in exc.value.message or "malformed" in exc.value.message
