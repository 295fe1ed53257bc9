"""`reap.kill_marked` on real processes of this host's pid namespace: only the ones that
carry the session's mark are killed, their children too, and a reused pid is never hit."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from linpodx.mcp import reap

# Forks a child (which inherits the environment) and waits; both ignore SIGTERM and stdin.
SERVER = """
import os, signal, time
signal.signal(signal.SIGTERM, signal.SIG_IGN)
if os.fork() == 0:
    time.sleep(60); os._exit(0)
print("ready", flush=True)
time.sleep(60)
"""


def _start(mark: str | None) -> subprocess.Popen[str]:
    env = {k: v for k, v in os.environ.items() if k != reap.ENV}
    if mark is not None:
        env[reap.ENV] = mark
    p = subprocess.Popen(
        [sys.executable, "-c", SERVER], env=env, stdout=subprocess.PIPE, text=True
    )
    assert p.stdout is not None and p.stdout.readline() == "ready\n"
    return p


def _children(pid: int) -> list[int]:
    with open(f"/proc/{pid}/task/{pid}/children") as f:
        return [int(x) for x in f.read().split()]


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def test_only_marked_processes_and_their_children_are_killed() -> None:
    ours = _start("sess_A")
    other = _start("sess_B")
    plain = _start(None)
    kids = {p.pid: _children(p.pid) for p in (ours, other, plain)}
    try:
        killed, left = reap.kill_marked(os.getpid(), "sess_A")
        assert (killed, left) == (2, 0)
        assert ours.wait(5) == -9
        deadline = time.monotonic() + 5
        while _alive(kids[ours.pid][0]) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not _alive(kids[ours.pid][0])
        for p in (other, plain):
            assert p.poll() is None and all(_alive(k) for k in kids[p.pid])
        # A prefix of the mark is not the mark.
        assert reap.kill_marked(os.getpid(), "sess_") == (0, 0)
        assert other.poll() is None
    finally:
        for p in (ours, other, plain):
            for k in kids[p.pid]:
                try:
                    os.kill(k, 9)
                except ProcessLookupError:
                    pass
            p.kill()
            p.wait()


def test_another_pid_namespace_is_left_alone(monkeypatch: pytest.MonkeyPatch) -> None:
    """A marked process outside the container's pid namespace is never touched."""
    p = _start("sess_C")
    try:
        real = reap._pid_ns
        monkeypatch.setattr(reap, "_pid_ns", lambda pid: "pid:[0]" if pid == 1 else real(pid))
        assert reap.kill_marked(1, "sess_C") == (0, 0)
        assert p.poll() is None
    finally:
        p.kill()
        p.wait()


def test_a_pid_reused_between_scan_and_signal_is_not_hit(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The scan found a marked pid; by the time it is opened the process there is another one
    (stood in for by checking the mark again through the pidfd's pid and failing)."""
    p = _start("sess_D")
    kid = _children(p.pid)[0]
    seen: list[int] = []
    real = reap._carries

    def carries(pid: int, ns: str, mark: bytes) -> bool:
        seen.append(pid)
        # Scan says yes; the check made through the pidfd sees "another process".
        return real(pid, ns, mark) and seen.count(pid) == 1

    monkeypatch.setattr(reap, "_carries", carries)
    monkeypatch.setattr(reap, "ROUNDS", 1)
    try:
        killed, _left = reap.kill_marked(os.getpid(), "sess_D")
        assert killed == 0
        assert p.poll() is None and _alive(kid)
    finally:
        os.kill(kid, 9)
        p.kill()
        p.wait()


def test_main_prints_two_counts(capsys: pytest.CaptureFixture[str]) -> None:
    p = _start("sess_E")
    try:
        assert reap.main([str(os.getpid()), "sess_E"]) == 0
        assert capsys.readouterr().out == "2 0\n"
        assert p.wait(5) == -9
        assert reap.main(["x", "sess_E"]) == 1
        assert capsys.readouterr().err.startswith("error: ")
    finally:
        if p.poll() is None:
            p.kill()
        p.wait()
