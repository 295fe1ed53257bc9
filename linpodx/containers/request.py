"""What a run is asked for (`RunRequest`), what is said about a container (`ContainerInfo`), and
the profile revision it runs under (`resolve_profile`, `profile_by_id`)."""

from __future__ import annotations

import contextlib
import os
import shlex
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

from linpodx.errors import LinpodxError, NotFound, UsageError
from linpodx.podman.argv import (
    CreateSpec,
)
from linpodx.profile.model import BUILTIN_ID, ProfileRef, builtin_ref
from linpodx.suggest import add_to_hint

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

    try:
        return _ref_of(store.get(name))
    except NotFound as err:
        if looks_like_profile_file(name):
            raise profile_file_given(name) from None
        with contextlib.suppress(LinpodxError, OSError):  # the store's own damage: no advice
            err.hint = add_to_hint(err.hint, name, (p.name for p in store.list_profiles()))
        raise


def looks_like_profile_file(name: str) -> bool:
    """Whether `--profile NAME` is a path to a profile file rather than a profile's name (it is
    not the name of an applied one): a file there, a `/` (never in a name), or a YAML suffix."""
    return "/" in name or name.endswith((".yml", ".yaml")) or os.path.isfile(name)


def profile_file_given(path: str) -> UsageError:
    """The refusal of `run --profile FILE`: `run` takes the name of an applied profile, never a
    file. Not applied on the spot: applying is a change of its own (recorded, a new revision),
    which a person decides to make, not a side effect of a run."""
    shown = shlex.quote(path)
    name = _name_in_file(path)
    return UsageError(
        f"--profile takes the name of an applied profile, not a file: {path}",
        f"apply it first with `linpodx sandbox apply --profile {shown}`, then run it by name: "
        f"`linpodx run --profile {shlex.quote(name) if name else 'NAME'} …`",
    )


def _name_in_file(path: str) -> str | None:
    """The `name:` of the profile file at `path`, read with the loader's own YAML reader and
    nothing else checked (its mounts may not exist yet); None if it has no valid one."""
    from pathlib import Path

    from linpodx.profile import store
    from linpodx.profile.loader import read_profile_text
    from linpodx.profile.loader.problems import Collector
    from linpodx.profile.loader.yaml import Converter, compose

    try:
        col = Collector(path)
        node = compose(read_profile_text(Path(path), path), col)
        data = Converter(col, {}).node(node, ()) if node is not None else None
    except (LinpodxError, OSError, ValueError):
        return None
    name = data.get("name") if isinstance(data, dict) else None
    return name if store.valid_name(name) else None


def profile_by_id(profile_id: str) -> ProfileRef:
    """The exact revision a container was created with (from its spec / labels)."""
    if profile_id == BUILTIN_ID:
        return builtin_ref()
    from linpodx.profile import store

    return _ref_of(store.get_by_id(profile_id))


Announce = Callable[[ContainerInfo, CreateSpec], None]
"""How a foreground run tells its caller about the container before any of its output."""
