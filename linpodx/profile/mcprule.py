"""The grammar of an MCP rule's argument matchers and rate, and how a value is matched.

A rule of the profile language: the loader parses `arguments:` and `rate:` with it when a
profile is applied, and the gate (`linpodx.mcp.policy`) matches a call's arguments with the
same objects. Pure, no I/O.

Globs and regexes both run on one small matching machine (`_Program`): a Thompson NFA walked
one character at a time, so a match costs at most `len(subject) * len(program)` steps whatever
the pattern. Python's `re` backtracks: `.*a.*a.*a.*x` against 1,024 `a`s took 108 s, long
enough for one call to stall a session. Python's own parser reads the regex (what it cannot
compile is refused at load time); its tree is then compiled here, and a construct the machine
has no meaning for (anchors, look-arounds, back-references, inline flags) is refused too.
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import lru_cache
from re import _parser as _re_parser  # type: ignore[attr-defined]  # no stub; stable since 3.11
from typing import Any

KINDS = ("glob", "regex", "equals", "one_of")
"""The matchers, one per argument: exactly one of these keys."""

MAX_PATTERN = 256
"""Longest glob or regex, in characters (also in the schema)."""
MAX_PROGRAM = 256
"""Largest matching program a pattern may compile to (`{m,n}` repeats are expanded)."""
MAX_SUBJECT = 4096
"""Longest string a glob or regex is matched against, in characters: a longer value is a
non-match (the rule does not apply). With MAX_PROGRAM, one match visits at most about a
million states: about a second of CPU for the worst pattern on a 2-core test machine (`.*`
written 84 times, against 4,096 distinct characters), microseconds for `/proj/**`."""
MAX_ONE_OF = 64
"""Most values in a `one_of` list."""

RATE_UNITS = {"s": 1, "min": 60, "h": 3600}
MAX_RATE = 10_000
"""Most calls a `rate:` may allow per period (each admitted call is kept until it ages out)."""
_RATE = re.compile(r"([1-9][0-9]{0,4})/(s|min|h)")


# ---- the matching machine ----------------------------------------------------------------

_Test = Callable[[str], bool]
_MATCH, _CHAR, _SPLIT, _JUMP = 0, 1, 2, 3


class PatternError(ValueError):
    """A glob or regex the machine will not run (the message says why)."""


class _Program:
    """Instructions: (_CHAR, test), (_SPLIT, a, b), (_JUMP, a), (_MATCH,)."""

    def __init__(self) -> None:
        self.code: list[tuple[Any, ...]] = []
        self._steps: dict[tuple[frozenset[int], str], frozenset[int]] = {}

    def emit(self, *ins: Any) -> int:
        if len(self.code) >= MAX_PROGRAM:
            raise PatternError(f"the pattern is too large once expanded (over {MAX_PROGRAM} steps)")
        self.code.append(ins)
        return len(self.code) - 1

    def _closure(self, pcs: Sequence[int]) -> frozenset[int]:
        seen: set[int] = set()
        stack = list(pcs)
        while stack:
            pc = stack.pop()
            if pc in seen:
                continue
            seen.add(pc)
            ins = self.code[pc]
            if ins[0] == _SPLIT:
                stack.extend((ins[2], ins[1]))
            elif ins[0] == _JUMP:
                stack.append(ins[1])
        return frozenset(pc for pc in seen if self.code[pc][0] in (_CHAR, _MATCH))

    def fullmatch(self, subject: str) -> bool:
        """Whether the whole of `subject` matches (one pass, no backtracking)."""
        states = self._closure([0])
        steps = self._steps
        for ch in subject:
            if not states:
                return False
            key = (states, ch)
            nxt = steps.get(key)
            if nxt is None:
                nxt = self._closure(
                    [pc + 1 for pc in states if self.code[pc][0] == _CHAR and self.code[pc][1](ch)]
                )
                # Memoized transitions (a lazily built DFA), bounded: a subject of many
                # distinct characters must not grow memory without end.
                if len(steps) >= 4096:
                    steps.clear()
                steps[key] = nxt
            states = nxt
        return any(self.code[pc][0] == _MATCH for pc in states)


def _loop(prog: _Program, body: Callable[[], object]) -> None:
    """`body` zero or more times."""
    split = prog.emit(_SPLIT, 0, 0)
    body()
    prog.emit(_JUMP, split)
    prog.code[split] = (_SPLIT, split + 1, len(prog.code))


def _optional(prog: _Program, body: Callable[[], object]) -> None:
    """`body` once or not at all."""
    split = prog.emit(_SPLIT, 0, 0)
    body()
    prog.code[split] = (_SPLIT, split + 1, len(prog.code))


def _not_slash(ch: str) -> bool:
    return ch != "/"


def _any(_ch: str) -> bool:
    return True


def _literal(c: str) -> _Test:
    return lambda ch: ch == c


@lru_cache(maxsize=256)
def compile_glob(pattern: str) -> _Program:
    """`**` is any run of characters, `/` included (`a/**/b` also matches `a/b`, `**/b` also
    `b`); `*` and `?` are any run of characters and any one character within one path
    segment. Everything else is itself (the loader refuses `[ ] { } \\`, so no character
    means two things)."""
    prog = _Program()
    i = 0

    def segments() -> None:
        _loop(prog, lambda: prog.emit(_CHAR, _any))
        prog.emit(_CHAR, _literal("/"))

    while i < len(pattern):
        if i == 0 and pattern.startswith("**/"):
            # `**/.ssh/**` also takes `.ssh/id_rsa`, as `a/**/b` takes `a/b`.
            _optional(prog, segments)
            i += 3
        elif pattern.startswith("/**/", i):
            prog.emit(_CHAR, _literal("/"))
            _optional(prog, segments)
            i += 4
        elif pattern.startswith("**", i):
            _loop(prog, lambda: prog.emit(_CHAR, _any))
            i += 2
        elif pattern[i] == "*":
            _loop(prog, lambda: prog.emit(_CHAR, _not_slash))
            i += 1
        elif pattern[i] == "?":
            prog.emit(_CHAR, _not_slash)
            i += 1
        else:
            prog.emit(_CHAR, _literal(pattern[i]))
            i += 1
    prog.emit(_MATCH)
    return prog


_CATEGORIES: dict[str, _Test] = {
    "CATEGORY_DIGIT": str.isdecimal,
    "CATEGORY_NOT_DIGIT": lambda ch: not ch.isdecimal(),
    "CATEGORY_SPACE": str.isspace,
    "CATEGORY_NOT_SPACE": lambda ch: not ch.isspace(),
    "CATEGORY_WORD": lambda ch: ch.isalnum() or ch == "_",
    "CATEGORY_NOT_WORD": lambda ch: not (ch.isalnum() or ch == "_"),
}
_UNICODE_FLAG = re.UNICODE.value


def _range(lo: int, hi: int) -> _Test:
    return lambda ch: lo <= ord(ch) <= hi


def _not(c: str) -> _Test:
    return lambda ch: ch != c


def _class_test(items: list[tuple[Any, Any]]) -> _Test:
    negate = False
    tests: list[_Test] = []
    for op, arg in items:
        name = str(op)
        if name == "NEGATE":
            negate = True
        elif name == "LITERAL":
            tests.append(_literal(chr(arg)))
        elif name == "RANGE":
            lo, hi = arg
            tests.append(_range(lo, hi))
        elif name == "CATEGORY" and str(arg) in _CATEGORIES:
            tests.append(_CATEGORIES[str(arg)])
        else:
            raise PatternError(f"{name.lower()} inside [...] is not supported")
    if negate:
        return lambda ch: not any(t(ch) for t in tests)
    return lambda ch: any(t(ch) for t in tests)


def _emit_regex(prog: _Program, items: Any, dotall: bool) -> None:
    for op, arg in items:
        name = str(op)
        if name == "LITERAL":
            prog.emit(_CHAR, _literal(chr(arg)))
        elif name == "NOT_LITERAL":
            prog.emit(_CHAR, _not(chr(arg)))
        elif name == "ANY":
            # `.` as `re` reads it without DOTALL (or with it: see Matcher.judge)
            prog.emit(_CHAR, _any if dotall else _not("\n"))
        elif name == "IN":
            prog.emit(_CHAR, _class_test(list(arg)))
        elif name == "CATEGORY" and str(arg) in _CATEGORIES:
            prog.emit(_CHAR, _CATEGORIES[str(arg)])
        elif name == "SUBPATTERN":
            _group, add_flags, del_flags, sub = arg
            if add_flags or del_flags:
                raise PatternError("inline flags such as (?i) are not supported")
            _emit_regex(prog, sub, dotall)
        elif name == "BRANCH":
            _emit_branch(prog, arg[1], dotall)
        elif name in ("MAX_REPEAT", "MIN_REPEAT"):
            # Lazy or greedy makes no difference to whether the whole value matches.
            lo, hi, sub = arg
            for _ in range(lo):
                before = len(prog.code)
                _emit_regex(prog, sub, dotall)
                if len(prog.code) == before:
                    # A body that emits nothing (`(?:){4000000000}`): its copies add nothing
                    # either, and counting them out would hang the loader. Every other copy
                    # emits a step, so MAX_PROGRAM bounds the loop.
                    break

            def body(sub: Any = sub) -> None:
                _emit_regex(prog, sub, dotall)

            if hi == _re_parser.MAXREPEAT:
                _loop(prog, body)
            else:
                for _ in range(hi - lo):
                    _optional(prog, body)
        elif name == "AT":
            raise PatternError("anchors (^, $, \\b, \\A, \\Z) are not supported: a regex "
                               "always matches the whole value")
        else:
            raise PatternError(f"{name.lower().replace('_', ' ')} is not supported")


def _emit_branch(prog: _Program, alternatives: list[Any], dotall: bool) -> None:
    jumps: list[int] = []
    for alt in alternatives[:-1]:
        split = prog.emit(_SPLIT, 0, 0)
        _emit_regex(prog, alt, dotall)
        jumps.append(prog.emit(_JUMP, 0))
        prog.code[split] = (_SPLIT, split + 1, len(prog.code))
    _emit_regex(prog, alternatives[-1], dotall)
    for j in jumps:
        prog.code[j] = (_JUMP, len(prog.code))


@lru_cache(maxsize=256)
def compile_regex(pattern: str, dotall: bool = False) -> _Program:
    """The program for a regex that must match the whole value (raises PatternError); with
    `dotall`, `.` matches a line end too."""
    try:
        re.compile(pattern)
        tree = _re_parser.parse(pattern)
    except (re.error, OverflowError, RecursionError) as exc:
        raise PatternError(f"not a valid regular expression ({exc})") from None
    if tree.state.flags & ~_UNICODE_FLAG:
        raise PatternError("inline flags such as (?i) are not supported")
    prog = _Program()
    _emit_regex(prog, tree, dotall)
    prog.emit(_MATCH)
    return prog


# ---- paths -------------------------------------------------------------------------------


def normalize_path(value: str) -> str | None:
    """The lexically normalized POSIX form of `value` (`.` and empty segments dropped, `..`
    taken back), or None: empty, holds NUL, or climbs above its root (`/a/../..`, `../x`)."""
    if not value or "\0" in value:
        return None
    absolute = value.startswith("/")
    parts: list[str] = []
    for seg in value.split("/"):
        if seg in ("", "."):
            continue
        if seg == "..":
            if not parts:
                return None
            parts.pop()
        else:
            parts.append(seg)
    text = "/".join(parts)
    if absolute:
        return "/" + text
    return text or "."


_PERCENT_ESCAPE = re.compile(r"%[0-9A-Fa-f]{2}")


def read_otherwise(value: str) -> bool:
    """Whether a server could read `value` as another path than its POSIX form: it holds a
    backslash (a separator on Windows, an escape to some parsers), a %XX escape (decoded by a
    server that takes file: URIs), or a character whose compatibility form holds `.`, `/`, `\\`
    or `%` (full-width dots, or the one-dot leader U+2024, which NFKC makes `.`). Linux reads each
    literally, but the gate cannot know how the server reads it, so a glob does not judge it."""
    if "\\" in value or _PERCENT_ESCAPE.search(value):
        return True
    return any(
        ord(c) > 127 and any(x in unicodedata.normalize("NFKC", c) for x in "./\\%")
        for c in value
    )


_TRIMMED = (
    "\x09\x0a\x0b\x0c\x0d\x1c\x1d\x1e\x1f\x20\x85\xa0\u1680\u2000\u2001\u2002\u2003\u2004"
    "\u2005\u2006\u2007\u2008\u2009\u200a\u2028\u2029\u202f\u205f\u3000\ufeff"
)
"""What servers trim from a value's ends: every character Python's `str.isspace` takes (its
`strip()`; Go's `TrimSpace` takes fewer), and the BOM, which JavaScript's `trim()` takes too."""


def _dot_dot(value: str) -> bool:
    """Whether a segment of `value` is `..`, or is once whitespace around it is trimmed: a
    server that trims the value (`/proj/.. ` to `/proj/..`) reads the root's parent."""
    return any(seg.strip(_TRIMMED) == ".." for seg in value.split("/"))


def glob_problem(pattern: str) -> str | None:
    """Why `pattern` is no glob the gate can match with, or None."""
    bad = sorted({c for c in pattern if c in "[]{}\\"})
    if bad:
        return f"{''.join(bad)} has no meaning in a glob here (only *, ** and ?)"
    if normalize_path(pattern) != pattern or (pattern.endswith("/") and pattern != "/"):
        return "a glob must be a normalized path (no `.`, `..`, `//` or trailing `/`)"
    return None


# ---- JSON values -------------------------------------------------------------------------


def json_equal(a: Any, b: Any) -> bool:
    """Equality of two JSON values, types included: 1, true, 1.0 and "1" are four values."""
    if type(a) is not type(b):
        return False
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(json_equal(a[k], b[k]) for k in a)
    if isinstance(a, list):
        return len(a) == len(b) and all(json_equal(x, y) for x, y in zip(a, b, strict=True))
    return bool(a == b)


def _kind(v: Any) -> str:
    """A JSON value's type as a server compares it: 1 and 1.0 are both numbers."""
    if v is None:
        return "null"
    if isinstance(v, bool):
        return "bool"
    if isinstance(v, (int, float)):
        return "number"
    return type(v).__name__


def _same_number(a: Any, b: Any) -> bool:
    """Whether `a` and `b` are the same number or hold the same numbers where `json_equal`
    tells an int from a float (`1` and `1.0`, `{"n": 1}` and `{"n": 1.0}`)."""
    if _kind(a) != _kind(b):
        return False
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(_same_number(a[k], b[k]) for k in a)
    if isinstance(a, list):
        return len(a) == len(b) and all(_same_number(x, y) for x, y in zip(a, b, strict=True))
    return bool(a == b)


# ---- the profile's values ----------------------------------------------------------------


@dataclass(frozen=True, eq=False)
class Matcher:
    """One argument's matcher: `kind` is one of KINDS; `value` the glob or regex (a string),
    the JSON value (`equals`) or the tuple of JSON values (`one_of`)."""

    kind: str
    value: Any

    def matches(self, arg: Any) -> bool:
        """Whether `arg` (a JSON value from the call) surely satisfies this matcher."""
        return self.judge(arg) is True

    def judge(self, arg: Any) -> bool | None:
        """True or False, or None where the matcher cannot judge `arg`: for a glob or regex no
        string, NUL in it, longer than MAX_SUBJECT, (a regex) a value it matches only if `.`
        crosses a line end, or (a glob) a path that holds a `..` segment or is relative where
        the glob is absolute (or the reverse); for `equals` and
        `one_of` a value of another JSON type than every value named, or the same number
        written otherwise (1.0 for 1). The gate reads None as a non-match for an `auto_allow`
        rule and as a match for a stricter one, so that such a value never slips past a `deny`
        into a later, looser rule."""
        if self.kind in ("equals", "one_of"):
            values = self.value if self.kind == "one_of" else (self.value,)
            if any(json_equal(v, arg) for v in values):
                return True
            # Where a server may read `arg` as one of the values, this cannot say it is not:
            # 1.0 is the number 1 to a Python or JavaScript server, and a value of a type none
            # of the values has (`["rm"]` for "rm") may be coerced. Exact types still decide
            # an allow; they no longer let a call past a deny.
            if any(_same_number(v, arg) for v in values):
                return None
            return None if _kind(arg) not in {_kind(v) for v in values} else False
        if not isinstance(arg, str) or len(arg) > MAX_SUBJECT or "\0" in arg:
            return None
        if self.kind == "glob":
            path = normalize_path(arg)
            if path is None or read_otherwise(arg) or _dot_dot(arg):
                # `..`: the kernel takes it back from where a symlink before it led, not from
                # the link (`/proj/node_modules/@s/pkg/../../../x`, pkg a link to
                # ../../packages/pkg, is /proj/x to the text and /x to the file system).
                return None
            rooted = self.value.startswith("/")
            if not self.value.startswith("**") and path.startswith("/") != rooted:
                # A relative path (`.ssh/id_rsa`, `~/.ssh`, `file:///etc`) against an
                # absolute glob, or the reverse: what it names depends on the server's working
                # directory and its reading of `~` and URLs, which the gate cannot see. (A
                # glob that starts with `**` takes both.)
                return None
            return compile_glob(self.value).fullmatch(path)
        if compile_regex(self.value).fullmatch(arg):
            return True
        # `.` stops at a line end, as `re` reads it, and a server may read lines apart (a
        # shell runs each): "ls\nrm -rf ~" is not `ls .*`, nor is it clear of `.*rm .*`.
        # A value a `.` would have to cross a line end to match is not judged.
        if "\n" in arg and compile_regex(self.value, dotall=True).fullmatch(arg):
            return None
        return False

    def to_dict(self) -> dict[str, Any]:
        return {self.kind: list(self.value) if self.kind == "one_of" else self.value}

    def __eq__(self, other: object) -> bool:
        return (
            isinstance(other, Matcher)
            and self.kind == other.kind
            and json_equal(self.to_dict(), other.to_dict())
        )

    def __hash__(self) -> int:
        return hash(self.kind)


@dataclass(frozen=True)
class Rate:
    """`N/s`, `N/min` or `N/h`: at most `count` matches in any `seconds`-long window."""

    count: int
    seconds: int

    @property
    def text(self) -> str:
        unit = {v: k for k, v in RATE_UNITS.items()}[self.seconds]
        return f"{self.count}/{unit}"


def parse_rate(text: str) -> Rate | None:
    """`30/min` → Rate(30, 60); None for anything else."""
    m = _RATE.fullmatch(text)
    if m is None or int(m.group(1)) > MAX_RATE:
        return None
    return Rate(int(m.group(1)), RATE_UNITS[m.group(2)])


def parse_matcher(raw: dict[str, Any]) -> tuple[Matcher | None, str | None, str | None]:
    """A Matcher from `{glob: …}` (the schema already checked its shape), or (None, problem,
    hint)."""
    ((kind, value),) = raw.items()
    if kind == "glob":
        problem = glob_problem(value)
        if problem:
            return None, problem, "e.g. `/proj/**` (everything below /proj) or `/proj/*.py`"
        try:
            compile_glob(value)
        except PatternError as exc:
            return None, str(exc), "use a shorter glob"
    elif kind == "regex":
        try:
            compile_regex(value)
        except PatternError as exc:
            return None, str(exc), "e.g. `[a-z0-9_-]+` (it matches the whole value)"
    elif kind == "one_of":
        value = tuple(value)
    return Matcher(kind, value), None, None
