"""`python -m linpodx`."""

from __future__ import annotations

from linpodx.cli.main import entry

if __name__ == "__main__":
    entry()
