"""The container service sits below snapshot (which recreates containers through it): loading
it must not load the snapshot package, nor the audit chain and the store it asks for only when
it acts (the fast run path imports it while podman starts)."""

from __future__ import annotations

import subprocess
import sys


def test_the_container_service_loads_no_snapshot_module() -> None:
    code = (
        "import sys, linpodx.containers\n"
        "print(' '.join(sorted(m for m in sys.modules if m.startswith('linpodx.'))))"
    )
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stderr
    loaded = set(res.stdout.split())
    assert "linpodx.containers.pipeline" in loaded
    assert not {m for m in loaded if m.startswith("linpodx.snapshot")}
    assert not {"linpodx.audit.chain", "linpodx.profile.store", "linpodx.egress.guard"} & loaded
