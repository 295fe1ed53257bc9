"""`linpodx snapshot …` commands."""

from __future__ import annotations

from linpodx.cli.common import new_app

app = new_app("snapshot commands (not built yet).")
