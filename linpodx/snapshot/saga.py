"""A saga: steps that change the world, each with the undo that puts back what it changed.

The runner is the one place the write-ahead rule lives: the journal names a step before the
step changes anything, so a process killed mid-step leaves a journal that says how far it MAY
have got. That is why an undo never trusts the journal about its own step: it looks at what is
really there and is safe to run when its step did not happen, or happened twice (recovery can
itself be killed and run again).

Undo runs the undos of every step that may have started, last first. The same `undo` serves a
failure in the running process and the recovery of a killed one, started from its journal.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Generic, Protocol, TypeVar

C = TypeVar("C")


class Faults(Protocol):
    """Where a test makes a saga fail: called right after each step changed something (so a
    test proves that step's undo), with the step's name. The default does nothing."""

    def at(self, point: str) -> None: ...


class NoFaults:
    """Production's fault points: none."""

    def at(self, point: str) -> None:
        return None


NO_FAULTS: Faults = NoFaults()


@dataclass(frozen=True)
class Step(Generic[C]):
    """One step: `do` changes something, `undo` puts it back from what is really there."""

    name: str
    do: Callable[[C], None]
    undo: Callable[[C], None] | None = None


@dataclass(frozen=True)
class Saga(Generic[C]):
    """Steps in the order they run. `journal(name)` records, before step `name` starts, that it
    is about to (write-ahead); it is called for every step, the first included."""

    steps: Sequence[Step[C]]

    def names(self) -> tuple[str, ...]:
        return tuple(s.name for s in self.steps)

    def run(self, ctx: C, journal: Callable[[str], None], faults: Faults = NO_FAULTS) -> None:
        """Run every step; the first exception stops it (the caller decides about the undo)."""
        for step in self.steps:
            journal(step.name)
            step.do(ctx)
            faults.at(step.name)

    def undo(self, ctx: C, reached: str) -> None:
        """Undo every step up to and including `reached` (the last one that may have started),
        last first. An undo collects its problems in `ctx` and never stops the others."""
        last = self.names().index(reached)
        for step in reversed(self.steps[: last + 1]):
            if step.undo is not None:
                step.undo(ctx)
