"""`linpodx audit …` commands."""

from __future__ import annotations

from linpodx.cli.common import new_app

app = new_app("audit commands (not built yet).")
