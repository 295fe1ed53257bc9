"""The podman calls the container service makes, as one object that can be handed in.

Every podman call of this package goes through `podman()`. By default that is
`linpodx.podman.engine` itself (a module satisfies the protocol), so the real path costs
nothing; unit tests hand in a small fake with `use(fake)` instead of patching the engine's
module globals one by one. Pure helpers of the engine (argv builders, `state`, `labels_of`)
are not calls and stay where they are.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING, Any, Protocol

from linpodx.podman import pslist

if TYPE_CHECKING:
    from pathlib import Path

    from linpodx.proc import Child


class Podman(Protocol):
    """What the container service asks podman to do (`linpodx.podman.engine` has each)."""

    def create(self, create_argv: Sequence[str]) -> str: ...
    def create_home(self, name: str) -> None: ...
    def init(self, name: str, global_flags: Sequence[str] = ()) -> None: ...
    def start(self, name: str, global_flags: Sequence[str] = ()) -> None: ...
    def stop(self, name: str, timeout: int = 10) -> None: ...
    def stop_quietly(self, name_or_id: str) -> None: ...
    def remove(self, name: str, force: bool = False) -> object: ...
    def remove_quietly(self, name: str) -> str | None: ...
    def inspect(self, name: str) -> dict[str, Any]: ...
    def exists(self, name: str) -> bool: ...
    def container_pid(self, name: str) -> int: ...
    def list_managed(self, all_states: bool) -> list[dict[str, Any]]: ...
    def podman_bin(self) -> str: ...
    def run_inherited(
        self, argv: Sequence[str], stop: Callable[[], None] | None = None
    ) -> int: ...
    def start_run(self, argv: Sequence[str]) -> Child: ...
    def relay_announced(
        self,
        child: Child,
        cidfile: Path,
        on_created: Callable[[str, Callable[[], bool]], None],
    ) -> int: ...
    def stream_chunks(self, argv: Sequence[str], sink: Any) -> int: ...


_current: Podman | None = None
"""What `use` handed in; None: the real engine."""


def podman() -> Podman:
    """The podman the service calls (the real engine unless `use` handed in another)."""
    if _current is None:
        from linpodx.podman import engine  # on first use: `start_listing` starts podman first

        return engine
    return _current


def start_listing(all_states: bool) -> Callable[[], list[dict[str, Any]]]:
    """`podman ps` of linpodx's containers, started now; call the result for its rows. The
    real podman starts before the engine module loads (`linpodx.podman.pslist`), so `linpodx
    ps` loads the rest while podman lists; one that `use` handed in lists when asked."""
    if _current is None:
        return pslist.start(all_states).rows
    other = _current
    return lambda: other.list_managed(all_states)


@contextlib.contextmanager
def use(other: Podman) -> Iterator[Podman]:
    """Make the service call `other` instead of podman inside the block."""
    global _current
    before, _current = _current, other
    try:
        yield other
    finally:
        _current = before
