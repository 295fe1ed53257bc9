"""Pinned bind mounts: the container gets exactly the directory (or file) linpodx checked.

linpodx checks every mount source on the host before each run and start
(`linpodx.profile.hostpaths`), but runc mounts the source again *by its path* moments later.
An agent with a writable mount over a source's parent can swap the source for a symlink to
`~/.ssh` in between, and a loop that keeps swapping wins that race often. So the check also
notes the identity (device, inode) of what it checked, found by walking the resolved path one
component at a time without following any symlink (`hostpaths.identity`), and an OCI `createRuntime`
hook (`mountcheck.sh`) compares it with what runc really mounted before the container's
command may start. A swap after the check then means the container does not start.

The hook needs `podman --hooks-dir=DIR` on every podman call that makes the mounts (`run`,
`init`, `start`). A plain `podman start`/`restart` outside linpodx would run no hook (nor
linpodx's check), so a container with mounts also bind-mounts a *gate*: an empty file in its
state dir that exists only while linpodx starts it. `setup` opens the gate (creates the file);
the hook closes it (removes it) before it checks anything, once runc has mounted it. A plain
start then fails in runc (as root: "error mounting …/use-linpodx-start: no such file or
directory"; rootless: "can't get final child's PID from pipe") before the container's command
could run with unchecked mounts; `linpodx start` opens the gate again after checking the
sources afresh.

Standard library's cheapest modules only: the fast run path uses this before podman starts.
"""

from __future__ import annotations

import json
import os

from linpodx import paths
from linpodx.fsutil import atomic_write

HOOK_SHELL = "/bin/sh"
HOOK_SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "mountcheck.sh")
MOUNTS_DIR = "mounts"
"""Under the container's state dir: the hooks dir and the expectations."""
HOOKS_DIR = "hooks"
HOOK_FILE = "linpodx-mounts.json"
EXPECT_FILE = "expect"
GATE_FILE = "use-linpodx-start"
"""The gate's name, which is what a plain `podman start`'s error message shows."""
HOOK_TIMEOUT = 30
"""Seconds runc gives the hook (it only reads two files and runs `stat` per mount)."""

TYPE_CHECKING = False  # the fast path's budget: linpodx/fastpath/__init__.py
if TYPE_CHECKING:
    from collections.abc import Sequence

Pin = tuple[int, int, str]
"""(device, inode, destination in the container)"""


def gate_path(container_dir: str) -> str:
    """The gate of the container whose state dir is `container_dir` (see the module doc)."""
    return os.path.join(container_dir, MOUNTS_DIR, GATE_FILE)


_OPENED: dict[str, tuple[int, int, int]] = {}
"""The gates this process opened: path -> (device, inode, ctime in ns) of the file it made."""


def open_gate(container_dir: str) -> str:
    """Create the gate file (podman needs it at `create`, runc at every mount); its path."""
    gate = gate_path(container_dir)
    paths.ensure_dir_str(os.path.dirname(gate))
    fd = os.open(gate, os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        st = os.fstat(fd)
    finally:
        os.close(fd)
    _OPENED[gate] = (st.st_dev, st.st_ino, st.st_ctime_ns)
    return gate


def close_gate(container_dir: str) -> None:
    """Remove the gate file if it is the one this process opened (the hook normally has
    removed it; this covers a podman call that failed before runc ran it).

    A gate another linpodx process opened since is left alone: a foreground `linpodx run`
    closes its gate once its container has ended, and by then a rollback (holding the name's
    lock) may have opened the gate again for the container it creates, whose `podman create`
    then failed on the missing file (seen in CI). That process closes its own."""
    gate = gate_path(container_dir)
    opened = _OPENED.pop(gate, None)
    try:
        st = os.lstat(gate)
    except FileNotFoundError:
        return
    if opened is not None and opened != (st.st_dev, st.st_ino, st.st_ctime_ns):
        return
    try:
        os.unlink(gate)
    except FileNotFoundError:
        pass


def setup(container_dir: str, pins: Sequence[Pin]) -> str | None:
    """Write the mount-check hook and its expectations under `container_dir` and open the
    gate; returns the hooks dir for `podman --hooks-dir=`, or None when there is no mount to
    check."""
    if not pins:
        return None
    where = paths.ensure_dir_str(os.path.join(container_dir, MOUNTS_DIR))
    hooks = paths.ensure_dir_str(os.path.join(where, HOOKS_DIR))
    expect = os.path.join(where, EXPECT_FILE)
    lines = "".join(f"{dev} {ino} {dest}\n" for dev, ino, dest in pins)
    atomic_write(expect, lines.encode(), durable=False)
    gate = open_gate(container_dir)
    hook = {
        "version": "1.0.0",
        "hook": {
            "path": HOOK_SHELL,
            "args": [HOOK_SHELL, HOOK_SCRIPT, expect, gate],
            "timeout": HOOK_TIMEOUT,
        },
        "when": {"always": True},
        "stages": ["createRuntime"],
    }
    atomic_write(os.path.join(hooks, HOOK_FILE), json.dumps(hook).encode(), durable=False)
    return hooks


def flags_of(container_dir: str) -> list[str]:
    """The global flags for the hooks dir `setup` last wrote under `container_dir`, if any."""
    hooks = os.path.join(container_dir, MOUNTS_DIR, HOOKS_DIR)
    return hooks_flags(hooks if os.path.exists(os.path.join(hooks, HOOK_FILE)) else None)


def hooks_flags(hooks: str | None) -> list[str]:
    """podman's global flags for the hooks dir `setup` returned (none for None)."""
    return [f"--hooks-dir={hooks}"] if hooks else []
