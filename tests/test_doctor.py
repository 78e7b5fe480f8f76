"""``fleet doctor`` on this machine: every guarantee holds here, and each broken one
is named with its fix and a non-zero exit.

Broken for real, never stubbed: an engine socket nobody serves (``DOCKER_HOST``), an
image set this checkout's inputs give but nobody built (another extra CA bundle, in a
``FLEET_CONFIG_DIR`` of its own), and host firewall rules read back from the kernel of
a fresh network namespace - absent, tampered with, and Fleet's own as the control.
The cluster's side (``--cluster``) is in ``test_cluster_auth.py``.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import missing_dependency

from sandbox.docker.firewall import RULESET, TABLE

pytestmark = [pytest.mark.docker]
FLEET = str(Path(sys.executable).with_name("fleet"))
REQUIRED = ("engine", "images", "host firewall", "isolation", "disk", "memory")


def _doctor(*args: str, env: dict[str, str] | None = None, wrap: list[str] | None = None):
    return subprocess.run(
        [*(wrap or []), FLEET, "doctor", *args],
        env={**os.environ, **(env or {})},
        capture_output=True,
        text=True,
        timeout=120,
    )


def _lines(out: str) -> dict[str, str]:
    """Guarantee -> its whole line."""
    found = {}
    for line in out.splitlines():
        status, _, rest = line.partition(" ")
        name = rest.strip().split(":", 1)[0]
        assert status in ("ok", "FAIL", "warn"), line
        found[name] = line
    return found


def test_doctor_on_this_machine_says_every_guarantee_holds(images):
    done = _doctor()
    assert done.returncode == 0, done.stdout + done.stderr
    lines = _lines(done.stdout)
    for name in REQUIRED:
        assert not lines[name].startswith("FAIL"), lines[name]
    assert lines["engine"].startswith("ok") and lines["images"].startswith("ok")
    assert {"user namespaces", "gVisor"} <= set(lines)  # informational, said either way
    assert "every guarantee holds" in done.stderr


def test_doctor_names_an_engine_nobody_serves_and_exits_non_zero(tmp_path):
    sock = tmp_path / "docker.sock"
    done = _doctor(env={"DOCKER_HOST": f"unix://{sock}"})
    assert done.returncode == 1, done.stdout + done.stderr
    engine = _lines(done.stdout)["engine"]
    assert engine.startswith("FAIL  engine:") and f"there is no socket at {sock}" in engine
    assert "fix: start it ('fleet setup' as root" in engine
    assert "Traceback" not in done.stderr


def test_doctor_names_images_not_built_at_this_checkouts_tags(tmp_path, images):
    # Another extra CA bundle gives every image other tags: an image set nobody built.
    bundle = Path("/etc/ssl/certs/ca-certificates.crt").read_text()
    (tmp_path / "extra-ca.pem").write_text(bundle[: bundle.index("-----END CERTIFICATE-----") + 26])
    done = _doctor(env={"FLEET_CONFIG_DIR": str(tmp_path)})
    assert done.returncode == 1, done.stdout + done.stderr
    line = _lines(done.stdout)["images"]
    assert line.startswith("FAIL  images: not built at this checkout's tags: fleet-coding:")
    assert images["coding"] not in line  # the built ones are not these
    assert "fix: 'fleet images build'" in line


def test_doctor_reads_the_host_firewall_rules_from_the_kernel(tmp_path, docker_client):
    if os.geteuid() != 0 or not (shutil.which("unshare") and shutil.which("nft")):
        missing_dependency("needs root, unshare and nft to read rules in a network namespace")
    # A fresh network namespace: the same engine (a socket on the file system), its own
    # (empty) nftables - the host's own rules, which other runs rely on, are not touched.
    fresh = ["unshare", "--net"]
    absent = _lines(_doctor(env={"FLEET_HOST_FIREWALL": "external"}, wrap=fresh).stdout)
    assert absent["host firewall"].startswith(
        f"FAIL  host firewall: there is no table inet {TABLE}"
    )
    assert "(FLEET_HOST_FIREWALL=external)" in absent["host firewall"]
    assert "fix: load sandbox/docker/firewall.py's RULESET" in absent["host firewall"]

    tampered = tmp_path / "tampered.nft"  # Fleet's table, less the rule for proxies
    tampered.write_text(RULESET.replace('iifname "flt-egress" jump host', ""))
    own = tmp_path / "own.nft"
    own.write_text(RULESET)
    for rules, verdict in (
        (tampered, f"FAIL  host firewall: table inet {TABLE} is not Fleet's"),
        (own, f"ok    host firewall: table inet {TABLE} is Fleet's rule set"),
    ):
        loaded = ["unshare", "--net", "sh", "-c", 'nft -f "$0" && exec "$@"', str(rules)]
        done = _doctor(wrap=loaded)
        assert _lines(done.stdout)["host firewall"].startswith(verdict), done.stdout
    off = _lines(_doctor(env={"FLEET_HOST_FIREWALL": "off"}).stdout)["host firewall"]
    assert off.startswith("FAIL  host firewall: switched off")
