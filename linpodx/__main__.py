"""`python -m linpodx`."""

from __future__ import annotations

from linpodx.cli.main import main

if __name__ == "__main__":
    raise SystemExit(main())
