"""`linpodx sandbox …` commands."""

from __future__ import annotations

from linpodx.cli.common import new_app

app = new_app("sandbox commands (not built yet).")
