"""Attached-session markers (`linpodx.containers.sessions`): a marker counts only while its
process lives (pid and start time), goes with its session, and a notice left for it is said
on stderr when the session ends."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from linpodx.containers import sessions


def test_a_session_is_live_while_it_lasts_and_gone_after(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with sessions.attached("agent-1", "attach") as me:
        assert sessions.live("agent-1") == [me]
        assert me.describe().startswith("`linpodx attach`, pid ")
        assert sessions.live("agent-2") == []
    assert sessions.live("agent-1") == []
    assert not me.marker.exists()
    assert capsys.readouterr().err == ""  # nothing was left for it: nothing said


def test_a_notice_left_for_a_session_is_said_when_it_ends(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with sessions.attached("agent-1", "run") as me:
        told = sessions.tell_all("agent-1", "agent-1 was stopped by a rollback\x1b]0;x\x07")
        assert told == [me]
    err = capsys.readouterr().err
    assert "linpodx: agent-1 was stopped by a rollback" in err
    assert "\x1b" not in err  # the notice is text, never terminal control
    assert not me.notice_path.exists()


def test_markers_of_ended_or_reused_processes_do_not_count() -> None:
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True)  # fmt: skip
    with sessions.attached("agent-1", "run") as me:
        where = me.marker.parent
        # A session killed before it could remove its marker: its pid is gone.
        (where / f"{dead.stdout.strip()}.json").write_text(
            json.dumps({"pid": int(dead.stdout), "start": "1", "how": "run"})
        )
        # A live pid, but another start time: a killed session whose pid was reused since.
        (where / "1.json").write_text(
            json.dumps({"pid": 1, "start": "never-a-start-time", "how": "attach"})
        )
        # Not a marker linpodx wrote.
        (where / "2.json").write_text("not json")
        (where / "3.json").write_text(json.dumps({"pid": True, "start": "0", "how": "run"}))
        assert sessions.live("agent-1") == [me]
