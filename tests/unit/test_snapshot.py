"""Unit tests for snapshot names, job files and worker liveness, fault points, manifests, CLI
errors. No podman here: everything that needs the engine is in tests/integration."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import tarfile
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from linpodx import proc
from linpodx.errors import EngineError, InvalidInput, NotFound
from linpodx.snapshot import jobs, manifest, names, workspace
from tests.faultinject import ROLLBACK_STEPS, Inject


@pytest.mark.parametrize(
    "label", ["before-refactor", "v1.2", "_x", "A", "a" * 128, "X_y.z-1"]
)
def test_valid_labels(label: str) -> None:
    assert names.check_label(label) == label


@pytest.mark.parametrize(
    "label",
    ["", ".hidden", "-x", "a" * 129, "a/b", "a:b", "a b", "..", "é", "a\nb", "a\x00"],
)
def test_invalid_labels(label: str) -> None:
    with pytest.raises(InvalidInput) as exc:
        names.check_label(label)
    assert exc.value.hint


def test_container_name_must_fit_an_image_reference() -> None:
    assert names.check_container_name("agent-1") == "agent-1"
    assert names.check_container_name("a.b_c--d") == "a.b_c--d"
    for bad in ("Agent", "a..b", "-a", "", "a/b", "a_-b"):
        with pytest.raises(InvalidInput):
            names.check_container_name(bad)


def test_image_ref_and_paths_stay_under_state_dir(isolated_state: Path) -> None:
    assert names.image_ref("agent-1", "before") == "localhost/linpodx/snapshot/agent-1:before"
    d = names.snapshot_dir("agent-1", "before")
    assert d.parts[-2:] == ("agent-1", "before")
    # Job files never share a directory with a container's snapshots (names cannot start with .)
    assert names.jobs_dir().name.startswith(".")
    assert names.job_file("snap-01J0000000000000000000000Z").parent == names.jobs_dir()


def test_job_id_checked() -> None:
    names.check_job_id("snap-01J0000000000000000000000Z")
    bad_ids = ("snap-", "snap-../../x", "job-01J0000000000000000000000Z",
               "snap-01j0000000000000000000000z")
    for bad in bad_ids:
        with pytest.raises(InvalidInput):
            names.check_job_id(bad)


def _job(**kw: object) -> jobs.Job:
    base = jobs.Job(
        job_id="snap-01J0000000000000000000000Z",
        kind="create",
        container="c1",
        label="l1",
        image=names.image_ref("c1", "l1"),
        created=jobs.now_iso(),
    )
    return replace(base, **kw)  # type: ignore[arg-type]


def test_job_roundtrip_and_private_file() -> None:
    job = _job(status=jobs.RUNNING, step="commit")
    jobs.write(job)
    assert jobs.read(job.job_id) == job
    assert names.job_file(job.job_id).stat().st_mode & 0o777 == 0o600
    assert jobs.list_jobs() == [job.job_id]


def test_unknown_job_is_not_found() -> None:
    with pytest.raises(NotFound):
        jobs.read("snap-01J0000000000000000000000Z")


def test_damaged_job_file_is_an_error_not_a_traceback() -> None:
    p = names.job_file("snap-01J0000000000000000000000Z")
    p.parent.mkdir(parents=True)
    p.write_text('{"job_id": "x", "job_id": "y"}')
    with pytest.raises(Exception) as exc:
        jobs.read("snap-01J0000000000000000000000Z")
    assert "damaged" in str(exc.value)


def test_live_worker_is_running() -> None:
    pid, start = jobs.pid_info(os.getpid())
    job = _job(status=jobs.RUNNING, worker_pid=pid, worker_start=start)
    jobs.write(job)
    assert jobs.current(job.job_id).status == jobs.RUNNING


def test_recycled_pid_is_not_mistaken_for_the_worker() -> None:
    pid, start = jobs.pid_info(os.getpid())
    assert start is not None
    job = _job(status=jobs.RUNNING, step="commit", worker_pid=pid, worker_start=start + 1)
    jobs.write(job)
    now = jobs.current(job.job_id)
    assert now.status == jobs.FAILED
    assert "worker died" in (now.error or "") and "commit" in (now.error or "")
    # The verdict is persisted: a second reader sees the same.
    assert jobs.read(job.job_id).status == jobs.FAILED


def test_exited_and_zombie_workers_are_dead() -> None:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    pid, start = child.pid, jobs.proc_start_time(child.pid)
    # Not reaped yet: a zombie (or gone). Either way not a live worker.
    deadline = time.monotonic() + 10
    while jobs.proc_start_time(pid) is not None and time.monotonic() < deadline:
        time.sleep(0.02)
    assert jobs.proc_start_time(pid) is None
    job = _job(status=jobs.QUEUED, worker_pid=pid, worker_start=start or 1)
    jobs.write(job)
    assert jobs.current(job.job_id).status == jobs.FAILED
    child.wait()


def test_finished_job_is_left_alone() -> None:
    job = _job(status=jobs.SUCCEEDED, worker_pid=1, worker_start=1)
    jobs.write(job)
    assert jobs.current(job.job_id).status == jobs.SUCCEEDED


def test_queued_without_worker_waits_for_grace_then_fails() -> None:
    fresh = _job(status=jobs.QUEUED)
    jobs.write(fresh)
    assert jobs.current(fresh.job_id).status == jobs.QUEUED
    old = _job(status=jobs.QUEUED, created="2020-01-01T00:00:00.000Z")
    jobs.write(old)
    now = jobs.current(old.job_id)
    assert now.status == jobs.FAILED and "never started" in (now.error or "")


def test_proc_stat_parsing_survives_odd_process_names(tmp_path: Path) -> None:
    # comm may contain ") " : the parser must split after the LAST ')'.
    odd = tmp_path / "w) x (y"
    odd.symlink_to(sys.executable)
    child = subprocess.Popen([str(odd), "-c", "import time; time.sleep(30)"])
    try:
        deadline = time.monotonic() + 10
        while True:
            with open(f"/proc/{child.pid}/stat") as f:
                if "w) x (y" in f.read() or time.monotonic() > deadline:
                    break
            time.sleep(0.02)
        start = jobs.proc_start_time(child.pid)
        with open(f"/proc/{child.pid}/stat") as f:
            expected = int(f.read().rsplit(")", 1)[1].split()[19])
        assert start == expected
    finally:
        child.kill()
        child.wait()


def test_the_saga_journals_before_each_step_and_fails_only_where_told() -> None:
    from linpodx.snapshot.saga import Saga, Step

    seen: list[str] = []
    saga: Saga[list[str]] = Saga([
        Step(n, lambda c, n=n: c.append(f"do {n}"), lambda c, n=n: c.append(f"undo {n}"))
        for n in ("a", "b", "c")
    ])
    saga.run(seen, lambda n: seen.append(f"journal {n}"), Inject("nowhere"))
    assert seen == ["journal a", "do a", "journal b", "do b", "journal c", "do c"]
    seen.clear()
    with pytest.raises(EngineError, match="injected failure at step b"):
        saga.run(seen, lambda n: seen.append(f"journal {n}"), Inject("b"))
    assert seen == ["journal a", "do a", "journal b", "do b"]  # b changed something first
    with pytest.raises(KeyboardInterrupt):
        saga.run([], lambda n: None, Inject("interrupt@a"))
    seen.clear()
    saga.undo(seen, "b")  # what may have started, last first
    assert seen == ["undo b", "undo a"]


def test_the_rollback_steps_are_the_journals_and_no_fault_is_read_from_the_environment() -> None:
    """The journal on disk names these steps (recovery reads them back); and the installed tool
    takes its fault points (rollback's, the worker's delays) from its caller only."""
    import linpodx
    from linpodx.snapshot import journal, rollback

    assert rollback.STEPS.names() == journal.STEPS[: journal.STEPS.index("commit")]
    assert set(ROLLBACK_STEPS) <= set(journal.STEPS)
    package = Path(linpodx.__file__).parent
    hooks = ("TEST_FAIL_AT", "SNAPSHOT_TEST_DELAY")  # the environment variables they replace
    readers = [p for p in package.rglob("*.py") if any(h in p.read_text() for h in hooks)]
    assert readers == []


def test_writable_mounts_keep_only_writable_binds_outside_our_state(isolated_state: Path) -> None:
    from linpodx import paths

    own = paths.runtime_dir() / "containers" / "x" / "resolv.conf"
    info = {
        "Mounts": [
            {"Type": "bind", "Source": "/srv/ws", "Destination": "/workspace", "RW": True},
            {"Type": "bind", "Source": "/srv/ro", "Destination": "/ro", "RW": False},
            {"Type": "volume", "Source": "/var/v", "Destination": "/v", "RW": True},
            {"Type": "bind", "Source": str(own), "Destination": "/etc/resolv.conf", "RW": True},
            {"Type": "bind", "Source": "/srv/a", "Destination": "/a", "RW": True},
        ]
    }
    got = workspace.writable_mounts(info)
    assert [(m.source, m.target) for m in got] == [("/srv/a", "/a"), ("/srv/ws", "/workspace")]


def test_manifest_missing_is_not_found_and_damaged_is_refused(isolated_state: Path) -> None:
    with pytest.raises(NotFound) as exc:
        manifest.read("c1", "l1")
    assert "snapshot list c1" in (exc.value.hint or "")
    d = names.snapshot_dir("c1", "l1")
    d.mkdir(parents=True)
    (d / manifest.MANIFEST).write_text(json.dumps({"schema": 99, "mounts": [], "image_id": "x"}))
    with pytest.raises(Exception, match="unknown version"):
        manifest.read("c1", "l1")


# --- CLI: bad input is error + hint + exit code, never a traceback, never podman ------------


def test_cli_invalid_label(cli) -> None:  # type: ignore[no-untyped-def]
    r = cli("snapshot", "create", "agent-1", "--label", "../x")
    assert r.exit_code == 3
    assert "error: invalid snapshot label" in r.stderr and "hint:" in r.stderr
    assert "Traceback" not in r.stderr


def test_cli_unknown_job(cli) -> None:  # type: ignore[no-untyped-def]
    r = cli("snapshot", "job-status", "snap-01J0000000000000000000000Z")
    assert r.exit_code == 4 and "snapshot job not found" in r.stderr
    r = cli("snapshot", "job-status", "nonsense", "--json")
    assert r.exit_code == 3
    doc = json.loads(r.stdout)
    assert doc["ok"] is False and doc["error"]["type"] == "InvalidInput"


def test_cli_rollback_unknown_label_is_not_found(cli) -> None:  # type: ignore[no-untyped-def]
    r = cli("snapshot", "rollback", "agent-1", "--to", "nope")
    assert r.exit_code == 4
    assert "snapshot not found: agent-1, label nope" in r.stderr


def test_cli_list_empty(cli) -> None:  # type: ignore[no-untyped-def]
    r = cli("snapshot", "list")
    assert r.exit_code == 0 and r.stdout == "" and r.stderr.strip() == "no snapshots"
    r = cli("snapshot", "list", "--json")
    assert json.loads(r.stdout)["result"] == {"snapshots": []}


def test_restore_swap_and_undo_on_plain_dirs(tmp_path: Path) -> None:
    # Pure filesystem part of the restore (no tar): swap puts the staged copy in place, the undo
    # puts the original back, byte for byte, and leaves no copies.
    src = tmp_path / "ws"
    src.mkdir()
    (src / "f").write_text("live")
    r = workspace.Restore({"source": str(src), "target": "/w", "kind": workspace.DIR}, "RB1")
    r.restored.mkdir(parents=True)
    (r.restored / "f").write_text("snap")
    workspace.check_restorable(r.entry)
    r.swap()
    assert (src / "f").read_text() == "snap" and (r.aside / "f").read_text() == "live"
    assert workspace.undo_interrupted(src, "RB1", existed=True, swap_started=True) == []
    assert (src / "f").read_text() == "live"
    assert [p.name for p in tmp_path.iterdir() if ".linpodx-" in p.name] == []


def test_check_restorable_refuses_kind_change(tmp_path: Path) -> None:
    f = tmp_path / "was-a-dir"
    f.write_text("x")
    with pytest.raises(InvalidInput, match="no longer a directory"):
        workspace.check_restorable({"source": str(f), "target": "/w", "kind": workspace.DIR})


def _wait_state(pid: int, want: str) -> str:
    deadline = time.monotonic() + 10
    while True:
        with open(f"/proc/{pid}/stat") as f:
            state = f.read().rsplit(")", 1)[1].split()[0]
        if state in want or time.monotonic() > deadline:
            return state
        time.sleep(0.02)


def test_release_continues_only_the_exact_processes_recorded() -> None:
    """After a worker died holding a container, only processes with the recorded pid AND start
    time are continued: a recycled pid (other start time) is left alone."""
    import signal

    from linpodx.snapshot import freeze

    a = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    b = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        for p in (a, b):
            os.kill(p.pid, signal.SIGSTOP)
            assert _wait_state(p.pid, "Tt") in "Tt"
        sa, sb = jobs.proc_start_time(a.pid), jobs.proc_start_time(b.pid)
        assert sa is not None and sb is not None
        done = freeze.release("unused", freeze.SIGSTOP_METHOD, [[a.pid, sa], [b.pid, sb + 7]])
        assert done == ["continued 1 processes"]
        assert _wait_state(a.pid, "SR") in "SR"
        time.sleep(0.3)  # a SIGCONT would have landed by now
        assert _wait_state(b.pid, "Tt") in "Tt"
    finally:
        for p in (a, b):
            p.kill()
            p.wait()


def test_prune_removes_only_jobs_that_finished_long_ago() -> None:
    """Finished more than KEEP_DAYS ago: file and log go. Finished lately, still running with a
    live worker, damaged: all stay. A job whose worker died is marked failed now (and stays)."""
    long_ago = "2026-01-01T00:00:00.000Z"
    pid, start = jobs.pid_info(os.getpid())
    made = {
        "old-ok": _job(job_id="snap-01J0000000000000000000001Z", status=jobs.SUCCEEDED,
                       finished=long_ago),
        "old-failed": _job(job_id="snap-01J0000000000000000000002Z", status=jobs.FAILED,
                           finished=long_ago),
        "recent": _job(job_id="snap-01J0000000000000000000003Z", status=jobs.SUCCEEDED,
                       finished=jobs.now_iso()),
        "running": _job(job_id="snap-01J0000000000000000000004Z", status=jobs.RUNNING,
                        created=long_ago, worker_pid=pid, worker_start=start),
        "dead-worker": _job(job_id="snap-01J0000000000000000000005Z", status=jobs.RUNNING,
                            created=long_ago, worker_pid=pid, worker_start=start + 1),
    }  # fmt: skip
    for job in made.values():
        jobs.write(job)
        names.job_log(job.job_id).write_text("worker log\n")
    damaged = names.job_file("snap-01J0000000000000000000006Z")
    damaged.write_text("{not json")

    gone = jobs.prune()

    old = {made["old-ok"].job_id, made["old-failed"].job_id}
    assert set(gone) == old
    for key, job in made.items():
        kept = job.job_id not in old
        assert names.job_file(job.job_id).exists() is kept, key
        assert names.job_log(job.job_id).exists() is kept, key
    assert damaged.exists()
    assert jobs.read(made["dead-worker"].job_id).status == jobs.FAILED
    assert jobs.read(made["running"].job_id).status == jobs.RUNNING
    assert jobs.prune() == []


def _admin_types() -> list[str]:
    from linpodx.paths import admin_log

    log = Path(admin_log())
    if not log.exists():
        return []
    return [json.loads(line)["type"] for line in log.read_text().splitlines() if line]


@pytest.mark.parametrize("fail_at", ["stage", "log", "audit", None])
def test_create_is_recorded_only_with_its_job_and_never_without(
    fail_at: str | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`snapshot create` on a full or read-only state dir: either the command fails before its
    `snapshot.create` record and leaves no job file or log, or the record and the job file both
    exist. (The job file used to be written after the record: on a full disk the log then named
    a job that did not exist.)"""
    import errno

    from linpodx.audit.chain import Chain
    from linpodx.errors import AuditError
    from linpodx.snapshot import service
    from linpodx.snapshot.names import jobs_dir

    def full(*_a: object, **_k: object) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(service, "require_managed", lambda name: {"Id": "c" * 64})
    monkeypatch.setattr(service, "_exists", lambda name, label: False)
    spawned: list[jobs.Job] = []
    monkeypatch.setattr(service, "_spawn", lambda job, fd, argv: spawned.append(job) or job)
    if fail_at == "stage":
        monkeypatch.setattr(jobs, "stage", full)
    elif fail_at == "log":
        monkeypatch.setattr(service, "_open_log", full)
    elif fail_at == "audit":
        def refuse(*_a: object, **_k: object) -> None:
            raise AuditError("the audit log could not be written")

        monkeypatch.setattr(Chain, "append", refuse)

    if fail_at is None:
        job = service.start_create("box", "before")
        assert _admin_types() == ["snapshot.create"]
        assert jobs.read(job.job_id).status == jobs.QUEUED
        assert spawned == [job]
        return
    with pytest.raises((OSError, AuditError)):
        service.start_create("box", "before")
    assert "snapshot.create" not in _admin_types()
    assert spawned == []
    left = sorted(p.name for p in jobs_dir().iterdir()) if jobs_dir().exists() else []
    assert left == [], left


def test_create_says_so_when_its_recorded_job_could_not_be_put_in_place(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """After the record only the rename is left; if even that fails, the error says the job
    was recorded and not taken (not a generic state dir error), and no worker starts."""
    import errno

    from linpodx.errors import LinpodxError
    from linpodx.fsutil import Staged
    from linpodx.snapshot import service

    monkeypatch.setattr(service, "require_managed", lambda name: {"Id": "c" * 64})
    monkeypatch.setattr(service, "_exists", lambda name, label: False)
    spawned: list[object] = []
    monkeypatch.setattr(service, "_spawn", lambda job, fd, argv: spawned.append(job) or job)

    def cannot(self: Staged) -> None:
        raise OSError(errno.EIO, "Input/output error")

    monkeypatch.setattr(Staged, "commit", cannot)
    with pytest.raises(LinpodxError) as ei:
        service.start_create("box", "before")
    assert "was recorded, but its job file could not be put in place" in ei.value.message
    assert ei.value.exit_code == 6 and "no snapshot was taken" in (ei.value.hint or "")
    assert _admin_types() == ["snapshot.create"] and spawned == []


def test_rm_of_an_unknown_snapshot_leaves_no_lock_file(  # type: ignore[no-untyped-def]
    cli, monkeypatch: pytest.MonkeyPatch
) -> None:
    from linpodx import paths
    from linpodx.snapshot import service

    monkeypatch.setattr(service, "image_id", lambda ref: None)
    r = cli("snapshot", "rm", "never-had-one", "--label", "x")
    assert r.exit_code == 4 and "snapshot not found: never-had-one, label x" in r.stderr
    locks = paths.snapshots_dir() / ".locks"
    assert not (locks / "never-had-one.lock").exists()


def _acl(*entries: tuple[int, int, int]) -> bytes:
    import struct

    return struct.pack("<I", 2) + b"".join(struct.pack("<HHI", *e) for e in entries)


@pytest.mark.skipif(os.geteuid() != 0, reason="security.capability needs root")
def test_archive_and_restore_keep_acls_and_xattrs_but_no_capabilities(tmp_path: Path) -> None:
    """A rollback puts back POSIX ACLs and other xattrs, not just modes; the archive keeps a
    file capability, but the restore leaves it out (no privilege comes back, setuid/setgid
    bits and device nodes neither: docs/containers.md)."""
    import struct

    src = tmp_path / "ws"
    src.mkdir()
    f = src / "acl.txt"
    f.write_text("data")
    # u::rw- u:65534:rw- g::r-- m::rw- o::r--  (the mask is what grants the named user write)
    acl = _acl((1, 6, 0xFFFFFFFF), (2, 6, 65534), (4, 4, 0xFFFFFFFF), (0x10, 6, 0xFFFFFFFF),
               (0x20, 4, 0xFFFFFFFF))
    os.setxattr(f, "system.posix_acl_access", acl)
    b = src / "capbin"
    b.write_bytes(b"\x7fELF")
    b.chmod(0o755)
    cap = struct.pack("<IIIII", 0x02000001, 1 << 13, 0, 0, 0)  # cap_net_raw+ep
    os.setxattr(b, "security.capability", cap)
    os.setxattr(b, "user.note", b"kept")
    (src / "suid").write_bytes(b"\x7fELF")
    (src / "suid").chmod(0o6755)
    (src / "sgid-dir").mkdir()
    (src / "sgid-dir").chmod(0o3775)
    os.mknod(src / "null", stat.S_IFCHR | 0o666, os.makedev(1, 3))
    out = tmp_path / "a.tar"
    entry = workspace.archive(workspace.WritableMount(str(src), "/ws"), out)
    with tarfile.open(out) as tar:
        archived = {m.name.removeprefix("./"): m for m in tar.getmembers()}
    assert archived["suid"].mode & 0o6000 and archived["null"].ischr()
    r = workspace.Restore({**entry, "source": str(src)}, "RB2")
    r.extract(out)
    assert os.getxattr(r.restored / "acl.txt", "system.posix_acl_access") == acl
    assert "security.capability" not in os.listxattr(r.restored / "capbin")
    assert os.getxattr(r.restored / "capbin", "user.note") == b"kept"
    assert (r.restored / "suid").stat().st_mode & 0o7777 == 0o755
    assert (r.restored / "sgid-dir").stat().st_mode & 0o7777 == 0o1775  # the sticky bit stays
    assert not os.path.lexists(r.restored / "null")
    assert (r.restored / "acl.txt").stat().st_mode & 0o070 == f.stat().st_mode & 0o070


def test_a_restore_keeps_its_staging_private_until_the_swap(tmp_path: Path) -> None:
    """tar gives the directory it extracts into the archive's mode for `.`; if that were the
    staging dir, a host user could reach (and run) a setuid-root member between tar and the
    clean-up of its bits. The staging dir stays 0700 and the content keeps its own mode."""
    src = tmp_path / "ws"
    src.mkdir()
    src.chmod(0o755)
    (src / "suid").write_bytes(b"\x7fELF")
    (src / "suid").chmod(0o4755)
    out = tmp_path / "a.tar"
    entry = workspace.archive(workspace.WritableMount(str(src), "/ws"), out)
    r = workspace.Restore({**entry, "source": str(src)}, "RB3")
    r.extract(out)
    assert r.staging.stat().st_mode & 0o777 == 0o700
    assert r.restored.stat().st_mode & 0o7777 == 0o755
    assert (r.restored / "suid").stat().st_mode & 0o7777 == 0o755
    r.swap()
    assert src.stat().st_mode & 0o7777 == 0o755 and (src / "suid").read_bytes() == b"\x7fELF"
    assert r.cleanup() == [] and not r.staging.exists()


def _raw_job(**fields: object) -> dict[str, object]:
    doc = _job(status=jobs.RUNNING, step="thaw", freeze="pause").to_dict()
    doc.update(fields)
    return doc


@pytest.mark.parametrize(
    "fields",
    [
        {"container": "../../victim", "image": "localhost/linpodx/snapshot/../../victim:l1"},
        {"container": "victim", "image": names.image_ref("victim", "l1"),
         "job_id": "snap-01J0000000000000000000000Y"},
        {"label": "../x"},
        {"image": "localhost/other:tag"},
        {"created": 123},
        {"error": 5},
        {"started": 1},
        {"worker_pid": "abc"},
        {"worker_pid": True},
        {"worker_start": -1},
        {"image_id": "--all"},
        {"freeze": "thaw-everything"},
        {"held": [[1, "x"]]},
        {"status": "sleeping"},
        {"step": "../x"},
        {"replace": "yes"},
        {"surprise": 1},
        {"kind": "delete"},
    ],
)
def test_a_tampered_job_file_is_damage_and_nothing_is_done(
    cli, fields: dict[str, object], tmp_path: Path  # type: ignore[no-untyped-def]
) -> None:
    """job-status acts on what a dead worker's job names (unpause, rmi, remove temp files):
    a job file linpodx would not have written is reported damaged and acted on in no way."""
    from linpodx.paths import snapshots_dir

    dead, _ = _dead_pid()
    doc = _raw_job(**{"worker_pid": dead, "worker_start": 1, **fields})
    p = names.job_file("snap-01J0000000000000000000000Z")
    p.parent.mkdir(parents=True)
    p.write_text(json.dumps(doc))
    victim = snapshots_dir().parent / "victim" / ".tmp-snap-01J0000000000000000000000Z"
    victim.mkdir(parents=True)
    before = sorted(str(x) for x in snapshots_dir().rglob("*"))
    r = cli("snapshot", "job-status", "snap-01J0000000000000000000000Z")
    assert r.exit_code != 0 and r.exit_code != 70, r
    assert "error: snapshot job file is damaged" in r.stderr and "hint:" in r.stderr
    assert victim.is_dir()
    assert sorted(str(x) for x in snapshots_dir().rglob("*")) == before
    assert json.loads(p.read_text()) == doc  # not rewritten either


def _dead_pid() -> tuple[int, int | None]:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    pid, start = jobs.pid_info(child.pid)
    child.wait()
    return pid, start


def _no_hang(seconds: int = 5) -> object:
    import contextlib
    import signal

    @contextlib.contextmanager
    def guard():  # type: ignore[no-untyped-def]
        def alarm(*_a: object) -> None:
            raise TimeoutError("hung")

        old = signal.signal(signal.SIGALRM, alarm)
        signal.alarm(seconds)
        try:
            yield
        finally:
            signal.alarm(0)
            signal.signal(signal.SIGALRM, old)

    return guard()


def test_a_fifo_for_a_job_file_or_manifest_is_damage_not_a_hang(cli) -> None:  # type: ignore[no-untyped-def]
    p = names.job_file("snap-01J0000000000000000000000Z")
    p.parent.mkdir(parents=True)
    os.mkfifo(p)
    sdir = names.snapshot_dir("c1", "l1")
    sdir.mkdir(parents=True)
    os.mkfifo(sdir / manifest.MANIFEST)
    with _no_hang():  # type: ignore[attr-defined]
        r = cli("snapshot", "job-status", "snap-01J0000000000000000000000Z")
        assert r.exit_code not in (0, 70) and "damaged" in r.stderr and "hint:" in r.stderr
        r = cli("snapshot", "list")
        assert r.exit_code == 0 and "damaged" in r.stdout
        with pytest.raises(Exception, match="damaged"):
            manifest.read("c1", "l1")


def test_no_go_byte_when_the_worker_could_not_be_recorded(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The job-file write that records the worker fails (ENOSPC): the CLI says so and the
    worker must not take the snapshot anyway; the job ends failed, never succeeded."""
    import errno

    from linpodx.errors import LinpodxError
    from linpodx.snapshot import service
    from linpodx.snapshot.names import job_log

    job = _job()
    jobs.write(job)
    real = jobs.write
    calls: list[jobs.Job] = []

    def full_once(j: jobs.Job) -> None:
        calls.append(j)
        if j.worker_pid is not None and len(calls) == 1:
            raise OSError(errno.ENOSPC, "No space left on device")
        real(j)

    monkeypatch.setattr(jobs, "write", full_once)
    fd = os.open(job_log(job.job_id), os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        with pytest.raises(LinpodxError) as ei:
            service._spawn(job, fd)
    finally:
        os.close(fd)
    assert "could not record the worker" in ei.value.message
    assert "no snapshot was taken" in (ei.value.hint or "")
    time.sleep(0.5)  # a worker that got the go byte would be at work by now
    after = jobs.read(job.job_id)
    assert after.status == jobs.FAILED and after.started is None, after
    assert "could not record the worker" in (after.error or "")


def test_every_field_linpodx_writes_reads_back() -> None:
    job = _job(status=jobs.SUCCEEDED, step="done", freeze="none", worker_pid=12, worker_start=34,
               image_id="a" * 64, started=jobs.now_iso(), finished=jobs.now_iso(),
               archives=[{"target": "/ws"}], held=[[5, 6]], recovered=True, replace=True,
               error="e", hint="h")
    jobs.write(job)
    assert jobs.read(job.job_id) == job


def _dead_job_holding_the_container() -> jobs.Job:
    dead, _ = _dead_pid()
    job = _job(status=jobs.RUNNING, step="archive", freeze="pause", worker_pid=dead,
               worker_start=1)
    jobs.write(job)
    return job


def test_a_dead_jobs_cleanup_is_not_marked_done_while_the_lock_is_busy(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """job-status of a dead job while another operation holds the container: nothing is
    cleaned, so the job must not say it was; the next look (lock free) lets the container go."""
    from linpodx.snapshot import freeze, service
    from linpodx.snapshot.lock import container_lock

    released: list[str] = []
    monkeypatch.setattr(freeze, "release",
                        lambda name, method, held: released.append(name) or ["unpaused"])
    job = _dead_job_holding_the_container()
    with container_lock("c1"):
        view = service.job_status(job.job_id)
    assert view["status"] == jobs.FAILED and "cleanup not finished" in view["error"]
    assert released == [] and jobs.read(job.job_id).recovered is False
    view = service.job_status(job.job_id)
    assert released == ["c1"] and "cleaned up: unpaused" in view["error"]
    assert jobs.read(job.job_id).recovered is True
    service.job_status(job.job_id)
    assert released == ["c1"]  # once


def test_the_next_jobs_worker_lets_go_a_container_a_dead_job_held(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from linpodx.snapshot import freeze, worker

    released: list[str] = []
    monkeypatch.setattr(freeze, "release",
                        lambda name, method, held: released.append(name) or ["unpaused"])
    job = _dead_job_holding_the_container()
    worker._clean_dead_jobs("other", "snap-01J0000000000000000000000Y")
    assert released == []  # another container's job is not this worker's business
    worker._clean_dead_jobs("c1", "snap-01J0000000000000000000000Y")
    assert released == ["c1"]
    after = jobs.read(job.job_id)
    assert after.status == jobs.FAILED and after.recovered is True


def test_shared_with_finds_the_same_inner_and_outer_sources(tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    (ws / "sub").mkdir(parents=True)
    ours = [workspace.WritableMount(str(ws), "/workspace")]

    def other(name: str, src: Path, *, rw: bool = True, running: bool = True) -> dict[str, object]:
        return {"Id": name * 8, "Name": name, "State": {"Running": running},
                "Mounts": [{"Type": "bind", "Source": str(src), "Destination": "/x", "RW": rw}]}

    others = [other("same", ws), other("inner", ws / "sub"), other("outer", tmp_path),
              other("apart", tmp_path / "elsewhere"), other("self", ws) | {"Id": "me"},
              other("ro", ws, rw=False), other("stopped", ws, running=False)]
    found = workspace.shared_with(ours, "me", others)
    assert [f.split()[1] for f in found] == ["same", "inner", "outer", "ro", "stopped"]
    writers = workspace.shared_with(ours, "me", others, writers_only=True)
    assert [f.split()[1] for f in writers] == ["same", "inner", "outer"]
    # A link to the workspace is the workspace.
    (tmp_path / "link").symlink_to(ws)
    assert workspace.shared_with(ours, "me", [other("via-link", tmp_path / "link")])


def _info_with(*mounts: tuple[Path, str]) -> dict[str, object]:
    return {"Id": "c" * 64, "Config": {"Labels": {"linpodx.managed": "1"}},
            "Mounts": [{"Type": "bind", "Source": str(s), "Destination": t, "RW": True}
                       for s, t in mounts]}


@pytest.mark.parametrize("layout", ["nested", "same"])
def test_overlapping_writable_mounts_are_refused_by_create_and_rollback(
    layout: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """ws at /workspace and ws/sub at /workspace/sub (or ws at two targets): every rollback
    failed and left a staging copy in the live workspace. Refused before anything is done."""
    from linpodx.snapshot import rollback, service

    ws = tmp_path / "ws"
    (ws / "sub").mkdir(parents=True)
    second = ws / "sub" if layout == "nested" else ws
    info = _info_with((ws, "/workspace"), (second, "/w2"))
    monkeypatch.setattr(service, "require_managed", lambda name: info)
    monkeypatch.setattr(service, "_exists", lambda name, label: False)
    monkeypatch.setattr(workspace, "other_containers", lambda own: [])
    with pytest.raises(InvalidInput) as ei:
        service.start_create("box", "s1")
    assert "cannot snapshot box: its writable mounts /w2" in ei.value.message
    assert ("same source" if layout == "same" else "overlap") in ei.value.message
    man = {"image": names.image_ref("box", "s1"), "image_id": "a" * 64,
           "mounts": [{"source": str(ws), "target": "/workspace", "kind": "dir"},
                      {"source": str(second), "target": "/w2", "kind": "dir"}]}
    monkeypatch.setattr(rollback, "_verify_snapshot", lambda name, label: man)
    monkeypatch.setattr(rollback, "require_managed", lambda name: info)
    with pytest.raises(InvalidInput) as ei:
        rollback.rollback("box", "s1")
    assert "cannot roll back box: its writable mounts" in ei.value.message
    assert _admin_types() == []
    assert sorted(p.name for p in tmp_path.iterdir()) == ["home", "ws"]


def test_the_worker_snapshots_only_the_container_that_was_checked_and_audited(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """`snapshot create` during a rollback: the CLI checked and audited the original, the
    worker (after the rollback let the lock go) found the recreated one under the name. The
    job must fail rather than snapshot a container nobody audited."""
    from linpodx.snapshot import service, worker

    monkeypatch.setattr(service, "require_managed",
                        lambda name: {"Id": "a" * 64, "Config": {"Labels": {}}})
    monkeypatch.setattr(service, "_exists", lambda name, label: False)
    monkeypatch.setattr(service, "_spawn", lambda job, fd, argv: job)
    job = service.start_create("box", "s1")
    assert jobs.read(job.job_id).container_id == "a" * 64
    from linpodx.paths import admin_log

    rec = json.loads(Path(admin_log()).read_text().splitlines()[-1])
    assert rec["data"]["container_id"] == "a" * 64
    monkeypatch.setattr(worker, "require_managed",
                        lambda name: {"Id": "b" * 64, "Config": {"Labels": {}}, "Mounts": []})
    assert worker.run_create(job.job_id) == 1
    after = jobs.read(job.job_id)
    assert after.status == jobs.FAILED and after.image_id is None
    assert "no longer the container this snapshot was requested for" in (after.error or "")


def test_a_full_disk_while_the_manifest_is_written_is_said_as_such(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """ENOSPC at the manifest: the job fails with a disk-space hint, not `this is a bug`."""
    import contextlib
    import errno

    from linpodx.snapshot import freeze, worker

    job = _job(container_id="a" * 64)
    jobs.write(job)
    monkeypatch.setattr(worker, "require_managed",
                        lambda name: {"Id": "a" * 64, "Config": {"Labels": {}}, "Mounts": []})
    monkeypatch.setattr(workspace, "other_containers", lambda own: [])

    @contextlib.contextmanager
    def still(*_a: object, **_k: object):  # type: ignore[no-untyped-def]
        yield "none"

    monkeypatch.setattr(freeze, "frozen", still)
    # (The size and restorability checks run real podman; this test is about the manifest.)
    monkeypatch.setattr(worker, "_check", lambda *_a: None)
    ran: list[list[str]] = []

    def fake_run(argv: list[str], **_k: object) -> object:
        ran.append(list(argv))
        from linpodx.proc import Result

        return Result(tuple(argv), 0, "b" * 64 + "\n", "")

    monkeypatch.setattr(proc, "run", fake_run)  # what the engine verbs run
    monkeypatch.setattr(worker, "image_id", lambda ref: "b" * 64)

    def full(*_a: object, **_k: object) -> None:
        raise OSError(errno.ENOSPC, "No space left on device", "/state/manifest.json")

    monkeypatch.setattr(worker.manifest, "write", full)
    assert worker.run_create(job.job_id) == 1
    after = jobs.read(job.job_id)
    assert after.status == jobs.FAILED
    assert "No space left on device" in (after.error or "") and "bug" not in (after.hint or "")
    assert "free disk space" in (after.hint or "")
    assert ["podman", "rmi", "b" * 64] in ran  # the untagged commit went


def test_a_paused_container_is_not_rolled_back(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Paused is neither running nor stopped: the rolled-back container used to end exited.
    Refused before anything changes, with the two ways on."""
    from linpodx.snapshot import rollback

    man = {"image": names.image_ref("box", "s1"), "image_id": "a" * 64, "mounts": []}
    monkeypatch.setattr(rollback, "_verify_snapshot", lambda name, label: man)
    monkeypatch.setattr(rollback, "require_managed", lambda name: {
        "Id": "c" * 64, "State": {"Status": "paused", "Running": False, "Paused": True},
        "Config": {"Labels": {"linpodx.managed": "1"}}, "Mounts": []})
    with pytest.raises(InvalidInput) as ei:
        rollback.rollback("box", "s1")
    assert ei.value.message == "box is paused"
    hint = ei.value.hint or ""
    assert "podman unpause box" in hint and "linpodx stop box" in hint
    assert _admin_types() == []


def _manifest(container: str, label: str, image: str | None = None) -> None:
    d = names.snapshot_dir(container, label)
    d.mkdir(parents=True)
    manifest.write(
        d,
        {
            "schema": 1,
            "container": container,
            "label": label,
            "image": names.image_ref(container, label) if image is None else image,
            "image_id": "sha256:" + "0" * 64,
            "created": "2026-01-01T00:00:00Z",
            "mounts": [{"target": "/w"}],
        },
    )


def test_cli_list_shows_the_good_snapshots_beside_a_damaged_one(  # type: ignore[no-untyped-def]
    cli, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A manifest naming an image that is not its own (podman refused it: `podman image
    inspect failed`, no hint, exit 5) no longer hides the others; each row that cannot be
    read says why and what to do, and a podman failure on one image is that row's."""
    from linpodx.snapshot import service

    def image_id(ref: str) -> str | None:
        if ref.endswith(":broken"):
            raise EngineError("podman image inspect failed", stderr="boom")
        return None if ref.endswith(":gone") else "sha256:" + "0" * 64

    monkeypatch.setattr(service, "image_id", image_id)
    _manifest("agent", "good")
    _manifest("agent", "gone")
    _manifest("agent", "forged", image="BAD::REF!!\x1b[2J")
    _manifest("agent", "broken")
    junk = names.snapshot_dir("agent", "junk")
    junk.mkdir()
    (junk / manifest.MANIFEST).write_text("{not json")
    r = cli("snapshot", "list")
    assert r.exit_code == 0, r.stderr
    states = {line.split()[1]: line.split()[3] for line in r.stdout.splitlines()[1:]}
    assert states == {
        "broken": "unknown", "forged": "damaged", "gone": "image", "good": "ok", "junk": "damaged"
    }
    assert "\x1b" not in r.stderr
    assert r.stderr.count("warning: snapshot agent --label ") == 3
    assert "hint: remove the snapshot with `linpodx snapshot rm agent --label forged`" in r.stderr
    r = cli("snapshot", "list", "--json")
    rows = {row["label"]: row for row in json.loads(r.stdout)["result"]["snapshots"]}
    assert rows["good"]["state"] == "ok" and rows["gone"]["state"] == "image missing"
    for label in ("broken", "forged", "junk"):
        assert rows[label]["error"] and rows[label]["hint"], rows[label]
    assert "podman" in rows["broken"]["hint"] and "snapshot rm" in rows["junk"]["hint"]


def test_container_names_follow_the_rule_and_message_of_every_other_command(
    cli,  # type: ignore[no-untyped-def]
) -> None:
    """`snapshot create` said "1-253 characters" where every other command says (and does)
    1-63: a linpodx container never has a longer name."""
    assert names.check_container_name("a" * 63) == "a" * 63
    r = cli("snapshot", "create", "a" * 64, "--label", "x")
    assert r.exit_code == 3 and "hint: use 1-63 characters" in r.stderr, r.stderr
    assert "253" not in r.stderr


def test_rm_of_a_snapshot_whose_image_podman_deleted_while_failing_succeeds(  # type: ignore[no-untyped-def]
    cli, monkeypatch: pytest.MonkeyPatch
) -> None:
    """After snapshot, rollback, snapshot: `podman rmi` of the newer image deletes it and then
    fails on its parent, which the rolled-back container uses. linpodx went on to untag the
    deleted id, failed (exit 5) and left the snapshot's directory behind. The image is gone:
    the snapshot is removed, and `image_deleted` says so."""
    from types import SimpleNamespace

    from linpodx.snapshot import service
    from linpodx.snapshot.names import snapshot_dir

    snapshot_dir("box", "l2").mkdir(parents=True)
    images = {"localhost/linpodx/snapshot/box:l2": "c" * 64, "c" * 64: "c" * 64}
    ran: list[list[str]] = []
    real_run = proc.run

    def run(argv: list[str], **kw: Any) -> Any:
        if argv[0] != "podman":
            return real_run(argv, **kw)  # (the tree removal's own tools)
        ran.append(argv)
        if argv[:2] == ["podman", "rmi"]:
            images.clear()  # deleted, then podman failed on the parent
            return SimpleNamespace(returncode=2, stderr="image is in use by a container")
        raise AssertionError(f"unexpected podman call: {argv}")

    monkeypatch.setattr(service, "image_id", lambda ref: images.get(ref))
    monkeypatch.setattr(proc, "run", run)  # what the engine verbs run
    r = cli("snapshot", "rm", "box", "--label", "l2", "--json")
    assert r.exit_code == 0, r.stderr
    assert json.loads(r.stdout)["result"]["image_deleted"] is True
    assert not snapshot_dir("box", "l2").exists()
    assert [a[:2] for a in ran] == [["podman", "rmi"]]


def test_a_signal_freeze_is_refused_unless_asked_for(monkeypatch: pytest.MonkeyPatch) -> None:
    """Signals cannot guarantee one point in time (a process can have itself continued), so
    `frozen` uses them only when told (`--consistency best-effort`)."""
    from linpodx.errors import EngineError
    from linpodx.snapshot import freeze

    monkeypatch.setattr(freeze, "_state", lambda name: ("running", 4242))
    with pytest.raises(EngineError) as err, freeze.frozen("c1", method=freeze.SIGSTOP_METHOD):
        pass
    assert "no cgroup freezer" in err.value.message
    assert "--consistency stop" in (err.value.hint or "")
