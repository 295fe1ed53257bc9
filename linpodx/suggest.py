"""Did-you-mean for names people type: profiles, containers, snapshots.

Only ever words a hint: a suggestion is never acted on (a typo'd name must not run the
container or profile it resembles)."""

from __future__ import annotations

import difflib
from collections.abc import Iterable

CUTOFF = 0.6
"""difflib's similarity ratio a known name needs to be offered (its own default)."""
MAX_SUGGESTIONS = 3


def close_to(word: str, known: Iterable[str]) -> list[str]:
    """The known names most like `word`, best first (at most MAX_SUGGESTIONS; never `word`)."""
    names = sorted({k for k in known if k and k != word})
    return difflib.get_close_matches(word, names, n=MAX_SUGGESTIONS, cutoff=CUTOFF)


def did_you_mean(word: str, known: Iterable[str]) -> str:
    """`did you mean `a` (or `b`)?`, or "" when nothing known is close to `word`."""
    found = close_to(word, known)
    if not found:
        return ""
    return "did you mean " + " or ".join(f"`{f}`" for f in found) + "?"


def add_to_hint(hint: str | None, word: str, known: Iterable[str]) -> str | None:
    """`hint` with a did-you-mean in front of it (unchanged when nothing is close)."""
    said = did_you_mean(word, known)
    if not said:
        return hint
    return f"{said} {hint}" if hint else said
