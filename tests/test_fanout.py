"""Fan-out isolation with real boxes: a member's failure is its own, never a sibling's.

The harness here is a scripted stand-in for ``run_member`` (each member's task names
a behaviour: succeed after an exec in its box, raise, hang, have its box killed), so
these tests pin the coordinator's own contract - statuses, reasons, retries, quorum,
fail-fast, boxes released - independently of any model. Every check runs twice: with
members on this host, and on a Ray cluster of two nodes (``ray_cluster``), where the
same harness runs in each node's actor - the contract does not depend on where
members run. On the cluster, the checks of a few tests share one fan-out (a cluster
run starts a node actor per node first, seconds of imports each): those tests run
here only (``HERE``) and name the cluster test that repeats them. The end-to-end
tests with the real harness and the fake Messages API are in ``test_cli_run.py`` (and
``test_cluster.py`` for a cluster).
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any

import anyio
import pytest

from coordinator.fanout.fanout import Deps, FanoutResult, MemberUnit, fan_out
from coordinator.job.jobfile import parse_job
from coordinator.job.spec import RetryPolicy
from coordinator.nodes.node import NodeDeps
from coordinator.nodes.worker import Recorder, Services
from coordinator.rundir.runs import RunDir
from sandbox.deferred import DeferredSandbox
from sandbox.docker.backend import DockerBackend
from subagents.context.config import ContextConfig
from subagents.context.memory import MemoryStore
from subagents.model import make_model
from subagents.results.outcome import MemberOutcome
from subagents.spec import MemberSpec

pytestmark = pytest.mark.docker


class ScriptedHarness:
    """Stand-in for ``run_member``: the task's first word says what to do. It counts
    its calls per member in files, so the count holds across a cluster's nodes."""

    def __init__(self, count_dir: Path) -> None:
        self.count_dir = count_dir
        count_dir.mkdir(parents=True, exist_ok=True)

    @property
    def calls(self) -> dict[str, int]:
        return {p.name: int(p.read_text()) for p in self.count_dir.iterdir()}

    async def __call__(self, spec: MemberSpec, *, sandbox, model, run_dir: Path, trace):
        counter = self.count_dir / spec.id
        n = int(counter.read_text()) + 1 if counter.exists() else 1
        counter.write_text(str(n))
        action = spec.task.split()[0]
        if isinstance(sandbox, DeferredSandbox):  # the node starts the box beside the member
            sandbox = await sandbox.ready()
        if (action == "crash-once" and n == 1) or action == "kill-box":
            await anyio.to_thread.run_sync(_kill, sandbox.id)
        if action == "raise":
            raise RuntimeError("tool exploded")
        if action == "hang":
            await anyio.sleep(3600)
        if action == "remember":  # one line into the shared profile, saved as a member saves
            await _remember(spec, run_dir, trace, f"{spec.id} was here")
        res = await sandbox.exec(["sh", "-c", f"echo {spec.id}; hostname"])
        return MemberOutcome(
            member=spec.id,
            kind=spec.kind,
            status="ok",
            result={"summary": res.stdout.split()[0], "notes": [res.stdout.split()[1]]},
            turns=1,
        )


async def _remember(spec: MemberSpec, run_dir: Path, trace: Any, line: str) -> None:
    """Load the member's memory profile, add a line to notes.md and save: the members
    overlap, so each save merges into a profile changed since its load."""
    store = MemoryStore(
        ContextConfig(), host_dir=spec.memory_dir, work_dir=run_dir / "memory",
        sandbox=None, trace=trace,
    )  # fmt: skip
    await store.start()
    notes = store.root / "notes.md"
    notes.write_text(notes.read_text() + line + "\n")
    store.record(notes)
    await anyio.sleep(1.0)  # the sibling loads before this save
    await store.save()


def _kill(container: str) -> None:
    from sandbox.docker.engine import connect

    client = connect()
    try:
        client.containers.get(container).kill()
    finally:
        client.close()


class ScriptedNode:
    """A node's side with the scripted harness (built on each node of a cluster)."""

    def __init__(self, images: dict[str, str], harness: ScriptedHarness) -> None:
        self.images, self.harness = images, harness

    def __call__(self, node: str = "") -> NodeDeps:
        return NodeDeps(
            backend=DockerBackend(images=self.images, node=node),
            # The scripted harness never asks the model; the worker still makes and closes one.
            make_model=lambda name, **kw: make_model("offline:echo"),
            run_member=self.harness,
        )


HERE = pytest.mark.parametrize("where", ["here"], indirect=True)
"""A test whose cluster twin shares a run with others' (see the end of this module)."""


@pytest.fixture(params=["here", "ray"])
def where(request: pytest.FixtureRequest) -> Any:
    """None: members on this host; else the Ray cluster they run on."""
    if request.param == "here":
        return None
    from ray_support import ship_by_value

    ship_by_value(sys.modules[__name__])
    return request.getfixturevalue("ray_cluster")


def _fan(
    where: Any,
    images: dict[str, str],
    harness: ScriptedHarness,
    run: RunDir,
    units: list[MemberUnit],
    *,
    listeners: list[Any] | None = None,
    timing: list[float] | None = None,
    **kw: Any,
) -> FanoutResult:
    """``fan_out`` the units on this host (``where`` None) or on the cluster; appends
    the fan-out's own seconds to ``timing`` (a cluster's node actors start before)."""
    setup = ScriptedNode(images, harness)
    timing = [] if timing is None else timing
    if where is None:
        deps = Deps(**vars(setup()), journal=run.journal.append, listeners=listeners or [])
        t0 = time.monotonic()
        try:
            return anyio.run(lambda: fan_out(units, deps, **kw))
        finally:
            timing.append(time.monotonic() - t0)
    from coordinator.nodes.cluster import RayNodes

    async def go() -> FanoutResult:
        nodes = RayNodes(where.address, setup=setup)
        record = Recorder(journal=run.journal.append, listeners=listeners or [])
        try:
            services = Services(max_parallel=kw["max_parallel"], warm_pool=False)
            async with nodes.serve(run.id, units, services):
                t0 = time.monotonic()
                try:
                    return await fan_out(units, record, nodes=nodes, **kw)
                finally:
                    timing.append(time.monotonic() - t0)
        finally:
            await nodes.remove_boxes(run.id)

    return anyio.run(go)


def _units(
    run: RunDir,
    tasks: dict[str, str],
    *,
    deadline: float = 20,
    attempts: int = 1,
    backoff: float = 0.2,
) -> list[MemberUnit]:
    return [
        MemberUnit(
            run_id=run.id,
            member_dir=str(run.member_dir(mid)),
            spec=MemberSpec(
                id=mid, kind="coding", task=task, model="offline", stated_deadline_s=deadline
            ),
            retry=RetryPolicy(attempts=attempts, backoff_s=backoff),
        )
        for mid, task in tasks.items()
    ]


def _run_dir(tmp_path: Path, run_id: str) -> RunDir:
    job = parse_job('name = "t"\n[research]\nquestion = "q"')
    run = RunDir.create(job, "", root=tmp_path)
    # Use the fixture's run id so its teardown removes anything left behind.
    run.path.rename(tmp_path / run_id)
    return RunDir(tmp_path / run_id)


def _boxes(where: Any, run_id: str) -> list[Any]:
    """The run's containers as the engine lists them (no per-box inspect, which races
    with a box being removed at that moment): this host's engine (``where``: its
    client), or the cluster's node engine (``where``: the cluster)."""
    client = where.engine_client() if hasattr(where, "engine_client") else where
    return client.api.containers(all=True, filters={"label": f"fleet.run={run_id}"})


class _Peak:
    """The most boxes of a run seen at once, counted as each box is created (a trace
    listener)."""

    def __init__(self, where: Any, run_id: str) -> None:
        self.where, self.run_id, self.most = where, run_id, 0

    def __call__(self, event: Any) -> None:
        if getattr(event, "action", "") == "create":
            self.most = max(self.most, len(_boxes(self.where, self.run_id)))


def test_one_raise_one_timeout_one_killed_box_keep_two_results(
    tmp_path, images, run_id, docker_client, where
):
    run = _run_dir(tmp_path, run_id)
    harness = ScriptedHarness(tmp_path / "calls")
    units = _units(
        run,
        {
            "good-1": "ok",
            "good-2": "ok",
            "raiser": "raise",
            "sleeper": "hang",
            "victim": "kill-box",
        },
        deadline=6,
    )
    timing: list[float] = []
    res = _fan(
        where,
        images,
        harness,
        run,
        units,
        timing=timing,
        max_parallel=5,
        min_success=2,
        fail_fast=False,
    )
    elapsed = timing[0]
    st = {k: o.status for k, o in res.outcomes.items()}
    assert st == {
        "good-1": "ok",
        "good-2": "ok",
        "raiser": "failed",
        "sleeper": "timed_out",
        "victim": "crashed",
    }
    assert res.outcomes["good-1"].result.summary == "good-1"
    assert res.outcomes["good-1"].result.notes != res.outcomes["good-2"].result.notes
    reasons = {k: res.outcomes[k].reason for k in ("raiser", "sleeper", "victim")}
    assert "RuntimeError: tool exploded" in reasons["raiser"]
    assert "deadline of 6s" in reasons["sleeper"]
    assert "sandbox crashed: killed" in reasons["victim"]
    assert len(set(reasons.values())) == 3
    assert res.quorum_met and res.ok == 2
    # The hang did not hold the others: all ran in parallel, bounded by the deadline.
    assert elapsed < 20
    # Each member's result.json and journal line record its own status; no box is left.
    for mid, status in st.items():
        assert run.outcome(mid).status == status
    assert run.state().members == st
    assert _boxes(where or docker_client, run_id) == []


@HERE  # on a cluster: test_retries_and_the_concurrency_limit_on_a_cluster
def test_box_crash_is_retried_with_backoff_and_then_succeeds(
    tmp_path, images, run_id, docker_client, where
):
    run = _run_dir(tmp_path, run_id)
    harness = ScriptedHarness(tmp_path / "calls")
    units = _units(run, {"flaky": "crash-once", "steady": "ok"}, attempts=3, backoff=0.5)
    res = _fan(where, images, harness, run, units, max_parallel=2, min_success=2, fail_fast=False)
    assert res.outcomes["flaky"].status == "ok"
    assert harness.calls == {"flaky": 2, "steady": 1}
    retries = [e for e in run.journal.read() if e.event == "member_retry"]
    assert len(retries) == 1 and retries[0].member == "flaky"
    assert "sandbox crashed" in retries[0].reason and retries[0].delay_s == 0.5
    assert run.state().starts == {"flaky": 2, "steady": 1}
    assert _boxes(where or docker_client, run_id) == []


@HERE  # on a cluster: test_failures_the_quorum_and_the_schema_on_a_cluster
def test_task_failure_is_not_retried(tmp_path, images, run_id, docker_client, where):
    run = _run_dir(tmp_path, run_id)
    harness = ScriptedHarness(tmp_path / "calls")
    units = _units(run, {"raiser": "raise"}, attempts=3)
    res = _fan(where, images, harness, run, units, max_parallel=1, min_success=1, fail_fast=False)
    assert res.outcomes["raiser"].status == "failed"
    assert harness.calls == {"raiser": 1}
    assert not res.quorum_met


@HERE  # on a cluster: test_failures_the_quorum_and_the_schema_on_a_cluster
def test_quorum_not_met_when_too_few_members_succeed(
    tmp_path, images, run_id, docker_client, where
):
    run = _run_dir(tmp_path, run_id)
    harness = ScriptedHarness(tmp_path / "calls")
    units = _units(run, {"a": "ok", "b": "raise", "c": "raise"})
    res = _fan(where, images, harness, run, units, max_parallel=3, min_success=2, fail_fast=False)
    assert res.ok == 1 and not res.quorum_met
    assert {o.status for o in res.outcomes.values()} == {"ok", "failed"}


def test_fail_fast_cancels_the_rest_and_removes_their_boxes(
    tmp_path, images, run_id, docker_client, where
):
    run = _run_dir(tmp_path, run_id)
    harness = ScriptedHarness(tmp_path / "calls")
    # One slot: "b" fails first; "c" and "d" are then cancelled (queued or running).
    units = _units(run, {"b": "raise", "c": "hang", "d": "ok"}, deadline=60)
    timing: list[float] = []
    res = _fan(
        where,
        images,
        harness,
        run,
        units,
        timing=timing,
        max_parallel=2,
        min_success=1,
        fail_fast=True,
    )
    assert timing[0] < 30
    assert res.fail_fast_by == "b"
    assert res.outcomes["b"].status == "failed"
    assert res.outcomes["c"].status == "cancelled"
    assert "fail_fast after b failed" in res.outcomes["c"].reason
    assert res.outcomes["d"].status == "cancelled"
    assert _boxes(where or docker_client, run_id) == []
    # Without fail_fast the same failure leaves the siblings alone.
    run2 = _run_dir(tmp_path / "again", run_id)
    units = _units(run2, {"b": "raise", "d": "ok"})
    res = _fan(where, images, harness, run2, units, max_parallel=1, min_success=1, fail_fast=False)
    assert res.outcomes["d"].status == "ok"


@HERE  # on a cluster: test_retries_and_the_concurrency_limit_on_a_cluster
def test_concurrency_limit_queues_members(tmp_path, images, run_id, docker_client, where):
    run = _run_dir(tmp_path, run_id)
    harness = ScriptedHarness(tmp_path / "calls")
    peak = _Peak(where or docker_client, run_id)

    units = _units(run, {f"m{i}": "ok" for i in range(4)})
    res = _fan(
        where,
        images,
        harness,
        run,
        units,
        listeners=[peak],
        max_parallel=2,
        min_success=4,
        fail_fast=False,
    )
    assert res.quorum_met
    assert 1 <= peak.most <= 2


STRICT = {
    "type": "object",
    "required": ["summary", "answer"],
    "properties": {"summary": {"type": "string", "minLength": 40}, "answer": {"type": "string"}},
}
"""A job's result schema the scripted harness's result misses (member ``strict``)."""


def _strict(spec: MemberSpec) -> MemberSpec:
    """``spec`` asking for :data:`STRICT` (its own field ``answer`` too), checked as a job's."""
    return MemberSpec.model_validate({**spec.model_dump(), "result_schema": STRICT})


def _strict_failed(res: FanoutResult, harness: ScriptedHarness, run: RunDir) -> None:
    """``strict``, whose result misses :data:`STRICT`, failed once (not retried), with
    both reasons; ``lenient``, without a schema, is ok."""
    assert res.outcomes["lenient"].status == "ok"
    strict = res.outcomes["strict"]
    assert strict.status == "failed" and harness.calls["strict"] == 1  # not retried
    assert "result.answer is required" in strict.reason
    assert "result.summary should have at least 40 characters" in strict.reason
    assert run.outcome("strict").status == "failed"


@HERE  # on a cluster: test_failures_the_quorum_and_the_schema_on_a_cluster
def test_result_that_misses_the_job_schema_is_that_members_failure(
    tmp_path, images, run_id, docker_client, where
):
    run = _run_dir(tmp_path, run_id)
    harness = ScriptedHarness(tmp_path / "calls")
    units = _units(run, {"strict": "ok", "lenient": "ok"})
    units[0].spec = _strict(units[0].spec)
    res = _fan(where, images, harness, run, units, max_parallel=2, min_success=1, fail_fast=False)
    _strict_failed(res, harness, run)


def test_members_sharing_a_memory_profile_lose_no_write(tmp_path, images, run_id, where):
    # On a cluster the members load the profile on their nodes and the coordinator
    # merges what they changed, as members on one machine merge their own saves.
    run = _run_dir(tmp_path, run_id)
    harness = ScriptedHarness(tmp_path / "calls")
    profile = tmp_path / "profile"
    profile.mkdir()
    (profile / "notes.md").write_text("# notes\n")
    units = _units(run, {"a": "remember", "b": "remember"})
    for u in units:
        u.spec = u.spec.model_copy(update={"memory_dir": profile})
    res = _fan(where, images, harness, run, units, max_parallel=2, min_success=2, fail_fast=False)
    assert res.quorum_met
    text = (profile / "notes.md").read_text()
    assert "a was here" in text and "b was here" in text, text
    saves = [e for e in run.journal.read() if e.event == "memory_saved"]
    assert sorted(e.member for e in saves) == ["a", "b"]


# The [ray] twins of the tests above share one fan-out each: a cluster run starts a node
# actor per node (seconds of imports) before its first member, and what these show is
# each member's own outcome, which one run shows for several members as well as one.


@pytest.mark.parametrize("where", ["ray"], indirect=True)
def test_retries_and_the_concurrency_limit_on_a_cluster(
    tmp_path, images, run_id, docker_client, where
):
    run = _run_dir(tmp_path, run_id)
    harness = ScriptedHarness(tmp_path / "calls")
    peak = _Peak(where, run_id)

    tasks = {"flaky": "crash-once", "steady": "ok"} | {f"m{i}": "ok" for i in range(3)}
    units = _units(run, tasks, attempts=3, backoff=0.5)
    res = _fan(
        where, images, harness, run, units,
        listeners=[peak], max_parallel=2, min_success=len(tasks), fail_fast=False,
    )  # fmt: skip
    # A crashed box is retried with its backoff, then succeeds.
    assert res.outcomes["flaky"].status == "ok"
    assert harness.calls == {m: 2 if m == "flaky" else 1 for m in tasks}
    retries = [e for e in run.journal.read() if e.event == "member_retry"]
    assert len(retries) == 1 and retries[0].member == "flaky"
    assert "sandbox crashed" in retries[0].reason and retries[0].delay_s == 0.5
    assert run.state().starts == {m: 2 if m == "flaky" else 1 for m in tasks}
    # No more boxes than max_parallel at once: the others queued.
    assert res.quorum_met
    assert 1 <= peak.most <= 2
    assert _boxes(where, run_id) == []


@pytest.mark.parametrize("where", ["ray"], indirect=True)
def test_failures_the_quorum_and_the_schema_on_a_cluster(
    tmp_path, images, run_id, docker_client, where
):
    run = _run_dir(tmp_path, run_id)
    harness = ScriptedHarness(tmp_path / "calls")
    tasks = {"a": "ok", "raiser": "raise", "c": "raise", "strict": "ok", "lenient": "ok"}
    units = _units(run, tasks, attempts=3)
    units[3].spec = _strict(units[3].spec)
    res = _fan(where, images, harness, run, units, max_parallel=3, min_success=3, fail_fast=False)
    # A task's failure is not retried.
    assert res.outcomes["raiser"].status == "failed"
    assert harness.calls["raiser"] == 1 and harness.calls["c"] == 1
    # Too few succeeded for the quorum.
    assert res.ok == 2 and not res.quorum_met
    assert {o.status for o in res.outcomes.values()} == {"ok", "failed"}
    # A result that misses the job's schema is that member's failure, not retried.
    assert res.outcomes["a"].status == "ok"
    _strict_failed(res, harness, run)
