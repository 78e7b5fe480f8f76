"""The approval queue without a run: an argument no UTF-8 file can hold is still asked
about and shown, and the waiting side takes a yes only for what it showed."""

from __future__ import annotations

import anyio

from coordinator.oversight.approvals import ApprovalQueue, FileApprover, shown_sha256
from subagents.rules.policy import ApprovalRequest


def _request(command: str) -> ApprovalRequest:
    return ApprovalRequest(
        member="m", call_id="c1", tool="shell", input={"command": command}, rule="shell:rm *"
    )


def _answered_by(queue: ApprovalQueue, request: ApprovalRequest, sha: str) -> tuple[bool, str]:
    async def go() -> tuple[bool, str]:
        asked = anyio.Event()
        approver = FileApprover(queue, "wait", changed=asked.set)
        async with anyio.create_task_group() as tg:

            async def answer() -> None:
                await asked.wait()  # the request is on disk
                (req,) = queue.pending()
                own = shown_sha256(req["input"])
                queue.answer(req["id"], allowed=True, by="fleet approve", sha256=sha or own)

            tg.start_soon(answer)
            approval = await approver.ask(request, 10)
        return approval.allowed, approval.by

    return anyio.run(go)


def test_a_lone_surrogate_in_an_argument_is_asked_about_and_shown_escaped(tmp_path):
    queue = ApprovalQueue(tmp_path)
    request = _request("rm -f a\ud800b \x9b31m")
    assert _answered_by(queue, request, "") == (True, "fleet approve")
    (req,) = queue.requests()
    assert req["input"] == request.input  # kept exactly, though no UTF-8 text holds it
    shown = queue.describe(req)
    assert "rm -f a\\ud800b \\u009b31m" in shown and "\x9b" not in shown


def test_a_yes_to_another_argument_than_the_one_asked_about_is_a_no(tmp_path):
    queue = ApprovalQueue(tmp_path)
    other = shown_sha256({"command": "rm -f notes.txt"})
    allowed, by = _answered_by(queue, _request("rm -rf /workspace"), other)
    assert not allowed and by == "fleet approve, to another argument than the one asked about"
