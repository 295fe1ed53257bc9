"""Importing modules at a lower CPU priority, for processes that race podman at start-up.

A `linpodx run` and its egress guard both import most of their code while podman creates the
container; none of that is what podman waits for, and on a machine with few CPUs it competed
with podman and runc for them. Linux keeps a niceness per thread, so the imports run in a
thread of their own that yields, while the calling thread (and every thread it starts later:
the output relay, the guard's resolver) keeps its priority. Lowering the niceness back would
need CAP_SYS_NICE, which rootless runs lack; this never has to.
"""

from __future__ import annotations

import importlib
import os
import threading

TYPE_CHECKING = False  # the fast path's budget: linpodx/fastpath/__init__.py
if TYPE_CHECKING:
    from types import ModuleType

NICE = 10
"""How much lower the importing thread's priority is than its caller's."""


def import_yielding(modules: tuple[str, ...]) -> list[ModuleType]:
    """Import `modules` (in order) in a thread NICE steps lower in priority and wait for it;
    raises what an import raised."""
    done: list[ModuleType] = []
    failed: list[BaseException] = []

    def work() -> None:
        tid = threading.get_native_id()
        try:
            nice = os.getpriority(os.PRIO_PROCESS, tid)
            os.setpriority(os.PRIO_PROCESS, tid, min(19, nice + NICE))
        except OSError:
            pass  # a priority that cannot be lowered: import at this one
        try:
            done.extend(importlib.import_module(m) for m in modules)
        except BaseException as exc:  # handed to the caller
            failed.append(exc)

    t = threading.Thread(target=work, name="imports")
    t.start()
    t.join()
    if failed:
        raise failed[0]
    return done
