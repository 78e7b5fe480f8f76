"""``fleet approve RUN``: answer, from any terminal, the calls a run's members wait on.

The run's asks are files in ``runs/<run>/approvals/`` (coordinator/approvals.py says
why); this command reads the pending ones and writes answers, exactly as a key
pressed at the run's own terminal would. With ``--yes``, ``--no`` or ``--always`` it
answers every pending ask (or only ``--id ID``) without prompting; otherwise, on a
terminal, it asks about each in turn, and elsewhere it lists them. ``--wait S`` waits
up to S seconds for an ask to appear (for scripts that start a run and answer it).
"""

from __future__ import annotations

import argparse
import sys
import time
from typing import Any

from ..approvals import ApprovalQueue, describe
from ..errors import UsageError
from ..runs import RunDir, RunNotFound
from . import add_runs_dir


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
    verdict = {"yes": (True, False), "no": (False, False), "always": (True, True)}.get(
        args.answer or ""
    )
    if verdict is None and not sys.stdin.isatty():
        for req in pending:
            print(f"{req['id']}  {describe(req)}")
        print(f"answer with: fleet approve {run.id} --yes | --no | --always [--id ID]")
        return 0
    for req in pending:
        allowed, always = verdict if verdict is not None else _prompt(req)
        if queue.answer(str(req["id"]), allowed=allowed, always=always, by="fleet approve"):
            word = "always (this rule)" if always else "yes" if allowed else "no"
            print(f"{req['id']}: {word} - {describe(req)}")
        else:
            print(f"{req['id']}: already answered ({(queue.answer_of(req['id']) or {}).get('by')})")
    return 0


def _pending(queue: ApprovalQueue, rid: str | None, wait_s: float) -> list[dict[str, Any]]:
    deadline = time.monotonic() + wait_s
    while True:
        pending = [r for r in queue.pending() if rid is None or r["id"] == rid]
        if pending or time.monotonic() >= deadline:
            return pending
        time.sleep(0.2)


def _prompt(req: dict[str, Any]) -> tuple[bool, bool]:
    while True:
        try:
            key = input(f"{describe(req, 200)}\n  allow? [y]es / [n]o / [a]lways: ").strip().lower()
        except EOFError:
            return False, False
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
                "yes": "allow every pending call (or --id's)",
                "no": "refuse them: the member gets an error result and goes on",
                "always": "allow them, and every later call their rule matches in this run",
            }[word],
        )
    p.add_argument("--id", metavar="ID", help="answer only this ask (ids: fleet approve RUN)")
    p.add_argument(
        "--wait",
        type=float,
        default=0.0,
        metavar="S",
        help="wait up to S seconds for an ask to appear (default: answer what is there)",
    )
    add_runs_dir(p)
    p.set_defaults(func=cmd_approve)
