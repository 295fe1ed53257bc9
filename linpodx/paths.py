"""Where linpodx keeps things. One module, so tests can point every path at a temp dir.

XDG base dirs are honoured: `$XDG_STATE_HOME/linpodx` (default `~/.local/state/linpodx`) holds
profiles, audit logs, approvals, events and snapshots; `$XDG_CONFIG_HOME/linpodx` is user config;
`$XDG_RUNTIME_DIR/linpodx` (falling back under the state dir) holds per-container runtime files.
`LINPODX_STATE_DIR` overrides the state dir outright (tests and CI use it).

The fast run path (`linpodx.fastpath.run`) uses the string forms (`state_root`, `ensure_dir_str`)
before it starts podman, so pathlib is imported only when a Path is asked for.
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat

TYPE_CHECKING = False  # the fast path's budget: linpodx/fastpath/__init__.py
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
    """`state_dir()` as a string, once it is known to be the running user's (`check_root`).

    An empty LINPODX_STATE_DIR means unset (as for the XDG variables). A relative one is
    refused rather than ignored: the XDG variables' rule (ignore it) would quietly send a
    person's `audit verify` to another state dir than the one they named, and report on it.
    """
    root = named_root()
    return check_root(root)


def named_root() -> str:
    """The state dir the environment names, not checked (`state_root` checks it): for telling
    whether a path is inside it."""
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


_checked: dict[tuple[str, int], str] = {}
"""(state dir as named, euid) -> the real directory, for those `check_root` found fine in this
process.
Once it is ours and 0700 and no other user can write any directory above it, only we (or root)
can change it or anything in it, so the check need not be repeated; and every path is built
from the real directory, so re-pointing a link that named it changes nothing."""

_HINT_OWN = (
    "use a state dir of your own: unset LINPODX_STATE_DIR (and XDG_STATE_HOME) or point it at "
    "a directory you own; as root, run `sudo` without -E so that root keeps its own state"
)


def _unsafe(message: str, hint: str = _HINT_OWN) -> Exception:
    from linpodx.errors import EXIT_AUDIT, LinpodxError

    return LinpodxError(message, hint, exit_code=EXIT_AUDIT)


def _owner(uid: int) -> str:
    import pwd

    try:
        return f"uid {uid} ({pwd.getpwuid(uid).pw_name})"
    except KeyError:
        return f"uid {uid}"


def check_root(root: str, *, required: bool = False) -> str:
    """Refuse a state dir that is not the running user's: it must be a directory (a link to
    one is fine: people link ~/.local/state), owned by the effective uid and not writable by
    group or others. One we own is tightened to 0700.

    Whoever can write there decides what linpodx runs (stored run plans, profiles, run specs)
    and where it writes (a link planted inside): root using another user's state dir (kept by
    `sudo -E`) would run that user's containers as root. Nothing there yet passes unless
    `required` (`ensure_dir_str` makes it, then checks it).

    Returns the directory to build paths from: the real one (links resolved) once it exists,
    so a link that named it cannot be re-pointed elsewhere after the check. Every directory
    above it must belong to root or to us and not be writable by others (unless sticky, as
    /tmp is): whoever can write one could put another directory in its place."""
    euid = os.geteuid()
    known = _checked.get((root, euid))
    if known is not None:
        return known
    try:
        real = os.path.realpath(root, strict=True)
        st = os.stat(real)
    except FileNotFoundError:
        if required:
            raise
        return root
    except OSError:
        # Not ours to judge (a parent we may not search): whatever uses it fails with its own
        # OSError, which the CLI reports as a state dir it cannot use.
        return root
    if not stat.S_ISDIR(st.st_mode):
        # Never tighten what is not a directory: LINPODX_STATE_DIR=/dev/null run as root once
        # made /dev/null 0700 for the whole machine.
        # The CLI reports it as a state dir it cannot use (`cli.main.environment_error`).
        raise NotADirectoryError(errno.ENOTDIR, os.strerror(errno.ENOTDIR), root)
    mode = stat.S_IMODE(st.st_mode)
    if st.st_uid != euid:
        raise _unsafe(
            f"linpodx's state dir {root} belongs to {_owner(st.st_uid)}, not to you "
            f"({_owner(euid)}); its mode is {mode:04o}; refusing to use it"
        )
    # The directories above first: once nobody else can change them, `real` (no links left
    # in it) names the directory just looked at. Tightened by that name, not by `root`: a
    # link re-pointed since the look (at /etc, say, for root) would be followed.
    _check_ancestors(real, euid)
    if mode & 0o077:
        try:
            os.chmod(real, DIR_MODE)
        except OSError as exc:
            if mode & 0o022:
                raise _unsafe(
                    f"linpodx's state dir {root} is writable by others (mode {mode:04o}) and "
                    f"could not be made 0700: {exc.strerror or exc}",
                    f"run `chmod 0700 {root}`, or use another state dir (LINPODX_STATE_DIR)",
                ) from None
    _checked[(root, euid)] = real
    return real


def _unmapped_uid() -> int | None:
    """The uid that owners outside this user namespace show as, if this process runs in one
    (rootless helpers under `podman unshare`, where the host's root shows as it); None in the
    initial namespace."""
    try:
        with open("/proc/self/uid_map", encoding="ascii") as f:
            if f.read().split() == ["0", "0", "4294967295"]:
                return None
        with open("/proc/sys/kernel/overflowuid", encoding="ascii") as f:
            return int(f.read())
    except (OSError, ValueError):
        return None


def _check_ancestors(real: str, euid: int) -> None:
    owners = {0, euid}
    unmapped = _unmapped_uid()
    if unmapped is not None:
        # Under `podman unshare` the host's root (owner of /home, /tmp …) shows as the
        # overflow uid. The linpodx command that started this helper checked the same
        # directories from the initial namespace before it did.
        owners.add(unmapped)
    parent = os.path.dirname(real)
    while True:
        try:
            st = os.stat(parent)
        except OSError:
            return  # (one we cannot look at: what uses the state dir fails on its own)
        mode = stat.S_IMODE(st.st_mode)
        if st.st_uid not in owners or (mode & 0o022 and not mode & stat.S_ISVTX):
            who = _owner(st.st_uid)
            raise _unsafe(
                f"{parent}, a directory above linpodx's state dir {real}, can be changed by "
                f"someone else (owner {who}, mode {mode:04o}): they could put another "
                "directory in the state dir's place; refusing to use it",
                "use a state dir whose parent directories belong to you or root and are not "
                "writable by others (LINPODX_STATE_DIR picks another)",
            )
        if parent == "/":
            return
        parent = os.path.dirname(parent)


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


def rollback_pending(name: str) -> bool:
    """Whether a rollback journal of container `name` is there (one lstat, cheap enough for
    every run). OSError other than "no such file": it cannot be told, and each caller fails
    closed in its own way (the journal's reader refuses, the fast run path leaves it to it)."""
    try:
        os.lstat(rollback_journal(name))
    except FileNotFoundError:
        return False
    return True


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
    """`ensure_dir` for a path given as a string.

    Under the state dir every component below it is checked with lstat (`_walk`): a link or a
    directory owned by someone else there would send what linpodx writes, or reads its
    decisions from, out of the state dir."""
    root, rel = _split(path)
    if rel is None:
        _make_missing(path)
        st = os.stat(path)
        if not stat.S_ISDIR(st.st_mode):
            # Never tighten what is not a directory (see `check_root`).
            raise NotADirectoryError(errno.ENOTDIR, os.strerror(errno.ENOTDIR), path)
        if st.st_uid == os.geteuid() and (st.st_mode & 0o077):
            os.chmod(path, DIR_MODE)
        return path
    _make_missing(root)
    check_root(root, required=True)
    _walk(root, rel, create=True)
    return path


def check_dir_str(path: str) -> str:
    """`ensure_dir_str` without creating anything: a missing component is FileNotFoundError.

    For reading a file under the state dir, or writing one into a directory that must already
    be there. A path outside the state dir is not checked."""
    root, rel = _split(path)
    if rel is not None:
        check_root(root, required=True)
        _walk(root, rel, create=False)
    return path


def _split(path: str) -> tuple[str, str | None]:
    """The state dir and `path` relative to it ("" for itself); None if it is not inside.
    Inside means under the state dir as named or under the real directory it names (what
    `state_root` hands out once it exists)."""
    named = named_root()
    full = os.path.abspath(path)  # (abspath normalises)
    for root, base in _roots(named):
        if full == base:
            return root, ""
        if full.startswith(base + "/"):
            return root, full[len(base) + 1 :]
    return named, None


_bases: dict[tuple[str, int], tuple[tuple[str, str], ...]] = {}
"""(state dir as named, euid) -> `_roots`, for a state dir `check_root` has found fine."""


def _roots(named: str) -> tuple[tuple[str, str], ...]:
    """(root, its normalised form without a trailing slash) for the state dir as named and the
    real directory it names."""
    key = (named, os.geteuid())
    known = _bases.get(key)
    real = _checked.get(key)
    if known is not None and real is not None and known[-1][0] == real:
        return known
    roots = [named]
    if real is not None:
        # Once `check_root` has found the state dir fine in this process, its real directory
        # is known, and it is the one every path is built from: no need to resolve the name
        # again (a third of a durable append's CPU went to that realpath), and a link
        # re-pointed since then still finds the paths built from the checked directory inside.
        roots.append(real)
    else:
        with contextlib.suppress(OSError):
            roots.append(os.path.realpath(named, strict=True))
    found = tuple((r, os.path.normpath(os.path.abspath(r)).rstrip("/")) for r in roots)
    if real is not None:
        _bases[key] = found
    return found


def _make_missing(path: str) -> None:
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


def _walk(root: str, rel: str, *, create: bool) -> None:
    """Each directory of `rel` below `root`, made 0700 if missing and `create`, must be a real
    directory (not a link: lstat) that the effective uid owns; one we own is tightened."""
    euid = os.geteuid()
    cur = root
    for part in rel.split("/") if rel else ():
        cur = os.path.join(cur, part)
        try:
            st = os.lstat(cur)
        except FileNotFoundError:
            if not create:
                raise
            try:
                os.mkdir(cur, DIR_MODE)
            except FileExistsError:
                pass  # another process made it meanwhile
            st = os.lstat(cur)
        if stat.S_ISLNK(st.st_mode):
            raise _unsafe(
                f"{cur} in linpodx's state dir is a symbolic link; linpodx does not follow "
                "links inside its state dir",
                f"remove the link (rm {cur}); linpodx makes the directory again",
            )
        if not stat.S_ISDIR(st.st_mode):
            raise NotADirectoryError(errno.ENOTDIR, os.strerror(errno.ENOTDIR), cur)
        if st.st_uid != euid:
            raise _unsafe(
                f"{cur} in linpodx's state dir belongs to {_owner(st.st_uid)}, not to you "
                f"({_owner(euid)}); refusing to use it"
            )
        if st.st_mode & 0o077:
            os.chmod(cur, DIR_MODE)
