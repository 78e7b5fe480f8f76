"""A member's fallback model (``[model] fallback``): the real ``anthropic`` client against
a fake Messages API on 127.0.0.1 whose primary model stays overloaded. The switch comes
after the adapter's own retries, once and for good, traced, and priced and budgeted as
the model that answers; a request the API refuses for what it is never switches."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anyio
import pytest

from coordinator.job.jobfile import JobError, parse_job
from subagents.fake_api import FakeMessagesAPI, fault, text
from subagents.model import ModelError
from subagents.model.base import ModelRequest
from subagents.model.claude import AnthropicModel
from subagents.model.fallback import FallbackModel
from subagents.spend.budget import BudgetedModel, RunBudget
from subagents.trace import TraceWriter, read_trace

PRIMARY, FALLBACK = "claude-sonnet-5", "claude-haiku-4-5"


def _api(primary: Any) -> FakeMessagesAPI:
    def policy(body: dict[str, Any]) -> Any:
        return primary if body.get("model") == PRIMARY else text("from the fallback")

    return FakeMessagesAPI(policy).start()


def _models(api: FakeMessagesAPI, trace: TraceWriter) -> FallbackModel:
    def make(name: str, **kw: Any) -> AnthropicModel:
        return AnthropicModel(
            name, api_key="k", base_url=api.url, max_retries=2, backoff_s=0.01, **kw
        )

    # The primary's patience on overload shrunk from a minute to a moment.
    return FallbackModel(make(PRIMARY, patience_s=0.3), make(FALLBACK), trace=trace)


def _ask(model: Any, n: int = 2) -> list[str]:
    async def go() -> list[str]:
        said = []
        for _ in range(n):
            response = await model.complete(
                ModelRequest(messages=[{"role": "user", "content": "hi"}], max_tokens=256)
            )
            said.append(response.message.content[0].text)
        await model.aclose()
        return said

    return anyio.run(go)


def test_an_overloaded_model_hands_the_member_to_its_fallback_for_good(tmp_path: Path) -> None:
    # (retry-after: the run's governor pauses the key for as long as the API says)
    api = _api(fault(529, "overloaded_error", "Overloaded", retry_after=0.05))
    trace = TraceWriter(tmp_path / "trace.jsonl", run="r", member="m")
    try:
        model = _models(api, trace)
        budget = RunBudget(usd=1.0)
        budgeted = BudgetedModel(model, budget, "m")
        assert _ask(budgeted) == ["from the fallback", "from the fallback"]
    finally:
        api.stop()
        trace.close()
    asked = [r.get("model") for r in api.requests]
    # The primary, tried again while its patience lasted, then the fallback only.
    n = asked.count(PRIMARY)
    assert n >= 2 and asked == [PRIMARY] * n + [FALLBACK, FALLBACK], asked
    assert model.switched is not None and model.switched.startswith(f"{PRIMARY} -> {FALLBACK}: ")
    assert model.profile.name == FALLBACK and budgeted.profile.name == FALLBACK
    (switch,) = [e for e in read_trace(tmp_path / "trace.jsonl") if e.type == "model_switch"]
    assert (switch.model, switch.to) == (PRIMARY, FALLBACK)
    # Priced as the model that answered: haiku's prices, not sonnet's.
    per_call = budget.spent.usd / 2
    assert per_call < 0.001, budget.spent


@pytest.mark.parametrize(
    "status,kind", [(400, "invalid_request_error"), (401, "authentication_error")]
)
def test_a_request_the_api_refuses_for_what_it_is_never_switches(tmp_path, status, kind) -> None:
    api = _api(fault(status, kind, "no"))
    trace = TraceWriter(tmp_path / "trace.jsonl", run="r", member="m")
    try:
        model = _models(api, trace)
        with pytest.raises(ModelError):
            _ask(model, 1)
    finally:
        api.stop()
        trace.close()
    assert model.switched is None
    assert all(r.get("model") == PRIMARY for r in api.requests)


def test_rate_limits_past_the_retries_switch_too(tmp_path) -> None:
    api = _api(fault(429, "rate_limit_error", "slow down", retry_after=0.01))
    trace = TraceWriter(tmp_path / "trace.jsonl", run="r", member="m")
    try:
        model = _models(api, trace)
        assert _ask(model, 1) == ["from the fallback"]
    finally:
        api.stop()
        trace.close()
    assert model.switched is not None


@pytest.mark.parametrize(
    ("table", "words"),
    [
        ('[model]\nfallback = "gpt-4o"', "model.fallback: 'gpt-4o' is not a model Fleet knows"),
        ('[model]\nfallback = "replay:t.jsonl"', "model.fallback: a fallback is a live model"),
    ],
)
def test_an_unknown_fallback_is_refused_naming_the_field(table: str, words: str) -> None:
    text_ = f'name = "x"\n{table}\n[[members]]\nkind = "coding"\ntask = "t"\n'
    with pytest.raises(JobError) as err:
        parse_job(text_, source="t")
    assert words in str(err.value)
    member = 'name = "x"\n[[members]]\nkind = "coding"\ntask = "t"\nfallback = "nope-1"\n'
    with pytest.raises(JobError) as err:
        parse_job(member, source="t")
    assert "members[0].fallback" in str(err.value)
    ok = parse_job(
        f'name = "x"\n[model]\nfallback = "{FALLBACK}"\n[[members]]\nkind = "coding"\ntask = "t"\n',
        source="t",
    )
    assert ok.model.fallback == FALLBACK


@pytest.mark.docker
def test_a_member_whose_model_stays_overloaded_finishes_on_its_fallback(
    tmp_path, images, fake_api, cleanup, monkeypatch, capsys
):
    from fleet_policies import coding_policy

    import coordinator.nodes.node as node
    import coordinator.runner.analyst as analyst
    from coordinator.cli import main
    from coordinator.rundir.runs import RunDir

    monkeypatch.setattr(node, "FALLBACK_AFTER_S", 0.3)  # a minute, shrunk
    monkeypatch.setattr(analyst, "FALLBACK_AFTER_S", 0.3)
    coder = coding_policy(turns=1)

    def policy(body: dict[str, Any]) -> Any:
        if body.get("model") == PRIMARY:
            return fault(529, "overloaded_error", "Overloaded", retry_after=0.05)
        return coder(body)

    api = fake_api(policy)
    cleanup.append(tmp_path / "runs")
    job = tmp_path / "job.toml"
    job.write_text(
        f'name = "fb"\noutput_dir = "{tmp_path / "runs"}"\n[model]\nname = "{PRIMARY}"\n'
        f'fallback = "{FALLBACK}"\n[synthesis]\nenabled = true\n'
        '[[members]]\nid = "m"\nkind = "coding"\ntask = "List the files."\n'
    )
    assert main(["run", str(job), "--plain"]) == 0, capsys.readouterr().err
    out = capsys.readouterr().err
    (run,) = RunDir.list(tmp_path / "runs")
    outcome = run.outcome("m")
    assert outcome.status == "ok"
    assert outcome.model_switch is not None and outcome.model_switch.startswith(
        f"{PRIMARY} -> {FALLBACK}: "
    )
    events = list(read_trace(run.path / "members" / "m" / "trace.jsonl"))
    (switch,) = [e for e in events if e.type == "model_switch"]
    assert (switch.model, switch.to) == (PRIMARY, FALLBACK)
    calls = [e for e in events if e.type == "model_call"]
    assert calls and all(c.model == FALLBACK for c in calls)
    # The live table's last action for the member says so.
    from coordinator.oversight.progress import _action

    assert _action(switch) == f"overloaded: now on {FALLBACK}"
    assert "m: ok" in out
    report = (run.path / "report.md").read_text()
    assert "went on with its fallback model" in report
    # The analyst (the job's model too) went on with the fallback as well.
    analyst_calls = [r for r in api.requests if "submit_report" in str(r.get("tools"))]
    assert analyst_calls and analyst_calls[-1].get("model") == FALLBACK
