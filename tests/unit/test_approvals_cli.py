"""`linpodx events`, `approve`, `deny`: rendering, filters, --since, and the decision commands."""

from __future__ import annotations

import json
import unicodedata
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from linpodx import events
from linpodx.approvals import store
from linpodx.approvals.prompter import Prompter
from linpodx.audit.core import MAX_LINE
from linpodx.cli import approvals as cli_approvals
from linpodx.errors import EXIT_CONFLICT, UsageError
from linpodx.events import reader as event_reader
from linpodx.paths import events_file, state_dir

REQ = {
    "jsonrpc": "2.0",
    "id": 1,
    "method": "tools/call",
    "params": {"name": "write_file", "arguments": {"path": "a", "content": "b"}},
}


def state_line() -> str:
    """What `events`, `approve` and `deny` say first on stderr."""
    return f"state dir: {state_dir()}\n"


def pending(timeout: float = 30) -> store.PendingRequest:
    return store.create(
        "sess_01KB0000000000000000000000", "tools/call", "write_file", REQ, REQ["params"], timeout
    )


def test_parse_since() -> None:
    now = datetime(2026, 11, 30, 5, 0, tzinfo=UTC)
    assert cli_approvals.parse_since("10m", now) == now - timedelta(minutes=10)
    assert cli_approvals.parse_since("2h", now) == now - timedelta(hours=2)
    assert cli_approvals.parse_since("2026-11-30T04:00:00Z") == datetime(
        2026, 11, 30, 4, tzinfo=UTC
    )
    with pytest.raises(UsageError):
        cli_approvals.parse_since("yesterday")


def test_filter_matches_first_component_or_exact_type() -> None:
    ev = {"type": "approval.pending"}
    assert cli_approvals.matches(ev, [])
    assert cli_approvals.matches(ev, ["approval"])
    assert cli_approvals.matches(ev, ["approval.pending"])
    assert not cli_approvals.matches(ev, ["approv"])
    assert not cli_approvals.matches(ev, ["mcp"])
    assert cli_approvals.matches(ev, ["mcp", "approval"])


def test_render_pending_like_the_walkthrough_and_escaped() -> None:
    ev: dict[str, Any] = {
        "ts": "2026-11-30T04:32:19.123456Z",
        "type": "approval.pending",
        "session": "sess_01KB0000000000000000000000",
        "approval_id": "apr_X",
        "method": "tools/call",
        "tool": "write\x1b[2Jfile",
        "payload": '{"content":"\x1b]0;owned\x07 y\ny"}',
    }
    lines = cli_approvals.render(ev)
    assert lines[0].endswith(
        "sess_01KB0000000000000000000000 tools/call write\\x1b[2Jfile → PROMPT"
    )
    assert lines[0].startswith("[") and lines[0][9] == "]"
    assert lines[1].startswith("payload: {") and "\x1b" not in lines[1] and "\n" not in lines[1]
    assert "\\x07" in lines[1] and "\\x0a" in lines[1]


def test_render_dns_denial_as_one_sentence_escaped() -> None:
    ev = {
        "ts": "2026-11-30T05:00:00.000000Z",
        "type": "dns.denied",
        "container": "agent-1",
        "name": "github.qkg1.top",
        "qtype": "A",
        "reason": "not in the allowlist",
        "message": "dns lookup denied for github.qkg1.top",
    }
    (line,) = cli_approvals.render(ev)
    expected = "] agent-1 dns lookup denied for github.qkg1.top (A, not in the allowlist)"
    assert line.endswith(expected)
    (hostile,) = cli_approvals.render({"type": "dns.denied", "message": "x\x1b]0;t\x07"})
    assert "\x1b" not in hostile and "\x07" not in hostile


def test_render_egress_denial_names_its_reason_once() -> None:
    reason = "server name not in the allowlist; address resolved for allowed.test"
    ev = {
        "type": "egress.denied",
        "container": "agent-1",
        "target": "evil.test:443",
        "address": "192.0.2.10",
        "reason": reason,
        "message": f"egress denied: evil.test:443 to 192.0.2.10 ({reason})",
    }
    (line,) = cli_approvals.render(ev)
    assert line.endswith(f"] agent-1 egress denied: evil.test:443 to 192.0.2.10 ({reason})")
    assert line.count(reason) == 1


def test_render_caps_payload() -> None:
    lines = cli_approvals.render({"type": "approval.pending", "payload": "x" * 50_000})
    assert len(lines[1]) < cli_approvals.PAYLOAD_CAP + 100


def test_events_no_follow_json_and_filter(cli: Any) -> None:
    events.emit("container.start", name="c1")
    events.emit("approval.pending", session="s", approval_id="apr_1", method="tools/call")
    events.emit("mcp.decision", session="s", method="tools/call", tool="t", decision="deny")
    res = cli("events", "--no-follow", "--json", "--filter", "approval", "--filter", "mcp")
    assert res.exit_code == 0
    types = [json.loads(x)["type"] for x in res.stdout.splitlines()]
    assert types == ["approval.pending", "mcp.decision"]
    res = cli("events", "--no-follow")
    assert "container.start" in res.stdout and "tools/call t → DENY" in res.stdout


def test_events_since_filters_old_events(cli: Any) -> None:
    path = events_file()
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as f:
        f.write(json.dumps({"ts": "2020-01-01T00:00:00.000000Z", "type": "old.event"}) + "\n")
        f.write("not json at all\n")
    events.emit("new.event")
    res = cli("events", "--no-follow", "--since", "1h")
    assert "new.event" in res.stdout and "old.event" not in res.stdout


@pytest.mark.parametrize("since", ["", " ", "yesterday"])
def test_events_refuses_an_empty_or_bad_since(cli: Any, since: str) -> None:
    """`--since ""` once meant "no --since" while `--since " "` was refused."""
    events.emit("old.event")
    res = cli("events", "--no-follow", "--since", since)
    assert res.exit_code == 2 and res.stdout == ""
    assert f"error: invalid --since value: {since!r}" in res.stderr
    assert "hint: use an ISO time like 2026-11-30T04:00:00Z or a duration like 10m" in res.stderr


def write_lines(*lines: str) -> None:
    path = events_file()
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as f:
        f.writelines(line + "\n" for line in lines)


def test_a_time_without_zone_or_out_of_range_is_no_time(cli: Any) -> None:
    """Such a `ts` once ended the listener with "internal error" (TypeError comparing it with
    --since, OverflowError converting it): it is treated like a `ts` that does not parse."""
    write_lines(
        '{"ts":"2999-01-01T00:00:00","type":"naive.time"}',
        '{"ts":"0001-01-01T00:00:00+14:00","type":"early.time"}',
        '{"ts":"9999-12-31T23:59:59-14:00","type":"late.time"}',
    )
    events.emit("good.event")
    res = cli("events", "--no-follow", "--since", "1h")
    assert res.exit_code == 0, res.stderr
    assert res.stdout.count("\n") == 1 and "good.event" in res.stdout
    res = cli("events", "--no-follow")
    assert res.exit_code == 0, res.stderr
    shown = res.stdout.splitlines()
    assert [line.split()[1] for line in shown] == [
        "naive.time", "early.time", "late.time", "good.event"
    ]  # fmt: skip
    assert all(line.startswith("[??:??:??] ") for line in shown[:3])


def test_a_time_the_local_zone_cannot_show_is_no_clock() -> None:
    import os
    import time

    old = os.environ.get("TZ")
    os.environ["TZ"] = "JST-9"  # 9 hours east of UTC: 9999-12-31T23:00Z is past year 9999 there
    time.tzset()
    try:
        (line,) = cli_approvals.render({"ts": "9999-12-31T23:00:00Z", "type": "x.y"})
    finally:
        if old is None:
            del os.environ["TZ"]
        else:
            os.environ["TZ"] = old
        time.tzset()
    assert line.startswith("[??:??:??] x.y")


def test_damaged_lines_are_skipped_and_json_output_stays_json(cli: Any) -> None:
    """Deep nesting once ended the listener with RecursionError, and NaN or 1e999 came out of
    `--json` as NaN/Infinity, which is not JSON."""
    write_lines(
        "[" * 100_000 + "]" * 100_000,
        '{"ts":"2026-01-01T00:00:00Z","type":"x.nan","a":NaN}',
        '{"ts":"2026-01-01T00:00:00Z","type":"x.inf","a":1e999}',
        '{"ts":"2026-01-01T00:00:00Z","type":"x.neg","a":-Infinity}',
        '{"ts":"2026-01-01T00:00:00Z","type":"x.dup","type":"approval.pending"}',
        '{"ts":"2026-01-01T00:00:00Z","type":"x.float","a":1.5}',
    )
    events.emit("good.event")

    def no_constant(name: str) -> Any:
        raise AssertionError(f"{name} printed")

    for args in (("--json",), ()):
        res = cli("events", "--no-follow", *args)
        assert res.exit_code == 0, res.stderr
        assert res.stderr == state_line()  # the state dir named, the damage not
        if args:
            shown = [json.loads(x, parse_constant=no_constant) for x in res.stdout.splitlines()]
            assert [e["type"] for e in shown] == ["x.float", "good.event"]
            assert shown[0]["a"] == 1.5
        else:
            assert [x.split()[1] for x in res.stdout.splitlines()] == ["x.float", "good.event"]


def test_event_file_keeps_partial_lines() -> None:
    path = events_file()
    path.parent.mkdir(parents=True, exist_ok=True)
    reader = event_reader.EventFile()
    path.write_bytes(b'{"type":"a.b","ts":"x"}\n{"type":"c.')
    assert [e["type"] for e in reader.read_new()] == ["a.b"]
    with open(path, "ab") as f:
        f.write(b'd"}\n')
    assert [e["type"] for e in reader.read_new()] == ["c.d"]


def big_event(n: int) -> bytes:
    """A valid event line (without newline) of about `n` bytes."""
    return json.dumps({"type": "big.event", "pad": "x" * n}).encode()


def test_a_line_longer_than_any_event_is_skipped_to_its_newline(cli: Any) -> None:
    path = events_file()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(big_event(MAX_LINE + 1) + b"\n" + big_event(MAX_LINE - 100) + b"\n")
    events.emit("good.event")
    res = cli("events", "--no-follow", "--json")
    assert res.exit_code == 0, res.stderr
    assert [json.loads(x)["type"] for x in res.stdout.splitlines()] == ["big.event", "good.event"]
    assert len(res.stdout) < MAX_LINE + 1000  # the longer one was skipped


def peak_bytes(fn: Any) -> int:
    """Most memory (bytes) Python held at once while `fn` ran."""
    import tracemalloc

    tracemalloc.start()
    try:
        fn()
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def test_a_large_file_is_read_in_bounded_memory() -> None:
    """A 251 MB events.jsonl once took ~546 MB: it was read whole, then split."""
    path = events_file()
    path.parent.mkdir(parents=True, exist_ok=True)
    line = big_event(100_000) + b"\n"
    with open(path, "wb") as f:
        for _ in range(320):  # 32 MB
            f.write(line)
    reader = event_reader.EventFile()
    count = 0

    def read_all() -> None:
        nonlocal count
        for _event in reader.read_new():
            count += 1

    assert peak_bytes(read_all) < 8 * 1024 * 1024
    assert count == 320


def test_an_endless_line_is_skipped_in_bounded_memory_while_following() -> None:
    """A follower once kept an unterminated line in memory however long it grew."""
    path = events_file()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"")
    reader = event_reader.EventFile()
    got: list[str] = []

    def poll() -> None:
        got.extend(e["type"] for e in reader.read_new())

    with open(path, "ab") as f:
        f.write(b'{"type":"endless","pad":"')
        for _ in range(32):  # 32 MB, polled after each MB as a follower would
            f.write(b"x" * 1024 * 1024)
            f.flush()
            assert peak_bytes(poll) < 8 * 1024 * 1024
        f.write(b'"}\n')
    events.emit("good.event")
    poll()
    assert got == ["good.event"]


@pytest.mark.usefixtures("watchdog")
def test_a_fifo_in_place_of_the_stream_is_refused_not_waited_on(cli: Any) -> None:
    import os

    path = events_file()
    path.parent.mkdir(parents=True, exist_ok=True)
    os.mkfifo(path, 0o600)
    res = cli("events", "--no-follow")
    assert res.exit_code == 1 and res.stdout == ""
    assert f"error: cannot follow the event stream: {path} is not a regular file" in res.stderr
    assert "hint: linpodx writes events.jsonl as a regular file" in res.stderr


def test_a_follower_reads_a_truncated_or_replaced_file_from_its_start() -> None:
    """A follower once kept its byte offset into the old file and showed nothing more."""
    import os

    for i in range(50):
        events.emit("old.event", message=f"padding padding padding {i}")
    path = events_file()
    reader = event_reader.EventFile()
    reader.skip_to_end()
    events.emit("before.truncate")
    assert [e["type"] for e in reader.read_new()] == ["before.truncate"]

    path.write_bytes(b"")  # truncated in place
    for i in range(3):
        events.emit("after.truncate", n=i)
    assert [e.get("n") for e in reader.read_new()] == [0, 1, 2]

    new = path.with_name("events.jsonl.new")  # replaced by a longer file
    new.write_text("".join(json.dumps({"type": "replaced", "n": i}) + "\n" for i in range(80)))
    os.replace(new, path)
    assert [e.get("n") for e in reader.read_new()] == list(range(80))

    path.unlink()  # removed, then written again
    assert list(reader.read_new()) == []
    events.emit("recreated")
    assert [e["type"] for e in reader.read_new()] == ["recreated"]
    events.emit("appended")
    assert [e["type"] for e in reader.read_new()] == ["appended"]


def interrupted_after_one_event(monkeypatch: pytest.MonkeyPatch) -> None:
    """Make the reader see one event, then Ctrl-C."""

    def read_new(_self: object) -> Iterator[dict[str, Any]]:
        yield {"ts": "2026-01-01T00:00:00Z", "type": "first.event"}
        raise KeyboardInterrupt

    monkeypatch.setattr(event_reader.EventFile, "read_new", read_new)


def test_ctrl_c_cuts_a_listing_short_with_an_error(
    cli: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`events --no-follow` once exited 0 after Ctrl-C, its partial output looking complete."""
    interrupted_after_one_event(monkeypatch)
    res = cli("events", "--no-follow")
    assert res.exit_code == 130
    assert res.stderr == state_line() + "error: interrupted\n"
    assert "first.event" in res.stdout


def test_ctrl_c_stops_a_follower_quietly(cli: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    interrupted_after_one_event(monkeypatch)
    res = cli("events")
    assert res.exit_code == 0 and res.stderr == state_line()
    assert "first.event" in res.stdout


def test_approve_and_deny_commands(cli: Any) -> None:
    p = pending()
    ok = cli("approve", "--non-interactive", p.approval_id)
    assert ok.exit_code == 0
    assert f"approval_id: {p.approval_id}" in ok.stdout and "decision: approved" in ok.stdout
    again = cli("deny", "--non-interactive", p.approval_id)
    assert again.exit_code == EXIT_CONFLICT and "already approved" in again.stderr
    p2 = pending()
    no = cli("deny", "--non-interactive", p2.approval_id, "--json")
    assert no.exit_code == 0 and json.loads(no.stdout)["result"]["decision"] == "denied"
    missing = cli("approve", "--non-interactive", "apr_01KB0000000000000000000000")
    assert missing.exit_code == 4 and "approval not found" in missing.stderr
    bad = cli("approve", "--non-interactive", "../../etc/passwd")
    assert bad.exit_code == 2 and "not an approval id" in bad.stderr


def test_approve_after_the_window_is_refused(cli: Any) -> None:
    p = pending(timeout=0.01)
    import time

    time.sleep(0.05)
    res = cli("approve", "--non-interactive", p.approval_id)
    assert res.exit_code == EXIT_CONFLICT and "already expired" in res.stderr
    assert store.read_answer(p.approval_id) is None


def test_events_without_a_terminal_only_prints(cli: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    p = pending()
    events.emit(
        "approval.pending",
        session=p.session,
        approval_id=p.approval_id,
        method="tools/call",
        tool="write_file",
        payload=p.payload,
    )
    res = cli("events", "--filter", "approval", "--no-follow")
    assert "→ PROMPT" in res.stdout and "approve?" not in res.stdout
    assert store.status(p.approval_id) == "pending"


def test_emit_many_writes_what_emit_would(cli: Any) -> None:
    events.emit_many(
        [
            (
                "mcp.decision",
                {"session": "s", "method": "tools/call", "tool": "a", "decision": "auto_allow"},
            ),
            (
                "mcp.decision",
                {"session": "s", "method": "tools/call", "tool": "b", "decision": "deny"},
            ),
        ]
    )
    events.emit("mcp.decision", session="s", method="tools/call", tool="c", decision="prompt")
    lines = [json.loads(x) for x in events_file().read_text().splitlines()]
    assert [(e["type"], e["tool"]) for e in lines] == [
        ("mcp.decision", "a"),
        ("mcp.decision", "b"),
        ("mcp.decision", "c"),
    ]
    assert all(set(e) == {"ts", "type", "session", "method", "tool", "decision"} for e in lines)
    assert events.emit_many([]) == []


@pytest.mark.parametrize("reader", [False, True])
def test_emitting_into_a_fifo_or_a_link_fails_at_once_without_writing_through(
    tmp_path: Any, reader: bool
) -> None:
    """Every command that emits an event would hang on a FIFO in the stream's place (no
    reader) or write into whatever reads it; a link would take the lines elsewhere."""
    import os
    import threading

    path = events_file()
    path.parent.mkdir(parents=True, exist_ok=True)
    os.mkfifo(path, 0o600)
    got: list[bytes] = []
    if reader:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    done = threading.Event()

    def emit() -> None:
        try:
            events.emit("x.y")
        except OSError as exc:
            got.append(str(exc).encode())
        done.set()

    threading.Thread(target=emit, daemon=True).start()
    assert done.wait(5), "emit blocked on a FIFO"
    assert got, "emit wrote into a FIFO"
    if reader:
        assert os.read(fd, 100) == b""
        os.close(fd)
    path.unlink()
    elsewhere = tmp_path / "elsewhere"
    elsewhere.write_bytes(b"")
    path.symlink_to(elsewhere)
    with pytest.raises(OSError):
        events.emit_many([("x.y", {})])
    assert elsewhere.read_bytes() == b""


HOSTILE_ID = "\x1b]0;PWNED\x07\x1b[2J"


def test_the_prompter_never_prints_a_hostile_approval_id_raw() -> None:
    """An `approval.pending` event whose id holds escape sequences: the prompter says the
    approval is not found, with the id escaped (it used to print the store's message raw)."""
    import io

    out = io.StringIO()
    prompter = Prompter(io.StringIO(), out, cli_approvals.render)
    event = {"type": "approval.pending", "session": "s", "approval_id": HOSTILE_ID}
    cli_approvals._show(event, out, False, prompter)
    text = out.getvalue()
    assert "approval not found" in text
    assert "\x1b" not in text and "\x07" not in text
    assert "\\x1b]0;PWNED\\x07" in text


@pytest.mark.parametrize("call", [store.load, store.status, store.read_answer])
def test_store_messages_quote_an_untrusted_id_escaped(call: Any) -> None:
    """The message is safe where it is built, whoever prints it (`--json`, the prompter…)."""
    with pytest.raises(store.NotFound) as exc:
        call(HOSTILE_ID + "x" * 500)
    assert "\x1b" not in exc.value.message and "\x07" not in exc.value.message
    assert len(exc.value.message) < 200


def test_approve_json_with_a_hostile_id_is_escaped(cli: Any) -> None:
    res = cli("approve", "--non-interactive", HOSTILE_ID, "--json")
    assert res.exit_code == 2
    doc = json.loads(res.stdout)
    assert "\x1b" not in doc["error"]["message"]
    assert "\x1b" not in res.stderr


def test_an_unknown_filter_is_refused_with_the_valid_types(cli: Any) -> None:
    """`--filter aproval` matched nothing and turned the approval prompter off, silently."""
    res = cli("events", "--filter", "aproval", "--no-follow")
    assert res.exit_code == 2 and "unknown event type for --filter: aproval" in res.stderr
    assert (
        "hint: use one of: approval, approval.decided, approval.granted, approval.pending,"
        in res.stderr
    )
    res = cli("events", "--filter", "aproval", "--no-follow", "--json")
    doc = json.loads(res.stdout)
    assert res.exit_code == 2 and "approval.pending" in doc["error"]["hint"]
    for ok in ("approval", "approval.pending", "dns", "dns.denied", "container.start"):
        assert cli("events", "--filter", ok, "--no-follow").exit_code == 0, ok


def test_every_event_type_linpodx_emits_is_a_valid_filter() -> None:
    """`events.EVENT_TYPES` is what --filter accepts: a type emitted but missing there could
    not be filtered. Every literal type passed to an emitter in linpodx/ must be in it."""
    import re
    from pathlib import Path

    import linpodx

    emitted: set[str] = set()
    call = re.compile(r"\b(?:emit|_emit|_event|emit_many)\(\s*\"([a-z]+\.[a-z_.]+)\"")
    pair = re.compile(r"\(\s*\"(dns\.[a-z_]+|mcp\.decision)\",")
    for path in Path(linpodx.__file__).parent.rglob("*.py"):
        text = path.read_text()
        emitted.update(call.findall(text))
        emitted.update(pair.findall(text))
    assert {"approval.pending", "approval.decided", "dns.denied", "mcp.decision"} <= emitted
    assert emitted <= set(events.EVENT_TYPES), emitted - set(events.EVENT_TYPES)


# fullwidth 5, fullwidth 0, Arabic-Indic 3: `\d` matches each, int() reads each.
@pytest.mark.parametrize("since", ["\uff15m", "1\uff10s", "\u0663h"])
def test_since_takes_ascii_digits_only(since: str) -> None:
    with pytest.raises(UsageError):
        cli_approvals.parse_since(since)


def test_an_anchor_takes_ascii_digits_only() -> None:
    from linpodx.audit.verify import parse_anchor

    assert parse_anchor("0:" + "a" * 64) == (0, "a" * 64)
    with pytest.raises(UsageError):
        parse_anchor("\uff10:" + "a" * 64)  # fullwidth 0


def test_an_open_prompt_ends_when_another_listener_answers() -> None:
    """Two listeners: the first answers `y`; the second's prompt stayed open until the window
    ended and then said "expired (denied after the window)" about an approved call. It now
    ends as soon as the request is decided elsewhere, and says how it was decided."""
    import io
    import os
    import threading
    import time

    p = pending(timeout=30)
    r, w = os.pipe()  # a terminal nobody types into
    out = io.StringIO()
    prompter = Prompter(os.fdopen(r, "r"), out, cli_approvals.render)
    threading.Timer(0.3, store.answer, (p.approval_id, p.digest, store.APPROVE)).start()
    began = time.monotonic()
    prompter.ask(p.approval_id)
    os.close(w)
    text = out.getvalue()
    assert "already decided (approved)" in text and "expired" not in text
    assert time.monotonic() - began < 10  # long before the 30 s window (not a timing target)


def test_a_request_gone_while_its_prompt_is_open_does_not_end_the_listener() -> None:
    """The open prompt polls the request's status; a request removed or damaged meanwhile is
    no longer pending, and must not raise out of the listener."""
    assert Prompter._status("apr_01KB0000000000000000000000").startswith(
        "unreadable: "
    )


def _pending_event(tool: str, fields: list[list[Any]], more: int) -> dict[str, Any]:
    """An `approval.pending` event of a `tools/call` of `tool` as the listener reads it."""
    return {
        "ts": "2026-11-30T05:00:00.000000Z",
        "type": "approval.pending",
        "session": "sess_01KB0000000000000000000000",
        "approval_id": "apr_01KB0000000000000000000000",
        "method": "tools/call",
        "tool": tool,
        "payload": "{}",
        "fields": fields,
        "fields_more": more,
    }


def test_render_fields_one_key_a_line_escaped_with_sizes() -> None:
    ev = _pending_event("write_file", [
        ["name", '"write_file"', None],
        ["arguments.content", '"harmless harmless…', 2700],
        ["arguments.p\x1b[2Jath", '"/home/agent/.bashrc\x07"', None],
    ], 3)  # fmt: skip
    lines = cli_approvals.render(ev)
    assert lines[1:4] == [
        '  name: "write_file"',
        '  arguments.content: "harmless harmless… (2,700 chars)',
        '  arguments.p\\x1b[2Jath: "/home/agent/.bashrc\\x07"',
    ]
    assert lines[4] == "  … 3 more keys: linpodx approvals show apr_01KB0000000000000000000000"
    assert lines[5] == "approval_id: apr_01KB0000000000000000000000"


@pytest.mark.parametrize(
    "hidden",
    [
        # Tag characters: ASCII that no terminal shows ("ASCII smuggling").
        "".join(chr(0xE0000 + ord(c)) for c in "AWS=AKIA1234"),
        # Variation selectors after one character, a byte each ("emoji smuggling").
        "\U0001f600" + "".join(chr(0xE0100 + b) for b in b"key=s3cret"),
        "\U0001f600" + "\ufe00\ufe01\ufe0f\ufe00",
        # Zero-width joiners in a run: bits between two letters.
        "H\u200c\u200d\u200c\u200c\u200di",
        # Other invisible format characters.
        "\u00ad\u2061\u2062\u2063\u2064\u206a\u206f\ufff9\U0001d173",
    ],
)
def test_approver_sees_every_invisible_character_a_call_carries(hidden: str) -> None:
    """`send_message(text="Hello" + hidden)` showed as `arguments.text: "Hello"`: the person
    approved a message that carried what they never saw (a key read by the agent)."""
    fields, more = store.display_fields({"name": "send", "arguments": {"text": "Hello" + hidden}})
    ev = _pending_event("send", [f.to_list() for f in fields], more)
    shown = "\n".join(cli_approvals.render(ev))
    unseen = {c for c in hidden if unicodedata.category(c) in ("Cf", "Mn")}
    assert unseen and not unseen & set(shown), ascii(shown)


def test_approve_without_a_terminal_needs_the_flag_and_says_so(cli: Any) -> None:
    """Issue 23 #5: the MCP client's shell tool has no terminal on stdin."""
    p = pending()
    res = cli("approve", p.approval_id)
    assert res.exit_code == 2 and "needs a terminal on stdin" in res.stderr
    assert "--non-interactive" in res.stderr
    assert store.status(p.approval_id) == "pending"
    ok = cli("approve", "--non-interactive", p.approval_id, "--json")
    assert ok.exit_code == 0 and json.loads(ok.stdout)["result"]["interactive"] is False
    answer = store.read_answer(p.approval_id)
    assert answer is not None and answer.by["interactive"] is False
    assert answer.reason == "approved by a person (non-interactive)"


@pytest.mark.parametrize("command", ["approve", "deny"])
@pytest.mark.parametrize("bad", ["", " ", "apr_", "apr_01kb0000000000000000000000", "../x"])
def test_a_malformed_id_is_a_usage_error_before_the_terminal_check(
    cli: Any, command: str, bad: str
) -> None:
    """`linpodx approve ''` said it needs a terminal: fixing stdin would only lead to the
    real error. The id is checked first, whatever stdin is."""
    for extra in ([], ["--non-interactive"]):
        res = cli(command, *extra, bad)
        assert res.exit_code == 2, res.stderr
        lines = res.stderr.splitlines()
        assert lines[0].startswith("error: not an approval id") and "terminal" not in lines[0]
        assert any(line.startswith("hint: approval ids look like apr_<ULID>") for line in lines)


def test_approvals_show_prints_the_whole_request(cli: Any) -> None:
    p = pending()
    res = cli("approvals", "show", p.approval_id, "--json")
    assert res.exit_code == 0, res.stderr
    doc = json.loads(res.stdout)["result"]
    assert store.request_digest(doc["request"]) == p.digest == doc["digest"]
    text = cli("approvals", "show", p.approval_id)
    assert text.exit_code == 0 and f"digest: {p.digest}" in text.stdout
    assert "request:\n{" in text.stdout
    (store.approvals_dir() / p.approval_id / "request.raw").write_bytes(b"{}")
    bad = cli("approvals", "show", p.approval_id)
    assert bad.exit_code == 3 and "does not match the digest" in bad.stderr
