"""Mount sources swapped between linpodx's check and runc's mount (THREATS: sandbox escape
through the host paths a profile mounts), on real podman and runc, root and rootless.

linpodx checks each source before a run, but runc mounts it again by its path moments later; an
agent with a writable mount over the source's parent can keep swapping the source for a
symlink to `~/.ssh`. The mount-check hook (`linpodx.podman.mountpin`) makes runc refuse any
mount that is not the very directory linpodx checked.
"""

from __future__ import annotations

import ctypes
import json
import os
import select
import struct
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from linpodx import paths
from linpodx.fastpath import plan as runplan
from linpodx.podman import mountpin
from linpodx.profile import hostpaths
from tests.conftest import BUSYBOX_IMAGE, linpodx_argv, run_linpodx

pytestmark = pytest.mark.podman


def podman_run(hooks: str | None, source: Path, *cmd: str) -> subprocess.CompletedProcess[str]:
    flags = mountpin.hooks_flags(hooks)
    return subprocess.run(
        ["podman", *flags, "run", "--rm", "--network=none",
         f"--mount=type=bind,source={source},destination=/data,ro=true",
         BUSYBOX_IMAGE, *cmd],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip


def test_runc_refuses_a_mount_that_is_not_what_was_checked(tmp_path: Path) -> None:
    """The hook itself, without linpodx around it: pinned to directory A, a container that
    gets B (what a swap after the check amounts to) never runs its command; one that gets A
    does."""
    checked, other = tmp_path / "checked", tmp_path / "other"
    for d, word in ((checked, "checked"), (other, "other")):
        d.mkdir()
        (d / "marker").write_text(f"{word}\n")
    ident = hostpaths.identity(str(checked))
    assert ident is not None
    hooks = mountpin.setup(str(tmp_path / "state"), [(ident[0], ident[1], "/data")])
    assert hooks is not None

    swapped = podman_run(hooks, other, "cat", "/data/marker")
    assert swapped.returncode != 0 and "other" not in swapped.stdout
    assert "linpodx mount check" in swapped.stderr and "not the directory" in swapped.stderr

    fine = podman_run(hooks, checked, "cat", "/data/marker")
    assert fine.returncode == 0, fine.stderr
    assert fine.stdout == "checked\n"


class Swapper:
    """Keeps swapping `path` between the directory it is and a symlink to `target`, as an
    agent with a writable mount over its parent could."""

    def __init__(self, path: Path, target: Path) -> None:
        self.path, self.target = path, target
        self.aside = path.with_name(path.name + ".real")
        self.stop = threading.Event()
        self.swaps = 0
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        # About half the time each: a check may see the directory and runc the symlink.
        while not self.stop.is_set():
            os.rename(self.path, self.aside)
            os.symlink(self.target, self.path)
            time.sleep(0.002)
            os.unlink(self.path)
            os.rename(self.aside, self.path)
            time.sleep(0.002)
            self.swaps += 1

    def __enter__(self) -> Swapper:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join(timeout=10)


@pytest.fixture
def secret_home() -> Iterator[Path]:
    home = Path(os.environ["HOME"])
    (home / ".ssh").mkdir(exist_ok=True)
    (home / ".ssh" / "id_test").write_text("secret-key-material\n")
    yield home / ".ssh"


def project_profile(tmp_path: Path, name: str) -> tuple[Path, subprocess.CompletedProcess[str]]:
    """A project dir (with `project-file`) and an applied profile NAME mounting it at
    /workspace; returns the project and `sandbox apply --json`'s result."""
    project = tmp_path / "project"
    project.mkdir()
    (project / "project-file").write_text("mine\n")
    prof = tmp_path / f"{name}.yml"
    prof.write_text(
        f"version: 1\nname: {name}\nmounts:\n  - source: {project}\n    target: /workspace\n"
    )
    applied = run_linpodx("sandbox", "apply", "--profile", str(prof), "--json")
    assert applied.returncode == 0, applied.stderr
    return project, applied


@pytest.mark.parametrize("path", ["full", "fast"])
def test_a_source_swapped_in_a_loop_never_reaches_the_container(
    tmp_path: Path, secret_home: Path, unique_name: str, path: str
) -> None:
    """linpodx run again and again while the source keeps turning into a symlink to ~/.ssh:
    every run either sees the project or is refused (by the check, or by runc's hook); none
    ever sees the key."""
    project, applied = project_profile(tmp_path, "race")
    plan = runplan.plan_file(json.loads(applied.stdout)["result"]["profile_id"])
    outcomes = {"saw the project": 0, "refused by the check": 0, "podman": 0, "hook": 0}
    with Swapper(project, secret_home) as swapper:
        for i in range(16):
            if path == "full" and os.path.exists(plan):
                os.unlink(plan)  # every full run writes it again
            res = run_linpodx(
                "run", "--rm", "--profile", "race", "--name", f"{unique_name}-{i}",
                "--image", BUSYBOX_IMAGE, "--", "ls", "/workspace",
            )  # fmt: skip
            assert "id_test" not in res.stdout, f"run {i} saw the key: {res.stdout}"
            assert "Traceback" not in res.stderr
            if res.returncode == 0:
                assert res.stdout.splitlines()[-1] == "project-file"
                outcomes["saw the project"] += 1
            elif "linpodx mount check" in res.stderr:
                outcomes["hook"] += 1
            elif "error: profile race: mount source" in res.stderr:
                assert "hint:" in res.stderr
                outcomes["refused by the check"] += 1
            else:
                # podman (statfs) or runc (its mount, or its init dying over it) came in the
                # middle of a swap: the engine refused, in its own words.
                assert "internal error" not in res.stderr, res.stderr
                words = res.stderr.lower()
                assert "no such file or directory" in words or "runc" in words, res.stderr
                outcomes["podman"] += 1
    assert swapper.swaps > 100, "the swapper did not run"
    # The race was on: some runs were refused (the check or runc's hook caught a swap).
    assert outcomes["saw the project"] < 16, outcomes
    left = subprocess.run(
        ["podman", "ps", "-a", "--filter", f"name={unique_name}", "--format", "{{.Names}}"],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert left.stdout.strip() == ""


def _state(name: str) -> str:
    return subprocess.run(
        ["podman", "inspect", "--format", "{{.State.Status}}", name],
        capture_output=True, text=True, timeout=60,
    ).stdout.strip()  # fmt: skip


def _podman(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["podman", *argv], capture_output=True, text=True, timeout=120)


def _gate_refused(stderr: str) -> bool:
    """runc's words for the missing gate: as root it names the file; rootless, runc's init dies
    on the mount and runc only says that it did."""
    return "use-linpodx-start" in stderr or "can't get final child's PID from pipe" in stderr


def test_plain_podman_start_or_restart_never_mounts_unchecked(
    tmp_path: Path, secret_home: Path, unique_name: str
) -> None:
    """A plain `podman start`/`restart` runs neither linpodx's check nor its hook, so a
    container with mounts carries a gate that only linpodx's own starts open: the plain ones
    fail in runc before the command runs, even with the source turned into a symlink to ~/.ssh
    meanwhile; `linpodx start` checks afresh and works again once the source is fine."""
    project, _ = project_profile(tmp_path, "gate")
    made = run_linpodx(
        "run", "-d", "--profile", "gate", "--name", unique_name, "--image", BUSYBOX_IMAGE,
        "--", "sleep", "600",
    )  # fmt: skip
    assert made.returncode == 0, made.stderr
    assert _podman("exec", unique_name, "cat", "/workspace/project-file").stdout == "mine\n"
    assert run_linpodx("stop", unique_name, "--time", "1").returncode == 0

    # The plain start fails even with the source unchanged: nothing checked it.
    plain = _podman("start", unique_name)
    assert plain.returncode != 0 and _gate_refused(plain.stderr), plain.stderr
    assert _state(unique_name) != "running"
    # The gate is what stands in the way: opened by hand, the same plain start works.
    gate = Path(mountpin.gate_path(os.path.join(paths.containers_root(), unique_name)))
    assert not gate.exists()
    gate.touch()
    opened = _podman("start", unique_name)
    assert opened.returncode == 0 and _state(unique_name) == "running", opened.stderr
    assert _podman("stop", "-t", "1", unique_name).returncode == 0
    gate.unlink()

    # What an agent with a writable mount over the parent could do while it was stopped.
    aside = project.with_name("project.real")
    project.rename(aside)
    project.symlink_to(secret_home)
    for argv in (["start", "--attach", unique_name], ["restart", unique_name]):
        res = _podman(*argv)
        assert res.returncode != 0, res.stdout
        assert "id_test" not in res.stdout and _gate_refused(res.stderr), res.stderr
        assert _state(unique_name) != "running"
    refused = run_linpodx("start", unique_name)
    assert refused.returncode != 0 and "sensitive path" in refused.stderr
    assert "hint:" in refused.stderr

    project.unlink()
    aside.rename(project)
    again = run_linpodx("start", unique_name)
    assert again.returncode == 0, again.stderr
    assert _podman("exec", unique_name, "cat", "/workspace/project-file").stdout == "mine\n"
    # A plain restart of the running container stops it and then cannot start it again.
    res = _podman("restart", unique_name)
    assert res.returncode != 0 and _gate_refused(res.stderr), res.stderr
    assert _state(unique_name) != "running"
    assert run_linpodx("start", unique_name).returncode == 0
    assert _state(unique_name) == "running"
    assert run_linpodx("rm", "--force", unique_name, timeout=60).returncode == 0


@pytest.mark.parametrize("tty", [False, True], ids=["no-rm", "tty-rm"])
def test_foreground_run_started_attached_gets_its_mounts(
    tmp_path: Path, unique_name: str, tty: bool
) -> None:
    """A foreground run that is not one `podman run` (no --rm, or a terminal: `run -it --rm`,
    the walk-through's way) is created, then started attached: the gate stays open for that
    start, whose hook closes it."""
    project_profile(tmp_path, "fg")
    if tty:
        pexpect = pytest.importorskip("pexpect")
        argv = [*linpodx_argv(), "run", "-it", "--rm", "--profile", "fg", "--name", unique_name,
                "--image", BUSYBOX_IMAGE, "--", "sh"]  # fmt: skip
        child = pexpect.spawn(argv[0], argv[1:], env=dict(os.environ), timeout=60,
                              encoding="utf-8")  # fmt: skip
        try:
            child.expect(r"state: +running")
            child.expect(r"[#$] ")
            child.sendline("cat /workspace/project-file; echo rc=$?")
            child.expect(r"mine\r\nrc=0")
            child.sendline("exit 3")
            child.expect(pexpect.EOF)
        finally:
            child.close(force=True)
        assert child.exitstatus == 3
        assert _podman("container", "exists", unique_name).returncode == 1
        return
    res = run_linpodx(
        "run", "--profile", "fg", "--name", unique_name, "--image", BUSYBOX_IMAGE,
        "--", "cat", "/workspace/project-file",
    )  # fmt: skip
    assert res.returncode == 0, res.stderr
    assert res.stdout.splitlines()[-1] == "mine"
    gate = Path(mountpin.gate_path(os.path.join(paths.containers_root(), unique_name)))
    assert gate.parent.is_dir() and not gate.exists()
    again = run_linpodx("start", unique_name)
    assert again.returncode == 0, again.stderr
    assert not gate.exists()
    assert _podman("start", unique_name).returncode != 0  # plain: no gate
    assert run_linpodx("rm", "--force", unique_name, timeout=60).returncode == 0


class GateSwapper:
    """The swap race of a symlinked target parent, timed by the gate instead of by luck: when
    linpodx opens the gate (after its check and pin) the source becomes a symlink to `target`,
    so runc mounts `target`; when the hook closes the gate (just before it looks) the source
    is put back, so a check of the host path sees the directory linpodx pinned. A second
    writer on the source's parent (another container with it mounted) could do the same in a
    loop; this makes every start hit the window."""

    def __init__(self, gate: Path, path: Path, target: Path) -> None:
        self.gate, self.path, self.target = gate, path, target
        self.aside = path.with_name(path.name + ".real")
        self.stop = threading.Event()
        self.swapped = 0
        self.thread = threading.Thread(target=self._run, daemon=True)
        libc = ctypes.CDLL(None, use_errno=True)
        self.fd = libc.inotify_init1(os.O_NONBLOCK | os.O_CLOEXEC)
        assert self.fd >= 0
        in_create, in_delete = 0x100, 0x200
        watch = libc.inotify_add_watch(self.fd, str(gate.parent).encode(), in_create | in_delete)
        assert watch >= 0

    def _events(self) -> Iterator[tuple[int, str]]:
        try:
            data = os.read(self.fd, 65536)
        except BlockingIOError:
            return
        at = 0
        while at < len(data):
            _wd, mask, _cookie, size = struct.unpack_from("iIII", data, at)
            name = data[at + 16 : at + 16 + size].rstrip(b"\0").decode()
            at += 16 + size
            yield mask, name

    def _run(self) -> None:
        while not self.stop.is_set():
            select.select([self.fd], [], [], 0.05)
            for mask, name in self._events():
                if name != self.gate.name:
                    continue
                if mask & 0x100 and not self.path.is_symlink():
                    os.rename(self.path, self.aside)
                    os.symlink(self.target, self.path)
                    self.swapped += 1
                elif mask & 0x200 and self.path.is_symlink():
                    os.unlink(self.path)
                    os.rename(self.aside, self.path)

    def __enter__(self) -> GateSwapper:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join(timeout=10)
        os.close(self.fd)
        if self.path.is_symlink():
            self.path.unlink()
            self.aside.rename(self.path)


def test_a_symlinked_target_parent_does_not_fool_the_hook(
    tmp_path: Path, secret_home: Path, unique_name: str
) -> None:
    """The agent turns a parent of its mount target into an absolute symlink to the host
    directory that holds the source (it survives stop/start, it is the agent's own rootfs);
    the source is then swapped for a symlink to ~/.ssh while runc mounts it and back before
    the hook looks. The hook must check what runc mounted (the target resolved inside the
    rootfs), not the host path the kernel reaches through the symlink: every start is refused
    and the key never reaches the container."""
    parent = tmp_path / "parent"
    source = parent / "ws"
    source.mkdir(parents=True)
    (source / "project-file").write_text("mine\n")
    prof = tmp_path / "sym.yml"
    prof.write_text(
        f"version: 1\nname: sym\nmounts:\n  - source: {source}\n"
        "    target: /home/agent/work/ws\n"
    )
    assert run_linpodx("sandbox", "apply", "--profile", str(prof)).returncode == 0
    made = run_linpodx(
        "run", "-d", "--profile", "sym", "--name", unique_name, "--image", BUSYBOX_IMAGE,
        "--", "sleep", "600",
    )  # fmt: skip
    assert made.returncode == 0, made.stderr
    try:
        agent = run_linpodx(
            "exec", unique_name, "--", "sh", "-c",
            f"mv /home/agent/work /home/agent/work.x && ln -s {parent} /home/agent/work",
        )  # fmt: skip
        assert agent.returncode == 0, agent.stderr
        assert run_linpodx("stop", unique_name, "--time", "1").returncode == 0
        gate = Path(mountpin.gate_path(os.path.join(paths.containers_root(), unique_name)))
        for attempt in range(3):
            with GateSwapper(gate, source, secret_home) as swapper:
                res = run_linpodx("start", unique_name)
            assert swapper.swapped == 1, f"attempt {attempt}: the swap did not happen"
            seen = _podman("exec", unique_name, "sh", "-c", "ls /home/agent/work/ws; true")
            assert "id_test" not in seen.stdout, f"attempt {attempt}: the key was mounted"
            assert res.returncode != 0, f"attempt {attempt}: started: {seen.stdout}"
            assert "linpodx mount check" in res.stderr, res.stderr
            assert "not the directory linpodx checked" in res.stderr, res.stderr
            assert _state(unique_name) != "running"
        # With the source left alone, the same container (link and all) starts and sees it.
        ok = run_linpodx("start", unique_name)
        assert ok.returncode == 0, ok.stderr
        assert _podman("exec", unique_name, "cat", "/home/agent/work/ws/project-file").stdout == (
            "mine\n"
        )
    finally:
        run_linpodx("rm", "--force", unique_name, timeout=60)
