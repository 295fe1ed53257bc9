"""Where one container's egress files live (under the container's state dir), and what the
guard's own file says about it (`status`): `linpodx ps` reads that for every row, and it must
not load the guard's machinery (netns, ctypes, locks) to do so (bench/bench_cli.py)."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from linpodx.egress import launch as names
from linpodx.fsutil import NotRegularFile, read_small
from linpodx.paths import containers_dir, ensure_dir
from linpodx.podman.runline import INIT_PIDFILE

MAX_STATE_BYTES = 4 << 20
"""The most of a guard state file (policy.json, guard.json) that is read."""


class EgressState:
    """Paths of one container's egress guard files. (A plain class, not a dataclass:
    `dataclasses` costs `linpodx ps` 4 ms of imports.)"""

    __slots__ = ("name",)

    def __init__(self, name: str) -> None:
        self.name = name

    def __repr__(self) -> str:
        return f"EgressState({self.name!r})"

    @property
    def dir(self) -> Path:
        return containers_dir() / self.name / names.EGRESS_DIR

    def ensure(self) -> Path:
        ensure_dir(self.dir.parent)
        return ensure_dir(self.dir)

    @property
    def resolv_conf(self) -> Path:
        """Bind-mounted over the container's /etc/resolv.conf; names only our resolver."""
        return self.dir / names.RESOLV_CONF_FILE

    @property
    def policy_file(self) -> Path:
        """What the guard enforces; rewritten atomically by a re-apply."""
        return self.dir / names.POLICY_FILE

    @property
    def init_pidfile(self) -> Path:
        """The container's init pid, written by `podman init` (see INIT_PIDFILE)."""
        return self.dir / INIT_PIDFILE

    @property
    def hooks_dir(self) -> Path:
        """OCI hooks dir of a one-call run (`podman --hooks-dir`); see guard.hook_setup."""
        return self.dir / names.HOOKS_DIR

    @property
    def hook_fifo(self) -> Path:
        """FIFO through which the createRuntime hook hands over the OCI state (with the pid)."""
        return self.dir / names.HOOK_FIFO

    @property
    def hook_answer_fifo(self) -> Path:
        """FIFO on which `linpodx run` answers the hook (see guard.hook_release)."""
        return self.dir / names.HOOK_ANSWER_FIFO

    @property
    def guard_file(self) -> Path:
        """The guard's own state: pid, container pid, helper, applied revision."""
        return self.dir / names.GUARD_FILE

    @property
    def guard_log(self) -> Path:
        return self.dir / names.GUARD_LOG

    @property
    def helper_log(self) -> Path:
        return self.dir / names.HELPER_LOG

    @property
    def pasta_pidfile(self) -> Path:
        """pasta's pid, written by the pasta keeper it runs under."""
        return self.dir / names.PASTA_PIDFILE

    @property
    def pasta_netns(self) -> Path:
        """Rootful pasta: an empty file the keeper binds the container's netns onto, in a
        mount namespace only the keeper and pasta see."""
        return self.dir / names.PASTA_NETNS


def read_json(path: Path) -> Any:
    """The JSON in one of the guard's files, None if it is missing or not what we wrote. Read
    without following a link or blocking on a FIFO (`fsutil.read_small`): a FIFO there must
    not hang `sandbox apply`, a start or `ps`."""
    try:
        raw = read_small(path, MAX_STATE_BYTES)
        return json.loads(raw) if raw is not None else None
    except (OSError, ValueError, NotRegularFile):
        return None


def read_guard(st: EgressState) -> dict[str, Any] | None:
    data = read_json(st.guard_file)
    return data if isinstance(data, dict) else None


def guard_alive(info: dict[str, Any], name: str) -> bool:
    """The recorded guard pid is alive and really is this container's guard."""
    pid = info.get("guard_pid")
    if not isinstance(pid, int):
        return False
    try:
        if os.stat(f"/proc/{pid}").st_uid != os.getuid():
            return False  # a pid reused by someone else's process (ours runs as us)
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        stat_line = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    if stat_line.rsplit(")", 1)[-1].split()[0] == "Z":
        return False
    is_guard = names.GUARD_MODULE.encode() in cmdline or names.GUARD_COMMAND.encode() in cmdline
    return is_guard and name.encode() in cmdline


def policy_revision(name: str) -> int | None:
    """The policy revision container `name`'s guard reports it enforces (guard.json), None if
    it reports none."""
    info = read_guard(EgressState(name))
    rev = info.get("policy_revision") if info is not None else None
    return rev if isinstance(rev, int) and not isinstance(rev, bool) else None


def status(name: str) -> str:
    """`none` (no egress for this container), `healthy` (guard up, container running) or
    `down` (egress configured but no working guard: the container has no network)."""
    st = EgressState(name)
    if not st.policy_file.exists():
        return "none"
    info = read_guard(st)
    if info is None or info.get("state") != "ready" or not guard_alive(info, name):
        return "down"
    cpid = info.get("container_pid")
    if not isinstance(cpid, int) or not Path(f"/proc/{cpid}").exists():
        return "down"
    return "healthy"
