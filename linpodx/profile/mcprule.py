"""The grammar of an MCP rule's argument matchers and rate, and how a value is matched.

A rule of the profile language: the loader parses `arguments:` and `rate:` with it when a
profile is applied, and the gate (`linpodx.mcp.policy`) matches a call's arguments with the
same objects. Pure, no I/O.

Globs and regexes both run on one small matching machine (`_Program`): a Thompson NFA walked
one character at a time, so a match costs at most `len(subject) * len(program)` steps whatever
the pattern. Python's `re` backtracks: `.*a.*a.*a.*x` against 1,024 `a`s took 108 s, long
enough for one call to stall a session. `re.compile` decides what is a valid regex (what it
refuses is refused at load time); a reader here then reads Python's syntax for the subset the
machine runs (`re`'s own parser is private to CPython), and refuses a construct it has no
meaning for (anchors, look-arounds, back-references, inline flags, atomic groups, possessive
repeats).
"""

from __future__ import annotations

import re
import unicodedata
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import lru_cache
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


# ---- regexes -----------------------------------------------------------------------------
#
# `re.compile` decides what is a valid regex; `_RegexReader` then reads the valid pattern the
# way `re` reads it (token by token, an escape being one token) into the items below, refusing
# what the machine has no meaning for. It folds alternatives as `re`'s parser does (a common
# first item moves out: `ab|ac` is `a[bc]`), so MAX_PROGRAM counts the steps it counted when
# `re`'s parser read the pattern: `(a|b){100}` is 101 steps, not 500.
#
# Items: ("lit", c), ("notlit", c), ("any",), ("in", negate, members) (one character each;
# members are ("lit", c), ("range", lo, hi) with code points, ("cat", "d") for `\d`, …),
# ("group", seq, captures), ("branch", [seq, …]), ("repeat", lo, hi or None for no bound, seq).

_Item = tuple[Any, ...]
_Seq = list[_Item]

_CATEGORIES: dict[str, _Test] = {
    # As `re` reads them in a str pattern (Unicode): \d is a decimal digit of any script.
    "d": str.isdecimal,
    "D": lambda ch: not ch.isdecimal(),
    "s": str.isspace,
    "S": lambda ch: not ch.isspace(),
    "w": lambda ch: ch.isalnum() or ch == "_",
    "W": lambda ch: not (ch.isalnum() or ch == "_"),
}
_ESCAPES = {"a": "\a", "b": "\b", "f": "\f", "n": "\n", "r": "\r", "t": "\t", "v": "\v"}
_DIGITS = frozenset("0123456789")
_OCTAL = frozenset("01234567")
_HEX = frozenset("0123456789abcdefABCDEF")
_QUANTIFIERS: dict[str, tuple[int, int | None]] = {"*": (0, None), "+": (1, None), "?": (0, 1)}
_ONE_CHAR = frozenset({"lit", "notlit", "any", "in"})
_ANCHORS = "anchors (^, $, \\b, \\A, \\Z) are not supported: a regex always matches the whole value"
_FLAGS = "inline flags such as (?i) are not supported"
_BACKREF = "back-references such as \\1 or (?P=name) are not supported"


_AMBIGUOUS = (
    "a class that opens with `[`, or holds `--`, `&&`, `~~` or `||` after its first member, is one"
    " Python warns may become a set operation: escape the character (`\\[`, `\\-`, `\\&`, ...)"
)
"""Refused, so a rule means one thing on every Python (`re` reads these as literals today, and
warns)."""


class _RegexReader:
    """Reads a pattern `re.compile` took (so its syntax is valid) into items."""

    def __init__(self, pattern: str) -> None:
        self.text = pattern
        self.pos = 0

    def peek(self) -> str:
        """The next token, "" at the end: one character, or an escape's two."""
        text, pos = self.text, self.pos
        return text[pos : pos + 2] if text.startswith("\\", pos) else text[pos : pos + 1]

    def take(self) -> str:
        tok = self.peek()
        if not tok:
            raise PatternError("not a valid regular expression (unexpected end)")
        self.pos += len(tok)
        return tok

    def accept(self, tok: str) -> bool:
        if self.peek() != tok:
            return False
        self.pos += len(tok)
        return True

    def run(self, allowed: frozenset[str], most: int) -> str:
        """Up to `most` characters of `allowed`."""
        start = self.pos
        while self.pos - start < most and self.text[self.pos : self.pos + 1] in allowed:
            self.pos += 1
        return self.text[start : self.pos]

    def alternation(self) -> _Seq:
        alternatives = [self.sequence()]
        while self.accept("|"):
            alternatives.append(self.sequence())
        return alternatives[0] if len(alternatives) == 1 else _fold(alternatives)

    def sequence(self) -> _Seq:
        seq: _Seq = []
        while (tok := self.peek()) not in ("", "|", ")"):
            self.pos += len(tok)
            if tok[0] == "\\":
                seq.append(self.escape(tok[1]))
            elif tok == "[":
                seq.append(self.char_class())
            elif tok == ".":
                seq.append(("any",))
            elif tok == "(":
                group = self.group()
                if group is not None:
                    seq.append(group)
            elif tok in ("^", "$"):
                raise PatternError(_ANCHORS)
            elif tok in _QUANTIFIERS:
                seq[-1:] = [self.repeat(*_QUANTIFIERS[tok], seq[-1:])]
            elif tok == "{" and (bounds := self.bounds()) is not None:
                seq[-1:] = [self.repeat(*bounds, seq[-1:])]
            else:
                seq.append(("lit", tok))  # `{` that opens no bounds, `]`, `}`: themselves
        # `re` then opens the groups that capture nothing: `(?:ab)|ac` has a common first item.
        flat: _Seq = []
        for item in seq:
            flat.extend(item[1] if item[0] == "group" and not item[2] else (item,))
        return flat

    def bounds(self) -> tuple[int, int | None] | None:
        """After `{`: the bounds of `{m}`, `{m,}`, `{,n}` or `{m,n}`, or None where `re` reads
        the `{` as itself (`{}`, `{x`, `{1,x}`)."""
        start = self.pos
        if self.peek() != "}":
            lo = self.run(_DIGITS, len(self.text))
            hi = self.run(_DIGITS, len(self.text)) if self.accept(",") else lo
            if self.accept("}"):
                return int(lo) if lo else 0, int(hi) if hi else None
        self.pos = start
        return None

    def repeat(self, lo: int, hi: int | None, last: _Seq) -> _Item:
        if not last or last[0][0] == "repeat":
            raise PatternError("not a valid regular expression (nothing to repeat)")
        if self.accept("+"):
            raise PatternError("possessive repeats such as a*+ are not supported")
        self.accept("?")  # lazy or greedy makes no difference to whether the whole value matches
        body = last[0][1] if last[0][0] == "group" else last
        return ("repeat", lo, hi, body)

    def group(self) -> _Item | None:
        """After `(`: the group, or None for one that adds nothing (a comment, `(?u)`)."""
        capture = not self.accept("?")
        if not capture:
            kind = self.take()
            if kind == "#":
                while self.take() != ")":  # a comment ends at the first `)` not escaped
                    pass
                return None
            if kind == "P" and self.accept("<"):
                self.pos = self.text.index(">", self.pos) + 1  # a named group
                capture = True
            elif kind == "P" or kind == "(":
                conditional = "conditional groups such as (?(1)a|b) are not supported"
                raise PatternError(_BACKREF if kind == "P" else conditional)
            elif kind in ("=", "!", "<"):
                raise PatternError("look-arounds such as (?=...) are not supported")
            elif kind == ">":
                raise PatternError("atomic groups such as (?>...) are not supported")
            elif kind != ":":
                end = self.pos
                while self.text[end : end + 1] not in ("", ")", ":"):
                    end += 1
                if set(self.text[self.pos - 1 : end]) == {"u"} and self.text[end] == ")":
                    self.pos = end + 1  # `(?u)`: Unicode, as a str pattern is anyway
                    return None
                raise PatternError(_FLAGS)
        seq = self.alternation()
        if not self.accept(")"):
            raise PatternError("not a valid regular expression (missing `)`)")
        return ("group", seq, capture)

    def escape(self, c: str) -> _Item:
        """An escape outside [...]: `\\d` and its kin are a class of one, as in `re`."""
        if c in ("A", "b", "B", "Z"):
            raise PatternError(_ANCHORS)
        if c in _CATEGORIES:
            return ("in", False, (("cat", c),))
        if c in _DIGITS and c != "0":
            # `\1` refers to a group, `\123` (three octal digits) is a character.
            digits = c + self.text[self.pos : self.pos + 2]
            if len(digits) < 3 or not set(digits) <= _OCTAL:
                raise PatternError(_BACKREF)
            self.pos += 2
            return ("lit", chr(int(digits, 8)))
        return ("lit", self.character(c))

    def character(self, c: str) -> str:
        """The character an escape `\\c` (with what follows) stands for, in [...] or outside."""
        if c in _ESCAPES:
            return _ESCAPES[c]  # (outside [...] `\b` is an anchor, refused above)
        if c in ("x", "u", "U"):
            return chr(int(self.run(_HEX, {"x": 2, "u": 4, "U": 8}[c]), 16))
        if c == "N":
            end = self.text.index("}", self.pos)
            name, self.pos = self.text[self.pos + 1 : end], end + 1
            return unicodedata.lookup(name)
        if c in _OCTAL:
            return chr(int(c + self.run(_OCTAL, 2), 8))
        if c.isascii() and c.isalnum():
            raise PatternError(f"not a valid regular expression (bad escape \\{c})")
        return c  # `\.`, `\\`, `\-`, `\é`: the character itself

    def char_class(self) -> _Item:
        """After `[`: one character of a set (ranges, `^` to negate, escapes, `\\d` and kin)."""
        if self.peek() == "[":
            raise PatternError(_AMBIGUOUS)
        negate = self.accept("^")
        members: list[_Item] = []
        while True:
            tok = self.take()
            if tok == "]" and members:  # (a `]` first is itself)
                break
            if members and tok in ("-", "&", "~", "|") and self.peek() == tok:
                raise PatternError(_AMBIGUOUS)
            first = self.member(tok)
            if not self.accept("-"):
                members.append(first)
                continue
            tok = self.take()
            if tok == "]":  # `[a-]`: the `-` is itself
                members += [first, ("lit", "-")]
                break
            if tok == "-":
                raise PatternError(_AMBIGUOUS)
            second = self.member(tok)
            if first[0] != "lit" or second[0] != "lit" or first[1] > second[1]:
                raise PatternError("not a valid regular expression (bad character range)")
            members.append(("range", ord(first[1]), ord(second[1])))
        unique = tuple(dict.fromkeys(members))
        if len(unique) == 1 and unique[0][0] == "lit":
            return ("notlit", unique[0][1]) if negate else unique[0]
        return ("in", negate, unique)

    def member(self, tok: str) -> _Item:
        if tok[0] != "\\":
            return ("lit", tok)
        if tok[1] in _CATEGORIES:
            return ("cat", tok[1])
        return ("lit", self.character(tok[1]))


def _fold(alternatives: list[_Seq]) -> _Seq:
    """a|b|… as `re`'s parser reads it: while every alternative starts with the same one
    character item, that item moves out; if each is then one character, they are one class."""
    seq: _Seq = []
    head = alternatives[0][:1]
    while head and head[0][0] in _ONE_CHAR and all(alt[:1] == head for alt in alternatives):
        seq.append(head[0])
        alternatives = [alt[1:] for alt in alternatives]
        head = alternatives[0][:1]
    members: list[_Item] = []
    for alt in alternatives:
        if len(alt) == 1 and alt[0][0] == "lit":
            members.append(alt[0])
        elif len(alt) == 1 and alt[0][0] == "in" and not alt[0][1]:
            members.extend(alt[0][2])
        else:
            seq.append(("branch", alternatives))
            return seq
    seq.append(("in", False, tuple(dict.fromkeys(members))))
    return seq


def _range(lo: int, hi: int) -> _Test:
    return lambda ch: lo <= ord(ch) <= hi


def _not(c: str) -> _Test:
    return lambda ch: ch != c


def _class_test(negate: bool, members: Sequence[_Item]) -> _Test:
    tests: list[_Test] = []
    for kind, *arg in members:
        if kind == "lit":
            tests.append(_literal(arg[0]))
        elif kind == "range":
            tests.append(_range(arg[0], arg[1]))
        else:
            tests.append(_CATEGORIES[arg[0]])
    if negate:
        return lambda ch: not any(t(ch) for t in tests)
    return lambda ch: any(t(ch) for t in tests)


def _emit_regex(prog: _Program, seq: _Seq, dotall: bool) -> None:
    for item in seq:
        kind = item[0]
        if kind == "lit":
            prog.emit(_CHAR, _literal(item[1]))
        elif kind == "notlit":
            prog.emit(_CHAR, _not(item[1]))
        elif kind == "any":
            # `.` as `re` reads it without DOTALL (or with it: see Matcher.judge)
            prog.emit(_CHAR, _any if dotall else _not("\n"))
        elif kind == "in":
            prog.emit(_CHAR, _class_test(item[1], item[2]))
        elif kind == "group":
            _emit_regex(prog, item[1], dotall)
        elif kind == "branch":
            _emit_branch(prog, item[1], dotall)
        else:
            _emit_repeat(prog, item[1], item[2], item[3], dotall)


def _emit_repeat(prog: _Program, lo: int, hi: int | None, sub: _Seq, dotall: bool) -> None:
    for _ in range(lo):
        before = len(prog.code)
        _emit_regex(prog, sub, dotall)
        if len(prog.code) == before:
            # A body that emits nothing (`(?:){4000000000}`): its copies add nothing either,
            # and counting them out would hang the loader. Every other copy emits a step, so
            # MAX_PROGRAM bounds the loop.
            break

    def body() -> None:
        _emit_regex(prog, sub, dotall)

    if hi is None:
        _loop(prog, body)
    else:
        for _ in range(hi - lo):
            _optional(prog, body)


def _emit_branch(prog: _Program, alternatives: list[_Seq], dotall: bool) -> None:
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
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)  # the reader refuses what it warns of
            re.compile(pattern)
    except (re.error, OverflowError, RecursionError) as exc:
        raise PatternError(f"not a valid regular expression ({exc})") from None
    reader = _RegexReader(pattern)
    seq = reader.alternation()
    if reader.pos != len(pattern):
        raise PatternError("not a valid regular expression (unbalanced parenthesis)")
    prog = _Program()
    _emit_regex(prog, seq, dotall)
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
