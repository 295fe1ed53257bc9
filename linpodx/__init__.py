"""linpodx: run an AI agent inside a rootless Podman sandbox, with no resident daemon."""

from __future__ import annotations

__version__ = "0.1.0"
