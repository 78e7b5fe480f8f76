"""On a cluster the run has one rate governor: members on every node pace by one view
of the account, through the run's governor actor (``coordinator/nodes/run_governor.py``).

Real Ray cluster (``ray_cluster``: head + 2 nodes), real boxes, the real ``anthropic``
client on the nodes against the fake Messages API on 127.0.0.1 with a request limit.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import anyio
import pytest
from fleet_policies import coding_policy
from ray_support import ship_by_value

from coordinator.fanout.fanout import MemberUnit, fan_out
from coordinator.job.jobfile import parse_job
from coordinator.job.spec import RetryPolicy
from coordinator.nodes.node import NodeDeps
from coordinator.nodes.worker import Recorder, Services
from coordinator.rundir.runs import RunDir
from sandbox.docker.backend import DockerBackend
from subagents.fake_api import FakeMessagesAPI, RateLimits
from subagents.spec import MemberSpec
from subagents.trace import read_trace

pytestmark = [pytest.mark.docker, pytest.mark.slow]


class _FakeApiNode:
    """A node whose members' model is Claude's adapter pointed at the test's fake API
    (the key is a test key: a real node reads its own environment)."""

    def __init__(self, images: dict[str, str], url: str) -> None:
        self.images, self.url = images, url

    def __call__(self, node: str = "") -> NodeDeps:
        from subagents.model.claude import AnthropicModel

        def make(name: str, **kw: Any) -> Any:
            return AnthropicModel(
                "claude-sonnet-5", api_key="test", base_url=self.url, trace=kw.get("trace")
            )

        return NodeDeps(backend=DockerBackend(images=self.images, node=node), make_model=make)


def test_members_on_every_node_share_the_runs_one_governor(tmp_path, ray_cluster, images, run_id):
    from coordinator.nodes.cluster import RayNodes

    ship_by_value(sys.modules[__name__])
    members = 6
    # 6 members x 3 calls against 6 requests a 6 s "minute": one node's governor alone
    # would believe the whole bucket its own and both nodes would spend it twice over.
    # (A 3 s "minute" met 4 429s on a loaded machine: a call's way to the server took a
    # fair share of the window, so the server's window and the headers' drifted apart.)
    limits = RateLimits(requests_per_minute=6, minute_s=6.0)
    job = parse_job('name = "t"\n[research]\nquestion = "q"')
    run = RunDir.create(job, "", root=tmp_path, name=run_id)
    units = [
        MemberUnit(
            run_id=run.id,
            member_dir=str(run.member_dir(f"m{i}")),
            spec=MemberSpec(
                id=f"m{i}", kind="coding", task="List the files.", stated_deadline_s=180
            ),
            retry=RetryPolicy(attempts=1),
        )
        for i in range(members)
    ]
    with FakeMessagesAPI(coding_policy(turns=2), limits=limits) as api:
        nodes = RayNodes(ray_cluster.address, setup=_FakeApiNode(images, api.url))

        async def go() -> Any:
            try:
                services = Services(max_parallel=members, warm_pool=False)
                async with nodes.serve(run.id, units, services):
                    record = Recorder(journal=run.journal.append)
                    kw = {"max_parallel": members, "min_success": 1, "fail_fast": False}
                    result = await fan_out(units, record, nodes=nodes, **kw)
                    stats = await nodes.governor.stats.remote()
                    return result, stats
            finally:
                await nodes.remove_boxes(run.id)

        result, stats = anyio.run(go)
        assert api.limiter is not None
        rejected = api.limiter.rejected
    outcomes = result.outcomes
    assert all(o.status == "ok" for o in outcomes.values()), {
        m: o.reason for m, o in outcomes.items()
    }
    nodes_used = {e.node for e in run.journal.read() if e.event == "member_started"}
    assert len(nodes_used) == 2, nodes_used  # members on both nodes
    # Every call of both nodes went through the run's one governor ...
    ((_digest, counters),) = stats.items()
    # (each attempt is admitted, so a call answered 429 and sent again counts twice,
    # as it does in the fake API's log).
    assert counters["calls"] == len(api.requests)
    assert counters["limited"] == rejected
    # ... which paced them by the account's headers: next to no 429s. (A loaded suite
    # drifted the server's window from the headers' enough for a third, once; a
    # governor per node spends the bucket twice over, six calls too many.)
    assert rejected <= 3, rejected
    waits = [
        e
        for i in range(members)
        for e in read_trace(Path(run.member_dir(f"m{i}")) / "trace.jsonl")
        if e.type == "rate_wait" and e.waited_s
    ]
    # Members waited for it, and said so in their traces: what they say they waited is
    # what the governor measured (a trace keeps waits of 50 ms and more). How long the
    # waits add up to depends on how fast the nodes' members reach their next call.
    assert waits, "no member's trace shows a wait for the run's governor"
    assert all(w.reason for w in waits)
    assert sum(w.waited_s for w in waits) <= counters["waited_s"] + 0.01
