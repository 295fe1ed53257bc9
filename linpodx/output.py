"""Rendering results: `key: value` lines for people, one JSON envelope with `--json`.

Core code returns plain data (a mapping); only this module decides how it looks. Anything that
came from a container or an agent goes through `safe_text` first so it can never drive the
terminal (escape sequences, control characters) or rich markup.
"""

from __future__ import annotations

import codecs
import contextlib
import json
import re
import sys
from collections.abc import Iterable, Mapping

from linpodx.errors import LinpodxError

TYPE_CHECKING = False  # the fast path's budget: linpodx/fastpath/__init__.py
if TYPE_CHECKING:
    from typing import Any, TextIO

ENVELOPE_SCHEMA = "linpodx/v1"
KEY_WIDTH = 8  # `status:  ok`, `mcp:     3 rules`: values line up after 9 columns


_INVISIBLE = (
    "\u2028\u2029"  # line and paragraph separators
    "\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069"  # bidirectional controls
    "\u00ad\u0600-\u0605\u06dd\u070f\u0890\u0891\u08e2\u180e\u200b\u2060-\u2064"
    "\u206a-\u206f\ufeff\ufff9-\ufffb"  # other format characters
)
"""Line and paragraph separators (a line break to some readers), Unicode's bidirectional
controls (the "Trojan Source" set): a terminal that implements right-to-left text reorders
what follows them, so an approver could be shown one tool name while the bytes say another;
and every other invisible format character (Unicode's Cf: zero-width space, word joiner, BOM,
soft hyphen, invisible operators). `_ASTRAL_INVISIBLE` are those above U+FFFF."""
_ASTRAL_INVISIBLE = (
    (0x110BD, 0x110BD), (0x110CD, 0x110CD), (0x13430, 0x1343F), (0x1BCA0, 0x1BCA3),
    (0x1D173, 0x1D17A),  # format characters
    (0xE0001, 0xE0001), (0xE0020, 0xE007F),  # tags: ASCII that no terminal shows
    (0xE0100, 0xE01EF),  # variation selectors 17-256, a byte each after any character
)  # fmt: skip
"""The tag characters spell ASCII unseen and a run of variation selectors after one
character carries a byte each: `"Hello"` followed by them showed as `Hello` at an approval
prompt while the approved call carried a secret past the person who approved it."""
_JOINERS = "\u200c\u200d\ufe00-\ufe0f"
"""The zero-width (non-)joiners and the first variation selectors, which emoji and some
scripts need one at a time: escaped where two or more follow each other (a run of them
carries hidden bits, and nothing needs one)."""
_JOINER_SET = frozenset("\u200c\u200d" + "".join(chr(o) for o in range(0xFE00, 0xFE10)))

_ESCAPE_LOW = "\x00-\x1f\x7f-\x9f"
# One class of what may need escaping, the astral ones as two spans around them (a class of
# their eight ranges scans 2-3 times slower, and emoji lie outside both); `_escape_one` decides.
_ASTRAL_SPANS = "\U000110bd-\U0001d17a\U000e0001-\U000e01ef"
_ESCAPE_RE = re.compile(f"[{_ESCAPE_LOW}{_INVISIBLE}{_JOINERS}{_ASTRAL_SPANS}]")
_ESCAPE_ASCII_RE = re.compile("[\x00-\x1f\x7f]")


def _escapes(value: str) -> re.Pattern[str]:
    """What may need escaping in `value`: in an ASCII string (CPython knows it is one at no
    cost) only its control characters, with a pattern several times faster to scan."""
    return _ESCAPE_ASCII_RE if value.isascii() else _ESCAPE_RE


def hides_text(value: Any) -> bool:
    """Does any string in `value` (a JSON-like document) hold a character `safe_text` escapes,
    other than tab and newline? Such a document is printed with every non-ASCII character
    escaped (YAML and JSON both have `\\uXXXX`), so that it still reads back the same."""
    if isinstance(value, str):
        return any(
            m.group() not in "\t\n" and _escape_one(m) != m.group()
            for m in _escapes(value).finditer(value)
        )
    if isinstance(value, dict):
        return any(hides_text(k) or hides_text(v) for k, v in value.items())
    if isinstance(value, list):
        return any(hides_text(v) for v in value)
    return False


def _escape_char(o: int) -> str:
    if o < 0x100:
        return f"\\x{o:02x}"
    return f"\\u{o:04x}" if o <= 0xFFFF else f"\\U{o:08x}"


def _escape_one(m: re.Match[str]) -> str:
    """The escape of the one character `m` matched, or the character itself where it shows
    as what it is (an astral character not in `_ASTRAL_INVISIBLE`, a joiner alone)."""
    ch = m.group()
    o = ord(ch)
    if o > 0xFFFF:
        if not any(lo <= o <= hi for lo, hi in _ASTRAL_INVISIBLE):
            return ch
    elif ch in _JOINER_SET:
        text, i = m.string, m.start()
        if not ((i > 0 and text[i - 1] in _JOINER_SET) or text[i + 1 : i + 2] in _JOINER_SET):
            return ch
    return _escape_char(o)


def _escaped_len(value: str, pos: int = 0) -> int:
    """len(escaped value[pos:]) without building it."""
    n = len(value) - pos
    for m in _escapes(value).finditer(value, pos):  # the common case: one scan, no match
        n += len(_escape_one(m)) - len(m.group())
    return n


def safe_text(value: str, limit: int | None = None) -> str:
    """Escape control characters (C0, DEL, C1, line/paragraph separators, bidirectional
    controls) and invisible ones (`_INVISIBLE`, runs of `_JOINERS`), and cap the length (of
    the escaped text, never cutting an escape in two).

    Only the part that is shown is escaped: a megabyte-long value costs a scan, not a copy
    per character."""
    if limit is None:
        return _escapes(value).sub(_escape_one, value)
    out: list[str] = []
    n = 0  # characters of output so far
    i = 0  # characters of `value` consumed
    full = True
    for m in _escapes(value).finditer(value, 0, limit):
        plain = value[i : m.start()]
        if n + len(plain) > limit:
            break
        out.append(plain)
        n += len(plain)
        i = m.start()
        esc = _escape_one(m)
        if n + len(esc) > limit:
            full = False
            break
        out.append(esc)
        n += len(esc)
        i = m.end()
    if full:
        take = min(limit - n, len(value) - i)
        out.append(value[i : i + take])
        n += take
        i += take
    text = "".join(out)
    if i >= len(value):
        return text
    return text + f"…(+{_escaped_len(value, i)} chars)"


class StreamEscaper:
    """`safe_text` for a byte stream that arrives in pieces (`linpodx logs`): each piece is
    decoded and escaped as it comes, newlines kept (a CR before one dropped, as a line's end),
    so no line is ever held whole. What a piece ends in the middle of (a UTF-8 sequence, a CR
    that may be a CRLF's) waits for the next piece; `end()` gives what is left."""

    def __init__(self) -> None:
        self._decoder = codecs.getincrementaldecoder("utf-8")("replace")
        self._cr = False

    def _escape(self, text: str) -> str:
        if self._cr:
            text = "\r" + text
        self._cr = text.endswith("\r")
        if self._cr:
            text = text[:-1]
        return "\n".join(safe_text(part) for part in text.replace("\r\n", "\n").split("\n"))

    def feed(self, raw: bytes) -> str:
        """The escaped text of `raw`, as far as it can be told yet."""
        return self._escape(self._decoder.decode(raw))

    def end(self) -> str:
        """What was held back, and a newline if the stream did not end with one."""
        text = self._escape(self._decoder.decode(b"", final=True))
        if self._cr:
            text += safe_text("\r")
            self._cr = False
        return text


def kv_line(key: str, value: Any) -> str:
    """One `key: value` line, value aligned like the walk-through's output."""
    if isinstance(value, bool):
        value = "true" if value else "false"
    elif value is None:
        value = "-"
    return f"{key + ':':<{KEY_WIDTH}} {value}"


def print_kv(items: Mapping[str, Any], stream: TextIO | None = None) -> None:
    """Print a flat mapping as `key: value` lines (nested values as compact JSON)."""
    stream = stream or sys.stdout
    for k, v in items.items():
        if isinstance(v, (dict, list)):
            v = json.dumps(v, ensure_ascii=False, separators=(",", ":"))
        stream.write(kv_line(k, v) + "\n")
    stream.flush()


def print_status(items: Mapping[str, Any]) -> None:
    """Status lines for people (`key: value`) on stderr: stdout is the command's data (a
    foreground `run`'s is the container's own output). On a terminal they read the same."""
    print_kv(items, sys.stderr)


def print_lines(lines: Iterable[str], stream: TextIO | None = None) -> None:
    """One value per line on stdout (`run -d`'s id, `ps -q`'s names), escaped like a table."""
    stream = stream or sys.stdout
    stream.write("".join(safe_text(line) + "\n" for line in lines))
    stream.flush()


def envelope(command: str, result: Any = None, error: LinpodxError | None = None) -> dict[str, Any]:
    """The one JSON document `--json` prints, on success and on failure alike."""
    doc: dict[str, Any] = {"schema": ENVELOPE_SCHEMA, "command": command, "ok": error is None}
    if error is None:
        doc["result"] = result
    else:
        doc["error"] = error.to_dict()
    return doc


_envelopes_printed = 0


def print_json(doc: Any, stream: TextIO | None = None, *, compact: bool = False) -> None:
    """Print one JSON document (pretty, UTF-8; `compact`: on one line). Characters that would
    drive, hide or reorder text on a terminal are written as `\\uXXXX` (`_json_safe`)."""
    global _envelopes_printed
    stream = stream or sys.stdout
    if compact:
        stream.write(_json_safe(json.dumps(doc, ensure_ascii=False, sort_keys=False)) + "\n")
    else:
        # Written as it is encoded (the same text json.dumps gives): a document with a long
        # list (`audit show --json`) is never held whole as one string.
        encoder = json.JSONEncoder(ensure_ascii=False, indent=2, sort_keys=False)
        for chunk in encoder.iterencode(doc):
            stream.write(_json_safe(chunk))
        stream.write("\n")
    stream.flush()
    if isinstance(doc, dict) and doc.get("schema") == ENVELOPE_SCHEMA:
        _envelopes_printed += 1


_JSON_UNSAFE_RE = re.compile(f"[\x7f-\x9f{_INVISIBLE}{_JOINERS}{_ASTRAL_SPANS}]")


def _json_escape(m: re.Match[str]) -> str:
    if _escape_one(m) == m.group():
        return m.group()
    o = ord(m.group())
    if o > 0xFFFF:  # JSON writes it as its UTF-16 surrogate pair
        o -= 0x10000
        return f"\\u{0xD800 + (o >> 10):04x}\\u{0xDC00 + (o & 0x3FF):04x}"
    return f"\\u{o:04x}"


def _json_safe(text: str) -> str:
    """JSON text with DEL, C1 controls, line/paragraph separators and bidirectional controls
    written as `\\uXXXX` (json escapes C0 itself): the same document to a parser, and one
    that cannot drive the terminal of whoever looks at it (`… --json | less`). Outside
    strings JSON is ASCII, so only string contents change."""
    if text.isascii():
        return text.replace("\x7f", "\\u007f") if "\x7f" in text else text
    if _JSON_UNSAFE_RE.search(text) is None:
        return text
    return _JSON_UNSAFE_RE.sub(_json_escape, text)


def envelopes_printed() -> int:
    """How many `--json` envelopes this process printed (the CLI's last resort prints one for
    a failure that reached it, unless the command already did)."""
    return _envelopes_printed


def print_error(err: LinpodxError, stream: TextIO | None = None) -> None:
    """`error: …` / `hint: …` on stderr.

    Messages quote what people and programs gave us (a file name from argv, podman's stderr,
    a container's name): every control character but the newlines that separate their lines
    and tabs is shown escaped, so none of it can drive the terminal.
    """
    stream = stream or sys.stderr
    stream.write(safe_lines(err.diagnostics()) + "\n")
    stream.flush()


def safe_lines(text: str) -> str:
    """`safe_text` for a diagnostic of several lines: the newlines that separate them and tabs
    stay, every other control character is escaped."""
    return "\n".join(
        "\t".join(safe_text(part) for part in line.split("\t")) for line in text.split("\n")
    )


UNENCODABLE = "linpodx-escape"
"""The error handler `printable_streams` gives stdout and stderr (registered on import)."""


def _escape_unencodable(exc: UnicodeError) -> tuple[str, int]:
    """Write what the stream's encoding cannot hold as `\\uXXXX` (astral characters as a
    UTF-16 surrogate pair): the text still reaches the person, and inside a JSON string
    (which `print_json` writes with ensure_ascii=False) it is the very escape JSON defines,
    so a `--json` document stays valid and reads back the same. Python's backslashreplace
    would write `\\U0001f600`, which JSON does not know."""
    if not isinstance(exc, UnicodeEncodeError):
        raise exc
    out: list[str] = []
    for ch in exc.object[exc.start : exc.end]:
        o = ord(ch)
        if o > 0xFFFF:
            o -= 0x10000
            out.append(f"\\u{0xD800 + (o >> 10):04x}\\u{0xDC00 + (o & 0x3FF):04x}")
        else:
            out.append(f"\\u{o:04x}")
    return "".join(out), exc.end


codecs.register_error(UNENCODABLE, _escape_unencodable)


def printable_streams() -> None:
    """Make stdout and stderr write every character, whatever their encoding.

    Under `LC_ALL=C`, `PYTHONIOENCODING=ascii` or a latin-1 locale, the first `…` or `→` a
    command printed ended it with UnicodeEncodeError after part of its output. Called once,
    by the CLI's entry. A UTF-8 stream with `surrogateescape` (Python's UTF-8 mode) is left
    as it is; binary output (`mcp attach` writes the protocol to fd 1 itself) is untouched."""
    for stream in (sys.stdout, sys.stderr):
        reconfigure = getattr(stream, "reconfigure", None)
        if reconfigure is None:
            continue  # not a TextIOWrapper (a test's StringIO, a closed or replaced stream)
        encoding = codecs.lookup(getattr(stream, "encoding", None) or "ascii").name
        if encoding == "utf-8" and getattr(stream, "errors", None) == "surrogateescape":
            continue
        with contextlib.suppress(ValueError, OSError):  # a closed stream: nothing to write
            reconfigure(errors=UNENCODABLE)


def note(message: str) -> None:
    """A diagnostic line for people, on stderr (never stdout)."""
    sys.stderr.write(message + "\n")
    sys.stderr.flush()
