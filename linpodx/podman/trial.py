"""The podman commands `linpodx doctor` runs to check this host: podman's version, its info, the
images it has, and test containers. A test container gets the flags `linpodx run` gives the
default profile on this host (`flags.profile_flags`, then `runline.tail` as for `run --rm`), so
what doctor tries is what a run does."""

from __future__ import annotations

from collections.abc import Sequence

from linpodx.podman import probe, runline
from linpodx.podman.flags import profile_flags


def version_argv(podman: str) -> list[str]:
    return [podman, "--version"]


def info_argv(podman: str, form: str = "json") -> list[str]:
    """`podman info` as JSON, or with a Go template (`{{.Store.GraphRoot}}`)."""
    return [podman, "info", f"--format={form}"]


def images_argv(podman: str) -> list[str]:
    """The images of this user's store, one `REPOSITORY:TAG` per line."""
    return [podman, "images", "--format={{.Repository}}:{{.Tag}}"]


def run_argv(podman: str, image: str, command: Sequence[str], seccomp: str) -> list[str]:
    """`podman run --rm` of `command` in `image`, as `linpodx run` would start the default
    profile here (`seccomp`: linpodx's seccomp profile, `linpodx.podman.seccomp.ensure`).
    InvalidInput if this host cannot run it as linpodx would (`flags.enforceable`)."""
    from linpodx.profile.model import default_profile

    lim = probe.host_limits()
    flags = profile_flags(
        default_profile().to_dict(),
        labels=(),
        rootless=probe.rootless(),
        nofile_hard=lim.nofile_hard,
        nproc_hard=lim.nproc_hard,
        cgroup_limits=lim.cgroup_limits,
        init=False,
        seccomp=seccomp,
    )
    end = runline.tail(
        mount_gate=None, resolv_conf=None, pidfile=None, pull="never", rm=True,
        interactive=False, tty=False, image=image, command=tuple(command),
    )  # fmt: skip
    return [podman, "run", *flags, *end]
