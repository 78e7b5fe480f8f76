"""``fleet run JOB`` starts the first wave's boxes while it reads and checks the job, and
the run takes them; a run that does not start leaves none behind."""

from __future__ import annotations

import json
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

from coordinator import prewarm as prewarm_module
from coordinator.cli import main
from subagents.trace import read_trace

pytestmark = pytest.mark.docker


def _job(tmp_path: Path, members: int, extra: str = "") -> Path:
    text = f'name = "warm"\noutput_dir = "{tmp_path / "runs"}"\n[model]\nname = "offline"\n'
    text += "[synthesis]\nenabled = false\n" + extra
    for i in range(members):
        text += f'[[members]]\nid = "c{i}"\nkind = "coding"\ntask = "Look around {i}."\n'
    path = tmp_path / "job.toml"
    path.write_text(text)
    return path


@pytest.fixture
def started(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """Every Prewarm the command line starts."""
    seen: list[Any] = []
    real = prewarm_module.Prewarm.start.__func__  # type: ignore[attr-defined]

    def recording(cls: Any, job_file: Any) -> Any:
        warm = real(cls, job_file)
        seen.append(warm)
        return warm

    monkeypatch.setattr(prewarm_module.Prewarm, "start", classmethod(recording))
    return seen


def _since_epoch(docker_time: str) -> float:
    return datetime.fromisoformat(docker_time[:26].rstrip("Z") + "+00:00").timestamp()


def test_the_first_wave_starts_before_the_run_exists_and_the_run_takes_it(
    tmp_path, images, docker_client, cleanup, monkeypatch, started
):
    monkeypatch.delenv("ANTHROPIC_API_KEY", raising=False)
    cleanup.append(tmp_path / "runs")
    assert main(["run", str(_job(tmp_path, 3)), "--plain"]) == 0
    (warm,) = started
    made = {info["Name"].lstrip("/"): info for _, info in warm._boxes}
    assert len(made) == 3
    run = tmp_path / "runs" / warm.run  # the run has the id its boxes were given
    created = json.loads((run / "journal.jsonl").read_text().splitlines()[0])["ts"]
    assert all(_since_epoch(info["Created"]) < created for info in made.values())
    used = [
        e.box
        for m in ("c0", "c1", "c2")
        for e in read_trace(run / "members" / m / "trace.jsonl")
        if e.type == "sandbox" and e.action == "create"
    ]
    assert sorted(used) == sorted(made)  # each member got one of them
    gone = docker_client.api.containers(all=True, filters={"label": f"fleet.run={warm.run}"})
    assert gone == []


def test_a_run_that_does_not_start_leaves_no_early_box(
    tmp_path, images, docker_client, cleanup, monkeypatch, started
):
    monkeypatch.delenv("ANTHROPIC_API_KEY", raising=False)
    cleanup.append(tmp_path / "runs")
    bad = _job(tmp_path, 2, extra="[fanout]\nmin_success = 5\n")  # more than the members
    assert main(["run", str(bad), "--plain"]) == 2
    (warm,) = started
    assert not (tmp_path / "runs").exists()
    left = docker_client.api.containers(all=True, filters={"label": f"fleet.run={warm.run}"})
    assert left == []
