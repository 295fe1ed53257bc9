"""Hash-chained audit logs: one admin chain, one chain per MCP session.

The API is in `linpodx.audit.chain` (import it from there); `linpodx.audit.core` is the
byte-level append it builds on. This package imports neither, so that importing `core` alone
stays cheap (`linpodx.fastpath`).
"""
