"""Approvals waiting in another state dir: why "the prompt never appears".

A listener (`linpodx events`) or `linpodx approve` only sees the state dir its environment
names; a bridge started with another `LINPODX_STATE_DIR`, or as root through `sudo` while the
person listens as themselves (or the other way round), keeps its approvals elsewhere. This
module looks, read-only, at the few other places the same person's approvals may be:

- the default state dirs of the running user (`$XDG_STATE_HOME/linpodx`,
  `~/.local/state/linpodx`, by `$HOME` and by the password database), when the one in use is
  another;
- the state dirs a `LINPODX_STATE_DIR` named where approvals were asked for in the last days
  (`approvals.seen` notes them in the default state dir);
- as root run through `sudo`, the default state dir of the user who ran `sudo` (root may read
  it; another user's dirs are read only then).

Nothing is followed through a link, and every directory on the way must belong to the user
whose dir it is: what is counted was written by linpodx for that user, or it is not counted.
It is advice for a person, so any error means "nothing to say" for that place.
"""

from __future__ import annotations

import os
import pwd
import shlex
import stat
import time
from dataclasses import dataclass

from linpodx import canonical, fsutil, ids
from linpodx.approvals import seen
from linpodx.approvals.store import REQUEST_LIMIT, PendingRequest
from linpodx.errors import LinpodxError
from linpodx.output import safe_text

SCAN_MAX = 1000
"""Entries of another approvals/ dir looked at, at most (a listener starts at once)."""


@dataclass(frozen=True)
class Elsewhere:
    """Approvals pending in a state dir other than the one in use."""

    state_dir: str
    pending: int
    command: str
    """The command that listens there."""


def _default_dirs(home: str, xdg_state: str | None) -> list[str]:
    out = []
    if xdg_state and os.path.isabs(xdg_state):
        out.append(os.path.join(xdg_state, "linpodx"))
    if home and os.path.isabs(home):
        out.append(os.path.join(home, ".local", "state", "linpodx"))
    return out


def _user_dir(path: str, uid: int) -> bool:
    """`path` is a directory (not a link) that `uid` owns and nobody else can write."""
    try:
        st = os.lstat(path)
    except OSError:
        return False
    return stat.S_ISDIR(st.st_mode) and st.st_uid == uid and not st.st_mode & 0o022


def count_pending(state_dir: str, uid: int, now: float | None = None) -> int:
    """Requests under `state_dir/approvals` that nobody answered and whose window is open;
    0 when the dir is not `uid`'s own (links not followed)."""
    now = time.time() if now is None else now
    base = os.path.join(state_dir, "approvals")
    if not (_user_dir(state_dir, uid) and _user_dir(base, uid)):
        return 0
    try:
        names = sorted(os.listdir(base))[-SCAN_MAX:]
    except OSError:
        return 0
    n = 0
    for name in names:
        d = os.path.join(base, name)
        if not ids.is_id(name, "apr") or not _user_dir(d, uid):
            continue
        try:
            os.lstat(os.path.join(d, "answer.json"))
            continue  # answered (or damaged, which is a deny): not waiting
        except FileNotFoundError:
            pass
        except OSError:
            continue
        try:
            raw = fsutil.read_regular(os.path.join(d, "request.json"), REQUEST_LIMIT)
            if raw is None or len(raw) > REQUEST_LIMIT:
                continue
            doc = canonical.strict_loads(raw, allow_floats=True)
            if not isinstance(doc, dict):
                continue
            if PendingRequest.from_dict(doc).expires > now:
                n += 1
        except (OSError, fsutil.NotRegularFile, canonical.CanonicalError, LinpodxError):
            continue
    return n


def _same(a: str, b: str) -> bool:
    try:
        return os.path.samefile(a, b)
    except OSError:
        return os.path.normpath(a) == os.path.normpath(b)


def candidates(in_use: str) -> list[tuple[str, int, str]]:
    """(state dir, owner uid, command that listens there) for each other place to look."""
    euid = os.geteuid()
    out: list[tuple[str, int, str]] = []
    try:
        own_home = pwd.getpwuid(euid).pw_dir
    except KeyError:
        own_home = ""
    mine = [
        *_default_dirs(os.environ.get("HOME", ""), os.environ.get("XDG_STATE_HOME")),
        *_default_dirs(own_home, None),
    ]
    for d in [*seen.recent(in_use), *mine]:
        cmd = f"LINPODX_STATE_DIR={shlex.quote(d)} linpodx events --filter approval"
        out.append((d, euid, cmd))
    sudo_uid = os.environ.get("SUDO_UID", "")
    if euid == 0 and sudo_uid.isascii() and sudo_uid.isdigit() and int(sudo_uid) != 0:
        try:
            user = pwd.getpwuid(int(sudo_uid))
        except (KeyError, OverflowError):
            user = None
        if user is not None:
            cmd = f"linpodx events --filter approval (as {user.pw_name}, without sudo)"
            for d in _default_dirs(user.pw_dir, None):
                out.append((d, user.pw_uid, cmd))
    looked: list[str] = [in_use]
    unique = []
    for d, uid, cmd in out:
        if any(_same(d, x) for x in looked):
            continue
        looked.append(d)
        unique.append((d, uid, cmd))
    return unique


def pending_elsewhere(in_use: str) -> list[Elsewhere]:
    """Other state dirs of this person with approvals waiting (see the module's docstring)."""
    found = []
    for d, uid, cmd in candidates(in_use):
        n = count_pending(d, uid)
        if n:
            found.append(Elsewhere(d, n, cmd))
    return found


def notes(in_use: str) -> list[str]:
    """Lines for stderr: one per other state dir with approvals waiting."""
    lines = []
    for e in pending_elsewhere(in_use):
        word = "approval" if e.pending == 1 else "approvals"
        lines.append(
            f"note: {e.pending} {word} pending in another state dir, "
            f"{safe_text(e.state_dir, 300)}; to answer them: {safe_text(e.command, 400)}"
        )
    return lines
