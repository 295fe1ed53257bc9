"""Markdown configuration reference, generated from the profile JSON Schema.

    python -m linpodx.profile.reference > docs/profile-reference.md

A unit test compares the committed file with this output, so the reference cannot drift from
the schema the loader enforces.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator, Mapping
from typing import Any

from linpodx.profile.loader import (
    MAX_BYTES,
    MAX_EVENTS,
    schema,
)

REGENERATE = "python -m linpodx.profile.reference > docs/profile-reference.md"

_CONSTRAINTS = (
    ("const", "must be {}"),
    ("enum", "one of {}"),
    ("pattern", "matches `{}`"),
    ("minimum", "≥ {}"),
    ("exclusiveMinimum", "> {}"),
    ("maximum", "≤ {}"),
    ("minLength", "at least {} characters"),
    ("maxLength", "at most {} characters"),
    ("maxItems", "at most {} entries"),
    ("maxProperties", "at most {} entries"),
    ("uniqueItems", "entries unique"),
)


def _type(node: Mapping[str, Any]) -> str:
    t = node.get("type", "any")
    types = [t] if isinstance(t, str) else list(t)
    if "array" in types and isinstance(node.get("items"), Mapping):
        inner = _type(node["items"])
        types = [f"list of {inner}" if x == "array" else x for x in types]
    if "object" in types and isinstance(node.get("additionalProperties"), Mapping):
        inner = _type(node["additionalProperties"])
        types = [f"map of {inner}" if x == "object" else x for x in types]
    return " or ".join(types)


def _value(v: Any) -> str:
    if isinstance(v, str):
        return f'`"{v}"`' if v else '`""`'
    return f"`{json.dumps(v)}`"


def _constraints(node: Mapping[str, Any]) -> str:
    out = []
    for key, fmt in _CONSTRAINTS:
        if key not in node:
            continue
        v = node[key]
        if key == "enum":
            out.append(fmt.format(", ".join(f"`{x}`" for x in v)))
        elif key == "const":
            out.append(fmt.format(_value(v)))
        elif key == "minLength" and v == 1:
            out.append("not empty")
        elif key == "uniqueItems":
            if v:
                out.append(fmt)
        else:
            out.append(fmt.format(v))
    names = node.get("propertyNames")
    if isinstance(names, Mapping) and "pattern" in names:
        out.append(f"names match `{names['pattern']}`")
    items = node.get("items")
    if isinstance(items, Mapping) and "properties" not in items:
        inner = _constraints(items)
        if inner:
            out.append(f"each entry: {inner}")
    return "; ".join(out)


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def _rows(
    props: Mapping[str, Any], required: list[str], prefix: str
) -> Iterator[tuple[str, Mapping[str, Any], bool]]:
    for key, node in props.items():
        path = f"{prefix}{key}"
        yield path, node, key in required
        if isinstance(node.get("properties"), Mapping):
            yield from _rows(node["properties"], node.get("required", []), f"{path}.")
        items = node.get("items")
        if isinstance(items, Mapping) and isinstance(items.get("properties"), Mapping):
            yield from _rows(items["properties"], items.get("required", []), f"{path}[].")


def generate() -> str:
    """The whole reference as Markdown text."""
    s = schema()
    lines = [
        "# Sandbox profile reference",
        "",
        "<!-- Generated from linpodx/profile/schema.json; do not edit by hand. Regenerate with:",
        f"     {REGENERATE} -->",
        "",
        f"Schema: `{s['$id']}` (JSON Schema draft 2020-12).",
        "",
        s["description"],
        "",
        f"Limits of the file itself: at most {MAX_BYTES} bytes (1 MiB), UTF-8, one YAML document "
        f"whose top level is a mapping, at most {MAX_EVENTS} YAML nodes, no duplicate keys.",
        "",
        "Problems are reported as `FILE:LINE:COL: key.path: message`, all of them at once, "
        "followed by a `hint:`; nothing is stored when any problem is found.",
        "",
        "| Key | Type | Default | Constraints | Description |",
        "| --- | --- | --- | --- | --- |",
    ]
    for path, node, required in _rows(s["properties"], s.get("required", []), ""):
        default = "required" if required else _value(node.get("default"))
        lines.append(
            "| `{}` | {} | {} | {} | {} |".format(
                path,
                _cell(_type(node)),
                _cell(default),
                _cell(_constraints(node)),
                _cell(node.get("description", "")),
            )
        )
    lines += [
        "",
        "## Example",
        "",
        "See `examples/agent-readonly.yml`:",
        "",
        "```yaml",
        "name: agent-readonly",
        "description: Coding agent with a read-only view of the demo project",
        "mounts:",
        "  - source: ${HOME}/demo-project",
        "    target: /workspace",
        "network:",
        "  egress_dns_allowlist: [registry.example.com, crates.io]",
        "mcp_policy:",
        "  - {method: tools/call, tool_name: read_file, decision: auto_allow}",
        "  - {method: tools/call, tool_name: write_file, decision: prompt}",
        "  - {method: tools/call, decision: prompt}",
        "audit:",
        "  hash_chain: true",
        "```",
        "",
    ]
    return "\n".join(lines)


README_BEGIN = (
    "<!-- BEGIN profile-reference (generated: python -m linpodx.profile.reference --readme) -->"
)
README_END = "<!-- END profile-reference -->"


def readme_block() -> str:
    """The reference as it stands in README.md: without its title, headings one level down."""
    body = generate().split("\n", 1)[1]
    return body.replace("\n## ", "\n### ")


def update_readme(text: str) -> str:
    """README text with the block between the markers replaced by `readme_block()`."""
    head, sep, rest = text.partition(README_BEGIN)
    _, sep2, tail = rest.partition(README_END)
    if not sep or not sep2:
        raise ValueError("README.md lacks the profile-reference markers")
    return f"{head}{README_BEGIN}\n{readme_block()}\n{README_END}{tail}"


def main() -> int:
    """Print the reference on stdout; with `--readme`, refresh the copy in ./README.md."""
    if sys.argv[1:] == ["--readme"]:
        from pathlib import Path

        readme = Path("README.md")
        readme.write_text(update_readme(readme.read_text(encoding="utf-8")), encoding="utf-8")
        return 0
    sys.stdout.write(generate())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
