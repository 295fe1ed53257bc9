"""A stand-in for the host the snapshot service calls (`linpodx.snapshot.runner`): podman's
look-ups of containers and images and the start of a create job's worker. A test module
imports `host_fixture` to have the `host` fixture."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from linpodx.snapshot import runner


class FakeHost:
    """Each call set on it (`set`) answers instead of the real host's; the others are the
    real host's."""

    def __init__(self) -> None:
        self.answers: dict[str, Any] = {}

    def set(self, **calls: Any) -> None:
        self.answers.update(calls)

    def __getattr__(self, name: str) -> Any:
        answers = self.__dict__["answers"]
        return answers[name] if name in answers else getattr(runner.REAL, name)


@pytest.fixture(name="host")
def host_fixture() -> Iterator[FakeHost]:
    """The snapshot service's host for this test (`runner.use`, undone at its end)."""
    fake = FakeHost()
    with runner.use(fake):  # type: ignore[arg-type]  # (a fake: __getattr__ answers)
        yield fake


def managed(info: dict[str, Any]) -> dict[str, Any]:
    """`info` with the label that makes it a container linpodx manages."""
    config = dict(info.get("Config") or {})
    config["Labels"] = {**(config.get("Labels") or {}), "linpodx.managed": "1"}
    return {**info, "Config": config}
