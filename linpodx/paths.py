"""Where linpodx keeps things. One module, so tests can point every path at a temp dir.

XDG base dirs are honoured: `$XDG_STATE_HOME/linpodx` (default `~/.local/state/linpodx`) holds
profiles, audit logs, approvals, events and snapshots; `$XDG_CONFIG_HOME/linpodx` is user config;
`$XDG_RUNTIME_DIR/linpodx` (falling back under the state dir) holds per-container runtime files.
`LINPODX_STATE_DIR` overrides the state dir outright (tests and CI use it).

The fast run path (`linpodx.fastrun`) uses the string forms (`state_root`, `ensure_dir_str`)
before it starts podman, so pathlib is imported only when a Path is asked for.
"""

from __future__ import annotations

import errno
import os
import stat

TYPE_CHECKING = False  # not typing's: see linpodx/fastrun.py
if TYPE_CHECKING:
    from pathlib import Path

DIR_MODE = 0o700
FILE_MODE = 0o600


def _path(text: str) -> Path:
    from pathlib import Path

    return Path(text)


def _home() -> str:
    return os.environ.get("HOME") or os.path.expanduser("~")


def _xdg(var: str, default: str) -> str:
    value = os.environ.get(var, "")
    # The XDG spec says relative values are invalid and must be ignored.
    if value and os.path.isabs(value):
        return value
    return os.path.join(_home(), default)


def state_root() -> str:
    """`state_dir()` as a string.

    An empty LINPODX_STATE_DIR means unset (as for the XDG variables). A relative one is
    refused rather than ignored: the XDG variables' rule (ignore it) would quietly send a
    person's `audit verify` to another state dir than the one they named, and report on it.
    """
    override = os.environ.get("LINPODX_STATE_DIR", "")
    if override:
        if not os.path.isabs(override):
            from linpodx.errors import UsageError

            raise UsageError(
                f"LINPODX_STATE_DIR must be an absolute path, not {override!r}",
                f"use LINPODX_STATE_DIR={os.path.join('$PWD', override)} or unset it "
                "for the default state dir",
            )
        return override
    return os.path.join(_xdg("XDG_STATE_HOME", ".local/state"), "linpodx")


def state_dir() -> Path:
    """Root of everything linpodx persists."""
    return _path(state_root())


def config_dir() -> Path:
    """User configuration (nothing required lives here yet)."""
    return _path(os.path.join(_xdg("XDG_CONFIG_HOME", ".config"), "linpodx"))


def runtime_dir() -> Path:
    """Per-boot runtime files (pid files, sockets of per-container helpers)."""
    base = os.environ.get("XDG_RUNTIME_DIR", "")
    if base and os.path.isabs(base) and os.access(base, os.W_OK):
        return _path(base) / "linpodx"
    return state_dir() / "run"


def profiles_root() -> str:
    """`profiles_dir()` as a string."""
    return os.path.join(state_root(), "profiles")


def profiles_dir() -> Path:
    return _path(profiles_root())


def audit_root() -> str:
    """`audit_dir()` as a string."""
    return os.path.join(state_root(), "audit")


def audit_dir() -> Path:
    return _path(audit_root())


def admin_log() -> str:
    """The administrative audit chain's file (`linpodx.audit.chain.admin_chain`)."""
    return os.path.join(audit_root(), "admin.jsonl")


def sessions_audit_dir() -> Path:
    return audit_dir() / "sessions"


def approvals_dir() -> Path:
    return state_dir() / "approvals"


def events_file() -> Path:
    return state_dir() / "events.jsonl"


def snapshots_dir() -> Path:
    return state_dir() / "snapshots"


def rollback_journal(name: str) -> str:
    """Where an unfinished rollback of container `name` keeps its journal
    (`linpodx.snapshot.journal`); a string, so that the fast run path can check it cheaply."""
    return os.path.join(state_root(), "snapshots", ".rollbacks", f"{name}.json")


def containers_root() -> str:
    """`containers_dir()` as a string."""
    return os.path.join(state_root(), "containers")


def containers_dir() -> Path:
    """Per-container state linpodx keeps (home volume name, egress helper state, …)."""
    return _path(containers_root())


def protected_roots() -> tuple[str, ...]:
    """`protected_dirs()` as strings."""
    home = _home()
    found = [
        # Every place the state dir can be, not only the one in use: a profile applied with
        # LINPODX_STATE_DIR (or XDG_STATE_HOME) set elsewhere must not mount the default state
        # dir, where the person's own audit logs, approvals and profiles live.
        os.environ.get("LINPODX_STATE_DIR", ""),
        os.path.join(os.environ.get("XDG_STATE_HOME", ""), "linpodx"),
        os.path.join(home, ".local", "state", "linpodx"),
        os.path.join(os.environ.get("XDG_CONFIG_HOME", ""), "linpodx"),
        os.path.join(home, ".config", "linpodx"),
    ]
    roots: list[str] = []
    for p in found:
        # Relative values are ignored (XDG) or refused where used (LINPODX_STATE_DIR).
        if os.path.isabs(p) and os.path.normpath(p) not in roots:
            roots.append(os.path.normpath(p))
    return tuple(roots)


def protected_dirs() -> tuple[Path, ...]:
    """Directories a profile must never mount into a container (our own state and config,
    wherever the environment puts them and where they are by default)."""
    return tuple(_path(p) for p in protected_roots())


def ensure_dir(path: Path) -> Path:
    """Create `path` (and any missing parents) as 0700; tighten an existing one we own."""
    ensure_dir_str(os.fspath(path))
    return path


def ensure_dir_str(path: str) -> str:
    """`ensure_dir` for a path given as a string."""
    # os.makedirs would give missing parents the umask's mode, not 0700.
    missing = []
    p = path
    while not os.path.exists(p) and p != os.path.dirname(p):
        missing.append(p)
        p = os.path.dirname(p)
    for d in reversed(missing):
        try:
            os.mkdir(d, DIR_MODE)
        except FileExistsError:
            pass  # another process made it meanwhile
    st = os.stat(path)
    if not stat.S_ISDIR(st.st_mode):
        # Never tighten what is not a directory: LINPODX_STATE_DIR=/dev/null run as root once
        # made /dev/null 0700 for the whole machine.
        raise NotADirectoryError(errno.ENOTDIR, os.strerror(errno.ENOTDIR), path)
    if st.st_uid == os.getuid() and (st.st_mode & 0o077):
        os.chmod(path, DIR_MODE)
    return path
