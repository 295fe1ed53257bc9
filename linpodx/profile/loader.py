"""YAML profile → validated, frozen `Profile`.

The pipeline is: bounded read (1 MiB, UTF-8) → ruamel.yaml *compose* (nodes with positions,
nothing constructed) → our own walk that refuses anchors, aliases, merge keys, custom tags and
duplicate keys and expands `${VAR}` → JSON Schema (draft 2020-12) → semantic checks (paths,
hostnames, capabilities, …) → frozen dataclasses. Every problem found on the way is collected
and reported as `FILE:LINE:COL: key.path: message`; the caller gets one `ProfileError` holding
all of them, or a `Profile`.

Why compose and not load: composing never expands aliases (an alias is the same node object
again), so a "billion laughs" file costs nothing before we refuse its first anchor.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import posixpath
import re
import stat
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from linpodx.canonical import CanonicalError, canonical_bytes
from linpodx.errors import ProfileError
from linpodx.output import safe_text
from linpodx.profile import HOME_DIR
from linpodx.profile.hostpaths import (
    FORBIDDEN_TEXT,
    PATH_FORBIDDEN,
    check_mount_source,
    has_dotdot,
    inside,
    show,
)
from linpodx.profile.model import (
    SCHEMA_VERSION,
    Audit,
    Decision,
    McpRule,
    McpSettings,
    Mount,
    Network,
    Profile,
    Resources,
)

# jsonschema and ruamel.yaml (and the small difflib, decimal, ipaddress) are imported where they
# are used: together they cost about 100 ms, which `linpodx run` (it only reads a stored, already
# validated profile) should not pay.
if TYPE_CHECKING:
    from jsonschema import Draft202012Validator  # type: ignore[import-untyped,unused-ignore]
    from jsonschema.exceptions import ValidationError  # type: ignore[import-untyped,unused-ignore]
    from ruamel.yaml.nodes import MappingNode, Node, ScalarNode

MAX_BYTES = 1024 * 1024
"""Largest profile file accepted (checked before parsing)."""

MAX_EVENTS = 10_000
"""Most YAML events (nodes, starts and ends) a profile may have; the schema's list bounds keep
a legitimate profile far below this."""

MAX_DEPTH = 32
"""Deepest nesting of YAML mappings and lists a profile may have. A legitimate profile nests
3 levels (`mcp_policy[0].method`); ruamel's composer recurses once per level and runs out of
Python stack at about 500, so deeper files are refused on the event stream, before composing."""

MAX_PROBLEMS = 200
"""Stop listing after this many problems (a hostile file could produce millions)."""

_YAML_CORE = "tag:yaml.org,2002:"
_ALLOWED_TAGS = {_YAML_CORE + t for t in ("str", "int", "float", "bool", "null", "map", "seq")}
# YAML 1.2 core schema spellings; the resolver only tags these, but an explicit `!!bool` or
# `!!null` tag puts any text under them.
_YAML_TRUE = ("true", "True", "TRUE")
_YAML_FALSE = ("false", "False", "FALSE")
_YAML_NULLS = ("", "~", "null", "Null", "NULL")

ALL_CAPS = frozenset(
    """CHOWN DAC_OVERRIDE DAC_READ_SEARCH FOWNER FSETID KILL SETGID SETUID SETPCAP
    LINUX_IMMUTABLE NET_BIND_SERVICE NET_BROADCAST NET_ADMIN NET_RAW IPC_LOCK IPC_OWNER
    SYS_MODULE SYS_RAWIO SYS_CHROOT SYS_PTRACE SYS_PACCT SYS_ADMIN SYS_BOOT SYS_NICE
    SYS_RESOURCE SYS_TIME SYS_TTY_CONFIG MKNOD LEASE AUDIT_WRITE AUDIT_CONTROL SETFCAP
    MAC_OVERRIDE MAC_ADMIN SYSLOG WAKE_ALARM BLOCK_SUSPEND AUDIT_READ PERFMON BPF
    CHECKPOINT_RESTORE""".split()
)
"""Every capability the Linux kernel knows (linux/capability.h)."""

DANGEROUS_CAPS = frozenset(
    """SYS_ADMIN NET_ADMIN NET_RAW SYS_MODULE SYS_RAWIO SYS_PTRACE SYS_BOOT DAC_READ_SEARCH
    MAC_ADMIN MAC_OVERRIDE BPF PERFMON SYSLOG SYS_TIME LINUX_IMMUTABLE AUDIT_CONTROL SETFCAP
    SYS_RESOURCE SYS_PACCT CHECKPOINT_RESTORE MKNOD FSETID""".split()
)
"""Capabilities that let a container escape, undo the egress firewall or hide its tracks, or
leave a privileged file on the host (MKNOD: a device node in a writable mount is the host's
device for any host user the node's mode lets in; SETFCAP: file capabilities; FSETID: a write
to a setuid file already in a writable mount keeps its bit, so the agent could turn a host
setuid-root program into its own code)."""

# Targets linpodx (or podman) manages itself, or that would hand the container the kernel.
# `/run` and `/run/linpodx` would hold the mount gate (linpodx.podman.mountpin): runc would
# make its mount point inside the person's directory. `$HOME` (`/home/agent`) is linpodx's: a
# tmpfs for `--rm` containers (a second mount there is a duplicate destination, every run
# fails), made by `podman cp` (which chowns) for the others; over `/home` the tmpfs's mount
# point, or the copied `$HOME`, would land in the person's directory. Paths inside `$HOME` are
# fine: they are mounted over it.
_TARGET_TREES = ("/proc", "/sys", "/dev", "/run/linpodx")
_TARGET_EXACT = (
    "/", "/etc/resolv.conf", "/etc/hosts", "/etc/hostname", "/run", "/run/.containerenv",
    posixpath.dirname(HOME_DIR), HOME_DIR,
)  # fmt: skip

_HOST_LABEL = re.compile(r"^[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?\Z")
_VAR = re.compile(r"\$(?:\{([A-Za-z_][A-Za-z0-9_]*)(?::-([^}]*))?\}|(\$))")



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


_VALIDATOR_RULES = b"\n# pattern: $ is \\Z\n"
"""How `_validator` departs from plain Draft 2020-12, as part of `schema_digest`: change it
when a rule changes, so that revisions stored under the old rule get the schema pass again
(a `tool_name` of `"delete_file\\n"` passed the old `pattern` check; see `_anchored`)."""


@functools.cache
def schema() -> dict[str, Any]:
    """The profile JSON Schema shipped as package data."""
    # Next to this module (package data). Not importlib.resources: importing it costs ~10 ms on
    # every `linpodx run`, and linpodx is never run from a zip archive.
    text = Path(__file__).with_name("schema.json").read_text("utf-8")
    doc: dict[str, Any] = json.loads(text)
    return doc


@functools.cache
def schema_digest() -> str:
    """sha256 of the schema file and of `_VALIDATOR_RULES`: names the schema (as this loader
    applies it) a stored revision was validated against."""
    data = Path(__file__).with_name("schema.json").read_bytes()
    return "sha256:" + hashlib.sha256(data + _VALIDATOR_RULES).hexdigest()


def _is_integer(_checker: object, instance: object) -> bool:
    return isinstance(instance, int) and not isinstance(instance, bool)


@functools.cache
def _anchored(pattern: str) -> re.Pattern[str]:
    """`pattern` with a final `$` meaning the end of the string (`\\Z`).

    JSON Schema's regexes are ECMA-262's, where `$` is the end of the string; Python's `$` also
    matches before a trailing newline, so `^[!-~]{1,256}$` let `"delete_file\\n"` through: a
    `deny` rule that never matched, a memory limit that crashed the loader, a name the store
    could not use.
    """
    if pattern.endswith("$") and not pattern.endswith("\\$"):
        pattern = pattern[:-1] + r"\Z"
    return re.compile(pattern)


def _pattern(
    validator: Any, pattern: str, instance: Any, _schema: Any
) -> Iterator[ValidationError]:
    """The `pattern` keyword, with `$` anchored at the very end (see `_anchored`)."""
    from jsonschema.exceptions import ValidationError

    if validator.is_type(instance, "string") and not _anchored(pattern).search(instance):
        yield ValidationError(f"{instance!r} does not match {pattern!r}")


@functools.cache
def _validator() -> Draft202012Validator:
    """The schema's validator, with `integer` meaning a YAML/JSON integer only and `$` in a
    `pattern` meaning the end of the string (`_anchored`).

    Draft 2020-12 counts `1.0` and `1e3` as integers; the store then refuses them (floats have
    no canonical form), so `validate` would say OK to a profile `apply` refuses. Written as
    digits or it is not an integer: one answer for every command.
    """
    from jsonschema import Draft202012Validator  # type: ignore[import-untyped,unused-ignore]
    from jsonschema.validators import extend  # type: ignore[import-untyped,unused-ignore]

    Draft202012Validator.check_schema(schema())
    checker = Draft202012Validator.TYPE_CHECKER.redefine("integer", _is_integer)
    strict = extend(Draft202012Validator, {"pattern": _pattern}, type_checker=checker)
    return strict(schema())


class _Collector:
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


# ---------------------------------------------------------------------------------------------
# Reading and composing


def read_profile_text(path: Path, display: str | None = None) -> str:
    """The file's text: a regular file of at most 1 MiB, valid UTF-8 (a BOM is dropped)."""
    name = display or str(path)
    col = _Collector(name)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        raise ProfileError(
            f"profile file not found: {name}", "check the path (relative paths are from here)"
        ) from None
    except OSError as exc:
        raise ProfileError(
            f"cannot read profile {name}: {exc.strerror}", "check the file's permissions"
        ) from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise ProfileError(
                f"profile {name} is not a regular file", "give the path of a YAML file"
            )
        chunks = []
        remaining = MAX_BYTES + 1
        while remaining > 0:
            chunk = os.read(fd, min(remaining, 65536))
            if not chunk:
                break
            chunks.append(chunk)
            remaining -= len(chunk)
    except OSError as exc:
        raise ProfileError(f"cannot read profile {name}: {exc.strerror}") from None
    finally:
        os.close(fd)
    data = b"".join(chunks)
    if len(data) > MAX_BYTES:
        raise ProfileError(
            f"{name}: file is larger than {MAX_BYTES} bytes (1 MiB); refused before parsing",
            "a sandbox profile is a few kilobytes; check that this is the right file",
        )
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        before = data[: exc.start]
        line = before.count(b"\n") + 1
        column = len(before) - (before.rfind(b"\n") + 1) + 1
        col.problems.append(
            Problem(f"invalid UTF-8 (byte offset {exc.start})", "", line, column,
                    "save the file as UTF-8")
        )
        raise col.error(f"profile {name} is not valid UTF-8") from None
    return text.removeprefix("\ufeff")


_DIRECTIVE_AREA = re.compile(r"(?:[ \t\r]*(?:#[^\n]*)?\n|%[^\n]*\n)*")
_YAML_DIRECTIVE = re.compile(r"^%YAML(?:[ \t]+([^ \t\r\n#]*))?", re.MULTILINE)


def _yaml_version_ok(text: str, col: _Collector) -> bool:
    """Refuse a `%YAML` directive other than 1.2 (checked on the text: ruamel's parser asserts,
    a traceback, on versions it does not know, and reads `%YAML 1.1` files by YAML 1.1 rules)."""
    # Directives sit at the start of a line before the document; blank and comment lines may
    # come between them.
    area = _DIRECTIVE_AREA.match(text)
    head = text[: area.end()] if area else ""
    for m in _YAML_DIRECTIVE.finditer(head):
        version = m.group(1) or ""
        if version == "1.2":
            continue
        # Under `%YAML 1.1` the same text means other values (`yes` and `on` are true, `0777`
        # is octal): a reviewer reading the file as YAML 1.2 would misjudge it.
        line = text.count("\n", 0, m.start()) + 1
        col.add(
            (),
            f"YAML version {show(version)} is not supported: a profile is YAML 1.2",
            "remove the `%YAML` line (or write `%YAML 1.2`)",
            pos=(line, 1),
        )
        return False
    return True


def _compose(text: str, col: _Collector) -> Node | None:
    from ruamel.yaml import YAML
    from ruamel.yaml.error import MarkedYAMLError, YAMLError
    from ruamel.yaml.events import CollectionEndEvent, CollectionStartEvent

    if not _yaml_version_ok(text, col):
        return None
    # The safe (not round-trip) parser: we need positions, not comments, and it is faster.
    yaml = YAML(typ="safe", pure=True)
    try:
        # A bounded first pass over the event stream: the pure-Python parser costs ~0.1 ms per
        # event, so a 1 MiB file of tiny flow mappings would otherwise take half a minute. The
        # parser keeps its own stack; only the composer (and our walk) recurse per level.
        depth = 0
        for count, event in enumerate(yaml.parse(text)):
            if count > MAX_EVENTS:
                col.add(
                    (),
                    f"the file has more than {MAX_EVENTS} YAML nodes; refused",
                    "a sandbox profile needs far fewer entries; check that this is the right file",
                    pos=(1, 1),
                )
                return None
            if isinstance(event, CollectionStartEvent):
                depth += 1
                if depth > MAX_DEPTH:
                    mark = event.start_mark
                    col.add(
                        (),
                        f"mappings and lists are nested more than {MAX_DEPTH} levels deep; "
                        "refused",
                        "a sandbox profile nests at most 3 levels (`mcp_policy: [{method: …}]`); "
                        "check the brackets, or that this is the right file",
                        pos=(mark.line + 1, mark.column + 1),
                    )
                    return None
            elif isinstance(event, CollectionEndEvent):
                depth -= 1
        return YAML(typ="safe", pure=True).compose(text)  # type: ignore[no-any-return]
    except RecursionError:
        # Not expected after the depth bound above; a clean refusal all the same (fail closed).
        col.add(
            (),
            "the YAML is nested too deeply to read; refused",
            f"a sandbox profile nests at most 3 levels (limit {MAX_DEPTH})",
            pos=(1, 1),
        )
    except MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        what = exc.problem or exc.context or "invalid YAML"
        if "expected a single document" in str(exc.context or ""):
            what = "more than one YAML document; a profile is exactly one document"
        pos = (mark.line + 1, mark.column + 1) if mark is not None else None
        col.add((), f"YAML syntax error: {safe_text(str(what), 200)}", pos=pos)
    except YAMLError as exc:  # reader errors (non-printable characters) and the like
        pos = None
        offset = getattr(exc, "position", None)
        if isinstance(offset, int) and 0 <= offset <= len(text):
            before = text[:offset]
            pos = (before.count("\n") + 1, offset - (before.rfind("\n") + 1) + 1)
        col.add((), f"YAML error: {safe_text(str(exc).splitlines()[0], 200)}", pos=pos)
    return None


# ---------------------------------------------------------------------------------------------
# Nodes → plain values (with positions), `${VAR}` expansion


HOST_VARS = (
    "HOME", "USER", "LOGNAME", "PWD",
    "XDG_CONFIG_HOME", "XDG_DATA_HOME", "XDG_STATE_HOME", "XDG_CACHE_HOME", "XDG_RUNTIME_DIR",
)  # fmt: skip
"""Host variables a profile may expand: where things are, never secrets."""

OPT_IN_PREFIX = "LINPODX_VAR_"
"""Any other value reaches a profile only through a variable with this prefix, which the person
sets on purpose when running the command."""


def var_allowed(name: str) -> bool:
    """May a profile expand `${name}`? A hostile profile must not copy the host's environment
    (`${AWS_SECRET_ACCESS_KEY}`) into the container's `env`, or leak it in an allowed DNS name."""
    return name in HOST_VARS or (name.startswith(OPT_IN_PREFIX) and len(name) > len(OPT_IN_PREFIX))


def expand_vars(
    value: str, env: Mapping[str, str]
) -> tuple[str, list[tuple[str, str]]]:
    """Expand `${VAR}`, `${VAR:-default}` and `$$`; return (text, problems as (msg, hint)).

    Only names `var_allowed` accepts are expanded; any other is a problem, default or not."""
    out: list[str] = []
    problems: list[tuple[str, str]] = []
    i = 0
    while i < len(value):
        j = value.find("$", i)
        if j < 0:
            out.append(value[i:])
            break
        out.append(value[i:j])
        m = _VAR.match(value, j)
        if m is None:
            problems.append(
                (
                    f"`$` at offset {j} is not `${{VAR}}`, `${{VAR:-default}}` or `$$`",
                    "write `${NAME}` to expand a variable or `$$` for a literal `$`",
                )
            )
            out.append("$")
            i = j + 1
            continue
        name, default, dollar = m.group(1), m.group(2), m.group(3)
        if dollar:
            out.append("$")
        elif not var_allowed(name):
            shown = safe_text(name, 60)
            suggested = shown if shown.startswith(OPT_IN_PREFIX) else OPT_IN_PREFIX + shown
            problems.append(
                (
                    f"`${{{shown}}}` is not expanded: a profile may only use "
                    f"{', '.join(HOST_VARS)} and variables named {OPT_IN_PREFIX}*",
                    f"use one of those host variables, or pass the value in on purpose: "
                    f"`export {suggested}=…` and write `${{{suggested}}}`",
                )
            )
        elif default is not None:
            # Shell semantics of `:-`: the default also replaces a set-but-empty variable.
            out.append(env.get(name) or default)
        elif name in env:
            out.append(env[name])
        else:
            problems.append(
                (
                    f"environment variable {name} is not set",
                    f"set {name}, or write `${{{name}:-default}}` to give a default",
                )
            )
        i = m.end()
    return "".join(out), problems


_BAD_CHARS = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u2028\u2029\ud800-\udfff]")


def _bad_char(text: str) -> str | None:
    """`U+XXXX` of the first character a profile string must not hold, else None."""
    m = _BAD_CHARS.search(text)
    return f"U+{ord(m.group()):04X}" if m else None


class _Converter:
    """Walks composed nodes into plain values, refusing what a profile never needs."""

    def __init__(self, col: _Collector, env: Mapping[str, str]):
        self.col = col
        self.env = env
        self.reported: set[int] = set()
        self.structural = False
        """Set when the YAML itself is unacceptable (anchors, tags, duplicate keys): then schema
        messages would only be noise."""

    def node(self, node: Node, path: KeyPath) -> Any:
        pos = (node.start_mark.line + 1, node.start_mark.column + 1)
        self.col.values[path] = pos
        if getattr(node, "anchor", None):
            # An aliased node is the same object again: report it once, never descend into it.
            if id(node) not in self.reported:
                self.structural = True
                self.reported.add(id(node))
                anchor = safe_text(str(node.anchor), 40)
                self.col.add(
                    path,
                    f"YAML anchors and aliases are not allowed (&{anchor})",
                    "write the value out in full; linpodx refuses anchors, aliases and merge keys "
                    "outright so that alias bombs (billion laughs) cannot expand",
                    pos=pos,
                )
            return None
        from ruamel.yaml.nodes import MappingNode, ScalarNode, SequenceNode

        tag = str(node.tag)
        if tag not in _ALLOWED_TAGS:
            self.structural = True
            self.col.add(
                path,
                f"YAML tag {safe_text(tag, 60)} is not allowed",
                "remove the tag; only plain YAML values are accepted",
                pos=pos,
            )
            return None
        if isinstance(node, MappingNode):
            return self.mapping(node, path)
        if isinstance(node, SequenceNode):
            return [self.node(item, (*path, i)) for i, item in enumerate(node.value)]
        if not isinstance(node, ScalarNode):  # the composer makes no other node kinds
            self.col.add(path, "unexpected YAML node", pos=pos)
            return None
        return self.scalar(node, tag, path, pos)

    def mapping(self, node: MappingNode, path: KeyPath) -> dict[str, Any]:
        from ruamel.yaml.nodes import ScalarNode

        out: dict[str, Any] = {}
        seen: dict[str, Pos] = {}
        for knode, vnode in node.value:
            kpos = (knode.start_mark.line + 1, knode.start_mark.column + 1)
            ktag = str(knode.tag)
            if ktag == _YAML_CORE + "merge":
                self.structural = True
                self.col.add(
                    path,
                    "YAML merge keys (<<) are not allowed",
                    "write the keys out in full; linpodx refuses anchors, aliases and merge keys",
                    pos=kpos,
                )
                continue
            if getattr(knode, "anchor", None) or not isinstance(knode, ScalarNode):
                self.structural = True
                self.col.add(path, "keys must be plain strings", pos=kpos)
                continue
            if ktag != _YAML_CORE + "str":
                self.structural = True
                self.col.add(
                    path,
                    f"key {show(knode.value)} must be a string",
                    "quote the key",
                    pos=kpos,
                )
                continue
            key = str(knode.value)
            if _bad_char(key):
                self.col.add(path, "keys must not contain control characters", pos=kpos)
                continue
            if key in seen:
                self.structural = True
                first = seen[key]
                self.col.add(
                    (*path, key),
                    f"duplicate key {show(key)} (first at line {first[0]}, column {first[1]})",
                    "remove one of them: YAML keys must be unique",
                    pos=kpos,
                )
                continue
            seen[key] = kpos
            self.col.keys[(*path, key)] = kpos
            out[key] = self.node(vnode, (*path, key))
        return out

    def scalar(self, node: ScalarNode, tag: str, path: KeyPath, pos: Pos) -> Any:
        text = str(node.value)
        kind = tag[len(_YAML_CORE) :]
        if kind == "str":
            value, problems = expand_vars(text, self.env)
            for message, hint in problems:
                self.col.add(path, message, hint, pos=pos)
            bad = _bad_char(value)
            if bad:
                # Double-quoted YAML escapes (and expanded variables) can produce characters the
                # reader refuses in raw form: ESC, C1 controls, NUL, lone surrogates. They would
                # reach terminals (`sandbox show`) and argv; a profile never needs them.
                self.col.add(
                    path,
                    f"strings must not contain control characters or lone surrogates ({bad})",
                    "remove the character; only tab and newline are allowed",
                    pos=pos,
                )
            if problems or bad:
                self.col.suppressed.add(path)
            return value
        if kind == "null":
            if text not in _YAML_NULLS:
                # `!!null delete_file` would turn a rule for one tool into one for every tool.
                self.col.add(path, f"{show(text)} tagged !!null is not a YAML null",
                             "write `null` or `~`, without a tag", pos=pos)
                self.col.suppressed.add(path)
            return None
        if kind == "bool":
            # Only YAML 1.2's spellings: `!!bool yes` or `!!bool "1"` must not quietly mean
            # false (a read-only mount made writable). Anything else is refused (fail closed).
            if text in _YAML_TRUE:
                return True
            if text in _YAML_FALSE:
                return False
            self.col.add(path, f"{show(text)} tagged !!bool is not a YAML boolean",
                         "write true or false, without a tag", pos=pos)
            self.col.suppressed.add(path)
            return None
        if kind == "int":
            digits = text.replace("_", "")
            for base in (0, 10):
                try:
                    return int(digits, base)
                except ValueError:
                    continue
            self.col.add(path, f"{show(text)} is not a valid integer", pos=pos)
            return None
        # float
        try:
            number = float(text.replace("_", ""))
        except ValueError:
            number = float("nan")
        if number != number or number in (float("inf"), float("-inf")):
            self.col.add(path, f"{show(text)} is not a finite number", pos=pos)
            return None
        self.col.float_texts[path] = text
        return number


# ---------------------------------------------------------------------------------------------
# Schema errors → our messages

_TYPE_NAMES = {
    "string": "a string",
    "integer": "an integer",
    "number": "a number",
    "boolean": "true or false",
    "object": "a mapping",
    "array": "a list",
    "null": "null",
}


def _json_type(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int):
        return "an integer"
    if isinstance(value, float):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, dict):
        return "a mapping"
    if isinstance(value, list):
        return "a list"
    return type(value).__name__


_PATTERN_HINTS = {
    "name": "use lower-case letters, digits, `_`, `.` and `-` (at most 63), starting with a "
    "letter or digit",
    "method": "a JSON-RPC method such as `tools/call`, or `*`: printable ASCII without spaces",
    "tool_name": "a tool's exact name, or `*`: printable ASCII without spaces",
    "allow_server_requests": "a JSON-RPC method such as `sampling/createMessage`",
    "memory": "a whole number and a unit k, m or g, e.g. `512m` or `2g`",
    "cpus": "a number of CPUs such as `2`, `1.5` or `0.25`",
    "cap_add": "a capability name such as CHOWN or NET_BIND_SERVICE",
}


def _schema_problem(err: ValidationError, col: _Collector) -> None:
    path: KeyPath = tuple(err.absolute_path)
    if path in col.suppressed:
        return
    v = err.validator
    sch = err.schema if isinstance(err.schema, dict) else {}
    if v == "additionalProperties" and isinstance(err.instance, dict):
        allowed = sorted(sch.get("properties", {}))
        for extra in sorted(set(err.instance) - set(allowed)):
            import difflib

            close = difflib.get_close_matches(extra, allowed, n=1)
            hint = f"did you mean `{close[0]}`? " if close else ""
            col.add(
                (*path, extra),
                f"unknown key {show(extra)}",
                f"{hint}keys allowed here: {', '.join(allowed)}",
                key=True,
            )
        return
    if "propertyNames" in err.schema_path and isinstance(err.instance, str):
        col.add(
            (*path, err.instance),
            f"{show(err.instance)} is not a valid environment variable name",
            "use letters, digits and `_`, not starting with a digit, at most 128 characters",
            key=True,
        )
        return
    if v == "required":
        missing = [k for k in sch.get("required", []) if k not in (err.instance or {})]
        for k in missing:
            col.add(path, f"missing required key {show(k)}", f"add `{k}:`")
        return
    if v == "type":
        want = err.validator_value
        wants = [want] if isinstance(want, str) else list(want)
        names = " or ".join(_TYPE_NAMES.get(w, w) for w in wants)
        quote = None
        if "integer" in wants and isinstance(err.instance, float):
            written = safe_text(col.float_texts.get(path, repr(err.instance)), 60)
            col.add(
                path,
                f"expected {names}, got the floating-point number `{written}`",
                "write a whole number as digits only, without a decimal point or exponent "
                "(`1000`, not `1e3` or `1000.0`)",
            )
            return
        if "string" in wants and isinstance(err.instance, (int, float, bool)):
            quote = "quote the value to make it a string"
        elif wants == ["boolean"] and isinstance(err.instance, str):
            quote = "write true or false, without quotes"
        col.add(path, f"expected {names}, got {_json_type(err.instance)}", quote)
        return
    if v == "const":
        if path == ("audit", "hash_chain"):
            col.add(
                path,
                "hash_chain: false is refused: linpodx always keeps the audit hash chain "
                "(fail closed)",
                "remove `hash_chain: false` (the default is true)",
            )
        elif path == ("version",):
            return  # reported before schema validation
        else:
            col.add(path, f"must be {show(err.validator_value)}, got {show(err.instance)}")
        return
    if v == "enum":
        options = ", ".join(str(o) for o in err.validator_value)
        col.add(path, f"{show(err.instance)} is not one of: {options}", f"use one of: {options}")
        return
    if v == "pattern":
        keys = [p for p in path if isinstance(p, str)]
        col.add(
            path,
            f"{show(err.instance)} is not valid here (must match {err.validator_value})",
            _PATTERN_HINTS.get(keys[-1]) if keys else None,
        )
        return
    if v in ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"):
        if sch.get("type") == "integer" and isinstance(err.instance, float):
            return  # the type error says it all
        lo = sch.get("minimum", sch.get("exclusiveMinimum"))
        hi = sch.get("maximum", sch.get("exclusiveMaximum"))
        rng = f"between {lo} and {hi}" if lo is not None and hi is not None else ""
        if "exclusiveMinimum" in sch:
            rng = f"greater than {lo}" + (f" and at most {hi}" if hi is not None else "")
        col.add(path, f"{show(err.instance)} is out of range: must be {rng}")
        return
    if v in ("maxLength", "minLength"):
        if v == "minLength":
            col.add(path, "must not be empty")
        else:
            col.add(path, f"too long (at most {err.validator_value} characters)")
        return
    if v in ("maxItems", "maxProperties"):
        col.add(path, f"too many entries (at most {err.validator_value})")
        return
    if v == "uniqueItems":
        col.add(path, "entries must be unique", "remove the duplicate entries")
        return
    col.add(path, safe_text(err.message, 200))


# ---------------------------------------------------------------------------------------------
# Semantic checks


def check_mount_target(target: str) -> tuple[str | None, str | None]:
    """(problem, hint) for a container path, or (None, None)."""
    if PATH_FORBIDDEN.search(target):
        return f"mount target must not contain {FORBIDDEN_TEXT}", (
            "podman's mount syntax uses these characters; choose another container path"
        )
    if not target.startswith("/"):
        return f"mount target {show(target)} must be an absolute path", "e.g. `/workspace`"
    if has_dotdot(target):
        return f"mount target {show(target)} must not contain `..`", None
    norm = posixpath.normpath(target)
    if norm.startswith("//"):
        norm = "/" + norm.lstrip("/")
    if norm != target:
        return f"mount target {show(target)} is not normalized", f"write `{norm}`"
    if target in _TARGET_EXACT:
        return f"mount target {target} is not allowed (linpodx manages it)", (
            "choose a directory such as `/workspace`"
        )
    for tree in _TARGET_TREES:
        if inside(target, tree):
            return f"mount target {show(target)} is over {tree}, which is not allowed", (
                "choose a directory such as `/workspace`"
            )
    return None, None


def normalize_hostname(raw: str) -> tuple[str | None, str | None]:
    """(normalized, problem) for an allowlist entry."""
    import ipaddress

    if not raw.isascii():
        # Before lower-casing: str.lower maps some non-ASCII letters to ASCII (the Kelvin sign
        # U+212A becomes `k`), which would allow a name other than the one written.
        first = next(ch for ch in raw if not ch.isascii())
        # The code point too: U+212A looks just like `K`.
        return None, (
            f"{show(raw)} is not ASCII (U+{ord(first):04X}); write the name in its `xn--` "
            "(IDNA) form"
        )
    name = raw.lower()
    if name.endswith(".") and not name.endswith(".."):
        name = name[:-1]
    if not name:
        return None, "empty host name"
    try:
        ipaddress.ip_address(name.strip("[]"))
    except ValueError:
        pass
    else:
        return None, f"{show(raw)} is an IP address; only DNS names can be allowed"
    wildcard = name.startswith("*.")
    body = name[2:] if wildcard else name
    if "*" in body:
        return None, (
            f"{show(raw)}: a wildcard is only allowed as a leading `*.` followed by a domain "
            "of at least two labels (`*.example.com`)"
        )
    if len(body) > 253:
        return None, f"{show(raw)} is longer than 253 characters"
    labels = body.split(".")
    if len(labels) < 2:
        what = "a wildcard needs a domain of at least two labels" if wildcard else (
            "a host name needs at least two labels"
        )
        return None, f"{show(raw)}: {what} (`*.example.com`, `crates.io`)"
    for label in labels:
        if not label:
            return None, f"{show(raw)} has an empty label"
        if len(label) > 63:
            return None, f"{show(raw)} has a label longer than 63 characters"
        if not _HOST_LABEL.match(label):
            return None, (
                f"{show(raw)}: label {show(label)} may only hold letters, digits and inner "
                "hyphens"
            )
    if labels[-1].isdigit():
        return None, f"{show(raw)} looks like an IP address; only DNS names can be allowed"
    return name, None


def normalize_entry(raw: str) -> tuple[str | None, str | None]:
    """(canonical entry, problem) for an allowlist entry `NAME[:PORT[/KIND]]` (KIND: `http`,
    `tcp`; none means TLS; a bare NAME is TLS on 443)."""
    from linpodx.profile.egressentry import Rule, split_entry

    try:
        written, port, kind = split_entry(raw)
    except ValueError as exc:
        # `[::1]`, `1.2.3.4:x`: say what the name part is wrong about, if it is.
        _, name_problem = normalize_hostname(raw)
        if name_problem and "IP address" in name_problem:
            return None, name_problem
        return None, f"{show(raw)}: {exc}"
    name, problem = normalize_hostname(written)
    if problem or name is None:
        return None, problem
    return Rule(name, port, kind).text(), None


def normalize_resolver(raw: str) -> tuple[str | None, str | None]:
    """(normalized `IP` / `IP:PORT` / `[V6]:PORT`, problem)."""
    import ipaddress

    if "%" in raw:
        # ipaddress takes `fe80::1%eth0` (and `%` followed by anything, spaces too): an
        # interface name is host-specific, and the resolver's address form has no place for it.
        return None, (
            f"{show(raw)}: IPv6 zone ids (`%eth0`) are not allowed; give an address reachable "
            "without one"
        )
    host, port = raw, None
    m = re.fullmatch(r"\[([^\]]+)\](?::([0-9]{1,5}))?", raw)
    if m:
        host, port = m.group(1), m.group(2)
        try:
            ipaddress.IPv6Address(host)
        except ValueError:
            return None, f"{show(raw)}: not an IPv6 address in brackets"
    elif raw.count(":") == 1:
        host, port = raw.split(":")
    try:
        addr = ipaddress.ip_address(host)
    except ValueError:
        return None, f"{show(raw)} is not `IP`, `IP:PORT` or `[IPV6]:PORT`"
    if port is not None:
        if not port.isdigit() or not 1 <= int(port) <= 65535:
            return None, f"{show(raw)}: port must be 1-65535"
        if addr.version == 6:
            return f"[{addr.compressed}]:{int(port)}", None
        return f"{addr.compressed}:{int(port)}", None
    return addr.compressed, None


def size_bytes(value: str) -> int | None:
    """Bytes of a `512m` form, None for anything else (the schema refuses it first, except for
    a stored revision, whose schema pass may be skipped)."""
    if not re.fullmatch(r"[1-9][0-9]{0,9}[kmgKMG]", value):
        return None
    return int(value[:-1]) * {"k": 1 << 10, "m": 1 << 20, "g": 1 << 30}[value[-1].lower()]


def _cpus(value: Any) -> tuple[str | None, str | None]:
    from decimal import Decimal, InvalidOperation

    if isinstance(value, bool):
        return None, "expected a number"
    try:
        d = Decimal(str(value))
    except InvalidOperation:
        return None, f"{show(value)} is not a number"
    if not d.is_finite() or d <= 0 or d > 1024:
        return None, f"{show(value)} is out of range: must be greater than 0 and at most 1024"
    if d != d.quantize(Decimal("0.001")):
        return None, f"{show(value)} has more than 3 decimals"
    text = format(d.normalize(), "f")
    return text, None


class _Semantics:
    def __init__(self, col: _Collector):
        self.col = col

    def ok(self, path: KeyPath) -> bool:
        return path not in self.col.bad_paths

    def run(self, data: dict[str, Any]) -> None:
        self.mounts(data.get("mounts"))
        self.network(data.get("network"))
        self.mcp_policy(data.get("mcp_policy"))
        self.caps(data.get("cap_add"))
        self.resources(data.get("resources"))
        wd = data.get("workdir")
        if isinstance(wd, str) and self.ok(("workdir",)):
            norm = posixpath.normpath(wd) if wd.startswith("/") else ""
            # Tab and newline pass the loader's character check (text may hold them), not a
            # working directory: `"/w\n"` made every run start somewhere else.
            if (
                not wd.startswith("/")
                or has_dotdot(wd)
                or norm != wd
                or _bad_char(wd)
                or "\n" in wd
                or "\t" in wd
            ):
                self.col.add(
                    ("workdir",),
                    f"workdir {show(wd)} must be an absolute, normalized path without `..` "
                    "or control characters",
                    "e.g. `/workspace`",
                )

    def mounts(self, mounts: Any) -> None:
        if not isinstance(mounts, list):
            return
        targets: dict[str, int] = {}
        for i, m in enumerate(mounts):
            if not isinstance(m, dict):
                continue
            src, tgt = m.get("source"), m.get("target")
            if isinstance(src, str) and self.ok(("mounts", i, "source")):
                resolved, problem, hint = check_mount_source(src)
                if problem:
                    self.col.add(("mounts", i, "source"), problem, hint)
                else:
                    m["source"] = resolved
            if isinstance(tgt, str) and self.ok(("mounts", i, "target")):
                problem, hint = check_mount_target(tgt)
                if problem:
                    self.col.add(("mounts", i, "target"), problem, hint)
                elif tgt in targets:
                    self.col.add(
                        ("mounts", i, "target"),
                        f"mount target {tgt} is already used by mounts[{targets[tgt]}]",
                        "each container path can be mounted once",
                    )
                else:
                    targets[tgt] = i

    def network(self, net: Any) -> None:
        if not isinstance(net, dict):
            return
        hosts = net.get("egress_dns_allowlist")
        if isinstance(hosts, list):
            seen: dict[str, int] = {}
            for i, h in enumerate(hosts):
                path: KeyPath = ("network", "egress_dns_allowlist", i)
                if not isinstance(h, str) or not self.ok(path):
                    continue
                norm, problem = normalize_entry(h)
                if problem or norm is None:
                    self.col.add(path, problem or "invalid host name",
                                 "write entries like `crates.io`, `*.example.com`, "
                                 "`example.com:8443`, `example.com:80/http` or "
                                 "`example.com:22/tcp`")
                elif norm in seen:
                    self.col.add(
                        path,
                        f"{show(norm)} is listed twice (also at index {seen[norm]})",
                        "remove the duplicate entry",
                    )
                else:
                    seen[norm] = i
                    hosts[i] = norm
        resolvers = net.get("upstream_dns")
        if isinstance(resolvers, list):
            for i, r in enumerate(resolvers):
                path = ("network", "upstream_dns", i)
                if isinstance(r, str) and self.ok(path):
                    norm, problem = normalize_resolver(r)
                    if problem:
                        self.col.add(path, problem, "e.g. `192.0.2.53`, `192.0.2.53:5353`, "
                                     "`[2001:db8::53]:53`")
                    else:
                        resolvers[i] = norm

    def mcp_policy(self, rules: Any) -> None:
        if not isinstance(rules, list):
            return
        for i, r in enumerate(rules):
            if not isinstance(r, dict):
                continue
            tool = r.get("tool_name")
            method = r.get("method")
            if tool is not None and isinstance(method, str) and method not in ("tools/call", "*"):
                self.col.add(
                    ("mcp_policy", i, "tool_name"),
                    f"tool_name only applies to method tools/call (or `*`), not {show(method)}",
                    "remove tool_name or set `method: tools/call`",
                )
            if tool == "*":
                r["tool_name"] = None

    def caps(self, caps: Any) -> None:
        if not isinstance(caps, list):
            return
        seen: set[str] = set()
        for i, c in enumerate(caps):
            path: KeyPath = ("cap_add", i)
            if not isinstance(c, str) or not self.ok(path):
                continue
            name = c.upper().removeprefix("CAP_")
            if name not in ALL_CAPS:
                self.col.add(path, f"unknown capability {show(c)}",
                             "use a Linux capability name such as CHOWN or NET_BIND_SERVICE")
            elif name in DANGEROUS_CAPS:
                self.col.add(
                    path,
                    f"capability {name} is refused: it would let the container escape or undo "
                    "the sandbox",
                    "drop it; if the agent needs it, it does not belong in this sandbox",
                )
            elif name in seen:
                self.col.add(path, f"capability {name} is listed twice", "remove the duplicate")
            else:
                seen.add(name)
                caps[i] = name

    def resources(self, res: Any) -> None:
        if not isinstance(res, dict):
            return
        mem = res.get("memory")
        if isinstance(mem, str) and self.ok(("resources", "memory")):
            n = size_bytes(mem)
            if n is None:
                self.col.add(("resources", "memory"), f"{show(mem)} is not a memory size",
                             _PATTERN_HINTS["memory"])
            elif not (6 << 20) <= n <= (1024 << 30):
                self.col.add(("resources", "memory"), f"{show(mem)} is out of range: must be "
                             "between 6m and 1024g")
            else:
                res["memory"] = mem.lower()
        for key, low, high, span in (("log_max_size", 1 << 20, 1 << 40, "1m and 1024g"),
                                     ("snapshot_max_size", 1 << 20, 1 << 50, "1m and 1048576g")):
            size = res.get(key)
            if isinstance(size, str) and self.ok(("resources", key)):
                n = size_bytes(size)
                if n is None:
                    self.col.add(("resources", key), f"{show(size)} is not a size",
                                 _PATTERN_HINTS["memory"])
                elif not low <= n <= high:
                    self.col.add(("resources", key), f"{show(size)} is out of range: must be "
                                 f"between {span}")
                else:
                    res[key] = size.lower()
        if res.get("cpus") is not None and self.ok(("resources", "cpus")):
            # A YAML float is judged as written (`0.1000001` has too many decimals even where
            # the float rounds it away).
            written = self.col.float_texts.get(("resources", "cpus"))
            raw = written.replace("_", "") if isinstance(res["cpus"], float) and written else None
            norm, problem = _cpus(raw if raw is not None else res["cpus"])
            if problem:
                self.col.add(("resources", "cpus"), problem, _PATTERN_HINTS["cpus"])
            else:
                res["cpus"] = norm


# ---------------------------------------------------------------------------------------------
# Construction


def _build(data: Mapping[str, Any]) -> Profile:
    """Frozen dataclasses from a dict that already passed the schema and semantic checks."""
    net = data.get("network") or {}
    mcp = data.get("mcp") or {}
    res = data.get("resources") or {}
    d = Resources()
    return Profile(
        name=data["name"],
        description=data.get("description", ""),
        mounts=tuple(
            Mount(source=m["source"], target=m["target"], read_only=m.get("read_only", True))
            for m in data.get("mounts") or []
        ),
        network=Network(
            egress_dns_allowlist=tuple(net.get("egress_dns_allowlist") or ()),
            upstream_dns=tuple(net.get("upstream_dns") or ()),
            allow_private_answers=net.get("allow_private_answers", False),
            wildcard_budget=net.get("wildcard_budget", Network.wildcard_budget),
            max_connections=net.get("max_connections", Network.max_connections),
            max_new_connections_per_second=net.get(
                "max_new_connections_per_second", Network.max_new_connections_per_second
            ),
        ),
        mcp_policy=tuple(
            McpRule(
                method=r["method"],
                decision=Decision(r["decision"]),
                tool_name=r.get("tool_name"),
            )
            for r in data.get("mcp_policy") or []
        ),
        mcp=McpSettings(
            approval_timeout_seconds=mcp.get("approval_timeout_seconds", 30),
            max_line_bytes=mcp.get("max_line_bytes", 4 * 1024 * 1024),
            allow_server_requests=tuple(mcp.get("allow_server_requests") or ()),
            record_arguments=mcp.get("record_arguments", False),
            drop_records_per_second=mcp.get("drop_records_per_second", 100),
            audit_max_bytes=mcp.get("audit_max_bytes", 1024 * 1024 * 1024),
            stderr_bytes_per_second=mcp.get("stderr_bytes_per_second", 64 * 1024),
        ),
        audit=Audit(hash_chain=True),
        resources=Resources(
            memory=res.get("memory", d.memory),
            cpus=res.get("cpus", d.cpus),
            pids_limit=res.get("pids_limit", d.pids_limit),
            nofile=res.get("nofile", d.nofile),
            nproc=res.get("nproc", d.nproc),
            enforcement=res.get("enforcement", d.enforcement),
            log_max_size=res.get("log_max_size", d.log_max_size),
            snapshot_max_size=res.get("snapshot_max_size", d.snapshot_max_size),
        ),
        cap_add=tuple(data.get("cap_add") or ()),
        env=tuple(sorted((data.get("env") or {}).items())),
        workdir=data.get("workdir"),
        version=data.get("version", SCHEMA_VERSION),
    )


def _check_version(data: Any, col: _Collector) -> bool:
    if not isinstance(data, dict) or "version" not in data:
        return True
    v = data["version"]
    if isinstance(v, int) and not isinstance(v, bool) and v == SCHEMA_VERSION:
        return True
    col.add(
        ("version",),
        f"profile version {show(v)} is not supported (this linpodx reads version "
        f"{SCHEMA_VERSION})",
        f"write `version: {SCHEMA_VERSION}` or upgrade linpodx",
    )
    return False


def _validate(
    data: Any, col: _Collector, *, check_paths: bool, schema_pass: bool = True
) -> Profile | None:
    if not isinstance(data, dict):
        col.add((), f"the top level must be a mapping of keys, got {_json_type(data)}",
                "start the file with `name: my-profile`", pos=col.pos(()) or (1, 1))
        return None
    if not _check_version(data, col):
        return None
    if schema_pass:
        for err in _validator().iter_errors(data):
            _schema_problem(err, col)
    sem = _Semantics(col)
    if check_paths:
        sem.run(data)
    else:
        # Stored profiles: same normalization, but host paths are not re-checked here (the
        # source may be gone by now; `linpodx run` checks them again: linpodx.profile.hostpaths).
        sem.network(data.get("network"))
        sem.mcp_policy(data.get("mcp_policy"))
        sem.caps(data.get("cap_add"))
        sem.resources(data.get("resources"))
    if not col.problems:
        _floats(data, (), col)
    if col.problems:
        return None
    profile = _build(data)
    try:
        canonical_bytes(profile.to_dict())
    except CanonicalError as exc:
        # Unreachable while the checks above hold; if one slips, refuse here (where `validate`
        # refuses too) rather than only in the store.
        col.add((), f"the profile has no canonical form: {exc}",
                "fix the value or report this as a bug in linpodx", pos=col.pos(()) or (1, 1))
        return None
    return profile


def _floats(value: Any, path: KeyPath, col: _Collector) -> None:
    """Refuse every floating-point number left after normalization: the store hashes the
    profile's canonical JSON, which has no floats (`cpus` is normalized to a decimal string)."""
    if isinstance(value, float):
        written = safe_text(col.float_texts.get(path, repr(value)), 60)
        col.add(path, f"the floating-point number `{written}` is not allowed here",
                "write a whole number as digits only")
    elif isinstance(value, dict):
        for k, v in value.items():
            _floats(v, (*path, k), col)
    elif isinstance(value, list):
        for i, v in enumerate(value):
            _floats(v, (*path, i), col)


def load_text(
    text: str, filename: str = "<profile>", env: Mapping[str, str] | None = None
) -> Profile:
    """Load a profile from YAML text (positions are reported against `filename`)."""
    col = _Collector(filename)
    if len(text.encode("utf-8", "surrogatepass")) > MAX_BYTES:
        raise ProfileError(
            f"{filename}: profile is larger than {MAX_BYTES} bytes (1 MiB); refused before parsing"
        )
    node = _compose(text, col)
    if node is None:
        if not col.problems:
            col.add((), "the file is empty", "start the file with `name: my-profile`", pos=(1, 1))
        raise col.error()
    conv = _Converter(col, os.environ if env is None else env)
    data = conv.node(node, ())
    if conv.structural:
        # Structure problems (anchors, tags, duplicates) make schema messages noise; stop here.
        raise col.error()
    profile = _validate(data, col, check_paths=True)
    if profile is None:
        raise col.error()
    return profile


def load_file(path: Path | str, env: Mapping[str, str] | None = None) -> Profile:
    """Load and validate a profile file; raises ProfileError listing every problem."""
    p = Path(path)
    return load_text(read_profile_text(p, str(path)), str(path), env)


def profile_from_dict(
    data: Mapping[str, Any],
    origin: str = "<stored profile>",
    *,
    validated_with: str | None = None,
) -> Profile:
    """Rebuild a Profile from its normalized dict (`Profile.to_dict()`), checking it again.

    `validated_with` is the `schema_digest()` the dict already passed (recorded by the store at
    apply time). When it names the current schema, the JSON Schema pass is not repeated: it
    would give the same answer, and importing and building the validator costs ~0.1 s on every
    `linpodx run`. The semantic checks (names, resolvers, capabilities, limits) always run.
    """
    col = _Collector(origin)
    copy = json.loads(json.dumps(data))
    fresh = validated_with is not None and validated_with == schema_digest()
    profile = _validate(copy, col, check_paths=False, schema_pass=not fresh)
    if profile is None:
        raise col.error(f"stored profile {origin} is not valid")
    return profile
