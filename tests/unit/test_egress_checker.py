"""The connection checker's own threads (the connections themselves: the integration tests
tests/integration/test_egress_names.py and test_egress_attacks.py)."""

from __future__ import annotations

import resource
import socket
import threading
from pathlib import Path

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
