"""Benchmark: `linpodx run --rm --profile P --image I true` vs `podman run --rm`, same flags.

Both are measured in the same run, alternating (and swapping which goes first each round), so
machine load affects both alike. The podman baseline uses exactly the flags linpodx passes (taken
from the pure argv builder), so the ratio is linpodx's own cost: Python start-up, the stored run
plan and the fsynced audit record before podman starts, loading and checking the profile, the
run spec and relaying the container's output while podman works (linpodx/fastpath/; a
foreground `--rm` run without a TTY is one `podman run`, like the baseline).

Run it from a plain install (`pip install .`) as people get linpodx: an editable install adds
an import hook to every Python start-up (~20 ms here).

    python bench/bench_run.py [--rounds 15] [--image IMAGE] [--mount]

`--mount` gives the profile a read-only project mount, as the walk-through's has: linpodx then
pins it, opens its mount gate and runc runs the mount-check hook (linpodx/podman/mountpin.py);
the baseline mounts the same directory, with neither hook nor gate.

Prints each median and the median ratio (target ≤ 1.25). Not a test: nothing here asserts.
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
from pathlib import Path

DEFAULT_IMAGE = os.environ.get("LINPODX_TEST_BUSYBOX", "localhost/linpodx-test/busybox:latest")
PROFILE = """version: 1
name: bench
description: benchmark profile (no mounts, no network)
"""


def timed(argv: list[str], env: dict[str, str]) -> float:
    t0 = time.perf_counter()
    res = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=300)
    dt = time.perf_counter() - t0
    if res.returncode != 0:
        sys.exit(f"bench: {' '.join(argv[:6])}… failed ({res.returncode}): {res.stderr.strip()}")
    return dt


def main() -> int:
    state = Path(tempfile.mkdtemp(prefix="linpodx-bench-run-"))
    try:
        return bench(state)
    finally:
        shutil.rmtree(state, ignore_errors=True)
        shutil.rmtree(state.with_name(state.name + "-project"), ignore_errors=True)


def bench(state: Path) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--image", default=DEFAULT_IMAGE)
    ap.add_argument("--mount", action="store_true", help="a read-only project mount")
    args = ap.parse_args()

    env = {**os.environ, "LINPODX_STATE_DIR": str(state)}
    os.environ["LINPODX_STATE_DIR"] = str(state)
    prof = state / "bench.yml"
    text = PROFILE
    if args.mount:
        # Beside the state dir, not in it (linpodx refuses to mount its own state).
        project = state.with_name(state.name + "-project")
        project.mkdir()
        text += f"mounts:\n  - source: {project}\n    target: /workspace\n"
    prof.write_text(text)
    # The `linpodx` command itself (the console script next to this interpreter), as a person
    # runs it; `python -m linpodx` where it is not installed as a script.
    script = Path(sys.executable).with_name("linpodx")
    lpx = [str(script)] if script.exists() else [sys.executable, "-m", "linpodx"]
    subprocess.run([*lpx, "sandbox", "apply", "--profile", str(prof)], env=env, check=True,
                   capture_output=True)  # fmt: skip

    # The baseline: the very argv linpodx builds for this profile, as one `podman run`.
    from linpodx import containers
    from linpodx.podman import runline
    from linpodx.podman.argv import build_create_argv

    ref = containers.resolve_profile("bench")
    req = containers.RunRequest(image=args.image, name="lpx-bench-base", command=("true",), rm=True)
    spec = containers.make_spec(req, ref)
    base_argv = list(build_create_argv(spec))
    base_argv[0] = "run"
    # No name, and no mount gate (linpodx's own, opened only for its starts: its cost is ours).
    gate = f"destination={runline.GATE_DEST},"
    base_argv = [a for a in base_argv if not a.startswith("--name=") and gate not in a]
    podman = ["podman", *base_argv]
    linpodx = [*lpx, "run", "--rm", "--profile", "bench", "--image", args.image, "--", "true"]
    startup = [*lpx, "version"]
    # Python start-up plus what the fast path imports before podman starts, and nothing else.
    imports = [sys.executable, "-c", "import linpodx.cli.main, linpodx.fastpath.argv, "
               "linpodx.fastpath.run"]  # fmt: skip

    # Warm-up (image layers, page cache, python bytecode).
    timed(podman, env)
    timed(linpodx, env)
    t_lpx: list[float] = []
    t_pod: list[float] = []
    t_start: list[float] = []
    t_imports: list[float] = []
    for i in range(args.rounds):
        order = [("lpx", linpodx), ("pod", podman)]
        if i % 2:
            order.reverse()
        for which, argv in order:
            (t_lpx if which == "lpx" else t_pod).append(timed(argv, env))
        t_start.append(timed(startup, env))
        t_imports.append(timed(imports, env))
    m_lpx, m_pod, m_start, m_imp = (
        statistics.median(x) for x in (t_lpx, t_pod, t_start, t_imports)
    )
    ratios = [a / b for a, b in zip(t_lpx, t_pod, strict=True)]
    print(f"rounds:                  {args.rounds} (alternating), image {args.image}")
    shape = "one read-only mount (pinned)" if args.mount else "no mounts"
    print(f"profile:                 {shape}")
    print(f"linpodx command:         {' '.join(lpx)}")
    print(f"podman run --rm (median): {m_pod:.3f} s")
    print(f"linpodx run --rm (median): {m_lpx:.3f} s")
    print(f"linpodx version (median): {m_start:.3f} s  (Python + the typer CLI, for comparison)")
    print(f"fast-path imports (median): {m_imp:.3f} s  (Python start-up + imports before podman)")
    print(f"ratio of medians:        {m_lpx / m_pod:.2f}  (target <= 1.25)")
    print(f"median per-round ratio:  {statistics.median(ratios):.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
