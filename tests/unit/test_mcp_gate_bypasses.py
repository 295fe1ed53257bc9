"""Issue 23's gate bypasses (1-8) and issue 25's record/size bounds, in-process: the pure parts
(policy, bounds) and the bridge with a recording fake chain. The same bypasses against a real
container are in tests/integration/test_mcp_bypasses.py."""

from __future__ import annotations

import inspect
import json
import tracemalloc
from collections.abc import Mapping
from typing import Any

import mcp_types.jsonrpc as sdk_codes

from linpodx.mcp import bounds, jsonrpc, policy
from linpodx.mcp.bridge import INFLIGHT_MAX, Bridge
from linpodx.mcp.framing import Line
from linpodx.profile.mcprule import Matcher
from linpodx.profile.model import Decision as A
from linpodx.profile.model import McpRule, McpSettings, Profile

RULES = (
    McpRule("tools/call", A.DENY, "run_shell"),
    McpRule("tools/call", A.PROMPT, "write_file"),
    McpRule("tools/call", A.AUTO_ALLOW),
)


class SizedChain:
    """Records appends and counts their bytes as `size` (like GroupCommitChain.size)."""

    def __init__(self) -> None:
        self.records: list[tuple[str, dict[str, Any]]] = []
        self.size = 0

    def append(self, type: str, data: Mapping[str, Any]) -> None:
        self.records.append((type, dict(data)))
        self.size += len(json.dumps(dict(data))) + 100


class Gate:
    def __init__(self, **settings: Any) -> None:
        self.chain = SizedChain()
        self.client: list[dict[str, Any]] = []
        self.server: list[dict[str, Any]] = []
        self.events: list[tuple[str, dict[str, Any]]] = []
        self.log: list[str] = []
        self.ended: list[str] = []
        self.now = 1000.0
        self.bridge = Bridge(
            profile=Profile(
                name="t",
                mcp_policy=RULES,
                mcp=McpSettings(**{"approval_timeout_seconds": 5, **settings}),
            ),
            session_id="sess_T",
            chain=self.chain,
            to_client=lambda b: self.client.append(json.loads(b)),
            to_server=lambda b: self.server.append(json.loads(b)),
            emit=lambda t, **d: self.events.append((t, d)),
            log=self.log.append,
            clock=lambda: self.now,
            on_bound=self.ended.append,
        )

    def c(self, obj: dict[str, Any]) -> None:
        self.bridge.on_client_frame(Line(json.dumps(obj).encode()))

    def s(self, data: bytes) -> None:
        self.bridge.on_server_frame(Line(data))

    def types(self) -> list[str]:
        return [t for t, _ in self.chain.records]


def call(i: Any, name: Any, **args: Any) -> dict[str, Any]:
    msg: dict[str, Any] = {"jsonrpc": "2.0", "method": "tools/call"}
    if i is not None:
        msg["id"] = i
    msg["params"] = {"name": name, "arguments": args}
    return msg


# ---- 1: a tools/call whose name is not a string ----------------------------------------------


def test_policy_refuses_a_name_that_is_no_string() -> None:
    for name in (["run_shell"], {"0": "run_shell"}, 7, None, True):
        d = policy.refusal("request", "tools/call", {"name": name})
        assert d is not None and d.action is A.DENY and d.rule_index is None, name
    assert policy.refusal("request", "tools/call", {}) is not None
    assert policy.refusal("request", "tools/call", None) is not None
    assert policy.refusal("request", "tools/call", {"name": "run_shell"}) is None


def test_a_list_as_tool_name_never_reaches_the_catch_all() -> None:
    g = Gate()
    g.c(call(1, ["run_shell"], cmd="M"))
    assert g.server == []
    assert g.client[0]["result"]["isError"] is True
    (rec,) = [d for t, d in g.chain.records if t == "mcp.request"]
    assert rec["decision"] == "deny" and rec["rule"] is None and rec["tool_type"] == "list"
    assert rec["reason"] == "tools/call without a string params.name"


def test_a_name_with_whitespace_around_or_control_characters_never_reaches_the_server() -> None:
    # `run_shell ` is not `run_shell` to the rules (the deny rule did not apply, the catch-all
    # allowed it), but a server that trims the name ran run_shell. MCP tool names are ASCII
    # letters, digits, `_-./` (SEP-986): nothing a conforming server registers looks so.
    odd = ["run_shell ", " run_shell", "run_shell\n", "\trun_shell", "run_shell\u00a0",
           "\ufeffrun_shell", "run_shell\u2028", "run\x00_shell", "run_\x1bshell",
           "run\u200b_shell", "run_shell\x7f"]
    for name in odd:
        d = policy.refusal("request", "tools/call", {"name": name})
        assert d is not None and d.action is A.DENY and d.rule_index is None, repr(name)
        assert d.reason == (
            "tools/call whose name has whitespace around it or unprintable characters"
        )
    g = Gate()
    for i, name in enumerate(odd, start=1):
        g.c(call(i, name, cmd="M"))
    assert g.server == []
    assert [c["result"]["isError"] for c in g.client] == [True] * len(odd)
    recs = [d for t, d in g.chain.records if t == "mcp.request"]
    assert [r["decision"] for r in recs] == ["deny"] * len(odd)
    # A name with a space inside, or beyond ASCII, is the server's business: rules compare it.
    for name in ("run shell", "lire_fichier_é", "user-profile/update", "admin.tools.list"):
        assert policy.refusal("request", "tools/call", {"name": name}) is None, name


def test_name_or_arguments_in_another_case_never_reach_the_server() -> None:
    # A Go server (encoding/json) fills its `Name` field from `name` or `Name`, the last one
    # winning: the gate saw `echo` (the catch-all allowed it) and the server ran `run_shell`.
    # `Arguments` alone: the gate saw no arguments, the server read these.
    g = Gate()
    odd = [
        {"name": "echo", "Name": "run_shell", "arguments": {"cmd": "M1"}},
        {"name": "echo", "NAME": "run_shell"},
        {"name": "echo", "Arguments": {"cmd": "M2"}},
        {"name": "echo", "arguments": {}, "_META": {"progressToken": 1}},
    ]
    for i, params in enumerate(odd, start=1):
        g.c({"jsonrpc": "2.0", "id": i, "method": "tools/call", "params": params})
    assert g.server == []
    assert [c["result"]["isError"] for c in g.client] == [True] * len(odd)
    recs = [d for t, d in g.chain.records if t == "mcp.request"]
    assert {r["reason"] for r in recs} == {
        "tools/call with name, arguments or _meta in another case"
    }
    # Other keys, and the MCP keys as MCP spells them, are what they were.
    ok = {"name": "echo", "arguments": {"Name": "x"}, "_meta": {}, "nAmEx": 1}
    assert policy.refusal("request", "tools/call", ok) is None
    g.c({"jsonrpc": "2.0", "id": 9, "method": "tools/call", "params": ok})
    assert [m["params"]["name"] for m in g.server] == ["echo"]


def test_a_proto_key_never_reaches_the_server() -> None:
    # JSON.parse makes `__proto__` an own key, but JavaScript that copies the object with
    # `Object.assign({}, args)` (or `obj[k] = v` in a loop) sets the copy's prototype to it,
    # and `copy.path` then reads the path in there: the gate saw no `path` (the deny rule on
    # it did not apply, the catch-all allowed the call) and the server read /etc/shadow.
    rules = (
        McpRule("tools/call", A.DENY, "read", arguments=(("path", Matcher("glob", "/etc/**")),)),
        McpRule("tools/call", A.AUTO_ALLOW),
    )
    odd = [
        {"name": "read", "arguments": {"__proto__": {"path": "/etc/shadow"}}},
        {"name": "read", "__proto__": {"arguments": {"path": "/etc/shadow"}}},
    ]
    for params in odd:
        assert policy.evaluate(rules, "tools/call", "read", params).action is A.AUTO_ALLOW
        d = policy.refusal("request", "tools/call", params)
        assert d is not None and d.action is A.DENY, params
        assert d.reason == "tools/call with a __proto__ key (a prototype to JavaScript)"
    g = Gate()
    for i, params in enumerate(odd, start=1):
        g.c({"jsonrpc": "2.0", "id": i, "method": "tools/call", "params": params})
    assert g.server == [] and [c["result"]["isError"] for c in g.client] == [True, True]


def test_a_proto_key_at_any_depth_never_reaches_the_server() -> None:
    # A JavaScript server that merges arguments into its defaults key by key (a deep merge)
    # copies a nested `__proto__` into Object.prototype: every object of the server then has
    # the keys in there (`shell`, `cwd`), in this call and every later one.
    deep = [
        {"name": "read", "arguments": {"opts": {"__proto__": {"shell": "/bin/sh"}}}},
        {"name": "read", "arguments": {"a": [1, {"b": {"__proto__": 1}}]}},
        {"name": "read", "arguments": {}, "_meta": {"x": {"__proto__": {}}}},
    ]
    for params in deep:
        d = policy.refusal("request", "tools/call", params)
        assert d is not None and d.action is A.DENY, params
        assert d.reason == "tools/call with a __proto__ key (a prototype to JavaScript)"
    # As the client sends it, also spelled with escapes (the same key once parsed).
    frames = [
        b'{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"read",'
        b'"arguments":{"o":{"__proto__":{"path":"/etc/shadow"}}}}}',
        b'{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"read",'
        b'"arguments":{"o":{"\\u005f_proto__":{"path":"/etc/shadow"}}}}}',
        b'{"jsonrpc":"2.0","id":3,"method":"tools/call","params":{"name":"read",'
        b'"arguments":{"o":[{"__\\u0070roto__":1}]}}}',
    ]
    g = Gate()
    for frame in frames:
        g.bridge.on_client_frame(Line(frame))
    assert g.server == [] and [c["result"]["isError"] for c in g.client] == [True] * 3
    # A key that only looks like it, or the word as a value, is what it was.
    fine = {"name": "read", "arguments": {"o": {"proto": "__proto__", "__proto": 1}}}
    assert policy.refusal("request", "tools/call", fine) is None
    g.c({"jsonrpc": "2.0", "id": 9, "method": "tools/call", "params": fine})
    assert [m["id"] for m in g.server] == [9]


def test_a_frame_that_cannot_spell_proto_skips_the_key_walk() -> None:
    plain = jsonrpc.parse(json.dumps(call(1, "read", a={"b": [{"c": 1}]})).encode())
    assert isinstance(plain, jsonrpc.Message) and not plain.may_hold_proto
    head = b'{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"r",'
    for text in (b'"x":"proto"', b'"x":"\\u00e9"'):
        frame = head + text + b"}}"
        msg = jsonrpc.parse(frame)
        assert isinstance(msg, jsonrpc.Message) and msg.may_hold_proto, text
    # Told the frame cannot hold it, the walk is skipped (the bridge tells it only then).
    deep = {"name": "read", "arguments": {"opts": {"__proto__": 1}}}
    assert policy.refusal("request", "tools/call", deep, may_hold_proto=False) is None


# ---- 2: a request sent as a notification ------------------------------------------------------


def test_policy_refuses_request_methods_without_an_id() -> None:
    for method in ("tools/call", "resources/read", "prompts/get", "initialize", "ping"):
        d = policy.refusal("notification", method, {"name": "echo"})
        assert d is not None and d.action is A.DENY, method
    assert policy.refusal("notification", "notifications/progress", {}) is None


def test_tools_call_as_a_notification_is_dropped_and_recorded() -> None:
    g = Gate()
    g.c(call(None, "echo", text="M-NOTIFY"))
    assert g.server == [] and g.client == []
    ((t, rec),) = g.chain.records
    assert t == "mcp.notification" and rec["decision"] == "deny"
    assert "sent without an id" in rec["reason"]
    assert g.log == ["bridge: dropped a request the client sent without an id"]


# ---- 3, 4: what the approver is shown ---------------------------------------------------------


def test_the_approval_event_shows_meta_and_every_argument() -> None:
    g = Gate()
    msg = call(1, "write_file", content="harmless " * 300, path="/home/agent/.bashrc")
    msg["params"]["_meta"] = {"progressToken": "M-META"}
    g.c(msg)
    (pending,) = [d for t, d in g.events if t == "approval.pending"]
    assert "M-META" in pending["payload"]
    shown = {k: (v, n) for k, v, n in pending["fields"]}
    assert shown["arguments.path"] == ('"/home/agent/.bashrc"', None)
    assert shown["arguments.content"][1] == 2700
    assert shown["_meta.progressToken"] == ('"M-META"', None)
    g.bridge.shutdown("test over")


# ---- 5: the approval id stays off the client's pipe -------------------------------------------


def test_the_bridge_never_says_an_approval_id_on_stderr() -> None:
    g = Gate()
    g.c(call(1, "write_file", path="a", content="b"))
    (pending,) = [d for t, d in g.events if t == "approval.pending"]
    g.bridge.shutdown("test over")
    assert g.log and not any(pending["approval_id"] in line for line in g.log), g.log
    assert not any("apr_" in line for line in g.log), g.log


# ---- 6: cancellations release in-flight slots -------------------------------------------------


def test_a_cancellation_storm_leaves_the_session_usable() -> None:
    g = Gate()
    for i in range(INFLIGHT_MAX + 200):
        g.c(call(i, "slow"))
        g.c(
            {
                "jsonrpc": "2.0",
                "method": "notifications/cancelled",
                "params": {"requestId": i, "reason": "storm"},
            }
        )
    assert g.bridge.inflight == {}
    assert all("error" not in m for m in g.client), g.client[:1]
    g.c({"jsonrpc": "2.0", "id": "p", "method": "ping"})
    assert g.server[-1] == {"jsonrpc": "2.0", "id": "p", "method": "ping"}
    # A late answer to a cancelled call answers no request in flight: dropped, recorded.
    g.s(b'{"jsonrpc":"2.0","id":3,"result":{"content":[]}}')
    assert g.client == [] and g.types()[-1] == "mcp.drop"


# ---- 7: the denial code is no SDK's ------------------------------------------------------------


def test_the_denial_code_is_not_one_an_sdk_uses() -> None:
    used = {
        v
        for _k, v in inspect.getmembers(sdk_codes)
        if isinstance(v, int) and not isinstance(v, bool) and -32768 <= v <= -32000
    }
    assert -32001 in used  # (the SDK's "request timed out", the old denial code)
    # TypeScript SDK: -32000 connection closed, -32001 timeout, -32042 URL elicitation;
    # the spec: -32002 resource not found; the Python SDK's HTTP transport: -32800.
    used |= {-32000, -32001, -32002, -32042, -32800}
    assert jsonrpc.DENIED_BY_POLICY not in used
    assert -32099 <= jsonrpc.DENIED_BY_POLICY <= -32000


# ---- 8: logging/setLevel is housekeeping -------------------------------------------------------


def test_logging_set_level_is_housekeeping() -> None:
    d = policy.evaluate((), "logging/setLevel")
    assert d.allowed and d.rule_index is None and d.reason == "protocol housekeeping"


# ---- issue 25: records of dropped messages per second, and the log's size ----------------------


def test_window_lets_the_limit_through_and_summarises_the_rest() -> None:
    now = [0.0]
    w = bounds.Window(3, lambda: now[0])
    got = [w.admit("x")[0] for _ in range(10)]
    assert got == [True] * 3 + [False] * 7
    now[0] = 1.5
    ok, ended = w.admit("y")
    assert ok and ended is not None and ended.count == 7 and ended.reasons == {"x": 7}
    assert w.take() is None


def test_window_counts_bytes_and_caps_its_reasons() -> None:
    w = bounds.Window(100, lambda: 0.0)
    assert w.admit("a", 60)[0] and not w.admit("b", 60)[0]
    assert not w.admit("c", 1)[0]  # a full window holds back lighter events too
    for i in range(40):
        w.admit(f"r{i}")
    held = w.take()
    assert held is not None and len(held.reasons) == bounds.REASONS_MAX + 1
    assert held.reasons["other"] == 42 - bounds.REASONS_MAX


def test_a_flood_of_invalid_lines_is_summarised_past_the_rate() -> None:
    g = Gate(drop_records_per_second=10)
    for _ in range(5000):
        g.s(b"x")
    for _ in range(5000):
        g.s(b'{"jsonrpc":"2.0","id":99,"result":{}}')
    assert g.types().count("mcp.invalid") + g.types().count("mcp.drop") == 10
    assert len(g.log) == 10  # and the stderr lines with them
    g.now += 1.0
    g.s(b"x")
    g.bridge.flush_summaries()
    summaries = [d for t, d in g.chain.records if t == "mcp.suppressed"]
    assert [s["count"] for s in summaries] == [9990]
    assert summaries[0]["dir"] == "server" and summaries[0]["limit"] == 10
    assert sum(summaries[0]["reasons"].values()) == 9990
    assert g.bridge.summary()["suppressed"] == 9990


def test_the_session_ends_at_the_size_bound() -> None:
    g = Gate(audit_max_bytes=65536)
    i = 0
    while not g.ended and i < 10_000:
        g.c({"jsonrpc": "2.0", "id": i, "method": "ping"})
        g.s(json.dumps({"jsonrpc": "2.0", "id": i, "result": {}}).encode())
        i += 1
    assert g.ended == ["audit log size bound reached (mcp.audit_max_bytes = 65536 bytes)"]
    size = g.chain.size
    forwarded = len(g.server)
    g.c({"jsonrpc": "2.0", "id": "late", "method": "ping"})
    assert len(g.server) == forwarded  # refused, not forwarded
    assert g.client[-1]["id"] == "late" and "error" in g.client[-1]
    assert g.chain.size == size  # and not recorded past the bound
    assert 65536 <= size < 65536 + 1000


def test_the_id_of_a_cancelled_call_is_not_taken_before_its_late_answer() -> None:
    """A new call under a cancelled call's id would be given the old call's late answer."""
    g = Gate()
    g.c(call(7, "slow"))
    g.c({"jsonrpc": "2.0", "method": "notifications/cancelled", "params": {"requestId": 7}})
    g.c(call(7, "echo", text="M-REUSE"))
    refused = g.client[-1]
    assert refused["id"] == 7 and "cancelled request reused" in refused["error"]["message"]
    assert [m.get("params", {}).get("name") for m in g.server if "id" in m] == ["slow"]
    g.s(b'{"jsonrpc":"2.0","id":7,"result":{"content":[]}}')  # the late answer: dropped
    assert g.chain.records[-1] == (
        "mcp.drop",
        {"dir": "server", "reason": "response to a cancelled request", "id": 7},
    )
    g.c(call(7, "echo", text="M-AFTER"))  # answered: the id is free again
    assert g.server[-1]["params"]["arguments"] == {"text": "M-AFTER"}


def test_the_servers_requests_in_flight_are_bounded_in_number_and_memory() -> None:
    """A server that sends pings (with 100 KB ids) to a client that does not answer them grew
    the bridge's table without bound: 2,000 of them held 400 MB."""
    g = Gate()
    forwarded = 0

    def to_client(data: bytes) -> None:
        nonlocal forwarded
        forwarded += 1

    g.bridge._to_client = to_client
    tracemalloc.start()
    try:
        for i in range(INFLIGHT_MAX + 20):
            rid = f"{i}-" + "x" * 100_000
            g.now += 0.011  # (under the pings' rate)
            g.s(json.dumps({"jsonrpc": "2.0", "id": rid, "method": "ping"}).encode())
        held, _ = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert forwarded == INFLIGHT_MAX
    assert len(g.bridge.server_inflight) == INFLIGHT_MAX
    refused = [m for m in g.server if m.get("error", {}).get("code") == jsonrpc.INVALID_REQUEST]
    assert len(refused) == 20 and refused[0]["id"].startswith(f"{INFLIGHT_MAX}-")
    assert held < 32 * 1024 * 1024, held  # (unbounded: ~400 MB per 2,000)
    # An answer still settles its request (the key of a long id is its digest).
    first = json.dumps({"jsonrpc": "2.0", "id": "0-" + "x" * 100_000, "result": {}})
    g.bridge.on_client_frame(Line(first.encode()))
    assert len(g.bridge.server_inflight) == INFLIGHT_MAX - 1


def test_long_ids_are_kept_by_digest_and_stay_apart() -> None:
    long_a, long_b = "a" * 300, "a" * 299 + "b"
    assert jsonrpc.id_key(long_a) != jsonrpc.id_key(long_b)
    assert jsonrpc.id_key(long_a) == jsonrpc.id_key("a" * 300)
    key = jsonrpc.id_key(long_a)
    assert key is not None and len(repr(key)) < 200
    assert jsonrpc.id_key("1") != jsonrpc.id_key(1)


def test_a_request_the_server_cancelled_frees_its_slot() -> None:
    """The server's own cancellation left its request counted until the client answered, and
    a conformant client never answers a cancelled request."""
    g = Gate()
    for i in range(INFLIGHT_MAX + 1):
        g.now += 0.011  # (under the pings' rate)
        g.s(json.dumps({"jsonrpc": "2.0", "id": i, "method": "ping"}).encode())
        cancel = {"jsonrpc": "2.0", "method": "notifications/cancelled", "params": {"requestId": i}}
        g.s(json.dumps(cancel).encode())
    assert g.bridge.server_inflight == {}
    assert [m for m in g.server if "error" in m] == []  # none refused as crowded
    assert sum(1 for m in g.client if m.get("method") == "ping") == INFLIGHT_MAX + 1
    # A late answer to a cancelled ping is dropped and recorded, not forwarded.
    g.bridge.on_client_frame(Line(b'{"jsonrpc":"2.0","id":3,"result":{}}'))
    assert g.server == [] and g.types()[-1] == "mcp.drop"


def test_cancellations_of_nothing_in_flight_are_dropped_and_summarised() -> None:
    """Each was forwarded with a decision record of its own: a storm of bogus ids filled the
    session log past any per-second bound (1,000 cancellations, 1,000 records)."""
    g = Gate()
    g.c(call(1, "echo", text="x"))  # forwarded, in flight
    for rid in [*range(100, 1100), None, "1"]:
        params = {} if rid is None else {"requestId": rid}
        g.c({"jsonrpc": "2.0", "method": "notifications/cancelled", "params": params})
    g.c({"jsonrpc": "2.0", "method": "notifications/cancelled", "params": {"requestId": 1}})
    cancels = [m for m in g.server if m.get("method") == "notifications/cancelled"]
    assert [m["params"]["requestId"] for m in cancels] == [1]  # only the real one
    types = g.types()
    assert types.count("mcp.drop") == McpSettings().drop_records_per_second
    assert g.bridge.suppressed == 1002 - McpSettings().drop_records_per_second
    # Cancelling it again: nothing in flight any more.
    g.c({"jsonrpc": "2.0", "method": "notifications/cancelled", "params": {"requestId": 1}})
    assert len([m for m in g.server if m.get("method") == "notifications/cancelled"]) == 1


def test_the_servers_pings_are_held_to_the_rate() -> None:
    """Each ping was a decision record and a forward, as fast as a client answered them."""
    g = Gate()
    limit = McpSettings().drop_records_per_second
    for i in range(limit + 50):
        g.s(json.dumps({"jsonrpc": "2.0", "id": i, "method": "ping"}).encode())
        g.bridge.on_client_frame(
            Line(json.dumps({"jsonrpc": "2.0", "id": i, "result": {}}).encode())
        )
    assert sum(1 for m in g.client if m.get("method") == "ping") == limit
    refused = [m for m in g.server if m.get("error", {}).get("code") == jsonrpc.INVALID_REQUEST]
    assert [m["id"] for m in refused] == list(range(limit, limit + 50))
    g.now += 1.0  # the next second: pings pass again
    g.s(b'{"jsonrpc":"2.0","id":"later","method":"ping"}')
    assert g.client[-1]["id"] == "later"
