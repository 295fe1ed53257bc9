"""The containers service and CLI with a small hand-written fake engine (no podman here).

What these pin: the audit record comes before any podman call; a failure after `podman create`
removes the container and its spec; a failure of `podman create` itself removes nothing (the name
may belong to someone else's container); containers without the linpodx label are refused.
"""

from __future__ import annotations

import contextlib
import errno
import json
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from linpodx import containers, namelock
from linpodx.containers import runner
from linpodx.errors import EXIT_USAGE, Conflict, EngineError, InvalidInput, NotFound, NotManaged
from linpodx.paths import audit_dir, containers_dir
from linpodx.podman import engine, probe
from linpodx.profile.model import Network, Profile, Resources


class FakeEngine:
    """The podman the container service calls (`linpodx.containers.runner.Podman`), handed in
    with `runner.use`: records every call, fails where told to. Running podman with a terminal
    or streaming its output is not faked (the real engine's functions)."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, ...]] = []
        self.fail: dict[str, BaseException] = {}
        self.labels: dict[str, str] = {"linpodx.managed": "1", "linpodx.profile_id": "builtin"}
        self.state = "running"
        self.present: set[str] = {"other"}
        self.renamed: dict[str, str] = {}  # what podman resolves a given name or id to
        self.start_run = engine.start_run
        self.relay_announced = engine.relay_announced
        self.stream_chunks = engine.stream_chunks

    def _step(self, what: str, *args: str) -> None:
        self.calls.append((what, *args))
        if what in self.fail:
            raise self.fail[what]

    def create(self, argv: Any) -> str:
        self._step("create", *argv)
        name = next(a.split("=", 1)[1] for a in argv if a.startswith("--name="))
        self.present.add(name)
        return "c0ffee"

    def create_home(self, name: str) -> None:
        self._step("create_home", name)

    def init(self, name: str, global_flags: Any = ()) -> None:
        self._step("init", *global_flags, name)

    def start(self, name: str, global_flags: Any = ()) -> None:
        self._step("start", *global_flags, name)

    def stop(self, name: str, timeout: int = 10) -> None:
        self._step("stop", name)

    def stop_quietly(self, name_or_id: str) -> None:
        with contextlib.suppress(EngineError):
            self.stop(name_or_id)

    def remove(self, name: str, force: bool = False) -> None:
        self._step("rm", name)

    def remove_quietly(self, name: str) -> str | None:
        self.calls.append(("remove", name))
        self.present.discard(name)
        return None

    def inspect(self, name: str) -> dict[str, Any]:
        self.calls.append(("inspect", name))
        return {
            "Id": "c0ffee",
            "Name": self.renamed.get(name, name),
            "State": {"Status": self.state, "Pid": 42},
            "Config": {"Labels": dict(self.labels)},
            "ImageName": "img",
        }

    def exists(self, name: str) -> bool:
        return name in self.present

    def container_pid(self, name: str) -> int:
        return 42

    def run_inherited(self, argv: Any, stop: Any = None) -> int:
        self._step("inherited", *argv)
        return 0

    def podman_bin(self) -> str:
        return "/usr/bin/podman"

    def list_managed(self, all_states: bool) -> list[dict[str, Any]]:
        return [
            {
                "Names": ["agent-1"],
                "Labels": {"linpodx.profile": "default", "linpodx.revision": "0"},
                "State": "running",
                "Image": "img",
            }
        ]

    def names(self) -> list[str]:
        return [c[0] for c in self.calls]


@pytest.fixture
def fake() -> Iterator[FakeEngine]:
    f = FakeEngine()
    with runner.use(f):
        yield f


def admin_records() -> list[dict[str, Any]]:
    path = audit_dir() / "admin.jsonl"
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


REQ = containers.RunRequest(image="localhost/img:1", name="agent-1", detach=True)


def test_run_audits_then_creates_home_then_starts(fake: FakeEngine) -> None:
    info, _ = containers.run(REQ)
    assert info.name == "agent-1" and info.state == "running"
    assert fake.names()[:3] == ["create", "create_home", "start"]
    recs = admin_records()
    assert [r["type"] for r in recs] == ["container.run"]
    assert recs[0]["data"]["name"] == "agent-1" and recs[0]["data"]["profile_id"] == "builtin"
    spec = containers.load_spec("agent-1")
    assert spec["image"] == "localhost/img:1" and spec["container_id"] == "c0ffee"


@pytest.mark.parametrize(
    "damage",
    [{"drop": "command"}, {"set": ("command", "sh")}, {"set": ("command", [1])},
     {"set": ("tty", 1)}, {"set": ("revision", True)}, {"keep_only": "version"}],
    ids=["no-command", "command-str", "command-int", "tty-int", "revision-bool", "only-version"],
)  # fmt: skip
def test_a_run_spec_missing_what_linpodx_reads_is_refused(
    fake: FakeEngine, damage: dict[str, Any]
) -> None:
    """`start` and snapshot rollback rebuild the container from the spec: one that lacks a
    field or has the wrong type was not written by linpodx and is refused, not filled in."""
    containers.run(REQ)
    path = containers.spec_path("agent-1")
    doc = json.loads(path.read_text())
    if "drop" in damage:
        del doc[damage["drop"]]
    elif "set" in damage:
        doc[damage["set"][0]] = damage["set"][1]
    else:
        doc = {"version": doc["version"]}
    path.write_text(json.dumps(doc))
    with pytest.raises(InvalidInput) as ei:
        containers.load_spec("agent-1")
    assert ei.value.message.startswith("run spec of agent-1 is damaged: ")
    assert ei.value.hint == "remove it with `linpodx rm agent-1`"


def test_audit_failure_means_no_podman_call(fake: FakeEngine, isolated_state: Path) -> None:
    d = audit_dir()
    d.parent.mkdir(parents=True, exist_ok=True)
    d.write_text("not a directory")  # the chain cannot be written
    code = __import__("linpodx.cli.main", fromlist=["main"]).main(
        ["run", "--image", "localhost/img:1", "--name", "agent-1", "-d"]
    )
    assert code == 6
    assert fake.calls == []
    assert not (containers_dir() / "agent-1").exists()


def test_failure_after_create_removes_container_and_spec(fake: FakeEngine) -> None:
    fake.fail["create_home"] = EngineError("podman cp failed", stderr="Error: boom")
    with pytest.raises(EngineError) as ei:
        containers.run(REQ)
    assert ("remove", "agent-1") in fake.calls
    assert "start" not in fake.names()
    assert not (containers_dir() / "agent-1").exists()
    assert ei.value.hint and "removed again" in ei.value.hint


def test_failed_start_removes_container(fake: FakeEngine) -> None:
    fake.fail["start"] = EngineError("podman start failed", stderr="Error: runc: boom")
    with pytest.raises(EngineError):
        containers.run(REQ)
    assert ("remove", "agent-1") in fake.calls
    assert not (containers_dir() / "agent-1").exists()


def test_create_failure_removes_nothing(fake: FakeEngine) -> None:
    fake.fail["create"] = EngineError(
        "podman create failed", stderr='Error: the container name "agent-1" is already in use'
    )
    with pytest.raises(Conflict):  # the kind of error a taken name is, from podman too
        containers.run(REQ)
    # The name belongs to another container: it must not be touched.
    assert "remove" not in fake.names()
    assert not (containers_dir() / "agent-1").exists()


class FakeGuard:
    def __init__(self, fail_attach: bool, pidfile_pid: int | None = None) -> None:
        self.fail_attach = fail_attach
        self.pidfile_pid = pidfile_pid
        self.calls: list[str] = []

    def init_pid(self, name: str) -> int | None:
        return self.pidfile_pid

    def prepare(self, name: str, stored: Any) -> Path:
        self.calls.append("prepare")
        return Path("/run/fake/resolv.conf")

    def attach(self, name: str, pid: int, stored: Any) -> None:
        self.calls.append(f"attach:{pid}")
        if self.fail_attach:
            raise RuntimeError("nft said no")

    def detach(self, name: str) -> None:
        self.calls.append("detach")


def guarded_ref() -> containers.ProfileRef:
    prof = Profile(name="net", network=Network(egress_dns_allowlist=("crates.io",)))
    return containers.ProfileRef(prof, "net", "prof_X", 2, "cd" * 32)


def test_guard_sequence_create_init_attach_start(
    fake: FakeEngine, monkeypatch: pytest.MonkeyPatch
) -> None:
    guard = FakeGuard(fail_attach=False)
    monkeypatch.setattr(containers.bringup, "egress_guard", lambda: guard)
    spec = containers.make_spec(REQ, guarded_ref())
    containers.create_and_start(spec, guarded_ref())
    assert fake.names()[:4] == ["create", "create_home", "init", "start"]
    create_argv = fake.calls[0]
    assert "--network=none" in create_argv
    assert any("destination=/etc/resolv.conf" in a for a in create_argv)
    # prepare before create (the bind mount needs its source) and again at bring-up (it must
    # hand back the same path), then attach with the init PID.
    assert guard.calls == ["prepare", "prepare", "attach:42"]


def test_init_pid_from_the_pidfile_needs_no_inspect(
    fake: FakeEngine, monkeypatch: pytest.MonkeyPatch
) -> None:
    guard = FakeGuard(fail_attach=False, pidfile_pid=77)
    monkeypatch.setattr(containers.bringup, "egress_guard", lambda: guard)

    def no_inspect(name: str) -> int:
        raise AssertionError("podman inspect for the pid")

    monkeypatch.setattr(fake, "container_pid", no_inspect)
    spec = containers.make_spec(REQ, guarded_ref())
    containers.create_and_start(spec, guarded_ref())
    assert guard.calls[-1] == "attach:77"


def test_guard_failure_fails_closed(fake: FakeEngine, monkeypatch: pytest.MonkeyPatch) -> None:
    guard = FakeGuard(fail_attach=True)
    monkeypatch.setattr(containers.bringup, "egress_guard", lambda: guard)
    monkeypatch.setattr(containers.bringup, "_pid_alive", lambda pid: True)
    spec = containers.make_spec(REQ, guarded_ref())
    with pytest.raises(EngineError) as ei:
        containers.create_and_start(spec, guarded_ref())
    assert "egress guard failed" in ei.value.message
    assert "start" not in fake.names()
    assert ("remove", "agent-1") in fake.calls
    assert "detach" in guard.calls
    assert guard.calls.count("attach:42") == 1  # the process was alive: no second try


def test_init_undone_by_podman_cleanup_is_retried_once(
    fake: FakeEngine, monkeypatch: pytest.MonkeyPatch
) -> None:
    """podman 4.3 can undo a fresh init right after a stop; one more init, then attach."""

    class FlakyGuard(FakeGuard):
        def attach(self, name: str, pid: int, stored: Any) -> None:
            super().attach(name, pid, stored)
            if self.calls.count(f"attach:{pid}") == 1:
                raise RuntimeError(f"the container's process {pid} is gone")

    guard = FlakyGuard(fail_attach=False)
    monkeypatch.setattr(containers.bringup, "egress_guard", lambda: guard)
    monkeypatch.setattr(containers.bringup, "_pid_alive", lambda pid: False)
    monkeypatch.setattr(containers.bringup.time, "sleep", lambda s: None)
    spec = containers.make_spec(REQ, guarded_ref())
    containers.create_and_start(spec, guarded_ref())
    assert fake.names().count("init") == 2
    assert guard.calls == ["prepare", "prepare", "attach:42", "attach:42"]
    assert "start" in fake.names() and "remove" not in fake.names()


def test_unmanaged_container_refused(fake: FakeEngine, cli: Any) -> None:
    fake.labels = {}
    for args in (["stop", "other"], ["rm", "other"], ["start", "other"], ["logs", "other"]):
        res = cli(*args)
        assert res.exit_code == 8, args
        assert "not managed by linpodx" in res.stderr
        assert "Traceback" not in res.stderr
    assert "stop" not in fake.names() and "rm" not in fake.names()


def test_exec_is_audited_with_argv(fake: FakeEngine, cli: Any) -> None:
    fake.present.add("agent-1")
    res = cli("exec", "agent-1", "--", "sh", "-c", "id")
    assert res.exit_code == 0, res.stderr
    recs = admin_records()
    assert recs[-1]["type"] == "container.exec"
    assert recs[-1]["data"]["argv"] == ["sh", "-c", "id"]
    assert fake.calls[-1][-4:] == ("agent-1", "sh", "-c", "id")


def test_exec_needs_a_command(fake: FakeEngine, cli: Any) -> None:
    res = cli("exec", "agent-1")
    assert res.exit_code == EXIT_USAGE
    assert "hint:" in res.stderr


def test_run_json_needs_detach(fake: FakeEngine, cli: Any) -> None:
    res = cli("run", "--image", "localhost/img:1", "--json")
    assert res.exit_code == 2
    doc = json.loads(res.stdout)
    assert doc["ok"] is False and "--detach" in doc["error"]["message"]
    assert fake.calls == []


def test_run_detached_json(fake: FakeEngine, cli: Any) -> None:
    res = cli("run", "--image", "localhost/img:1", "--name", "agent-1", "-d", "--json")
    assert res.exit_code == 0, res.stderr
    doc = json.loads(res.stdout)
    assert doc["result"]["container_id"] == "c0ffee"
    assert doc["result"]["state"] == "running"


@pytest.mark.parametrize("name", ["../etc", ""])
def test_bad_name_is_an_error_not_a_traceback(fake: FakeEngine, cli: Any, name: str) -> None:
    """An empty `--name` too: it is a mistake, not a request for a generated name."""
    res = cli("run", "--image", "localhost/img:1", "--name", name)
    assert res.exit_code == 3
    assert res.stderr.startswith("error: invalid container name")
    assert fake.calls == []


def test_ps_lists_rows(fake: FakeEngine, cli: Any) -> None:
    res = cli("ps", "--all")
    assert res.exit_code == 0
    lines = res.stdout.splitlines()
    assert lines[0].split() == ["NAME", "PROFILE", "REVISION", "STATE", "EGRESS"]
    assert lines[1].split()[:4] == ["agent-1", "default", "0", "running"]


def test_stop_audited_before_stop(fake: FakeEngine, cli: Any) -> None:
    fake.present.add("agent-1")
    res = cli("stop", "agent-1")
    assert res.exit_code == 0, res.stderr
    assert admin_records()[-1]["type"] == "container.stop"
    assert "stop" in fake.names()


def test_stop_names_the_container_id_as_start_ps_and_run_do(fake: FakeEngine, cli: Any) -> None:
    fake.present.add("agent-1")
    fake.state = "exited"
    res = cli("stop", "agent-1", "--json")
    assert res.exit_code == 0, res.stderr
    doc = json.loads(res.stdout)["result"]
    assert doc == {"container_id": "c0ffee", "name": "agent-1", "state": "exited"}
    res = cli("stop", "agent-1")
    assert res.stdout.splitlines()[0].split() == ["container_id:", "c0ffee"]


@pytest.mark.parametrize("time", ["-1", "86401", "99999999999999999999"])
def test_stop_refuses_a_time_out_of_range_before_anything_is_recorded(
    fake: FakeEngine, cli: Any, time: str
) -> None:
    fake.present.add("agent-1")
    res = cli("stop", "agent-1", "--time", time)
    assert res.exit_code == 2, res.stderr
    assert res.stderr.startswith("error: --time must be between 0 and 86400 seconds")
    assert "hint:" in res.stderr and "internal error" not in res.stderr
    assert "stop" not in fake.names()
    assert [r["type"] for r in admin_records()] == []


def test_stop_waits_for_whoever_holds_the_name(fake: FakeEngine) -> None:
    """A snapshot rollback holds its container's name lock throughout: a `linpodx stop` of it
    in another process waits until it is done, instead of slipping in before its journal."""
    import threading

    from linpodx import namelock

    fake.present.add("agent-1")
    held = namelock.acquire("agent-1")
    done: list[str] = []

    def stop() -> None:
        containers.stop("agent-1")
        done.append("stopped")

    t = threading.Thread(target=stop, daemon=True)
    t.start()
    t.join(0.5)
    assert done == [] and "stop" not in fake.names()
    held.release()
    t.join(10)
    assert done == ["stopped"] and "stop" in fake.names()


def test_guarded_run_with_a_taken_name_leaves_the_other_guard_alone(
    fake: FakeEngine, monkeypatch: pytest.MonkeyPatch
) -> None:
    guard = FakeGuard(fail_attach=False)
    monkeypatch.setattr(containers.bringup, "egress_guard", lambda: guard)
    fake.present.add("agent-1")  # another linpodx container already has the name
    containers.spec_dir("agent-1").mkdir(parents=True)  # ... and its files
    spec = containers.make_spec(REQ, guarded_ref())
    with pytest.raises(Conflict) as ei:
        containers.create_and_start(spec, guarded_ref())
    assert "already in use" in ei.value.message
    # The hint works for a container linpodx did not make too (`linpodx rm` refuses those).
    assert "`podman rm NAME` otherwise" in (ei.value.hint or "")
    assert guard.calls == []  # neither prepare (would overwrite its files) nor detach
    assert "create" not in fake.names() and "remove" not in fake.names()


def test_guarded_run_with_a_name_taken_outside_linpodx_cleans_only_its_own_files(
    fake: FakeEngine, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No state dir of that name: nothing of another container's to overwrite, so no
    `podman container exists` first; podman refuses the create and our files go again."""
    guard = FakeGuard(fail_attach=False)
    monkeypatch.setattr(containers.bringup, "egress_guard", lambda: guard)
    fake.present.add("agent-1")
    fake.fail["create"] = EngineError("podman create failed", stderr="name is already in use")
    spec = containers.make_spec(REQ, guarded_ref())
    with pytest.raises(Conflict):
        containers.create_and_start(spec, guarded_ref())
    assert guard.calls == ["prepare", "detach"]
    assert "remove" not in fake.names()


def test_start_refuses_a_moved_resolv_conf(
    fake: FakeEngine, monkeypatch: pytest.MonkeyPatch
) -> None:
    guard = FakeGuard(fail_attach=False)
    monkeypatch.setattr(containers.bringup, "egress_guard", lambda: guard)
    spec = containers.make_spec(REQ, guarded_ref())
    containers.create_and_start(spec, guarded_ref())
    doc = containers.load_spec("agent-1")
    doc["resolv_conf"] = "/somewhere/else/resolv.conf"
    containers.save_spec("agent-1", doc)
    fake.state = "exited"
    fake.present.add("agent-1")
    monkeypatch.setattr(containers.request, "profile_by_id", lambda pid: guarded_ref())
    fake.calls.clear()
    with pytest.raises(EngineError) as ei:
        containers.start("agent-1")
    assert "resolv.conf moved" in ei.value.message
    assert "start" not in fake.names() and "init" not in fake.names()


def test_start_of_a_container_whose_run_was_killed_is_refused_before_its_record(
    fake: FakeEngine, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`linpodx run` killed after podman created the container and before the spec was
    written: `start` refuses with a hint that works (remove it), and records no start."""
    containers.run(REQ)
    containers.spec_path("agent-1").unlink()
    fake.state = "exited"
    fake.present.add("agent-1")
    fake.calls.clear()
    records = len(admin_records())
    with pytest.raises(NotFound) as ei:
        containers.start("agent-1")
    assert "its `linpodx run` did not finish" in ei.value.message
    assert ei.value.hint == "remove it with `linpodx rm agent-1` and run it again"
    assert len(admin_records()) == records
    assert "start" not in fake.names() and "init" not in fake.names()


def test_start_of_a_container_renamed_outside_linpodx_names_its_old_name(
    fake: FakeEngine,
) -> None:
    """`podman rename agent-1 agent-2`: linpodx's state stays under agent-1, so `start
    agent-2` is refused before its record, with the rename that makes it work again (not
    "its run did not finish", which sent people to remove a healthy container)."""
    containers.run(REQ)
    fake.state = "exited"
    fake.present.add("agent-2")
    fake.calls.clear()
    records = len(admin_records())
    with pytest.raises(NotFound) as ei:
        containers.start("agent-2")
    assert "renamed outside linpodx" in ei.value.message
    assert "created it as agent-1" in ei.value.message
    assert ei.value.hint == (
        "rename it back with `podman rename agent-2 agent-1`, then `linpodx start agent-1`"
    )
    assert len(admin_records()) == records
    assert "start" not in fake.names() and "init" not in fake.names()


def test_start_refuses_a_labelled_container_that_its_run_did_not_create(
    fake: FakeEngine,
) -> None:
    """The container was removed and made again outside linpodx with linpodx's labels (any
    flags: privileged, the host's network): its id is not the run spec's, so it is neither
    started nor recorded nor given a guard."""
    containers.run(REQ)
    doc = containers.load_spec("agent-1")
    doc["container_id"] = "a" * 64  # what linpodx created; podman now has c0ffee
    containers.save_spec("agent-1", doc)
    fake.state = "exited"
    fake.present.add("agent-1")
    fake.calls.clear()
    records = len(admin_records())
    with pytest.raises(NotManaged) as ei:
        containers.start("agent-1")
    assert "is not the one linpodx created under that name" in ei.value.message
    assert "podman rm agent-1" in (ei.value.hint or "")
    assert len(admin_records()) == records
    assert "start" not in fake.names() and "init" not in fake.names()


@pytest.mark.parametrize("command", [("stop",), ("start",), ("rm", "-f"), ("exec",)])
def test_an_id_is_not_taken_for_a_name(
    fake: FakeEngine, cli: Any, command: tuple[str, ...]
) -> None:
    """podman resolves ids and their prefixes too; linpodx's lock, spec and records go by name,
    so an id is refused before anything is done or recorded."""
    fake.renamed["c0ffee"] = "agent-1"
    fake.present.add("c0ffee")
    tail = ["--", "true"] if command == ("exec",) else []
    res = cli(*command, "c0ffee", *tail)
    assert res.exit_code == 3, res.stderr
    assert "c0ffee is not a container name (podman resolves it to 'agent-1')" in res.stderr
    assert admin_records() == []
    assert [c for c in fake.names() if c != "inspect"] == []


def _mounted_ref(source: Path, *, allowlist: tuple[str, ...] = ()) -> containers.ProfileRef:
    from linpodx.profile.model import Mount

    prof = Profile(
        name="mnt",
        mounts=(Mount(str(source), "/workspace"),),
        network=Network(egress_dns_allowlist=allowlist),
    )
    return containers.ProfileRef(prof, "mnt", "prof_M", 1, "ef" * 32)


@pytest.mark.parametrize("guarded", [False, True], ids=["plain", "guarded"])
def test_podman_calls_that_make_the_mounts_get_the_mount_check_hook(
    fake: FakeEngine, monkeypatch: pytest.MonkeyPatch, tmp_path: Path, guarded: bool
) -> None:
    """`init`/`start` (run and `linpodx start`) carry `--hooks-dir` of the container's pins, and
    the pins are the device and inode of the source as it is when the call is made."""
    monkeypatch.setattr(containers.bringup, "egress_guard", lambda: FakeGuard(fail_attach=False))
    project = tmp_path / "project"
    project.mkdir()
    ref = _mounted_ref(project, allowlist=("crates.io",) if guarded else ())
    containers.create_and_start(containers.make_spec(REQ, ref), ref)
    hooks = containers_dir() / "agent-1" / "mounts" / "hooks"
    flag = f"--hooks-dir={hooks}"
    mounting = [c for c in fake.calls if c[0] in ("init", "start")]
    assert mounting and all(c[1] == flag for c in mounting), fake.calls
    st = project.stat()
    expect = hooks.parent / "expect"
    assert expect.read_text() == f"{st.st_dev} {st.st_ino} /workspace\n"

    # Replaced by another directory of the same name before `linpodx start`: pinned afresh.
    project.rename(tmp_path / "old")
    project.mkdir()
    fake.calls.clear()
    fake.state = "exited"
    monkeypatch.setattr(containers.request, "profile_by_id", lambda pid: ref)
    containers.start("agent-1")
    assert next(c for c in fake.calls if c[0] in ("init", "start"))[1] == flag
    st = project.stat()
    assert expect.read_text() == f"{st.st_dev} {st.st_ino} /workspace\n"


def test_a_source_that_became_a_symlink_stops_the_start_before_podman(
    fake: FakeEngine, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    project = tmp_path / "project"
    project.mkdir()
    ref = _mounted_ref(project)
    containers.create_and_start(containers.make_spec(REQ, ref), ref)
    ssh = Path.home() / ".ssh"
    ssh.mkdir(exist_ok=True)
    project.rmdir()
    project.symlink_to(ssh)
    fake.calls.clear()
    fake.state = "exited"
    monkeypatch.setattr(containers.request, "profile_by_id", lambda pid: ref)
    with pytest.raises(InvalidInput):
        containers.start("agent-1")
    assert "init" not in fake.names() and "start" not in fake.names()


@pytest.mark.parametrize(
    ("state", "removed"),
    [
        ('{"ociVersion":"1.0.2","id":"c0ffee","status":"stopped"}', True),
        # A newer container of the same name: its spec names another id, its files stay.
        ('{"ociVersion":"1.0.2","id":"beef","status":"stopped"}', False),
        ('{"ociVersion":"1.0.2","status":"stopped"}', False),
        ('{"ociVersion":"1.0.2","id":"c0ffee\\" x","status":"stopped"}', False),
        ("", False),
    ],
    ids=["its-own", "another-id", "no-id", "odd-id", "empty"],
)
def test_rm_cleanup_hook_removes_only_its_own_containers_dir(state: str, removed: bool) -> None:
    """The `--rm` poststop hook, run as runc runs it (OCI state on stdin)."""
    import subprocess

    flags = containers.bringup.rm_cleanup_flags("agent-1")
    where = containers.spec_dir("agent-1")
    hooks = Path(flags[0].removeprefix("--hooks-dir="))
    assert hooks.parent == where
    hook = json.loads((hooks / "linpodx-rm.json").read_text())
    assert hook["stages"] == ["poststop"]
    containers.save_spec("agent-1", {"container_id": "c0ffee", "name": "agent-1"})
    res = subprocess.run(hook["hook"]["args"], input=state, text=True, timeout=30,
                         capture_output=True)  # fmt: skip
    assert res.returncode == 0, res.stderr
    assert where.exists() is not removed


def test_the_loser_of_two_runs_of_one_name_leaves_the_winners_files_alone(
    fake: FakeEngine, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two guarded `run -d --name agent-1` at once. The first (the winner) holds the name while
    it prepares its guard (policy file, resolv.conf, the guard's log) and podman creates its
    container; the second must not prepare over those files, nor remove them when podman
    refuses its create: it waits for the name, then finds it taken."""
    import threading

    from linpodx.egress import guard
    from linpodx.egress.state import EgressState

    def launch(name: str) -> None:  # what spawning the guard does to its log: append
        with EgressState(name).guard_log.open("a") as f:
            f.write(f"guard of {name} launched\n")

    monkeypatch.setattr(guard, "launch", launch)
    ref = guarded_ref()
    st = EgressState("agent-1")
    winner = namelock.acquire("agent-1")
    guard.prepare("agent-1", ref)
    files = {p.name: p.read_bytes() for p in st.dir.iterdir()}
    assert "guard.log" in files
    fake.fail["create"] = EngineError(
        "podman create failed", stderr='Error: the container name "agent-1" is already in use'
    )
    failed: list[BaseException] = []

    def loser() -> None:
        try:
            containers.create_and_start(containers.make_spec(REQ, ref), ref)
        except BaseException as exc:
            failed.append(exc)

    t = threading.Thread(target=loser, daemon=True)
    t.start()
    t.join(1.0)  # (without the lock it has run to its end by now)
    fake.present.add("agent-1")  # the winner's podman create took the name
    winner.release()
    t.join(30)
    assert not t.is_alive()
    assert {p.name: p.read_bytes() for p in st.dir.iterdir()} == files
    [err] = failed
    assert isinstance(err, Conflict) and "already in use" in err.message
    assert "create" not in fake.names()  # refused before podman was asked


def test_a_finished_rm_run_removes_only_its_own_state_dir() -> None:
    """After a `--rm` container ended, the name is free: a new run of it may already have
    written its spec. `forget` removes the state dir only if it is still this container's."""
    containers.save_spec("agent-1", {"container_id": "beef", "name": "agent-1"})
    containers.forget("agent-1", "c0ffee", ask_podman=False)
    assert containers.spec_path("agent-1").exists()
    containers.forget("agent-1", "beef", ask_podman=False)
    assert not containers.spec_dir("agent-1").exists()


def failed_records() -> list[dict[str, Any]]:
    return [r["data"] for r in admin_records() if r["type"].endswith(".failed")]


@pytest.mark.parametrize(
    ("fail", "step", "container"),
    [
        ("create", "podman_create", "not_created"),
        ("create_home", "home", "removed"),
        ("start", "podman_start", "removed"),
    ],
)
def test_a_run_that_fails_after_its_record_records_how(
    fake: FakeEngine, fail: str, step: str, container: str
) -> None:
    fake.fail[fail] = EngineError(f"podman {fail} failed (exit 125)", stderr="Error: secret-ish")
    with pytest.raises(EngineError):
        containers.run(REQ)
    assert [r["type"] for r in admin_records()] == ["container.run", "container.run.failed"]
    assert failed_records() == [
        {"name": "agent-1", "step": step, "error": "EngineError",
         "reason": f"podman {fail} failed (exit 125)", "container": container},
    ]  # fmt: skip


def test_a_run_whose_clean_up_fails_records_the_container_as_left(
    fake: FakeEngine, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake.fail["start"] = EngineError("podman start failed (exit 125)")
    monkeypatch.setattr(fake, "remove_quietly", lambda name: "Error: device busy")
    with pytest.raises(EngineError) as ei:
        containers.run(REQ)
    assert ei.value.hint and "podman rm -f agent-1" in ei.value.hint
    assert failed_records()[0]["container"] == "left"


def test_a_guarded_run_records_a_guard_failure_and_a_taken_name(
    fake: FakeEngine, monkeypatch: pytest.MonkeyPatch
) -> None:
    guard = FakeGuard(fail_attach=True)
    monkeypatch.setattr(containers.bringup, "egress_guard", lambda: guard)
    monkeypatch.setattr(containers.bringup, "_pid_alive", lambda pid: True)
    spec = containers.make_spec(REQ, guarded_ref())
    with pytest.raises(EngineError):
        containers.create_and_start(spec, guarded_ref())
    # The taken name: refused before anything of the other container's is touched.
    containers.spec_dir("agent-1").mkdir(parents=True)
    fake.present.add("agent-1")
    with pytest.raises(Conflict):
        containers.create_and_start(spec, guarded_ref())
    assert [(r["step"], r["reason"].split(":")[0], r["container"]) for r in failed_records()] == [
        ("egress_guard", "egress guard failed", "removed"),
        ("name_check", "the container name 'agent-1' is already in use", "not_created"),
    ]


def test_a_start_that_fails_after_its_record_records_how(
    fake: FakeEngine, monkeypatch: pytest.MonkeyPatch
) -> None:
    containers.run(REQ)
    fake.state = "exited"
    fake.present.add("agent-1")
    fake.fail["start"] = EngineError("podman start failed (exit 125)")
    with pytest.raises(EngineError) as ei:
        containers.start("agent-1")
    assert ei.value.hint and "agent-1 was left stopped" in ei.value.hint
    assert [r["type"] for r in admin_records()][-2:] == [
        "container.start", "container.start.failed"
    ]  # fmt: skip
    assert failed_records() == [
        {"name": "agent-1", "step": "podman_start", "error": "EngineError",
         "reason": "podman start failed (exit 125)", "stopped": True},
    ]  # fmt: skip


@pytest.mark.parametrize(
    ("exc", "error"),
    [(OSError(errno.ENOSPC, "No space left on device"), "OSError"),
     (KeyboardInterrupt(), "KeyboardInterrupt")],
)  # fmt: skip
def test_a_start_that_fails_with_an_error_not_of_linpodx_stops_the_container_too(
    fake: FakeEngine, capsys: pytest.CaptureFixture[str], exc: BaseException, error: str
) -> None:
    """Not only linpodx's own errors: an OSError of the state dir or a Ctrl-C during the
    bring-up also leaves the container stopped (never running half set up), and says so."""
    containers.run(REQ)
    fake.state = "exited"
    fake.present.add("agent-1")
    fake.fail["start"] = exc
    with pytest.raises(type(exc)):
        containers.start("agent-1")
    assert fake.names()[-1] == "stop"
    assert "note: agent-1 was left stopped" in capsys.readouterr().err
    assert failed_records()[-1]["stopped"] is True
    assert failed_records()[-1]["error"] == error


@pytest.mark.parametrize("exc", [OSError(errno.EIO, "I/O error"), KeyboardInterrupt()])
def test_a_run_that_fails_with_an_error_not_of_linpodx_removes_the_container(
    fake: FakeEngine, capsys: pytest.CaptureFixture[str], exc: BaseException
) -> None:
    fake.fail["create_home"] = exc
    with pytest.raises(type(exc)):
        containers.run(REQ)
    assert "agent-1" not in fake.present
    assert "note: the container agent-1 was removed again" in capsys.readouterr().err
    assert failed_records()[-1]["container"] == "removed"


def test_an_attached_start_that_never_started_records_the_run_as_failed(
    fake: FakeEngine, monkeypatch: pytest.MonkeyPatch
) -> None:
    containers.create_and_start(containers.make_spec(REQ, containers.builtin_ref()),
                                containers.builtin_ref(), start=False)  # fmt: skip
    monkeypatch.setattr(fake, "run_inherited", lambda argv, stop=None: 125)
    monkeypatch.setattr(
        fake, "inspect", lambda name: {"State": {"StartedAt": "0001-01-01T00:00:00Z"}}
    )
    assert containers.attached_start("agent-1", False, remove_on_failure=True) == 125
    assert failed_records() == [
        {"name": "agent-1", "step": "podman_start", "error": "EngineError",
         "reason": "podman start --attach exited 125 without starting the container",
         "container": "removed"},
    ]  # fmt: skip


@pytest.mark.parametrize("why", ["audit", "bug"])
def test_an_outcome_record_that_cannot_be_written_keeps_the_original_error(
    fake: FakeEngine, monkeypatch: pytest.MonkeyPatch, cli: Any, why: str
) -> None:
    """The failure record is written after the fact: if it cannot be, that is a warning, and
    the error and exit code the person sees stay the run's own."""
    from linpodx.errors import AuditError

    real = containers.audit

    def audit(event_type: str, data: dict[str, Any]) -> None:
        if event_type.endswith(".failed"):
            if why == "audit":
                raise AuditError("could not record to the audit log: disk full")
            raise RuntimeError("something unexpected")
        real(event_type, data)

    monkeypatch.setattr(containers.record, "audit", audit)
    fake.fail["start"] = EngineError("podman start failed (exit 125)", hint="see podman")
    res = cli("run", "--image", "localhost/img:1", "--name", "agent-1", "-d")
    assert res.exit_code == 5
    assert res.stderr.startswith("warning: could not record container.run.failed for agent-1")
    said = "disk full" if why == "audit" else "RuntimeError"
    assert said in res.stderr.splitlines()[0]
    assert "error: podman start failed (exit 125)" in res.stderr
    assert "hint: see podman; the container agent-1 was removed again" in res.stderr
    assert "Traceback" not in res.stderr
    assert [r["type"] for r in admin_records()] == ["container.run"]


def test_the_chain_with_failure_records_verifies(fake: FakeEngine, cli: Any) -> None:
    fake.fail["create"] = EngineError("podman create failed (exit 125)")
    assert cli("run", "--image", "localhost/img:1", "--name", "agent-1", "-d").exit_code == 5
    res = cli("audit", "verify")
    assert res.exit_code == 0 and "chain:   OK" in res.stdout
    shown = cli("audit", "show").stdout
    assert "container.run.failed" in shown and '"step":"podman_create"' in shown


def _leftover_of_a_killed_rm(fake: FakeEngine) -> None:
    """What `linpodx rm -f agent-1` killed after `podman rm` leaves: the state dir (run spec,
    egress files), no container."""
    from linpodx.egress.state import EgressState

    containers.run(REQ)
    st = EgressState("agent-1")
    st.ensure()
    st.policy_file.write_text("{}")
    st.guard_log.write_text("old guard\n")
    fake.present.discard("agent-1")
    fake.calls.clear()


def test_rm_after_a_killed_rm_removes_the_leftover_and_says_so(
    fake: FakeEngine, cli: Any
) -> None:
    _leftover_of_a_killed_rm(fake)
    assert cli("ps", "--all").exit_code == 0
    res = cli("rm", "agent-1")
    assert res.exit_code == 0, res.stderr
    assert "present: false" in res.stdout
    assert "note: container agent-1 was already gone" in res.stderr
    assert "Traceback" not in res.stderr
    assert not containers.spec_dir("agent-1").exists()
    assert "rm" not in fake.names()  # no podman rm for a container that is not there
    assert admin_records()[-1]["data"] == {"name": "agent-1", "force": False, "present": False}
    again = cli("rm", "agent-1")
    assert again.exit_code == 4 and "container not found: agent-1" in again.stderr
    assert "hint:" in again.stderr


def test_run_after_a_killed_rm_takes_the_name(fake: FakeEngine) -> None:
    _leftover_of_a_killed_rm(fake)
    fake.present.discard("agent-1")
    info, _ = containers.run(REQ)
    assert info.state == "running"
    assert containers.load_spec("agent-1")["container_id"] == "c0ffee"


def test_rm_of_a_leftover_waits_for_a_run_of_that_name_under_way(fake: FakeEngine) -> None:
    """A state dir without a container is also what a run looks like before `podman create`:
    `rm` must not remove that run's files. It waits for the name, then finds the container."""
    import threading

    _leftover_of_a_killed_rm(fake)
    run = namelock.acquire("agent-1")  # a new run of agent-1 is under way
    spec_before = containers.spec_path("agent-1").read_bytes()
    done: list[dict[str, Any]] = []
    t = threading.Thread(target=lambda: done.append(containers.remove("agent-1", True)))
    t.daemon = True
    t.start()
    t.join(1.0)  # (without the lock it has removed everything by now)
    assert containers.spec_path("agent-1").read_bytes() == spec_before
    fake.present.add("agent-1")  # the run's podman create
    run.release()
    t.join(30)
    assert done and done[0]["present"] is True  # it removed the container, as asked
    assert ("rm", "agent-1") in fake.calls


def test_rm_of_a_container_that_vanishes_meanwhile_is_not_an_error(
    fake: FakeEngine, monkeypatch: pytest.MonkeyPatch
) -> None:
    containers.run(REQ)
    fake.present.add("agent-1")

    def gone(name: str, force: bool = False) -> None:
        fake.present.discard(name)  # a `--rm` container that ended just now
        raise EngineError("podman rm failed (exit 1)", stderr="Error: no such container")

    monkeypatch.setattr(fake, "remove", gone)
    assert containers.remove("agent-1", True)["removed"] is True
    assert not containers.spec_dir("agent-1").exists()


def test_an_attached_rm_run_waits_for_podman_to_remove_the_container(
    fake: FakeEngine, monkeypatch: pytest.MonkeyPatch
) -> None:
    """podman 5 may return from `start --attach` of a `--rm` container before removing it:
    the run waits (bounded) so that `forget` then drops its state dir."""
    seen: list[str] = []

    def exists(name: str) -> bool:
        seen.append(name)
        return len(seen) < 4  # removed after the third look

    monkeypatch.setattr(fake, "exists", exists)
    containers.pipeline._wait_removed("c0ffee", timeout=5)
    assert seen == ["c0ffee"] * 4
    seen.clear()
    monkeypatch.setattr(fake, "exists", lambda name: seen.append(name) or True)
    containers.pipeline._wait_removed("c0ffee", timeout=0.2)  # never removed: gives up
    assert 1 < len(seen) < 20


def test_a_guard_file_written_during_the_removal_does_not_keep_the_state_dir(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The egress guard's last write lands while the state dir is removed (the rmdir then
    fails): a second pass removes it."""
    import shutil

    where = containers.spec_dir("agent-1")
    (where / "egress").mkdir(parents=True)
    (where / "spec.json").write_text("{}")
    real = shutil.rmtree
    calls: list[int] = []

    def rmtree(path: Any, ignore_errors: bool = False) -> None:
        calls.append(1)
        real(path, ignore_errors=ignore_errors)
        if len(calls) == 1:  # the guard's "stopped" arrives between the listing and the rmdir
            (where / "egress").mkdir(parents=True)
            (where / "egress" / "guard.json").write_text('{"state": "stopped"}')

    monkeypatch.setattr(containers.state.shutil, "rmtree", rmtree)
    containers.state.remove_spec("agent-1")
    assert not where.exists() and len(calls) == 2


def test_start_of_a_paused_container_is_refused_before_its_record(fake: FakeEngine) -> None:
    containers.run(REQ)
    fake.state = "paused"
    fake.calls.clear()
    records = len(admin_records())
    with pytest.raises(InvalidInput) as ei:
        containers.start("agent-1")
    assert ei.value.message == "container agent-1 is paused"
    assert "podman unpause agent-1" in (ei.value.hint or "")
    assert len(admin_records()) == records
    assert "start" not in fake.names() and "init" not in fake.names()


@pytest.mark.parametrize(("health", "refused"), [("down", True), ("healthy", False)])
def test_start_of_a_running_container_says_when_its_egress_guard_is_down(
    fake: FakeEngine, monkeypatch: pytest.MonkeyPatch, health: str, refused: bool
) -> None:
    """A running container whose guard died has no network; `start` said "running", exit 0,
    which read as "egress restored". It now says what is wrong and what restores it."""
    containers.run(REQ)
    monkeypatch.setattr(containers.manage, "egress_status", lambda name: health)
    fake.calls.clear()
    records = len(admin_records())
    if refused:
        with pytest.raises(EngineError) as ei:
            containers.start("agent-1")
        assert "its egress guard is down" in ei.value.message
        assert ei.value.hint == (
            "run `linpodx stop agent-1` and then `linpodx start agent-1` to start it again "
            "with its egress filter"
        )
    else:
        assert containers.start("agent-1").state == "running"
    assert len(admin_records()) == records
    assert "start" not in fake.names()


def test_start_of_a_container_left_initialized_stops_it_before_init(fake: FakeEngine) -> None:
    """A run killed between `podman init` and its start leaves the container initialized;
    podman refuses to init it again, so the first `linpodx start` failed and only a second one
    worked. `start` now takes it back to stopped first, after its record."""
    containers.run(REQ)
    fake.state = "initialized"
    fake.calls.clear()
    containers.start("agent-1")
    names = fake.names()
    assert "stop" in names and "start" in names
    assert names.index("stop") < names.index("start")
    assert admin_records()[-1]["type"] == "container.start"


def test_an_outcome_record_says_which_os_error_stopped_the_run() -> None:
    """`container.run.failed` said "unexpected error" for a full disk; an OSError's reason is
    the C library's fixed text (never an exception's own text, which may hold anything)."""
    import errno

    reason = containers.record._reason(OSError(errno.ENOSPC, "No space left on device"))
    assert reason == {"error": "OSError", "reason": "No space left on device"}
    assert containers.record._reason(ValueError("anything at all")) == {
        "error": "ValueError",
        "reason": "unexpected error",
    }


def test_ps_of_a_container_renamed_outside_linpodx_shows_its_guard(
    fake: FakeEngine, cli: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """After `podman rename agent-1 agent-2`, ps showed EGRESS `none` for a filtered container
    (its guard's state is under agent-1). It shows that guard's health and says what to do."""

    containers.run(REQ)
    row = {
        "Names": ["agent-2"],
        "Id": "c0ffee",
        "Labels": {"linpodx.profile": "net", "linpodx.revision": "3"},
        "State": "running",
        "Image": "img",
    }
    monkeypatch.setattr(fake, "list_managed", lambda all_states: [row])
    monkeypatch.setattr(
        containers.listing, "egress_status", lambda name: "healthy" if name == "agent-1" else "none"
    )
    res = cli("ps")
    assert res.exit_code == 0, res.stderr
    assert res.stdout.splitlines()[1].split() == ["agent-2", "net", "3", "running", "healthy"]
    assert "agent-2 was renamed outside linpodx (linpodx created it as agent-1)" in res.stderr
    assert "podman rename agent-2 agent-1" in res.stderr
    [listed] = json.loads(cli("ps", "--json").stdout)["result"]["containers"]
    assert listed["egress"] == "healthy" and listed["renamed_from"] == "agent-1"


def test_ps_reads_the_run_specs_once_for_all_rows_it_has_no_spec_for(
    fake: FakeEngine, cli: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Containers of another state dir have no spec here: each row looked through every
    spec again (rows x specs reads, up to 4,096 specs each)."""
    from linpodx.containers import state

    containers.run(REQ)  # one spec: agent-1's
    rows = [
        {"Names": [f"other-{i}"], "Id": f"id{i}", "Labels": {}, "State": "running", "Image": "i"}
        for i in range(5)
    ]
    monkeypatch.setattr(fake, "list_managed", lambda all_states: rows)
    reads: list[str] = []
    load = state.load_spec
    monkeypatch.setattr(state, "load_spec", lambda name: reads.append(name) or load(name))
    res = cli("ps")
    assert res.exit_code == 0, res.stderr
    assert [line.split()[0] for line in res.stdout.splitlines()[1:]] == [
        f"other-{i}" for i in range(5)
    ]
    assert reads == ["agent-1"]


def test_ps_lists_a_container_renamed_to_a_name_linpodx_would_not_give(
    fake: FakeEngine, cli: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`podman rename` takes names over 63 characters; ps must still list everything."""

    long = "x" * 70
    row = {"Names": [long], "Id": "c0ffee", "Labels": {}, "State": "running", "Image": "img"}
    monkeypatch.setattr(fake, "list_managed", lambda all_states: [row])
    res = cli("ps")
    assert res.exit_code == 0, res.stderr
    assert res.stdout.splitlines()[1].split()[0] == long


def _limited(enforcement: str) -> containers.ProfileRef:
    res = Resources(memory="64m", pids_limit=64, enforcement=enforcement)
    profile = Profile(name="lim", resources=res)
    return containers.ProfileRef(profile, "lim", "prof_LIM", 1, "ab" * 32)


def _no_cgroups(monkeypatch: pytest.MonkeyPatch) -> None:
    """This host as rootless podman on cgroup v1 sees it: no cgroup limit applies."""
    host = replace(probe.host_limits(), cgroup_limits=False)
    monkeypatch.setattr(probe, "host_limits", lambda: host)


def test_limits_the_host_cannot_apply_refuse_run_and_start_before_their_record(
    fake: FakeEngine, monkeypatch: pytest.MonkeyPatch
) -> None:
    containers.run(REQ)
    fake.state = "exited"
    fake.present.add("agent-1")
    _no_cgroups(monkeypatch)
    monkeypatch.setattr(containers.request, "resolve_profile", lambda name: _limited("required"))
    monkeypatch.setattr(containers.manage, "_ref_for", lambda name, info: _limited("required"))
    records = len(admin_records())
    fake.calls.clear()
    for attempt in (
        lambda: containers.run(containers.RunRequest(image="img", name="agent-2", detach=True)),
        lambda: containers.start("agent-1"),
    ):
        with pytest.raises(InvalidInput) as ei:
            attempt()
        assert "sets resources.memory, resources.pids_limit" in ei.value.message
        assert "cannot enforce" in ei.value.message
        assert ei.value.hint and "enforcement: best_effort" in ei.value.hint
        assert "cgroup v2" in ei.value.hint
    assert len(admin_records()) == records
    assert not {"create", "init", "start"} & set(fake.names())


def test_best_effort_runs_without_them_and_says_so_in_its_record(
    fake: FakeEngine, monkeypatch: pytest.MonkeyPatch
) -> None:
    _no_cgroups(monkeypatch)
    monkeypatch.setattr(containers.request, "resolve_profile", lambda name: _limited("best_effort"))
    containers.run(REQ)
    run_rec = [r for r in admin_records() if r["type"] == "container.run"][-1]
    assert run_rec["data"]["limits_not_applied"] == ["memory", "pids_limit"]
    argv = next(c for c in fake.calls if c[0] == "create")
    assert not [a for a in argv if a.startswith(("--memory", "--pids-limit", "--cpus"))]
    fake.state = "exited"
    monkeypatch.setattr(containers.manage, "_ref_for", lambda name, info: _limited("best_effort"))
    containers.start("agent-1")
    start_rec = [r for r in admin_records() if r["type"] == "container.start"][-1]
    assert start_rec["data"]["limits_not_applied"] == ["memory", "pids_limit"]


def test_unset_limits_are_never_a_refusal_and_apply_where_they_can(
    fake: FakeEngine, monkeypatch: pytest.MonkeyPatch
) -> None:
    containers.run(REQ)  # the built-in profile sets none
    argv = next(c for c in fake.calls if c[0] == "create")
    if probe.host_limits().cgroup_limits:
        assert "--memory=2g" in argv and "--pids-limit=512" in argv and "--cpus=2" in argv
    rec = [r for r in admin_records() if r["type"] == "container.run"][-1]
    assert "limits_not_applied" not in rec["data"]
    _no_cgroups(monkeypatch)
    fake.calls.clear()
    containers.run(containers.RunRequest(image="img", name="agent-3", detach=True))
    argv = next(c for c in fake.calls if c[0] == "create")
    assert not [a for a in argv if a.startswith(("--memory", "--pids-limit", "--cpus"))]


def test_rm_names_the_container_id_as_stop_start_ps_and_run_do(fake: FakeEngine, cli: Any) -> None:
    fake.present.add("agent-1")
    fake.state = "exited"
    res = cli("rm", "agent-1", "--json")
    assert res.exit_code == 0, res.stderr
    doc = json.loads(res.stdout)["result"]
    assert doc == {"container_id": "c0ffee", "name": "agent-1", "removed": True, "present": True}
