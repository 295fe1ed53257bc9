"""Stage 2: YAML → plain values with positions.

ruamel.yaml *composes* (nodes with positions, nothing constructed); our own walk refuses
anchors, aliases, merge keys, custom tags and duplicate keys, and expands `${VAR}`.

Why compose and not load: composing never expands aliases (an alias is the same node object
again), so a "billion laughs" file costs nothing before we refuse its first anchor.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from linpodx.output import safe_text
from linpodx.profile.hostpaths import show
from linpodx.profile.loader.problems import Collector, KeyPath, Pos

# ruamel.yaml is imported where it is used (see linpodx.profile.loader).
if TYPE_CHECKING:
    from ruamel.yaml.nodes import MappingNode, Node, ScalarNode

MAX_EVENTS = 10_000
"""Most YAML events (nodes, starts and ends) a profile may have; the schema's list bounds keep
a legitimate profile far below this."""

MAX_DEPTH = 32
"""Deepest nesting of YAML mappings and lists a profile may have. A legitimate profile nests
3 levels (`mcp_policy[0].method`); ruamel's composer recurses once per level and runs out of
Python stack at about 500, so deeper files are refused on the event stream, before composing."""

_YAML_CORE = "tag:yaml.org,2002:"
_ALLOWED_TAGS = {_YAML_CORE + t for t in ("str", "int", "float", "bool", "null", "map", "seq")}
# YAML 1.2 core schema spellings; the resolver only tags these, but an explicit `!!bool` or
# `!!null` tag puts any text under them.
_YAML_TRUE = ("true", "True", "TRUE")
_YAML_FALSE = ("false", "False", "FALSE")
_YAML_NULLS = ("", "~", "null", "Null", "NULL")

_VAR = re.compile(r"\$(?:\{([A-Za-z_][A-Za-z0-9_]*)(?::-([^}]*))?\}|(\$))")


_DIRECTIVE_AREA = re.compile(r"(?:[ \t\r]*(?:#[^\n]*)?\n|%[^\n]*\n)*")
_YAML_DIRECTIVE = re.compile(r"^%YAML(?:[ \t]+([^ \t\r\n#]*))?", re.MULTILINE)


def _yaml_version_ok(text: str, col: Collector) -> bool:
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


def compose(text: str, col: Collector) -> Node | None:
    """The document's root node, or None (with the problems in `col`)."""
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


def bad_char(text: str) -> str | None:
    """`U+XXXX` of the first character a profile string must not hold, else None."""
    m = _BAD_CHARS.search(text)
    return f"U+{ord(m.group()):04X}" if m else None


class Converter:
    """Walks composed nodes into plain values, refusing what a profile never needs."""

    def __init__(self, col: Collector, env: Mapping[str, str]):
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
            if bad_char(key):
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
            bad = bad_char(value)
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
