"""Asks of members' tool policies, answered by a person: a queue of files in the run.

Why files. A request is one JSON file in ``runs/<run>/approvals/``, its answer another
beside it; ``always.json`` lists the rules a person said "always" to. That is all
the state there is, so:

* it works across processes with nothing to connect to: ``fleet approve RUN`` in
  another terminal (or a script) reads the requests and writes an answer, the same
  as a key pressed at the run's own terminal;
* it is durable: a request and its answer are on disk before anyone acts on them, so
  a coordinator killed mid-ask leaves a record, and ``fleet resume`` marks what was
  never answered as abandoned (journalled) - the member runs again and asks again -
  while "always" answers hold for the resumed run too;
* the first answer wins, atomically: an answer is written to a temporary file and
  hard-linked to its final name, which fails if someone answered first - two people
  (or a person and a timeout) cannot both decide one call.

The waiting side polls for the answer (every 0.2 s): a person answers in seconds, so
a socket or inotify would buy nothing but moving parts. Only the asking call waits;
the member's other calls and its siblings go on.

Who answers, per run: ``--approve-all`` says yes to everything; a run with a terminal
(the progress table shows pending requests and takes y / n / a) or started with
``--wait-approval`` waits for a person; any other run (a pipe, CI) cannot ask anyone,
so the member's ``ask_default`` applies at once.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, Literal

import anyio

from subagents.policy import Approval, ApprovalRequest

Mode = Literal["wait", "default", "all"]
POLL_S = 0.2


class ApprovalQueue:
    """The request and answer files of one run (``runs/<run>/approvals/``)."""

    def __init__(self, directory: Path) -> None:
        self.dir = Path(directory)

    def request(self, req: ApprovalRequest, *, attempt: int = 0) -> str:
        """Record a request; returns its id."""
        self.dir.mkdir(parents=True, exist_ok=True)
        rid = f"{time.strftime('%H%M%S')}-{uuid.uuid4().hex[:6]}"
        data = {"id": rid, "asked_at": time.time(), "attempt": attempt, **req.model_dump()}
        _write_atomic(self.dir / f"{rid}.request.json", data)
        return rid

    def requests(self) -> list[dict[str, Any]]:
        """Every request of the run, oldest first, each with its ``answer`` (or None)."""
        out = []
        for path in sorted(self.dir.glob("*.request.json")) if self.dir.is_dir() else []:
            data = _read(path)
            if data is not None:
                data["answer"] = self.answer_of(str(data.get("id", "")))
                out.append(data)
        return sorted(out, key=lambda r: r.get("asked_at", 0))

    def pending(self) -> list[dict[str, Any]]:
        """Requests nobody has answered yet, oldest first."""
        return [r for r in self.requests() if r["answer"] is None]

    def answer_of(self, rid: str) -> dict[str, Any] | None:
        return _read(self.dir / f"{rid}.answer.json")

    def answer(
        self, rid: str, *, allowed: bool, by: str, always: bool = False, **extra: Any
    ) -> bool:
        """Answer request ``rid``; False when it was answered already (first answer wins)."""
        if not (self.dir / f"{rid}.request.json").exists():
            raise KeyError(rid)
        data = {"allowed": allowed, "by": by, "always": always, "answered_at": time.time(), **extra}
        tmp = self.dir / f".{rid}.{uuid.uuid4().hex[:6]}.tmp"
        _write_atomic(tmp, data)
        try:
            os.link(tmp, self.dir / f"{rid}.answer.json")
        except FileExistsError:
            return False
        finally:
            tmp.unlink(missing_ok=True)
        if always and allowed:
            request = _read(self.dir / f"{rid}.request.json") or {}
            self.add_always(str(request.get("rule", "")))
        return True

    def always_rules(self) -> set[str]:
        data = _read(self.dir / "always.json")
        return set(data.get("rules", [])) if data else set()

    def add_always(self, rule: str) -> None:
        self.dir.mkdir(parents=True, exist_ok=True)
        with _locked(self.dir / ".always.lock"):
            rules = self.always_rules() | {rule}
            _write_atomic(self.dir / "always.json", {"rules": sorted(rules)})

    def abandon_unanswered(self, why: str) -> list[dict[str, Any]]:
        """Close every request still open (its asker is gone); returns them."""
        closed = []
        for req in self.pending():
            if self.answer(str(req["id"]), allowed=False, by="abandoned", reason=why):
                closed.append(req)
        return closed


class FileApprover:
    """The coordinator's :class:`~subagents.policy.Approver`: asks through the queue."""

    def __init__(
        self,
        queue: ApprovalQueue,
        mode: Mode,
        *,
        journal: Callable[..., Any] | None = None,
        changed: Callable[[], None] | None = None,
    ) -> None:
        self.queue, self.mode = queue, mode
        self.journal = journal
        """``journal(event, **fields)`` for requests made and abandoned."""
        self.changed = changed
        """Called when a request appears or goes (the progress table redraws)."""

    async def ask(self, request: ApprovalRequest, timeout_s: float | None) -> Approval:
        if self.mode == "all":
            return Approval(allowed=True, by="approve-all")
        if request.rule and request.sure and request.rule in self.queue.always_rules():
            return Approval(allowed=True, by="always")
        if self.mode == "default":
            return Approval(allowed=request.ask_default == "allow", by="no terminal")
        rid = await anyio.to_thread.run_sync(self.queue.request, request)
        self._note("approval_requested", request, id=rid)
        try:
            with anyio.move_on_after(timeout_s if timeout_s is not None else float("inf")):
                while True:
                    answer = self.queue.answer_of(rid)
                    if answer is not None:
                        return _approval(answer)
                    await anyio.sleep(POLL_S)
            # Timed out, unless an answer came in the same instant: first answer wins.
            self.queue.answer(rid, allowed=request.ask_default == "allow", by="timeout")
            return _approval(self.queue.answer_of(rid) or {})
        except anyio.get_cancelled_exc_class():
            # No await here: the record is written before the cancellation goes on.
            if self.queue.answer(rid, allowed=False, by="abandoned", reason="member stopped"):
                self._note("approval_abandoned", request, id=rid, reason="member stopped")
            raise
        finally:
            if self.changed is not None:
                self.changed()

    def abandon_earlier(self, journal: Callable[..., Any]) -> None:
        """A resume: close the asks of the run's earlier life nobody answered, each
        journalled; their members run again and ask again."""
        why = "the run was resumed: the member runs again and asks again"
        for req in self.queue.abandon_unanswered(why):
            journal(
                "approval_abandoned",
                id=req["id"],
                member=req.get("member"),
                tool=req.get("tool"),
                rule=req.get("rule"),
                reason=why,
            )

    def _note(self, event: str, request: ApprovalRequest, **fields: Any) -> None:
        if self.changed is not None:
            self.changed()
        if self.journal is not None:
            self.journal(
                event, member=request.member, tool=request.tool, rule=request.rule, **fields
            )


async def read_keys(queue: ApprovalQueue, fd: int, changed: Callable[[], None]) -> None:
    """Answer the oldest pending ask with a key pressed at the terminal: y(es), n(o),
    a(lways: yes, and no more asks for its rule in this run). Runs until cancelled;
    the terminal is put in cbreak mode (keys arrive unbuffered, Ctrl-C still
    interrupts) and restored, whatever happens."""
    import termios
    import tty

    try:
        saved = termios.tcgetattr(fd)
    except termios.error:
        return  # not a terminal after all: `fleet approve` still answers
    try:
        tty.setcbreak(fd)
        while True:
            await anyio.wait_readable(fd)
            data = os.read(fd, 1)
            if not data:
                return  # the terminal closed its input
            key = data.decode("utf-8", "ignore").lower()
            pending = queue.pending()
            if key in ("y", "n", "a") and pending:
                queue.answer(
                    str(pending[0]["id"]), allowed=key != "n", always=key == "a", by="terminal"
                )
                changed()
    finally:
        with contextlib.suppress(termios.error):
            termios.tcsetattr(fd, termios.TCSADRAIN, saved)


def _approval(answer: dict[str, Any]) -> Approval:
    return Approval(
        allowed=bool(answer.get("allowed")),
        by=str(answer.get("by") or "unknown"),
        always=bool(answer.get("always")),
    )


def describe(req: dict[str, Any], width: int = 100) -> str:
    """One line for a person: member, tool, arguments, the rule that asked."""
    args = json.dumps(req.get("input", {}), ensure_ascii=False, default=str)
    if len(args) > width:
        args = args[: width - 3] + "..."
    rule = req.get("rule") or "the policy's default"
    return f"{req.get('member')} wants {req.get('tool')} {args} (rule {rule})"


def _write_atomic(path: Path, data: dict[str, Any]) -> None:
    tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex[:6]}")
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(data, f, ensure_ascii=False, default=str)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def _read(path: Path) -> dict[str, Any] | None:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    with open(path, "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)
