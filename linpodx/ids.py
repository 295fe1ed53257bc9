"""ULIDs: 48-bit millisecond time + 80 random bits, Crockford base32, 26 characters.

Sortable by creation time, which makes `ls` of our state dirs read in order.
"""

from __future__ import annotations

import os
import re
import time

_ALPHABET = "0123456789ABCDEFGHJKMNPQRSTVWXYZ"
ULID_RE = re.compile(r"^[0-9A-HJKMNP-TV-Z]{26}\Z")


def new_ulid(now_ms: int | None = None) -> str:
    """A new ULID string."""
    ms = int(time.time() * 1000) if now_ms is None else now_ms
    # os.urandom is what `secrets` draws from; importing secrets (random, base64, …) costs the
    # fast run path a few milliseconds.
    value = (ms & ((1 << 48) - 1)) << 80 | int.from_bytes(os.urandom(10), "big")
    out = []
    for _ in range(26):
        out.append(_ALPHABET[value & 31])
        value >>= 5
    return "".join(reversed(out))


def new_id(prefix: str) -> str:
    """`prefix_ULID`, e.g. `prof_01J…`, `sess_01J…`."""
    return f"{prefix}_{new_ulid()}"


def is_id(value: str, prefix: str) -> bool:
    """True if `value` is `prefix_` followed by a well-formed ULID."""
    head, sep, tail = value.partition("_")
    return sep == "_" and head == prefix and bool(ULID_RE.match(tail))
