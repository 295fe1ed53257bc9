"""The profile as the rest of linpodx sees it: frozen dataclasses, already validated.

Nothing past the loader handles a raw dict. `to_dict()` gives the normalized form that the
store hashes and keeps (canonical JSON has no floats, so every number here is an int and CPU
quotas are kept as a decimal string).
"""

from __future__ import annotations

import hashlib
from dataclasses import asdict, dataclass, field
from enum import StrEnum
from typing import Any

from linpodx.canonical import canonical_bytes
from linpodx.profile.mcprule import Matcher, Rate

SCHEMA_VERSION = 1


class Decision(StrEnum):
    """What the MCP gate does with a matching request."""

    AUTO_ALLOW = "auto_allow"
    PROMPT = "prompt"
    DENY = "deny"


@dataclass(frozen=True)
class Mount:
    """A host path bind-mounted into the container."""

    source: str
    """Absolute, normalized host path (after `${VAR}` expansion); symlinks already resolved."""
    target: str
    """Absolute path inside the container."""
    read_only: bool = True
    """Read-only unless the profile says `read_only: false`."""


@dataclass(frozen=True)
class Network:
    """Egress policy."""

    egress_dns_allowlist: tuple[str, ...] = ()
    """Lower-case names: exact (`crates.io`) or wildcard (`*.example.com`, subdomains only).
    Empty means no network at all."""
    upstream_dns: tuple[str, ...] = ()
    """`IP` or `IP:PORT` resolvers the policy resolver asks; empty means the host's."""
    allow_private_answers: bool = False
    """Allow allowed names to resolve to loopback, link-local, private or host addresses."""
    wildcard_budget: int = 100
    """Distinct new names allowed by wildcard entries alone, at most, per 10 minutes."""
    max_connections: int = 512
    """Outbound connections open at once through the connection checker, at most."""
    max_new_connections_per_second: int = 100
    """New outbound connections per second through the connection checker, at most."""


@dataclass(frozen=True)
class McpRule:
    """One gate rule; rules are tried in order and the first match wins."""

    method: str
    """JSON-RPC method, exact (`tools/call`) or `*` for any."""
    decision: Decision
    tool_name: str | None = None
    """For `tools/call`: the tool's exact name; None (or `*`) matches any tool."""
    arguments: tuple[tuple[str, Matcher], ...] = ()
    """For `tools/call`: (name, matcher) per argument; the rule matches only when every one
    is present in `params.arguments` and matches (see `linpodx.profile.mcprule`)."""
    rate: Rate | None = None
    """For `auto_allow`: at most this many of the rule's matches per window and session;
    past it the decision is `prompt`."""

    def to_dict(self) -> dict[str, Any]:
        """The stored form; `arguments` and `rate` only when set, so that a rule without them
        keeps the form (and a revision its digest) it had before they existed."""
        d: dict[str, Any] = {
            "method": self.method,
            "tool_name": self.tool_name,
            "decision": self.decision.value,
        }
        if self.arguments:
            d["arguments"] = {name: m.to_dict() for name, m in self.arguments}
        if self.rate is not None:
            d["rate"] = self.rate.text
        return d


@dataclass(frozen=True)
class McpSettings:
    """How the MCP bridge behaves beyond the rules."""

    approval_timeout_seconds: int = 30
    """How long a `prompt` waits for a person before it is denied."""
    max_line_bytes: int = 4 * 1024 * 1024
    """Longest JSON-RPC line accepted in either direction; longer lines are dropped."""
    allow_server_requests: tuple[str, ...] = ()
    """Server→client request methods let through (e.g. `sampling/createMessage`); others denied."""
    record_arguments: bool = False
    """Record tool-call arguments in full in the audit log (by digest otherwise)."""
    drop_records_per_second: int = 100
    """Records of refused or dropped messages per second and direction; the rest summarised."""
    audit_max_bytes: int = 1024 * 1024 * 1024
    """Size of a session's audit log at which the session ends (closed, with a last record)."""
    stderr_bytes_per_second: int = 64 * 1024
    """Bytes of the server's stderr passed on per second; the rest dropped and counted."""


@dataclass(frozen=True)
class Audit:
    """Audit settings."""

    hash_chain: bool = True
    """Keep the session's hash chain. linpodx refuses profiles that turn it off (fail closed)."""


@dataclass(frozen=True)
class Resources:
    """Limits; defaults fit under this kind of host's hard limits."""

    memory: str | None = None
    """podman `--memory` value (`512m`, `2g`); None: not set by the profile (linpodx applies
    `flags.DEFAULT_MEMORY` where the host can, and never refuses a run for it)."""
    cpus: str | None = None
    """podman `--cpus` value, a decimal string; None: not set (`flags.DEFAULT_CPUS`)."""
    pids_limit: int | None = None
    """None: not set (`flags.DEFAULT_PIDS_LIMIT`)."""
    nofile: int = 1024
    """RLIMIT_NOFILE soft=hard inside the container."""
    nproc: int = 4096
    """RLIMIT_NPROC soft=hard inside the container."""
    enforcement: str = "required"
    """`required`: a run whose cgroup limits (memory, cpus, pids_limit) this host cannot apply
    is refused; `best_effort`: it goes ahead without them, and its record says which."""
    log_max_size: str = "64m"
    """Bound of the container's log file (podman `--log-opt max-size`, k8s-file driver): at
    the bound conmon truncates the file and goes on writing, so it never holds more."""
    snapshot_max_size: str = "16g"
    """Bound of one snapshot: the container's changes (apparent size, as `podman commit`
    writes them) plus the workspace archives; `snapshot create` refuses above it."""


@dataclass(frozen=True)
class Profile:
    """A validated sandbox profile."""

    name: str
    description: str = ""
    mounts: tuple[Mount, ...] = ()
    network: Network = field(default_factory=Network)
    mcp_policy: tuple[McpRule, ...] = ()
    mcp: McpSettings = field(default_factory=McpSettings)
    audit: Audit = field(default_factory=Audit)
    resources: Resources = field(default_factory=Resources)
    cap_add: tuple[str, ...] = ()
    """Capabilities added back after dropping all (upper-case, without `CAP_`)."""
    env: tuple[tuple[str, str], ...] = ()
    """The only environment variables set in the container (host env never leaks in)."""
    workdir: str | None = None
    """Working directory inside the container."""
    version: int = SCHEMA_VERSION

    def to_dict(self) -> dict[str, Any]:
        """Normalized, JSON-ready form (what the store hashes and keeps)."""
        d = asdict(self)
        d["mcp_policy"] = [r.to_dict() for r in self.mcp_policy]
        d["env"] = {k: v for k, v in self.env}
        return d

    def digest_form(self) -> dict[str, Any]:
        """`to_dict()` without the keys added after revisions were first stored, where they
        hold their default (LATER_DEFAULTS): the form the store hashes. A revision stored
        before such a key existed means its default, and keeps its digest."""
        d = self.to_dict()
        for (section, key), default in LATER_DEFAULTS.items():
            if d[section].get(key) == default:
                del d[section][key]
        return d


LATER_DEFAULTS: dict[tuple[str, str], object] = {
    ("network", "wildcard_budget"): Network.wildcard_budget,
    ("network", "max_connections"): Network.max_connections,
    ("network", "max_new_connections_per_second"): Network.max_new_connections_per_second,
    ("resources", "log_max_size"): Resources.log_max_size,
    ("resources", "snapshot_max_size"): Resources.snapshot_max_size,
}
"""(section, key) -> default, for keys the profile gained after its first release."""


def default_profile() -> Profile:
    """The built-in profile used by `linpodx run` without `--profile`: no mounts, no network,
    every MCP request beyond the handshake denied."""
    return Profile(
        name="default",
        description="built-in: no mounts, no network, MCP default deny",
        mcp_policy=(McpRule(method="*", decision=Decision.DENY),),
    )


BUILTIN_ID = "builtin"
"""profile_id label of containers run under the built-in default profile (not in the store)."""


@dataclass(frozen=True)
class ProfileRef:
    """The profile revision a container runs under (same fields as the store's StoredProfile)."""

    profile: Profile
    name: str
    profile_id: str
    revision: int
    audit_hash: str
    applied_at: str = ""


def builtin_ref() -> ProfileRef:
    """The built-in default profile as a revision: id `builtin`, revision 0, hash of its form."""
    prof = default_profile()
    digest = hashlib.sha256(canonical_bytes(prof.to_dict())).hexdigest()
    return ProfileRef(
        profile=prof, name=prof.name, profile_id=BUILTIN_ID, revision=0, audit_hash=digest
    )
