"""The createRuntime hook script (linpodx/egress/hook.py), run as runc runs it: a separate
`python -I -S` process with the OCI state on stdin.

What these pin: it hands over exactly the pid from the OCI state, and exits 0 only when the
guard reports `ready` for that very pid; a failed guard, a ready guard of another pid, a removed
guard dir, a missing pid or no answer in time all exit non-zero (runc then never starts the
container's command).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from linpodx.egress import launch


def run_hook(
    tmp_path: Path, state: object, guard_doc: dict[str, object] | None, timeout: float = 0.5
) -> tuple[int, str, str]:
    """(exit status, pid line it handed over, stderr)."""
    fifo = tmp_path / "hook.pid"
    os.mkfifo(fifo, 0o600)
    gfile = tmp_path / "egress" / "guard.json"
    gfile.parent.mkdir(exist_ok=True)
    if guard_doc is not None:
        gfile.write_text(json.dumps(guard_doc))
    got: list[bytes] = []

    def read() -> None:
        with open(fifo, "rb") as f:
            got.append(f.read())

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    proc = subprocess.run(
        [sys.executable, "-I", "-S", launch.HOOK_SCRIPT, str(fifo), str(gfile), str(timeout)],
        input=json.dumps(state).encode() if not isinstance(state, bytes) else state,
        capture_output=True,
        timeout=30,
    )
    if proc.returncode != 0 and not got:
        # A hook that gave up before writing leaves the reader waiting: release it.
        with open(fifo, "wb"):
            pass
    reader.join(5)
    return proc.returncode, (got[0] if got else b"").decode(), proc.stderr.decode()


def test_ready_for_this_pid_lets_the_container_start(tmp_path: Path) -> None:
    rc, handed, _ = run_hook(
        tmp_path, {"pid": 4242, "status": "creating"}, {"state": "ready", "container_pid": 4242}
    )
    assert (rc, handed) == (0, "4242\n")


@pytest.mark.parametrize(
    "doc, why",
    [
        ({"state": "failed", "container_pid": 4242, "error": "nft said no"}, "guard failed"),
        ({"state": "ready", "container_pid": 999}, "in time"),  # another container's guard
        ({"state": "waiting"}, "in time"),
        (None, "in time"),
    ],
)
def test_anything_but_ready_for_this_pid_stops_the_container(
    tmp_path: Path, doc: dict[str, object] | None, why: str
) -> None:
    rc, handed, err = run_hook(tmp_path, {"pid": 4242}, doc)
    assert rc == 1 and handed == "4242\n"
    assert why in err


@pytest.mark.parametrize("state", [b"not json", {"status": "creating"}, {"pid": 0}, {"pid": "x"}])
def test_no_pid_in_the_oci_state_stops_the_container(tmp_path: Path, state: object) -> None:
    rc, handed, err = run_hook(tmp_path, state, {"state": "ready", "container_pid": 1})
    assert rc == 1 and handed == ""
    assert "no container pid" in err


def test_removed_guard_stops_the_container(tmp_path: Path) -> None:
    fifo = tmp_path / "hook.pid"
    os.mkfifo(fifo, 0o600)
    gone = tmp_path / "gone" / "guard.json"  # its dir does not exist: detached meanwhile
    reader = threading.Thread(target=lambda: open(fifo, "rb").read(), daemon=True)
    reader.start()
    proc = subprocess.run(
        [sys.executable, "-I", "-S", launch.HOOK_SCRIPT, str(fifo), str(gone), "5"],
        input=b'{"pid": 7}', capture_output=True, timeout=30,
    )  # fmt: skip
    assert proc.returncode == 1 and b"removed" in proc.stderr
