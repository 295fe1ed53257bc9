"""The pure podman argv builder: a `CreateSpec` in, an argv tuple out. Nothing here runs anything.

Every hardening choice is made here, in one place, so the unit tests can pin the exact argv:

- `--cap-drop=all` then only the profile's `cap_add`; `--security-opt=no-new-privileges`.
- `--network=none` always: the egress guard attaches filtered network after `podman init`, so a
  plain `podman start` outside linpodx gets no network at all.
- `--http-proxy=false`: podman copies the host's `*_proxy` variables into containers by default,
  which would leak host environment; only the profile's `env` is set (never `--env-host`).
- limits: `--ulimit nofile/nproc` always (RLIMIT_NPROC also bounds a fork bomb where cgroup
  limits are unavailable: rootless on cgroup v1); `--pids-limit/--memory/--cpus` when the host
  can apply cgroup limits.
- mounts as `--mount=type=bind,…,ro=true` unless the profile says `read_only: false`,
  `bind-propagation=rprivate` so host mount events never propagate in either direction.
- `$HOME` is `/home/agent` in the container's own rootfs (created by the engine before the first
  start, so it survives restarts and is part of `podman commit`); `--rm` containers, which are
  never restarted, get a private tmpfs there instead (saves a `podman cp` per run).
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field

from linpodx import paths
from linpodx.egress.launch import INIT_PIDFILE
from linpodx.errors import InvalidInput
from linpodx.podman import mountpin, runline
from linpodx.podman.runline import HOME_DIR
from linpodx.profile.model import Profile

LABEL_PREFIX = "linpodx."
MANAGED_LABEL = "linpodx.managed"

_HOME_TARGETS = (HOME_DIR, os.path.dirname(HOME_DIR))
_ENV_KEY_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*\Z")
_CAP_RE = re.compile(r"^[A-Z][A-Z0-9_]*\Z")
# Podman's --memory: a number with an optional b/k/m/g unit; --cpus: a decimal.
_MEMORY_RE = re.compile(r"^[0-9]+[bkmgBKMG]?\Z")
_CPUS_RE = re.compile(r"^[0-9]+(\.[0-9]+)?\Z")


@dataclass(frozen=True)
class HostLimits:
    """Host facts that shape the argv (from `probe`)."""

    nofile_hard: int | None = None
    """Hard RLIMIT_NOFILE of the caller (None: unlimited); a container cannot get more."""
    nproc_hard: int | None = None
    """Hard RLIMIT_NPROC of the caller (None: unlimited)."""
    cgroup_limits: bool = True
    """False where podman cannot apply cgroup limits (rootless on cgroup v1)."""
    init: bool = True
    """podman's init binary (catatonit) exists, so `--init` reaps zombies and forwards signals."""


@dataclass(frozen=True)
class CreateSpec:
    """Everything `podman create` needs, already decided. Frozen; hashed into nothing."""

    profile: Profile
    """The validated profile the container runs under."""
    profile_name: str
    """Name the profile was applied under (`default` for the built-in)."""
    profile_id: str
    """Stored profile id (`prof_…`, or `builtin` for the built-in default)."""
    revision: int
    """Profile revision (0 for the built-in default)."""
    audit_hash: str
    """The audit hash of that revision (labels record it)."""
    image: str
    """Image reference; must already be in this user's store (`--pull=never`)."""
    name: str
    """Container name (also its hostname)."""
    command: tuple[str, ...] = ()
    """Command and arguments; empty means the image's default."""
    interactive: bool = False
    tty: bool = False
    rm: bool = False
    """Remove the container when its command exits."""
    rootless: bool = False
    """Running as a normal user: `--userns=keep-id` maps the person's uid into the container."""
    resolv_conf: str | None = None
    """Host file bind-mounted read-only over /etc/resolv.conf (the egress guard's resolver)."""
    host: HostLimits = field(default_factory=HostLimits)
    """Host facts (hard limits, cgroup support)."""
    hostname: str | None = None
    """Hostname inside; defaults to `name` (rollback creates under a temp name, same hostname)."""






def clamp_limit(name: str, wanted: int, hard: int | None) -> tuple[int, str | None]:
    """`wanted` if the host's hard limit allows it, else the hard limit and a note saying so.

    Clamping only ever lowers a limit (stricter than asked), so it is safe to do silently-ish;
    podman would otherwise fail with `setrlimit …: Operation not permitted`.
    """
    if hard is not None and wanted > hard:
        return hard, f"{name} limit {wanted} exceeds the host's hard limit {hard}; using {hard}"
    return wanted, None




def labels(spec: CreateSpec) -> tuple[tuple[str, str], ...]:
    """The labels every linpodx container carries."""
    return (
        (MANAGED_LABEL, "1"),
        ("linpodx.profile", spec.profile_name),
        ("linpodx.profile_id", spec.profile_id),
        ("linpodx.revision", str(spec.revision)),
        ("linpodx.audit_hash", spec.audit_hash),
    )




def build_create_argv(spec: CreateSpec) -> tuple[str, ...]:
    """The full `podman create …` argv (without the podman binary itself) for `spec`.

    Raises InvalidInput for values podman could misread (never passes them through).
    """
    pidfile = None
    if spec.resolv_conf is not None:
        pidfile = f"{spec.resolv_conf.rsplit('/', 1)[0]}/{INIT_PIDFILE}"
    head = runline.head(spec.name, spec.hostname)  # validates the name before it makes a path
    gate = None
    if spec.profile.mounts:
        gate = mountpin.gate_path(os.path.join(paths.containers_root(), spec.name))
    return (
        *head,
        *profile_flags(spec),
        *runline.tail(
            mount_gate=gate,
            resolv_conf=spec.resolv_conf,
            pidfile=pidfile,
            rm=spec.rm,
            interactive=spec.interactive,
            tty=spec.tty,
            image=spec.image,
            command=spec.command,
        ),
    )


def profile_flags(spec: CreateSpec) -> list[str]:
    """The flags between `runline.head` and `runline.tail`: everything the profile revision and
    this host decide (labels, privileges, limits, environment, workdir, the profile's mounts).

    Depends on nothing of the spec but `profile`, `profile_name`, `profile_id`, `revision`,
    `audit_hash`, `rootless` and `host`: `linpodx.runplan` stores it for the fast run path,
    keyed by exactly those (tests/unit/test_runplan.py holds them equal).
    """
    p = spec.profile
    res = p.resources
    argv: list[str] = [f"--label={k}={v}" for k, v in labels(spec)]
    # Privileges: nothing the profile did not name.
    argv.append("--cap-drop=all")
    for cap in p.cap_add:
        if not _CAP_RE.match(cap):
            raise InvalidInput(
                f"invalid capability name: {cap!r}", "use names like NET_BIND_SERVICE"
            )
        argv.append(f"--cap-add={cap}")
    argv.append("--security-opt=no-new-privileges")
    argv.append("--network=none")
    argv.append("--http-proxy=false")
    # A private IPC namespace (rootful podman's default is "shareable").
    argv.append("--ipc=private")
    argv.append("--systemd=false")
    # Images come only from this user's store: a missing image is an error, never a pull.
    argv.append("--pull=never")
    argv.append("--read-only=false")
    if spec.rootless:
        # The person's uid is the agent's uid: files written to writable mounts stay theirs.
        argv.append("--userns=keep-id")
    if spec.host.init:
        argv.append("--init")
    # Limits. ulimits always (they also work rootless on cgroup v1).
    nofile, _ = clamp_limit("nofile", res.nofile, spec.host.nofile_hard)
    nproc, _ = clamp_limit("nproc", res.nproc, spec.host.nproc_hard)
    argv.append(f"--ulimit=nofile={nofile}:{nofile}")
    argv.append(f"--ulimit=nproc={nproc}:{nproc}")
    if spec.host.cgroup_limits:
        if not _MEMORY_RE.match(res.memory) or not _CPUS_RE.match(res.cpus):
            raise InvalidInput(
                f"invalid resources: memory={res.memory!r} cpus={res.cpus!r}",
                "use memory like 512m or 2g and cpus like 1 or 1.5",
            )
        argv.append(f"--pids-limit={res.pids_limit}")
        argv.append(f"--memory={res.memory}")
        # No swap beyond the memory limit.
        argv.append(f"--memory-swap={res.memory}")
        argv.append(f"--cpus={res.cpus}")
    # Environment: HOME, then exactly the profile's variables (always KEY=VALUE: a bare KEY or
    # a KEY* pattern would make podman copy it from the host).
    argv.append(f"--env=HOME={HOME_DIR}")
    for key, value in p.env:
        if not _ENV_KEY_RE.match(key):
            raise InvalidInput(
                f"invalid environment variable name: {key!r}", "use [A-Za-z_][A-Za-z0-9_]*"
            )
        argv.append(f"--env={key}={value}")
    argv.append(f"--workdir={p.workdir or HOME_DIR}")
    for m in p.mounts:
        if m.target in _HOME_TARGETS:
            # The loader refuses these; a revision stored before it did still reaches here.
            # Over `$HOME` a `--rm` container gets two mounts at one destination (podman
            # refuses it), another gets `$HOME` made by `podman cp` (chowning) in the host path.
            raise InvalidInput(
                f"mount target {m.target} is linpodx's $HOME ({HOME_DIR}) or holds it",
                "apply the profile again with another target, e.g. /workspace or "
                f"{HOME_DIR}/work",
            )
        argv.append(runline.mount_arg(m.source, m.target, m.read_only))
    return argv


def build_run_argv(spec: CreateSpec, cidfile: str) -> tuple[str, ...]:
    """`podman run` with exactly the create argv's flags, writing the new id to `cidfile`.

    For foreground runs that need nothing between create and start (see
    `containers.run_foreground`): one podman process instead of two.
    """
    return tuple(runline.run_form(list(build_create_argv(spec)), cidfile))


def limit_notes(spec: CreateSpec) -> list[str]:
    """Human notes about limits that were lowered or could not be applied on this host."""
    res = spec.profile.resources
    notes = [
        n
        for n in (
            clamp_limit("nofile", res.nofile, spec.host.nofile_hard)[1],
            clamp_limit("nproc", res.nproc, spec.host.nproc_hard)[1],
        )
        if n
    ]
    if not spec.host.cgroup_limits:
        nproc = clamp_limit("nproc", res.nproc, spec.host.nproc_hard)[0]
        notes.append(
            "cgroup limits (pids, memory, cpus) cannot be applied rootless on cgroup v1; "
            f"processes are bounded by RLIMIT_NPROC={nproc}"
        )
    return notes
