"""Stage 3: the JSON Schema pass (draft 2020-12, `profile/schema.json`) and its errors turned
into our messages and hints."""

from __future__ import annotations

import functools
import hashlib
import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from linpodx.output import safe_text
from linpodx.profile.hostpaths import show
from linpodx.profile.loader.problems import Collector, KeyPath
from linpodx.profile.model import SCHEMA_VERSION

# jsonschema (and difflib) are imported where they are used (see linpodx.profile.loader).
if TYPE_CHECKING:
    from jsonschema import Draft202012Validator  # type: ignore[import-untyped,unused-ignore]
    from jsonschema.exceptions import ValidationError  # type: ignore[import-untyped,unused-ignore]

# Package data of linpodx.profile, found by path. Not importlib.resources: importing it costs
# ~10 ms on every `linpodx run`, and linpodx is never run from a zip archive.
_SCHEMA_FILE = Path(__file__).parent.parent / "schema.json"

_VALIDATOR_RULES = b"\n# pattern: $ is \\Z\n"
"""How `_validator` departs from plain Draft 2020-12, as part of `schema_digest`: change it
when a rule changes, so that revisions stored under the old rule get the schema pass again
(a `tool_name` of `"delete_file\\n"` passed the old `pattern` check; see `_anchored`)."""


@functools.cache
def schema() -> dict[str, Any]:
    """The profile JSON Schema shipped as package data."""
    text = _SCHEMA_FILE.read_text("utf-8")
    doc: dict[str, Any] = json.loads(text)
    return doc


@functools.cache
def schema_digest() -> str:
    """sha256 of the schema file and of `_VALIDATOR_RULES`: names the schema (as this loader
    applies it) a stored revision was validated against."""
    data = _SCHEMA_FILE.read_bytes()
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


def check_version(data: Any, col: Collector) -> bool:
    """False (with a problem) when `data` names a `version` this linpodx does not read."""
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


def check(data: dict[str, Any], col: Collector) -> None:
    """Add a problem for every schema error in `data`."""
    for err in _validator().iter_errors(data):
        _schema_problem(err, col)


_TYPE_NAMES = {
    "string": "a string",
    "integer": "an integer",
    "number": "a number",
    "boolean": "true or false",
    "object": "a mapping",
    "array": "a list",
    "null": "null",
}


def json_type(value: Any) -> str:
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


PATTERN_HINTS = {
    "name": "use lower-case letters, digits, `_`, `.` and `-` (at most 63), starting with a "
    "letter or digit",
    "method": "a JSON-RPC method such as `tools/call`, or `*`: printable ASCII without spaces",
    "tool_name": "a tool's exact name, or `*`: printable ASCII without spaces",
    "allow_server_requests": "a JSON-RPC method such as `sampling/createMessage`",
    "memory": "a whole number and a unit k, m or g, e.g. `512m` or `2g`",
    "cpus": "a number of CPUs such as `2`, `1.5` or `0.25`",
    "cap_add": "a capability name such as CHOWN or NET_BIND_SERVICE",
    "rate": "N/s, N/min or N/h with N from 1 to 10000, e.g. `30/min`",
}


def _schema_problem(err: ValidationError, col: Collector) -> None:
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
        col.add(path, f"expected {names}, got {json_type(err.instance)}", quote)
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
            PATTERN_HINTS.get(keys[-1]) if keys else None,
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
    if v in ("minProperties", "maxProperties") and len(path) == 4 and path[2] == "arguments":
        # One argument's matcher (`mcp_policy[i].arguments.NAME`).
        col.add(path, "an argument takes exactly one matcher",
                "write one of `{glob: …}`, `{regex: …}`, `{equals: …}`, `{one_of: […]}`")
        return
    if v in ("maxItems", "maxProperties"):
        col.add(path, f"too many entries (at most {err.validator_value})")
        return
    if v == "uniqueItems":
        col.add(path, "entries must be unique", "remove the duplicate entries")
        return
    col.add(path, safe_text(err.message, 200))
