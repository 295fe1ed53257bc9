"""Host facts the argv builder and `linpodx doctor` need, read cheaply (no `podman info` on the
run path: it costs a podman start-up).

Imports only the standard library's cheapest modules: `linpodx.fastpath.run` reads these facts
before it starts podman (see there), so this module must not pull in the argv builder.
"""

from __future__ import annotations

import os
import resource
from functools import lru_cache

TYPE_CHECKING = False  # the fast path's budget: linpodx/fastpath/__init__.py
if TYPE_CHECKING:
    from linpodx.podman.argv import HostLimits

HostFacts = tuple[bool, int | None, int | None, bool, bool]
"""(rootless, nofile_hard, nproc_hard, cgroup_limits, init): what `host_limits` is made of."""

MIN_PODMAN = (4, 3)
"""The oldest podman linpodx is tested with."""
PASTA_PODMAN = (5, 0)
"""podman from here on uses pasta for rootless networking by default (`--network pasta`)."""
INIT_PATHS = (
    "/usr/libexec/podman/catatonit",
    "/usr/bin/catatonit",
    "/usr/libexec/catatonit/catatonit",
)


def rootless() -> bool:
    """True when linpodx runs as a normal user (rootless podman)."""
    return os.geteuid() != 0


def cgroup_version() -> int:
    """2 if /sys/fs/cgroup is the unified (v2) hierarchy, else 1 (v1 or hybrid)."""
    try:
        with open("/proc/self/mounts", encoding="utf-8") as f:
            for line in f:
                parts = line.split()
                if len(parts) >= 3 and parts[1] == "/sys/fs/cgroup":
                    return 2 if parts[2] == "cgroup2" else 1
    except OSError:
        pass
    return 1


CGROUP_ROOT = "/sys/fs/cgroup"
SELF_CGROUP = "/proc/self/cgroup"
LIMIT_CONTROLLERS = frozenset({"memory", "cpu", "pids"})
"""The cgroup v2 controllers the profile's memory, cpus and pids_limit need."""


def user_controllers(uid: int) -> frozenset[str]:
    """The cgroup v2 controllers rootless podman can use for `uid`: those delegated to the
    user's systemd manager (where podman puts rootless containers, and the file podman itself
    reads), else those of this process's own cgroup; none if neither can be read."""
    own = None
    try:
        with open(SELF_CGROUP, encoding="utf-8") as f:
            for line in f:
                if line.startswith("0::/"):
                    own = line[3:].strip()
    except OSError:
        pass
    places = [f"{CGROUP_ROOT}/user.slice/user-{uid}.slice/user@{uid}.service"]
    if own is not None:
        places.append(CGROUP_ROOT + own.rstrip("/"))
    for place in places:
        try:
            with open(f"{place}/cgroup.controllers", encoding="utf-8") as f:
                return frozenset(f.read().split())
        except OSError:
            continue
    return frozenset()


def cgroup_limits_apply(is_rootless: bool) -> bool:
    """Whether podman applies memory, cpus and pids limits for this caller. Rootless podman on
    cgroup v1 applies none; on v2 it drops, with only a warning, a limit whose controller is not
    delegated to the user (a run would go without it), so all three must be there."""
    if not is_rootless:
        return True
    if cgroup_version() == 1:
        return False
    return LIMIT_CONTROLLERS <= user_controllers(os.getuid())


def _hard(which: int) -> int | None:
    hard = resource.getrlimit(which)[1]
    return None if hard == resource.RLIM_INFINITY else hard


def init_binary() -> str | None:
    """podman's `--init` binary if installed (catatonit)."""
    for p in INIT_PATHS:
        if os.access(p, os.X_OK):
            return p
    return None


def host_facts() -> HostFacts:
    """Everything about this host and caller that shapes the argv, as plain values."""
    is_rootless = rootless()
    return (
        is_rootless,
        _hard(resource.RLIMIT_NOFILE),
        _hard(resource.RLIMIT_NPROC),
        cgroup_limits_apply(is_rootless),
        init_binary() is not None,
    )


@lru_cache(maxsize=1)
def host_limits() -> HostLimits:
    """Hard rlimits, whether cgroup limits apply, whether `--init` is available."""
    from linpodx.podman.argv import HostLimits

    _, nofile, nproc, cgroup_limits, init = host_facts()
    return HostLimits(
        nofile_hard=nofile, nproc_hard=nproc, cgroup_limits=cgroup_limits, init=init
    )


def parse_version(text: str) -> tuple[int, int, int] | None:
    """`podman version 4.3.1` or `4.3.1` -> (4, 3, 1); None if it does not parse."""
    for word in text.split():
        bits = word.split(".")
        if len(bits) >= 2 and all(b.split("-")[0].isdigit() for b in bits[:3]):
            nums = [int(b.split("-")[0]) for b in bits[:3]]
            while len(nums) < 3:
                nums.append(0)
            return nums[0], nums[1], nums[2]
    return None
