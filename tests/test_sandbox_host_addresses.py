"""The Docker host's addresses are found even where the engine does not list them."""

from __future__ import annotations

import subprocess

from sandbox.docker.host_addresses import bridge_gateways, local_addresses


def test_a_listed_gateway_is_taken_as_is() -> None:
    net = {"Id": "x" * 64, "IPAM": {"Config": [{"Subnet": "10.9.0.0/16", "Gateway": "10.9.0.7"}]}}
    assert bridge_gateways(net) == ["10.9.0.7"]


def test_without_a_gateway_the_bridge_interface_is_asked() -> None:
    """What a fresh Debian docker.io 20.10 shows for docker0: a Subnet and no Gateway.
    ``lo`` stands in for the bridge interface, so no engine is needed."""
    net = {
        "Id": "x" * 64,
        "Options": {"com.docker.network.bridge.name": "lo"},
        "IPAM": {"Config": [{"Subnet": "127.0.0.0/8"}]},
    }
    assert bridge_gateways(net) == ["127.0.0.1"]


def test_without_a_gateway_or_an_interface_here_the_subnet_gives_it() -> None:
    net = {"Id": "0123456789ab" + "0" * 52, "IPAM": {"Config": [{"Subnet": "10.77.0.0/16"}]}}
    assert bridge_gateways(net) == ["10.77.0.1"]


def test_local_addresses_are_every_interface_address_v4_and_v6() -> None:
    shown = subprocess.run(["ip", "-o", "addr", "show"], capture_output=True, text=True).stdout
    expected = {line.split()[3].split("/")[0] for line in shown.splitlines()}
    assert set(local_addresses()) == expected
