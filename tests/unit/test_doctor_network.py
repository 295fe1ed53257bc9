"""`linpodx doctor`'s network check: rootful netavark without iptables is reported with a fix."""

from __future__ import annotations

from typing import Any

import pytest

from linpodx import doctor
from linpodx.podman import probe


def _which(found: dict[str, str]) -> Any:
    return lambda name: found.get(name)


def _check(info: dict[str, Any], found: dict[str, str], driver: str | None = None) -> doctor.Check:
    r = doctor.Report()
    doctor.check_network(r, info, which=_which(found), firewall_driver=lambda: driver)
    [c] = r.checks
    assert c.name == "network"
    return c


@pytest.fixture(autouse=True)
def _rootful(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(probe, "rootless", lambda: False)


PODMAN4 = {"host": {"networkBackend": "netavark"}}
PODMAN5 = {
    "host": {
        "networkBackend": "netavark",
        "networkBackendInfo": {"backend": "netavark", "version": "netavark 1.14.0"},
    }
}


def test_netavark_without_iptables_warns_with_the_package_to_install() -> None:
    c = _check(PODMAN4, {})
    assert c.status == doctor.WARN
    assert "without iptables" in c.detail and "netavark: No such file or directory" in c.detail
    assert c.fix == "install iptables (Debian: apt-get install iptables)"


def test_netavark_with_iptables_is_ok() -> None:
    c = _check(PODMAN4, {"iptables": "/usr/sbin/iptables"})
    assert c.status == doctor.OK
    assert "/usr/sbin/iptables" in c.detail


def test_new_netavark_without_iptables_also_names_the_nftables_driver() -> None:
    c = _check(PODMAN5, {})
    assert c.status == doctor.WARN
    assert c.fix is not None and 'firewall_driver = "nftables"' in c.fix
    assert "netavark 1.14.0" in c.detail


def test_new_netavark_set_to_nftables_needs_no_iptables() -> None:
    c = _check(PODMAN5, {}, driver="nftables")
    assert c.status == doctor.OK and "nftables" in c.detail


def test_old_netavark_set_to_nftables_still_needs_iptables() -> None:
    # netavark 1.4 (Debian 12) has no nftables driver: the setting does not help there.
    c = _check(PODMAN4, {}, driver="nftables")
    assert c.status == doctor.WARN


def test_cni_backend_and_rootless_need_no_iptables(monkeypatch: pytest.MonkeyPatch) -> None:
    assert _check({"host": {"networkBackend": "cni"}}, {}).status == doctor.OK
    monkeypatch.setattr(probe, "rootless", lambda: True)
    assert _check(PODMAN4, {}).status == doctor.OK


def test_firewall_driver_setting_is_read_from_the_network_table(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    base = tmp_path / "base.conf"
    base.write_text(
        '[engine]\nfirewall_driver = "iptables"\n[network]\nfirewall_driver="iptables"\n'
    )
    etc = tmp_path / "etc.conf"
    etc.write_text(
        '[network]\n# firewall_driver = "none"\n  firewall_driver = "nftables"  # ours\n'
    )
    monkeypatch.setattr(doctor, "CONTAINERS_CONFS", (str(base), str(etc)))
    monkeypatch.setattr(doctor, "CONTAINERS_CONF_D", str(tmp_path / "missing.d"))
    assert doctor._firewall_driver_setting() == "nftables"
    monkeypatch.setattr(doctor, "CONTAINERS_CONFS", (str(base),))
    assert doctor._firewall_driver_setting() == "iptables"
