"""The connection checker's own threads (the connections themselves: the integration tests
tests/integration/test_egress_names.py and test_egress_attacks.py)."""

from __future__ import annotations

import os
import resource
import socket
import threading
import time
from pathlib import Path

import pytest

from linpodx.egress.checker import (
    FILES_KEPT,
    FILES_PER_CONNECTION,
    Checker,
    Leases,
    connection_room,
)
from linpodx.egress.policy import Allowlist


def test_the_checker_ends_if_its_threads_cannot_join_the_netns(tmp_path: Path) -> None:
    """An acceptor that cannot join the container's netns ends the checker (and so the guard:
    fail closed), instead of leaving connections unanswered behind a guard that looks
    healthy."""
    not_a_netns = tmp_path / "netns"
    not_a_netns.write_bytes(b"")  # setns(2) on it fails (EINVAL), for root too
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(8)
    allow = Allowlist.from_entries(["a.test"])
    checker = Checker(listener, str(not_a_netns), lambda: allow, Leases(), lambda *_: None)
    serving = threading.Thread(target=checker.serve, args=(threading.Event(),), daemon=True)
    serving.start()
    serving.join(timeout=10)
    assert not serving.is_alive()
    listener.close()


def test_the_connections_held_stay_within_the_guards_file_limit() -> None:
    """Six descriptors per connection, and some kept for the resolver and the records: what a
    low file limit cannot hold is refused by the checker's bound, not met as EMFILE."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (FILES_KEPT + 5 * FILES_PER_CONNECTION, hard))
        assert connection_room() == 5
        resource.setrlimit(resource.RLIMIT_NOFILE, (100, hard))
        assert connection_room() == 0
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


class _NoNewThreads:
    """`threading` for the checker, where a thread can no longer be started (a guard at its
    process or memory limit): `start` raises as CPython's does."""

    def __init__(self) -> None:
        self.Event = threading.Event
        self.Lock = threading.Lock
        self.Condition = threading.Condition
        self.stack_size = threading.stack_size
        self.refuse = False
        self.started = 0
        outer = self

        class Thread(threading.Thread):
            def start(self) -> None:
                if outer.refuse:
                    raise RuntimeError("can't start new thread")
                super().start()
                outer.started += 1

        self.Thread = Thread


def test_an_acceptor_that_cannot_start_another_still_handles_its_connection(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """An acceptor that takes a connection starts another when few are left waiting; when that
    start failed, the acceptor ended with the connection it had taken unhandled, still counted
    as waiting: two such and no acceptor was left, every new connection hung in the backlog
    and the guard looked healthy."""
    from linpodx.egress import checker as checker_mod

    if os.geteuid() != 0:
        pytest.skip("joining a netns (its own) needs CAP_SYS_ADMIN")
    fake = _NoNewThreads()
    monkeypatch.setattr(checker_mod, "threading", fake)
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(16)
    allow = Allowlist.from_entries(["a.test"])
    checker = Checker(listener, "/proc/self/ns/net", lambda: allow, Leases(), lambda *_: None)
    handled: list[socket.socket] = []
    release = threading.Event()

    def hold(conn: socket.socket) -> None:  # the connection's work, held until released
        handled.append(conn)
        release.wait(10)
        conn.close()

    monkeypatch.setattr(checker, "_one", hold)
    stop = threading.Event()
    serving = threading.Thread(target=checker.serve, args=(stop,), daemon=True)
    serving.start()
    clients = []
    try:
        deadline = time.monotonic() + 5
        while fake.started < Checker.ACCEPTORS_MIN and time.monotonic() < deadline:
            time.sleep(0.01)
        time.sleep(0.2)  # (into accept())
        fake.refuse = True
        for n in range(1, 5):
            clients.append(socket.create_connection(listener.getsockname()))
            deadline = time.monotonic() + 5
            while len(handled) < n and time.monotonic() < deadline:
                time.sleep(0.01)
        assert len(handled) == 4
    finally:
        release.set()
        stop.set()
        serving.join(5)
        for c in clients:
            c.close()
        listener.close()


def test_a_task_whose_thread_could_not_start_is_not_run_later(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The pool queued a task, then failed to start a thread for it: the connection it was for
    ended (its sockets closed), yet the task stayed queued, and the next thread started ran
    it, on that connection's sockets."""
    from linpodx.egress import checker as checker_mod

    if os.geteuid() != 0:
        pytest.skip("joining a netns (its own) needs CAP_SYS_ADMIN")
    fake = _NoNewThreads()
    monkeypatch.setattr(checker_mod, "threading", fake)
    fd = os.open("/proc/self/ns/net", os.O_RDONLY | os.O_CLOEXEC)
    try:
        pool = checker_mod._Pool(fd)
        ran: list[str] = []
        done = threading.Event()
        fake.refuse = True
        with pytest.raises(RuntimeError):
            pool.submit(ran.append, "stale")
        fake.refuse = False
        pool.submit(lambda: (ran.append("fresh"), done.set()))
        assert done.wait(5)
        time.sleep(0.1)
        assert ran == ["fresh"]
    finally:
        os.close(fd)
