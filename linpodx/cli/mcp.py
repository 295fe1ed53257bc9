"""`linpodx mcp …` commands."""

from __future__ import annotations

from linpodx.cli.common import new_app

app = new_app("mcp commands (not built yet).")
