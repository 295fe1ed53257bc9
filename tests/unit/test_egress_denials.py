"""The bound on denial records: a hostile container cannot flood the audit log."""

from __future__ import annotations

from typing import Any

from linpodx.egress.denials import DenialRecorder


class Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def test_flood_is_bounded_and_summarized() -> None:
    out: list[tuple[str, dict[str, Any]]] = []
    clock = Clock()
    rec = DenialRecorder("c", lambda k, d: out.append((k, d)), max_records=5, clock=clock)
    for i in range(1000):
        rec.deny(f"n{i}.exfil.test", "A", "name not in the allowlist")
    assert len(out) == 5
    assert out[0][1]["message"] == "dns lookup denied for n0.exfil.test"
    clock.t = 61
    rec.deny("again.test", "A", "name not in the allowlist")
    assert out[5][1]["suppressed"] == 995
    assert out[6][1]["name"] == "again.test"
    rec.deny("again.test", "A", "name not in the allowlist")
    rec.flush()
    assert out[-1][1]["suppressed"] == 1 and len(out) == 8


def test_same_name_recorded_once_per_window() -> None:
    out: list[tuple[str, dict[str, Any]]] = []
    rec = DenialRecorder("c", lambda k, d: out.append((k, d)), clock=Clock())
    for _ in range(3):
        rec.deny("github.qkg1.top", "A", "name not in the allowlist")
    assert len(out) == 1


def test_failing_sink_does_not_raise() -> None:
    def boom(kind: str, data: dict[str, Any]) -> None:
        raise OSError("disk full")

    rec = DenialRecorder("c", boom, clock=Clock())
    rec.deny("x.test", "A", "name not in the allowlist")  # must not raise: still denied
