"""The regex matcher's own reading of Python's syntax, held to `re` as the oracle.

`linpodx.profile.mcprule` reads a rule's regex itself (no private `re._parser`) and runs it on
its linear-time machine. Random patterns of the subset it supports, against random values,
must match exactly where `re.fullmatch` does, with and without DOTALL.
"""

from __future__ import annotations

import random
import re
import warnings
from collections.abc import Callable

import pytest

from linpodx.profile.mcprule import MAX_PATTERN, PatternError, compile_regex

LITERALS = ["a", "b", "x", "-", "_", " ", "é", "0", "7", ",", "}", "]", "{}", "{,x}", "{1,x}"]
ESCAPES = [
    r"\d", r"\w", r"\s", r"\D", r"\W", r"\S", r"\n", r"\t", r"\r", r"\f", r"\v", r"\a", r"\\",
    r"\.", r"\-", r"\*", r"\+", r"\?", r"\(", r"\)", r"\[", r"\]", r"\{", r"\}", r"\|", r"\^",
    r"\$", r"\/", r"\ ", r"\é", r"\x61", r"\x0a", r"\u00e9", r"\u2014", r"\U0001F600",
    r"\N{EM DASH}", r"\0", r"\012", r"\101", r"\141",
]  # fmt: skip
IN_CLASS = [
    "a", "b", "c", "x", "0", "9", "é", "[", " ", ".", "*", "(", r"\d", r"\w", r"\s",
    r"\D", r"\W", r"\S", r"\n", r"\t", r"\]", r"\-", r"\\", r"\^", r"\x41", r"\b", r"\0", r"\101",
    r"\u00e9", r"\N{EM DASH}", "a-c", "0-9", "x-z", r"\x00-\x7f", r"\--\x2f", "é-ü", r"\n-\r",
]  # fmt: skip
QUANTIFIERS = [("*", 0, None), ("+", 1, None), ("?", 0, 1), ("{2}", 2, 2), ("{1,}", 1, None),
               ("{0,2}", 0, 2), ("{,2}", 0, 2), ("{1,3}", 1, 3), ("{0}", 0, 0), ("{,}", 0, None)]
SUBJECT_CHARS = "abxcz-_ 0179,{}]é\n\r\t\x07\x0b\x08\u2014\u2003\u0661\u00b2\u00bd\U0001f600AB/.\\"
"""What values are made of: ASCII, line ends and controls, and Unicode digits, numbers, spaces
and letters, where `\\d`, `\\s` and `\\w` of a str pattern differ from their ASCII forms."""

Sample = Callable[[random.Random], str]
"""Draws a value the pattern it was made with matches (most of the time: see one_char)."""
_CHARS: dict[str, list[str]] = {}


def one_char(atom: str) -> Sample:
    """A draw of a character `re` says `atom` matches ("" where SUBJECT_CHARS holds none, or
    for the empty atom)."""
    if atom not in _CHARS:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)  # `re` on "[[": possible nested set
            _CHARS[atom] = [c for c in SUBJECT_CHARS if re.fullmatch(atom, c)]
    chars = _CHARS[atom]
    return lambda rng: rng.choice(chars) if chars else ""


def random_class(rng: random.Random) -> str:
    first = rng.choice(["", "", "", "]", "-"])  # `]` or `-` first is itself (a lone `-` or
    # `^` elsewhere would make a range of its neighbours or a negation)
    items = "".join(rng.choice(IN_CLASS) for _ in range(rng.randint(1, 3)))
    last = "-" if rng.random() < 0.1 else ""
    return "[" + ("^" if rng.random() < 0.3 else "") + first + items + last + "]"


def random_char(rng: random.Random) -> str:
    """An item of one character: itself, an escape, `.` or a class."""
    pick = rng.random()
    if pick < 0.25:
        return rng.choice([c for c in LITERALS if len(c) == 1])
    if pick < 0.6:
        return rng.choice(ESCAPES)
    return "." if pick < 0.7 else random_class(rng)


def random_regex(rng: random.Random, depth: int = 0) -> tuple[str, Sample, bool]:
    """A pattern of the subset the matcher supports (always valid to `re`), its sampler, and
    whether it holds an unbounded repeat. A group that holds a repeat or a choice is not itself
    repeated without bound: `re` backtracks, and `(?:(?:a|)*)*` against a few characters
    would take it ages."""
    parts: list[str] = []
    samples: list[Sample] = []
    unbounded = False
    for _ in range(rng.randint(0, 4)):
        pick = rng.random()
        inner_unbounded = inner_repeats = False
        if pick < 0.3:
            atom = rng.choice(LITERALS)
            sample: Sample = lambda _rng, text=atom: text  # noqa: E731  # (each is itself)
        elif pick < 0.65:
            atom = random_char(rng)
            sample = one_char(atom)
        elif pick < 0.75:
            # Alternatives of one character each, after a common one at times: `re` folds them.
            head = random_char(rng) if rng.random() < 0.4 else ""
            alternatives = [random_char(rng) for _ in range(rng.randint(2, 3))]
            atom = "(?:" + "|".join(head + alt for alt in alternatives) + ")"
            first, draws = one_char(head), [one_char(alt) for alt in alternatives]
            sample = lambda r, h=first, d=draws: h(r) + r.choice(d)(r)  # noqa: E731
            inner_repeats = True
        elif pick < 0.88 and depth < 3:
            opening = rng.choice(["(", "(?:", f"(?P<g{rng.randrange(10**9)}>"])
            inner, sample, inner_unbounded = random_regex(rng, depth + 1)
            atom = opening + inner + ")"
            inner_repeats = inner_unbounded or bool(re.search(r"[*+?}]", inner))
        elif depth < 3:
            one, first, one_unbounded = random_regex(rng, depth + 1)
            two, second, two_unbounded = random_regex(rng, depth + 1)
            atom = f"(?:{one}|{two})"
            sample = lambda r, a=first, b=second: r.choice((a, b))(r)  # noqa: E731
            inner_unbounded = one_unbounded or two_unbounded
            inner_repeats = True
        else:
            atom, sample = "a", lambda _rng: "a"
        if rng.random() < 0.35:
            text, lo, hi = rng.choice(
                [q for q in QUANTIFIERS if q[2] is not None] if inner_repeats else QUANTIFIERS
            )
            atom += text + ("?" if rng.random() < 0.3 else "")  # lazy: the same whole matches
            inner_unbounded = inner_unbounded or hi is None
            top = lo + 2 if hi is None else hi

            def sample(r: random.Random, one: Sample = sample, lo: int = lo, top: int = top) -> str:
                return "".join(one(r) for _ in range(r.randint(lo, top)))

        if rng.random() < 0.05:
            atom += "(?#a comment \\) ends here)"
        parts.append(atom)
        samples.append(sample)
        unbounded = unbounded or inner_unbounded
    whole = "".join(parts)
    if rng.random() < 0.2 and depth < 2:
        rest, other, rest_unbounded = random_regex(rng, depth + 1)
        return f"{whole}|{rest}", lambda r: (
            "".join(s(r) for s in samples) if r.random() < 0.5 else other(r)
        ), unbounded or rest_unbounded
    return whole, lambda r: "".join(s(r) for s in samples), unbounded


def random_subject(rng: random.Random, sample: Sample) -> str:
    """A value the pattern matches, one changed in one place, or one of random characters; at
    most 8 long (`re` backtracks: nested repeats against a long value would take it ages)."""
    pick = rng.random()
    value = sample(rng) if pick < 0.7 else ""
    if pick < 0.4:
        return value[:8]
    if pick < 0.7:
        at = rng.randint(0, len(value))
        return (value[:at] + rng.choice(["", *SUBJECT_CHARS]) + value[at + 1 :])[:8]
    return "".join(rng.choice(SUBJECT_CHARS) for _ in range(rng.randint(0, 8)))


def test_the_matcher_agrees_with_re_on_random_patterns_and_values() -> None:
    rng = random.Random(22)  # noqa: S311 - a reproducible fuzz, not a secret
    compared = matched = too_large = 0
    for _ in range(1500):
        pattern, sample, _unbounded = random_regex(rng)
        if len(pattern) > MAX_PATTERN:
            continue
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)  # `re` on "[[": possible nested set
            plain, dotall = re.compile(pattern), re.compile(pattern, re.DOTALL)
        try:
            ours, ours_dotall = compile_regex(pattern), compile_regex(pattern, dotall=True)
        except PatternError as exc:
            # The only refusals a pattern of the subset may meet: a program over MAX_PROGRAM,
            # and a class `re` warns may become a set operation ("[[", "a--").
            assert "too large" in str(exc) or "set operation" in str(exc), (pattern, str(exc))
            too_large += 1
            continue
        for _ in range(6):
            value = random_subject(rng, sample)
            want = plain.fullmatch(value) is not None
            assert ours.fullmatch(value) == want, (pattern, value)
            assert ours_dotall.fullmatch(value) == (dotall.fullmatch(value) is not None), (
                pattern, value,
            )  # fmt: skip
            compared += 1
            matched += want
    # Not vacuous: many comparisons, and both answers common.
    assert compared > 5000 and compared // 4 < matched < compared * 3 // 4 and too_large < 150


@pytest.mark.parametrize(
    ("pattern", "yes", "no"),
    [
        (r"\x41\u00e9\U0001F600\N{EM DASH}", "Aé\U0001f600\u2014", "A"),
        (r"\0\012\101\141", "\0\nAa", "\0\n"),
        (r"[\]\-\\^]+", "]-\\^", "a"),
        (r"[]a]", "]", "b"),  # `]` first is itself
        (r"[^]a]", "b", "]"),
        (r"[a-]", "-", "b"),  # `-` last is itself
        (r"[\b]", "\b", "b"),  # in [...] `\b` is a backspace
        (r"[\d-]", "-", "a"),
        (r"\d\s\w", "\u0661\u2003_", "a b"),  # Unicode classes, as `re` reads a str pattern
        (r"a{}b", "a{}b", "ab"),  # no bounds: `{` is itself
        (r"a{,x}", "a{,x}", "a"),
        (r"a{,}", "aaa", "b"),  # `{,}` is `*`
        (r"a{,2}", "aa", "aaa"),
        (r"(?u)a", "a", "b"),  # Unicode: what a str pattern is anyway
        (r"a(?#x\)y)b", "ab", "a"),  # a comment ends at the first `)` not escaped
        (r"(?P<n>ab)+", "abab", "aba"),
        (r"x*?y+?z??", "xxyz", "z"),
    ],
)
def test_escapes_classes_and_oddities_as_re_reads_them(pattern: str, yes: str, no: str) -> None:
    assert re.fullmatch(pattern, yes) and not re.fullmatch(pattern, no)  # the oracle agrees
    prog = compile_regex(pattern)
    assert prog.fullmatch(yes) and not prog.fullmatch(no)


@pytest.mark.parametrize(
    ("pattern", "why"),
    [
        ("(?<=a)b", "look-arounds"),
        ("(?!a)b", "look-arounds"),
        ("(?P<n>a)(?P=n)", "back-references"),
        ("(a)(?(1)b|c)", "conditional groups"),
        ("(?>a)", "atomic groups"),
        ("a*+", "possessive repeats"),
        ("a{1,2}+", "possessive repeats"),
        ("(?u:a)", "inline flags"),
        ("(?-i:a)", "inline flags"),
        ("(?x)a b", "inline flags"),  # verbose mode would change how the pattern reads
        (r"\A", "anchors"),
        (r"a\Z", "anchors"),
        (r"\Ba", "anchors"),
        (r"(?=a){0}a", "look-arounds"),  # repeated no times is still not run
        (r"\q", "not a valid regular expression"),  # `re` refuses an unknown letter escape
    ],
)
def test_what_re_takes_but_the_machine_does_not_is_refused(pattern: str, why: str) -> None:
    with pytest.raises(PatternError, match=re.escape(why)):
        compile_regex(pattern)


def test_alternatives_fold_as_re_reads_them() -> None:
    # `re` folds a common first item and one-character alternatives into one class, and
    # MAX_PROGRAM counts the folded program: 100 copies of `(a|b)` stay within bounds.
    assert len(compile_regex("ab|ac").code) == 3  # a, [bc], match
    assert len(compile_regex("(?:x)y|xz").code) == 3
    assert len(compile_regex("(a|b){100}").code) == 101
    assert compile_regex("(a|b){100}").fullmatch("ab" * 50)
    assert len(compile_regex("(x)y|xz").code) == 7  # a capturing group is not opened,
    assert len(compile_regex("(x)y|(x)z").code) == 7  # nor is it a common first item


@pytest.mark.parametrize("pattern", ["[+--x]", "[a||b]", "[a&&]", "[a~~b]", "[[a]", "[x-y--]"])
def test_a_class_python_warns_may_become_a_set_operation_is_refused(pattern: str) -> None:
    # `re` reads these as literals today and warns (a FutureWarning that `sandbox validate`
    # printed raw): refused, with a hint, so a rule means one thing on every Python.
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pytest.raises(PatternError, match="set operation"):
            compile_regex(pattern)


@pytest.mark.parametrize("pattern", [r"[&&a]", r"[^[a]", r"[a&b]", r"[-a]", r"[a-]", r"[a\-\-b]"])
def test_a_class_re_reads_plainly_is_still_taken(pattern: str) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        compile_regex(pattern)
