"""The host firewall guard fails closed, with what to do, when it cannot install its rules."""

from __future__ import annotations

import pytest

from sandbox.docker import firewall
from sandbox.errors import SandboxUnavailable


def test_bridge_names_fit_an_interface_name_and_match_the_rule() -> None:
    name = firewall.bridge_name("fleet-run-" + "x" * 63)
    assert len(name) <= 15 and name.startswith(firewall.RUN_BRIDGE_PREFIX)
    assert firewall.RUN_BRIDGE_PREFIX.startswith(firewall.BRIDGE_PREFIX)
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


@pytest.mark.parametrize(
    ("address", "why"),
    [
        ("93.184.216.34", "an address of the Docker host"),  # a public address of the host
        ("2a00:1450:4001::9", "an address of the Docker host"),
        ("::ffff:93.184.216.34", "an address of the Docker host"),
        ("::ffff:127.0.0.1", "loopback"),
        ("64:ff9b::a9fe:a9fe", "link-local"),  # NAT64 for 169.254.169.254
        ("2002:7f00:1::", "loopback"),  # 6to4 around 127.0.0.1
    ],
)
def test_the_proxy_refuses_the_hosts_addresses_in_any_form(address: str, why: str) -> None:
    """Whatever the kind of address: public, IPv6, or an IPv6 one carrying IPv4."""
    import ipaddress

    from sandbox.inbox.egress_proxy import Policy

    policy = Policy(["example.org"], "172.30.0.0/16", ["93.184.216.34", "2a00:1450:4001::9"])
    refusal = policy.address_allowed(ipaddress.ip_address(address))
    assert refusal is not None and why in refusal, refusal
    assert policy.address_allowed(ipaddress.ip_address("93.184.216.35")) is None
