"""Pinned mount sources (`linpodx.podman.mountpin`): the identity walk and the shell hook that
compares it with what runc mounted. The hook runs here against a stand-in OCI state and bundle
whose `pid` is this test process (so /proc/PID/root is /); real runc runs it in
tests/integration/test_mount_pinning.py."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from linpodx.podman import mountpin
from linpodx.profile import hostpaths


def test_identity_is_the_directory_or_file_at_a_symlink_free_path(tmp_path: Path) -> None:
    d = tmp_path / "dir"
    d.mkdir()
    f = d / "file"
    f.write_text("x")
    for p in (d, f):
        st = os.stat(p)
        assert hostpaths.identity(str(p)) == (st.st_dev, st.st_ino)


def test_identity_refuses_symlinks_anywhere_and_odd_things(tmp_path: Path) -> None:
    real = tmp_path / "real"
    (real / "inner").mkdir(parents=True)
    (tmp_path / "link").symlink_to(real)
    assert hostpaths.identity(str(tmp_path / "link")) is None  # last component
    assert hostpaths.identity(str(tmp_path / "link" / "inner")) is None  # on the way
    assert hostpaths.identity(str(tmp_path / "missing")) is None
    assert hostpaths.identity("relative/path") is None
    os.mkfifo(tmp_path / "fifo")
    assert hostpaths.identity(str(tmp_path / "fifo")) is None


def test_pin_mount_source_pins_the_resolved_directory(tmp_path: Path) -> None:
    real = tmp_path / "project"
    real.mkdir()
    (tmp_path / "via").symlink_to(real)  # a symlink the person wrote is resolved, then pinned
    ident, problem, _ = hostpaths.pin_mount_source(str(tmp_path / "via"))
    st = os.stat(real)
    assert problem is None and ident == (st.st_dev, st.st_ino)


def test_no_mounts_no_hook(tmp_path: Path) -> None:
    assert mountpin.setup(str(tmp_path), []) is None
    assert mountpin.hooks_flags(None) == [] and mountpin.flags_of(str(tmp_path)) == []


def _hook(
    tmp_path: Path, pins: list[mountpin.Pin], *, state: str | None = None
) -> subprocess.CompletedProcess[str]:
    """Run the hook `setup` wrote, as runc would, with a bundle whose rootfs is `tmp_path/root`."""
    hooks = mountpin.setup(str(tmp_path / "state"), pins)
    assert hooks is not None
    assert mountpin.flags_of(str(tmp_path / "state")) == [f"--hooks-dir={hooks}"]
    spec = json.loads(Path(hooks, mountpin.HOOK_FILE).read_text())
    assert spec["stages"] == ["createRuntime"] and spec["hook"]["path"] == "/bin/sh"
    bundle = tmp_path / "bundle"
    bundle.mkdir(exist_ok=True)
    # Compact JSON, as runc (the state) and podman (config.json) write it.
    (bundle / "config.json").write_text(
        json.dumps(
            {"ociVersion": "1.0.2", "root": {"path": str(tmp_path / "root")}},
            separators=(",", ":"),
        )
    )
    if state is None:
        state = json.dumps(
            {"ociVersion": "1.0.2", "id": "c0ffee", "status": "creating", "pid": os.getpid(),
             "bundle": str(bundle), "annotations": {"x": '"pid":1'}},
            separators=(",", ":"),
        )  # fmt: skip
    return subprocess.run(
        spec["hook"]["args"], input=state, capture_output=True, text=True, timeout=30
    )


@pytest.fixture
def rootfs(tmp_path: Path) -> Path:
    for d in ("root/workspace", "root/data dir", "elsewhere"):
        (tmp_path / d).mkdir(parents=True)
    return tmp_path / "root"


def _pin(path: Path, dest: str) -> mountpin.Pin:
    st = os.stat(path)
    return (st.st_dev, st.st_ino, dest)


def test_hook_passes_when_every_mount_is_what_was_checked(tmp_path: Path, rootfs: Path) -> None:
    pins = [_pin(rootfs / "workspace", "/workspace"), _pin(rootfs / "data dir", "/data dir")]
    res = _hook(tmp_path, pins)
    assert res.returncode == 0, res.stderr


def _gate(tmp_path: Path) -> Path:
    return Path(mountpin.gate_path(str(tmp_path / "state")))


@pytest.mark.parametrize("fine", [True, False], ids=["check-passes", "check-fails"])
def test_setup_opens_the_gate_and_the_hook_closes_it(
    tmp_path: Path, rootfs: Path, fine: bool
) -> None:
    """Whatever the check finds, the gate is gone after the hook: a later plain `podman start`
    cannot mount it, so it never starts the command with unchecked mounts."""
    other = rootfs / "workspace" if fine else tmp_path / "elsewhere"
    hooks = mountpin.setup(str(tmp_path / "state"), [_pin(other, "/workspace")])
    assert hooks is not None and _gate(tmp_path).is_file()
    spec = json.loads(Path(hooks, mountpin.HOOK_FILE).read_text())
    assert spec["hook"]["args"][-1] == str(_gate(tmp_path))
    res = _hook(tmp_path, [_pin(other, "/workspace")])
    assert (res.returncode == 0) is fine, res.stderr
    assert not _gate(tmp_path).exists()


def test_hook_fails_closed_when_it_cannot_close_the_gate(tmp_path: Path, rootfs: Path) -> None:
    """A gate that `rm -f` cannot remove (here a non-empty directory put in its place) would stay
    open for a plain start: the hook refuses the start instead."""
    pins = [_pin(rootfs / "workspace", "/workspace")]
    hooks = mountpin.setup(str(tmp_path / "state"), pins)
    assert hooks is not None
    gate = _gate(tmp_path)
    spec = json.loads(Path(hooks, mountpin.HOOK_FILE).read_text())
    gate.unlink()
    (gate / "inside").mkdir(parents=True)
    state = json.dumps({"pid": os.getpid(), "bundle": str(tmp_path)}, separators=(",", ":"))
    res = subprocess.run(
        spec["hook"]["args"], input=state, capture_output=True, text=True, timeout=30
    )
    assert res.returncode == 1
    assert f"linpodx mount check: cannot close the start gate {gate}" in res.stderr


def test_close_gate_is_quiet_when_the_hook_already_closed_it(tmp_path: Path) -> None:
    where = str(tmp_path / "state")
    gate = Path(mountpin.open_gate(where))
    assert gate == _gate(tmp_path) and gate.is_file()
    mountpin.close_gate(where)
    assert not gate.exists()
    mountpin.close_gate(where)  # already closed: nothing to do, no error
    assert not gate.exists()


def test_hook_fails_when_one_mount_is_something_else(tmp_path: Path, rootfs: Path) -> None:
    pins = [_pin(rootfs / "workspace", "/workspace"), _pin(tmp_path / "elsewhere", "/data dir")]
    res = _hook(tmp_path, pins)
    assert res.returncode == 1
    assert "linpodx mount check: the mount at /data dir is not the directory" in res.stderr


def test_hook_fails_when_the_mount_point_is_missing(tmp_path: Path, rootfs: Path) -> None:
    res = _hook(tmp_path, [_pin(rootfs / "workspace", "/nowhere")])
    assert res.returncode == 1 and "cannot see the mount at /nowhere" in res.stderr


@pytest.mark.parametrize(
    "state",
    ["", "not json", '{"pid":0,"bundle":"/x"}', '{"bundle":"/nonexistent","pid":5}'],
    ids=["empty", "garbage", "pid-0", "no-bundle-dir"],
)
def test_hook_fails_closed_on_a_state_it_cannot_use(
    tmp_path: Path, rootfs: Path, state: str
) -> None:
    res = _hook(tmp_path, [_pin(rootfs / "workspace", "/workspace")], state=state)
    assert res.returncode != 0 and "linpodx mount check" in res.stderr


def test_hook_resolves_an_absolute_symlink_parent_inside_the_rootfs(
    tmp_path: Path, rootfs: Path
) -> None:
    """The agent made a parent of the target an absolute symlink to the host directory that
    holds the source: runc follows it inside the rootfs, so what it mounted is there, and the
    host directory the kernel would reach from the host's root is not what the hook looks at."""
    host_parent = tmp_path / "elsewhere"
    (host_parent / "ws").mkdir()
    # What runc made and mounted over: the link's target inside the rootfs.
    inside = rootfs / str(host_parent).lstrip("/") / "ws"
    inside.mkdir(parents=True)
    (rootfs / "home").mkdir()
    (rootfs / "home" / "agent").symlink_to(host_parent)
    # Pinned to the host directory (the source linpodx checked): the mount is not that.
    res = _hook(tmp_path, [_pin(host_parent / "ws", "/home/agent/ws")])
    assert res.returncode == 1, res.stderr
    assert "the mount at /home/agent/ws is not the directory" in res.stderr
    # Pinned to what is at the target resolved in the rootfs: that is what runc mounted.
    res = _hook(tmp_path, [_pin(inside, "/home/agent/ws")])
    assert res.returncode == 0, res.stderr


@pytest.mark.parametrize(
    ("links", "dest"),
    [
        ({"a": "/real"}, "/a/ws"),  # absolute, from the rootfs' root
        ({"a": "real"}, "/a/ws"),  # relative to the link's directory
        ({"a": "b", "b": "/x/../real/."}, "/a/ws"),  # a chain, with `..` and `.`
        ({"a": "../../../../real"}, "/a/ws"),  # `..` never above the rootfs
        ({}, "//real/./ws/"),  # odd slashes and dots, no link
        ({"real/ws2": "ws"}, "/real/ws2"),  # the last component is the link
    ],
)
def test_hook_follows_links_as_runc_does(
    tmp_path: Path, rootfs: Path, links: dict[str, str], dest: str
) -> None:
    target = rootfs / "real" / "ws"
    target.mkdir(parents=True)
    (rootfs / "x").mkdir()
    for name, to in links.items():
        (rootfs / name).symlink_to(to)
    res = _hook(tmp_path, [_pin(target, dest)])
    assert res.returncode == 0, res.stderr


def test_hook_refuses_a_symlink_loop(tmp_path: Path, rootfs: Path) -> None:
    (rootfs / "a").symlink_to("/b")
    (rootfs / "b").symlink_to("/a")
    res = _hook(tmp_path, [_pin(rootfs / "workspace", "/a/ws")])
    assert res.returncode == 1 and "cannot resolve /a/ws in the rootfs" in res.stderr


def test_hook_reads_a_link_target_that_ends_in_a_newline_exactly(
    tmp_path: Path, rootfs: Path
) -> None:
    """runc follows `/a` -> "/real\\n" to the directory named "real\\n". A shell's `$(readlink)`
    drops trailing newlines and would look at `/real` instead, where the agent could have made
    the checked directory visible (another mount of its parent) while runc mounted something
    else at "/real\\n/ws": the hook must look where runc mounted."""
    (rootfs / "real" / "ws").mkdir(parents=True)
    (rootfs / "real\n" / "ws").mkdir(parents=True)
    (rootfs / "a").symlink_to("/real\n")
    res = _hook(tmp_path, [_pin(rootfs / "real" / "ws", "/a/ws")])
    assert res.returncode == 1, res.stderr
    assert "the mount at /a/ws is not the directory" in res.stderr
    res = _hook(tmp_path, [_pin(rootfs / "real\n" / "ws", "/a/ws")])
    assert res.returncode == 0, res.stderr


@pytest.mark.parametrize("dest", ["/ws ", "/ws  ", "/w s"])
def test_hook_checks_a_target_with_spaces_exactly(tmp_path: Path, rootfs: Path, dest: str) -> None:
    """A target may end in a space (`/ws `): runc mounts there, not at `/ws`; the hook must not
    let `read` trim the field and look at `/ws`, where the checked directory could be."""
    (rootfs / "ws").mkdir()
    (rootfs / dest.lstrip("/")).mkdir(exist_ok=True)
    if dest.strip() != dest:
        res = _hook(tmp_path, [_pin(rootfs / "ws", dest)])
        assert res.returncode == 1, res.stderr
        assert f"the mount at {dest} is not the directory" in res.stderr
    res = _hook(tmp_path, [_pin(rootfs / dest.lstrip("/"), dest)])
    assert res.returncode == 0, res.stderr


def test_close_gate_leaves_a_gate_another_process_opened_since(tmp_path: Path) -> None:
    """A foreground run closes its gate once its container has ended; by then a rollback (in
    another process, holding the name's lock) may have opened it again for the container it
    creates. Removing that gate failed the rollback's `podman create` (seen in CI)."""
    import time

    where = str(tmp_path)
    gate = Path(mountpin.open_gate(where))
    gate.unlink()  # the hook closed it when the container started
    time.sleep(0.02)  # (a file made in another tick of the kernel's coarse clock)
    gate.touch()  # another process opened it again
    mountpin.close_gate(where)
    assert gate.exists()
    # A gate this process opened and nobody closed is removed, as before.
    other = str(tmp_path / "b")
    mine = Path(mountpin.open_gate(other))
    mountpin.close_gate(other)
    assert not mine.exists()
