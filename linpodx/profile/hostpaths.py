"""Host paths a profile may mount, checked when the profile is applied and again at every run.

A mount source that was fine when the profile was applied can be a symlink to `~/.ssh` by the
next run (an agent with a writable mount can make one), so `linpodx run` and `start` check
every source again (`linpodx.containers.pin_mounts`, and `linpodx.fastpath.run` before podman
starts), and pin what they checked: runc must mount that very directory or the container does
not start (`linpodx.podman.mountpin`). Standard library's cheapest modules only: the fast run
path imports this before podman starts.
"""

from __future__ import annotations

import json
import os
import posixpath
import pwd
import re
import stat

from linpodx import paths
from linpodx.output import safe_text

TYPE_CHECKING = False  # not typing's: see linpodx/fastpath/__init__.py
if TYPE_CHECKING:
    from typing import Any

# Sensitive host paths relative to a home directory (refused as, inside, or containing a source).
_HOME_SECRETS = (
    ".ssh",
    ".gnupg",
    ".aws",
    ".azure",
    ".kube",
    ".docker",
    ".netrc",
    ".git-credentials",
    ".pypirc",
    ".npmrc",
    # Publishing tokens inside package caches a person may mount for speed (`~/.cargo`):
    ".cargo/credentials",
    ".cargo/credentials.toml",
    ".gradle/gradle.properties",
    ".m2/settings.xml",
    ".m2/settings-security.xml",
    ".gem/credentials",
    ".terraform.d/credentials.tfrc.json",
    ".vault-token",
    ".password-store",
    ".config/linpodx",
    ".config/containers",
    ".config/gcloud",
    ".config/gh",
    ".local/share/containers",
    ".local/share/keyrings",
    ".local/state/linpodx",
)
_SYSTEM_TREES = (
    "/etc",
    "/proc",
    "/sys",
    "/dev",
    "/run",
    "/var/run",
    "/boot",
    "/var/run/docker.sock",
    "/run/docker.sock",
    "/run/podman",
    "/run/containerd",
    "/var/lib/containers",
    "/var/lib/docker",
    # Sockets of the person's desktop and terminal multiplexer: with the X server's or tmux's
    # socket the agent can type into the person's sessions (code execution on the host).
    "/tmp/.X11-unix",  # noqa: S108 - a path refused, nothing is made in /tmp
    "/tmp/.ICE-unix",  # noqa: S108 - a path refused, nothing is made in /tmp
)
# tmux's per-user socket directories (`/tmp/tmux-UID`), any user's (root may reach them all).
_TMUX_DIR = re.compile(r"/tmp/tmux-[0-9]+(?:/|\Z)")  # noqa: S108 - refused, not used
# Refused only as the whole thing: subdirectories are fine (`/root/project` when HOME=/root).
_SYSTEM_EXACT = ("/", "/root", "/home")
# podman reads `--mount` as one CSV record (Go's encoding/csv: `,` splits, a bare `"` is an
# error) and `-v` splits on `:`; control characters have no place in a path we print.
PATH_FORBIDDEN = re.compile(r'[\x00-\x1f\x7f:,"]')
FORBIDDEN_TEXT = 'control characters, `:`, `,` or `"`'


def show(value: Any) -> str:
    """A value quoted for a message: JSON form, control characters escaped, length capped."""
    try:
        text = json.dumps(value, ensure_ascii=False)
    except (TypeError, ValueError):
        text = repr(value)
    return safe_text(text, 120)


def _home_dirs() -> list[str]:
    homes = []
    candidates = [os.environ.get("HOME", ""), _passwd_home(), "/root"]
    if os.geteuid() == 0:
        # Root can read every other account's home: those homes (and their secrets) are as
        # sensitive as our own.
        candidates.extend(_other_homes())
    for h in candidates:
        if h and os.path.isabs(h):
            h = posixpath.normpath(h)
            if h not in homes:
                homes.append(h)
    return homes


_REGULAR_UID_MIN = 1000
"""Lowest uid of people's accounts (shadow's default UID_MIN)."""


def _other_homes() -> list[str]:
    """Homes of every passwd account: real directories owned by the account, or named by a
    regular account. Not the directories system accounts merely name as home (`/usr/sbin` for
    daemon, `/bin`, `/dev`, `/`): treating those as homes would refuse `/usr` and the like."""
    homes = []
    for pw in pwd.getpwall():
        home = pw.pw_dir
        if not home or not os.path.isabs(home) or posixpath.normpath(home) == "/":
            continue
        try:
            st = os.stat(home)
        except OSError:
            continue  # `/nonexistent` and the like: nothing there to protect
        if stat.S_ISDIR(st.st_mode) and (
            st.st_uid == pw.pw_uid or pw.pw_uid >= _REGULAR_UID_MIN
        ):
            homes.append(home)
    return homes


def _passwd_home() -> str:
    try:
        return pwd.getpwuid(os.getuid()).pw_dir
    except KeyError:
        return ""


def sensitive_paths() -> tuple[list[str], list[str]]:
    """(trees, exact): sensitive host paths. A source equal to, inside or containing a tree is
    refused; an `exact` path is refused only as the whole thing."""
    trees = list(_SYSTEM_TREES)
    for home in _home_dirs():
        trees.extend(posixpath.join(home, rel) for rel in _HOME_SECRETS)
    runtime = os.environ.get("XDG_RUNTIME_DIR", "")
    if runtime and os.path.isabs(runtime):
        trees.append(posixpath.normpath(runtime))
    trees.append(f"/run/user/{os.getuid()}")
    agent = os.environ.get("SSH_AUTH_SOCK", "")
    if agent and os.path.isabs(agent):
        trees.append(posixpath.normpath(agent))
    tmux = os.environ.get("TMUX_TMPDIR", "")
    if tmux and os.path.isabs(tmux):
        trees.append(posixpath.join(posixpath.normpath(tmux), f"tmux-{os.getuid()}"))
    trees.extend(paths.protected_roots())
    exact = list(_SYSTEM_EXACT)
    return trees, exact


def _forms(p: str, resolved: str | None = None) -> set[str]:
    """The lexical and the symlink-resolved form of a path (`resolved`, when already known)."""
    return {posixpath.normpath(p), resolved if resolved is not None else os.path.realpath(p)}


def inside(child: str, parent: str) -> bool:
    return child == parent or child.startswith(parent.rstrip("/") + "/")


def sensitive_reason(source: str, resolved: str | None = None) -> str | None:
    """Why `source` must not be mounted, or None. Checks both its written and resolved forms
    (`resolved`: as resolved by the caller, so that the form judged is the form it uses)
    against both forms of every sensitive path."""
    trees, exact = sensitive_paths()
    src_forms = _forms(source, resolved)
    for src in src_forms:
        if _TMUX_DIR.match(src):
            return "is inside a tmux socket directory (/tmp/tmux-UID)"
    for s in exact:
        for sf in _forms(s):
            if sf in src_forms:
                return f"is the sensitive path {sf}"
    for t in trees:
        for tf in _forms(t):
            for src in src_forms:
                if src == tf:
                    return f"is the sensitive path {tf}"
                if inside(src, tf):
                    return f"is inside the sensitive path {tf}"
                if inside(tf, src):
                    return f"contains the sensitive path {tf}"
    return None


def has_dotdot(p: str) -> bool:
    return ".." in p.split("/")


def check_mount_source(source: str) -> tuple[str | None, str | None, str | None]:
    """Check a host path for mounting: (resolved path, problem, hint). Exported so run time can
    check again what was applied earlier."""
    try:
        return _check_mount_source(source)
    except OSError:
        # Resolving symlinks is several system calls (lstat, readlink per component): a path
        # replaced meanwhile makes one of them fail.
        return None, *_changed(source)


_FORBIDDEN_HINT = "podman's mount syntax uses these characters; rename or move the directory"


def _changed(source: str) -> tuple[str, str]:
    return f"mount source {show(source)} changed while it was being checked", (
        "something replaced it (or a directory on its path) just now; if that keeps "
        "happening, find out what does"
    )


def _check_mount_source(source: str) -> tuple[str | None, str | None, str | None]:
    if PATH_FORBIDDEN.search(source):
        return None, f"mount source must not contain {FORBIDDEN_TEXT}", _FORBIDDEN_HINT
    if not os.path.isabs(source):
        return None, f"mount source {show(source)} must be an absolute path", (
            "write the full path, e.g. `${HOME}/project`"
        )
    if has_dotdot(source):
        return None, f"mount source {show(source)} must not contain `..`", (
            "write the path without `..` components"
        )
    # Resolved once: the form judged below is the form returned (and pinned by the caller).
    # Resolving twice let a path swapped in between be judged as one thing and used as another.
    try:
        resolved = os.path.realpath(source, strict=True)
        exists = True
    except FileNotFoundError:
        resolved, exists = os.path.realpath(source), False
    reason = sensitive_reason(source, resolved)
    if reason is None and not exists:
        return None, f"mount source {show(source)} does not exist", (
            "create it first, or fix the path"
        )
    if reason is not None:
        shown = show(source) + (f" (resolves to {show(resolved)})" if resolved != source else "")
        return None, f"mount source {shown} {reason}", (
            "mount the project subdirectory instead, never a sensitive path or a directory "
            "that contains one"
        )
    if PATH_FORBIDDEN.search(resolved):
        # The written path was fine but a symlink on it leads to one podman cannot be given:
        # stored, it would make every run fail.
        return None, (
            f"mount source {show(source)} resolves to {show(resolved)}, which contains "
            f"{FORBIDDEN_TEXT}"
        ), _FORBIDDEN_HINT
    try:
        st = os.stat(resolved)
    except OSError as exc:
        return None, f"mount source {show(source)} cannot be read: {exc.strerror}", None
    if not (stat.S_ISDIR(st.st_mode) or stat.S_ISREG(st.st_mode)):
        return None, f"mount source {show(source)} is not a directory or regular file", (
            "sockets and devices cannot be mounted into a sandbox"
        )
    if stat.S_ISDIR(st.st_mode):
        try:
            sock = _socket_in(resolved)
        except PermissionError as exc:
            # Not listed, not checked: refused (fail closed).
            return None, f"mount source {show(source)} cannot be read: {exc.strerror}", None
        if sock is not None:
            # A directory of sockets is as good as the socket (a tmux or X server socket lets
            # the agent run commands as the person); the usual ones are listed above, this
            # catches the rest one level down.
            return None, (
                f"mount source {show(source)} holds the socket {show(sock)}; a sandbox must "
                "not reach host sockets"
            ), "mount a subdirectory without sockets, or remove the socket"
    return resolved, None, None


def _socket_in(directory: str) -> str | None:
    """The first Unix socket directly in `directory` (symlinks not followed), else None."""
    with os.scandir(directory) as entries:
        for entry in entries:
            # d_type answers these without a system call; only the rest need an lstat.
            if entry.is_dir(follow_symlinks=False) or entry.is_file(follow_symlinks=False):
                continue
            if entry.is_symlink():
                continue  # resolved inside the container, never to a host socket
            try:
                mode = entry.stat(follow_symlinks=False).st_mode
            except FileNotFoundError:
                continue  # gone meanwhile
            if stat.S_ISSOCK(mode):
                return entry.path
    return None


def pin_mount_source(source: str) -> tuple[tuple[int, int] | None, str | None, str | None]:
    """`check_mount_source`, and the identity (device, inode) of what it checked, for the
    mount-check hook (`linpodx.podman.mountpin`): (identity, problem, hint)."""
    resolved, problem, hint = check_mount_source(source)
    if problem is not None or resolved is None:
        return None, problem, hint
    ident = identity(resolved)
    if ident is None:
        return None, *_changed(source)
    return ident, None, None


_WALK = os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC


def identity(resolved: str) -> tuple[int, int] | None:
    """(device, inode) of the directory or regular file at `resolved`, an absolute path that
    had no symlink in it when it was resolved; None if any component is a symlink now (or is
    gone), or the end is something else. The walk opens each component relative to the last
    one without following symlinks, so what it identifies is what is at that path now."""
    if not os.path.isabs(resolved):
        return None
    fd = os.open("/", _WALK | os.O_DIRECTORY)
    try:
        for part in resolved.split("/"):
            if not part:
                continue
            try:
                nxt = os.open(part, _WALK, dir_fd=fd)
            except OSError:
                return None  # gone, or a symlink where a directory was (ENOTDIR)
            os.close(fd)
            fd = nxt
        st = os.fstat(fd)
    finally:
        os.close(fd)
    if not (stat.S_ISDIR(st.st_mode) or stat.S_ISREG(st.st_mode)):
        return None  # a symlink as the last component, or a socket, a device …
    return st.st_dev, st.st_ino
