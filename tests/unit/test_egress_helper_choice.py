"""Which user-mode network helper the egress guard starts (`netns.choose_helper`)."""

from __future__ import annotations

import pytest

from linpodx.egress import netns
from linpodx.errors import EngineError


def _installed(monkeypatch: pytest.MonkeyPatch, *tools: str) -> None:
    monkeypatch.setattr(
        netns.proc, "which", lambda name: f"/usr/bin/{name}" if name in tools else None
    )


@pytest.mark.parametrize(
    ("tools", "preferred", "chosen"),
    [
        (("slirp4netns", "pasta"), None, "slirp4netns"),
        (("pasta",), None, "pasta"),  # rootful too: pasta runs under the keeper as root
        (("slirp4netns", "pasta"), "pasta", "pasta"),
        (("slirp4netns",), "slirp4netns", "slirp4netns"),
    ],
)
def test_the_helper_is_the_preferred_one_or_slirp4netns_first(
    monkeypatch: pytest.MonkeyPatch, tools: tuple[str, ...], preferred: str | None, chosen: str
) -> None:
    _installed(monkeypatch, *tools)
    assert netns.choose_helper(preferred) == chosen


@pytest.mark.parametrize(("tools", "preferred"), [((), None), (("slirp4netns",), "pasta")])
def test_no_usable_helper_is_an_error_with_a_hint(
    monkeypatch: pytest.MonkeyPatch, tools: tuple[str, ...], preferred: str | None
) -> None:
    _installed(monkeypatch, *tools)
    with pytest.raises(EngineError) as err:
        netns.choose_helper(preferred)
    assert "no user-mode network helper" in err.value.message and err.value.hint
