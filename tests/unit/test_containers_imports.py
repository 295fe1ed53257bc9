"""The container service sits below snapshot (which recreates containers through it): loading
it must not load the snapshot package, nor the audit chain and the store it asks for only when
it acts (the fast run path imports it while podman starts)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path


def _in_a_fresh_interpreter(code: str, env: dict[str, str] | None = None) -> str:
    """What `code` prints, run by a new interpreter (nothing of linpodx loaded before it)."""
    res = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, env=env
    )
    assert res.returncode == 0, res.stderr
    return res.stdout


def test_the_container_service_loads_no_snapshot_module() -> None:
    code = (
        # The package loads its names on first use: load the service's modules themselves.
        "import sys, linpodx.containers.pipeline, linpodx.containers.manage\n"
        "print(' '.join(sorted(m for m in sys.modules if m.startswith('linpodx.'))))"
    )
    loaded = set(_in_a_fresh_interpreter(code).split())
    assert "linpodx.containers.pipeline" in loaded
    assert not {m for m in loaded if m.startswith("linpodx.snapshot")}
    assert not {"linpodx.audit.chain", "linpodx.profile.store", "linpodx.egress.guard"} & loaded


def test_ps_loads_the_listing_alone() -> None:
    """`linpodx ps` (bench/bench_cli.py: <= 2x `podman ps`) loads the listing, not the run
    pipeline, the plan, the CLI framework or the schema checker (~0.1 s of imports)."""
    code = (
        "import sys\n"
        "from linpodx.cli import pscmd\n"
        "import linpodx.containers\n"  # the package itself loads its names on first use
        "from linpodx.containers import listing\n"
        "print(' '.join(sorted(sys.modules)))"
    )
    loaded = set(_in_a_fresh_interpreter(code).split())
    assert "linpodx.containers.listing" in loaded
    heavy = {"linpodx.containers.pipeline", "linpodx.containers.plan", "linpodx.containers.state",
             "linpodx.egress.guard", "linpodx.podman.argv", "linpodx.profile.model", "typer",
             "rich", "jsonschema"}  # fmt: skip
    assert not heavy & loaded, heavy & loaded


def test_ps_reads_each_guard_state_without_the_guard(tmp_path: Path) -> None:
    """Each row's egress column reads the guard's own files (`egress.state`); the guard's
    machinery (netns and ctypes, name locks) and `dataclasses` cost `ps` ~20 ms to import."""
    egress = tmp_path / "containers" / "agent-1" / "egress"
    egress.mkdir(parents=True)
    (egress / "policy.json").write_text("{}")
    (egress / "guard.json").write_text(json.dumps({"state": "ready", "guard_pid": 1}))
    code = (
        "import sys\n"
        "from linpodx.containers import listing\n"
        "print(listing.egress_status('agent-1'))\n"
        "print(' '.join(sorted(sys.modules)))"
    )
    env = {**os.environ, "LINPODX_STATE_DIR": str(tmp_path)}
    status, modules = _in_a_fresh_interpreter(code, env).splitlines()
    assert status == "down"  # pid 1 is not this container's guard
    heavy = {"linpodx.egress.guard", "linpodx.egress.netns", "linpodx.namelock", "ctypes",
             "dataclasses"}  # fmt: skip
    assert not heavy & set(modules.split()), heavy & set(modules.split())
