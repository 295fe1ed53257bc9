"""The per-name lock (linpodx.namelock): exclusive, gone with what it guards, never two holders."""

from __future__ import annotations

import os
import threading
from pathlib import Path

import pytest

from linpodx import namelock
from linpodx.paths import containers_dir


def test_the_lock_file_goes_once_nothing_is_left_under_the_name() -> None:
    with namelock.acquire("agent-1") as lock:
        assert os.path.exists(lock.path)
    assert not os.path.exists(lock.path)
    (containers_dir() / "agent-1").mkdir(parents=True)
    with namelock.acquire("agent-1") as lock:
        pass
    assert os.path.exists(lock.path)  # the state dir is still there: so is its lock


def test_a_waiter_gets_the_lock_only_after_release_even_when_the_file_was_removed() -> None:
    first = namelock.acquire("agent-1")
    order: list[str] = []

    def second() -> None:
        with namelock.acquire("agent-1"):
            order.append("second")

    t = threading.Thread(target=second, daemon=True)
    t.start()
    t.join(0.3)
    order.append("first")
    first.release()  # removes the file the waiter is blocked on
    t.join(10)
    assert not t.is_alive()
    assert order == ["first", "second"]
    # And a third comer is not let in beside a holder of a new file.
    held = namelock.acquire("agent-1")
    got: list[namelock.NameLock] = []
    t = threading.Thread(target=lambda: got.append(namelock.acquire("agent-1")), daemon=True)
    t.start()
    t.join(0.3)
    assert got == []
    held.release()
    t.join(10)
    assert [g.name for g in got] == ["agent-1"]
    got[0].release()


def test_sweep_removes_only_unheld_lock_files_of_names_with_nothing_left() -> None:
    for name in ("gone", "kept", "held"):
        (containers_dir() / name).mkdir(parents=True)
        namelock.acquire(name).release()
    for name in ("gone", "held"):
        (containers_dir() / name).rmdir()
    held = namelock.acquire("held")
    namelock.sweep()
    left = sorted(os.listdir(containers_dir() / namelock.LOCKS_DIR))
    assert left == ["held", "kept"]
    held.release()
    assert sorted(os.listdir(containers_dir() / namelock.LOCKS_DIR)) == ["kept"]


def test_the_thread_that_holds_a_name_takes_it_again_at_once() -> None:
    """A rollback holds its container's name and calls stop/create/start, which take it again:
    that must not wait for itself. Only the outermost release lets go."""
    outer = namelock.acquire("agent-1")
    inner = namelock.acquire("agent-1")
    assert inner.held and outer.held
    inner.release()
    inner.release()  # a handle is given up once, however often it is released
    assert outer.held and not inner.held
    got: list[str] = []

    def other() -> None:
        with namelock.acquire("agent-1") as lock:
            got.append(lock.name)

    t = threading.Thread(target=other, daemon=True)
    t.start()
    t.join(0.3)
    assert got == []  # another thread still waits
    outer.release()
    t.join(10)
    assert got == ["agent-1"]


def test_a_wait_for_the_lock_is_said_once_on_stderr(capfd) -> None:  # type: ignore[no-untyped-def]
    first = namelock.acquire("agent-1")
    t = threading.Thread(target=lambda: namelock.acquire("agent-1").release(), daemon=True)
    t.start()
    t.join(0.5)
    first.release()
    t.join(10)
    assert not t.is_alive()
    out, err = capfd.readouterr()
    assert out == ""
    assert err == "note: waiting for another linpodx command on container agent-1 to finish\n"
    with namelock.acquire("agent-1"):
        pass  # no wait, nothing said
    assert capfd.readouterr() == ("", "")


HOLDER = """
import sys, time
from linpodx import namelock
lock = namelock.acquire("agent-1")
print("held", flush=True)
sys.stdin.read()
"""


def test_the_wait_note_names_the_linpodx_command_that_holds_the_lock(capfd) -> None:  # type: ignore[no-untyped-def]
    """The holder's pid is in the lock file; a waiter names it with its command line (control
    characters escaped). A holder that is not a linpodx command is not named."""
    import subprocess
    import sys

    for argv, shown in (
        (
            ["linpodx", "snapshot", "rollback", "agent-1\x1b[2J"],
            "linpodx snapshot rollback agent-1\\x1b[2J",
        ),
        (["something-else"], None),
    ):
        holder = subprocess.Popen(
            [sys.executable, "-c", HOLDER, *argv],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=os.environ,
        )  # fmt: skip
        assert holder.stdout is not None and holder.stdin is not None
        assert holder.stdout.readline() == "held\n"
        t = threading.Thread(target=lambda: namelock.acquire("agent-1").release(), daemon=True)
        t.start()
        t.join(0.5)
        holder.stdin.close()
        assert holder.wait(10) == 0
        t.join(10)
        assert not t.is_alive()
        err = capfd.readouterr().err
        prefix = "note: waiting for another linpodx command on container agent-1 to finish"
        if shown is None:
            assert err == prefix + "\n"
        else:
            assert err == f"{prefix} (pid {holder.pid}: {shown})\n"


def test_a_scope_of_its_own_bounds_its_wait_and_keeps_its_files(tmp_path: Path) -> None:
    """The snapshot lock is this lock in another scope: not taken again by the thread that
    holds it (it waits, then gives up, as another process would), its files stay, and its fd
    is the one that holds the flock (lent to programs that must keep it held)."""
    import fcntl

    scope = namelock.Scope(lambda: str(tmp_path / "locks"), guarded=None, reentrant=False,
                           what=None, suffix=".lock")  # fmt: skip
    with namelock.acquire("c1", scope, timeout=0) as lock:
        assert lock.path == str(tmp_path / "locks" / "c1.lock")
        with pytest.raises(namelock.Busy):
            namelock.acquire("c1", scope, timeout=0.3)
        other = os.open(lock.path, os.O_RDWR)
        try:
            with pytest.raises(BlockingIOError):
                fcntl.flock(other, fcntl.LOCK_EX | fcntl.LOCK_NB)
        finally:
            os.close(other)
        fd = lock.fd
    assert os.path.exists(lock.path)
    with pytest.raises(ValueError):
        _ = lock.fd
    with pytest.raises(OSError):
        os.fstat(fd)  # closed with the lock
    namelock.acquire("c1", scope, timeout=0).release()  # free again
