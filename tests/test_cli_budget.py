"""``fleet run`` with one ``[budget]`` for the run: real boxes, the real client against the
fake Messages API, every member's calls reserved against the same line."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from fleet_policies import coding_policy

from coordinator.cli import main
from coordinator.rundir.runs import RunDir
from subagents.fake_api import tool_use
from subagents.model.profiles import profile_for
from subagents.spend.usage import Usage
from subagents.trace import read_trace

MODEL = "claude-sonnet-5"
HARD_USD = 0.06
MEMBERS = 8


def _job(tmp_path: Path, members: int, budget: str) -> Path:
    text = f'name = "t"\noutput_dir = "{tmp_path / "runs"}"\n'
    text += f'[model]\nname = "{MODEL}"\nmax_tokens = 256\n'
    text += f"[fanout]\nmax_parallel = {members}\n{budget}\n"
    for i in range(members):
        text += f'[[members]]\nid = "m{i + 1}"\nkind = "coding"\ntask = "List the files."\n'
    path = tmp_path / "job.toml"
    path.write_text(text)
    return path


def _answers_forced_submit(inner: Any) -> Any:
    """``coding_policy``, but a call forcing submit_result gets one (as the API does)."""

    def policy(body: dict[str, Any]) -> Any:
        if (body.get("tool_choice") or {}).get("name") == "submit_result":
            summary = "stopped early: listed some files, the rest is unfinished"
            return tool_use("submit_result", {"summary": summary, "tests_run": [], "notes": []})
        return inner(body)

    return policy


def _call_costs(run: RunDir) -> list[float]:
    """What each model call of the run cost, from the members' traces."""
    profile = profile_for(MODEL)
    costs = []
    for trace in sorted((run.path / "members").glob("*/trace.jsonl")):
        for e in read_trace(trace):
            if e.type == "model_call":
                usage = Usage()
                usage.add(
                    SimpleNamespace(
                        input_tokens=e.input_tokens,
                        output_tokens=e.output_tokens,
                        cache_read_input_tokens=e.cache_read_tokens,
                        cache_creation_input_tokens=e.cache_write_tokens,
                    ),
                    profile,
                )
                costs.append(usage.cost_usd)
    return costs


@pytest.mark.docker
def test_a_fan_out_stops_at_the_hard_line_and_resume_with_more_finishes_it(
    tmp_path, images, docker_client, fake_api, cleanup, capsys
):
    # 8 members of 12 turns cost about $0.09 together; the budget holds $0.06.
    fake_api(_answers_forced_submit(coding_policy(turns=12)))
    cleanup.append(tmp_path / "runs")
    job = _job(tmp_path, MEMBERS, f"[budget]\nusd = {HARD_USD}")
    code = main(["run", str(job), "--plain"])
    out = capsys.readouterr().err
    (run,) = RunDir.list(tmp_path / "runs")
    results = {f"m{i + 1}": run.outcome(f"m{i + 1}") for i in range(MEMBERS)}
    costs = _call_costs(run)
    spent = sum(costs)
    # Reserved before each call went out: the fan-out stops short of the line, not one
    # turn of every member past it.
    assert spent <= HARD_USD + max(costs), (spent, max(costs))
    assert spent == pytest.approx(sum(r.cost_usd for r in results.values()), abs=1e-5)
    stopped = {m: r for m, r in results.items() if r.status != "ok"}
    assert stopped and code in (0, 1), out
    # Admitted as the line can carry them: most finish; the others either never started
    # (skipped, no box, no call) or were stopped at the line with their partial result.
    assert len(stopped) <= MEMBERS // 2, {m: r.reason for m, r in stopped.items()}
    skipped = {m for m, r in stopped.items() if r.status == "skipped"}
    for member, r in stopped.items():
        assert r.limit == "budget", (member, r.reason)
        if member in skipped:
            assert r.reason.startswith("skipped: the run's budget cannot carry it"), r.reason
            assert r.turns == 0 and not r.partial_result
            assert not (run.path / "members" / member / "trace.jsonl").exists()  # no box
            continue
        assert r.status == "incomplete" and r.reason.startswith("run budget reached"), r.reason
        if r.turns:  # a member that had started keeps what it did and says so
            assert r.partial_result.summary.startswith("stopped early"), r.reason
            assert r.progress.last_actions
    journal = list(run.journal.read())
    events = [e.event for e in journal]
    assert events.count("budget_soft") == 1 and events.count("budget_hard") <= 1
    last = [e for e in journal if e.event == "budget_spent"][-1]
    assert last.spent_usd == pytest.approx(spent, abs=1e-5)
    assert spent >= 0.8 * HARD_USD, spent  # the line is spent on work, not left
    assert "budget: past the soft line" in out
    report = (run.path / "report.md").read_text()
    assert "## Budget" in report
    if skipped:
        assert f"{len(skipped)} never started (skipped" in report
        waiting = [e.member for e in journal if e.event == "member_queued" and e.waiting]
        assert skipped <= set(waiting)  # each waited for the line first, then was skipped
    if events.count("budget_hard"):
        assert "budget: reached the hard line" in out and "reached the hard line" in report
    # fleet runs says how the line was used: spent, finished, stopped, never started.
    assert main(["runs", "--output-dir", str(tmp_path / "runs"), "--json"]) == 0
    (row,) = json.loads(capsys.readouterr().out)
    use = row["budget"]
    assert use["usd"] == HARD_USD and use["spent_usd"] == pytest.approx(spent, abs=1e-5)
    assert use["finished"] == MEMBERS - len(stopped)
    assert use["stopped"] == sum(1 for r in stopped.values() if r.turns)
    assert use["never_started"] == sum(1 for r in stopped.values() if not r.turns)
    assert use["never_started"] >= len(skipped)
    assert main(["runs", "--output-dir", str(tmp_path / "runs")]) == 0
    assert f"budget: ${use['spent_usd']:.4f} of ${HARD_USD:g} spent" in capsys.readouterr().out

    # A raise below what was spent, or no number at all, is refused before anything runs.
    for bad in ("0.001", "0", "nan", "-1"):
        assert (
            main(["resume", run.id, "--output-dir", str(tmp_path / "runs"), f"--budget-usd={bad}"])
            == 2
        )
        assert "--budget-usd" in capsys.readouterr().err
    # More money: the members the budget stopped run again and finish.
    code = main(
        ["resume", run.id, "--output-dir", str(tmp_path / "runs"), "--budget-usd", "1", "--plain"]
    )
    out = capsys.readouterr().err
    assert code == 0, out
    assert all(run.outcome(m).status == "ok" for m in results), out
    journal = list(run.journal.read())
    raised = [e for e in journal if e.event == "budget"]
    assert [e.usd for e in raised] == [HARD_USD, 1.0]
    assert raised[1].spent_usd == pytest.approx(spent, abs=1e-5)  # goes on from there
    assert journal[-1].event == "run_finished" and journal[-1].status == "succeeded"
    report = (run.path / "report.md").read_text()
    assert "## Budget" in report and "reached the hard line" not in report
    assert "never started" not in report


@pytest.mark.parametrize(
    ("table", "said"),
    [
        ("[budget]\nusd = -1", "budget.usd: input should be greater than 0"),
        ("[budget]\nusd = nan", "budget.usd: input should be a finite number"),
        ("[budget]\nusd = 1\nsoft = 1.5", "budget.soft: input should be less than 1"),
        ("[budget]\nsoft = 0.5", "a [budget] needs a hard line: usd, tokens or both"),
        ("[budget]\ntokens = 10", "budget.tokens: input should be greater than or equal to 1000"),
        ("[budget]\ndollars = 3", "budget.dollars: is not a known field"),
        (
            "[budget]\ntokens = 9000\nclosing_max_tokens = 100",
            "budget.closing_max_tokens: input should be greater than or equal to 256",
        ),
        (
            "[budget]\ntokens = 9000\nclosing_max_tokens = 99999",
            "budget.closing_max_tokens: input should be less than or equal to 16384",
        ),
    ],
)
def test_bad_budget_values_are_refused_with_what_is_wrong(tmp_path, capsys, table, said):
    path = tmp_path / "job.toml"
    path.write_text(f'name = "t"\n[[members]]\nkind = "coding"\ntask = "x"\n{table}\n')
    assert main(["run", str(path)]) == 2
    err = capsys.readouterr().err
    assert said in err and "Traceback" not in err, err


@pytest.mark.parametrize(
    ("model", "line", "said"),
    [
        ("offline", "tokens = 5000", "budget.tokens: 5,000 cannot carry one member's first call"),
        (MODEL, "usd = 0.01", "budget.usd: $0.01 cannot carry one member's first call"),
    ],
)
def test_a_line_below_one_first_call_is_refused_before_any_box_starts(
    tmp_path, capsys, monkeypatch, model, line, said
):
    monkeypatch.setenv("ANTHROPIC_API_KEY", "test-key")  # the model is made, never called
    monkeypatch.setenv("DOCKER_HOST", "unix:///nonexistent.sock")  # no engine is asked
    path = tmp_path / "job.toml"
    path.write_text(
        f'name = "t"\noutput_dir = "{tmp_path / "runs"}"\n[model]\nname = "{model}"\n'
        f'max_tokens = 4096\n[budget]\n{line}\n[[members]]\nkind = "coding"\ntask = "x"\n'
    )
    for command in ("run", "check"):
        assert main([command, str(path)]) == 2
        err = capsys.readouterr().err
        assert said in err and "4,096 tokens of output" in err and "Traceback" not in err, err
    assert not (tmp_path / "runs").exists()  # no run, no box
    # Lowering max_tokens is one of the two ways out the message gives.
    path.write_text(path.read_text().replace("max_tokens = 4096", "max_tokens = 256"))
    if model == "offline":
        assert main(["check", str(path)]) == 0


@pytest.mark.docker
def test_offline_members_cost_nothing_and_still_spend_a_token_budget(
    tmp_path, images, docker_client, cleanup, monkeypatch, capsys
):
    monkeypatch.delenv("ANTHROPIC_API_KEY", raising=False)
    cleanup.append(tmp_path / "runs")
    job = _job(tmp_path, 4, "[budget]\ntokens = 12000")
    job.write_text(job.read_text().replace(f'"{MODEL}"', '"offline"'))
    main(["run", str(job), "--plain"])
    err = capsys.readouterr().err
    (run,) = RunDir.list(tmp_path / "runs")
    spent = [e for e in run.journal.read() if e.event == "budget_spent"]
    assert spent and all(e.usd == 0 and e.tokens > 0 for e in spent), err
    assert spent[-1].spent_usd == 0
    assert spent[-1].spent_tokens <= 12000 + max(e.tokens for e in spent)
    results = [run.outcome(f"m{i + 1}") for i in range(4)]
    assert any(r.limit == "budget" for r in results), err
