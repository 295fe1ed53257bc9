"""The grammar of an egress allowlist entry, `NAME[:PORT[/KIND]]`.

A rule of the profile language: the loader normalizes entries with it when a profile is
applied, and the egress guard (`linpodx.egress.policy`) matches connections against the rules.
"""

from __future__ import annotations

from dataclasses import dataclass

KINDS = ("tls", "http", "tcp")
"""What a connection under an entry carries and how it is checked: `tls` (the ClientHello's
server name), `http` (every request's Host), `tcp` (nothing but the address: weaker)."""
DEFAULT_PORT = 443


@dataclass(frozen=True)
class Rule:
    """One parsed allowlist entry: a name (exact, or `*.suffix`) on one port, of one kind."""

    name: str
    """Normalized: lower case, no trailing dot; `*.example.com` for a wildcard."""
    port: int
    kind: str
    """One of KINDS."""

    def matches(self, name: str) -> bool:
        """`name` (normalized) is this rule's name, or a strict subdomain of its wildcard."""
        if self.name.startswith("*."):
            return name.endswith(self.name[1:]) and len(name) > len(self.name) - 1
        return name == self.name

    def text(self) -> str:
        """The canonical entry (`NAME` for TLS on 443, `NAME:PORT`, `NAME:PORT/KIND`)."""
        if self.kind == "tls":
            return self.name if self.port == DEFAULT_PORT else f"{self.name}:{self.port}"
        return f"{self.name}:{self.port}/{self.kind}"


def split_entry(raw: str) -> tuple[str, int, str]:
    """`NAME`, `NAME:PORT`, `NAME:PORT/KIND` -> (name as written, port, kind); ValueError
    with a message for anything else. The name itself is checked by the caller."""
    text = raw.strip()
    kind = "tls"
    if "/" in text:
        text, _, kind = text.partition("/")
        if kind not in KINDS:
            raise ValueError(f"unknown kind {kind!r} (use /http, /tcp, or nothing for TLS)")
        if ":" not in text:
            raise ValueError(f"/{kind} needs a port (`NAME:PORT/{kind}`)")
    port = DEFAULT_PORT
    if ":" in text:
        text, _, digits = text.rpartition(":")
        if not digits.isascii() or not digits.isdigit() or len(digits) > 5:
            raise ValueError(f"port {digits!r} is not a number")
        port = int(digits)
        if not 0 < port < 65536:
            raise ValueError(f"port {port} is out of range (1-65535)")
    return text, port, kind
