"""sha256 for the fast run path, without importing hashlib when nothing else has.

Importing hashlib loads OpenSSL (~5 ms here), which `linpodx.fastpath.run` would pay before podman
starts. CPython also has its own C implementation of sha256 (the module hashlib falls back to);
its digests are the same bytes; it is 8 times slower at 1 MiB and twice as slow on the few
hundred bytes of an audit record. So: hashlib's sha256 once any module has imported hashlib
(every command but a fast `run` has: the audit chain, the profile store), the built-in one
otherwise, hashlib itself where this Python was built without the built-in one.
"""

from __future__ import annotations

import sys

TYPE_CHECKING = False  # the fast path's budget: linpodx/fastpath/__init__.py
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any

_builtin: Callable[..., Any] | None
try:
    from _sha2 import sha256 as _builtin  # type: ignore[import-not-found, no-redef, unused-ignore]
except ImportError:
    try:
        from _sha256 import sha256 as _builtin  # type: ignore[import-not-found, no-redef, unused-ignore]
    except ImportError:
        _builtin = None


def sha256(data: bytes = b"") -> Any:
    """A new sha256 object (`update`, `hexdigest`), fed `data`."""
    return sha256_maker()(data)


def sha256_maker() -> Callable[..., Any]:
    """The constructor `sha256` calls now: for a loop that hashes many short inputs (the audit
    verifier, a record at a time), which would otherwise pay this choice per call."""
    lib = sys.modules.get("hashlib")
    if lib is not None:
        return lib.sha256  # type: ignore[no-any-return]
    if _builtin is not None:
        return _builtin
    import hashlib

    return hashlib.sha256
