"""``fleet approve RUN``: answer, from any terminal, the calls a run's members wait on.

The run's asks are files in ``runs/<run>/approvals/`` (coordinator/oversight/approvals.py says
why); this command reads the pending ones and writes answers, exactly as a key
pressed at the run's own terminal would. Each ask is shown whole (its arguments made
visible, or for a long one the review file and its sha256), and each answer is bound
to the sha256 of what was shown and signed with this process's pid and user.

``--yes`` and ``--always`` answer one ask: the one ``--id ID`` names, or the only one
pending - with several pending they refuse (exit 2) and list them, so a yes never
lands on an ask its giver did not look at. For an ask whose argument was too long to
print, they also need ``--sha256`` (a prefix of 12 or more hex digits of the review
file's sha256): the yes is for the text that was reviewed. ``--no`` refuses every
pending ask (or ``--id``'s). Without a flag, on a terminal, it asks about each in
turn; elsewhere it lists them. ``--wait S`` waits up to S seconds for an ask to appear
(for scripts that start a run and answer it).
"""

from __future__ import annotations

import argparse
import sys
import time
from typing import Any

from ..errors import UsageError
from ..oversight.approvals import ApprovalQueue, answerer, shown_sha256
from ..rundir.runs import RunDir, RunNotFound
from . import add_runs_dir

_VERDICTS = {"yes": (True, False), "no": (False, False), "always": (True, True)}


def cmd_approve(args: argparse.Namespace) -> int:
    try:
        run = RunDir.open(args.run, root=args.output_dir)
    except RunNotFound as exc:
        raise UsageError(str(exc)) from None
    queue = ApprovalQueue(run.path / "approvals")
    pending = _pending(queue, args.id, args.wait)
    if not pending:
        print(f"no ask of run {run.id} is waiting for an answer")
        return 0 if args.id is None else 1
    verdict = _VERDICTS.get(args.answer or "")
    if verdict is None and not sys.stdin.isatty():
        for req in pending:
            print(f"{req['id']}  {queue.describe(req)}")
        print(f"answer with: fleet approve {run.id} --yes | --no | --always [--id ID]")
        return 0
    if verdict is not None and verdict[0]:
        refusal = _refusal(queue, run.id, pending, args)
        if refusal:
            print(refusal, file=sys.stderr)
            return 2
    for req in pending:
        allowed, always = verdict if verdict is not None else _prompt(queue, req)
        rid = str(req["id"])
        sha = shown_sha256(req.get("input", {}))
        if queue.answer(
            rid, allowed=allowed, always=always, by="fleet approve", sha256=sha, who=answerer()
        ):
            word = "always (this rule)" if always else "yes" if allowed else "no"
            print(f"{rid}: {word} - {queue.describe(req)}")
        else:
            print(f"{rid}: already answered ({(queue.answer_of(rid) or {}).get('by')})")
    return 0


def _refusal(
    queue: ApprovalQueue, run_id: str, pending: list[dict[str, Any]], args: argparse.Namespace
) -> str:
    """Why a yes may not be given as asked ("" when it may)."""
    if len(pending) > 1:
        listed = "\n".join(f"  {r['id']}  {queue.describe(r)}" for r in pending)
        return (
            f"{len(pending)} asks are pending; a yes answers one: name it with --id ID "
            f"(fleet approve {run_id} --{args.answer} --id ID).\n{listed}"
        )
    (req,) = pending
    if queue.review_file(req) is None:
        return ""
    sha = shown_sha256(req.get("input", {}))
    given = (args.sha256 or "").strip().lower()
    if len(given) >= 12 and sha.startswith(given):
        return ""
    what = "does not match" if given else "is needed"
    return (
        f"ask {req['id']} has an argument too long to print: --sha256 {what}. Review "
        f"{queue.review_file(req)}, then answer with --sha256 {sha} (12 or more of its "
        "hex digits)."
    )


def _pending(queue: ApprovalQueue, rid: str | None, wait_s: float) -> list[dict[str, Any]]:
    deadline = time.monotonic() + wait_s
    while True:
        pending = [r for r in queue.pending() if rid is None or r["id"] == rid]
        if pending or time.monotonic() >= deadline:
            return pending
        time.sleep(0.2)


def _prompt(queue: ApprovalQueue, req: dict[str, Any]) -> tuple[bool, bool]:
    while True:
        try:
            key = input(f"{queue.describe(req)}\n  allow? [y]es / [n]o / [a]lways: ")
        except EOFError:
            return False, False
        key = key.strip().lower()
        if key[:1] in ("y", "n", "a"):
            return key[:1] != "n", key[:1] == "a"


def register(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "approve", help="answer the tool calls a run's members wait on (y / n / always)"
    )
    p.add_argument("run", help="run id (or the start of one) or run directory")
    g = p.add_mutually_exclusive_group()
    for word in ("yes", "no", "always"):
        g.add_argument(
            f"--{word}",
            dest="answer",
            action="store_const",
            const=word,
            help={
                "yes": "allow the pending call (--id's, or the only one pending)",
                "no": "refuse every pending call (or --id's): the member gets an error "
                "result and goes on",
                "always": "allow it, and every later call its rule matches in this run",
            }[word],
        )
    p.add_argument("--id", metavar="ID", help="answer only this ask (ids: fleet approve RUN)")
    p.add_argument(
        "--sha256",
        metavar="HEX",
        help="for an ask whose argument was too long to print: the sha256 (12 or more "
        "hex digits) of the review file its listing names, the text you approve",
    )
    p.add_argument(
        "--wait",
        type=float,
        default=0.0,
        metavar="S",
        help="wait up to S seconds for an ask to appear (default: answer what is there)",
    )
    add_runs_dir(p)
    p.set_defaults(func=cmd_approve)
