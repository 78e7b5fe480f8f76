"""The choice among a coding member's parallel attempts (coordinator/attempts/selection.py),
without boxes: Fleet's test verdict first, a reviewer among passing attempts, the rule
when there is no reviewer answer - and a reviewer's answer taken as hostile input."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import anyio
import pytest

from coordinator.attempts.attempts import attempt_note, attempt_units, member_outcome
from coordinator.attempts.selection import (
    DIFF_CHARS,
    REASON_CHARS,
    Candidate,
    changed_lines,
    choose,
    review_prompt,
)
from coordinator.job.spec import RetryPolicy, split_attempt
from coordinator.nodes.worker import MemberUnit
from subagents.kinds.coding import read_patch
from subagents.model import ModelError
from subagents.model.base import ModelRequest, ModelResponse
from subagents.model.offline import build_message
from subagents.model.profiles import profile_for
from subagents.results.outcome import MemberOutcome
from subagents.spec import MemberSpec
from subagents.spend.budget import BudgetExhausted
from subagents.trace import TraceWriter, read_trace

REAL = "claude-sonnet-4-6"


def _patch(path: str, old: str, new: str, extra: int = 0) -> bytes:
    body = [f"-{old}", f"+{new}"] + [f"+line {i}" for i in range(extra)]
    text = "\n".join(
        [f"diff --git a/{path} b/{path}", f"--- a/{path}", f"+++ b/{path}", "@@ -1 +1 @@", *body]
    )
    return (text + "\n").encode()


def _outcome(
    status: str = "ok", *, passed: bool | None = True, files: tuple[str, ...] = ("greet.py",)
) -> MemberOutcome:
    result: dict[str, Any] = {"summary": "changed it", "files_changed": list(files)}
    if passed is not None:
        result["verified"] = {
            "command": "python3 t.py",
            "exit_code": 0 if passed else 1,
            "passed": passed,
        }
    return MemberOutcome(
        member="coder.1",
        kind="coding",
        status=status,  # type: ignore[arg-type]
        reason="" if status == "ok" else f"{status} for a reason",
        result=result if status in ("ok", "failed") else None,
        input_tokens=1000,
        output_tokens=200,
        cost_usd=0.01,
        turns=3,
    )


def _cand(n: int, patch: bytes, outcome: MemberOutcome | None = None) -> Candidate:
    c = Candidate(attempt=n, outcome=outcome or _outcome(), patch=patch)
    c.lines = changed_lines(patch)
    return c


class _Reviewer:
    """A real-model stand-in: answers with ``answer`` (content blocks) or raises."""

    offline = False

    def __init__(self, answer: list[dict[str, Any]] | BaseException) -> None:
        self.answer = answer
        self.profile = profile_for(REAL)
        self.requests: list[ModelRequest] = []
        self.closed = False

    async def complete(self, request: ModelRequest) -> ModelResponse:
        self.requests.append(request)
        if isinstance(self.answer, BaseException):
            raise self.answer
        message = build_message(
            self.answer,
            model=REAL,
            input_tokens=3000,
            message_id="msg_review",
            usage={"output_tokens": 60},
        )
        return ModelResponse(message=message)

    async def count_tokens(self, request: ModelRequest) -> int | None:
        return None

    async def aclose(self) -> None:
        self.closed = True


def _pick(n: Any, reason: Any = "the cleanest fix") -> list[dict[str, Any]]:
    return [
        {
            "type": "tool_use",
            "id": "t1",
            "name": "choose_attempt",
            "input": {"attempt": n, "reason": reason},
        }
    ]


def _choose(tmp_path: Path, cands: list[Candidate], reviewer: Any, model: str = REAL) -> Any:
    trace = TraceWriter(tmp_path / "trace.jsonl", run="r", member="coder")

    async def go() -> Any:
        return await choose(
            "coder",
            "Fix greet.",
            cands,
            model_name=model,
            make_model=lambda *a, **k: reviewer,
            run_id="run-sel",
            trace=trace,
        )

    try:
        return anyio.run(go)
    finally:
        trace.close()


A = _patch("greet.py", "Hello", "Hello there")
B = _patch("greet.py", "Hello", "Hi there", extra=3)
C = _patch("other.py", "x = 1", "x = 2", extra=1)


def test_changed_lines_counts_added_and_removed_not_headers():
    assert changed_lines(A) == 2
    assert changed_lines(B) == 5
    assert changed_lines(b"") == 0


def test_the_reviewer_chooses_among_passing_attempts_and_its_call_is_traced_and_counted(tmp_path):
    reviewer = _Reviewer(_pick(2, "keeps the greeting's tone"))
    got = _choose(tmp_path, [_cand(1, A), _cand(2, B), _cand(3, C)], reviewer)
    assert (got.choice.attempt, got.choice.by) == (2, "reviewer")
    assert got.choice.reason == "keeps the greeting's tone"
    assert got.choice.input_tokens == 3000 and got.choice.output_tokens == 60
    assert got.choice.cost_usd > 0 and reviewer.closed
    (request,) = reviewer.requests
    assert request.tool_choice == {"type": "any"}  # not the budget's closing-call shape
    enum = request.tools[0]["input_schema"]["properties"]["attempt"]["enum"]
    assert enum == [1, 2, 3]
    calls = [e for e in read_trace(tmp_path / "trace.jsonl") if e.type == "model_call"]
    assert len(calls) == 1 and calls[0].span == "coder/review" and calls[0].input_tokens == 3000


def test_a_failing_test_or_no_patch_is_never_a_candidate_whatever_the_reviewer_says(tmp_path):
    failed = _cand(1, A, _outcome("failed", passed=False))
    empty = _cand(2, b"")
    crashed = _cand(3, B, _outcome("crashed", passed=None))
    good = _cand(4, C)
    reviewer = _Reviewer(_pick(1))
    got = _choose(tmp_path, [failed, empty, crashed, good], reviewer)
    assert (got.choice.attempt, got.choice.by) == (4, "only")
    assert got.candidates == [4] and reviewer.requests == []  # one candidate: no call


def test_a_reviewer_naming_a_non_candidate_falls_to_the_rule(tmp_path):
    for answer in (_pick(3), _pick(9), _pick("2"), _pick(True), _pick(None)):
        cands = [_cand(1, B), _cand(2, A), _cand(3, C, _outcome("failed", passed=False))]
        got = _choose(tmp_path, cands, _Reviewer(answer))
        assert (got.choice.attempt, got.choice.by) == (2, "rule"), answer
        assert "named no candidate" in got.choice.reason
        assert got.choice.input_tokens == 3000  # the call that was made still counts
    text_only = [{"type": "text", "text": "I pick attempt 1"}]
    got = _choose(tmp_path, [_cand(1, B), _cand(2, A)], _Reviewer(text_only))
    assert (got.choice.attempt, got.choice.by) == (2, "rule")
    assert "did not call choose_attempt" in got.choice.reason


def test_no_reviewer_answer_means_the_fewest_changed_lines(tmp_path):
    for error, words in (
        (ModelError("overloaded", retryable=True), "the model failed"),
        (BudgetExhausted("the hard line"), "the run's budget"),
    ):
        got = _choose(tmp_path, [_cand(1, B), _cand(2, A)], _Reviewer(error))
        assert (got.choice.attempt, got.choice.by) == (2, "rule")
        assert words in got.choice.reason and "fewest changed lines (2)" in got.choice.reason
        assert got.choice.input_tokens == 0
    offline = _Reviewer(_pick(1))
    got = _choose(tmp_path, [_cand(1, B), _cand(2, A)], offline, model="offline")
    assert (got.choice.attempt, got.choice.by) == (2, "rule") and offline.requests == []


def test_the_rule_breaks_ties_by_agreement_then_number(tmp_path):
    same_as_3 = A.replace(b"+Hello there", b"+Hello there   ")  # whitespace at the end only
    other = _patch("greet.py", "Hello", "Howdy")  # as small as A, made once
    cands = [_cand(1, other), _cand(2, B), _cand(3, A), _cand(4, same_as_3)]
    got = _choose(tmp_path, cands, _Reviewer(ModelError("down")))
    assert got.choice.attempt == 3  # two attempts made it
    assert cands[3].same_as == 3 and cands[2].agree == 2


def test_attempts_that_all_made_the_same_change_need_no_reviewer(tmp_path):
    reviewer = _Reviewer(_pick(2))
    got = _choose(tmp_path, [_cand(1, A), _cand(2, A)], reviewer)
    assert (got.choice.attempt, got.choice.by) == (1, "rule") and reviewer.requests == []


def test_nothing_to_choose_names_each_attempts_end(tmp_path):
    cands = [
        _cand(1, A, _outcome("failed", passed=False)),
        _cand(2, b"", _outcome("timed_out", passed=None)),
    ]
    got = _choose(tmp_path, cands, _Reviewer(_pick(1)))
    assert got.choice.attempt is None and got.choice.by == "none"
    assert "1: failed" in got.choice.reason and "2: timed_out" in got.choice.reason


def test_the_reviewers_reason_is_bounded_and_its_prompt_too(tmp_path):
    long = "why " * 5000 + "\x1b[2J"
    got = _choose(tmp_path, [_cand(1, B), _cand(2, A)], _Reviewer(_pick(1, long)))
    assert got.choice.attempt == 1 and len(got.choice.reason) <= REASON_CHARS
    huge = [_cand(n, _patch(f"f{n}.py", "a", "b", extra=20_000)) for n in (1, 2, 3)]
    prompt = review_prompt("Fix it.", huge)
    assert len(prompt) < DIFF_CHARS + 10_000
    assert prompt.count("[... diff cut at") == 3
    twins = [_cand(1, A), _cand(2, A), _cand(3, B)]
    from coordinator.attempts.selection import group_same

    group_same(twins)
    prompt = review_prompt("Fix it.", twins)
    assert prompt.count("+Hello there") == 1 and "attempts 2 made the same change" in prompt


def test_a_patch_is_never_read_through_a_link(tmp_path):
    secret = tmp_path / "secret"
    secret.write_text("host file")
    link = tmp_path / "patch.diff"
    os.symlink(secret, link)
    assert read_patch(link, 1 << 20) == b""
    real = tmp_path / "real.diff"
    real.write_bytes(b"x" * 100)
    assert read_patch(real, 10) == b"x" * 10


def _unit(tmp_path: Path, n: int) -> MemberUnit:
    spec = MemberSpec(id="coder", kind="coding", task="Fix greet.", model="offline")
    return MemberUnit(
        run_id="run-att",
        member_dir=str(tmp_path / "members" / "coder"),
        spec=spec.model_copy(update={"stated_deadline_s": 60}),
        retry=RetryPolicy(),
        attempts=n,
    )


def test_attempts_are_units_of_their_own_told_apart_on_purpose(tmp_path):
    subs = attempt_units(_unit(tmp_path, 3))
    assert [s.spec.id for s in subs] == ["coder.1", "coder.2", "coder.3"]
    assert [split_attempt(s.spec.id) for s in subs] == [("coder", 1), ("coder", 2), ("coder", 3)]
    assert split_attempt("coder") is None and split_attempt("research-1") is None
    assert subs[0].spec.task == "Fix greet."
    assert "Attempt 2 of 3" in subs[1].spec.task and "Attempt 3 of 3" in subs[2].spec.task
    assert subs[1].spec.task != subs[2].spec.task  # each leads with its own approach
    assert all(s.attempts == 1 for s in subs)
    assert subs[2].member_dir.endswith("members/coder/attempts/3")
    assert attempt_note(2, 8) != attempt_note(3, 8)


def test_the_member_outcome_is_the_chosen_attempts_with_everything_spent(tmp_path):
    unit = _unit(tmp_path, 3)
    cands = [_cand(1, B), _cand(2, A), _cand(3, b"", _outcome("crashed", passed=None))]
    got = _choose(tmp_path, cands, _Reviewer(_pick(1, "clearer")))
    out = member_outcome(unit, cands, got.choice, 12.5)
    assert out.member == "coder" and out.status == "ok" and out.choice.attempt == 1
    assert [a.attempt for a in out.attempts] == [1, 2, 3]
    assert [a.verified for a in out.attempts] == [True, True, None]
    assert out.attempts[0].patch == "attempts/1/patch.diff" and out.attempts[2].patch == ""
    assert out.input_tokens == 3 * 1000 + 3000 and out.turns == 9
    assert out.cost_usd == pytest.approx(0.03 + got.choice.cost_usd)
    nothing = [
        _cand(1, A, _outcome("failed", passed=False)),
        _cand(2, b"", _outcome("crashed", passed=None)),
    ]
    got = _choose(tmp_path, nothing, _Reviewer(_pick(1)))
    out = member_outcome(unit, nothing, got.choice, 3.0)
    assert out.status == "failed" and out.reason.startswith("none of 2 attempts was chosen")
    assert out.result is not None  # the failing attempt's change, kept for reading
