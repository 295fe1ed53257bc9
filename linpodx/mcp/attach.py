"""`linpodx mcp attach`: one MCP session between the host's stdio and a server in a container.

This module owns the session's one long-running child, `podman exec -i CONTAINER CMD…`: it has
to live exactly as long as the session and stream both directions, which the run-to-completion
`proc.run` cannot do, so it is started here with `proc.popen` (argv list, no shell) and
nowhere else.
"""

from __future__ import annotations

import collections
import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from linpodx import ids, proc
from linpodx.errors import (
    EXIT_BUG,
    EXIT_FAILURE,
    EXIT_INTERRUPTED,
    InvalidInput,
    LinpodxError,
    UsageError,
)
from linpodx.mcp import bounds, reap
from linpodx.mcp.auditlog import GroupCommitChain
from linpodx.mcp.bridge import Bridge
from linpodx.mcp.framing import Frame, FrameReader
from linpodx.output import safe_lines

SERVER_EXIT_GRACE = 5.0
"""Seconds the server gets to exit after its stdin closes before it is terminated."""
EXIT_TERMINATED = 143
"""128 + SIGTERM (also for SIGHUP): how a shell reports a process ended by SIGTERM."""
INTERNAL_ERROR = "internal error"
"""How a session-ending bug in a reader thread starts its reason (exit status EXIT_BUG)."""
AUDIT_FAILED = "the session's audit log could not be made durable (fsync failed)"
"""The reason of a session ended by a failed fsync of its log (exit status EXIT_FAILURE)."""


@dataclass(frozen=True)
class Target:
    """The container a session attaches to, and the profile revision it was started with."""

    name: str
    container_id: str
    profile_id: str


def find_container(name: str) -> Target:
    """Look the container up; it must be a running linpodx container with a profile label."""
    from linpodx import containers
    from linpodx.podman import engine

    # The name checked (one podman could read as an option is refused), no rollback under way
    # or left half done, linpodx's own, its name and not an id; a did-you-mean if not found.
    info = containers.managed_info(name)
    labels = engine.labels_of(info)
    profile_id = labels.get("linpodx.profile_id", "")
    if not (ids.is_id(profile_id, "prof") or profile_id == "builtin"):
        raise InvalidInput(
            f"container {name} has no valid linpodx.profile_id label",
            "recreate it with `linpodx run`",
        )
    state = engine.state(info)
    if state == "paused":  # a snapshot job freezes it for a moment; `podman exec` would fail
        raise InvalidInput(
            f"container {name} is paused",
            "attach again when the snapshot job that paused it is done (`linpodx snapshot "
            f"job-status`), or run `podman unpause {name}`",
        )
    if state != "running":
        raise InvalidInput(
            f"container {name} is not running", f"start it with `linpodx start {name}`"
        )
    return Target(name=name, container_id=str(info.get("Id", "")), profile_id=profile_id)


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        n = os.write(fd, view)
        view = view[n:]


def attach(
    container: str,
    command: Sequence[str],
    *,
    stdin_fd: int = 0,
    stdout_fd: int = 1,
    log: Callable[[str], None] | None = None,
) -> int:
    """Run one bridged session; returns linpodx's exit code (the server's when it ended it)."""
    if not command:
        raise UsageError(
            "no server command given", "usage: linpodx mcp attach --container NAME -- CMD…"
        )

    def say(message: str) -> None:
        # What is said quotes error messages, which can quote podman, a container or the
        # event stream: never raw on the terminal.
        message = safe_lines(message)
        if log is not None:
            log(message)
            return
        try:
            sys.stderr.write(message + "\n")
            sys.stderr.flush()
        except (OSError, ValueError):
            # stderr closed (an MCP client that closed its pipe): what is said is lost, and
            # must not end a reader thread or skip the session's closing record.
            pass

    # The signal's number is also written to a pipe by the C-level handler, the moment the
    # signal is delivered: the Python handler runs later, in the main thread, and by then a
    # reader thread may have told of the end the signal caused (see Ending.settle).
    wake_r, wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
    ending = Ending(wake_r)
    old_wakeup = signal.set_wakeup_fd(wake_w, warn_on_full_buffer=False)
    # Caught from the start: a signal that comes once the session is open (even before its
    # reader threads run) must still end it with its closing record, and one that comes
    # before ends it the moment it is open.
    old = {
        s: signal.signal(s, lambda signum, _frame: ending.signalled(signum))
        for s in ENDING_SIGNALS
    }
    try:
        return _session(container, command, stdin_fd, stdout_fd, say, ending)
    finally:
        for s, h in old.items():
            signal.signal(s, h)
        signal.set_wakeup_fd(old_wakeup)
        os.close(wake_r)
        os.close(wake_w)


ENDING_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


class Ending:
    """Why the session ends: the first reason given wins (but a signal wins over a peer's end,
    see `settle`), and `done` is set by it.

    Given from the reader threads, the bridge (a bound hit) and the signal handlers alike.
    `wakeup_fd` is the read end of the signal wakeup pipe (see `settle`), or None.
    """

    def __init__(self, wakeup_fd: int | None = None) -> None:
        self.done = threading.Event()
        self._wakeup_fd = wakeup_fd
        # (reason, signal name, a bug?, a peer's end?); list.append is atomic, so the first
        # stays first.
        self._given: list[tuple[str, str | None, bool, bool]] = []

    def finish(self, reason: str) -> None:
        self._end(reason, None, False)

    def peer_ended(self, reason: str) -> None:
        """The client closed its input or the server its output."""
        self._end(reason, None, False, peer=True)

    def signalled(self, signum: int) -> None:
        name = signal.Signals(signum).name
        self._end(f"signal {name}", name, False)

    def broke(self, side: str, exc: Exception) -> None:
        """A bug in the reader of `side`: the session ends (exit status EXIT_BUG)."""
        self._end(f"{INTERNAL_ERROR} reading the {side}: {type(exc).__name__}: {exc}", None, True)

    def settle(self) -> None:
        """Fix the reason once the main thread has seen `done`: a signal delivered by then wins
        over a peer's end. Ctrl-C reaches the whole process group, `podman exec` with it; its
        end can be read (and given as "server exited") before the Python handler of the
        signal runs, so the signal is read from the wakeup pipe, where the C handler wrote it
        when it was delivered (to this thread, before it could run this)."""
        if self._wakeup_fd is not None:
            try:
                data = os.read(self._wakeup_fd, 64)
            except (BlockingIOError, InterruptedError):
                data = b""
            for signum in data:
                if signum in ENDING_SIGNALS:
                    self.signalled(signum)
        first = self._given[0]
        if first[3]:
            signalled = next((g for g in self._given if g[1] is not None), None)
            if signalled is not None:
                self._given.insert(0, signalled)

    def _end(self, reason: str, signal_name: str | None, bug: bool, peer: bool = False) -> None:
        self._given.append((reason, signal_name, bug, peer))
        self.done.set()


    @property
    def reason(self) -> str:
        return self._given[0][0]

    @property
    def signal_name(self) -> str | None:
        """The signal that ended the session, None if it ended otherwise."""
        return self._given[0][1]

    @property
    def bug(self) -> bool:
        return self._given[0][2]

    def signal_exit(self) -> int:
        """The exit status for a session a signal ended (Ctrl-C: 130, else 143)."""
        return EXIT_INTERRUPTED if self.signal_name == "SIGINT" else EXIT_TERMINATED


def _session(
    container: str,
    command: Sequence[str],
    stdin_fd: int,
    stdout_fd: int,
    say: Callable[[str], None],
    ending: Ending,
) -> int:
    """`attach` once its signal handlers are in place (they end `ending`)."""
    from linpodx.audit import chain as audit_chain

    target, stored = _target_and_profile(container)
    profile = stored.profile
    if ending.done.is_set():  # a signal before the session was opened: it is not opened at all
        raise LinpodxError("interrupted", exit_code=ending.signal_exit())
    session_id = ids.new_id("sess")
    # The session's first record is written before anything runs: no record, no session.
    chain, _first = audit_chain.open_session(
        session_id,
        stored.profile_id,
        stored.audit_hash,
        data={
            "container": target.name,
            "container_id": target.container_id,
            "command": list(command),
            "revision": stored.revision,
            "rules": len(profile.mcp_policy),
        },
    )
    # There was room for the session's first records: put back the space kept for the records
    # of the safe direction (its closing record among them) if a full disk had taken it.
    audit_chain.keep_reserve()
    say(f"mcp_session_id: {session_id}")
    say("bridge: host stdio <-> container stdio")
    say(f"policy: {len(profile.mcp_policy)} rules loaded")
    try:
        child = _start_server(target, session_id, command)
    except OSError as exc:
        _close(chain, audit_chain, session_id, "podman exec failed to start", None, {})
        raise LinpodxError(f"could not run podman exec: {exc}", "is podman installed?") from None
    server = ServerInput(child, say)

    # One open file and group commit for the session's records (see mcp.auditlog).
    group = GroupCommitChain(chain)
    # A failed fsync: what it covered may be lost, so nothing more is forwarded or answered
    # (the chain refuses every record) and the session ends, closed.
    group.on_failure = lambda _exc: ending.finish(AUDIT_FAILED)
    bridge = Bridge(
        profile=profile,
        session_id=session_id,
        chain=group,
        to_client=lambda data: _write_all(stdout_fd, data),
        to_server=server.write,
        answer_server=server.answer,
        log=say,
        pipeline=True,
        on_bound=ending.finish,
    )
    # Started once the bridge exists (it records what the bound holds back); until then the
    # pipe holds what the server writes.
    assert child.stderr is not None and child.stdout is not None  # noqa: S101 - PIPE
    stderr_relay = _thread(
        "stderr",
        lambda: _relay_stderr(
            child.stderr.fileno(),  # type: ignore[union-attr]
            say,
            profile.mcp.stderr_bytes_per_second,
            bridge,
        ),
    )
    max_line = profile.mcp.max_line_bytes
    server_out = child.stdout.fileno()
    _thread(
        "client",
        lambda: _pump(
            stdin_fd, max_line, bridge.on_client_frame, ending, "client closed its input", "client"
        ),
    )
    server_reader = _thread(
        "server",
        lambda: _pump(
            server_out, max_line, bridge.on_server_frame, ending, "server exited", "server"
        ),
    )
    code: int | None = None
    closed = False
    try:
        while not ending.done.wait(0.2):
            pass
        ending.settle()
        code, killed = _wind_down(
            bridge, server, ending.reason, server_reader, stderr_relay, target, session_id, say
        )
        exit_code = _exit_code(ending, bridge, code, say, group.failure)
        summary = bridge.summary()
        summary["server_killed"] = killed  # processes linpodx had to kill (None: could not)
        if group.failure is not None:
            summary["audit_failure"] = group.failure.message
        # A chain that failed refuses every record: the closing one goes in through the plain
        # chain (it reads the file's real tail, cut back to what was known durable), if it can.
        _close(group, audit_chain, session_id, ending.reason, code, summary,
               fallback=chain if group.failure is not None else None)
        closed = True  # (_close says itself when it could not record)
    finally:
        # Whatever happened above: every record written (deferred outcomes too) is made durable
        # before the bridge exits, and a failure to do so is said.
        group.close()
        if group.failure is not None and not closed:
            say(f"error: {group.failure.message}")
            if group.failure.hint:
                say(f"hint: {group.failure.hint}")
    shown = "unknown" if code is None else code
    say(f"bridge: session {session_id} ended ({ending.reason}; server exit {shown})")
    return exit_code


def _target_and_profile(container: str) -> tuple[Target, Any]:
    """The running container and the profile revision it was started with (`builtin` is the
    default profile)."""
    from linpodx import containers

    target = find_container(container)
    return target, containers.profile_by_id(target.profile_id)


def _start_server(
    target: Target, session_id: str, command: Sequence[str]
) -> subprocess.Popen[bytes]:
    """`podman exec -i` of the server's command, its stdio in pipes; OSError if it cannot start.

    By the id that was inspected: the container whose labels and revision were checked is the
    one the server runs in, even if the name changed hands since. The mark lets linpodx find
    the server in the container if it has to end it (`reap`). stderr comes through linpodx
    too: the server's (and podman's) words reach the person's terminal escaped, never as
    escape sequences a server chose.
    """
    from linpodx.podman import engine

    mark = f"{reap.ENV}={session_id}"
    argv = engine.exec_argv(target.container_id, command, True, False, env=(mark,))
    return proc.popen(
        argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, bufsize=0
    )


class ServerInput:
    """The server's stdin: writes from the bridge, answers to the server's own requests queued
    (see `answer`), and one close that cannot hang on a server that stopped reading."""

    def __init__(self, child: subprocess.Popen[bytes], say: Callable[[str], None]) -> None:
        assert child.stdin is not None  # noqa: S101 - PIPE above
        self.child = child
        self.say = say
        self.fd = child.stdin.fileno()
        self.closed = threading.Event()
        self.lock = threading.Lock()
        self.forced = threading.Event()
        """linpodx ended podman exec to close the server's input."""
        self._answers: collections.deque[bytes] = collections.deque()
        self._queued = 0
        self.answers_dropped = 0
        self._cv = threading.Condition()
        self._writer: threading.Thread | None = None
        self._writing = False

    def answer(self, data: bytes) -> None:
        """Queue an answer to one of the server's requests (a refusal, a denial); a thread of
        its own writes the queue. Never waits: the thread that reads the server's output calls
        this, and podman exec's relay (conmon, one thread for both directions) stops taking the
        server's input while its output is not read. A reader blocked writing an answer thus
        stopped the output that would have let the write go on (seen with a server's ping
        flood: the session hung). Past ANSWERS_MAX_BYTES queued (a server that sends requests
        and reads nothing) an answer is dropped and counted; the refusal it carried stays
        recorded."""
        with self._cv:
            if self.closed.is_set():
                return
            if self._queued + len(data) > ANSWERS_MAX_BYTES:
                self.answers_dropped += 1
                return
            self._answers.append(data)
            self._queued += len(data)
            if self._writer is None:
                self._writer = _thread("server-answers", self._write_answers)
            self._cv.notify()

    def _write_answers(self) -> None:
        while True:
            with self._cv:
                while not self._answers and not self.closed.is_set():
                    self._cv.wait()
                if not self._answers:
                    return
                data = self._answers.popleft()
                self._queued -= len(data)
                self._writing = True
            try:
                self.write(data)
            except OSError:
                return  # the input is closed: what is left is never read
            finally:
                with self._cv:
                    self._writing = False
                    self._cv.notify_all()

    def write(self, data: bytes) -> None:
        with self.lock:
            if self.closed.is_set():
                raise OSError("server input already closed")
            _write_all(self.fd, data)

    def close(self) -> None:
        with self._cv:
            # The answers queued so far go first (a server that reads gets them all), for at
            # most SERVER_INPUT_WAIT: one that does not read is handled below.
            deadline = time.monotonic() + SERVER_INPUT_WAIT
            while (self._answers or self._writing) and time.monotonic() < deadline:
                self._cv.wait(max(0.0, deadline - time.monotonic()))
            self.closed.set()  # no write starts from now on
            self._cv.notify_all()
        if self.answers_dropped:
            self.say(
                f"bridge: {self.answers_dropped} answers to the server's requests were dropped "
                "(it sent requests faster than it read their answers)"
            )
        if not self.lock.acquire(timeout=SERVER_INPUT_WAIT):
            # A write is blocked: the server stopped reading its input. Waiting for it would
            # hang the session's end (and a SIGTERM with it); end podman exec instead, which
            # closes the pipe's other end and fails that write.
            self.say("bridge: the server is not reading its input; ending its podman exec")
            self.forced.set()
            with contextlib.suppress(OSError):
                self.child.terminate()
            if not self.lock.acquire(timeout=SERVER_INPUT_WAIT):
                with contextlib.suppress(OSError):
                    self.child.kill()
                if not self.lock.acquire(timeout=SERVER_INPUT_WAIT):
                    return  # (podman exec is gone; the session ends without waiting more)
        try:
            with contextlib.suppress(OSError):
                self.child.stdin.close()  # type: ignore[union-attr]
        finally:
            self.lock.release()


def _thread(name: str, target: Callable[[], None]) -> threading.Thread:
    t = threading.Thread(target=target, name=name, daemon=True)
    t.start()
    return t


def _pump(
    fd: int,
    max_line: int,
    on_frame: Callable[[Frame, bool], None],
    ending: Ending,
    at_eof: str,
    side: str,
) -> None:
    """Hand the frames read from `fd` to the bridge until EOF, then end the session."""
    # An unexpected exception here is a bug; it must end the session (every pending call
    # denied, the log closed) rather than leave this direction dead and the session hanging.
    try:
        reader = FrameReader(fd, max_line)
        while (frame := reader.read_frame()) is not None:
            on_frame(frame, reader.has_more())
    except Exception as exc:
        ending.broke(side, exc)
        return
    ending.peer_ended(at_eof)


def _wind_down(
    bridge: Bridge,
    server: ServerInput,
    reason: str,
    server_reader: threading.Thread,
    stderr_relay: threading.Thread,
    target: Target,
    session_id: str,
    say: Callable[[str], None],
) -> tuple[int | None, int | None]:
    """End the session in order; (the server's exit status, None if unknown; the processes
    killed in the container, None if that could not be done)."""
    # No request the client sends from now on is acted on (nor recorded): nothing may
    # follow the session's closing record.
    bridge.fence("client")
    # Pending approvals are denied first: nothing waits for a person past the session.
    bridge.shutdown(reason)
    bridge.settle_client()
    server.close()
    status, ended = _wait_child(server.child, SERVER_EXIT_GRACE)
    ended = ended or server.forced.is_set()
    code: int | None = status
    server_reader.join(2.0)  # let the last server messages through
    stderr_relay.join(2.0)
    bridge.fence("server")
    bridge.flush_summaries()
    bridge.drain()
    # The end of `podman exec` is not the end of the server: podman gives up the moment
    # it is told to (then its exit status says nothing of the server's), a Ctrl-C ends it
    # and not the server, and a server's children may outlive it. Whatever carries the
    # session's mark in the container is ended now (`reap`).
    killed = _end_server(target.container_id, session_id, say)
    if ended:
        how = (
            f"linpodx killed {killed} of its processes in the container"
            if killed is not None
            else "it may still run in the container"
        )
        say(
            f"bridge: the server did not exit within {SERVER_EXIT_GRACE:g} s of its input "
            f"closing; its podman exec was ended and {how}"
        )
        code = None
    elif killed:
        say(f"bridge: linpodx killed {killed} processes the server left in the container")
    return code, killed


def _exit_code(
    ending: Ending,
    bridge: Bridge,
    code: int | None,
    say: Callable[[str], None],
    failure: LinpodxError | None = None,
) -> int:
    """linpodx's exit status for a session that ended as `ending` says, saying why on stderr
    where that is an error; otherwise the server's."""
    reason = ending.reason
    if ending.signal_name is not None:
        return ending.signal_exit()
    if reason == AUDIT_FAILED:
        say(f"error: the session ended: {reason}: {failure.message if failure else ''}")
        say(
            "hint: nothing was forwarded or answered after the failure; check the disk under "
            "the state dir (dmesg, df -h) before starting another session"
        )
        return EXIT_FAILURE
    if bridge.bound_hit is not None and reason == bridge.bound_hit:
        say(f"error: the session ended: {reason}")
        say(
            "hint: a session that writes this much is refused from here on; raise "
            "mcp.audit_max_bytes in the profile if this one was legitimate"
        )
        return EXIT_FAILURE
    if ending.bug:
        say(f"error: {reason}")
        say("hint: this is a bug in linpodx; the session was ended and is in the audit log")
        return EXIT_BUG
    if code is None:
        return EXIT_FAILURE
    return code if code >= 0 else 128 - code


STDERR_LINE_MAX = 4096
"""Bytes of one line of the server's stderr that are shown (the rest is dropped, said)."""


def _relay_stderr(
    fd: int, say: Callable[[str], None], per_second: int, bridge: Bridge | None = None
) -> None:
    """Pass the server's stderr on line by line through `say` (escaped), at most `per_second`
    bytes a second (`mcp.stderr_bytes_per_second`): a server that floods its stderr must not
    flood the person's terminal or the MCP client's log (75 MB in 20 s). What is held back is
    counted, said and recorded once per second. Reads to the end whatever happens, so the
    server never blocks on a full stderr pipe."""
    window = bounds.Window(per_second, time.monotonic)

    def held_back(summary: bounds.Summary) -> None:
        with contextlib.suppress(Exception):  # (a closed stderr: `say` already swallows it)
            say(
                f"bridge: {summary.count} lines ({summary.amount} bytes) of the server's "
                f"stderr not shown (over mcp.stderr_bytes_per_second = {per_second})"
            )
        if bridge is not None:
            bridge.record_notice(
                "mcp.stderr_suppressed",
                {"lines": summary.count, "bytes": summary.amount, "limit": per_second},
            )

    def emit(line: bytes) -> None:
        admitted, ended = window.admit("stderr", min(len(line), STDERR_LINE_MAX) + 1)
        if ended is not None:
            held_back(ended)
        if admitted:
            _say_line(line, say)

    buf = b""
    while True:
        try:
            chunk = os.read(fd, 65536)
        except OSError:
            break
        if not chunk:
            break
        buf += chunk
        *lines, buf = buf.split(b"\n")
        if len(buf) > STDERR_LINE_MAX:
            lines.append(buf)
            buf = b""
        for line in lines:
            emit(line)
    if buf:
        emit(buf)
    last = window.take()
    if last is not None:
        held_back(last)


def _say_line(line: bytes, say: Callable[[str], None]) -> None:
    text = line[:STDERR_LINE_MAX].decode("utf-8", "replace")
    if len(line) > STDERR_LINE_MAX:
        text += f"…(+{len(line) - STDERR_LINE_MAX} bytes)"
    with contextlib.suppress(Exception):  # (a closed stderr: `say` already swallows it)
        say(text)


SERVER_INPUT_WAIT = 2.0
ANSWERS_MAX_BYTES = 8 << 20
"""Answers to the server's requests `ServerInput` holds before it drops new ones."""
"""Seconds the session's end waits for a write to the server's input to finish."""


def _end_server(container_id: str, session_id: str, say: Callable[[str], None]) -> int | None:
    """Kill what the server left running in the container (`reap`); how many processes, or
    None (said on stderr) if that could not be done."""
    try:
        return reap.end_left_behind(container_id, session_id)
    except LinpodxError as exc:
        say(f"bridge: could not end the server in the container: {exc.message}")
        return None


def _wait_child(child: subprocess.Popen[bytes], grace: float) -> tuple[int, bool]:
    """The child's exit status, and whether linpodx had to end it (after `grace` seconds)."""
    try:
        return child.wait(grace), False
    except subprocess.TimeoutExpired:
        child.terminate()
    try:
        return child.wait(grace), True
    except subprocess.TimeoutExpired:
        child.kill()
        return child.wait(), True


def _close(
    chain: Any,
    audit_chain: Any,
    session_id: str,
    reason: str,
    code: int | None,
    summary: dict[str, Any],
    fallback: Any = None,
) -> None:
    """Closing record in the session chain, then its anchor in the admin chain. The end of a
    session is the safe direction: on a full state dir both go in the space kept for it
    (`audit.chain.in_reserve`), and if even that is gone the session still ends, said on
    stderr. `fallback`: the chain to write the closing record to if `chain` refuses it."""
    data = {"reason": reason, "server_exit": code, **summary}

    def closing() -> Any:
        try:
            return chain.append("session.close", data)
        except LinpodxError:
            if fallback is None:
                raise
            return fallback.append("session.close", data)

    in_reserve = getattr(audit_chain, "in_reserve", None)
    went_ahead = "the session ended"
    try:
        if in_reserve is None:
            rec, warning = closing(), None
        else:
            rec, warning = in_reserve(closing, "session.close", went_ahead)
        anchor = getattr(audit_chain, "anchor_session", None)
        if rec is not None and anchor is not None:
            if in_reserve is None:
                anchor(session_id, rec.hash, rec.seq + 1)
            else:
                _, later = in_reserve(
                    lambda: anchor(session_id, rec.hash, rec.seq + 1), "session.close anchor",
                    went_ahead,
                )
                warning = warning or later
        if warning is not None:
            sys.stderr.write(safe_lines(warning) + "\n")
    except LinpodxError as exc:
        sys.stderr.write(
            safe_lines(
                f"error: could not close the session's audit chain: {exc.message}\n"
                f"hint: {exc.hint + '; ' if exc.hint else ''}the session's log then has no "
                f"closing record (`linpodx audit verify --session {session_id}` says so)"
            )
            + "\n"
        )
    time.sleep(0)
