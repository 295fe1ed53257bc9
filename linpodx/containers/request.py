"""What a run is asked for (`RunRequest`), what is said about a container (`ContainerInfo`), and
the profile revision it runs under (`resolve_profile`, `profile_by_id`)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

from linpodx.podman.argv import (
    CreateSpec,
)
from linpodx.profile.model import BUILTIN_ID, ProfileRef, builtin_ref

if TYPE_CHECKING:
    from linpodx.profile.store import StoredProfile


@dataclass(frozen=True)
class RunRequest:
    """What `linpodx run` was asked for."""

    image: str
    name: str | None = None
    profile: str | None = None
    """Applied profile name; None means the built-in default profile."""
    command: tuple[str, ...] = ()
    interactive: bool = False
    tty: bool = False
    detach: bool = False
    rm: bool = False
    pull: str | None = None
    """`--pull` (None: `LINPODX_PULL`, else `missing`; see `runline.pull_policy`)."""
    env: tuple[str, ...] = field(default=(), repr=False)
    """`-e KEY[=VALUE]` as given: values never go further than `linpodx.containers.runenv`."""
    env_files: tuple[str, ...] = ()
    """`--env-file FILE`s, read by `linpodx.containers.runenv`."""
    secrets: tuple[str, ...] = ()
    """`--secret NAME[,type=mount|env][,target=T]` as given (podman secret names)."""


@dataclass(frozen=True)
class ContainerInfo:
    """What the CLI prints about a container."""

    name: str
    container_id: str
    state: str
    profile: str
    revision: int
    image: str

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form."""
        return asdict(self)


def _ref_of(stored: StoredProfile) -> ProfileRef:
    return ProfileRef(
        profile=stored.profile,
        name=stored.name,
        profile_id=stored.profile_id,
        revision=stored.revision,
        audit_hash=stored.audit_hash,
        applied_at=stored.applied_at,
    )


def resolve_profile(name: str | None) -> ProfileRef:
    """An applied profile by name (NotFound otherwise), or the built-in default for None."""
    if name is None:
        return builtin_ref()
    from linpodx.profile import store  # not on every command's path (`ps`, `logs`)

    return _ref_of(store.get(name))


def profile_by_id(profile_id: str) -> ProfileRef:
    """The exact revision a container was created with (from its spec / labels)."""
    if profile_id == BUILTIN_ID:
        return builtin_ref()
    from linpodx.profile import store

    return _ref_of(store.get_by_id(profile_id))


Announce = Callable[[ContainerInfo, CreateSpec], None]
"""How a foreground run tells its caller about the container before any of its output."""
