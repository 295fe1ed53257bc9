"""`mcp attach` end to end without podman: a local responder stands in for `podman exec -i`."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import threading
from typing import Any

import pytest

from linpodx.audit import chain as audit_chain
from linpodx.mcp import attach as attach_mod
from linpodx.mcp.bridge import Bridge

RESPONDER = """
import json, sys
for line in sys.stdin:
    msg = json.loads(line)
    sys.stdout.write(json.dumps({"jsonrpc": "2.0", "id": msg["id"], "result": {}}) + "\\n")
    sys.stdout.flush()
"""


def fake_podman(monkeypatch: pytest.MonkeyPatch) -> None:
    """The container is found and `podman exec -i` runs RESPONDER on this host instead."""
    real_popen = subprocess.Popen

    def responder(_argv: list[str], **kw: Any) -> Any:
        return real_popen([sys.executable, "-c", RESPONDER], **kw)

    monkeypatch.setattr(
        attach_mod, "find_container", lambda name: attach_mod.Target(name, "0" * 64, "builtin")
    )
    monkeypatch.setattr(attach_mod.subprocess, "Popen", responder)
    monkeypatch.setattr(attach_mod.reap, "end_left_behind", lambda _cid, _sid: 0)


def run(lines: bytes, said: list[str] | None = None) -> tuple[list[dict[str, Any]], list[str]]:
    """attach() with `lines` then EOF on its stdin; (what it wrote to stdout, what it said:
    also appended to `said` as it goes)."""
    in_r, in_w = os.pipe()
    out_r, out_w = os.pipe()
    os.write(in_w, lines)
    os.close(in_w)
    said = [] if said is None else said
    try:
        attach_mod.attach("c", ["server"], stdin_fd=in_r, stdout_fd=out_w, log=said.append)
    finally:
        os.close(in_r)
        os.close(out_w)
        with os.fdopen(out_r, "rb") as out:
            got = [json.loads(line) for line in out]
    return got, said


def test_request_just_before_eof_is_still_forwarded(monkeypatch: pytest.MonkeyPatch) -> None:
    """The request and the EOF arrive together: it is forwarded before the server's input is
    closed, and its answer reaches the client."""
    fake_podman(monkeypatch)
    got, _said = run(b'{"jsonrpc":"2.0","id":1,"method":"ping"}\n')
    assert got == [{"jsonrpc": "2.0", "id": 1, "result": {}}]


class Syncs:
    """Stands in for os.fsync and remembers the file size each call covered."""

    def __init__(self) -> None:
        self.sizes: list[int] = []
        self.real = os.fsync

    def __call__(self, fd: int) -> None:
        self.real(fd)
        self.sizes.append(os.fstat(fd).st_size)


def test_deferred_outcome_is_durable_when_attach_fails_late(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """An error after the last answer (here in drain) skips the closing record, yet the
    answer's deferred outcome record is fsync'd before attach() gives up."""
    fake_podman(monkeypatch)

    def boom(_self: Bridge, _timeout: float = 10.0) -> None:
        raise RuntimeError("boom")

    monkeypatch.setattr(Bridge, "drain", boom)
    monkeypatch.setattr("linpodx.mcp.auditlog.FLUSH_DELAY", 3600.0)  # only an exit path syncs
    syncs = Syncs()
    monkeypatch.setattr("linpodx.mcp.auditlog.os.fsync", syncs)
    said: list[str] = []
    with pytest.raises(RuntimeError, match="boom"):
        run(b'{"jsonrpc":"2.0","id":1,"method":"ping"}\n', said)
    sid = next(m.split(": ", 1)[1] for m in said if m.startswith("mcp_session_id: "))
    path = audit_chain.session_path(sid)
    types = [r.type for r in audit_chain.read_records(path)]
    assert types[-2:] == ["mcp.request", "mcp.response"]
    assert syncs.sizes[-1] == path.stat().st_size


def test_a_bug_in_a_reader_ends_the_session_instead_of_hanging(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """An unexpected exception while handling a client message: the session ends at once
    (exit status 70, said on stderr, closed in the audit log), it does not hang."""
    fake_podman(monkeypatch)

    def broken(_self: Bridge, _frame: Any, _more: bool) -> None:
        raise KeyError("oops")

    monkeypatch.setattr(Bridge, "on_client_frame", broken)
    in_r, in_w = os.pipe()  # stays open: only the bug can end this session
    out_r, out_w = os.pipe()
    os.write(in_w, b'{"jsonrpc":"2.0","id":1,"method":"ping"}\n')
    said: list[str] = []
    try:
        code = attach_mod.attach("c", ["server"], stdin_fd=in_r, stdout_fd=out_w, log=said.append)
    finally:
        for fd in (in_r, in_w, out_r, out_w):
            os.close(fd)
    assert code == 70
    assert any(m.startswith("error: internal error reading the client: KeyError") for m in said)
    sid = next(m.split(": ", 1)[1] for m in said if m.startswith("mcp_session_id: "))
    types = [r.type for r in audit_chain.read_records(audit_chain.session_path(sid))]
    assert types[-1] == "session.close"


def _session_under(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Any, lines: bytes
) -> tuple[int, list[dict[str, Any]]]:
    """attach() under an applied profile with `mcp.record_arguments: true`, `lines` then EOF on
    its stdin (fed from a thread: they may be larger than a pipe holds); (its exit status,
    what it wrote to its stdout). Diagnostics go to sys.stderr, as for a person."""
    import threading

    from linpodx.profile import store

    f = tmp_path / "rec.yml"
    f.write_text("name: rec\nmcp: {record_arguments: true}\n", encoding="utf-8")
    pid = store.apply(f).profile_id
    fake_podman(monkeypatch)
    monkeypatch.setattr(
        attach_mod, "find_container", lambda name: attach_mod.Target(name, "0" * 64, pid)
    )
    in_r, in_w = os.pipe()
    out_r, out_w = os.pipe()

    def feed() -> None:
        with os.fdopen(in_w, "wb") as w:
            w.write(lines)

    feeder = threading.Thread(target=feed, daemon=True)
    feeder.start()
    try:
        code = attach_mod.attach("c", ["server"], stdin_fd=in_r, stdout_fd=out_w)
    finally:
        feeder.join(60)
        os.close(in_r)
        os.close(out_w)
        with os.fdopen(out_r, "rb") as out:
            got = [json.loads(line) for line in out]
    return code, got


def _call(i: int, arguments: dict[str, Any]) -> bytes:
    msg = {"jsonrpc": "2.0", "id": i, "method": "tools/call",
           "params": {"name": "t", "arguments": arguments}}  # fmt: skip
    return json.dumps(msg).encode() + b"\n"


PING = b'{"jsonrpc":"2.0","id":1,"method":"ping"}\n'


@pytest.mark.parametrize("after_ping", [False, True], ids=["first record", "later record"])
@pytest.mark.parametrize("kind", ["event type", "float", "too large"])
def test_an_unrecordable_call_is_said_on_stderr_with_a_hint(
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    tmp_path: Any,
    kind: str,
    after_ping: bool,
) -> None:
    """A call whose record cannot be written is denied to the client, and the person running
    the bridge reads why and what to do (`error:`, `hint:`) on stderr; stdout carries only
    protocol messages."""
    import re

    from linpodx.audit import core as audit_core
    from linpodx.audit.core import MAX_LINE

    if kind == "event type":
        # Only linpodx's own constants are event types: make `mcp.request` one the chain refuses.
        refuse = re.compile(r"^(?!mcp\.request$)[a-z][a-z0-9_]*(?:\.[a-z][a-z0-9_]*)+$")
        monkeypatch.setattr(audit_core, "TYPE_RE", refuse)
        bad = _call(2, {"path": "/etc"})
        message, advice = "invalid event type 'mcp.request'", "this is a bug in linpodx"
    elif kind == "float":
        bad = _call(2, {"temperature": 0.5})
        message, advice = "the event data cannot be recorded", "set record_arguments to false"
    else:
        bad = _call(2, {"text": "a" * MAX_LINE})
        message, advice = f"record larger than {MAX_LINE} bytes", "set record_arguments to false"
    code, got = _session_under(monkeypatch, tmp_path, (PING if after_ping else b"") + bad)
    out, err = capsys.readouterr()
    assert out == ""
    assert all(m.get("jsonrpc") == "2.0" for m in got), got
    denied = [m for m in got if m.get("id") == 2]
    assert len(denied) == 1 and "could not record" in json.dumps(denied[0])
    lines = err.splitlines()
    [i] = [n for n, line in enumerate(lines) if line.startswith("error: ") and message in line]
    assert lines[i + 1].startswith("hint: ") and advice in lines[i + 1], lines
    assert "Traceback" not in err and code == 0


def test_a_session_close_that_cannot_be_recorded_says_what_to_do(
    capsys: pytest.CaptureFixture[str],
) -> None:
    from linpodx.errors import AuditError

    class Full:
        def append(self, type: str, data: Any) -> Any:
            raise AuditError("could not record to the audit log x: No space left", "check df -h")

    attach_mod._close(Full(), audit_chain, "sess_x", "client closed its input", 0, {})
    out, err = capsys.readouterr()
    assert out == ""
    assert err.splitlines() == [
        "error: could not close the session's audit chain: could not record to the audit log x: "
        "No space left",
        "hint: check df -h; the session's log then has no closing record "
        "(`linpodx audit verify --session sess_x` says so)",
    ]


REAL_END_LEFT_BEHIND = attach_mod.reap.end_left_behind


def _attach_with(
    monkeypatch: pytest.MonkeyPatch, server: str, feed: Any, before_exec: Any = None
) -> tuple[int | None, list[str], list[list[str]]]:
    """attach() with `server` (Python source) standing in for `podman exec -i`, and `feed`
    writing to its stdin from a thread (it gets the write end and must close it, or not);
    (exit status, what it said, the argv given to podman)."""
    import threading

    real_popen = subprocess.Popen
    argvs: list[list[str]] = []

    def popen(argv: list[str], **kw: Any) -> Any:
        argvs.append(list(argv))
        if before_exec is not None:
            before_exec()
        return real_popen([sys.executable, "-c", server], **kw)

    monkeypatch.setattr(
        attach_mod, "find_container", lambda name: attach_mod.Target(name, "c0ffee" * 10, "builtin")
    )
    monkeypatch.setattr(attach_mod.subprocess, "Popen", popen)
    if attach_mod.reap.end_left_behind is REAL_END_LEFT_BEHIND:  # (unless the test set one)
        monkeypatch.setattr(attach_mod.reap, "end_left_behind", lambda _cid, _sid: 0)
    in_r, in_w = os.pipe()
    out_r, out_w = os.pipe()
    def drain_all() -> None:
        while os.read(out_r, 1 << 20):
            pass

    drain = threading.Thread(target=drain_all, daemon=True)
    drain.start()
    feeder = threading.Thread(target=feed, args=(in_w,), daemon=True)
    feeder.start()
    said: list[str] = []
    code: int | None = None
    try:
        code = attach_mod.attach("c", ["server"], stdin_fd=in_r, stdout_fd=out_w, log=said.append)
    finally:
        os.close(in_r)
        os.close(out_w)
        feeder.join(10)
        drain.join(10)
        os.close(out_r)
    return code, said, argvs


def _session_records(said: list[str]) -> list[Any]:
    sid = next(m.split(": ", 1)[1] for m in said if m.startswith("mcp_session_id: "))
    return audit_chain.read_records(audit_chain.session_path(sid))


def test_a_client_still_sending_when_the_session_ends_leaves_no_record_after_its_close(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The server exits while the client floods requests: nothing is recorded after
    `session.close` (before, `audit verify --session` then reported the chain broken)."""
    from linpodx.integrity import verify_session

    server = "import sys; sys.stdin.readline(); sys.exit(7)"

    def flood(fd: int) -> None:
        try:
            while True:
                os.write(fd, PING * 50)
        except OSError:
            pass
        finally:
            os.close(fd)

    for _ in range(3):
        code, said, _ = _attach_with(monkeypatch, server, flood)
        assert code == 7
        records = _session_records(said)
        assert records[-1].type == "session.close"
        assert verify_session(records[0].data["session_id"]).ok


@pytest.mark.parametrize("reaped", [2, None])
def test_a_server_that_does_not_exit_is_reported_as_ended_not_as_exit_0(
    monkeypatch: pytest.MonkeyPatch, reaped: int | None
) -> None:
    """Its podman exec is ended, then what it left in the container is killed by its mark
    (here a stand-in for `reap.end_left_behind`); both outcomes are said and recorded."""
    from linpodx.errors import EngineError

    asked: list[tuple[str, str]] = []

    def end_left_behind(container_id: str, session_id: str) -> int:
        asked.append((container_id, session_id))
        if reaped is None:
            raise EngineError("podman unshare failed")
        return reaped

    monkeypatch.setattr(attach_mod.reap, "end_left_behind", end_left_behind)
    monkeypatch.setattr(attach_mod, "SERVER_EXIT_GRACE", 0.3)
    server = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(30)"
    code, said, argvs = _attach_with(monkeypatch, server, os.close)
    assert code == 1
    close = _session_records(said)[-1]
    sid = next(m.split(": ", 1)[1] for m in said if m.startswith("mcp_session_id: "))
    assert asked == [("c0ffee" * 10, sid)]
    # The server was started with the session's mark, which is how it is found again.
    assert argvs[0][1:4] == ["exec", "--interactive", f"--env=LINPODX_MCP_SESSION={sid}"]
    assert close.type == "session.close" and close.data["server_exit"] is None
    assert close.data["server_killed"] == reaped
    ended = [m for m in said if "did not exit within 0.3 s of its input closing" in m]
    assert len(ended) == 1
    if reaped is None:
        assert "it may still run in the container" in ended[0]
        assert any("could not end the server in the container: podman unshare failed" in m
                   for m in said)
    else:
        assert "linpodx killed 2 of its processes in the container" in ended[0]


@pytest.mark.parametrize("left", [0, 3])
def test_what_a_server_that_exited_left_behind_is_ended_too(
    monkeypatch: pytest.MonkeyPatch, left: int
) -> None:
    """The server exited (or only its podman exec did, as on Ctrl-C): the container is still
    searched for the session's processes; none found is the usual case and is not said."""
    asked: list[str] = []

    def end_left_behind(container_id: str, session_id: str) -> int:
        asked.append(session_id)
        return left

    monkeypatch.setattr(attach_mod.reap, "end_left_behind", end_left_behind)
    code, said, _ = _attach_with(monkeypatch, "import sys; sys.stdin.read(); sys.exit(4)", os.close)
    assert code == 4 and len(asked) == 1
    close = _session_records(said)[-1]
    assert close.data["server_exit"] == 4 and close.data["server_killed"] == left
    note = [m for m in said if "processes the server left in the container" in m]
    assert note == ([f"bridge: linpodx killed {left} processes the server left in the container"]
                    if left else [])


def test_a_signal_right_after_the_session_opened_still_closes_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """SIGTERM as the server is being started (the session is open, its readers not yet):
    the session ends with its closing record and exit status 143."""
    import signal

    code, said, argvs = _attach_with(
        monkeypatch, RESPONDER, os.close, before_exec=lambda: os.kill(os.getpid(), signal.SIGTERM)
    )
    assert code == 143
    close = _session_records(said)[-1]
    assert close.type == "session.close" and close.data["reason"] == "signal SIGTERM"
    sid = next(m.split(": ", 1)[1] for m in said if m.startswith("mcp_session_id: "))
    mark = f"LINPODX_MCP_SESSION={sid}"
    # By the inspected id, marked with the session (see linpodx.mcp.reap).
    assert [a[1:] for a in argvs] == [["exec", "--interactive", f"--env={mark}", "c0ffee" * 10,
                                       "server"]]  # fmt: skip


@pytest.mark.parametrize("name", ["--latest", "-l", "a b"])
def test_a_container_name_podman_could_read_as_an_option_is_refused(name: str) -> None:
    from linpodx.errors import InvalidInput

    with pytest.raises(InvalidInput, match="invalid container name"):
        attach_mod.find_container(name)


class _Child:
    """What `ServerInput` uses of a `podman exec` Popen: its stdin, and the two stops."""

    def __init__(self, stdin: Any) -> None:
        self.stdin = stdin
        self.stopped: list[str] = []

    def terminate(self) -> None:
        self.stopped.append("terminate")

    def kill(self) -> None:
        self.stopped.append("kill")


def test_answers_to_the_server_never_wait_on_its_input_and_go_first_at_close() -> None:
    """The reader of the server's output queues its answers (a ping flood's refusals): with the
    server's input full it must go on reading, or podman exec's relay, which carries both
    directions, stalls the session. At close the queued answers are written first."""
    r, w = os.pipe()
    os.set_blocking(w, False)
    with contextlib.suppress(BlockingIOError):
        while True:
            os.write(w, b"\n" * 4096)  # the pipe is full: a blocking write would wait
    os.set_blocking(w, True)
    server = attach_mod.ServerInput(_Child(os.fdopen(w, "wb")), lambda _m: None)  # type: ignore[arg-type]
    done = threading.Event()

    def flood() -> None:
        for i in range(1000):
            server.answer(b'{"jsonrpc":"2.0","id":%d,"error":{}}\n' % i)
        done.set()

    t = threading.Thread(target=flood, daemon=True)
    t.start()
    assert done.wait(10), "answer() waited on a full pipe"
    # The server reads again: everything queued arrives, in order, before the input closes.
    got = bytearray()
    reader = threading.Thread(target=lambda: got.extend(_read_all(r)), daemon=True)
    reader.start()
    server.close()
    reader.join(10)
    lines = bytes(got).split(b"\n")
    answers = [x for x in lines if x.startswith(b'{"jsonrpc"')]
    assert len(answers) == 1000 and answers[0].endswith(b'"id":0,"error":{}}'), len(answers)
    assert server.answers_dropped == 0


def _read_all(fd: int) -> bytes:
    out = bytearray()
    while chunk := os.read(fd, 65536):
        out.extend(chunk)
    os.close(fd)
    return bytes(out)


def test_a_failed_fsync_ends_the_session_closed_and_says_so(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The first fsync of a call's record fails (once, as Linux reports a writeback error):
    the client gets an error instead of the answer, the session ends by itself with exit
    status 1, `error:` and `hint:` on stderr, and `session.close` still goes in (through
    the plain chain, onto what was known durable), naming the failure."""
    fake_podman(monkeypatch)
    real = os.fsync
    failed: list[int] = []

    def fsync(fd: int) -> None:
        path = os.readlink(f"/proc/self/fd/{fd}")
        if not failed and "/sessions/" in path and b'"mcp.request"' in open(path, "rb").read():
            failed.append(fd)
            raise OSError(5, "Input/output error")
        real(fd)

    monkeypatch.setattr("linpodx.mcp.auditlog.os.fsync", fsync)
    in_r, in_w = os.pipe()
    out_r, out_w = os.pipe()
    os.write(in_w, b'{"jsonrpc":"2.0","id":1,"method":"ping"}\n')  # stdin stays open
    said: list[str] = []
    try:
        code = attach_mod.attach("c", ["server"], stdin_fd=in_r, stdout_fd=out_w, log=said.append)
    finally:
        for fd in (in_r, in_w, out_w):
            os.close(fd)
        with os.fdopen(out_r, "rb") as out:
            got = [json.loads(line) for line in out]
    assert failed, "the fsync of the call's record never ran"
    assert code == 1
    assert [m["id"] for m in got] == [1] and "result" not in got[0], got
    assert "result withheld" in got[0]["error"]["message"]
    text = "\n".join(said)
    assert "error: the session ended: the session's audit log could not be made durable" in text
    assert "\nhint: " in text and "Traceback" not in capsys.readouterr().err
    records = _session_records(said)
    assert records[-1].type == "session.close"
    assert "fsync failed" in records[-1].data["audit_failure"]
    assert "mcp.request" not in [r.type for r in records]  # cut off: not known durable


class _Inspected:
    """A podman whose one container is linpodx's, in `status`."""

    def __init__(self, status: str) -> None:
        self.status = status

    def inspect(self, name: str) -> dict[str, Any]:
        labels = {"linpodx.managed": "1", "linpodx.profile_id": "builtin"}
        return {"Name": name, "Id": "c0ffee" * 10, "Config": {"Labels": labels},
                "State": {"Status": self.status, "Running": self.status != "exited"}}  # fmt: skip


@pytest.mark.parametrize(
    ("status", "said"),
    [("paused", "container agent-1 is paused"), ("exited", "container agent-1 is not running")],
)
def test_attach_to_a_container_that_cannot_take_an_exec_says_why(status: str, said: str) -> None:
    """A paused container (a snapshot job freezes it) reads as running to podman's `Running`;
    `podman exec` then fails after the session was opened."""
    from linpodx.containers import runner
    from linpodx.errors import InvalidInput

    with runner.use(_Inspected(status)), pytest.raises(InvalidInput) as ei:  # type: ignore[arg-type]
        attach_mod.find_container("agent-1")
    assert ei.value.message == said


def test_attach_finds_a_running_container_of_linpodx() -> None:
    from linpodx.containers import runner

    with runner.use(_Inspected("running")):  # type: ignore[arg-type]
        assert attach_mod.find_container("agent-1") == attach_mod.Target(
            "agent-1", "c0ffee" * 10, "builtin"
        )


def test_a_signal_wins_over_the_end_it_caused_even_before_its_handler_ran() -> None:
    """Ctrl-C reaches podman exec too: its end ("server exited") can be given before the
    Python handler of the SIGINT runs. The C handler has written the signal to the wakeup
    pipe by then, and `settle` makes it the reason (exit 130, as the person asked)."""
    import signal

    r, w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
    ending = attach_mod.Ending(r)
    # A handler that does nothing stands for one that has not run yet.
    old_handler = signal.signal(signal.SIGINT, lambda *_: None)
    old_wakeup = signal.set_wakeup_fd(w, warn_on_full_buffer=False)
    try:
        os.kill(os.getpid(), signal.SIGINT)
        ending.peer_ended("server exited")
        assert ending.reason == "server exited"  # what the reader thread gave first
        ending.settle()
    finally:
        signal.set_wakeup_fd(old_wakeup)
        signal.signal(signal.SIGINT, old_handler)
        os.close(r)
        os.close(w)
    assert ending.reason == "signal SIGINT" and ending.signal_exit() == 130


def test_a_signal_does_not_hide_an_end_that_is_not_a_peers() -> None:
    """Only a peer's end gives way: an audit failure or a bound stays the reason (with its
    error and status) when a signal comes after it; a peer's end with no signal stays too."""
    failed = attach_mod.Ending()
    failed.finish(attach_mod.AUDIT_FAILED)
    failed.signalled(2)
    failed.settle()
    assert failed.reason == attach_mod.AUDIT_FAILED and failed.signal_name is None
    quiet = attach_mod.Ending()
    quiet.peer_ended("client closed its input")
    quiet.settle()
    assert quiet.reason == "client closed its input" and quiet.signal_name is None
    late = attach_mod.Ending()
    late.peer_ended("server exited")
    late.signalled(15)
    late.settle()
    assert late.reason == "signal SIGTERM" and late.signal_exit() == 143
