"""The parts of a podman argv that belong to one run rather than to a profile: the container's
name and hostname in front, and its mounts for that run, flags, image and command at the end.

`linpodx.podman.argv` puts a profile's flags between these two; `linpodx.fastpath.run` puts a
stored copy of those flags there (see `linpodx.fastpath.plan`). Both take these parts from
here, so a plain `linpodx run` and its fast path build the same argv. Standard library only,
and only what the `json` module imports anyway (`re`): this module is on the fast run path.
"""

from __future__ import annotations

import os
import re

from linpodx.errors import InvalidInput, LinpodxError, UsageError
from linpodx.profile import HOME_DIR

MANAGED_LABEL = "linpodx.managed"
"""The label every container linpodx made carries (`=1`); `podman ps` filters on it. Here, not
in `argv`, so that listing (`linpodx ps`) loads no argv builder."""

GATE_DEST = "/run/linpodx/mount-gate"
"""Where a container with mounts sees its mount gate (see `linpodx.podman.mountpin`)."""
INIT_PIDFILE = "init.pid"
"""Beside the resolv.conf: `podman create --pidfile` makes `podman init` write the container's
init pid there, so the guard's pid needs no `podman inspect`."""
HOME_TMPFS_SIZE = "512m"
"""Size bound of the tmpfs `$HOME` of `--rm` containers (counted against the memory limit)."""

PULL_POLICIES = ("missing", "never", "always", "newer")
"""`linpodx run --pull`'s values, podman's own."""
PULL_DEFAULT = "missing"
"""As podman's; `LINPODX_PULL` changes it (the test suite and air-gapped hosts set `never`)."""

# podman's own rule for container names, capped so the name also fits as a hostname.
_NAME_RE = re.compile(r"^[a-zA-Z0-9][a-zA-Z0-9_.-]{0,62}\Z")
# podman reads --mount as one CSV record (Go's encoding/csv: commas split it, a bare `"` is a
# parse error) and key=value on '='; a path with those cannot be expressed.
_MOUNT_BAD = (",", '"', "\n", "\x00")


def validate_name(name: str) -> str:
    """Refuse names podman would refuse, or that could be read as an option."""
    if not _NAME_RE.match(name):
        raise InvalidInput(
            f"invalid container name: {name!r}",
            "use 1-63 characters: letters, digits, '_', '.', '-', starting with a letter or digit",
        )
    return name


def validate_image(image: str) -> str:
    """Refuse an image reference that is empty, has whitespace, or could be read as an option."""
    if not image or image.startswith("-") or any(c.isspace() or ord(c) < 0x20 for c in image):
        raise InvalidInput(
            f"invalid image reference: {image!r}",
            "give an image like localhost/NAME:TAG (see `podman images`)",
        )
    return image


def pull_policy(policy: str | None) -> str:
    """The pull policy of a run: `policy` (`--pull`), else `LINPODX_PULL`, else `missing`;
    anything but podman's four is a usage error on the command line (as every other option
    value outside its list), invalid input in the environment."""
    error: type[LinpodxError]
    if policy is None:
        policy = os.environ.get("LINPODX_PULL") or PULL_DEFAULT
        where, error = "LINPODX_PULL", InvalidInput
    else:
        where, error = "--pull", UsageError
    if policy not in PULL_POLICIES:
        raise error(f"invalid {where} value: {policy!r}", f"use one of {', '.join(PULL_POLICIES)}")
    return policy


def create_pull(policy: str) -> str:
    """The `--pull` podman's create (or one-call run) gets for a run's policy: `never` stays
    `never`; any other pull was done before, by linpodx (`linpodx.containers.images`), with
    podman's progress on stderr, so create only pulls again if the image went away since."""
    return "never" if policy == "never" else "missing"


def hostname_for(name: str) -> str:
    """A valid hostname (RFC 1123 label) derived from a container name."""
    label = re.sub(r"[^a-zA-Z0-9-]", "-", name).strip("-")[:63]
    return label or "linpodx"


def mount_arg(source: str, target: str, read_only: bool) -> str:
    """`--mount=type=bind,…` for one host path; InvalidInput for paths podman would misread."""
    for part in (source, target):
        if any(b in part for b in _MOUNT_BAD) or not part.startswith("/"):
            raise InvalidInput(
                f"mount path cannot be passed to podman: {part!r}",
                "use absolute paths without commas, double quotes or control characters",
            )
    ro = "true" if read_only else "false"
    return (
        f"--mount=type=bind,source={source},destination={target},ro={ro},bind-propagation=rprivate"
    )


def head(name: str, hostname: str | None) -> list[str]:
    """`create --name=… --hostname=…` (hostname defaults to one derived from the name)."""
    validate_name(name)
    return ["create", f"--name={name}", f"--hostname={hostname or hostname_for(name)}"]


def tail(
    *,
    mount_gate: str | None,
    resolv_conf: str | None,
    pidfile: str | None,
    pull: str,
    env_file: str | None = None,
    secrets: tuple[str, ...] = (),
    rm: bool,
    interactive: bool,
    tty: bool,
    image: str,
    command: tuple[str, ...],
) -> list[str]:
    """What follows the profile's flags: podman's `--pull` (`create_pull` of the run's
    policy), the run's own environment (`env_file`: a `/dev/fd/N` path podman reads the
    `-e`/`--env-file` values from, never the values themselves: see
    `linpodx.containers.runenv`) and podman secrets (`secrets`: `--secret` values, names and
    targets only), the mount gate (`linpodx.podman.mountpin`, for a
    profile with mounts), the guard's resolv.conf and pid file, the `--rm` container's tmpfs
    `$HOME`, the terminal flags, the image and the command."""
    validate_image(image)
    if pull not in ("never", "missing"):
        raise InvalidInput(f"invalid pull for podman create: {pull!r}", "use never or missing")
    argv: list[str] = [f"--pull={pull}"]
    if env_file is not None:
        if not env_file.startswith("/dev/fd/") or not env_file[8:].isdigit():
            raise InvalidInput(f"invalid env file for podman: {env_file!r}", "a bug in linpodx")
        argv.append(f"--env-file={env_file}")
    argv.extend(f"--secret={s}" for s in secrets)
    if mount_gate is not None:
        argv.append(mount_arg(mount_gate, GATE_DEST, True))
    if resolv_conf is not None:
        argv.append(mount_arg(resolv_conf, "/etc/resolv.conf", True))
    if pidfile is not None:
        # The egress guard needs the init pid after `podman init`; this saves a podman inspect.
        argv.append(f"--pidfile={pidfile}")
    if rm:
        argv.append(
            f"--mount=type=tmpfs,destination={HOME_DIR},tmpfs-mode=0700,"
            f"tmpfs-size={HOME_TMPFS_SIZE},chown=true"
        )
        argv.append("--rm")
    if interactive:
        argv.append("--interactive")
    if tty:
        argv.append("--tty")
    argv.append(image)
    argv.extend(command)
    return argv


def unshare_argv(argv: list[str], podman: str = "podman") -> list[str]:
    """`argv` run inside podman's user namespace when rootless (as uid 0 of it: files owned by
    the container's sub-uids keep their owners there, a process may join the container's
    netns); `argv` itself as root. `podman`: its path, if known."""
    return list(argv) if os.geteuid() == 0 else [podman, "unshare", *argv]


def run_form(create_argv: list[str], cidfile: str) -> list[str]:
    """The `podman run` argv with exactly a create argv's flags, writing the new id to `cidfile`."""
    return ["run", f"--cidfile={cidfile}", *create_argv[1:]]
