"""Issue 25 #1: what a peer can make `mcp attach` write is bounded. A server that floods
invalid lines, answers to ids nobody asked for and stderr (which produced a 212 MB session
log and 75 MB of stderr in 20 s) is measured against the profile's bounds; the session log's
size bound ends a session closed; and a normal session is far from every bound."""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path

import pytest

from linpodx.audit import chain as audit_chain
from linpodx.profile.model import McpSettings
from tests.conftest import DEBIAN_IMAGE
from tests.integration.test_bounds import fill, small_state  # noqa: F401 - a fixture
from tests.servers.harness import (
    TEST_PROFILE,
    RawSession,
    linpodx,
    server_log,
    start_server_container,
)

pytestmark = pytest.mark.podman

FLOOD_SRC = Path(__file__).parents[1] / "servers" / "flood_server.py"
FLOOD_PATH = "/tmp/flood.py"
DEFAULTS = McpSettings()


def copy_flood(name: str) -> None:
    subprocess.run(
        ["podman", "cp", str(FLOOD_SRC), f"{name}:{FLOOD_PATH}"],
        check=True,
        capture_output=True,
        timeout=60,
    )


def test_a_flooding_server_is_held_to_the_bounds(tmp_path: Path, unique_name: str) -> None:
    start_server_container(tmp_path, unique_name, DEBIAN_IMAGE)
    copy_flood(unique_name)
    seconds = 6.0
    t0 = time.monotonic()
    s = RawSession(unique_name, ["python3", FLOOD_PATH, "garbage,ids,stderr", str(seconds)])
    try:
        sid = s.session_id()
        code = s.proc.wait(120)
    finally:
        s.kill()
    s._e.join(10)
    took = time.monotonic() - t0
    assert took >= seconds and code == 0, s.stderr[-2000:]
    records = audit_chain.read_records(audit_chain.session_path(sid))
    types = [r.type for r in records]
    windows = took + 2  # every one-second window the session can have touched
    # Records of dropped messages: at most the rate in each window, the rest summarised.
    one_by_one = types.count("mcp.invalid") + types.count("mcp.drop")
    assert 0 < one_by_one <= DEFAULTS.drop_records_per_second * windows, one_by_one
    summaries = [r.data for r in records if r.type == "mcp.suppressed"]
    held = sum(d["count"] for d in summaries)
    assert summaries and len(summaries) <= windows
    assert held > 20 * one_by_one  # the flood was far over the bound
    close = records[-1]
    assert close.type == "session.close" and close.data["suppressed"] == held
    size = audit_chain.session_path(sid).stat().st_size
    # (unbounded, the same flood wrote ~10 MB a second)
    assert size < 400 * windows * (DEFAULTS.drop_records_per_second + 10), size
    # stderr: the server's lines at most the rate; the bridge's own lines about drops and
    # summaries are bounded with the records.
    err = s.stderr
    server_lines = [x for x in err.splitlines() if x.startswith(b"EEEE")]
    assert sum(len(x) + 1 for x in server_lines) <= DEFAULTS.stderr_bytes_per_second * windows
    assert len(err) <= DEFAULTS.stderr_bytes_per_second * windows + 200 * windows * (
        2 * DEFAULTS.drop_records_per_second + 10
    ), len(err)
    assert b"of the server's stderr not shown (over mcp.stderr_bytes_per_second" in err
    stderr_held = [r.data for r in records if r.type == "mcp.stderr_suppressed"]
    assert stderr_held and all(d["bytes"] > 0 for d in stderr_held)
    assert linpodx("audit", "verify", "--session", sid).returncode == 0


def test_the_session_ends_closed_at_its_size_bound(tmp_path: Path, unique_name: str) -> None:
    bound = 65536
    profile = TEST_PROFILE + f"  audit_max_bytes: {bound}\n"
    start_server_container(tmp_path, unique_name, DEBIAN_IMAGE, profile_text=profile)
    s = RawSession(unique_name)
    answered = 0
    try:
        s.handshake()
        sid = s.session_id()
        while True:
            resp = s.request(answered + 1, "ping")
            if "error" in resp:
                assert "mcp.audit_max_bytes" in resp["error"]["message"], resp
                break
            answered += 1
            assert answered < 5000, "the bound was never met"
        code = s.proc.wait(60)
    finally:
        s.kill()
    s._e.join(10)
    assert code == 1, s.stderr[-2000:]
    err = s.stderr.decode()
    assert "error: the session ended: audit log size bound reached" in err, err[-2000:]
    path = audit_chain.session_path(sid)
    size = path.stat().st_size
    assert bound <= size < bound + 4096, size
    records = audit_chain.read_records(path)
    close = records[-1]
    assert close.type == "session.close"
    assert close.data["reason"] == (
        f"audit log size bound reached (mcp.audit_max_bytes = {bound} bytes)"
    )
    assert linpodx("audit", "verify", "--session", sid).returncode == 0


def test_a_long_normal_session_stays_far_from_every_bound(tmp_path: Path, unique_name: str) -> None:
    """The defaults are generous: a session of real calls through the SDK test server, with
    its stderr logging, summarises nothing, and at its bytes per call the default size bound
    holds over a million calls."""
    start_server_container(tmp_path, unique_name, DEBIAN_IMAGE)
    s = RawSession(unique_name)
    calls = 1500
    try:
        s.handshake()
        sid = s.session_id()
        path = audit_chain.session_path(sid)
        before = path.stat().st_size
        assert s.request("list", "tools/list")["result"]["tools"]
        for i in range(calls):
            resp = s.request(
                i, "tools/call", {"name": "echo", "arguments": {"text": f"call {i} " * 20}}
            )
            assert resp["result"]["content"][0]["text"].startswith("echo:call"), resp
        after = path.stat().st_size
        assert s.close() == 0
    finally:
        s.kill()
    per_call = (after - before) / calls
    assert DEFAULTS.audit_max_bytes / per_call > 1_000_000, per_call
    types = [r.type for r in audit_chain.read_records(path)]
    assert "mcp.suppressed" not in types and "mcp.stderr_suppressed" not in types
    assert b"not shown (over" not in s.stderr and b"not recorded one by one" not in s.stderr


def _rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise AssertionError("no VmRSS")


def test_requests_the_client_never_answers_do_not_grow_the_bridge(
    tmp_path: Path, unique_name: str
) -> None:
    """The server's requests in flight had no bound: 4,146 requests with 16 KB ids that the
    client never answers stayed in the bridge's memory (66 MB of ids; megabyte ids made it
    gigabytes). Past 4,096 the server is refused, and a long id is kept by its digest."""
    profile = TEST_PROFILE + "  allow_server_requests: [roots/list]\n"
    start_server_container(tmp_path, unique_name, DEBIAN_IMAGE, profile_text=profile)
    s = RawSession(unique_name)
    try:
        s.handshake()
        before = _rss_kib(s.proc.pid)
        args = {"name": "emit_raw", "arguments": {"kind": "roots_many"}}
        r = s.request(1, "tools/call", args, 180)
        assert r["result"]["content"][0]["text"] == "emitted roots_many", r
        after = _rss_kib(s.proc.pid)
        asked = [m for m in s.others if m.get("method") == "roots/list"]
        assert len(asked) == 4096, len(asked)
        assert s.close(60) == 0, s.stderr[-2000:]
    finally:
        s.kill()
    assert after - before < 30 * 1024, (before, after)
    got = [json.loads(x) for x in server_log(unique_name).splitlines() if x.strip()]
    refused = [m for m in got if m.get("error", {}).get("code") == -32600]
    assert len(refused) == 50 and refused[0]["id"].startswith("roots/list-4096-"), refused[:1]


def test_a_ping_flood_from_the_server_is_held_to_the_rate(tmp_path: Path, unique_name: str) -> None:
    """Each of the server's pings was a decision record and a forward (with a client that
    answers, an answer record too): ~700 bytes each, as fast as the client answered. Past
    mcp.drop_records_per_second a second they are refused and summarised.

    At a rate of 10 (not the default 100): every admitted ping costs durable records, and on
    a disk where an fsync takes 20 ms a flood of 4,146 that stays under 100 a second took
    minutes to get through; the bound is the same code at any rate."""
    rate = 10
    profile = TEST_PROFILE + f"  drop_records_per_second: {rate}\n"
    start_server_container(tmp_path, unique_name, DEBIAN_IMAGE, profile_text=profile)
    s = RawSession(unique_name)
    try:
        s.handshake()
        sid = s.session_id()
        t0 = time.monotonic()
        r = s.request(1, "tools/call", {"name": "emit_raw", "arguments": {"kind": "pings"}}, 180)
        took = time.monotonic() - t0
        assert r["result"]["content"][0]["text"] == "emitted pings", r
        asked = [m for m in s.others if m.get("method") == "ping"]
        assert s.close(60) == 0, s.stderr[-2000:]
    finally:
        s.kill()
    assert 0 < len(asked) <= rate * (took + 2), (len(asked), took)
    got = [json.loads(x) for x in server_log(unique_name).splitlines() if x.strip()]
    refused = [m for m in got if m.get("error", {}).get("code") == -32600]
    assert len(refused) + len(asked) == 4146
    records = audit_chain.read_records(audit_chain.session_path(sid))
    pings = [r for r in records if r.type == "mcp.request" and r.data.get("method") == "ping"]
    assert len(pings) == len(asked)
    held = sum(r.data["count"] for r in records if r.type == "mcp.suppressed")
    one_by_one = sum(1 for r in records if r.type == "mcp.invalid")
    assert held + one_by_one == len(refused)


def test_a_storm_of_bogus_cancellations_is_neither_forwarded_nor_recorded_one_by_one(
    tmp_path: Path, unique_name: str
) -> None:
    """Each `notifications/cancelled` naming no request in flight was forwarded with a decision
    record of its own, past every per-second bound."""
    start_server_container(tmp_path, unique_name, DEBIAN_IMAGE)
    s = RawSession(unique_name)
    storm = 5000
    try:
        s.handshake()
        sid = s.session_id()
        t0 = time.monotonic()
        data = b"".join(
            b'{"jsonrpc":"2.0","method":"notifications/cancelled","params":{"requestId":%d,'
            b'"reason":"M-BOGUS"}}\n' % i
            for i in range(storm)
        )
        assert s.proc.stdin is not None
        s.proc.stdin.write(data)
        s.proc.stdin.flush()
        assert s.request("after", "ping", timeout=120)["result"] == {}
        took = time.monotonic() - t0
        assert s.close() == 0, s.stderr[-2000:]
    finally:
        s.kill()
    assert b"M-BOGUS" not in server_log(unique_name)
    records = audit_chain.read_records(audit_chain.session_path(sid))
    drops = [r for r in records if r.type == "mcp.drop"]
    assert 0 < len(drops) <= DEFAULTS.drop_records_per_second * (took + 2), len(drops)
    assert not [
        r
        for r in records
        if r.type == "mcp.notification" and r.data.get("method") == "notifications/cancelled"
    ]
    held = sum(r.data["count"] for r in records if r.type == "mcp.suppressed")
    assert held + len(drops) == storm


def test_a_full_state_dir_ends_the_session_and_its_close_goes_in_the_reserve(
    small_state: Path,  # noqa: F811 - the fixture imported above
    tmp_path: Path,
    unique_name: str,
) -> None:
    """Issue 25 #6 for MCP: a state dir filled to the last byte during a session (as a
    flooding session log would). Calls are refused (nothing unrecorded is forwarded), the end
    of the session still ends the server and the bridge, and its `session.close` (with the
    admin chain's anchor) is written in the space kept for the safe direction, said on
    stderr; once space is back the session verifies."""
    start_server_container(tmp_path, unique_name, DEBIAN_IMAGE)
    assert (small_state / "audit" / ".reserve").stat().st_size > 0
    s = RawSession(unique_name)
    try:
        s.handshake()
        sid = s.session_id()
        assert "result" in s.request(1, "ping")
        fill(small_state)
        # The log's last page may still take a few records: until it is full, pings pass.
        for i in range(2, 200):
            resp = s.request(i, "ping")
            if "error" in resp:
                break
        assert "could not record" in json.dumps(resp), resp
        code = s.close(60)
    finally:
        s.kill()
    err = s.stderr.decode()
    assert code == 0, err[-2000:]
    assert "is full: the session.close record was written in the space linpodx keeps" in err, err
    assert f"session {sid} ended" in err
    assert "could not close the session's audit chain" not in err
    records = audit_chain.read_records(audit_chain.session_path(sid))
    assert records[-1].type == "session.close", [r.type for r in records[-3:]]
    (small_state / "filler").unlink()
    verify = linpodx("audit", "verify", "--session", sid, check=False)
    assert verify.returncode == 0, verify.stdout + verify.stderr
