"""State dirs named by `LINPODX_STATE_DIR` where approvals were asked for recently.

A bridge started with an override (a CI job, a second checkout) writes its approvals there,
and a person listening with the default state dir saw nothing. So when an approval is created
under an override, the override's path is noted in the *default* state dir of the same user
(`$XDG_STATE_HOME/linpodx`, else `~/.local/state/linpodx`) under `seen/`; `linpodx events`
run with that default reads the notes back (`approvals.elsewhere`) and looks there.

Only into a default state dir that is already there, a real directory (not a link) of the
running user that nobody else can write; `seen/` likewise, and each note is opened without
following a link. A note is a hint for a person: writing one never fails the approval, and a
note that cannot be read is skipped.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import stat
import time

from linpodx import fsutil

SEEN_DIR = "seen"
KEEP_SECONDS = 7 * 24 * 3600
"""Notes older than this are not read back (nor rewritten until the override is used again)."""
NOTES_MAX = 32
"""Notes read back, the most recent first."""
NOTE_LIMIT = 4096
"""Bytes of one note read back (a path)."""


def default_root() -> str | None:
    """The state dir the environment names without `LINPODX_STATE_DIR` (`paths.named_root`'s
    rule), or None when there is no absolute one."""
    xdg = os.environ.get("XDG_STATE_HOME", "")
    if xdg and os.path.isabs(xdg):
        return os.path.join(xdg, "linpodx")
    home = os.environ.get("HOME") or os.path.expanduser("~")
    return os.path.join(home, ".local", "state", "linpodx") if os.path.isabs(home) else None


def _own_dir(path: str) -> bool:
    try:
        st = os.lstat(path)
    except OSError:
        return False
    return stat.S_ISDIR(st.st_mode) and st.st_uid == os.geteuid() and not st.st_mode & 0o022


def remember(in_use: str) -> None:
    """Note `in_use` in the default state dir when it is another one (best effort)."""
    if not os.environ.get("LINPODX_STATE_DIR"):
        return
    default = default_root()
    if default is None or not _own_dir(default):
        return
    with contextlib.suppress(OSError):
        if os.path.samefile(default, in_use):
            return
    base = os.path.join(default, SEEN_DIR)
    with contextlib.suppress(OSError):
        if not os.path.lexists(base):
            os.mkdir(base, 0o700)
        if not _own_dir(base):
            return
        name = hashlib.sha256(in_use.encode("utf-8", "surrogatepass")).hexdigest()[:32]
        flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
        fd = os.open(os.path.join(base, name), flags, 0o600)
        try:
            if stat.S_ISREG(os.fstat(fd).st_mode):
                os.write(fd, in_use.encode("utf-8", "surrogatepass"))
        finally:
            os.close(fd)


def recent(in_use: str, now: float | None = None) -> list[str]:
    """The override paths noted in `in_use/seen/` within KEEP_SECONDS, the most recent first."""
    now = time.time() if now is None else now
    base = os.path.join(in_use, SEEN_DIR)
    if not _own_dir(base):
        return []
    found: list[tuple[float, str]] = []
    with contextlib.suppress(OSError):
        for entry in os.scandir(base):
            with contextlib.suppress(OSError):
                st = entry.stat(follow_symlinks=False)
                if stat.S_ISREG(st.st_mode) and now - st.st_mtime <= KEEP_SECONDS:
                    found.append((st.st_mtime, entry.path))
    out = []
    for _, path in sorted(found, reverse=True)[:NOTES_MAX]:
        try:
            raw = fsutil.read_regular(path, NOTE_LIMIT)
        except (OSError, fsutil.NotRegularFile):
            continue
        if raw is None or len(raw) > NOTE_LIMIT:
            continue
        text = raw.decode("utf-8", "replace")
        if os.path.isabs(text) and "\0" not in text and "\n" not in text:
            out.append(text)
    return out
