"""`podman ps` of linpodx's containers, started before the rest of `linpodx ps` loads.

`linpodx ps` is podman's own listing plus the Python around it (bench/bench_cli.py: at most 2x
`podman ps`). Started first (`start`), podman lists while the listing's modules load, and only
`rows` waits for it. Only what the interpreter and `linpodx.cli.main` have already loaded comes
in before podman is on its way, and `linpodx.proc` (the one place programs start), the label
and the hints.
"""

from __future__ import annotations

import os
from typing import Any

from linpodx import proc
from linpodx.errors import EngineError
from linpodx.podman.hints import classify_hint, podman_bin, podman_json
from linpodx.podman.runline import MANAGED_LABEL

WHAT = "podman ps"


def argv(podman: str, all_states: bool) -> list[str]:
    """`podman ps` of the containers with linpodx's label, as JSON."""
    out = [podman, "ps", "--format=json", f"--filter=label={MANAGED_LABEL}=1"]
    if all_states:
        out.append("--all")
    return out


class Listing:
    """A `podman ps` on its way; `rows` waits for it."""

    def __init__(self, child: proc.Child) -> None:
        self._child = child

    def rows(self) -> list[dict[str, Any]]:
        """podman's rows (dicts only); EngineError with podman's words if it failed."""
        child = self._child
        try:
            rc, out, err = child.collect(proc.DEFAULT_TIMEOUT)
        except TimeoutError as exc:
            raise EngineError(
                f"{WHAT} did not finish within {proc.DEFAULT_TIMEOUT:g}s",
                "check the engine with `linpodx doctor`",
                argv=child.argv,
            ) from exc
        if rc != 0:
            stderr = err.decode("utf-8", "replace")
            default = "see podman's message above; `linpodx doctor` checks the host"
            raise EngineError(
                f"{WHAT} failed (exit {rc})",
                classify_hint(stderr, default),
                argv=child.argv,
                returncode=rc,
                stderr=stderr,
            )
        rows = podman_json(out.decode("utf-8", "replace") or "[]", "podman ps", child.argv)
        return [r for r in rows if isinstance(r, dict)] if isinstance(rows, list) else []


def start(all_states: bool) -> Listing:
    """Start `podman ps` now; EngineError if podman is missing or cannot be started."""
    found = podman_bin()
    try:
        return Listing(proc.Child(argv(found, all_states)))
    except OSError as exc:
        raise EngineError(
            f"{WHAT} could not be started: {os.strerror(exc.errno or 0)}",
            "check the engine with `linpodx doctor`",
            argv=(found,),
        ) from exc
