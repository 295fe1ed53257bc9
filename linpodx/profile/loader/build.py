"""Stage 5: the frozen `Profile` from a dict that passed every check."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from linpodx.profile.mcprule import parse_matcher, parse_rate
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


def _rule(r: Mapping[str, Any]) -> McpRule:
    arguments = []
    for name, spec in (r.get("arguments") or {}).items():
        matcher, problem, _hint = parse_matcher(spec)
        if matcher is None:  # the semantic pass refused it already; never reached
            raise ValueError(f"argument matcher {name!r}: {problem}")
        arguments.append((name, matcher))
    rate = r.get("rate")
    return McpRule(
        method=r["method"],
        decision=Decision(r["decision"]),
        tool_name=r.get("tool_name"),
        arguments=tuple(arguments),
        rate=None if rate is None else parse_rate(rate),
    )


def build_profile(data: Mapping[str, Any]) -> Profile:
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
            _rule(r) for r in data.get("mcp_policy") or []
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
