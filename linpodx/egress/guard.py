"""The egress guard API the container lifecycle codes against (first commit: fail-closed stub)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from linpodx.errors import EngineError

if TYPE_CHECKING:
    from linpodx.profile.store import StoredProfile


def prepare(name: str, stored: StoredProfile) -> Path:
    """Write the container's resolv.conf (bind-mounted over /etc/resolv.conf at create time)."""
    raise EngineError(
        "egress filtering not implemented yet",
        "use a profile with an empty network.egress_dns_allowlist for now",
    )


def resolv_conf_path(name: str) -> Path | None:
    """The resolv.conf `prepare` wrote for `name`, or None if there is none."""
    return None


def attach(name: str, pid: int, stored: StoredProfile) -> None:
    """Start the egress guard for `name` (init PID `pid`); raises EngineError on failure."""
    raise EngineError(
        "egress filtering not implemented yet",
        "use a profile with an empty network.egress_dns_allowlist for now",
    )


def status(name: str) -> str:
    """`none`, `healthy` or `down`."""
    return "none"


def detach(name: str) -> None:
    """Stop the guard of `name` if one runs and forget its runtime files."""


def update_profile(stored: StoredProfile) -> list[str]:
    """Push a re-applied profile's allowlist to its running containers; returns names updated."""
    return []
