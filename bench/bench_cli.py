"""Benchmark: the CLI's own start-up against podman's, for the commands people run most.

- `linpodx --help` vs `podman --help` (target: median ratio ≤ 3);
- `linpodx ps` vs `podman ps --filter label=linpodx.managed=1` (target ≤ 2), with N
  linpodx containers running (made here under a state dir of this run, removed after).

Each pair is measured in the same run, alternating (and swapping which goes first each round),
so machine load affects both alike. Run it from a plain install (`pip install .`) as people get
linpodx: an editable install adds an import hook to every Python start-up.

    python bench/bench_cli.py [--rounds 21] [--containers 3] [--image IMAGE]

Prints each median and the median ratio. Not a test: nothing here asserts.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

DEFAULT_IMAGE = os.environ.get("LINPODX_TEST_BUSYBOX", "localhost/linpodx-test/busybox:latest")


def linpodx() -> list[str]:
    found = shutil.which("linpodx")
    return [found] if found else [sys.executable, "-m", "linpodx"]


def timed(argv: list[str], env: dict[str, str]) -> float:
    t0 = time.perf_counter()
    res = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=300)
    dt = time.perf_counter() - t0
    if res.returncode != 0:
        sys.exit(f"bench: {' '.join(argv[:6])} failed ({res.returncode}): {res.stderr.strip()}")
    return dt


def pair(
    name: str, ours: list[str], theirs: list[str], env: dict[str, str], rounds: int
) -> float:
    """Alternate the two commands `rounds` times; print the medians and return the ratio."""
    a: list[float] = []
    b: list[float] = []
    for i in range(rounds):
        order = [(ours, a), (theirs, b)] if i % 2 == 0 else [(theirs, b), (ours, a)]
        for argv, out in order:
            out.append(timed(argv, env))
    ratio = statistics.median(x / y for x, y in zip(a, b, strict=True))
    print(
        f"{name}: linpodx {statistics.median(a) * 1000:.1f} ms, baseline "
        f"{statistics.median(b) * 1000:.1f} ms, median ratio {ratio:.2f}"
    )
    return ratio


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--rounds", type=int, default=21)
    ap.add_argument("--containers", type=int, default=3)
    ap.add_argument("--image", default=DEFAULT_IMAGE)
    opts = ap.parse_args()
    state = Path(tempfile.mkdtemp(prefix="linpodx-bench-cli-"))
    env = {**os.environ, "LINPODX_STATE_DIR": str(state), "LINPODX_PULL": "never"}
    env.pop("COLUMNS", None)
    names = [f"lpx-bench-cli-{uuid.uuid4().hex[:8]}" for _ in range(opts.containers)]
    try:
        # Warm both (page cache, podman's storage) before timing.
        for argv in (["podman", "--help"], [*linpodx(), "--help"]):
            timed(argv, env)
        pair("--help", [*linpodx(), "--help"], ["podman", "--help"], env, opts.rounds)
        for name in names:
            timed(
                [*linpodx(), "run", "-d", "--name", name, "--image", opts.image, "--",
                 "sleep", "3600"],
                env,
            )  # fmt: skip
        ps_podman = ["podman", "ps", "--filter", "label=linpodx.managed=1"]
        timed([*linpodx(), "ps"], env)
        pair(f"ps ({len(names)} of ours running)", [*linpodx(), "ps"], ps_podman, env, opts.rounds)
    finally:
        for name in names:
            subprocess.run(
                [*linpodx(), "rm", "--force", name], env=env, capture_output=True, timeout=120
            )
        shutil.rmtree(state, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
