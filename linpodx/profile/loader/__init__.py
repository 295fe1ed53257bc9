"""YAML profile → validated, frozen `Profile`.

One module per stage, in the order a file goes through them:

1. `read`: bounded read (1 MiB, UTF-8);
2. `yaml`: ruamel.yaml *compose* (nodes with positions, nothing constructed), then our own walk
   that refuses anchors, aliases, merge keys, custom tags and duplicate keys and expands
   `${VAR}`;
3. `schemapass`: JSON Schema (draft 2020-12);
4. `semantics`: semantic checks (paths, hostnames, capabilities, …);
5. `build`: frozen dataclasses.

`problems` holds what they share. Every problem found on the way is collected and reported as
`FILE:LINE:COL: key.path: message`; the caller gets one `ProfileError` holding all of them, or a
`Profile`. The entry points below (`load_file`, `load_text`, `profile_from_dict`) run the stages.

jsonschema and ruamel.yaml (and the small difflib, decimal, ipaddress) are imported where they
are used: together they cost about 100 ms, which `linpodx run` (it only reads a stored, already
validated profile) should not pay.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from linpodx.canonical import CanonicalError, canonical_bytes
from linpodx.errors import ProfileError
from linpodx.profile.hostpaths import check_mount_source
from linpodx.profile.loader import schemapass, semantics
from linpodx.profile.loader.build import build_profile
from linpodx.profile.loader.problems import MAX_PROBLEMS, Collector, Problem, format_path
from linpodx.profile.loader.read import MAX_BYTES, read_profile_text
from linpodx.profile.loader.schemapass import json_type, schema, schema_digest
from linpodx.profile.loader.semantics import (
    ALL_CAPS,
    DANGEROUS_CAPS,
    check_mount_target,
    normalize_entry,
    normalize_hostname,
    normalize_resolver,
    size_bytes,
)
from linpodx.profile.loader.yaml import (
    HOST_VARS,
    MAX_DEPTH,
    MAX_EVENTS,
    OPT_IN_PREFIX,
    Converter,
    compose,
    expand_vars,
    var_allowed,
)
from linpodx.profile.model import Profile

__all__ = [
    "ALL_CAPS",
    "DANGEROUS_CAPS",
    "HOST_VARS",
    "MAX_BYTES",
    "MAX_DEPTH",
    "MAX_EVENTS",
    "MAX_PROBLEMS",
    "OPT_IN_PREFIX",
    "Problem",
    "check_mount_source",
    "check_mount_target",
    "expand_vars",
    "format_path",
    "load_file",
    "load_text",
    "normalize_entry",
    "normalize_hostname",
    "normalize_resolver",
    "profile_from_dict",
    "read_profile_text",
    "schema",
    "schema_digest",
    "size_bytes",
    "var_allowed",
]


def _validate(
    data: Any, col: Collector, *, check_paths: bool, schema_pass: bool = True
) -> Profile | None:
    """Stages 3 to 5 on values from the YAML walk (or a stored revision's dict), normalized in
    place: the `Profile`, or None with the problems in `col`."""
    if not isinstance(data, dict):
        col.add((), f"the top level must be a mapping of keys, got {json_type(data)}",
                "start the file with `name: my-profile`", pos=col.pos(()) or (1, 1))
        return None
    if not schemapass.check_version(data, col):
        return None
    if schema_pass:
        schemapass.check(data, col)
    semantics.check(data, col, check_paths=check_paths)
    if not col.problems:
        semantics.refuse_floats(data, (), col)
    if col.problems:
        return None
    profile = build_profile(data)
    try:
        canonical_bytes(profile.to_dict())
    except CanonicalError as exc:
        # Unreachable while the checks above hold; if one slips, refuse here (where `validate`
        # refuses too) rather than only in the store.
        col.add((), f"the profile has no canonical form: {exc}",
                "fix the value or report this as a bug in linpodx", pos=col.pos(()) or (1, 1))
        return None
    return profile


def load_text(
    text: str, filename: str = "<profile>", env: Mapping[str, str] | None = None
) -> Profile:
    """Load a profile from YAML text (positions are reported against `filename`)."""
    col = Collector(filename)
    if len(text.encode("utf-8", "surrogatepass")) > MAX_BYTES:
        raise ProfileError(
            f"{filename}: profile is larger than {MAX_BYTES} bytes (1 MiB); refused before parsing"
        )
    node = compose(text, col)
    if node is None:
        if not col.problems:
            col.add((), "the file is empty", "start the file with `name: my-profile`", pos=(1, 1))
        raise col.error()
    conv = Converter(col, os.environ if env is None else env)
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
    col = Collector(origin)
    copy = json.loads(json.dumps(data))
    fresh = validated_with is not None and validated_with == schema_digest()
    profile = _validate(copy, col, check_paths=False, schema_pass=not fresh)
    if profile is None:
        raise col.error(f"stored profile {origin} is not valid")
    return profile
