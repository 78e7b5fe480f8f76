"""max_parallel when the job leaves it out: chosen from the members and the engine's host."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

import coordinator as fleet
from coordinator.job.jobfile import parse_job
from coordinator.nodes.capacity import HostSize, Parallelism, choose, engine_host, job_boxes
from coordinator.runner.preflight import check_parallel
from sandbox.spec import SandboxSpec

GIB = 2**30
THIS_VM = HostSize(cpus=2, memory_bytes=int(23.5 * GIB))


def boxes(kind: str, n: int, **overrides: str) -> list[SandboxSpec]:
    return [SandboxSpec(kind=kind, **overrides) for _ in range(n)]  # type: ignore[arg-type]


def test_sixteen_coding_members_all_run_at_once_on_two_cores() -> None:
    """They wait on the model most of the time: the CPU count is not their bound."""
    chosen = choose(boxes("coding", 16), THIS_VM)
    assert chosen.members == 16
    assert "2 CPUs" in chosen.why and "23.5 GiB" in chosen.why


def test_browser_members_are_bound_by_the_cpus() -> None:
    chosen = choose(boxes("browser", 10), THIS_VM)
    assert chosen.members == 4  # half a CPU each (Chromium) on 2 CPUs
    assert "bound by CPUs" in chosen.why


def test_memory_bounds_large_boxes() -> None:
    big = boxes("coding", 30, memory="8g")  # 9.3 GiB limit each with the tmpfs mounts
    chosen = choose(big, HostSize(cpus=64, memory_bytes=64 * GIB))
    assert chosen.members == 13  # 2 x 64 GiB of limits
    assert "bound by memory" in chosen.why


def test_never_more_than_the_members_nor_fewer_than_one() -> None:
    assert choose(boxes("coding", 3), THIS_VM).members == 3
    tiny = HostSize(cpus=1, memory_bytes=1 * GIB)
    assert choose(boxes("browser", 5), tiny).members == 1


def test_an_engine_that_does_not_say_keeps_the_old_default() -> None:
    chosen = choose(boxes("coding", 16), None)
    assert chosen.members == 4 and "did not report" in chosen.why


def test_the_engine_reports_its_host(docker_client: Any) -> None:
    host = engine_host(docker_client)
    info = docker_client.info()
    assert host == HostSize(cpus=info["NCPU"], memory_bytes=info["MemTotal"])


def test_the_preflight_chooses_only_when_the_job_leaves_it_out(docker_client: Any) -> None:
    members = "".join(f'[[members]]\nkind = "coding"\ntask = "t{i}"\n' for i in range(16))
    job = parse_job(f'name = "many"\n{members}')
    chosen = check_parallel(job)
    assert chosen == choose(job_boxes(job), engine_host(docker_client))
    assert "on the engine's host" in chosen.why
    explicit = parse_job(f'name = "many"\n[fanout]\nmax_parallel = 3\n{members}')
    assert check_parallel(explicit) == Parallelism(3, "as the job says")


@pytest.mark.docker
def test_a_job_without_max_parallel_runs_what_the_host_holds_at_once(
    tmp_path: Path, images: Any, docker_client: Any, cleanup: list[Path], monkeypatch: Any
) -> None:
    """Six coding members on any host that can hold them: all six start before any ends
    (the old fixed default, 4, queued two of them)."""
    monkeypatch.delenv("ANTHROPIC_API_KEY", raising=False)
    cleanup.append(tmp_path / "runs")
    job = {
        "name": "six",
        "output_dir": str(tmp_path / "runs"),
        "model": {"name": "offline"},
        "members": [
            {"id": f"c{i}", "kind": "coding", "task": f"Look around {i}."} for i in range(6)
        ],
        "synthesis": {"enabled": False},
    }
    assert choose(job_boxes(fleet.load(job)), engine_host(docker_client)).members >= 6
    journal: list[dict[str, Any]] = []
    result = fleet.run(job, on_journal=journal.append)
    assert result.status == "succeeded"
    events = [e.event for e in journal]
    assert events.count("member_started") == 6
    last_start = max(i for i, e in enumerate(events) if e == "member_started")
    assert last_start < events.index("member_finished")
