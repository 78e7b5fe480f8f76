"""The egress proxy's rules, judged without a box: which addresses it refuses, how it
reads a host written in disguise, and that ``fleet run`` refuses such a host in a job
file before anything starts (exit 2, the field, what the host really is, an example).

No test here opens a connection: the decision functions are called on addresses, and
the job files stop at reading (their model is a replay of a trace that does not exist,
so a job that were accepted after all would stop at that preflight error instead).
"""

from __future__ import annotations

import ipaddress
import json
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from coordinator.cli import main
from sandbox.inbox import egress_proxy
from sandbox.inbox.egress_proxy import Denied, Policy
from sandbox.inbox.egress_rules import address_refusal, read_host

RUN_NET = ipaddress.ip_network("172.30.0.0/16")

REFUSED = [
    ("100.100.100.200", "carrier-grade NAT"),  # a cloud metadata service
    ("100.64.0.1", "carrier-grade NAT"),
    ("100.127.255.254", "carrier-grade NAT"),
    ("0.0.0.0", "'this network'"),
    ("0.1.2.3", "'this network'"),
    ("255.255.255.255", "broadcast"),
    ("224.0.0.1", "multicast"),
    ("239.255.255.250", "multicast"),
    ("127.0.0.1", "loopback"),
    ("169.254.169.254", "link-local"),
    ("10.1.2.3", "private"),
    ("192.168.1.1", "private"),
    ("192.0.2.7", "not globally routable"),  # documentation (TEST-NET-1)
    ("198.18.0.1", "not globally routable"),  # benchmarking
    ("240.0.0.1", "reserved"),
    ("192.88.99.1", "6to4 relay"),
    ("::1", "loopback"),
    ("::", "unspecified"),
    ("fe80::1", "link-local"),
    ("fc00::1", "private"),
    ("fec0::1", "reserved"),  # site-local: ipaddress calls it global
    ("ff02::1", "multicast"),
    ("2001:db8::1", "not globally routable"),
    ("::ffff:100.100.100.200", "carrier-grade NAT"),  # IPv4-mapped
    ("::ffff:127.0.0.1", "loopback"),
    ("64:ff9b::6464:64c8", "carrier-grade NAT"),  # NAT64 of 100.100.100.200
    ("64:ff9b:1::1", "local-use NAT64"),
    ("2002:6464:64c8::1", "carrier-grade NAT"),  # 6to4 around 100.100.100.200
    ("2002:a9fe:a9fe::", "link-local"),
    ("2001:0:4136:e378:8000:63bf:3fff:fdd2", "Teredo"),
    ("::7f00:1", "reserved"),  # IPv4-compatible, deprecated
    ("172.30.0.0", "network or broadcast"),  # the run network's own, not a box
    ("172.30.255.255", "network or broadcast"),
]


@pytest.mark.parametrize(("address", "why"), REFUSED)
def test_the_proxy_refuses_every_address_that_is_not_globally_routable(
    address: str, why: str
) -> None:
    refusal = address_refusal(ipaddress.ip_address(address), RUN_NET)
    assert refusal is not None and why in refusal, refusal


@pytest.mark.parametrize(
    "address", ["93.184.216.34", "1.1.1.1", "2606:4700::1111", "2002:5db8:d822::1", "172.30.0.5"]
)
def test_globally_routable_addresses_and_the_run_networks_boxes_pass(address: str) -> None:
    assert address_refusal(ipaddress.ip_address(address), RUN_NET) is None


DISGUISED = [
    # (as written, what it really is, a word of how it is disguised)
    ("127.1", "127.0.0.1", "2 parts"),
    ("0x7f000001", "127.0.0.1", "hexadecimal"),
    ("0x7f.0.0.1", "127.0.0.1", "hexadecimal"),
    ("2852039166", "169.254.169.254", "1 part"),
    ("017700000001", "127.0.0.1", "octal"),
    ("0177.0.0.1", "127.0.0.1", "octal"),
    ("1572395042", "93.184.216.34", "1 part"),  # a public address in disguise: refused too
    ("0x646464c8", "100.100.100.200", "hexadecimal"),
    ("[::ffff:127.0.0.1]", "::ffff:7f00:1", "square brackets"),
    ("127.0.0.1.", "127.0.0.1", "trailing dot"),
    ("%31%32%37.0.0.1", "127.0.0.1", "percent-encoding"),
    ("a@127.0.0.1", "127.0.0.1", "user information"),
    ("docs.python.org.", "docs.python.org", "trailing dot"),
    ("example.0x10", "example.0x10", "a number"),
    ("1" * 5000, "1" * 5000, "a number"),  # past int()'s digit limit: still read, and refused
]


@pytest.mark.parametrize(("written", "plain", "how"), DISGUISED)
def test_a_host_in_disguise_is_read_for_what_it_is(written: str, plain: str, how: str) -> None:
    form = read_host(written)
    assert form.host == plain
    assert any(how in d for d in form.disguises), form


@pytest.mark.parametrize("plain", ["docs.python.org", "corpus", "93.184.216.34", "2606:4700::1"])
def test_a_plain_host_is_no_disguise(plain: str) -> None:
    assert read_host(plain).disguises == ()


@pytest.mark.parametrize(("written", "plain", "how"), DISGUISED)
def test_the_proxy_refuses_a_host_in_disguise_even_when_it_is_allowlisted(
    monkeypatch: pytest.MonkeyPatch, written: str, plain: str, how: str
) -> None:
    """The proxy's side of the one reading: no lookup, no connection, a 403 saying why."""

    def no_lookup(*args: object, **kwargs: object) -> None:
        raise AssertionError(f"the proxy looked up {args[0]!r}")  # a lookup may leave the host

    monkeypatch.setattr(egress_proxy.socket, "getaddrinfo", no_lookup)
    policy = Policy([written, plain], "172.30.0.0/16", [])
    with pytest.raises(Denied, match="in disguise"):
        policy.resolve(written, 80)


@pytest.mark.parametrize(
    ("name", "allowed"),
    [("docs", True), ("docs.example.org", False), ("172.30.0.5", False)],
)
def test_the_run_network_is_open_only_to_the_name_of_a_box_on_it(
    monkeypatch: pytest.MonkeyPatch, name: str, allowed: bool
) -> None:
    """A service box's alias reaches it; a public name pointed at the run's network
    (DNS rebinding) and a bare address do not. The lookup is answered here."""

    def lookup(host: str, port: int, **kwargs: object) -> list:
        return [(socket.AF_INET, socket.SOCK_STREAM, 6, "", ("172.30.0.5", port))]

    monkeypatch.setattr(egress_proxy.socket, "getaddrinfo", lookup)
    policy = Policy([f"{name}:8080"], "172.30.0.0/16", [])
    if allowed:
        assert policy.resolve(name, 8080) == ("172.30.0.5", 8080)
    else:
        with pytest.raises(Denied, match="not globally routable"):
            policy.resolve(name, 8080)


# ---------------------------------------------------------------- fleet run

REPLAY = "replay:/nonexistent/fleet-egress/trace.jsonl"


def _job(where: str, host: str) -> str:
    """A job naming ``host`` in one place: the allowlist, the search URL or an MCP URL."""
    allow = [host] if where == "allow" else ["corpus:8080"]
    lines = ['name = "disguise"', "[model]", f"name = {json.dumps(REPLAY)}"]
    lines += ["[egress]", f"allow = {json.dumps(allow)}"]
    if where == "search_url":
        lines.append(f"search_url = {json.dumps(f'http://{host}/search?q={{query}}')}")
    lines += ["[[members]]", 'kind = "coding"', 'task = "t"']
    if where == "mcp":
        lines += ["[[members.mcp]]", 'name = "m"', f"url = {json.dumps(f'http://{host}/mcp')}"]
    return "\n".join(lines) + "\n"


FIELDS = {
    "allow": "egress.allow",
    "search_url": "egress.search_url",
    "mcp": "members[0].mcp[0].url",
}


@pytest.mark.parametrize("where", list(FIELDS))
@pytest.mark.parametrize(("written", "plain", "how"), DISGUISED)
def test_fleet_run_refuses_a_job_naming_a_host_in_disguise(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    where: str,
    written: str,
    plain: str,
    how: str,
) -> None:
    monkeypatch.chdir(tmp_path)  # no runs/ directory may appear anywhere else
    (tmp_path / "job.toml").write_text(_job(where, written))
    try:
        code = main(["run", "job.toml"])
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 1
    err = capsys.readouterr().err
    assert code == 2, err
    assert "Traceback" not in err and not list(tmp_path.rglob("journal.jsonl")), err
    assert f"{FIELDS[where]}: " in err, err
    what = "the host" if read_host(written).address is None else "the IP address"
    assert f"is {what} {plain} in disguise" in err, err
    assert how in err and "example of right:" in err, err


def test_the_installed_fleet_refuses_a_disguised_metadata_address(tmp_path: Path) -> None:
    job = tmp_path / "job.toml"
    job.write_text(_job("allow", "2852039166"))
    fleet = str(Path(sys.executable).with_name("fleet"))
    proc = subprocess.run([fleet, "run", str(job)], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr
    assert "egress.allow: '2852039166' can never be reached" in proc.stderr, proc.stderr
    assert "169.254.169.254 in disguise" in proc.stderr and "link-local" in proc.stderr
