"""A Fleet cluster lets in no one without its token.

Against a cluster without token authentication (``ray_head(auth=False)``, started as
the README's recipe starts one, less the token), ``fleet run --cluster`` and ``fleet
sandbox gc --cluster`` refuse with exit 2 and the paragraph on how to turn it on, and
run only with ``--insecure-cluster-without-auth``. Against the test cluster (token
authentication on), a process without the token - or with a wrong one - can neither
connect nor run a task, while one with it can; and a Fleet process without the token
is told so at once instead of after Ray's retries. ``fleet doctor --cluster`` says
which of the two a cluster is, and checks each node of the closed one.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import missing_dependency
from ray_support import LOOPBACK, RayHead, ray_head, without_token

from coordinator.rundir.runs import RunDir

pytestmark = [pytest.mark.docker, pytest.mark.slow]
FLEET = str(Path(sys.executable).with_name("fleet"))
EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
INSECURE = "--insecure-cluster-without-auth"


@pytest.fixture(scope="module")
def open_cluster(images: dict[str, str]) -> Iterator[RayHead]:
    """A one-node Fleet cluster on this machine with token authentication off."""
    if importlib.util.find_spec("ray") is None:
        missing_dependency("Ray is not installed; pip install -e '.[cluster]' (make setup does)")
    with ray_head(auth=False, slots=2) as head:
        yield head


def _fleet(
    *args: str, env: dict[str, str], timeout: float = 300
) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in env.items() if k != "FLEET_CLUSTER"}
    return subprocess.run([FLEET, *args], env=env, capture_output=True, text=True, timeout=timeout)


def _job(tmp_path: Path) -> Path:
    """One coding member, offline, on a copy of the sample repository."""
    shutil.copytree(EXAMPLES / "sample-repo", tmp_path / "sample-repo")
    job = tmp_path / "job.toml"
    job.write_text(
        'name = "t"\n[model]\nname = "offline"\n[[members]]\nid = "c"\nkind = "coding"\n'
        'task = "Replace `Hello, {name}!` with `Hello there, {name}!` in `greet.py`."\n'
        'repo = "sample-repo"\ntest = "python3 test_greet.py"\n'
    )
    return job


def test_a_cluster_without_token_auth_is_refused_unless_the_user_says_insecure(
    tmp_path, open_cluster, docker_client, cleanup
):
    job, runs = _job(tmp_path), tmp_path / "runs"
    cleanup.append(runs)
    env = without_token()  # the user of an open cluster has no token
    run = ["run", str(job), "--output-dir", str(runs), "--plain", "--cluster", open_cluster.address]
    for refused in (
        _fleet(*run, env=env),
        _fleet("sandbox", "gc", "--cluster", open_cluster.address, env=env),
    ):
        assert refused.returncode == 2, refused.stderr[-3000:]
        said = " ".join(refused.stderr.split())
        assert f"the Ray cluster at {open_cluster.address} lets in anyone who can reach it" in said
        assert "RAY_AUTH_MODE=token" in said and "ray get-auth-token --generate" in said
        assert INSECURE in said and "Traceback" not in refused.stderr
    assert not runs.exists() or not RunDir.list(runs), "nothing ran, no run directory"
    doctor = _fleet("doctor", "--cluster", open_cluster.address, env=env)
    assert doctor.returncode == 1, doctor.stdout + doctor.stderr
    auth, *rest = doctor.stdout.splitlines()
    assert auth.startswith(f"FAIL  ray token auth: the cluster at {open_cluster.address} let in")
    assert "fix: Turn token authentication on" in auth and "RAY_AUTH_MODE=token" in auth
    assert rest == [next(r for r in rest if r.startswith("FAIL  nodes: not checked: "))]

    ran = _fleet(*run, INSECURE, env=env)
    assert ran.returncode == 0, ran.stderr[-3000:]
    assert f"{INSECURE} says to use it anyway" in " ".join(ran.stderr.split())
    (done,) = RunDir.list(runs)
    started = [e for e in done.journal.read() if e.event == "member_started"]
    assert [e.node.split("-")[0] for e in started] == [LOOPBACK]
    assert done.outcome("c").status == "ok"


INTRUDER = """
import logging, pathlib, sys
import ray
marker = pathlib.Path(sys.argv[2])
try:
    ray.init(address=sys.argv[1], log_to_driver=False, logging_level=logging.ERROR)
    ray.get(ray.remote(lambda: marker.write_text("ran")).remote(), timeout=60)
    print("RAN")
except Exception as exc:
    print("REFUSED", type(exc).__name__)
"""


def test_with_token_auth_a_process_without_the_token_cannot_connect_or_run_a_task(
    tmp_path, ray_cluster
):
    def attempt(env: dict[str, str], name: str) -> tuple[str, bool]:
        marker = tmp_path / name
        done = subprocess.run(
            [sys.executable, "-c", INTRUDER, ray_cluster.address, str(marker)],
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        return (done.stdout.split() or ["nothing"])[0], marker.exists()

    # Ray's own retries for a GCS that does not let it in, cut from 20 s to 2 s.
    intruder = without_token() | {"HOME": str(tmp_path), "RAY_gcs_server_port_wait_time_s": "2"}
    assert attempt(intruder, "no-token") == ("REFUSED", False)
    wrong = intruder | {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": "0" * 64}
    assert attempt(wrong, "wrong-token") == ("REFUSED", False)
    # The same attempt with the cluster's token gets in: the refusals were the token's.
    assert attempt(dict(os.environ), "token") == ("RAN", True)


def test_fleet_without_the_clusters_token_is_told_at_once(tmp_path, ray_cluster):
    job = _job(tmp_path)
    run = ["run", str(job), "--output-dir", str(tmp_path / "runs"), "--plain"]
    run += ["--cluster", ray_cluster.address]
    none = _fleet(*run, env=without_token(), timeout=60)
    assert none.returncode == 2, none.stderr[-3000:]
    assert "requires its token, and this process would not send one" in none.stderr
    wrong = _fleet(
        *run,
        env=without_token() | {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": "0" * 64},
        timeout=60,
    )
    assert wrong.returncode == 2, wrong.stderr[-3000:]
    assert "refused this process: its token is missing or not the cluster's" in wrong.stderr
    assert not (tmp_path / "runs").exists() or not RunDir.list(tmp_path / "runs")


def test_doctor_on_a_cluster_with_token_auth_checks_each_node(ray_cluster, all_images_on_nodes):
    done = _fleet("doctor", "--cluster", ray_cluster.address, env=dict(os.environ))
    assert done.returncode == 0, done.stdout + done.stderr
    lines = done.stdout.splitlines()
    assert lines[0] == (
        f"ok    ray token auth: the cluster at {ray_cluster.address} refuses a process "
        "without its token"
    )
    for node in ray_cluster.nodes:
        where = f"node {ray_cluster.name(node)} "
        mine = [line.split(where, 1)[1] for line in lines if where in line]
        assert {m.split(":")[0] for m in mine} >= {"engine", "images", "host firewall"}, lines
        assert not any(line.startswith("FAIL") for line in lines)
