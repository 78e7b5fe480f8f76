"""The host firewall guard fails closed, with what to do, when it cannot install its rules."""

from __future__ import annotations

import pytest

from sandbox import firewall
from sandbox.errors import SandboxUnavailable


def test_bridge_names_fit_an_interface_name_and_match_the_rule() -> None:
    name = firewall.bridge_name("fleet-run-" + "x" * 63)
    assert len(name) <= 15 and name.startswith(firewall.BRIDGE_PREFIX)
    assert name != firewall.bridge_name("fleet-run-other")


def test_without_root_creating_a_run_network_is_refused_with_what_to_do(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("FLEET_HOST_FIREWALL", raising=False)
    monkeypatch.setattr(firewall.os, "geteuid", lambda: 1000)
    with pytest.raises(SandboxUnavailable) as err:
        firewall.ensure_host_rules()
    text = str(err.value)
    assert "not running as root" in text
    assert "FLEET_HOST_FIREWALL=external" in text and "FLEET_HOST_FIREWALL=off" in text


@pytest.mark.parametrize("value", ["external", "off"])
def test_the_guard_can_be_handed_to_an_administrator_or_waived(
    monkeypatch: pytest.MonkeyPatch, value: str
) -> None:
    monkeypatch.setenv("FLEET_HOST_FIREWALL", value)
    monkeypatch.setattr(firewall.os, "geteuid", lambda: 1000)
    firewall.ensure_host_rules()  # no error: nothing to install


def test_an_unknown_guard_setting_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FLEET_HOST_FIREWALL", "maybe")
    with pytest.raises(SandboxUnavailable, match="'maybe' is not understood"):
        firewall.ensure_host_rules()
