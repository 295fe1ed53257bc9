"""What every stage of the loader shares: a `Problem` with its position, and the `Collector`
that gathers them (it knows where every value and key sits in the file) into one
`ProfileError`."""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass

from linpodx.errors import ProfileError
from linpodx.output import safe_text

MAX_PROBLEMS = 200
"""Stop listing after this many problems (a hostile file could produce millions)."""


@dataclass(frozen=True)
class Problem:
    """One thing wrong with a profile, with its position when the file has one."""

    message: str
    path: str = ""
    """Dotted key path (`mounts[0].source`), empty for file-level problems."""
    line: int | None = None
    """1-based line."""
    col: int | None = None
    """1-based column."""
    hint: str | None = None

    def render(self, filename: str) -> str:
        """`FILE:LINE:COL: key.path: message`."""
        where = filename if self.line is None else f"{filename}:{self.line}:{self.col}"
        return f"{where}: {self.path}: {self.message}" if self.path else f"{where}: {self.message}"


Pos = tuple[int, int]
KeyPath = tuple[str | int, ...]


def format_path(path: Sequence[str | int]) -> str:
    """`("mounts", 0, "source")` → `mounts[0].source`."""
    out = ""
    for part in path:
        if isinstance(part, int):
            out += f"[{part}]"
        elif re.fullmatch(r"[A-Za-z0-9_-]+", part):
            out += f".{part}" if out else part
        else:
            out += f"[{json.dumps(part, ensure_ascii=False)}]"
    return safe_text(out, 200)


class Collector:
    """Gathers problems with positions; knows where every value and key sits in the file."""

    def __init__(self, filename: str):
        self.filename = filename
        self.problems: list[Problem] = []
        self.values: dict[KeyPath, Pos] = {}
        self.keys: dict[KeyPath, Pos] = {}
        self.bad_paths: set[KeyPath] = set()
        self.suppressed: set[KeyPath] = set()
        """Values already reported (e.g. an unset `${VAR}`): schema errors there are noise."""
        self.float_texts: dict[KeyPath, str] = {}
        """How each floating-point value was written (`1e3`), for messages."""

    def pos(self, path: KeyPath, *, key: bool = False) -> Pos | None:
        """Position of the value (or key) at `path`, else of its nearest ancestor."""
        if key and path in self.keys:
            return self.keys[path]
        p = path
        while True:
            if p in self.values:
                return self.values[p]
            if not p:
                return None
            p = p[:-1]

    def add(
        self,
        path: KeyPath,
        message: str,
        hint: str | None = None,
        *,
        key: bool = False,
        pos: Pos | None = None,
    ) -> None:
        self.bad_paths.add(path)
        if len(self.problems) >= MAX_PROBLEMS:
            return
        where = pos or self.pos(path, key=key)
        line, col = where if where else (None, None)
        self.problems.append(Problem(message, format_path(path), line, col, hint))

    def error(self, summary: str | None = None) -> ProfileError:
        problems = sorted(self.problems, key=lambda p: (p.line or 0, p.col or 0))
        hints: list[str] = []
        for p in problems:
            if p.hint and p.hint not in hints:
                hints.append(p.hint)
        n = len(problems)
        more = " (only the first ones are listed)" if n >= MAX_PROBLEMS else ""
        message = summary or (
            f"profile {self.filename} refused: {n} problem{'s' if n != 1 else ''}{more}"
        )
        return ProfileError(
            message,
            "; ".join(hints[:4]) or "fix the lines above and run `linpodx sandbox validate FILE`",
            problems=[p.render(self.filename) for p in problems],
        )
