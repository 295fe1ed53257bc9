"""Finding podman, and what linpodx tells a person when podman fails (recognised from podman's
own words). Light on purpose: `linpodx ps` starts podman before the engine module loads
(`linpodx.podman.pslist`)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from linpodx import proc
from linpodx.errors import EngineError

NAME_IN_USE_HINT = (
    "choose another --name, or remove the old container "
    "(`linpodx rm NAME` if linpodx made it, `podman rm NAME` otherwise)"
)
PODMAN_HINT = "install podman (4.3 or newer) and check it with `linpodx doctor`"


def podman_bin() -> str:
    """Full path of podman, or EngineError with an install hint."""
    found = proc.which("podman")
    if found is None:
        raise EngineError("podman not found", PODMAN_HINT, argv=("podman",))
    return found


def podman_json(text: str, what: str, argv: Sequence[str] = ()) -> Any:
    """`text` (what podman printed) parsed as JSON; EngineError `WHAT printed something that
    is not JSON` when it is not, or nests past Python's stack (json's parser recurses: that
    was a RecursionError, an internal error, on hostile output)."""
    try:
        return json.loads(text)
    except (ValueError, RecursionError) as exc:  # (JSONDecodeError is a ValueError)
        raise EngineError(f"{what} printed something that is not JSON", argv=argv) from exc


def classify_hint(stderr: str, default: str | None = None) -> str | None:
    """A hint for the failures people hit most, recognised from podman's own message."""
    low = stderr.lower()
    if "image not known" in low or "no such image" in low or "unable to find" in low:
        return (
            "the image is not in this user's image store (`podman images`); pull it (`linpodx "
            "run --pull=missing`, the default unless LINPODX_PULL says otherwise) or import it "
            "first (rootless users have their own store)"
        )
    if "already in use" in low:
        return NAME_IN_USE_HINT
    if "no such container" in low:
        return "list linpodx containers with `linpodx ps --all`"
    if "cgroups in hybrid mode" in low or ("crun" in low and "cgroup" in low):
        return 'set runtime = "runc" under [engine] in containers.conf (see `linpodx doctor`)'
    if "setrlimit" in low or "rlimit" in low:
        return (
            "a ulimit exceeds the host's hard limit; lower resources.nofile/nproc "
            "(`linpodx doctor`)"
        )
    if "/dev/net/tun" in low:
        return "rootless networking needs a usable /dev/net/tun (`linpodx doctor`)"
    return default
