"""The guard's guard.json writer: every state is written, but the last one ("stopped") never
brings back a state dir that a `--rm` container's cleanup removed meanwhile."""

from __future__ import annotations

import json
import shutil

from linpodx.egress.runner import Reporter
from linpodx.egress.state import EgressState


def test_stopped_is_written_while_the_state_dir_is_there() -> None:
    st = EgressState("rep-1")
    st.ensure()
    r = Reporter(st, None)
    r.write(state="ready", container="rep-1")
    assert json.loads(st.guard_file.read_text())["state"] == "ready"
    r.write(state="stopped", container="rep-1")
    assert json.loads(st.guard_file.read_text())["state"] == "stopped"


def test_stopped_does_not_recreate_a_removed_state_dir() -> None:
    st = EgressState("rep-2")
    st.ensure()
    Reporter(st, None).write(state="ready", container="rep-2")
    shutil.rmtree(st.dir.parent)  # what the --rm cleanup hook does when the container goes
    Reporter(st, None).write(state="stopped", container="rep-2")
    assert not st.dir.parent.exists()


def test_other_states_create_the_dir_as_before() -> None:
    st = EgressState("rep-3")
    Reporter(st, None).write(state="filtered", container="rep-3")
    assert json.loads(st.guard_file.read_text())["state"] == "filtered"
