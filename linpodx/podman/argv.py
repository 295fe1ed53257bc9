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
from dataclasses import dataclass, field

from linpodx import paths
from linpodx.errors import EngineError
from linpodx.podman import flags, mountpin, runline
from linpodx.podman.flags import clamp_limit
from linpodx.profile.model import Profile

LABEL_PREFIX = "linpodx."


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
    seccomp: str | None = None
    """linpodx's seccomp profile on this host (`seccomp.ensure`); a spec without one is
    refused (never podman's default alone)."""


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
    """Image reference."""
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
    pull: str = "never"
    """podman's `--pull` (`runline.create_pull`): `never` unless the run asked for a pull,
    which linpodx has then done before (`linpodx.containers.images`). Rollback never pulls."""
    env_keys: tuple[str, ...] = ()
    """Names of the run's own variables (`run -e`/`--env-file`); their values are in no spec,
    only in the memory file `env_file` names (`linpodx.containers.runenv`)."""
    env_file: str | None = None
    """`/dev/fd/N` of the memory file podman reads those values from, while it runs."""
    secrets: tuple[str, ...] = ()
    """podman `--secret` values of the run (secret names and targets: never a secret's value)."""

def labels(spec: CreateSpec) -> tuple[tuple[str, str], ...]:
    """The labels every linpodx container carries."""
    return flags.labels(spec.profile_name, spec.profile_id, spec.revision, spec.audit_hash)

def build_create_argv(spec: CreateSpec) -> tuple[str, ...]:
    """The full `podman create …` argv (without the podman binary itself) for `spec`.

    Raises InvalidInput for values podman could misread (never passes them through).
    """
    pidfile = None
    if spec.resolv_conf is not None:
        pidfile = f"{spec.resolv_conf.rsplit('/', 1)[0]}/{runline.INIT_PIDFILE}"
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
            pull=spec.pull,
            env_file=spec.env_file,
            secrets=spec.secrets,
            rm=spec.rm,
            interactive=spec.interactive,
            tty=spec.tty,
            image=spec.image,
            command=spec.command,
        ),
    )


def profile_flags(spec: CreateSpec) -> list[str]:
    """The flags between `runline.head` and `runline.tail`: everything the profile revision and
    this host decide (labels, privileges, limits, environment, workdir, the profile's mounts),
    built by `flags.profile_flags` from the profile's stored form, as the fast path checks a
    run plan against it (`linpodx.fastpath.plan`).

    Depends on nothing of the spec but `profile`, `profile_name`, `profile_id`, `revision`,
    `audit_hash`, `rootless` and `host`: `linpodx.fastpath.plan` stores it for the fast run
    path, keyed by exactly those (tests/unit/test_fastrun.py holds them equal).
    """
    if spec.host.seccomp is None:
        raise EngineError(
            "no seccomp profile for the container",
            "this is a bug in linpodx: the host facts were made without `seccomp.ensure`",
        )
    return flags.profile_flags(
        spec.profile.to_dict(),
        labels=labels(spec),
        rootless=spec.rootless,
        nofile_hard=spec.host.nofile_hard,
        nproc_hard=spec.host.nproc_hard,
        cgroup_limits=spec.host.cgroup_limits,
        init=spec.host.init,
        seccomp=spec.host.seccomp,
    )


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
        missing = flags.unenforced(spec.profile.to_dict()["resources"], False)
        what = (
            f"the profile's {', '.join(missing)} (enforcement: best_effort) are not applied"
            if missing
            else "linpodx's default cgroup limits (pids, memory, cpus) are not applied"
        )
        notes.append(
            f"{what}: this host cannot apply cgroup limits for this user (rootless on cgroup "
            f"v1); processes are bounded by RLIMIT_NPROC={nproc}"
        )
    return notes
