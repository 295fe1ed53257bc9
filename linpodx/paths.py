"""Where linpodx keeps things. One module, so tests can point every path at a temp dir.

XDG base dirs are honoured: `$XDG_STATE_HOME/linpodx` (default `~/.local/state/linpodx`) holds
profiles, audit logs, approvals, events and snapshots; `$XDG_CONFIG_HOME/linpodx` is user config;
`$XDG_RUNTIME_DIR/linpodx` (falling back under the state dir) holds per-container runtime files.
`LINPODX_STATE_DIR` overrides the state dir outright (tests and CI use it).
"""

from __future__ import annotations

import os
from pathlib import Path

DIR_MODE = 0o700
FILE_MODE = 0o600


def _home() -> Path:
    return Path(os.environ.get("HOME") or Path.home())


def _xdg(var: str, default: str) -> Path:
    value = os.environ.get(var, "")
    # The XDG spec says relative values are invalid and must be ignored.
    if value and os.path.isabs(value):
        return Path(value)
    return _home() / default


def state_dir() -> Path:
    """Root of everything linpodx persists."""
    override = os.environ.get("LINPODX_STATE_DIR", "")
    if override and os.path.isabs(override):
        return Path(override)
    return _xdg("XDG_STATE_HOME", ".local/state") / "linpodx"


def config_dir() -> Path:
    """User configuration (nothing required lives here yet)."""
    return _xdg("XDG_CONFIG_HOME", ".config") / "linpodx"


def runtime_dir() -> Path:
    """Per-boot runtime files (pid files, sockets of per-container helpers)."""
    base = os.environ.get("XDG_RUNTIME_DIR", "")
    if base and os.path.isabs(base) and os.access(base, os.W_OK):
        return Path(base) / "linpodx"
    return state_dir() / "run"


def profiles_dir() -> Path:
    return state_dir() / "profiles"


def audit_dir() -> Path:
    return state_dir() / "audit"


def sessions_audit_dir() -> Path:
    return audit_dir() / "sessions"


def approvals_dir() -> Path:
    return state_dir() / "approvals"


def events_file() -> Path:
    return state_dir() / "events.jsonl"


def snapshots_dir() -> Path:
    return state_dir() / "snapshots"


def containers_dir() -> Path:
    """Per-container state linpodx keeps (home volume name, egress helper state, …)."""
    return state_dir() / "containers"


def protected_dirs() -> tuple[Path, ...]:
    """Directories a profile must never mount into a container (our own state and config)."""
    return (state_dir(), config_dir())


def ensure_dir(path: Path) -> Path:
    """Create `path` (and any missing parents) as 0700; tighten an existing one we own."""
    # mkdir(parents=True) would give missing parents the umask's mode, not 0700.
    missing = []
    p = path
    while not p.exists() and p != p.parent:
        missing.append(p)
        p = p.parent
    for d in reversed(missing):
        try:
            d.mkdir(mode=DIR_MODE)
        except FileExistsError:
            pass  # another process made it meanwhile
    st = path.stat()
    if st.st_uid == os.getuid() and (st.st_mode & 0o077):
        path.chmod(DIR_MODE)
    return path
