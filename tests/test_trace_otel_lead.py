"""A lead run exported live: the offline lead through the real ``fleet`` CLI (real
boxes, the offline corpus, real Chromium), its spans sent to a local OTLP/HTTP
collector named by ``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`` alone."""

from __future__ import annotations

import pytest
from otlp_collector import Collector, attributes

from coordinator.cli import main
from coordinator.rundir.runs import RunDir

pytestmark = pytest.mark.docker

QUESTION = "How are asyncio tasks cancelled by the zorblax scheduler?"


def test_a_live_lead_run_is_one_trace_with_its_members_under_the_lead(
    tmp_path, images, docker_client, cleanup, capsys, monkeypatch
):
    collector = Collector()
    monkeypatch.delenv("OTEL_EXPORTER_OTLP_ENDPOINT", raising=False)
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", f"{collector.url}/v1/traces")
    cleanup.append(tmp_path / "runs")
    try:
        code = main(
            [
                "research", QUESTION, "--lead", "--members", "1", "--max-waves", "2",
                "--output-dir", str(tmp_path / "runs"), "--plain",
            ]
        )  # fmt: skip
        assert code == 0, capsys.readouterr().err
        spans = collector.spans()
    finally:
        collector.close()
    (run,) = RunDir.list(tmp_path / "runs")
    waves = {m.id: e.wave for e in run.journal.read() if e.event == "lead_spawn"
             for m in e.members}  # fmt: skip
    assert sorted(set(waves.values())) == [1, 2]
    assert len({s.trace_id for s in spans}) == 1
    agents = {attributes(s.attributes)["gen_ai.agent.name"]: s for s in spans
              if attributes(s.attributes)["gen_ai.operation.name"] == "invoke_agent"}  # fmt: skip
    lead = agents["lead"]
    spawns = {s.span_id for s in spans if s.name == "execute_tool spawn"}
    assert len(spawns) == 2
    for member, wave in waves.items():
        agent = agents[member]
        assert agent.parent_span_id == lead.span_id
        assert attributes(agent.attributes)["fleet.lead.wave"] == wave
        (link,) = agent.links
        assert link.span_id in spawns
