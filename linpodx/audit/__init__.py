"""Hash-chained audit logs: one admin chain, one chain per MCP session (see chain.py)."""

from __future__ import annotations

from linpodx.audit.chain import (
    Chain,
    Record,
    VerifyReport,
    admin_chain,
    anchor_session,
    open_session,
    session_chain,
    verify_file,
)

__all__ = [
    "Chain",
    "Record",
    "VerifyReport",
    "admin_chain",
    "anchor_session",
    "open_session",
    "session_chain",
    "verify_file",
]
