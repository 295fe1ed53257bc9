"""The network helper's own limits (issue 25, item 3): from the profile to the policy file to
the helper process, on real child processes (the flood itself: the integration test)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from linpodx import proc
from linpodx.egress import netns, runner
from linpodx.errors import EngineError, ProfileError


def _limits(pid: int) -> tuple[str, str]:
    files = memory = ""
    for line in Path(f"/proc/{pid}/limits").read_text().splitlines():
        if line.startswith("Max open files"):
            files = " ".join(line.split()[3:5])
        if line.startswith("Max address space"):
            memory = " ".join(line.split()[3:5])
    return files, memory


def test_defaults_agree_everywhere_and_reach_the_policy_file() -> None:
    from linpodx.podman import flags
    from linpodx.profile import loader
    from linpodx.profile.model import Network
    from linpodx.snapshot import egresskeep

    props = loader.schema()["properties"]["network"]["properties"]
    assert (
        props["helper_max_files"]["default"]
        == Network().helper_max_files
        == flags.HELPER_MAX_FILES_DEFAULT
        == netns.HELPER_MAX_FILES_DEFAULT
    )
    assert (
        props["helper_max_memory_mib"]["default"]
        == Network().helper_max_memory_mib
        == flags.HELPER_MAX_MEMORY_MIB_DEFAULT
        == netns.HELPER_MAX_MEMORY_MIB_DEFAULT
    )
    net = {"egress_dns_allowlist": ["a.test"], "upstream_dns": [], "allow_private_answers": False,
           "helper_max_files": 300, "helper_max_memory_mib": 200}  # fmt: skip
    doc = flags.egress_policy("p", "prof_X", 1, net)
    assert runner._helper_limits(doc) == netns.HelperLimits(300, 200)
    egresskeep.check(doc)  # a rollback keeps such a policy file
    # A policy file written before the limits existed (or holding nonsense): the defaults.
    old = {k: v for k, v in doc.items() if not k.startswith("helper_")}
    egresskeep.check(old)
    want = netns.HelperLimits(netns.HELPER_MAX_FILES_DEFAULT, netns.HELPER_MAX_MEMORY_MIB_DEFAULT)
    assert runner._helper_limits(old) == want
    assert runner._helper_limits({"helper_max_files": True, "helper_max_memory_mib": -1}) == want


def test_limits_in_a_profile_file(tmp_path: Path) -> None:
    from linpodx.profile.loader import load_file

    f = tmp_path / "p.yml"
    f.write_text("name: c\nnetwork:\n  egress_dns_allowlist: [a.test]\n"
                 "  helper_max_files: 100\n  helper_max_memory_mib: 300\n")  # fmt: skip
    net = load_file(f).network
    assert (net.helper_max_files, net.helper_max_memory_mib) == (100, 300)
    for bad in ("helper_max_files: 10", "helper_max_memory_mib: 1", "helper_max_files: 1.5"):
        f.write_text(f"name: c\nnetwork:\n  egress_dns_allowlist: [a.test]\n  {bad}\n")
        with pytest.raises(ProfileError) as refused:
            load_file(f)
        assert bad.split(":")[0] in " ".join(refused.value.problems), refused.value.problems


def test_limit_helper_sets_both_on_a_real_process_and_fails_closed() -> None:
    child = proc.popen(["sleep", "30"], stdin=subprocess.DEVNULL)
    try:
        netns.limit_helper(child.pid, netns.HelperLimits(100, 256))
        assert _limits(child.pid) == ("100 100", f"{256 << 20} {256 << 20}")
    finally:
        child.kill()
        child.wait()
    # Gone (or not ours to limit): an error, never a helper left unbounded in silence.
    with pytest.raises(EngineError) as failed:
        netns.limit_helper(child.pid, netns.HelperLimits(100, 256))
    assert "could not limit the network helper" in failed.value.message


def test_pasta_keeper_starts_pasta_under_the_limits(tmp_path: Path) -> None:
    """The keeper sets them on itself before it starts pasta, so pasta is bounded from its
    first descriptor (it opens pools of sockets at start)."""
    watched = proc.popen(["sleep", "30"], stdin=subprocess.DEVNULL)
    out = tmp_path / "limits"
    pasta = ["sh", "-c", f"cat /proc/self/limits > {out}"]
    argv = netns.keeper_argv(
        os.getpid(), watched.pid, tmp_path / "pid", pasta, netns.HelperLimits(80, 300)
    )
    assert argv[0] == sys.executable
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=30)
    finally:
        watched.kill()
        watched.wait()
    assert done.returncode == 0, done.stderr
    text = out.read_text()
    assert any(ln.startswith("Max open files") and ln.split()[3:5] == ["80", "80"]
               for ln in text.splitlines()), text  # fmt: skip
    want = [str(300 << 20)] * 2
    assert any(ln.startswith("Max address space") and ln.split()[3:5] == want
               for ln in text.splitlines()), text  # fmt: skip

