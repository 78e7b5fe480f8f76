"""``fleet run`` against an account with real-looking limits: real boxes, the real client,
the fake Messages API limiting requests per minute and shedding load with 529s."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from fleet_policies import coding_policy

from coordinator.cli import main
from coordinator.rundir.runs import RunDir
from subagents.fake_api import Overload, RateLimits
from subagents.trace import read_trace

pytestmark = pytest.mark.docker


def _job(tmp_path: Path, members: int) -> Path:
    text = f'name = "t"\noutput_dir = "{tmp_path / "runs"}"\n[model]\nname = "claude-sonnet-5"\n'
    text += f"[fanout]\nmax_parallel = {members}\n"
    for i in range(members):
        text += f'[[members]]\nid = "m{i + 1}"\nkind = "coding"\ntask = "List the files."\n'
    path = tmp_path / "job.toml"
    path.write_text(text)
    return path


def test_a_fan_out_over_the_accounts_limits_and_an_overload_burst_loses_no_member(
    tmp_path, images, docker_client, fake_api, cleanup, capsys
):
    # 8 members x 4 calls against 8 requests a 3 s "minute" (one every 0.375 s: 32 calls
    # take 9 s at least), with every request answered 529 for 2 s from the 16th (by then
    # every member's box is up and calls come one after another, as the limit allows).
    burst = Overload(start_s=0.0, end_s=2.0, after=16)
    limits = RateLimits(requests_per_minute=8, minute_s=3.0, overloads=[burst])
    api = fake_api(coding_policy(turns=3), limits=limits)
    cleanup.append(tmp_path / "runs")
    assert main(["run", str(_job(tmp_path, 8)), "--plain"]) == 0, capsys.readouterr().err
    (run,) = RunDir.list(tmp_path / "runs")
    assert all(run.outcome(f"m{i + 1}").status == "ok" for i in range(8))
    assert api.limiter is not None
    # Paced by one governor: a handful of 429s at most, not one per member per retry.
    assert api.limiter.rejected <= 4, api.limiter.rejected
    waits = [
        e
        for i in range(8)
        for e in read_trace(run.path / "members" / f"m{i + 1}" / "trace.jsonl")
        if e.type == "rate_wait" and e.waited_s
    ]
    assert waits and sum(w.waited_s for w in waits) > 5.0
    assert {w.reason for w in waits} & {"requests per minute"}
    reasons = {w.reason for w in waits}
    assert any("overloaded (529)" in r for r in reasons), reasons
    capsys.readouterr()
    assert main(["trace", str(run.path)]) == 0
    assert "waited for the API's rate limits" in capsys.readouterr().out
    report = json.loads((run.path / "report.json").read_text())
    assert not report.get("failed")
