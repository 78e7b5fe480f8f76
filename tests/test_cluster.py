"""``fleet run --cluster``: members on the nodes of a Ray cluster, end to end.

The cluster is ``ray_cluster`` (head + 2 nodes with ``fleet_slots``, token
authentication on, the nodes on a Docker engine and home directory of their own, not
the coordinator's); the fan-out contract itself runs against it in ``test_fanout.py``.
Here the real ``fleet`` command runs against it: a mixed job's run directory has the
same shape as on one machine and none of its boxes ever exists on the coordinator's
engine, a node removed mid-run costs only a retry of its members, Ctrl-C leaves no box
on any node (a SIGKILL followed by ``fleet resume --cluster``:
``test_cluster_resume.py``), a node whose images are not the run's refuses the run up
front, a node member's policy asks are answered from the coordinator's approval queue,
and a node member's stdio MCP server gets its files
through Ray. Offline models throughout: a node's model client would read its own
environment, never the coordinator's.

Each ``fleet run --cluster`` costs a node actor per node (a process that imports the
agent loop) before its first member starts, so checks that need the same kind of run
share one: a job wider than the cluster's slots also shows ``--approve-all`` answering
node members and a repository linking ``/proc/self`` leaking nothing; the run whose
only node is lost loses it while its member waits for an answer.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import anyio
import pytest
from process_support import popen
from ray_support import SLOTS, ship_by_value

from coordinator.fanout.fanout import MemberUnit, fan_out
from coordinator.job.jobfile import parse_job
from coordinator.job.spec import RetryPolicy
from coordinator.nodes.node import NodeDeps
from coordinator.nodes.worker import Recorder, Services
from coordinator.oversight.approvals import ApprovalQueue
from coordinator.rundir.runs import RunDir
from sandbox.docker.backend import DockerBackend
from sandbox.docker.reaper import fleet_home, pid_alive
from subagents.model.offline import OfflineModel, with_required_fields
from subagents.spec import MemberSpec
from subagents.tools.mcp import McpServerSpec
from subagents.trace import read_trace

pytestmark = [pytest.mark.docker, pytest.mark.slow]
FLEET = [str(Path(sys.executable).with_name("fleet"))]
EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


def _fleet(*args: str, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "FLEET_CLUSTER"}
    return subprocess.run([*FLEET, *args], env=env, capture_output=True, text=True, timeout=timeout)


def _boxes(docker_client: Any, run_id: str) -> list[dict[str, Any]]:
    return docker_client.api.containers(all=True, filters={"label": f"fleet.run={run_id}"})


def _started_on(run: RunDir) -> dict[str, list[str]]:
    """Member -> the node of each attempt, from the journal."""
    out: dict[str, list[str]] = {}
    for e in run.journal.read():
        if e.event == "member_started":
            out.setdefault(e.member, []).append(e.node or "")
    return out


def _files(run: RunDir) -> dict[str, set[str]]:
    """Member -> its files, relative to its directory."""
    root = run.path / "members"
    return {
        m.name: {str(p.relative_to(m)) for p in m.rglob("*") if p.is_file()}
        for m in sorted(root.iterdir())
    }


def _wait_for(pred: Callable[[], bool], seconds: float, what: str) -> None:
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        if pred():
            return
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}")


def _slow_first(seconds: int) -> str:
    """A test command that takes ``seconds`` the first time it runs in a box (while a
    test removes the member's node, say) and is quick after that: the offline coder
    runs its test three times, and only the first run needs to be slow."""
    return f"[ -e /tmp/slept ] || {{ touch /tmp/slept && sleep {seconds}; }}; python3 test_greet.py"


def _coder_job(tmp_path: Path, members: int, *, test: str, max_parallel: int) -> Path:
    """Coding members on a copy of the sample repository; each re-runs ``test``."""
    shutil.copytree(EXAMPLES / "sample-repo", tmp_path / "sample-repo")
    lines = ['name = "coders"', "[model]", 'name = "offline"']
    lines += ["[fanout]", f"max_parallel = {max_parallel}", f"min_success = {members}"]
    lines += ['retry = { attempts = 3, backoff_s = 0.5, on = ["crashed"] }']
    for i in range(members):
        lines += [
            "[[members]]",
            f'id = "c{i}"',
            'kind = "coding"',
            'task = "Replace `Hello, {name}!` with `Hello there, {name}!` in `greet.py`."',
            'repo = "sample-repo"',
            f"test = {json.dumps(test)}",
        ]
    job = tmp_path / "job.toml"
    job.write_text("\n".join(lines) + "\n")
    return job


@contextmanager
def _cluster_run(
    tmp_path: Path, job: Path, address: str, *flags: str
) -> Iterator[tuple[subprocess.Popen[str], RunDir]]:
    """``fleet run JOB --cluster ADDRESS [FLAGS]`` in the background, once its run
    directory exists; killed at the end if it still runs."""
    env = {k: v for k, v in os.environ.items() if k != "FLEET_CLUSTER"}
    args = ["run", str(job), "--output-dir", str(tmp_path / "runs"), "--plain", *flags]
    proc = popen(
        [*FLEET, *args, "--cluster", address],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        _wait_for(lambda: bool(RunDir.list(tmp_path / "runs")), 60, "the run directory")
        (run,) = RunDir.list(tmp_path / "runs")
        yield proc, run
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)


def test_without_cluster_ray_is_never_imported(tmp_path, images, cleanup):
    job = tmp_path / "job.toml"
    job.write_text(
        'name = "t"\n[model]\nname = "offline"\n[[members]]\nid = "c"\nkind = "coding"\n'
        'task = "Say hello."\nlimits = { max_turns = 2 }\n'
    )
    cleanup.append(tmp_path / "runs")
    code = (
        "import sys\nfrom coordinator.cli import main\n"
        f"rc = main(['run', {str(job)!r}, '--output-dir', {str(tmp_path / 'runs')!r}, '--plain'])\n"
        "print('RAY' if any(m.split('.')[0] == 'ray' for m in sys.modules) else 'NO-RAY', rc)\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "FLEET_CLUSTER"}
    done = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300
    )
    assert done.stdout.split()[-2:] in (["NO-RAY", "0"], ["NO-RAY", "1"]), done.stderr[-2000:]
    assert RunDir.list(tmp_path / "runs"), "the run happened"


def test_mixed_job_on_two_nodes_has_the_shape_of_a_local_run(
    tmp_path, ray_cluster, node_client, docker_client, cleanup, all_images_on_nodes
):
    shutil.copytree(EXAMPLES, tmp_path / "examples")
    job = str(tmp_path / "examples" / "mixed.toml")
    cleanup += [tmp_path / "here", tmp_path / "there"]
    with _engine_events(docker_client) as seen, _engine_events(node_client) as on_nodes:
        here = _fleet("run", job, "--output-dir", str(tmp_path / "here"), "--plain")
        there = _fleet(
            "run", job, "--output-dir", str(tmp_path / "there"), "--plain",
            "--cluster", ray_cluster.address,
        )  # fmt: skip
    assert here.returncode == 0, here.stderr[-3000:]
    assert there.returncode == 0, there.stderr[-3000:]
    (local,) = RunDir.list(tmp_path / "here")
    (remote,) = RunDir.list(tmp_path / "there")
    # The same members, statuses and files: pages, patch, memory working copy...
    assert remote.state().members == local.state().members
    assert set(remote.state().members.values()) == {"ok"}
    assert _files(remote) == _files(local)
    assert {p.name for p in remote.path.iterdir()} == {p.name for p in local.path.iterdir()}
    for member in local.state().members:
        mine, theirs = remote.outcome(member), local.outcome(member)
        # The offline coder's summary counts the files its first glob saw, which races
        # with its first test run writing __pycache__ (on one machine as on a node).
        same = {k: v for k, v in mine.result.model_dump().items() if k != "summary"}
        assert same == {k: v for k, v in theirs.result.model_dump().items() if k != "summary"}
        assert mine.status == theirs.status
    # Each member's node is in the journal; members were spread over both nodes.
    nodes = {ray_cluster.name(n) for n in ray_cluster.nodes}
    started = _started_on(remote)
    assert all(len(v) == 1 and v[0] in nodes for v in started.values()), started
    assert {v[0] for v in started.values()} == nodes
    assert all(not v[0] for v in _started_on(local).values())
    # The coder's memory changes came back and were merged into the profile here.
    profile = tmp_path / "there" / "memory" / "greeter"
    assert sorted(p.name for p in profile.iterdir() if p.name != ".fleet") == sorted(
        p.name for p in (tmp_path / "here" / "memory" / "greeter").iterdir() if p.name != ".fleet"
    )
    # fleet trace shows where each member ran, in the table and in --json.
    table = _fleet("trace", str(remote.path))
    assert table.returncode == 0 and "NODE" in table.stdout.splitlines()[2]
    rows = json.loads(_fleet("trace", str(remote.path), "--json").stdout)["members"]
    assert {r["member"]: r["node"] for r in rows} == {m: v[0] for m, v in started.items()}
    assert "NODE" not in _fleet("trace", str(local.path)).stdout
    assert _boxes(node_client, remote.id) == []
    # Neither run is left marked live on this host (the nodes mark their own share).
    assert not (fleet_home() / "live" / remote.id).exists()
    assert not (fleet_home() / "live" / local.id).exists()
    # The nodes' boxes and networks lived on the nodes' engine alone: the coordinator's
    # engine never saw one (it saw the local run's, so it was listening).
    assert local.id in str(seen) and remote.id not in str(seen)
    assert remote.id in str(on_nodes)


@contextmanager
def _engine_events(client: Any) -> Iterator[list[dict[str, Any]]]:
    """Every container and network event of an engine while the block runs, as it
    happens (an engine keeps only its last 256 events: a busy one has dropped a run's
    by the time it ends)."""
    seen: list[dict[str, Any]] = []
    stream = client.events(decode=True, filters={"type": ["container", "network"]})

    def read() -> None:
        with contextlib.suppress(Exception):  # the stream closed under it: done
            for event in stream:
                seen.append(event)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        yield seen
    finally:
        stream.close()
        reader.join(10)


def test_a_node_lost_mid_run_costs_only_a_retry_of_its_members(
    tmp_path, ray_cluster, node_client, cleanup
):
    doomed = ray_cluster.add_node(slots=2)
    name = ray_cluster.name(doomed)
    cleanup.append(tmp_path / "runs")
    job = _coder_job(tmp_path, 6, test=_slow_first(6), max_parallel=6)
    with _cluster_run(tmp_path, job, ray_cluster.address) as (proc, run):
        on_doomed = lambda: [m for m, v in _started_on(run).items() if v[-1] == name]  # noqa: E731
        _wait_for(lambda: len(on_doomed()) == 2, 120, f"two members started on {name}")
        victims = on_doomed()
        time.sleep(2)  # well into their test's sleep
        ray_cluster.remove_node(doomed)
        _, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err[-3000:]
    st = run.state()
    assert set(st.members.values()) == {"ok"}
    retries = [e for e in run.journal.read() if e.event == "member_retry"]
    assert sorted(e.member for e in retries) == sorted(victims)
    for e in retries:
        assert e.status == "crashed" and e.reason.startswith(f"node {name} lost: ")
    started = _started_on(run)
    for m in victims:  # retried on a node that was still there
        assert len(started[m]) == 2 and started[m][1] not in ("", name)
    for m in set(started) - set(victims):  # the others ran once, their results kept
        assert len(started[m]) == 1 and run.outcome(m).status == "ok"
    # The lost node's boxes outlived it (same engine); gc on the cluster finds them
    # by the node's liveness rule: its actor, their owner, is gone.
    gc = _fleet("sandbox", "gc", "--cluster", ray_cluster.address)
    assert gc.returncode == 0, gc.stderr
    assert _boxes(node_client, run.id) == []


def test_ctrl_c_leaves_no_box_on_any_node(tmp_path, ray_cluster, node_client, cleanup):
    cleanup.append(tmp_path / "runs")
    job = _coder_job(tmp_path, 4, test="sleep 60", max_parallel=4)
    with _cluster_run(tmp_path, job, ray_cluster.address) as (proc, run):
        _wait_for(lambda: len(_boxes(node_client, run.id)) >= 4, 120, "four boxes")
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err[-3000:]
    assert run.state().status == "interrupted"
    assert _boxes(node_client, run.id) == []


def test_a_node_without_the_runs_images_refuses_the_run(tmp_path, ray_cluster, cleanup):
    # A node whose images were built with another CA bundle: its image tags differ from
    # this checkout's, so it has none of the run's images.
    (tmp_path / "cfg").mkdir()
    bundle = Path("/etc/ssl/certs/ca-certificates.crt").read_text()
    first = bundle[: bundle.index("-----END CERTIFICATE-----") + 26]
    (tmp_path / "cfg" / "extra-ca.pem").write_text(first)
    stale = ray_cluster.add_node(slots=1, env={"FLEET_CONFIG_DIR": str(tmp_path / "cfg")})
    try:
        job = _coder_job(tmp_path, 1, test="true", max_parallel=1)
        done = _fleet(
            "run", str(job), "--output-dir", str(tmp_path / "runs"),
            "--cluster", ray_cluster.address,
        )  # fmt: skip
    finally:
        ray_cluster.remove_node(stale)
    assert done.returncode == 2, done.stderr[-3000:]
    assert f"node {ray_cluster.name(stale)}: image fleet-coding:" in done.stderr
    assert "is missing" in done.stderr and "fleet setup" in done.stderr
    assert "Traceback" not in done.stderr
    assert not (tmp_path / "runs").exists() or not RunDir.list(tmp_path / "runs")


def test_a_node_engine_without_the_coding_image_is_fixed_by_images_push(
    tmp_path, ray_cluster, node_client, docker_client, images, cleanup
):
    from node_engine import copy_images

    ref = images["coding"]
    node_client.images.remove(ref)  # the nodes' engine lacks it (its layers stay, base's)
    cleanup.append(tmp_path / "runs")
    try:
        job = _coder_job(tmp_path, 1, test="true", max_parallel=1)
        run = ("run", str(job), "--output-dir", str(tmp_path / "runs"), "--plain")
        refused = _fleet(*run, "--cluster", ray_cluster.address)
        assert refused.returncode == 2, refused.stderr[-3000:]
        for node in ray_cluster.nodes:
            assert f"node {ray_cluster.name(node)}: image {ref} is missing" in refused.stderr
        assert f"'fleet images push --cluster {ray_cluster.address}'" in refused.stderr
        assert not (tmp_path / "runs").exists() or not RunDir.list(tmp_path / "runs")

        pushed = _fleet("images", "push", "--cluster", ray_cluster.address)
        assert pushed.returncode == 0, pushed.stderr[-3000:]
        # The two nodes share one engine: it got the image once, and only that one.
        assert pushed.stderr.count(f": loading {ref}\n") == 1, pushed.stderr
        assert "images pushed to 1 engine(s)" in pushed.stderr
        assert node_client.images.get(ref).id == docker_client.images.get(ref).id  # its bytes
        again = _fleet("images", "push", "--cluster", ray_cluster.address)
        assert again.returncode == 0 and "loading" not in again.stderr, again.stderr
        assert "images pushed to 0 engine(s)" in again.stderr

        done = _fleet(*run, "--cluster", ray_cluster.address)
        assert done.returncode == 0, done.stderr[-3000:]
    finally:
        with contextlib.suppress(Exception):
            node_client.images.get(ref)
            ref = ""
        if ref:  # the later tests need it
            copy_images(ray_cluster.engine.host, [ref])


def test_a_wide_job_runs_as_many_at_once_as_the_slots_approve_all_answers_and_no_secret_leaks(
    tmp_path, ray_cluster, node_client, monkeypatch, cleanup
):
    # One run shows three things: a job that does not say how many members run at once
    # runs as many as the nodes offer fleet_slots; --approve-all answers node members'
    # asks; a repository linking /proc/self sends none of the coordinator's environment.
    from test_repo_escape import _all_bytes, _linked_out

    marker = secrets.token_hex(16)
    monkeypatch.setenv("FLEET_TEST_MARKER", marker)  # in the coordinator's environment
    _linked_out(tmp_path / "proj", "/proc/self", "environ", ignore=".gitignore")
    coders = SLOTS * len(ray_cluster.nodes) + 1  # with the linked one: past the slots
    job = _asking_job(tmp_path, coders - 1, max_parallel=1)
    text = job.read_text().replace("max_parallel = 1\n", "")  # the job does not say
    policy = text.index("[policy]")
    linked = (
        '[[members]]\nid = "linked"\nkind = "coding"\nrepo = "proj"\n'
        'test = "cat p/environ; true"\ntask = "replace `world` with `fleet` in `greet.txt`"\n'
    )
    job.write_text(text[:policy] + linked + text[policy:])
    slots = SLOTS * len(ray_cluster.nodes)  # the session's nodes, each with SLOTS
    out = tmp_path / "runs"
    cleanup.append(out)
    done = _fleet(
        "run", str(job), "--output-dir", str(out), "--plain", "--approve-all",
        "--cluster", ray_cluster.address,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    assert f"{slots} at once: the cluster's nodes offer {slots} fleet_slots" in done.stderr
    (run,) = RunDir.list(out)
    assert _boxes(node_client, run.id) == []
    nodes = {ray_cluster.name(n) for n in ray_cluster.nodes}
    started = _started_on(run)
    assert len(started) == coders and all(v[0] in nodes for v in started.values()), started
    # Every member's one ask was answered by --approve-all, on whichever node it ran.
    assert _decisions(run) == {m: [("approve-all", True)] for m in started}
    assert all(_edited(run, f"c{i}") for i in range(coders - 1))
    # The linked repository: nothing of /proc/self/environ anywhere in the run's files.
    assert marker.encode() not in _all_bytes(out)
    result = run.outcome("linked")
    assert result.result.files_changed == ["greet.txt"]
    assert result.not_copied[0].startswith("p/environ: p is a symbolic link (to /proc/self)")


def test_a_members_own_image_missing_on_the_nodes_refuses_the_run(tmp_path, ray_cluster):
    job = _coder_job(tmp_path, 1, test="true", max_parallel=1)
    job.write_text(job.read_text() + 'sandbox = { image = "fleet-no-such-image:1" }\n')
    done = _fleet(
        "run", str(job), "--output-dir", str(tmp_path / "runs"), "--cluster", ray_cluster.address
    )
    assert done.returncode == 2, done.stderr[-3000:]
    for node in ray_cluster.nodes:
        assert (
            f"node {ray_cluster.name(node)}: image 'fleet-no-such-image:1' "
            "(members[0].sandbox.image) is not on its engine" in done.stderr
        )
    assert not (tmp_path / "runs").exists() or not RunDir.list(tmp_path / "runs")


def test_a_frozen_node_is_met_by_the_coordinators_own_deadline(
    tmp_path, ray_cluster, node_client, cleanup
):
    frozen = ray_cluster.add_node(slots=8)  # the most slots: the run's one slot is here
    name = ray_cluster.name(frozen)
    cleanup.append(tmp_path / "runs")
    # c1 runs after c0, on another node: the frozen node is fenced while it does.
    job = _coder_job(tmp_path, 2, test="sleep 30", max_parallel=1)
    text = job.read_text().replace("min_success = 2", "min_success = 1")
    job.write_text(
        text.replace('test = "sleep 30"', 'test = "sleep 30"\nlimits = { deadline_s = 8 }')
    )
    stopped: list[int] = []
    try:
        with _cluster_run(tmp_path, job, ray_cluster.address) as (proc, run):
            _wait_for(lambda: _started_on(run).get("c0") == [name], 120, f"c0 on {name}")
            # The node's actor (its live marker names it) stops: no deadline of its own
            # fires there, no event comes back, and Ray does not see it die.
            marker = Path(frozen.fleet_env["FLEET_HOME"]) / "live" / f"{run.id}@{name}"
            _wait_for(marker.exists, 60, "the node's live marker")
            stopped.append(int(marker.read_text().split()[0]))
            os.kill(stopped[0], signal.SIGSTOP)
            t0 = time.monotonic()
            # Fenced: the coordinator killed the actor it gave up on while the run went
            # on (Ray does not see a stopped process die): a node that wakes up cannot
            # go on with a member that runs elsewhere.
            _wait_for(lambda: not pid_alive(stopped[0]), 60, "the fenced actor to end")
            assert run.state().members.get("c1") in (None, "queued", "running"), run.state()
            _, err = proc.communicate(timeout=120)
        waited = time.monotonic() - t0
    finally:
        for pid in stopped:  # the frozen node goes for good, its actor first
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        ray_cluster.remove_node(frozen)
    assert proc.returncode == 1, err[-3000:]
    result = run.outcome("c0")
    assert result.status == "timed_out"
    assert result.reason == f"deadline of 8s passed (node {name} did not report)"
    assert waited < 90, "the run ended by the coordinator's deadline, not by Ray's verdict"
    assert _started_on(run)["c1"][-1] != name
    # Once the node is gone with its actor, gc takes its box (its owner is dead).
    gc = _fleet("sandbox", "gc", "--cluster", ray_cluster.address)
    left = [(b["Names"], b["Labels"], b["State"]) for b in _boxes(node_client, run.id)]
    assert left == [], (gc.stdout, gc.stderr[-2000:], os.listdir(marker.parent))


def _asking_job(tmp_path: Path, members: int, max_parallel: int) -> Path:
    """Coders whose policy asks before every edit_file (the offline coder makes one)."""
    job = _coder_job(tmp_path, members, test="python3 test_greet.py", max_parallel=max_parallel)
    job.write_text(job.read_text() + '[policy]\nask = ["edit_file"]\n')
    return job


def _asks(run: RunDir, member: str) -> list[dict[str, Any]]:
    """The member's requests in the run's approval queue (the coordinator's), oldest first."""
    return [r for r in ApprovalQueue(run.path / "approvals").requests() if r["member"] == member]


def _decisions(run: RunDir) -> dict[str, list[tuple[str, bool]]]:
    """Member -> (by, allowed) of each policy decision, from the journal."""
    out: dict[str, list[tuple[str, bool]]] = {}
    for e in run.journal.read():
        if e.event == "policy_decision":
            out.setdefault(e.member, []).append((e.by, e.allowed))
    return out


def _edited(run: RunDir, member: str) -> bool:
    """Whether the member's edit of greet.py ran (the offline coder's report says)."""
    result = run.outcome(member)
    refused = "edit in greet.py was refused by edit_file (see the trace)" in result.result.notes
    applied = "Applied 1 stated edit(s) in greet.py." in result.result.summary
    assert refused != applied, result
    return applied


def test_asks_from_node_members_are_answered_by_fleet_approve(
    tmp_path, ray_cluster, node_client, cleanup
):
    cleanup.append(tmp_path / "runs")
    job = _asking_job(tmp_path, 2, max_parallel=2)
    with _cluster_run(tmp_path, job, ray_cluster.address, "--wait-approval") as (proc, run):
        _wait_for(lambda: _asks(run, "c0") and _asks(run, "c1"), 120, "both members' asks")
        # Both wait on their nodes, their asks in this run's own queue.
        assert set(run.state().members.values()) == {"running"}
        for member, answer in (("c0", "--yes"), ("c1", "--no")):
            (ask,) = _asks(run, member)
            assert ask["tool"] == "edit_file" and ask["input"]["path"] == "greet.py"
            done = _fleet("approve", str(run.path), answer, "--id", ask["id"])
            assert done.returncode == 0, done.stdout + done.stderr
        _, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err[-3000:]
    nodes = {ray_cluster.name(n) for n in ray_cluster.nodes}
    assert {v[0] for v in _started_on(run).values()} == nodes  # one member on each node
    assert _decisions(run) == {"c0": [("fleet approve", True)], "c1": [("fleet approve", False)]}
    assert _edited(run, "c0") and not _edited(run, "c1")
    assert _boxes(node_client, run.id) == []


def test_a_run_whose_only_node_is_lost_while_its_member_waits_for_an_answer_goes_on_on_another(
    tmp_path, ray_cluster, node_client, cleanup
):
    # One member at a time: the run holds one slot, on the node with the most of them.
    doomed = ray_cluster.add_node(slots=8)
    name = ray_cluster.name(doomed)
    cleanup.append(tmp_path / "runs")
    job = _asking_job(tmp_path, 2, max_parallel=1)
    with _cluster_run(tmp_path, job, ray_cluster.address, "--wait-approval") as (proc, run):
        _wait_for(lambda: _asks(run, "c0"), 120, "c0's ask")
        assert _started_on(run)["c0"] == [name]
        ray_cluster.remove_node(doomed)
        # Retried on another node, the member asks again; the first ask is closed.
        _wait_for(lambda: len(_asks(run, "c0")) == 2, 120, "c0's second ask")
        first, again = _asks(run, "c0")
        assert first["answer"]["by"] == "abandoned" and again["answer"] is None
        for member in ("c0", "c1"):  # c1 starts once c0 is done, and asks in turn

            def pending(m: str = member) -> list[dict[str, Any]]:
                return [a for a in _asks(run, m) if a["answer"] is None]

            _wait_for(lambda: bool(pending()), 120, f"{member}'s open ask")
            (ask,) = pending()
            done = _fleet("approve", str(run.path), "--yes", "--id", ask["id"])
            assert done.returncode == 0, done.stdout + done.stderr
        _, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err[-3000:]
    assert set(run.state().members.values()) == {"ok"}
    (retry,) = [e for e in run.journal.read() if e.event == "member_retry"]
    assert retry.member == "c0" and retry.status == "crashed"
    assert retry.reason.startswith(f"node {name} lost: ")
    started = _started_on(run)
    assert len(started["c0"]) == 2 and started["c0"][1] != name
    assert started["c1"] == [started["c0"][1]]  # the run went on where c0 went
    others = {ray_cluster.name(n) for n in ray_cluster.nodes}
    assert all(v[-1] in others for v in started.values())
    assert _decisions(run) == {m: [("fleet approve", True)] for m in ("c0", "c1")}
    assert run.outcome("c0").status == "ok" and _edited(run, "c0") and _edited(run, "c1")
    # The lost node's boxes did not outlive it: the actor that took over its slots, on
    # the same engine, removed them (their owner was killed when its node was taken for
    # lost, before Ray's health checks gave up on it) - no gc.
    assert _boxes(node_client, run.id) == []
    gc = _fleet("sandbox", "gc", "--cluster", ray_cluster.address, "--dry-run")
    assert gc.returncode == 0 and f"run {run.id}" not in gc.stdout, gc.stdout
    gc = _fleet("sandbox", "gc", "--cluster", ray_cluster.address)
    assert gc.returncode == 0, gc.stderr
    assert _boxes(node_client, run.id) == []


def _echo_then_submit(request: Any) -> list[dict[str, Any]]:
    """An offline model that calls the echo server's tool once, then submits."""
    done = [
        b
        for m in request.messages
        if isinstance(m["content"], list)
        for b in m["content"]
        if b.get("type") == "tool_result"
    ]
    if not done:
        return [{"type": "tool_use", "name": "mcp__echo__echo", "input": {"text": "from a node"}}]
    args = {"summary": "echoed", "tests_run": [], "notes": []}
    return [
        {"type": "tool_use", "name": "submit_result", "input": with_required_fields(request, args)}
    ]


class _HostWithoutTheFiles(DockerBackend):
    """A node's engine on a host that, like a real node, has no copy of the
    coordinator's files: its first box removes them (the attempt's request, with
    whatever was shipped, is already on the node then)."""

    def __init__(self, files: Path, **kw: Any) -> None:
        super().__init__(**kw)
        self.files = files

    async def create(self, spec: Any, **kw: Any) -> Any:
        shutil.rmtree(self.files, ignore_errors=True)
        return await super().create(spec, **kw)


class _McpNode:
    """The node side of the MCP test (built on each node)."""

    def __init__(self, images: dict[str, str], files: Path) -> None:
        self.images, self.files = images, files

    def __call__(self, node: str = "") -> NodeDeps:
        backend = _HostWithoutTheFiles(self.files, images=self.images, node=node)
        return NodeDeps(
            backend=backend, make_model=lambda name, **kw: OfflineModel(_echo_then_submit)
        )


def test_a_node_members_stdio_mcp_server_gets_its_files_through_ray(
    tmp_path, ray_cluster, images, run_id
):
    from coordinator.nodes.cluster import RayNodes

    ship_by_value(sys.modules[__name__])
    files = tmp_path / "mcp"  # the server's files, on the coordinator's host only
    shutil.copytree(EXAMPLES / "mcp", files)
    job = parse_job('name = "t"\n[research]\nquestion = "q"')
    run = RunDir.create(job, "", root=tmp_path, name=run_id)
    server = McpServerSpec(name="echo", command="python3 echo_server.py", files=str(files))
    spec = MemberSpec(id="coder", kind="coding", task="Echo.", model="offline", mcp=[server])
    unit = MemberUnit(
        run_id=run.id,
        member_dir=str(run.member_dir("coder")),
        spec=spec.model_copy(update={"stated_deadline_s": 120}),
        retry=RetryPolicy(attempts=1),
    )

    async def go() -> Any:
        nodes = RayNodes(ray_cluster.address, setup=_McpNode(images, files))
        try:
            async with nodes.serve(run.id, [unit], Services(max_parallel=1, warm_pool=False)):
                record = Recorder(journal=run.journal.append)
                kw = {"max_parallel": 1, "min_success": 1, "fail_fast": False}
                return await fan_out([unit], record, nodes=nodes, **kw)
        finally:
            await nodes.remove_boxes(run.id)

    outcome = anyio.run(go).outcomes["coder"]
    assert outcome.status == "ok", outcome.reason
    assert not files.exists()  # the node had only what came with the request
    assert _started_on(run)["coder"][0] in {ray_cluster.name(n) for n in ray_cluster.nodes}
    trace = list(read_trace(run.member_dir("coder") / "trace.jsonl"))
    (call,) = [e.call_id for e in trace if e.type == "tool_call" and e.tool == "mcp__echo__echo"]
    (result,) = [e for e in trace if e.type == "tool_result" and e.call_id == call]
    assert not result.is_error
    assert result.output == (
        '<untrusted_page_content url="mcp://echo/echo">\nfrom a node\n</untrusted_page_content>'
    )


def test_a_lead_jobs_members_run_on_the_nodes(
    tmp_path, ray_cluster, node_client, cleanup, all_images_on_nodes
):
    cleanup.append(tmp_path / "runs")
    question = "How are asyncio tasks cancelled by the zorblax scheduler?"
    done = _fleet(
        "research", question, "--lead", "--members", "1", "--max-waves", "2",
        "--model", "offline", "--output-dir", str(tmp_path / "runs"), "--plain",
        "--cluster", ray_cluster.address,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    (run,) = RunDir.list(tmp_path / "runs")
    assert run.state().status == "succeeded"
    # Both waves' members - the first wave's browser member, the second's browser and
    # coding members - ran on the cluster's nodes, each once.
    spawned = [m for e in run.journal.read() if e.event == "lead_spawn" for m in e.members]
    assert sorted(m.kind for m in spawned) == ["browser", "browser", "coding"]
    nodes = {ray_cluster.name(n) for n in ray_cluster.nodes}
    started = _started_on(run)
    assert set(started) == {m.id for m in spawned}
    assert all(len(v) == 1 and v[0] in nodes for v in started.values()), started
    assert {run.outcome(m).status for m in started} == {"ok"}
    # The second wave's two members ran at once, as on one machine: the run holds
    # slots for the members of later waves, not only for the first wave's one.
    ts = {(e.event, getattr(e, "member", None)): e.ts for e in run.journal.read()}
    assert ts[("member_started", "w2-2")] < ts[("member_finished", "w2-1")]
    assert ts[("member_started", "w2-1")] < ts[("member_finished", "w2-2")]
    # The second wave's browser member got the box the node holding the first wave's
    # browser pool started for it when the wave was spawned, not one of its own.
    (first,) = [m.id for m in spawned if m.id.startswith("w1-")]
    (later,) = [m.id for m in spawned if m.kind == "browser" and m.id.startswith("w2-")]
    assert started[later] == started[first]
    created = [
        e.box
        for e in read_trace(run.member_dir(later) / "trace.jsonl")
        if e.type == "sandbox" and e.action == "create"
    ]
    assert len(created) == 1 and "-pool-" in created[0], created
    report = json.loads((run.path / "report.json").read_text())
    assert report["analyst"] == "offline lead" and "2 wave(s)" in report["summary"]
    assert _boxes(node_client, run.id) == []


class _Holder:
    """Stands for a node's actor serving a run: alive while the test holds it."""

    def ping(self) -> bool:
        return True


def test_gc_on_the_cluster_takes_dead_actors_boxes_with_their_network_and_no_live_ones(
    ray_cluster, node_client, images
):
    import ray
    from conftest import remove_run

    from sandbox.cluster.nodes import actor_name, connect
    from sandbox.docker.network import network_name
    from sandbox.docker.reaper import box_labels, network_labels
    from sandbox.spec import SandboxSpec

    ship_by_value(sys.modules[__name__])
    node = ray_cluster.name(ray_cluster.nodes[0])
    dead, live, foreign = (f"test-{secrets.token_hex(6)}" for _ in range(3))
    # (run, node): no actor serves `dead` (its coordinator was killed, say); `live` is
    # served right now by an actor of a node whose markers are on another disk; the
    # third run's node is another cluster's, on the same engine.
    owners = [(dead, node), (live, node), (foreign, "10.9.9.9-abcdef")]
    connect(ray_cluster.address)
    holder = (
        ray.remote(_Holder)
        .options(name=actor_name(live, node), namespace="fleet", num_cpus=0)
        .remote()
    )
    ray.get(holder.ping.remote(), timeout=60)
    try:
        for run, where in owners:
            net = network_name(run, where)
            node_client.networks.create(net, internal=True, labels=network_labels(run, where))
            for member in ("m1", "m2"):
                node_client.containers.create(
                    images["coding"], ["true"], network=net,
                    labels=box_labels(SandboxSpec(), run, member, where),
                )  # fmt: skip
        gc = _fleet("sandbox", "gc", "--cluster", ray_cluster.address)
        assert gc.returncode == 0, gc.stderr
        assert f"removed network {network_name(dead, node)}" in gc.stdout
        for member in ("m1", "m2"):
            assert f"(run {dead}, member {member}, node {node})" in gc.stdout, gc.stdout
        assert _boxes(node_client, dead) == []
        assert not node_client.networks.list(filters={"label": f"fleet.run={dead}"})
        for run in (live, foreign):
            assert len(_boxes(node_client, run)) == 2
            assert node_client.networks.list(filters={"label": f"fleet.run={run}"})
    finally:
        ray.kill(holder)
        for run, _ in owners:
            remove_run(node_client, run)


def test_a_push_sends_a_node_only_the_images_asked_for_once_per_engine():
    from sandbox.images.push import plan

    def node(n: int) -> dict[str, str]:
        return {"NodeManagerAddress": "10.0.0.1", "NodeID": f"{n:06d}ffff"}

    ours = "fleet-coding:abc"
    found: list[tuple[dict[str, str], Any]] = [
        # A node that says it lacks another image this host has: it gets nothing.
        (node(1), {"engine": "e1", "missing": [ours, "internal-secrets:1"]}),
        (node(2), {"engine": "e1", "missing": [ours]}),
        (node(3), {"engine": "e1", "missing": [ours]}),  # the same engine: sent once
        (node(4), {"engine": "e2", "missing": ["fleet-coding:other"]}),  # another Fleet
        (node(5), {"engine": "e3", "missing": []}),
        (node(6), RuntimeError("engine down")),
    ]
    done = plan(found, {ours, "internal-secrets:1"}, {"fleet-coding", "fleet-base"})
    assert done.sends == {"e1": (node(2), [ours])}
    assert done.ready == ["10.0.0.1-000005"]
    first, other, down = done.problems
    assert "node 10.0.0.1-000001 asked for internal-secrets:1" in first
    assert "node 10.0.0.1-000004 wants fleet-coding:other" in other
    assert "another version" in other
    assert down == "node 10.0.0.1-000006 could not say what it lacks (engine down)"


def test_members_with_a_setup_start_from_its_snapshot_on_their_nodes_engine(
    tmp_path, ray_cluster, node_client, cleanup
):
    # Each node sets up on its own engine, once per key whatever its number of members
    # (nodes that share an engine find each other's snapshot), and its members run
    # offline from it: the project's test imports a package only the wheelhouse has.
    from test_setup_boxes import INSTALL, make_project

    from sandbox.docker import prepared as store

    repo, wheels = make_project(tmp_path)
    setup = (
        f"{{ run = {json.dumps(f'{INSTALL} # {tmp_path}')}, wheels = {json.dumps(str(wheels))} }}"
    )
    lines = [
        'name = "setup-on-nodes"',
        "[model]",
        'name = "offline"',
        "[fanout]",
        "max_parallel = 4",
    ]
    for i in range(4):
        lines += [
            "[[members]]", f'id = "c{i}"', 'kind = "coding"',
            'task = "replace `world` with `fleet` in `greet.txt`"',
            f"repo = {json.dumps(str(repo))}",
            'test = "python3 -m pytest -q -p no:cacheprovider test_dep.py"',
            f"setup = {setup}",
        ]  # fmt: skip
    job = tmp_path / "job.toml"
    job.write_text("\n".join(lines) + "\n")
    out = tmp_path / "runs"
    cleanup.append(out)
    done = _fleet(
        "run", str(job), "--output-dir", str(out), "--plain", "--cluster", ray_cluster.address
    )
    assert done.returncode == 0, done.stderr[-3000:]
    (run,) = RunDir.list(out)
    started = _started_on(run)
    nodes = {node for attempts in started.values() for node in attempts}
    assert nodes <= {ray_cluster.name(n) for n in ray_cluster.nodes} and len(started) == 4
    events = {}
    for m in started:
        lines = (run.member_dir(m) / "trace.jsonl").read_text().splitlines()
        (events[m],) = [
            e
            for e in map(json.loads, lines)
            if e.get("type") == "sandbox" and e.get("action") == "setup"
        ]
        outcome = run.outcome(m)
        assert outcome.status == "ok" and outcome.result.verified.passed, outcome.reason
        assert outcome.result.files_changed == ["greet.txt"]
    made = [m for m, e in events.items() if not e["detail"]["reused"]]
    assert 1 <= len(made) <= len(nodes), events  # never twice for a node
    (key,) = {e["detail"]["key"] for e in events.values()}
    for info in store.list_all(node_client):
        if info.key.startswith(key):
            store.remove(node_client, info)


def test_a_members_parallel_attempts_run_at_once_on_the_nodes(
    tmp_path, ray_cluster, node_client, cleanup
):
    # max_parallel = 1 member, but its three attempts are three boxes at once: the run
    # reserves slots for all of them, and each attempt is placed like a member.
    job = _coder_job(tmp_path, 1, test="python3 test_greet.py", max_parallel=1)
    job.write_text(job.read_text() + "attempts = 3\n")
    out = tmp_path / "runs"
    cleanup.append(out)
    done = _fleet(
        "run", str(job), "--output-dir", str(out), "--plain", "--cluster", ray_cluster.address
    )
    assert done.returncode == 0, done.stderr[-3000:]
    (run,) = RunDir.list(out)
    outcome = run.outcome("c0")
    assert outcome.status == "ok" and [a.status for a in outcome.attempts] == ["ok"] * 3
    assert outcome.choice is not None and outcome.choice.attempt == 1  # the same change thrice
    started = _started_on(run)
    nodes = {ray_cluster.name(n) for n in ray_cluster.nodes}
    assert all(started[f"c0.{k}"][0] in nodes for k in (1, 2, 3))
    entries = run.journal.read()
    starts = [e.ts for e in entries if e.event == "member_started" and e.member.startswith("c0.")]
    ends = [e.ts for e in entries if e.event == "member_finished" and e.member.startswith("c0.")]
    assert len(starts) == 3 and max(starts) < min(ends), "the attempts ran one after another"
    for k in (1, 2, 3):
        assert (run.path / f"members/c0/attempts/{k}/patch.diff").read_text().strip()
    assert _boxes(node_client, run.id) == []
