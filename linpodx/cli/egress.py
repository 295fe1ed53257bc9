"""Egress commands (internal helpers of the egress guard live here too)."""

from __future__ import annotations

import typer


def register(app: typer.Typer) -> None:
    """Add this module's commands to the top-level app."""
