"""Pending approvals and their answers, as files under `paths.approvals_dir()`.

Layout, one directory per approval `apr_<ULID>/`:
- `request.json`: written atomically by the bridge (session, method, tool, payload and fields
  for display, digest, created, expires).
- `request.raw`: the exact bytes the digest is the sha256 of (the whole request, `_meta`
  included): what `linpodx approvals show ID` prints once it has checked them against the
  digest. What is forwarded after an approval is that request.
- `answer.json`: created with `fsutil.create_exclusive`, so the first answer wins. It names the
  approval id AND the digest it approves; the bridge accepts it only when both match the request,
  so an answer cannot be moved to another call. A timeout or the end of the session is itself an
  answer (`deny`) written the same way, which makes "already decided" a single question: does
  `answer.json` exist? One that exists but is damaged is therefore a deny, at once.
- `consumed`: created exclusively by the bridge when it acts on the answer (used once).

An approving answer has a `scope`: `call` (this call only) or `session` (this call, and the
bridge makes a session grant for later calls like it: `linpodx.mcp.grants`). An answer without
one is `call` (older writers); an answer with any other scope is damaged, so a deny: a reader
never guesses what an approval it does not understand meant. An older bridge ignores the key and
approves the one call, which is less than was asked, never more. `request.json` says whether
the bridge would make a grant for it (`grantable`); the listener offers `s` only then.

Anyone running as the same user can write these files; that user can also drive the agent, so
the files are not a security boundary against them. They guard against the *agent* (which cannot
reach the host's state dir) and against mistakes: stale answers, replays, double use.
"""

from __future__ import annotations

import contextlib
import errno
import getpass
import hashlib
import json
import math
import os
import re
import socket
import stat
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from linpodx import canonical, fsutil, ids
from linpodx.approvals import seen
from linpodx.audit.core import encode_data
from linpodx.errors import InvalidInput, NotFound
from linpodx.output import safe_text
from linpodx.paths import approvals_dir, ensure_dir

PAYLOAD_CAP = 4096
"""Characters of the canonical payload (and of the method and tool name) kept for display."""

REQUEST_LIMIT = 256 * 1024
"""Bytes of `request.json` read back. What `create` writes stays far below: its three texts from
the client are capped at PAYLOAD_CAP characters, and JSON spends at most 6 bytes on one."""

ANSWER_LIMIT = 64 * 1024
"""Bytes of `answer.json` read back; `answer` writes a few hundred."""

_ENTRY_ERRNOS = frozenset(
    {errno.ENOTDIR, errno.ELOOP, errno.EISDIR, errno.EACCES, errno.EPERM, errno.ENXIO, errno.ENODEV}
)
"""Errors that say one approval's entry is damaged (a file where its directory belongs, a link,
a socket, no permission), not that the state dir as a whole is unusable."""

POLL_SECONDS = 0.05

APPROVE = "approve"
DENY = "deny"

SCOPE_CALL = "call"
SCOPE_SESSION = "session"
SCOPES = (SCOPE_CALL, SCOPE_SESSION)


def _now() -> float:
    return time.time()


def _iso(t: float) -> str:
    return datetime.fromtimestamp(t, UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def request_bytes(request: Any) -> bytes:
    """The canonical JSON of the exact request (id, method, params): what the digest covers."""
    try:
        # Same bytes as canonical_bytes, through the audit chain's C-accelerated encoder.
        data, _ = encode_data(request)
    except (canonical.CanonicalError, RecursionError):
        # Floats have no canonical form here; sorted compact JSON is still deterministic.
        data = json.dumps(
            request, sort_keys=True, ensure_ascii=False, separators=(",", ":")
        ).encode()
    return data


def request_digest(request: Any) -> str:
    """sha256 (hex) of `request_bytes(request)`."""
    return hashlib.sha256(request_bytes(request)).hexdigest()


def _capped(text: str, cap: int = PAYLOAD_CAP) -> str:
    return text[:cap] + f"…(+{len(text) - cap} chars)" if len(text) > cap else text


def display_payload(value: Any, cap: int = PAYLOAD_CAP) -> str:
    """Compact JSON of `value`, capped at `cap` characters (escaping is the renderer's job)."""
    try:
        text = canonical.canonical_str(value)
    except canonical.CanonicalError:
        text = json.dumps(value, sort_keys=True, ensure_ascii=False, separators=(",", ":"))
    return _capped(text, cap)


FIELDS_MAX = 128
"""Keys of a request shown one by one by a listener; `approvals show` prints the rest."""
KEY_CAP = 80
"""Characters of one key's name shown."""
VALUE_CAP = 60
"""Characters of one value's JSON shown; its size is said when it is cut."""


@dataclass(frozen=True)
class Field:
    """One key of a request as a listener shows it."""

    key: str
    """Its path: `arguments.path`, `_meta.progressToken`, `name`."""
    value: str
    """Its JSON, cut at VALUE_CAP characters as a terminal shows them (escaped once cut)."""
    size: int | None
    """Its whole size in characters (a string's length, else its JSON's) when it was cut."""

    def to_list(self) -> list[Any]:
        return [self.key, self.value, self.size]


def _cut(text: str, width: int) -> str | None:
    """`text` escaped as a terminal shows it (`safe_text`) and cut at `width` characters,
    never inside an escape; None when all of it fits (width + 1 characters never do)."""
    out: list[str] = []
    n = 0
    for ch in text[: width + 1]:
        shown = safe_text(ch)
        if n + len(shown) > width:
            return "".join(out)
        out.append(shown)
        n += len(shown)
    return None


def _shown_key(key: str) -> str:
    """A key's path as shown, cut at KEY_CAP characters *as escaped for the terminal* (a key
    of ESC characters shows four times longer): a cut key also says its length and a digest of
    the whole path, so two keys that share their first KEY_CAP characters never read alike."""
    cut = _cut(key, KEY_CAP)
    if cut is None:
        return key
    tag = hashlib.sha256(key.encode("utf-8", "surrogatepass")).hexdigest()[:8]
    return cut + f"…({len(key)} chars, #{tag})"


def _field(key: str, value: Any) -> Field:
    text = canonical_or_json(value)
    size = len(value) if isinstance(value, str) else len(text)
    key = _shown_key(key)
    # Cut as the terminal shows it: `"\u202e…/etc/shadow"` fits VALUE_CAP raw, but its escapes
    # took the renderer's whole width and the path was never shown, with no size said.
    cut = _cut(text, VALUE_CAP)
    if cut is not None:
        return Field(key, cut + "…", size)
    return Field(key, text, None)


_PLAIN_KEY = re.compile(r"[A-Za-z_][A-Za-z0-9_-]*\Z")


def _path(prefix: str, key: str) -> str:
    """`prefix.key`, or `prefix["key"]` for a key that is not a plain name: a key holding a dot
    (`{"arguments.path": …}` next to `arguments`) must not read as a nested one."""
    if _PLAIN_KEY.match(key):
        return f"{prefix}.{key}" if prefix else key
    return f"{prefix}[{json.dumps(key, ensure_ascii=False)}]"


def _leaves(
    prefix: str, value: Any, order: Callable[[str], Any], room: int
) -> tuple[list[Field], int]:
    """Up to `room` fields, one per scalar (and per empty object or array) under `value` with
    its path, depth first and in order, and how many more there are: a nested object shown as
    one JSON value cut at VALUE_CAP let padding in one of its keys hide another
    (`arguments.opts: {"a": "harmless …", "target": "/home/…"}`). Paths are built only for
    what is shown: a request may hold millions of keys."""
    out: list[Field] = []
    stack: list[tuple[str, Any, str | int | None]] = [(prefix, value, None)]
    # (each entry: the parent's path, the value, its key or index under it; None for the root)
    while stack:
        if len(out) >= room:
            return out, sum(_count_leaves(v) for _, v, _ in stack)
        parent, v, step = stack.pop()
        if step is None:
            path = parent
        elif isinstance(step, int):
            path = f"{parent}[{step}]"
        else:
            path = _path(parent, step)
        if isinstance(v, dict) and v:
            keys = sorted(v, key=order if step is None else _by_name)
            stack.extend((path, v[k], k) for k in reversed(keys))
        elif isinstance(v, list) and v:
            stack.extend((path, v[i], i) for i in range(len(v) - 1, -1, -1))
        else:
            out.append(_field(path, v))
    return out, 0


def _count_leaves(value: Any) -> int:
    """How many `_leaves` `value` has (without building their paths)."""
    n, stack = 0, [value]
    while stack:
        v = stack.pop()
        if isinstance(v, dict) and v:
            stack.extend(v.values())
        elif isinstance(v, list) and v:
            stack.extend(v)
        else:
            n += 1
    return n


def _by_name(key: str) -> Any:
    return key


def canonical_or_json(value: Any) -> str:
    """Canonical JSON of `value`, or sorted compact JSON where it has no canonical form."""
    try:
        return canonical.canonical_str(value)
    except canonical.CanonicalError:
        return json.dumps(value, sort_keys=True, ensure_ascii=False, separators=(",", ":"))


def display_fields(params: Any, first: tuple[str, ...] = ()) -> tuple[list[Field], int]:
    """Every scalar of a request's params with its path (`arguments.opts.target`,
    `arguments.files[1]`), each value cut on its own, and how many are left out past
    FIELDS_MAX. Cutting the whole payload (or one nested value) at one length let a call pad
    one argument so that another one (`path`) was never shown. Order: `name`, then the tool's
    arguments (those named in `first`, the ones a rule matched on, before the rest), then every
    other key, `_meta` included: the approval binds all of it."""
    if not isinstance(params, dict):
        parts: list[tuple[str, Any, Callable[[str], Any]]] = (
            [] if params is None else [("params", params, _by_name)]
        )
    else:
        parts = [(k, params[k], _by_name) for k in ("name",) if k in params]
        if "arguments" in params:
            parts.append(("arguments", params["arguments"], lambda k: (k not in first, k)))
        if "_meta" in params:
            parts.append(("_meta", params["_meta"], _by_name))
        rest = sorted(k for k in params if k not in ("name", "arguments", "_meta"))
        parts.extend((_path("", k), params[k], _by_name) for k in rest)
    out: list[Field] = []
    more = 0
    for prefix, value, order in parts:
        shown, left = _leaves(prefix, value, order, FIELDS_MAX - len(out))
        out.extend(shown)
        more += left
    return out, more


def who() -> dict[str, Any]:
    """Who is answering, from where: uid, user, pid, tty, hostname, and whether from a
    terminal on stdin (`interactive`)."""
    tty = None
    for fd in (0, 1, 2):
        with contextlib.suppress(OSError):
            tty = os.ttyname(fd)
            break
    try:
        user = getpass.getuser()
    except (KeyError, OSError):
        user = None
    return {
        "uid": os.getuid(),
        "user": user,
        "pid": os.getpid(),
        "tty": tty,
        "hostname": socket.gethostname(),
        "interactive": os.isatty(0),
    }


@dataclass(frozen=True)
class PendingRequest:
    """What `request.json` holds."""

    approval_id: str
    session: str
    method: str
    tool: str | None
    payload: str
    """Canonical JSON of the request's params (`_meta` included), capped for display."""
    digest: str
    created: float
    expires: float
    fields: tuple[Field, ...] = ()
    """Each key of the params, cut on its own (`display_fields`)."""
    fields_more: int = 0
    """Keys not in `fields` (FIELDS_MAX): `linpodx approvals show` prints them."""
    grantable: bool = False
    """Whether an approval for the session would make a grant (`mcp.grants.refusal`): the
    rule itself says prompt and no rate limit was passed. Absent (older writers): False."""
    reason: str = ""
    """Why a person is asked: the gate's reason (the rule, or its rate exceeded)."""

    def to_dict(self) -> dict[str, Any]:
        return {
            "approval_id": self.approval_id,
            "session": self.session,
            "method": self.method,
            "tool": self.tool,
            "payload": self.payload,
            "digest": self.digest,
            "created": _iso(self.created),
            "created_unix": self.created,
            "expires": _iso(self.expires),
            "expires_unix": self.expires,
            "fields": [f.to_list() for f in self.fields],
            "fields_more": self.fields_more,
            "grantable": self.grantable,
            "reason": self.reason,
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> PendingRequest:
        try:
            return cls(
                approval_id=str(d["approval_id"]),
                session=str(d["session"]),
                method=str(d["method"]),
                tool=None if d.get("tool") is None else str(d["tool"]),
                payload=str(d["payload"]),
                digest=str(d["digest"]),
                created=_unix_time(d["created_unix"]),
                expires=_unix_time(d["expires_unix"]),
                fields=_fields(d.get("fields", [])),
                fields_more=_count(d.get("fields_more", 0)),
                grantable=d.get("grantable", False) is True,
                reason=str(d.get("reason", "")),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise InvalidInput(
                f"malformed approval request: {safe_text(str(exc))}", DAMAGED_HINT
            ) from None


def _fields(value: Any) -> tuple[Field, ...]:
    if not isinstance(value, list) or len(value) > FIELDS_MAX:
        raise ValueError("fields must be a list of at most FIELDS_MAX entries")
    out = []
    for item in value:
        if (
            not isinstance(item, list)
            or len(item) != 3
            or not isinstance(item[0], str)
            or not isinstance(item[1], str)
            or not (item[2] is None or type(item[2]) is int)
        ):
            raise ValueError("a field must be [key, value, size]")
        out.append(Field(item[0], item[1], item[2]))
    return tuple(out)


def _count(value: Any) -> int:
    if type(value) is not int or value < 0:
        raise ValueError("fields_more must be a count")
    return int(value)


def _unix_time(value: Any) -> float:
    """A JSON number of seconds, finite: `float()` would also take the strings "nan" and
    "inf", and a request that expires at NaN never looks expired."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"not a time in seconds: {type(value).__name__}")
    if not math.isfinite(value):
        raise ValueError("not a finite time")
    return float(value)


@dataclass(frozen=True)
class Answer:
    """What `answer.json` holds."""

    approval_id: str
    digest: str
    decision: str
    reason: str
    by: dict[str, Any]
    at: str
    unreadable: bool = False
    """The file is there but is no answer (damaged): a deny that `reason` explains."""
    scope: str = SCOPE_CALL
    """`call`, or `session` for an approval that also grants later calls like it."""

    @property
    def for_session(self) -> bool:
        """An approval for the session (a deny has no scope)."""
        return self.decision == APPROVE and self.scope == SCOPE_SESSION and not self.unreadable


def _unreadable_answer(approval_id: str, why: str) -> Answer:
    return Answer(approval_id, "", DENY, f"the answer file is unreadable ({why})", {}, "", True)


ELSEWHERE_HINT = (
    "a bridge started with another LINPODX_STATE_DIR, or as another user (root through sudo, "
    "or you when this runs as root), keeps its approvals in that state dir: answer there"
)

NOT_GRANTABLE_HINT = (
    "only a tools/call whose rule says `prompt` can be approved for the session (not one "
    "that prompts because a rate limit was passed); approve this call alone"
)

DAMAGED_HINT = (
    "its files under the state dir's approvals/ are damaged; nobody can approve it, so the "
    "call waiting for it is denied when its window ends"
)


ID_CAP = 80
"""Characters of an approval id quoted in a message (a real one has 30)."""


def shown_id(approval_id: str) -> str:
    """`approval_id` as messages quote it: escaped and capped. Ids come from the command line
    and from the event stream, which anyone who can write the state dir can fill; a message
    built from one is printed by several callers (`print_error`, the `events` prompter, a
    `--json` envelope), so it is made safe here, once, where it is built."""
    return safe_text(approval_id, ID_CAP)


def _dir(approval_id: str) -> Path:
    if not ids.is_id(approval_id, "apr"):
        raise NotFound(
            f"approval not found: {shown_id(approval_id)}", "approval ids look like apr_<ULID>"
        )
    return approvals_dir() / approval_id


def create(
    session: str,
    method: str,
    tool: str | None,
    request: Any,
    params: Any,
    timeout_seconds: float,
    first: tuple[str, ...] = (),
    reason: str = "",
    *,
    grantable: bool = False,
) -> PendingRequest:
    """Record a pending approval for `request` (atomic write) and return it; `first` are the
    arguments the rule matched on (shown first), `reason` why a person is asked."""
    created = _now()
    fields, more = display_fields(params, first)
    raw = request_bytes(request)
    pending = PendingRequest(
        approval_id=ids.new_id("apr"),
        session=session,
        # Display only, like the payload; capped so that `request.json` fits REQUEST_LIMIT.
        method=_capped(method),
        tool=None if tool is None else _capped(tool),
        # Everything the approval binds, `_meta` included: it is forwarded too, and a server
        # may act on it.
        payload=display_payload(params if params is not None else {}),
        digest=hashlib.sha256(raw).hexdigest(),
        created=created,
        expires=created + timeout_seconds,
        fields=tuple(fields),
        fields_more=more,
        grantable=grantable,
        reason=_capped(reason),
    )
    d = _dir(pending.approval_id)
    ensure_dir(d)
    # The whole request first: a listener that sees request.json can always show it.
    fsutil.atomic_write(d / "request.raw", raw)
    fsutil.atomic_write(
        d / "request.json", json.dumps(pending.to_dict(), ensure_ascii=False).encode()
    )
    # Under a LINPODX_STATE_DIR, a person listening with the default state dir is told.
    seen.remember(str(approvals_dir().parent))
    return pending


def _base_usable() -> bool:
    """Whether approvals/ itself is a directory we can enter: if it is not (or the state dir is
    a file), an error below it is the state dir's, not one approval's."""
    base = approvals_dir()
    try:
        return stat.S_ISDIR(os.stat(base).st_mode) and os.access(base, os.X_OK)
    except OSError:
        return False


class _Unreadable(Exception):
    """A store file is there but is not one linpodx wrote; the message says why."""


def _read_object(path: Path, limit: int) -> dict[str, Any] | None:
    """The JSON object in `path`, None if there is no file; _Unreadable if it is damaged.

    The bridge and every listener read these files: a FIFO must not hang them, a link is not a
    file linpodx wrote, and a huge or deeply nested document must cost neither memory nor a
    RecursionError (hence `fsutil.read_regular`, a size bound and the strict parser).
    """
    try:
        raw = fsutil.read_regular(path, limit)
    except fsutil.NotRegularFile:
        raise _Unreadable("not a regular file") from None
    except OSError as exc:
        if exc.errno not in _ENTRY_ERRNOS or not _base_usable():
            raise  # the state dir itself is unusable: the CLI's to report
        raise _Unreadable(exc.strerror or str(exc)) from None
    if raw is None:
        return None
    if len(raw) > limit:
        raise _Unreadable(f"larger than {limit} bytes")
    try:
        doc = canonical.strict_loads(raw, allow_floats=True)
    except canonical.CanonicalError as exc:
        raise _Unreadable(str(exc)) from None
    if not isinstance(doc, dict):
        raise _Unreadable("not a JSON object")
    return doc


def load(approval_id: str) -> PendingRequest:
    """Read a request; NotFound if there is none, InvalidInput if it is damaged."""
    try:
        data = _read_object(_dir(approval_id) / "request.json", REQUEST_LIMIT)
    except _Unreadable as exc:
        # This one request is damaged; the others (and the listeners that show them) are not.
        raise InvalidInput(
            f"approval request is unreadable: {shown_id(approval_id)} ({safe_text(str(exc))})",
            DAMAGED_HINT,
        ) from None
    if data is None:
        raise NotFound(
            f"approval not found: {shown_id(approval_id)} "
            f"(searched the state dir {safe_text(str(approvals_dir().parent), 300)})",
            "list pending ones with `linpodx events --filter approval --no-follow`; "
            + ELSEWHERE_HINT,
        )
    return PendingRequest.from_dict(data)


RAW_LIMIT = 256 * 1024 * 1024
"""Bytes of `request.raw` read back (a request is at most `mcp.max_line_bytes`, 64 MiB)."""


def load_request(approval_id: str) -> tuple[PendingRequest, Any]:
    """The request and the whole JSON request it binds, checked against its digest:
    InvalidInput when the bytes are missing, damaged or not the ones the digest covers."""
    pending = load(approval_id)
    shown = shown_id(approval_id)
    try:
        raw = fsutil.read_regular(_dir(approval_id) / "request.raw", RAW_LIMIT)
    except fsutil.NotRegularFile:
        raw = None
    except OSError as exc:
        if exc.errno not in _ENTRY_ERRNOS or not _base_usable():
            raise
        raw = None
    if raw is None or len(raw) > RAW_LIMIT:
        raise InvalidInput(
            f"approval {shown} has no readable copy of its request", DAMAGED_HINT
        )
    if hashlib.sha256(raw).hexdigest() != pending.digest:
        raise InvalidInput(
            f"approval {shown}: its request copy does not match the digest it binds",
            DAMAGED_HINT,
        )
    try:
        request = canonical.strict_loads(raw, allow_floats=True)
    except canonical.CanonicalError as exc:
        raise InvalidInput(
            f"approval {shown}: its request copy is not JSON ({safe_text(str(exc))})",
            DAMAGED_HINT,
        ) from None
    return pending, request


def read_answer(approval_id: str) -> Answer | None:
    """The answer, or None if nobody answered yet. A damaged answer reads as a deny.

    `answer.json` is created complete and only once, so a damaged one will never turn into a
    valid answer: the deny holds at once rather than at the end of the window.
    """
    try:
        d = _read_object(_dir(approval_id) / "answer.json", ANSWER_LIMIT)
    except _Unreadable as exc:
        return _unreadable_answer(approval_id, str(exc))
    if d is None:
        return None
    scope = d.get("scope", SCOPE_CALL)
    if scope not in SCOPES:
        # Written by something newer or damaged: what it approves cannot be told (fail closed).
        return _unreadable_answer(approval_id, "unknown scope")
    try:
        return Answer(
            approval_id=str(d["approval_id"]),
            digest=str(d["digest"]),
            decision=str(d["decision"]),
            reason=str(d.get("reason", "")),
            by=dict(d.get("by") or {}),
            at=str(d.get("at", "")),
            scope=str(scope),
        )
    except (ValueError, KeyError, TypeError):
        return _unreadable_answer(approval_id, "malformed")


def answer(
    approval_id: str,
    digest: str,
    decision: str,
    reason: str = "",
    by: dict[str, Any] | None = None,
    *,
    scope: str = SCOPE_CALL,
) -> bool:
    """Write the answer for `approval_id`, bound to `digest`. True if ours was the first.

    `scope=SCOPE_SESSION` approves for the session; only an approval of a `grantable`
    request may have it (InvalidInput otherwise, nothing written)."""
    if decision not in (APPROVE, DENY):
        raise InvalidInput(f"unknown decision: {decision}")
    if scope not in SCOPES or (scope == SCOPE_SESSION and decision != APPROVE):
        raise InvalidInput(f"unknown scope for {decision}: {safe_text(scope, 40)}")
    doc = {
        "approval_id": approval_id,
        "digest": digest,
        "decision": decision,
        "reason": reason,
        "by": by if by is not None else who(),
        "at": _iso(_now()),
    }
    if scope != SCOPE_CALL:
        doc["scope"] = scope
    d = _dir(approval_id)
    pending = load(approval_id)
    if scope == SCOPE_SESSION and not pending.grantable:
        raise InvalidInput(
            f"approval {shown_id(approval_id)} cannot be approved for the session",
            NOT_GRANTABLE_HINT,
        )
    if decision == APPROVE and _now() >= pending.expires:
        # The window is over: an approval now would act on a request the bridge gave up on.
        return False
    return fsutil.create_exclusive(d / "answer.json", json.dumps(doc, ensure_ascii=False).encode())


@dataclass(frozen=True)
class Outcome:
    """What the bridge does with a prompted request in the end."""

    approved: bool
    reason: str
    """`approved`, `denied by a person`, `timeout`, `session ended`, `digest mismatch`, …"""
    answer: Answer | None


def check_answer(pending: PendingRequest, ans: Answer) -> Outcome:
    """Accept `ans` only if it names this approval and this request's digest (pure)."""
    if ans.unreadable:
        return Outcome(False, ans.reason, ans)
    if ans.approval_id != pending.approval_id:
        return Outcome(False, "answer names another approval", ans)
    if ans.digest != pending.digest:
        return Outcome(False, "answer is bound to another request (digest mismatch)", ans)
    if ans.decision == APPROVE:
        return Outcome(True, "approved", ans)
    return Outcome(False, ans.reason or "denied", ans)


def consume(approval_id: str) -> bool:
    """Mark the answer used; False if it had been used already."""
    return fsutil.create_exclusive(_dir(approval_id) / "consumed", b"")


def wait(
    pending: PendingRequest,
    *,
    cancelled: Callable[[], str | None] = lambda: None,
    poll: float = POLL_SECONDS,
    sleep: Callable[[float], None] = time.sleep,
) -> Outcome:
    """Wait for an answer until `pending.expires`; no answer means deny (fail closed).

    `cancelled()` returns a reason when the wait must end early (the session is closing); the
    bridge then answers `deny` itself, which still loses to an answer that was already there.
    """
    while True:
        ans = read_answer(pending.approval_id)
        if ans is None:
            stop = cancelled()
            if stop is None and _now() >= pending.expires:
                stop = "timeout"
            if stop is not None:
                answer(
                    pending.approval_id,
                    pending.digest,
                    DENY,
                    stop,
                    by={"bridge": True, "pid": os.getpid()},
                )
                ans = read_answer(pending.approval_id)
        if ans is not None:
            outcome = check_answer(pending, ans)
            if outcome.approved and not consume(pending.approval_id):
                return Outcome(False, "answer already used", ans)
            return outcome
        sleep(poll)


def iter_requests() -> Iterator[PendingRequest]:
    """Every recorded request, oldest first (ULIDs sort by time)."""
    base = approvals_dir()
    if not base.is_dir():
        return
    for d in sorted(base.iterdir()):
        if not ids.is_id(d.name, "apr"):
            continue
        with contextlib.suppress(NotFound, InvalidInput):
            yield load(d.name)


def pending_requests() -> list[PendingRequest]:
    """Requests nobody answered yet and whose window is still open."""
    now = _now()
    return [p for p in iter_requests() if read_answer(p.approval_id) is None and p.expires > now]


def status(approval_id: str) -> str:
    """`pending`, `expired` (window over, no answer yet recorded), or the answer's decision."""
    pending = load(approval_id)
    ans = read_answer(approval_id)
    if ans is None:
        return "expired" if _now() >= pending.expires else "pending"
    if ans.decision == APPROVE and ans.digest == pending.digest:
        return "approved"
    return "denied"
