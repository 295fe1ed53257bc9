"""The guard's launch protocol: started before the container exists, it waits for the pid on
its control socket and ends by itself when nobody sends one.

No container and no podman here: a launched guard that never gets a pid touches nothing.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from linpodx.egress import guard, launch
from linpodx.egress.runner import await_order
from linpodx.profile.model import Network, Profile

_open_peers: list[socket.socket] = []


def _pair_with(data: bytes, *, close: bool) -> socket.socket:
    ours, theirs = socket.socketpair()
    ours.sendall(data)
    if close:
        ours.close()
    else:
        _open_peers.append(ours)  # the CLI's end stays open: no EOF
    return theirs


def test_order_carries_pid_and_helper() -> None:
    sock = _pair_with(b'{"pid": 42, "helper": "pasta"}\n', close=False)
    assert await_order(sock, 5) == (42, "pasta")


def test_order_without_helper() -> None:
    sock = _pair_with(b'{"pid": 7, "helper": null}\n', close=True)
    assert await_order(sock, 5) == (7, None)


def test_closed_socket_means_no_order() -> None:
    assert await_order(_pair_with(b"", close=True), 5) is None
    assert await_order(_pair_with(b'{"pid": 4', close=True), 5) is None


def test_no_order_in_time() -> None:
    assert await_order(_pair_with(b"", close=False), 0.05) is None


@pytest.mark.parametrize(
    "line",
    [b'{"pid": 0}\n', b'{"pid": "1"}\n', b'{"pid": 3, "helper": 5}\n', b"[1]\n", b"nope\n"],
)
def test_bad_orders_are_refused(line: bytes) -> None:
    with pytest.raises(ValueError):
        await_order(_pair_with(line, close=True), 5)


def _guards_of(name: str) -> list[int]:
    out = []
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            cmd = (d / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if launch.GUARD_MODULE.encode() in cmd and name.encode() in cmd:
            out.append(int(d.name))
    return out


def _wait_until(cond: object, limit: float = 20.0) -> bool:
    end = time.monotonic() + limit
    while time.monotonic() < end:
        if cond():  # type: ignore[operator]
            return True
        time.sleep(0.05)
    return False


def test_a_launched_guard_ends_when_detached() -> None:
    name = f"lpx-launch-{uuid.uuid4().hex[:8]}"
    guard.launch(name)
    try:
        assert _wait_until(lambda: _guards_of(name))
        guard.launch(name)  # already waiting: no second guard
        assert len(_guards_of(name)) == 1
    finally:
        guard.detach(name)
    assert _wait_until(lambda: not _guards_of(name))


def test_init_pid_comes_from_the_pidfile_beside_the_resolv_conf() -> None:
    name = f"lpx-pid-{uuid.uuid4().hex[:8]}"
    assert guard.init_pid(name) is None  # nothing written: the caller asks podman
    st = guard.EgressState(name)
    st.ensure()
    st.init_pidfile.write_text("4242\n")
    assert guard.init_pid(name) == 4242
    st.init_pidfile.write_text("garbage")
    assert guard.init_pid(name) is None
    guard.detach(name)
    assert not st.dir.parent.exists()  # nothing of the container's was left


@dataclass
class Stored:
    """The fields of a stored profile the guard reads."""

    profile: Profile
    name: str
    profile_id: str
    revision: int


def stored(rev: int) -> Stored:
    """Revision `rev` of profile p, allowing only r<rev>.test."""
    net = Network(egress_dns_allowlist=(f"r{rev}.test",))
    return Stored(Profile(name="p", network=net), "p", f"prof_TEST{rev}", rev)


def _egress_updates() -> list[dict[str, Any]]:
    """The data of every `egress.update` record in the admin chain."""
    from linpodx.audit.chain import admin_chain, read_records

    path = admin_chain().path
    found = read_records(path) if path.exists() else []
    return [dict(r.data) for r in found if r.type == "egress.update"]


def test_a_push_waits_for_a_command_holding_the_container_name() -> None:
    """A re-apply's push to a container takes the container's name lock: a run or start that
    is bringing the container's guard up (and writing its policy file) finishes first."""
    import threading

    from linpodx import namelock
    from linpodx.egress.state import EgressState

    def updates() -> list[object]:
        return [d["revision"] for d in _egress_updates()]

    guard._write_policy(EgressState("agent-1"), stored(1))  # type: ignore[arg-type]
    held = namelock.acquire("agent-1")
    result: list[list[str]] = []
    t = threading.Thread(
        target=lambda: result.append(guard.update_profile(stored(2))),  # type: ignore[arg-type]
        daemon=True,
    )
    try:
        t.start()
        t.join(0.5)
        assert t.is_alive() and result == []  # waiting for the name
        assert updates() == []
    finally:
        held.release()
    t.join(10)
    assert result == [[]]  # no guard runs: recorded and written, nothing to nudge
    assert updates() == [2]


def test_an_unchanged_re_apply_pushes_only_to_containers_left_behind() -> None:
    """An apply cut short after storing revision 2 left agent-1's policy at revision 1;
    applying the same file again (unchanged) pushes to agent-1 only, recorded first."""
    from linpodx.egress.state import EgressState

    def updates() -> list[object]:
        return [d["container"] for d in _egress_updates()]

    guard._write_policy(EgressState("agent-1"), stored(1))  # type: ignore[arg-type]
    guard._write_policy(EgressState("agent-2"), stored(2))  # type: ignore[arg-type]
    assert guard.update_profile(stored(2), only_stale=True) == []  # type: ignore[arg-type]
    assert updates() == ["agent-1"]
    doc = json.loads(EgressState("agent-1").policy_file.read_text())
    assert doc["revision"] == 2 and doc["allowlist"] == ["r2.test"]
    guard.update_profile(stored(2), only_stale=True)  # type: ignore[arg-type]
    assert updates() == ["agent-1"]  # nothing left behind: nothing recorded again


def test_a_guard_pid_reused_by_another_users_process_is_not_a_guard(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """`ps` shows `healthy` only for a guard that is this user's: a recorded pid that another
    user's process now holds, whatever its command line, is not one (r5)."""
    from linpodx.egress import state

    sleep = "import time; time.sleep(30)"
    argv = [sys.executable, "-c", sleep, state.names.GUARD_MODULE, "agent-1"]
    child = subprocess.Popen(argv)
    try:
        info = {"guard_pid": child.pid}
        assert _wait_until(lambda: state.guard_alive(info, "agent-1"))
        real = os.getuid()
        monkeypatch.setattr(os, "getuid", lambda: real + 1)  # as another user sees it
        assert not state.guard_alive(info, "agent-1")
    finally:
        child.kill()
        child.wait()
