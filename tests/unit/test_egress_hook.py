"""The createRuntime hook of a guarded one-call run (linpodx/egress/hook.sh), run as runc runs
it: `/bin/sh hook.sh STATE_FIFO ANSWER_FIFO` with the OCI state on stdin; and the CLI's side of
the hand-over (guard.hook_pid, guard.hook_release).

What these pin: the hook hands the OCI state over untouched and exits 0 only on the answer
`ready`; a failure answer, no answer (the CLI is gone), or a missing FIFO exit non-zero (runc
then never starts the container's command). The CLI takes the pid only from a state that is
JSON for this very container being created, and answers the hook.
"""

from __future__ import annotations

import json
import os
import subprocess
import threading
from pathlib import Path

import pytest

from linpodx.egress import guard, launch
from linpodx.egress.state import EgressState
from linpodx.errors import EngineError

STATE = {"ociVersion": "1.0.2", "id": "ab" * 32, "status": "creating", "pid": 4242,
         "bundle": "/x"}  # fmt: skip


def run_hook(tmp_path: Path, state: bytes, answer: bytes | None) -> tuple[int, bytes, str]:
    """(exit status, what it handed over, stderr). `answer` None: the CLI closes the answer
    FIFO without a word (it died)."""
    fifo, answer_fifo = tmp_path / "state", tmp_path / "answer"
    os.mkfifo(fifo, 0o600)
    os.mkfifo(answer_fifo, 0o600)
    got: list[bytes] = []

    def cli() -> None:
        with open(fifo, "rb") as f:
            got.append(f.read())
        with open(answer_fifo, "wb") as f:
            if answer is not None:
                f.write(answer)

    t = threading.Thread(target=cli, daemon=True)
    t.start()
    proc = subprocess.run(
        [launch.HOOK_SHELL, launch.HOOK_SCRIPT, str(fifo), str(answer_fifo)],
        input=state, capture_output=True, timeout=30,
    )  # fmt: skip
    t.join(5)
    return proc.returncode, (got[0] if got else b""), proc.stderr.decode()


def test_ready_lets_the_container_start_and_the_state_is_handed_over_untouched(
    tmp_path: Path,
) -> None:
    raw = json.dumps(STATE).encode()
    assert run_hook(tmp_path, raw, b"ready\n") == (0, raw, "")
    (tmp_path / "again").mkdir()
    assert run_hook(tmp_path / "again", raw, b"ready")[0] == 0  # no newline after it: the same


@pytest.mark.parametrize(
    "answer, said",
    [
        (b"not started: egress filter for a could not be set up\n", "could not be set up"),
        (b"ready-ish\n", "ready-ish"),
        (b"\n", "linpodx egress hook:"),
        (None, "no answer"),
    ],
)
def test_anything_but_ready_stops_the_container(
    tmp_path: Path, answer: bytes | None, said: str
) -> None:
    rc, handed, err = run_hook(tmp_path, json.dumps(STATE).encode(), answer)
    assert rc == 1 and handed
    assert said in err


def test_a_missing_fifo_stops_the_container(tmp_path: Path) -> None:
    proc = subprocess.run(
        [launch.HOOK_SHELL, launch.HOOK_SCRIPT, str(tmp_path / "gone"), str(tmp_path / "gone2")],
        input=b"{}", capture_output=True, timeout=30,
    )  # fmt: skip
    assert proc.returncode != 0


def hand_over(name: str, data: bytes) -> None:
    def write() -> None:
        with open(EgressState(name).hook_fifo, "wb") as f:
            f.write(data)

    threading.Thread(target=write, daemon=True).start()


def test_the_cli_takes_the_pid_of_this_containers_state_only() -> None:
    launch.hook_setup("agent-1")
    hand_over("agent-1", json.dumps(STATE).encode())
    assert guard.hook_pid("agent-1", lambda: True, "ab" * 32) == 4242


@pytest.mark.parametrize(
    "state",
    [
        b"not json",
        json.dumps({**STATE, "id": "cd" * 32}).encode(),  # another container's
        json.dumps({**STATE, "status": "running"}).encode(),
        json.dumps({**STATE, "pid": 0}).encode(),
        json.dumps({**STATE, "pid": True}).encode(),
        json.dumps({**STATE, "pid": "4242"}).encode(),
        json.dumps([STATE]).encode(),
        b"",
    ],
)
def test_any_other_state_is_refused(state: bytes) -> None:
    launch.hook_setup("agent-1")
    hand_over("agent-1", state)
    with pytest.raises(EngineError, match="did not hand over this container's state"):
        guard.hook_pid("agent-1", lambda: True, "ab" * 32)


def test_nothing_handed_over_while_podman_ends_is_refused() -> None:
    launch.hook_setup("agent-1")
    with pytest.raises(EngineError):
        guard.hook_pid("agent-1", lambda: False, "ab" * 32)


def test_the_cli_answers_the_waiting_hook() -> None:
    launch.hook_setup("agent-1")
    got: list[bytes] = []

    def hook() -> None:
        with open(EgressState("agent-1").hook_answer_fifo, "rb") as f:
            got.append(f.read())

    t = threading.Thread(target=hook, daemon=True)
    t.start()
    guard.hook_release("agent-1", "not started: nft\nsaid no", lambda: True)
    t.join(5)
    assert got == [b"not started: nft said no\n"]  # one line, whatever the reason said


def test_ready_that_cannot_be_told_is_an_error() -> None:
    launch.hook_setup("agent-1")  # no hook reads the answer FIFO
    with pytest.raises(EngineError, match="could not be told"):
        guard.hook_release("agent-1", "ready", lambda: False)
    guard.hook_release("agent-1", "not started: x", lambda: False)  # a refusal: best effort
