"""The rollback journal and the on-disk half of recovering a rollback killed part-way (no
podman here: tests/integration/test_snapshot.py kills real rollbacks at every step)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from linpodx import paths
from linpodx.errors import ChainBroken, LinpodxError
from linpodx.ids import new_ulid
from linpodx.snapshot import jobs, journal, workspace
from linpodx.snapshot.names import image_ref

RB = new_ulid()


def _journal(name: str = "agent-1", **kw: object) -> journal.Journal:
    j = journal.new(
        rollback_id=RB, container=name, label="s1", image=image_ref(name, "s1"),
        orig_id="a" * 64, aside=journal.aside_name(name, RB), was_running=True,
        spec=b'{"v":1}\n',
        mounts=[{"source": "/nonexistent/ws", "target": "/ws", "kind": "dir"}],
    )
    return replace(j, **kw)  # type: ignore[arg-type]


def _dead_pid() -> tuple[int, int | None]:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    pid, start = jobs.pid_info(child.pid)
    child.wait()
    return pid, start


def test_journal_round_trips_and_is_private(isolated_state: Path) -> None:
    j = _journal()
    journal.write(j)
    assert journal.read("agent-1") == j
    assert j.spec_bytes() == b'{"v":1}\n'
    assert j.mounts[0]["existed"] is False
    assert (journal.path("agent-1").stat().st_mode & 0o077) == 0
    assert str(journal.path("agent-1")) == paths.rollback_journal("agent-1")
    journal.clear("agent-1")
    assert journal.read("agent-1") is None
    journal.clear("agent-1")  # gone already is fine


def test_staged_journal_appears_only_on_commit(isolated_state: Path) -> None:
    staged = journal.stage(_journal())
    assert not journal.exists("agent-1")
    staged.commit()
    assert journal.exists("agent-1")
    staged2 = journal.stage(_journal(step="swap"))
    staged2.discard()
    assert journal.read("agent-1").step == "extract"  # type: ignore[union-attr]
    assert [p.name for p in journal.path("agent-1").parent.iterdir()] == ["agent-1.json"]


@pytest.mark.parametrize(
    "content",
    [
        b"not json",
        b"[]",
        b'{"version": 2}',
        b'{"version": 1, "rollback_id": "x"}',
    ],
)
def test_damaged_journal_is_refused_with_a_hint(isolated_state: Path, content: bytes) -> None:
    p = journal.path("agent-1")
    p.parent.mkdir(parents=True)
    p.write_bytes(content)
    with pytest.raises(ChainBroken) as err:
        journal.read("agent-1")
    assert "rollback journal" in err.value.message and err.value.hint


def test_journal_of_another_container_or_step_is_damage(isolated_state: Path) -> None:
    journal.write(_journal())
    os.rename(journal.path("agent-1"), journal.path("agent-2"))
    with pytest.raises(ChainBroken):
        journal.read("agent-2")
    journal.write(_journal(name="agent-3", step="teleport"))
    with pytest.raises(ChainBroken):
        journal.read("agent-3")


def test_a_fifo_in_place_of_the_journal_does_not_hang(isolated_state: Path, watchdog: None) -> None:
    p = journal.path("agent-1")
    p.parent.mkdir(parents=True)
    os.mkfifo(p)
    with pytest.raises(ChainBroken, match="not a regular file"):
        journal.read("agent-1")
    with pytest.raises(ChainBroken):
        journal.check_no_interrupted("agent-1")


def test_check_no_interrupted_tells_own_live_and_dead_owners_apart(isolated_state: Path) -> None:
    journal.check_no_interrupted("agent-1")  # no journal: nothing to say
    journal.write(_journal())
    journal.check_no_interrupted("agent-1")  # this process's own rollback acts on it
    parent = os.getppid()
    journal.write(_journal(pid=parent, pid_start=jobs.proc_start_time(parent)))
    with pytest.raises(LinpodxError, match="is in progress") as live:
        journal.check_no_interrupted("agent-1")
    assert "wait for it" in (live.value.hint or "")
    pid, start = _dead_pid()
    journal.write(_journal(pid=pid, pid_start=start, step="rename"))
    with pytest.raises(LinpodxError, match="was interrupted at step rename") as dead:
        journal.check_no_interrupted("agent-1")
    assert "linpodx snapshot recover agent-1" in (dead.value.hint or "")
    # A live process with the pid but another start time is not the owner (pid reuse).
    journal.write(_journal(pid=parent, pid_start=(start or 0) + 999_999_999))
    with pytest.raises(LinpodxError, match="was interrupted"):
        journal.check_no_interrupted("agent-1")


def test_cli_refuses_to_start_a_container_whose_rollback_was_interrupted(cli) -> None:  # type: ignore[no-untyped-def]
    pid, start = _dead_pid()
    journal.write(_journal(pid=pid, pid_start=start, step="swap"))
    for args in (("start", "agent-1"), ("stop", "agent-1"), ("rm", "agent-1"),
                 ("exec", "agent-1", "--", "true"), ("snapshot", "create", "agent-1",
                                                     "--label", "x")):
        r = cli(*args)
        assert r.exit_code == 1, (args, r.stderr)
        assert "error: a rollback of agent-1 to s1 was interrupted at step swap" in r.stderr
        assert "hint: run `linpodx snapshot recover agent-1`" in r.stderr
        assert "Traceback" not in r.stderr


def test_recover_with_nothing_to_do_changes_nothing(cli) -> None:  # type: ignore[no-untyped-def]
    r = cli("snapshot", "recover", "agent-1")
    assert r.exit_code == 0 and "recovered: false" in r.stdout


def test_recover_refuses_while_the_rollback_still_runs(cli) -> None:  # type: ignore[no-untyped-def]
    parent = os.getppid()
    journal.write(_journal(pid=parent, pid_start=jobs.proc_start_time(parent)))
    r = cli("snapshot", "recover", "agent-1")
    assert r.exit_code != 0 and "is in progress" in r.stderr and "hint:" in r.stderr
    assert journal.exists("agent-1")


# --- the workspace half of an undo, at each point a kill can leave it -------------------------


def _ws(tmp_path: Path) -> tuple[Path, Path, Path]:
    source = tmp_path / "ws"
    staging, aside = workspace._names(source, RB)
    return source, staging, aside


def _tree(path: Path, text: str) -> None:
    path.mkdir()
    (path / "f.txt").write_text(text)


def _left(tmp_path: Path) -> list[str]:
    return sorted(p.name for p in tmp_path.iterdir() if ".linpodx-" in p.name)


def test_undo_after_extract_only_drops_the_staging_dir(tmp_path: Path) -> None:
    source, staging, _ = _ws(tmp_path)
    _tree(source, "original")
    _tree(staging, "restored")
    assert workspace.undo_interrupted(source, RB, existed=True, swap_started=False) == []
    assert (source / "f.txt").read_text() == "original" and _left(tmp_path) == []


def test_undo_between_the_two_renames_of_a_swap(tmp_path: Path) -> None:
    source, staging, aside = _ws(tmp_path)
    _tree(aside, "original")  # moved aside; the restored copy not yet in place
    _tree(staging, "restored")
    assert workspace.undo_interrupted(source, RB, existed=True, swap_started=True) == []
    assert (source / "f.txt").read_text() == "original" and _left(tmp_path) == []


def test_undo_after_a_complete_swap_and_again(tmp_path: Path) -> None:
    source, _, aside = _ws(tmp_path)
    _tree(aside, "original")
    _tree(source, "restored")
    for _ in range(2):  # recovery may itself be interrupted and run again
        assert workspace.undo_interrupted(source, RB, existed=True, swap_started=True) == []
        assert (source / "f.txt").read_text() == "original" and _left(tmp_path) == []


def test_undo_of_a_recovery_killed_between_its_renames(tmp_path: Path) -> None:
    source, _, aside = _ws(tmp_path)
    _tree(aside, "original")
    _tree(tmp_path / f".ws.linpodx-undone-{RB}", "restored")  # source already moved out
    assert workspace.undo_interrupted(source, RB, existed=True, swap_started=True) == []
    assert (source / "f.txt").read_text() == "original" and _left(tmp_path) == []


def test_undo_of_a_file_mount_and_of_a_source_that_did_not_exist(tmp_path: Path) -> None:
    source, staging, aside = _ws(tmp_path)
    aside.write_text("original file")
    source.write_text("restored file")
    staging.mkdir()
    assert workspace.undo_interrupted(source, RB, existed=True, swap_started=True) == []
    assert source.read_text() == "original file" and _left(tmp_path) == []
    # Nothing was there before the rollback: the restored copy goes, nothing comes back.
    source.unlink()
    _tree(source, "restored")
    assert workspace.undo_interrupted(source, RB, existed=False, swap_started=True) == []
    assert not source.exists() and _left(tmp_path) == []


def test_finish_drops_the_moved_aside_original_and_staging(tmp_path: Path) -> None:
    source, staging, aside = _ws(tmp_path)
    _tree(source, "restored")
    _tree(aside, "original")
    staging.mkdir()
    assert workspace.finish_interrupted(source, RB) == []
    assert (source / "f.txt").read_text() == "restored" and _left(tmp_path) == []


def _deep_tree(top: Path, depth: int = 2000) -> None:
    """A tree `depth` directories deep, made with relative paths (one openat-like step at a
    time), so the test itself never builds a path longer than PATH_MAX."""
    top.mkdir()
    fd = os.open(top, os.O_RDONLY | os.O_DIRECTORY)
    try:
        for _ in range(depth):
            os.mkdir("d", dir_fd=fd)
            nxt = os.open("d", os.O_RDONLY | os.O_DIRECTORY, dir_fd=fd)
            os.close(fd)
            fd = nxt
        os.close(os.open("leaf", os.O_WRONLY | os.O_CREAT, 0o600, dir_fd=fd))
    finally:
        os.close(fd)


@pytest.fixture(autouse=True)
def _no_deep_tree_left(tmp_path: Path) -> object:
    # pytest's own clean-up of old temp dirs uses shutil.rmtree, which a deep tree left by a
    # failing test would crash in a later run.
    yield
    subprocess.run(["rm", "-rf", "--", str(tmp_path)], check=False)


def test_a_deep_tree_is_removed_without_recursion(tmp_path: Path) -> None:
    # An agent can write a tree deeper than Python's recursion limit into its workspace.
    top = tmp_path / "deep"
    _deep_tree(top)
    workspace.remove_tree(top)
    assert not os.path.lexists(top)


def test_finish_and_undo_cope_with_a_deep_tree(tmp_path: Path) -> None:
    source, staging, aside = _ws(tmp_path)
    _tree(source, "restored")
    _deep_tree(aside)
    staging.mkdir()
    assert workspace.finish_interrupted(source, RB) == []
    assert (source / "f.txt").read_text() == "restored" and _left(tmp_path) == []
    # Undo: the restored copy at the source is the deep one this time.
    _tree(aside, "original")
    import shutil  # only to clear the shallow tree
    shutil.rmtree(source)
    _deep_tree(source)
    assert workspace.undo_interrupted(source, RB, existed=True, swap_started=True) == []
    assert (source / "f.txt").read_text() == "original" and _left(tmp_path) == []


def test_cleanup_failures_are_named_not_raised(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    source, staging, aside = _ws(tmp_path)
    _tree(source, "restored")
    _tree(aside, "original")
    staging.mkdir()

    def boom(path: Path) -> None:
        raise RecursionError("maximum recursion depth exceeded")

    monkeypatch.setattr(workspace, "remove_tree", boom)
    problems = workspace.finish_interrupted(source, RB)
    assert len(problems) == 2 and all("RecursionError" in p for p in problems)
    left = workspace.Restore({"source": str(source), "target": "/ws", "kind": "dir"},
                             RB).cleanup()
    assert len(left) == 2 and str(aside) in left[1]
    assert workspace.undo_interrupted(source, RB, existed=True, swap_started=True)


def test_mcp_attach_refuses_a_container_whose_rollback_was_interrupted(
    isolated_state: Path,
) -> None:
    from linpodx.mcp import attach

    pid, start = _dead_pid()
    journal.write(_journal(pid=pid, pid_start=start, step="create"))
    with pytest.raises(LinpodxError, match="was interrupted at step create"):
        attach.find_container("agent-1")


def test_ps_names_containers_whose_rollback_was_interrupted(  # type: ignore[no-untyped-def]
    cli, monkeypatch: pytest.MonkeyPatch
) -> None:
    from linpodx.containers import runner

    class NoContainers:
        def list_managed(self, all_states: bool) -> list[dict[str, object]]:
            return []

    monkeypatch.setattr(runner, "_current", NoContainers())  # not the host's real podman
    pid, start = _dead_pid()
    journal.write(_journal(pid=pid, pid_start=start, step="rename"))
    journal.write(_journal(name="agent-2"))  # this process's own: not interrupted
    r = cli("ps", "--all", "--json")
    # stdout: the envelope
    assert r.exit_code == 0 and json.loads(r.stdout)["result"] == {"containers": []}
    assert r.stderr == ("a rollback of agent-1 to s1 was interrupted at step rename; run "
                        "`linpodx snapshot recover agent-1`\n")


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("rollback_id", "../../x"),
        ("orig_id", "abc"),
        ("aside", "someone-else"),
        ("image", "docker.io/evil:1"),
        ("label", "-bad"),
        ("was_running", 1),
        ("pid", True),
        ("pid", -1),
        ("spec", "not base64!"),
        ("mounts", [["source", "target", "kind", "existed"]]),
        ("mounts", [{"source": 1, "target": "/ws", "kind": "dir", "existed": True}]),
        ("mounts", [{"source": "rel/ws", "target": "/ws", "kind": "dir", "existed": True}]),
        ("mounts", [{"source": "/a/../b", "target": "/ws", "kind": "dir", "existed": True}]),
        ("mounts", [{"source": "/", "target": "/ws", "kind": "dir", "existed": True}]),
        ("mounts", [{"source": "/ws", "target": "/ws", "kind": "fifo", "existed": True}]),
        ("mounts", [{"source": "/ws", "target": "/ws", "kind": "dir", "existed": "no"}]),
    ],
)
def test_journal_fields_are_checked_before_recovery_trusts_them(
    isolated_state: Path, field: str, value: object
) -> None:
    """Recovery renames and removes the paths a journal names: a field a rollback would not
    have written is damage (exit 7), never a TypeError or a path outside the mount's parent."""
    journal.write(replace(_journal(), **{field: value}))  # type: ignore[arg-type]
    with pytest.raises(ChainBroken):
        journal.read("agent-1")


def test_a_reused_pid_does_not_make_a_journal_ours(isolated_state: Path) -> None:
    journal.write(_journal(pid=os.getpid(), pid_start=12345))
    with pytest.raises(LinpodxError, match="was interrupted"):
        journal.check_no_interrupted("agent-1")


def test_a_state_dir_that_cannot_be_searched_is_not_no_journal(
    isolated_state: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    real = os.lstat

    def denied(p: object, *a: object, **kw: object) -> os.stat_result:
        if str(p).endswith("/.rollbacks/agent-1.json"):
            raise PermissionError(13, "Permission denied")
        return real(p, *a, **kw)  # type: ignore[arg-type]

    monkeypatch.setattr(os, "lstat", denied)
    with pytest.raises(LinpodxError, match="cannot check for an interrupted rollback"):
        journal.check_no_interrupted("agent-1")


def test_temp_files_of_a_killed_journal_writer_are_swept(isolated_state: Path) -> None:
    staged = journal.stage(_journal())  # a stage whose writer was killed before the rename
    journal.write(_journal(name="agent-2"))
    other = journal.stage(_journal(name="agent-2"))
    where = journal.path("agent-1").parent
    assert len([n for n in os.listdir(where) if n.endswith(".tmp")]) == 2
    journal.sweep_temps("agent-1")
    left = sorted(os.listdir(where))
    assert [n for n in left if n.startswith(".agent-1.")] == []
    assert "agent-2.json" in left and len([n for n in left if n.endswith(".tmp")]) == 1
    staged.discard()
    other.discard()


def test_the_sweep_leaves_a_dotted_neighbours_temp_files_alone(isolated_state: Path) -> None:
    """Container names may hold dots: sweeping `foo`'s temp files must not take those of a
    container named `foo.json.x`."""
    journal.write(_journal(name="foo.json.x"))
    neighbour = journal.stage(_journal(name="foo.json.x"))
    journal.sweep_temps("foo")
    where = journal.path("foo").parent
    assert len([n for n in os.listdir(where) if n.endswith(".tmp")]) == 1
    neighbour.discard()


def test_an_undo_interrupted_before_the_restart_says_so(cli) -> None:  # type: ignore[no-untyped-def]
    pid, start = _dead_pid()
    journal.write(_journal(pid=pid, pid_start=start, step="undone"))
    r = cli("start", "agent-1")
    assert r.exit_code == 1
    assert "was undone, but interrupted before agent-1 was started again" in r.stderr
    assert "hint: run `linpodx snapshot recover agent-1` to start it again" in r.stderr
