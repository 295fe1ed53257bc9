"""The egress guard process: `python -m linpodx.egress.guardproc --container NAME …`.

Imports the guard (`linpodx.egress.runner`) at a lower CPU priority (`linpodx.yielding`): the
guard is started before podman and imports while podman creates the container, which needs
the CPU more. Then runs it at the caller's priority.
"""

from __future__ import annotations

import sys

from linpodx.yielding import import_yielding


def main() -> int:
    [runner] = import_yielding(("linpodx.egress.runner",))
    code: int = runner.main(sys.argv[1:])
    return code


if __name__ == "__main__":
    raise SystemExit(main())
