"""Snapshots and rollback on real podman (root and rootless): the walk-through's promises.

Each test runs its own linpodx container (unique name) under a profile with one writable and
one read-only mount, and removes the container, the snapshot images and the aside copies it
made. Tests go through the CLI (in-process, `cli` fixture) as a person would; the create
worker is a real detached process.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from linpodx.errors import EXIT_CONFLICT
from linpodx.snapshot import jobs
from linpodx.snapshot.freeze import can_freeze
from linpodx.snapshot.names import image_ref, snapshot_dir
from tests import faultinject
from tests.conftest import BUSYBOX_IMAGE, DEBIAN_IMAGE, ROOTLESS, CliResult
from tests.servers.dns_upstream import DnsUpstream

pytestmark = pytest.mark.podman

Cli = Callable[..., CliResult]
# The container's "agent": ends on SIGTERM within a second (a bare `sleep` as PID 1 ignores
# SIGTERM, and every rollback would wait out the stop grace).
AGENT_CMD = ("sh", "-c", "trap 'exit 0' TERM; while :; do sleep 1; done")
# Where there is no cgroup freezer (rootless on cgroup v1) a running container is snapshotted
# only when asked to be held by signals; these tests are about everything else.
HELD: tuple[str, ...] = () if can_freeze() else ("--consistency", "best-effort")


def podman(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    r = subprocess.run(["podman", *args], capture_output=True, text=True, timeout=120)
    if check:
        assert r.returncode == 0, f"podman {' '.join(args)}: {r.stderr.strip()}"
    return r


def inspect(name: str) -> dict[str, object]:
    data = json.loads(podman("container", "inspect", name).stdout)
    assert isinstance(data, list) and len(data) == 1
    return data[0]  # type: ignore[no-any-return]


def ok(r: CliResult) -> CliResult:
    assert r.exit_code == 0, f"exit {r.exit_code}\nstdout: {r.stdout}\nstderr: {r.stderr}"
    return r


def result(r: CliResult) -> dict[str, object]:
    doc = json.loads(ok(r).stdout)
    assert doc["ok"] is True
    return doc["result"]  # type: ignore[no-any-return]


def audit_types() -> list[str]:
    from linpodx.audit.chain import admin_chain, read_records

    return [rec.type for rec in read_records(admin_chain().path)]


def event_types() -> list[str]:
    from linpodx import paths

    f = paths.events_file()
    if not f.exists():
        return []
    return [json.loads(line)["type"] for line in f.read_text().splitlines() if line]


@pytest.fixture(autouse=True)
def rootless_storage_conf(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Rootless podman 4.3 `podman commit` needs `runroot` and `graphroot` in a storage.conf
    given by CONTAINERS_STORAGE_CONF ("runroot must be set"), although every other command
    works with `rootless_storage_path` alone. If the test host's file lacks them, point the
    tests at a copy that names the same store explicitly (the same images and containers)."""
    conf = os.environ.get("CONTAINERS_STORAGE_CONF", "")
    if not ROOTLESS or not conf or not os.path.isfile(conf):
        return
    text = Path(conf).read_text()
    if "runroot" in text and "graphroot" in text:
        return
    info = podman("info", "--format", "{{.Store.GraphRoot}}\t{{.Store.RunRoot}}\t"
                  "{{.Store.GraphDriverName}}").stdout.strip().split("\t")
    graph, run, driver = info
    fixed = tmp_path / "storage.conf"
    fixed.write_text(
        f'[storage]\ndriver = "{driver}"\ngraphroot = "{graph}"\nrunroot = "{run}"\n'
        f'rootless_storage_path = "{graph}"\n'
    )
    monkeypatch.setenv("CONTAINERS_STORAGE_CONF", str(fixed))


@dataclass
class Box:
    """A running linpodx container with a writable workspace and a read-only mount."""

    name: str
    ws: Path
    ro: Path
    cli: Cli
    profile: str

    def sh(self, script: str) -> str:
        return podman("exec", self.name, "sh", "-c", script).stdout

    def snapshot(self, label: str, *extra: str) -> dict[str, object]:
        return result(self.cli("snapshot", "create", *HELD, self.name, "--label", label, "--wait",
                               "--json", *extra))


def make_box(cli: Cli, name: str, tmp_path: Path, *, image: str = BUSYBOX_IMAGE,
             network: str = "  egress_dns_allowlist: []\n", resources: str = "",
             command: tuple[str, ...] = AGENT_CMD, run_args: tuple[str, ...] = ()) -> Box:
    """Apply a profile with a writable and a read-only mount and run a container under it."""
    ws = tmp_path / "work" / "ws"
    ro = tmp_path / "work" / "ro"
    ws.mkdir(parents=True)
    ro.mkdir()
    (ws / "f.txt").write_text("v1\n")
    (ws / "f.txt").chmod(0o640)
    (ws / "sub").mkdir()
    (ws / "sub" / "deep.txt").write_text("deep\n")
    (ro / "readme").write_text("ro\n")
    profile = f"snap-{name[-10:]}"
    pfile = tmp_path / "profile.yaml"
    pfile.write_text(
        f"name: {profile}\n"
        "description: snapshot test\n"
        "mounts:\n"
        f"  - source: {ws}\n"
        "    target: /ws\n"
        "    read_only: false\n"
        f"  - source: {ro}\n"
        "    target: /ro\n"
        "network:\n"
        f"{network}"
        "mcp_policy:\n"
        "  - method: '*'\n"
        "    decision: deny\n"
        "audit:\n"
        "  hash_chain: true\n"
        + (f"resources:\n{resources}" if resources else "")
    )
    ok(cli("sandbox", "apply", "--profile", str(pfile)))
    ok(cli("run", "--profile", profile, "--image", image, "--name", name,
           "--detach", *run_args, "--", *command))
    return Box(name, ws, ro, cli, profile)


def cleanup(name: str, tmp_path: Path) -> None:
    """Remove what a test made: containers named after ours, our snapshot images, the
    workspace (rootless: sub-uid files need the user namespace to go)."""
    for line in podman("ps", "-a", "--format", "{{.Names}}").stdout.split():
        if line.startswith(name):
            podman("rm", "-f", "-t", "0", line, check=False)
    prefix = f"localhost/linpodx/snapshot/{name}:"
    for _ in range(5):  # podman may still hold a lock from the container just removed
        # podman 4.3's `images` fails outright ("image not known") when another image is
        # removed while it lists (a worker cleaning up its untagged commit): list again.
        listed = podman("images", "--format", "{{.Repository}}:{{.Tag}}", check=False)
        if listed.returncode != 0:
            time.sleep(0.5)
            continue
        refs = [r for r in listed.stdout.split() if r.startswith(prefix)]
        if not refs:
            break
        for ref in refs:
            podman("rmi", "-f", ref, check=False)
    if os.geteuid() != 0:
        podman("unshare", "rm", "-rf", str(tmp_path / "work"), check=False)


@pytest.fixture
def box(cli: Cli, unique_name: str, tmp_path: Path) -> Iterator[Box]:
    try:
        yield make_box(cli, unique_name, tmp_path)
    finally:
        cleanup(unique_name, tmp_path)


def test_create_prints_job_id_at_once_then_job_status_succeeds(box: Box) -> None:
    box.sh("echo hello > /ws/from-container")
    r = result(box.cli("snapshot", "create", *HELD, box.name, "--label", "before-refactor",
                       "--json"))
    job_id = str(r["job_id"])
    assert job_id.startswith("snap-") and r["status"] == jobs.QUEUED
    deadline = time.monotonic() + 120
    while True:
        st = result(box.cli("snapshot", "job-status", job_id, "--json"))
        if st["status"] in jobs.FINISHED or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert st["status"] == jobs.SUCCEEDED, st
    assert st["image"] == image_ref(box.name, "before-refactor")
    assert st["started"] and st["finished"] and st["duration"]
    # The human form the walk-through shows.
    human = ok(box.cli("snapshot", "job-status", job_id)).stdout
    assert "status:  succeeded" in human
    assert f"image:   localhost/linpodx/snapshot/{box.name}:before-refactor" in human
    # The image really exists and only the writable mount was archived.
    iid = podman("image", "inspect", "--format", "{{.Id}}", str(st["image"])).stdout.strip()
    assert iid == st["image_id"]
    man = json.loads((snapshot_dir(box.name, "before-refactor") / "manifest.json").read_text())
    assert [m["target"] for m in man["mounts"]] == ["/ws"]
    assert man["profile_labels"]["linpodx.profile"] == box.profile
    listed = result(box.cli("snapshot", "list", box.name, "--json"))
    assert [(x["label"], x["state"]) for x in listed["snapshots"]] == [("before-refactor", "ok")]
    # The container runs again after the commit (unpaused / continued).
    assert inspect(box.name)["State"]["Status"] == "running"  # type: ignore[index]
    assert "snapshot.create" in audit_types() and "snapshot.create" in event_types()


def test_rollback_restores_rootfs_workspace_and_profile_revision(box: Box) -> None:
    from linpodx import containers

    box.snapshot("before")
    before = inspect(box.name)
    labels_before = before["Config"]["Labels"]  # type: ignore[index]
    egress_before = containers.egress_status(box.name)
    # The agent's "destructive refactor": a new file in its rootfs, a changed and a new file in
    # the workspace, a changed mode, a deleted directory.
    box.sh("echo junk > /tmp/created-after; echo v2 > /ws/f.txt; chmod 666 /ws/f.txt;"
           " echo new > /ws/new.txt; rm -r /ws/sub")
    assert (box.ws / "f.txt").read_text() == "v2\n"
    r = result(box.cli("snapshot", "rollback", box.name, "--to", "before", "--json"))
    assert r["rolled_back"] is True
    after = inspect(box.name)
    assert after["Id"] != before["Id"]
    assert (r["container_id"], r["previous_id"]) == (after["Id"], before["Id"])  # whole ids
    assert r["revision"] == int(labels_before["linpodx.revision"])
    assert after["State"]["Status"] == "running"  # type: ignore[index]
    assert box.sh("ls /tmp").split().count("created-after") == 0
    assert (box.ws / "f.txt").read_text() == "v1\n"
    assert (box.ws / "f.txt").stat().st_mode & 0o777 == 0o640
    assert not (box.ws / "new.txt").exists()
    assert (box.ws / "sub" / "deep.txt").read_text() == "deep\n"
    # The container sees the restored workspace (its bind mount is the restored directory).
    assert box.sh("cat /ws/f.txt") == "v1\n"
    assert box.sh("cat /ro/readme") == "ro\n"
    # Same profile revision, same labels, same egress guard state.
    labels_after = after["Config"]["Labels"]  # type: ignore[index]
    for k in ("linpodx.managed", "linpodx.profile", "linpodx.profile_id", "linpodx.revision",
              "linpodx.audit_hash"):
        assert labels_after[k] == labels_before[k], k  # type: ignore[index]
    assert containers.egress_status(box.name) == egress_before
    # Mount modes kept: /ro still refuses writes.
    w = podman("exec", box.name, "sh", "-c", "echo x > /ro/x", check=False)
    assert w.returncode != 0
    # Nothing left over: no aside container, no staging or moved-aside workspace copies.
    names = podman("ps", "-a", "--format", "{{.Names}}").stdout.split()
    assert [n for n in names if n.startswith(box.name)] == [box.name]
    assert [p.name for p in box.ws.parent.iterdir() if ".linpodx-" in p.name] == []
    assert "snapshot.rollback" in audit_types() and "snapshot.rollback" in event_types()


def test_rollback_unknown_label_fails_and_changes_nothing(box: Box) -> None:
    box.snapshot("known")
    (box.ws / "f.txt").write_text("edited\n")
    before = inspect(box.name)
    r = box.cli("snapshot", "rollback", box.name, "--to", "unknown")
    assert r.exit_code == 4
    assert f"snapshot not found: {box.name}, label unknown" in r.stderr
    assert "hint:" in r.stderr
    after = inspect(box.name)
    assert after["Id"] == before["Id"]
    assert after["State"]["StartedAt"] == before["State"]["StartedAt"]  # type: ignore[index]
    assert (box.ws / "f.txt").read_text() == "edited\n"
    assert "snapshot.rollback" not in audit_types()


def test_injected_failure_at_each_step_leaves_the_original_intact(
    box: Box, monkeypatch: pytest.MonkeyPatch
) -> None:
    from linpodx import paths

    box.snapshot("s1")
    box.sh("echo v2 > /ws/f.txt; echo after > /tmp/after")
    spec = paths.containers_dir() / box.name / "spec.json"
    spec_before = spec.read_bytes()
    for step in faultinject.ROLLBACK_STEPS:
        before = inspect(box.name)
        with faultinject.injecting(step):
            r = box.cli("snapshot", "rollback", box.name, "--to", "s1")
        assert r.exit_code != 0, step
        assert f"failed at step {step}" in r.stderr, r.stderr
        assert "the original container and workspace were put back as they were" in r.stderr
        after = inspect(box.name)
        assert after["Id"] == before["Id"], step
        assert after["State"]["Status"] == "running", step  # type: ignore[index]
        assert (box.ws / "f.txt").read_text() == "v2\n", step
        assert box.sh("cat /ws/f.txt; cat /tmp/after") == "v2\nafter\n", step
        assert spec.read_bytes() == spec_before, step
        names = podman("ps", "-a", "--format", "{{.Names}}").stdout.split()
        assert [n for n in names if n.startswith(box.name)] == [box.name], step
        assert [p.name for p in box.ws.parent.iterdir() if ".linpodx-" in p.name] == [], step
    # A Ctrl-C in the middle (after the workspace swap) is undone the same way.
    before = inspect(box.name)
    with faultinject.injecting("interrupt@swap"):
        r = box.cli("snapshot", "rollback", box.name, "--to", "s1")
    assert r.exit_code == 130 and "interrupted" in r.stderr and "put back" in r.stderr
    assert inspect(box.name)["Id"] == before["Id"]
    assert (box.ws / "f.txt").read_text() == "v2\n"
    # After all that, a real rollback still works.
    r = ok(box.cli("snapshot", "rollback", box.name, "--to", "s1"))
    assert "rolled_back: true" in r.stdout
    assert (box.ws / "f.txt").read_text() == "v1\n"


def _leftovers(box: Box) -> tuple[list[str], list[str]]:
    names = podman("ps", "-a", "--format", "{{.Names}}").stdout.split()
    return ([n for n in names if n.startswith(box.name)],
            [p.name for p in box.ws.parent.iterdir() if ".linpodx-" in p.name])


def test_rollback_killed_at_each_step_is_recovered_by_the_next_command(
    box: Box, monkeypatch: pytest.MonkeyPatch
) -> None:
    """kill -9 of `snapshot rollback` (no undo runs): the container is refused by other
    commands until `snapshot recover` puts the original back (or, after the commit record,
    finishes the rollback); nothing is left over and the audit chain stays intact."""
    from linpodx import paths
    from linpodx.snapshot import journal

    box.snapshot("s1")
    spec = paths.containers_dir() / box.name / "spec.json"
    for step in faultinject.KILL_STEPS:
        box.sh("echo v2 > /ws/f.txt; echo after > /tmp/after")
        spec_before = spec.read_bytes()
        before = inspect(box.name)
        r = faultinject.run(f"kill@{step}", "snapshot", "rollback", box.name, "--to", "s1")
        assert r.returncode == -signal.SIGKILL, (step, r.stderr)
        assert journal.exists(box.name), step
        # Until it is recovered, nothing acts on the half-rolled-back container.
        for args in (("start", box.name), ("rm", "--force", box.name)):
            refused = box.cli(*args)
            assert refused.exit_code != 0, (step, args)
            assert f"was interrupted at step {step}" in refused.stderr, refused.stderr
            assert f"hint: run `linpodx snapshot recover {box.name}`" in refused.stderr
        rec = result(box.cli("snapshot", "recover", box.name, "--json"))
        assert rec["recovered"] is True and rec["interrupted_at"] == step, rec
        after = inspect(box.name)
        assert after["State"]["Status"] == "running", step  # type: ignore[index]
        if step == "commit":
            # The new container had been checked and the commit recorded: finished.
            assert rec["action"] == "finished"
            assert after["Id"] != before["Id"]
            assert box.sh("cat /ws/f.txt; cat /tmp/after 2>/dev/null || echo gone") == "v1\ngone\n"
        else:
            assert rec["action"] == "undone"
            assert after["Id"] == before["Id"], step
            assert (box.ws / "f.txt").read_text() == "v2\n", step
            assert box.sh("cat /ws/f.txt; cat /tmp/after") == "v2\nafter\n", step
            assert spec.read_bytes() == spec_before, step
        assert _leftovers(box) == ([box.name], []), step
        assert not journal.exists(box.name), step
        again = result(box.cli("snapshot", "recover", box.name, "--json"))
        assert again["recovered"] is False
    assert audit_types().count("snapshot.rollback.recover") == len(faultinject.KILL_STEPS)
    # A recovery killed once the original is back but before it runs again is finished by
    # the next one: the container runs again (it ran before the rollback).
    before = inspect(box.name)
    stop_kill = "kill@stop"
    assert faultinject.run(stop_kill, "snapshot", "rollback", box.name, "--to", "s1").returncode < 0
    restart_kill = f"kill@{faultinject.RESTART_STEP}"
    assert faultinject.run(restart_kill, "snapshot", "recover", box.name).returncode < 0
    assert inspect(box.name)["State"]["Status"] != "running"  # type: ignore[index]
    refused = box.cli("start", box.name)
    assert refused.exit_code != 0 and "interrupted before" in refused.stderr
    rec = result(box.cli("snapshot", "recover", box.name, "--json"))
    assert rec["interrupted_at"] == "undone" and rec["action"] == "restarted"
    after = inspect(box.name)
    assert after["Id"] == before["Id"] and after["State"]["Status"] == "running"  # type: ignore[index]
    assert _leftovers(box) == ([box.name], []) and not journal.exists(box.name)
    ok(box.cli("audit", "verify"))
    # A rollback killed part-way is also recovered by the next rollback, which then runs.
    box.sh("echo v3 > /ws/f.txt")
    killed = faultinject.run("kill@swap", "snapshot", "rollback", box.name, "--to", "s1")
    assert killed.returncode < 0
    r = result(box.cli("snapshot", "rollback", box.name, "--to", "s1", "--json"))
    assert r["recovered_first"]["action"] == "undone"  # type: ignore[index]
    assert (box.ws / "f.txt").read_text() == "v1\n"
    assert _leftovers(box) == ([box.name], [])


def test_worker_killed_mid_job_is_reported_failed(
    box: Box, monkeypatch: pytest.MonkeyPatch
) -> None:
    with faultinject.slow_worker(60):
        created = result(box.cli("snapshot", "create", *HELD, box.name, "--label", "k", "--json"))
    job_id = str(created["job_id"])
    deadline = time.monotonic() + 60
    while True:
        job = jobs.read(job_id)
        if job.status == jobs.RUNNING and job.step not in (None, "start"):
            break
        assert time.monotonic() < deadline, job
        time.sleep(0.05)
    st = result(box.cli("snapshot", "job-status", job_id, "--json"))
    assert st["status"] == jobs.RUNNING
    assert job.worker_pid is not None
    os.kill(job.worker_pid, signal.SIGKILL)
    deadline = time.monotonic() + 30
    while jobs.proc_start_time(job.worker_pid) is not None and time.monotonic() < deadline:
        time.sleep(0.05)
    r = box.cli("snapshot", "job-status", job_id)
    assert r.exit_code == 0
    assert "status:  failed" in r.stdout
    assert "worker died" in r.stdout
    # No half snapshot under the label, and the container still runs.
    assert not snapshot_dir(box.name, "k").exists()
    assert podman("image", "exists", image_ref(box.name, "k"), check=False).returncode != 0
    assert inspect(box.name)["State"]["Status"] == "running"  # type: ignore[index]


def test_replace_and_rm(box: Box) -> None:
    first = box.snapshot("dup")
    r = box.cli("snapshot", "create", *HELD, box.name, "--label", "dup")
    assert r.exit_code == EXIT_CONFLICT and "already exists" in r.stderr and "--replace" in r.stderr
    (box.ws / "f.txt").write_text("v3\n")
    second = box.snapshot("dup", "--replace")
    assert second["image_id"] != first["image_id"]
    # The replaced image is gone (nothing used it); the label points at the new one.
    assert podman("image", "exists", str(first["image_id"]), check=False).returncode != 0
    rm = result(box.cli("snapshot", "rm", box.name, "--label", "dup", "--json"))
    assert rm["removed"] is True
    assert podman("image", "exists", image_ref(box.name, "dup"), check=False).returncode != 0
    assert not snapshot_dir(box.name, "dup").exists()
    assert "snapshot.rm" in audit_types() and "snapshot.rm" in event_types()
    again = box.cli("snapshot", "rm", box.name, "--label", "dup")
    assert again.exit_code == 4


def test_non_linpodx_container_is_refused(cli: Cli, unique_name: str) -> None:
    podman("run", "-d", "--name", unique_name, "--network", "none", BUSYBOX_IMAGE,
           "sleep", "1000")
    r = cli("snapshot", "create", *HELD, unique_name, "--label", "x")
    assert r.exit_code == 8 and "not a linpodx container" in r.stderr
    assert not (snapshot_dir(unique_name, "x")).exists()


def _netns_ruleset(name: str) -> str:
    pid = podman("inspect", "--format", "{{.State.Pid}}", name).stdout.strip()
    nsenter = ["nsenter", f"--net=/proc/{pid}/ns/net", "/usr/sbin/nft", "list", "ruleset"]
    argv = ["podman", "unshare", *nsenter] if ROOTLESS else nsenter
    r = subprocess.run(argv, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    return r.stdout


def _can_connect(name: str, host: str, port: int) -> bool:
    code = (f"import socket; socket.create_connection(({host!r}, {port}), timeout=3)")
    return podman("exec", name, "python3", "-c", code, check=False).returncode == 0


def test_rollback_keeps_filtered_egress(cli: Cli, unique_name: str, tmp_path: Path) -> None:
    """A container with an allowlist comes back with its guard up and its default-drop filter;
    a direct connection to a host server outside the allowlist still fails."""
    import socket

    from linpodx import containers

    out = subprocess.run(["hostname", "-I"], capture_output=True, text=True, check=True).stdout
    host = next(t for t in out.split() if ":" not in t and not t.startswith("127."))
    srv = socket.socket()
    srv.bind((host, 0))
    srv.listen(8)
    port = srv.getsockname()[1]
    # The upstream resolver is a closed local port: no name resolves, which is all we need.
    network = ("  egress_dns_allowlist: [allowed.test]\n"
               "  upstream_dns: ['127.0.0.1:9']\n")
    try:
        b = make_box(cli, unique_name, tmp_path, image=DEBIAN_IMAGE, network=network)
        assert containers.egress_status(b.name) == "healthy"
        assert "policy drop" in _netns_ruleset(b.name)
        assert not _can_connect(b.name, host, port)
        b.snapshot("net")
        # A rollback that fails after the guard was detached and the new container created
        # puts the original back with its guard up again.
        for step in ("stop", "create"):
            orig = inspect(b.name)["Id"]
            with faultinject.injecting(step):
                failed = b.cli("snapshot", "rollback", b.name, "--to", "net")
            assert failed.exit_code != 0 and "put back as they were" in failed.stderr, step
            assert inspect(b.name)["Id"] == orig, step
            assert containers.egress_status(b.name) == "healthy", step
            assert "policy drop" in _netns_ruleset(b.name), step
        r = result(b.cli("snapshot", "rollback", b.name, "--to", "net", "--json"))
        assert r["rolled_back"] is True
        assert containers.egress_status(b.name) == "healthy"
        rules = _netns_ruleset(b.name)
        assert "linpodx_egress" in rules and "policy drop" in rules
        assert not _can_connect(b.name, host, port)
    finally:
        srv.close()
        cleanup(unique_name, tmp_path)


def _upstream() -> DnsUpstream:
    """A DNS upstream on 127.0.0.1 (the guard asks it from the host side) that answers an A
    record for every name, so the guard's allowlist alone decides what resolves."""
    return DnsUpstream(lambda name, rtype: [(name, "A", "192.0.2.1")] if rtype == "A" else [])


def _resolves(name: str, host: str) -> bool:
    return podman("exec", name, "getent", "hosts", host, check=False).returncode == 0


def _policy_revision(name: str) -> tuple[int, list[str], object]:
    """Container `name`'s policy file (revision, allowlist) and what its guard enforces."""
    from linpodx.egress.state import EgressState

    st = EgressState(name)
    pol = json.loads(st.policy_file.read_text())
    enforced = json.loads(st.guard_file.read_text()).get("policy_revision") \
        if st.guard_file.exists() else None
    return pol["revision"], pol["allowlist"], enforced


def test_rollback_keeps_the_allowlist_a_reapply_gave_the_container(
    cli: Cli, unique_name: str, tmp_path: Path
) -> None:
    """Run under revision A (allowlist with allowed.test), snapshot, re-apply without
    allowed.test (revision B, pushed to the container's guard), roll back: the recreated
    container's guard enforces B, not A (allowed.test is denied from inside it). The same for
    a stopped container, after the profile was removed (`sandbox rm`), and its next start."""
    from linpodx import containers
    from linpodx.audit.chain import admin_chain, read_records

    up = _upstream()
    # TEST-NET answers are not global: allowed as private answers, so the allowlist decides.
    network = (f"  egress_dns_allowlist: [allowed.test, other.test]\n"
               f"  upstream_dns: ['127.0.0.1:{up.port}']\n"
               "  allow_private_answers: true\n")
    try:
        b = make_box(cli, unique_name, tmp_path, image=DEBIAN_IMAGE, network=network)
        created, _, _ = _policy_revision(b.name)
        assert _resolves(b.name, "allowed.test") and _resolves(b.name, "other.test")
        b.snapshot("net")
        pfile = tmp_path / "profile.yaml"
        pfile.write_text(pfile.read_text().replace("[allowed.test, other.test]", "[other.test]"))
        ok(cli("sandbox", "apply", "--profile", str(pfile)))
        newer, allow, enforced = _policy_revision(b.name)
        assert newer > created and allow == ["other.test"] and enforced == newer
        assert not _resolves(b.name, "allowed.test")

        r = result(b.cli("snapshot", "rollback", b.name, "--to", "net", "--json"))
        assert r["rolled_back"] is True
        assert _policy_revision(b.name) == (newer, ["other.test"], newer)
        assert containers.egress_status(b.name) == "healthy"
        assert not _resolves(b.name, "allowed.test"), "the creation revision came back"
        assert _resolves(b.name, "other.test")
        recs = {rec.type: rec.data for rec in read_records(admin_chain().path)}
        assert recs["snapshot.rollback"]["egress_policy"]["revision"] == newer
        assert recs["snapshot.rollback.commit"]["egress_policy"]["revision"] == newer
        assert recs["container.run"]["revision"] == created  # the labels stay the creation's

        # Stopped, its profile removed meanwhile: rolled back stopped, then started.
        ok(b.cli("stop", b.name))
        ok(b.cli("sandbox", "rm", b.profile))
        r = result(b.cli("snapshot", "rollback", b.name, "--to", "net", "--json"))
        assert inspect(b.name)["State"]["Running"] is False  # type: ignore[index]
        assert _policy_revision(b.name)[:2] == (newer, ["other.test"])
        ok(b.cli("start", b.name))
        assert _policy_revision(b.name) == (newer, ["other.test"], newer)
        assert not _resolves(b.name, "allowed.test") and _resolves(b.name, "other.test")
    finally:
        up.close()
        cleanup(unique_name, tmp_path)


def _states(pids: set[int]) -> dict[int, str]:
    out = {}
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat") as f:
                out[pid] = f.read().rsplit(")", 1)[1].split()[0]
        except FileNotFoundError:
            pass
    return out


def test_sigstop_freeze_holds_every_process_and_lets_go(unique_name: str) -> None:
    """The rootless cgroup-v1 fallback: every process of the container is stopped (also ones
    started by `podman exec`), all are continued afterwards, and a process that was already
    stopped stays stopped. Run as root too (forced method), so both users test it."""
    from linpodx.snapshot import freeze

    podman("run", "-d", "--name", unique_name, "--network", "none", BUSYBOX_IMAGE,
           "sh", "-c", "sleep 1000 & sleep 1000 & wait")
    podman("exec", "-d", unique_name, "sleep", "1001")
    podman("exec", unique_name, "sh", "-c", "sleep 1002 </dev/null >/dev/null 2>&1 & kill -STOP $!")
    init = int(podman("inspect", "--format", "{{.State.Pid}}", unique_name).stdout)
    deadline = time.monotonic() + 10
    while len(freeze.container_pids(init)) < 5 and time.monotonic() < deadline:
        time.sleep(0.05)
    pids = freeze.container_pids(init)
    assert len(pids) >= 5, pids
    pre_stopped = {p for p, s in _states(pids).items() if s == "T"}
    assert len(pre_stopped) == 1
    with freeze.frozen(unique_name, method=freeze.SIGSTOP_METHOD, signals=True) as method:
        assert method == freeze.SIGSTOP_METHOD
        during = _states(freeze.container_pids(init))
        assert during and all(s in ("T", "t") for s in during.values()), during
    after = _states(freeze.container_pids(init))
    assert {p for p, s in after.items() if s == "T"} == pre_stopped
    assert podman("exec", unique_name, "true").returncode == 0


def test_default_freeze_matches_the_host(box: Box) -> None:
    """`podman pause` where the host can freeze; SIGSTOP rootless on cgroup v1."""
    from linpodx.snapshot import freeze

    snap = box.snapshot("fz")
    v2 = Path("/sys/fs/cgroup/cgroup.controllers").exists()
    expected = freeze.SIGSTOP_METHOD if ROOTLESS and not v2 else freeze.PAUSE
    assert snap["freeze"] == expected
    assert inspect(box.name)["State"]["Status"] == "running"  # type: ignore[index]


def test_rm_after_rollback_keeps_the_image_the_container_uses(box: Box) -> None:
    box.snapshot("used")
    ok(box.cli("snapshot", "rollback", box.name, "--to", "used"))
    iid = podman("image", "inspect", "--format", "{{.Id}}", image_ref(box.name, "used")).stdout
    rm = result(box.cli("snapshot", "rm", box.name, "--label", "used", "--json"))
    assert rm["removed"] is True and rm["image_deleted"] is False
    assert podman("image", "exists", image_ref(box.name, "used"), check=False).returncode != 0
    assert podman("image", "exists", iid.strip(), check=False).returncode == 0
    assert inspect(box.name)["State"]["Status"] == "running"  # type: ignore[index]
    assert not snapshot_dir(box.name, "used").exists()
    # Our own leftovers: the untagged image goes once its container is gone.
    podman("rm", "-f", "-t", "0", box.name)
    podman("rmi", iid.strip())


@pytest.mark.parametrize("step", ["commit", "archive"])
def test_worker_killed_while_holding_the_container_lets_it_go(
    box: Box, monkeypatch: pytest.MonkeyPatch, step: str
) -> None:
    """Killed while the container is held (paused or SIGSTOPped) and, at `archive`, after the
    image was committed: job-status reports failed, lets the container go and removes the
    untagged image and temp archives."""
    from linpodx.snapshot.names import container_root

    # Each step waits 8 s first: long enough to see the step and kill inside its window.
    with faultinject.slow_worker(8):
        created = result(box.cli("snapshot", "create", *HELD, box.name, "--label", "h", "--json"))
    job_id = str(created["job_id"])
    deadline = time.monotonic() + 60
    while (job := jobs.read(job_id)).step != step:
        assert time.monotonic() < deadline, job
        time.sleep(0.05)
    assert job.freeze in ("pause", "sigstop")
    if job.freeze == "pause":
        assert inspect(box.name)["State"]["Status"] == "paused"  # type: ignore[index]
    else:
        assert job.held
    if step == "archive":
        assert job.image_id
    assert job.worker_pid is not None
    os.kill(job.worker_pid, signal.SIGKILL)
    while jobs.proc_start_time(job.worker_pid) is not None and time.monotonic() < deadline:
        time.sleep(0.05)
    st = result(box.cli("snapshot", "job-status", job_id, "--json"))
    assert st["status"] == jobs.FAILED and "worker died" in str(st["error"]), st
    assert inspect(box.name)["State"]["Status"] == "running"  # type: ignore[index]
    # Every process runs again: exec works and no process of the container is stopped.
    assert box.sh("echo alive") == "alive\n"
    init = int(podman("inspect", "--format", "{{.State.Pid}}", box.name).stdout)
    from linpodx.snapshot import freeze

    assert not [p for p, s in _states(freeze.container_pids(init)).items() if s in "Tt"]
    assert not (container_root(box.name) / f".tmp-{job_id}").exists()
    if step == "archive":
        assert podman("image", "exists", str(job.image_id), check=False).returncode != 0


def test_rollback_of_an_rm_container_is_refused(cli: Cli, unique_name: str) -> None:
    """Stopping a `--rm` container removes it, so it could not be put back: refuse up front."""
    ok(cli("run", "--rm", "--detach", "--image", BUSYBOX_IMAGE, "--name", unique_name, "--",
           "sleep", "100000"))
    try:
        ok(cli("snapshot", "create", *HELD, unique_name, "--label", "r", "--wait"))
        before = inspect(unique_name)
        r = cli("snapshot", "rollback", unique_name, "--to", "r")
        assert r.exit_code == 3 and "--rm" in r.stderr and "nothing was changed" in r.stderr
        assert inspect(unique_name)["Id"] == before["Id"]
    finally:
        podman("rm", "-f", "-t", "0", unique_name, check=False)
        podman("rmi", "-f", image_ref(unique_name, "r"), check=False)


def test_a_workspace_another_container_mounts_is_not_rolled_back(box: Box) -> None:
    """A rollback renames the workspace aside and deletes it: another container mounting it
    would be left on a deleted directory. Refused (before anything changes) while any other
    container, running or not, mounts it; a snapshot is refused while one runs that can write
    there (it is not held still)."""
    box.snapshot("s1")
    other = f"{box.name}-other"  # removed by the fixture's cleanup (name prefix)
    podman("run", "-d", "--name", other, "-v", f"{box.ws}:/shared", BUSYBOX_IMAGE,
           *AGENT_CMD)
    before = inspect(box.name)
    r = box.cli("snapshot", "rollback", box.name, "--to", "s1")
    assert r.exit_code == 3, r
    assert f"container {other} mounts {box.ws}" in r.stderr and "hint:" in r.stderr
    assert inspect(box.name)["Id"] == before["Id"]
    assert "snapshot.rollback" not in audit_types()
    r = box.cli("snapshot", "create", *HELD, box.name, "--label", "s2")
    assert r.exit_code == 3 and "another running container can write" in r.stderr, r
    podman("stop", "-t", "0", other)
    box.snapshot("s2")  # a stopped container writes nothing
    r = box.cli("snapshot", "rollback", box.name, "--to", "s1")
    assert r.exit_code == 3 and f"container {other}" in r.stderr, r  # stopped, still mounts it
    podman("rm", "-f", "-t", "0", other)
    ok(box.cli("snapshot", "rollback", box.name, "--to", "s1"))


DEEP = "i=0; while [ $i -lt 1500 ]; do mkdir d && cd d || exit 1; i=$((i+1)); done; echo x > leaf"


def test_a_deep_tree_in_the_workspace_is_rolled_back_and_undone(
    box: Box, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An agent's 1500-level tree: the rollback removes the moved-aside copy, an undo the
    restored one, without Python's recursion limit (it used to crash with exit 70 after the
    commit record and leave the container blocked)."""
    try:
        box.sh(f"mkdir /ws/old && cd /ws/old && {DEEP}")
        box.snapshot("s1")
        box.sh(f"mkdir /ws/new && cd /ws/new && {DEEP}")
        with faultinject.injecting("create"):
            r = box.cli("snapshot", "rollback", box.name, "--to", "s1")
        assert r.exit_code not in (0, 70) and "put back as they were" in r.stderr, r
        assert (box.ws / "new").is_dir()
        r = ok(box.cli("snapshot", "rollback", box.name, "--to", "s1"))
        assert "leftovers" not in r.stdout
        assert not (box.ws / "new").exists() and (box.ws / "old" / "d").is_dir()
        assert _leftovers(box) == ([box.name], [])
        ok(box.cli("snapshot", "create", *HELD, box.name, "--label", "s2", "--wait"))  # not blocked
    finally:
        # pytest's own temp-dir clean-up recurses: the deep trees go here.
        prefix = ["podman", "unshare"] if os.geteuid() != 0 else []
        subprocess.run([*prefix, "rm", "-rf", "--", str(box.ws.parent)], check=False)


def test_a_dead_jobs_container_is_let_go_even_if_the_first_look_found_the_lock_busy(
    box: Box, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A worker killed while it holds the container; `job-status` asked while another
    snapshot operation holds the lock cannot clean up and must not say it did (the container
    stayed paused for good). The next `snapshot create` lets the container go first."""
    from linpodx.snapshot.lock import container_lock

    with faultinject.slow_worker(8):
        job_id = str(result(box.cli("snapshot", "create", *HELD, box.name, "--label", "h",
                                    "--json"))["job_id"])
    deadline = time.monotonic() + 60
    while (job := jobs.read(job_id)).step != "archive":
        assert time.monotonic() < deadline, job
        time.sleep(0.05)
    assert job.worker_pid is not None
    os.kill(job.worker_pid, signal.SIGKILL)
    while jobs.proc_start_time(job.worker_pid) is not None and time.monotonic() < deadline:
        time.sleep(0.05)
    with container_lock(box.name):  # another snapshot operation on the container
        st = result(box.cli("snapshot", "job-status", job_id, "--json"))
    assert st["status"] == jobs.FAILED and "cleanup not finished" in str(st["error"]), st
    assert jobs.read(job_id).recovered is False
    held = inspect(box.name)["State"]["Status"]  # type: ignore[index]
    assert held in ("paused", "running")  # paused as root; SIGSTOPped processes rootless
    r = result(box.cli("snapshot", "create", *HELD, box.name, "--label", "next", "--wait",
                       "--json"))
    assert r["status"] == jobs.SUCCEEDED, r
    assert inspect(box.name)["State"]["Status"] == "running"  # type: ignore[index]
    assert box.sh("echo alive") == "alive\n"
    assert jobs.read(job_id).recovered is True


def test_rollback_restores_no_setuid_device_or_file_capability(box: Box) -> None:
    """A workspace archive with a setuid/setgid member (and, as root, a device node and a file
    capability) restores the content without the privilege: the host sees none of it."""
    import stat
    import struct

    suid = box.ws / "suid"
    shutil.copyfile("/bin/sh", suid)
    suid.chmod(0o4755)
    (box.ws / "sgid_dir").mkdir()
    (box.ws / "sgid_dir").chmod(0o2775)
    (box.ws / "sgid_dir" / "tool").write_text("#!/bin/sh\n")
    (box.ws / "sgid_dir" / "tool").chmod(0o2755)
    if not ROOTLESS:
        caps = struct.pack("<IIIII", 0x02000001, 1 << 7, 0, 0, 0)
        shutil.copyfile("/bin/sh", box.ws / "capfile")
        os.setxattr(box.ws / "capfile", "security.capability", caps)
        # A device node is refused when the snapshot is taken (a rollback would not restore
        # it); the rollback's own stripping of device nodes is for archives made otherwise.
        os.mknod(box.ws / "devnode", stat.S_IFCHR | 0o666, os.makedev(1, 3))
        refused = box.cli("snapshot", "create", *HELD, box.name, "--label", "dev", "--wait",
                          "--json")  # fmt: skip
        assert refused.exit_code != 0 and "device node" in refused.stdout, refused
        os.unlink(box.ws / "devnode")
    box.snapshot("priv")
    box.sh("echo changed > /ws/f.txt")
    result(box.cli("snapshot", "rollback", box.name, "--to", "priv", "--json"))
    assert (box.ws / "f.txt").read_text() == "v1\n"
    assert suid.read_bytes() == Path("/bin/sh").read_bytes()
    assert suid.stat().st_mode & 0o7777 == 0o755
    assert (box.ws / "sgid_dir").stat().st_mode & 0o7777 == 0o775
    assert (box.ws / "sgid_dir" / "tool").stat().st_mode & 0o7777 == 0o755
    assert (box.ws / "sgid_dir" / "tool").read_text() == "#!/bin/sh\n"
    if not ROOTLESS:
        assert "security.capability" not in os.listxattr(box.ws / "capfile")
        assert (box.ws / "capfile").read_bytes() == Path("/bin/sh").read_bytes()
        assert not os.path.lexists(box.ws / "devnode")
        # A host user runs the restored file (through a hard link where they can reach it).
        with tempfile.TemporaryDirectory(dir="/tmp") as top:
            os.chmod(top, 0o755)  # noqa: S103 (nobody must reach the file it runs)
            os.link(suid, f"{top}/suid")
            runs = subprocess.run(
                ["runuser", "-u", "nobody", "--", f"{top}/suid", "-p", "-c", "id -u"],
                capture_output=True, text=True, timeout=30,
            )
        assert runs.stdout.strip() not in ("", "0"), (runs.stdout, runs.stderr)


def test_snapshot_image_keeps_no_run_variable_value_and_rollback_keeps_it(
    cli: Cli, unique_name: str, tmp_path: Path
) -> None:
    """`run -e` values are the agent's keys: podman commit copied them into the snapshot
    image's config, where `podman image inspect` showed them after the container was gone.
    The image keeps the names only, and the rolled-back container still gets the values."""
    value = "s3cret-for-the-snapshot-test"
    env_file = tmp_path / "vars.env"
    env_file.write_text(f"LPX_FILE_TOKEN={value}-file\n")
    try:
        box = make_box(cli, unique_name, tmp_path, run_args=(
            "-e", f"LPX_TOKEN={value}", "--env-file", str(env_file)))
        box.snapshot("with-env")
        image = podman("image", "inspect", image_ref(box.name, "with-env")).stdout
        assert value not in image
        env = json.loads(image)[0]["Config"]["Env"]
        assert "LPX_TOKEN=" in env and "LPX_FILE_TOKEN=" in env
        ok(box.cli("snapshot", "rollback", box.name, "--to", "with-env"))
        assert box.sh("echo $LPX_TOKEN; echo $LPX_FILE_TOKEN").split() == [
            value, f"{value}-file"]
        from linpodx import containers

        assert containers.load_spec(box.name)["env_keys"] == ["LPX_FILE_TOKEN", "LPX_TOKEN"]
    finally:
        cleanup(unique_name, tmp_path)
