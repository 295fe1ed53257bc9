"""The podman flags a profile revision gives on this host, from the revision's stored form.

One builder for both run paths. The full path hands it `Profile.to_dict()`
(`argv.profile_flags`); the fast path (`linpodx.fastpath.plan.load`) hands it the `profile`
object of the revision file it has just read and checked, and takes a stored run plan only if
the plan's flags are exactly these. So an edited plan can never change what a run gets: only
the revision decides, and an edited revision is what `audit verify` compares with its
`profile.apply` record.

Standard library only (and `runline`, `errors`): this is on the fast path. The document is
the store's JSON, so every field is checked for its type here, and anything unexpected raises
InvalidInput (the fast path then takes no plan; the full path reports it).
"""

from __future__ import annotations

import os
import re

from linpodx.errors import InvalidInput
from linpodx.podman import runline
from linpodx.profile import HOME_DIR

TYPE_CHECKING = False  # the fast path's budget: linpodx/fastpath/__init__.py
if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence
    from typing import Any

HOME_TARGETS = (HOME_DIR, os.path.dirname(HOME_DIR))
_ENV_KEY_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*\Z")
_CAP_RE = re.compile(r"^[A-Z][A-Z0-9_]*\Z")
# Podman's --memory: a number with an optional b/k/m/g unit; --cpus: a decimal.
_MEMORY_RE = re.compile(r"^[0-9]+[bkmgBKMG]?\Z")
_CPUS_RE = re.compile(r"^[0-9]+(\.[0-9]+)?\Z")
# linpodx's own cgroup limits where a profile sets none and the host can apply them. They are
# a safety net, not the profile's promise: a host that cannot apply them is no reason to refuse.
DEFAULT_MEMORY = "2g"
DEFAULT_CPUS = "2"
DEFAULT_PIDS_LIMIT = 512
CGROUP_LIMITS = ("memory", "cpus", "pids_limit")
"""The profile's limits that need cgroups (`resources.enforcement` is about these)."""
REQUIRED = "required"
BEST_EFFORT = "best_effort"
_SIZE_RE = re.compile(r"^[1-9][0-9]{0,9}[kmg]\Z")
_LOG_MAX_DEFAULT = "64m"  # profile.model.Resources.log_max_size (not imported: fast path)


def labels(
    name: str, profile_id: str, revision: int, audit_hash: str
) -> tuple[tuple[str, str], ...]:
    """The labels every linpodx container carries."""
    return (
        ("linpodx.managed", "1"),
        ("linpodx.profile", name),
        ("linpodx.profile_id", profile_id),
        ("linpodx.revision", str(revision)),
        ("linpodx.audit_hash", audit_hash),
    )


def clamp_limit(name: str, wanted: int, hard: int | None) -> tuple[int, str | None]:
    """`wanted` if the host's hard limit allows it, else the hard limit and a note saying so.

    Clamping only ever lowers a limit (stricter than asked), so it is safe to do silently-ish;
    podman would otherwise fail with `setrlimit …: Operation not permitted`.
    """
    if hard is not None and wanted > hard:
        return hard, f"{name} limit {wanted} exceeds the host's hard limit {hard}; using {hard}"
    return wanted, None


def unenforced(res: Mapping[str, Any], cgroup_limits: bool) -> list[str]:
    """The cgroup limits the profile's `resources` (`res`, the stored form) set that this host
    cannot apply for this user (`cgroup_limits`: `probe.host_facts`)."""
    if cgroup_limits:
        return []
    return [k for k in CGROUP_LIMITS if res.get(k) is not None]


def enforceable(profile: str, res: Mapping[str, Any], cgroup_limits: bool) -> list[str]:
    """The limits a run of `profile` goes without (only with `enforcement: best_effort`);
    raises InvalidInput when the profile requires limits this host cannot apply."""
    missing = unenforced(res, cgroup_limits)
    enforcement = res.get("enforcement", REQUIRED)
    if enforcement not in (REQUIRED, BEST_EFFORT):
        raise _damaged(f"resources.enforcement is {enforcement!r}")
    if missing and enforcement != BEST_EFFORT:
        raise InvalidInput(
            f"profile {profile} sets resources.{', resources.'.join(missing)}, which this host "
            "cannot enforce for this user (rootless podman on cgroup v1 applies no cgroup "
            "limits, and on cgroup v2 none whose controller is not delegated to the user); "
            "refused rather than run without them",
            "run on a cgroup v2 host with the memory, cpu and pids controllers delegated to "
            "this user (`linpodx doctor` shows which limits apply here), or set "
            "`resources.enforcement: best_effort` in the profile to run without them",
        )
    return missing


def _damaged(what: str) -> InvalidInput:
    return InvalidInput(
        f"profile revision is damaged: {what}",
        "apply the profile again with `linpodx sandbox apply --profile FILE`",
    )


def _strings(value: object, what: str) -> list[str]:
    # A list in the store's JSON, a tuple in `Profile.to_dict()` (dataclasses.asdict).
    if not isinstance(value, (list, tuple)) or not all(type(v) is str for v in value):
        raise _damaged(f"{what} is not a list of strings")
    return list(value)


def _int(value: object, what: str) -> int:
    if type(value) is not int:
        raise _damaged(f"{what} is not an integer")
    return value


def profile_flags(
    doc: Mapping[str, Any],
    *,
    labels: Sequence[tuple[str, str]],
    rootless: bool,
    nofile_hard: int | None,
    nproc_hard: int | None,
    cgroup_limits: bool,
    init: bool,
    seccomp: str,
) -> list[str]:
    """The flags between `runline.head` and `runline.tail`: everything the profile revision
    (`doc`, a profile's `to_dict()` form) and this host decide: labels, privileges, limits,
    environment, workdir, the profile's mounts. `seccomp`: the path of linpodx's seccomp
    profile on this host (`linpodx.podman.seccomp`)."""
    res = doc.get("resources")
    env = doc.get("env")
    mounts = doc.get("mounts")
    workdir = doc.get("workdir")
    if type(res) is not dict or type(env) is not dict or not isinstance(mounts, (list, tuple)):
        raise _damaged("resources, env or mounts has the wrong type")
    if workdir is not None and type(workdir) is not str:
        raise _damaged("workdir is not a string")
    argv: list[str] = [f"--label={k}={v}" for k, v in labels]
    # Privileges: nothing the profile did not name.
    argv.append("--cap-drop=all")
    for cap in _strings(doc.get("cap_add"), "cap_add"):
        if not _CAP_RE.match(cap):
            raise InvalidInput(
                f"invalid capability name: {cap!r}", "use names like NET_BIND_SERVICE"
            )
        argv.append(f"--cap-add={cap}")
    argv.append("--security-opt=no-new-privileges")
    if not seccomp.startswith("/"):
        raise InvalidInput(
            f"the seccomp profile path {seccomp!r} is not absolute",
            "set LINPODX_STATE_DIR (or HOME) to an absolute path",
        )
    # No setuid/setgid files (linpodx.podman.seccomp): never podman's default alone.
    argv.append(f"--security-opt=seccomp={seccomp}")
    argv.append("--network=none")
    argv.append("--http-proxy=false")
    # A private IPC namespace (rootful podman's default is "shareable").
    argv.append("--ipc=private")
    argv.append("--systemd=false")
    argv.append("--read-only=false")
    if rootless:
        # The person's uid is the agent's uid: files written to writable mounts stay theirs.
        argv.append("--userns=keep-id")
    if init:
        argv.append("--init")
    # Limits. ulimits always (they also work rootless on cgroup v1).
    nofile, _ = clamp_limit("nofile", _int(res.get("nofile"), "nofile"), nofile_hard)
    nproc, _ = clamp_limit("nproc", _int(res.get("nproc"), "nproc"), nproc_hard)
    argv.append(f"--ulimit=nofile={nofile}:{nofile}")
    argv.append(f"--ulimit=nproc={nproc}:{nproc}")
    name = doc.get("name")
    enforceable(name if type(name) is str else "?", res, cgroup_limits)
    # The log file has a bound whatever containers.conf says (the driver is pinned: journald's
    # bounds are the host's, not the profile's). At max-size conmon empties the file and goes
    # on. A revision stored before the field existed gets the default.
    log_max = res.get("log_max_size", _LOG_MAX_DEFAULT)
    if type(log_max) is not str or not _SIZE_RE.match(log_max):
        raise _damaged("resources.log_max_size is not a size like 64m")
    argv.append("--log-driver=k8s-file")
    argv.append(f"--log-opt=max-size={log_max}")
    if cgroup_limits:
        memory, cpus = res.get("memory"), res.get("cpus")
        memory = DEFAULT_MEMORY if memory is None else memory
        cpus = DEFAULT_CPUS if cpus is None else cpus
        pids = res.get("pids_limit")
        if (
            type(memory) is not str
            or type(cpus) is not str
            or not _MEMORY_RE.match(memory)
            or not _CPUS_RE.match(cpus)
        ):
            raise InvalidInput(
                f"invalid resources: memory={memory!r} cpus={cpus!r}",
                "use memory like 512m or 2g and cpus like 1 or 1.5",
            )
        pids = DEFAULT_PIDS_LIMIT if pids is None else _int(pids, "pids_limit")
        argv.append(f"--pids-limit={pids}")
        argv.append(f"--memory={memory}")
        # No swap beyond the memory limit.
        argv.append(f"--memory-swap={memory}")
        argv.append(f"--cpus={cpus}")
    # Environment: HOME, then exactly the profile's variables (always KEY=VALUE: a bare KEY or
    # a KEY* pattern would make podman copy it from the host).
    argv.append(f"--env=HOME={HOME_DIR}")
    for key, value in env.items():
        if type(value) is not str:
            raise _damaged(f"the value of env {key!r} is not a string")
        if not _ENV_KEY_RE.match(key):
            raise InvalidInput(
                f"invalid environment variable name: {key!r}", "use [A-Za-z_][A-Za-z0-9_]*"
            )
        argv.append(f"--env={key}={value}")
    argv.append(f"--workdir={workdir or HOME_DIR}")
    for m in mounts:
        if type(m) is not dict:
            raise _damaged("a mount is not an object")
        source, target, read_only = m.get("source"), m.get("target"), m.get("read_only")
        if type(source) is not str or type(target) is not str or type(read_only) is not bool:
            raise _damaged("a mount's source, target or read_only has the wrong type")
        if target in HOME_TARGETS:
            # The loader refuses these; a revision stored before it did still reaches here.
            # Over `$HOME` a `--rm` container gets two mounts at one destination (podman
            # refuses it), another gets `$HOME` made by `podman cp` (chowning) in the host path.
            raise InvalidInput(
                f"mount target {target} is linpodx's $HOME ({HOME_DIR}) or holds it",
                "apply the profile again with another target, e.g. /workspace or "
                f"{HOME_DIR}/work",
            )
        argv.append(runline.mount_arg(source, target, read_only))
    return argv


WILDCARD_BUDGET_DEFAULT = 100
"""`Network.wildcard_budget`'s default, without importing the profile model on the fast run
path (a unit test holds the two, the schema's and the guard's equal)."""
MAX_CONNECTIONS_DEFAULT = 512
MAX_NEW_CONNECTIONS_PER_SECOND_DEFAULT = 100
"""`Network.max_connections` and `.max_new_connections_per_second` defaults, for the same
reason (held equal to the model's, the schema's and the checker's by the same test)."""
HELPER_MAX_FILES_DEFAULT = 4096
HELPER_MAX_MEMORY_MIB_DEFAULT = 1024
"""`Network.helper_max_files` and `.helper_max_memory_mib` defaults (the same test)."""


def egress_policy(
    name: str, profile_id: str, revision: int, network: Mapping[str, Any]
) -> dict[str, Any]:
    """The policy an egress guard is given for a revision (`network`: the profile's
    `to_dict()["network"]`); the same for the full and the fast path."""
    return {
        "profile": name,
        "profile_id": profile_id,
        "revision": int(revision),
        "allowlist": list(network["egress_dns_allowlist"]),
        "upstream_dns": list(network["upstream_dns"]),
        "allow_private_answers": bool(network["allow_private_answers"]),
        # Absent from revisions stored before it existed (`Profile.digest_form`): the default.
        "wildcard_budget": int(network.get("wildcard_budget", WILDCARD_BUDGET_DEFAULT)),
        "max_connections": int(network.get("max_connections", MAX_CONNECTIONS_DEFAULT)),
        "max_new_connections_per_second": int(
            network.get(
                "max_new_connections_per_second", MAX_NEW_CONNECTIONS_PER_SECOND_DEFAULT
            )
        ),
        "helper_max_files": int(network.get("helper_max_files", HELPER_MAX_FILES_DEFAULT)),
        "helper_max_memory_mib": int(
            network.get("helper_max_memory_mib", HELPER_MAX_MEMORY_MIB_DEFAULT)
        ),
    }
