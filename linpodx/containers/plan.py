"""The plan of a run, from the request, the profile revision and this host's facts: the
CreateSpec (argv inputs), its `container.run` record, and which run it takes (`one_call`).
It checks (mount sources, limits), it never changes anything."""

from __future__ import annotations

import secrets
from dataclasses import replace
from typing import Any

from linpodx.containers.request import RunRequest
from linpodx.containers.runenv import RunEnv
from linpodx.containers.state import SPEC_VERSION
from linpodx.errors import (
    InvalidInput,
)
from linpodx.fastpath import plan as runplan
from linpodx.podman import flags, mountpin, probe, seccomp
from linpodx.podman.argv import (
    CreateSpec,
    HostLimits,
)
from linpodx.podman.runline import create_pull, pull_policy, validate_image, validate_name
from linpodx.profile import hostpaths
from linpodx.profile.model import ProfileRef


def needs_guard(ref: ProfileRef) -> bool:
    """A non-empty allowlist means filtered network attached after `podman init`."""
    return bool(ref.profile.network.egress_dns_allowlist)


def check_mount_sources(ref: ProfileRef) -> list[mountpin.Pin]:
    """Check every mount source of the profile on the host again, as `sandbox apply` did:
    InvalidInput if one is now missing, sensitive, or a symlink to something sensitive (an
    agent with a writable mount can turn a path into one between two runs). Returns what was
    checked, pinned: (device, inode, target) per mount (`linpodx.podman.mountpin`)."""
    pins: list[mountpin.Pin] = []
    for m in ref.profile.mounts:
        ident, problem, hint = hostpaths.pin_mount_source(m.source)
        if problem or ident is None:
            raise InvalidInput(
                f"profile {ref.name}: {problem}",
                f"{hint + '; ' if hint else ''}it was checked when the profile was applied and is "
                "checked again before every start; fix the path on the host or re-apply",
            )
        pins.append((ident[0], ident[1], m.target))
    return pins


def host_limits() -> HostLimits:
    """The host facts a container's argv needs, with linpodx's seccomp profile written
    (`linpodx.podman.seccomp`: once per content)."""
    return replace(probe.host_limits(), seccomp=seccomp.ensure())


def unapplied_limits(ref: ProfileRef) -> list[str]:
    """The cgroup limits of `ref`'s profile that a run on this host goes without (only under
    `resources.enforcement: best_effort`); InvalidInput, before anything is recorded, when the
    profile requires them and this host cannot apply them for this user."""
    return flags.enforceable(
        ref.name, ref.profile.to_dict()["resources"], probe.host_limits().cgroup_limits
    )


def run_env(req: RunRequest, ref: ProfileRef) -> RunEnv:
    """The run's `-e`/`--env-file`/`--secret` (`linpodx.containers.runenv`), checked against
    what the profile sets."""
    from linpodx.containers import runenv
    from linpodx.profile import HOME_DIR

    reserved = {"HOME": f"linpodx (HOME={HOME_DIR})"}
    reserved.update({k: f"profile {ref.name}" for k in ref.profile.env})
    return runenv.resolve(req.env, req.env_files, req.secrets, reserved=reserved)


def make_spec(
    req: RunRequest,
    ref: ProfileRef,
    *,
    resolv_conf: str | None = None,
    env: RunEnv | None = None,
) -> CreateSpec:
    """The CreateSpec for a run request under a profile revision on this host; the profile's
    mount sources are checked again (`check_mount_sources`). `env`: the run's own environment
    (`run_env`); only its names and secret names reach the spec."""
    # An explicit empty --name is a mistake, not a request for a generated name.
    name = f"linpodx-{secrets.token_hex(4)}" if req.name is None else req.name
    validate_name(name)
    validate_image(req.image)
    pull = create_pull(pull_policy(req.pull))
    check_mount_sources(ref)
    unapplied_limits(ref)
    if req.tty and not req.interactive and not req.detach:
        # podman start --attach without -i would leave the terminal without input.
        raise InvalidInput("--tty needs --interactive (or --detach)", "use -it for a terminal")
    return CreateSpec(
        profile=ref.profile,
        profile_name=ref.name,
        profile_id=ref.profile_id,
        revision=ref.revision,
        audit_hash=ref.audit_hash,
        image=req.image,
        name=name,
        command=tuple(req.command),
        interactive=req.interactive,
        tty=req.tty,
        rm=req.rm,
        rootless=probe.rootless(),
        resolv_conf=resolv_conf,
        host=host_limits(),
        pull=pull,
        env_keys=env.keys if env is not None else (),
        secrets=env.secrets if env is not None else (),
    )


def run_record(spec: CreateSpec, ref: ProfileRef) -> dict[str, Any]:
    """The `container.run` audit record of a new container: with the names of the run's own
    variables and secrets, never their values."""
    record = runplan.run_record(
        name=spec.name,
        image=spec.image,
        profile=ref.name,
        profile_id=ref.profile_id,
        revision=ref.revision,
        audit_hash=ref.audit_hash,
        command=spec.command,
        interactive=spec.interactive,
        tty=spec.tty,
        rm=spec.rm,
        limits_not_applied=flags.unenforced(
            ref.profile.to_dict()["resources"], spec.host.cgroup_limits
        ),
    )
    if spec.env_keys:
        record["env_keys"] = list(spec.env_keys)
    if spec.secrets:
        # `NAME[,type=…][,target=…]`: names and where podman puts them, never a value; a
        # rollback gives the new container the same secrets (`spec_from_record`).
        record["secrets"] = list(spec.secrets)
    return record


def fields(spec: CreateSpec) -> dict[str, Any]:
    return {f: getattr(spec, f) for f in spec.__dataclass_fields__}


def one_call(spec: CreateSpec) -> bool:
    """Whether a foreground run can be one `podman run`: a --rm container (its `$HOME` is a
    tmpfs, nothing to create first) without a TTY (the id is printed while podman already
    runs; on a terminal in raw mode it would not be a clean line). An egress guard is attached
    by an OCI hook inside that one call (see `pipeline._run_once`). Not with the run's own
    variables: their memory file is lent to a `podman create` only, never to a `podman run`,
    whose conmon would keep it open for the container's life (`proc.lending`)."""
    return spec.rm and not spec.tty and not spec.env_keys


def spec_from_record(
    doc: dict[str, Any], ref: ProfileRef, *, image: str, name: str, hostname_of: str
) -> CreateSpec:
    """The create spec that brings back a recorded container (its run spec `doc`) under the
    profile revision `ref`, from `image`, as `name`; the hostname stays the recorded one (or
    the one `hostname_of` would get). Used by snapshot rollback."""
    check_mount_sources(ref)
    unapplied_limits(ref)
    return CreateSpec(
        profile=ref.profile,
        profile_name=ref.name,
        profile_id=ref.profile_id,
        revision=ref.revision,
        audit_hash=ref.audit_hash,
        image=image,
        name=name,
        hostname=doc.get("hostname") or _hostname(hostname_of),
        command=tuple(str(c) for c in doc.get("command") or ()),
        interactive=bool(doc.get("interactive")),
        tty=bool(doc.get("tty")),
        rm=False,
        rootless=probe.rootless(),
        resolv_conf=doc.get("resolv_conf"),
        host=host_limits(),
        secrets=_recorded_secrets(doc),
        env_keys=_recorded_env_keys(doc),
    )


def _recorded_env_keys(doc: dict[str, Any]) -> tuple[str, ...]:
    """The names of the variables a recorded run gave its container, checked again."""
    from linpodx.containers.runenv import valid_key

    recorded = doc.get("env_keys") or []
    if not isinstance(recorded, list) or not all(valid_key(k) for k in recorded):
        raise InvalidInput(
            "the run spec's env_keys are not a list of variable names",
            "the run spec is damaged; remove the container with `linpodx rm`",
        )
    return tuple(recorded)


def _recorded_secrets(doc: dict[str, Any]) -> tuple[str, ...]:
    """The podman secrets a recorded container was given, checked again (a run spec is a file
    in the state dir: nothing in it reaches podman's parser unchecked)."""
    from linpodx.containers.runenv import parse_secret

    recorded = doc.get("secrets") or []
    if not isinstance(recorded, list) or not all(isinstance(s, str) for s in recorded):
        raise InvalidInput(
            "the run spec's secrets are not a list of strings",
            "the run spec is damaged; remove the container with `linpodx rm`",
        )
    return tuple(parse_secret(s) for s in recorded)


def _hostname(name: str) -> str:
    from linpodx.podman.runline import hostname_for

    return hostname_for(name)


def spec_doc(
    spec: CreateSpec, ref: ProfileRef, container_id: str, created_at: str
) -> dict[str, Any]:
    return {
        "version": SPEC_VERSION,
        **run_record(spec, ref),
        "hostname": spec.hostname,
        "container_id": container_id,
        "rootless": spec.rootless,
        "resolv_conf": spec.resolv_conf,
        "created_at": created_at,
    }
