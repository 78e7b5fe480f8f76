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

What a person approves is what they were shown. A request's arguments are shown whole,
never cut, with every character that could hide or rewrite something made visible
(:mod:`coordinator.oversight.visible`: no escape sequence from a model reaches a terminal raw).
An argument longer than :data:`LONG_CHARS` is not printed but written, shown the same
way, to ``<id>.review.txt`` beside its request, and its path and sha256 are printed.
Every answer carries the sha256 of the showing its answerer read, and the waiting
side takes a yes only when that is the sha256 of its own request's showing: a yes
given to anything else (a request file changed after it was written) is a no. Each
answer is journalled (``approval_answered``: by whom - ``fleet approve`` with its pid
and user, the terminal prompt, the timeout - and when) and told in the progress output.
"""

from __future__ import annotations

import contextlib
import fcntl
import getpass
import json
import os
import time
import uuid
from collections.abc import Callable, Iterator
from datetime import datetime
from pathlib import Path
from typing import Any, Literal

import anyio

from subagents.rules.policy import Approval, ApprovalRequest

from ..journal.entries import (
    ApprovalAbandonedEntry,
    ApprovalAnsweredEntry,
    ApprovalRequestedEntry,
    JournalEntryModel,
)
from .visible import digest, shown, visible

Mode = Literal["wait", "default", "all"]
POLL_S = 0.2
LONG_CHARS = 4096
"""An argument shown longer than this is written to a review file, not printed."""


class ApprovalQueue:
    """The request and answer files of one run (``runs/<run>/approvals/``)."""

    def __init__(self, directory: Path) -> None:
        self.dir = Path(directory)

    def request(self, req: ApprovalRequest, *, attempt: int = 0) -> str:
        """Record a request (and its review file, for a long argument); returns its id."""
        self.dir.mkdir(parents=True, exist_ok=True)
        rid = f"{time.strftime('%H%M%S')}-{uuid.uuid4().hex[:6]}"
        data = {"id": rid, "asked_at": time.time(), "attempt": attempt, **req.model_dump()}
        self.review_file(data)
        _write_atomic(self.dir / f"{rid}.request.json", data)
        return rid

    def review_file(self, req: dict[str, Any]) -> Path | None:
        """Where a long argument is shown whole (written if it is not there as shown);
        None for an argument short enough to print."""
        text = shown(req.get("input", {}))
        if len(text) <= LONG_CHARS:
            return None
        path = self.dir / f"{req.get('id')}.review.txt"
        with contextlib.suppress(OSError):
            if path.read_text(encoding="utf-8") == text:
                return path
        self.dir.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex[:6]}")
        tmp.write_text(text, encoding="utf-8")
        os.replace(tmp, path)
        return path

    def describe(self, req: dict[str, Any]) -> str:
        """What a person is shown of a request: member, tool, the whole argument (or,
        when long, the file it is in and its sha256), the rule that asked."""
        text = shown(req.get("input", {}))
        review = self.review_file(req)
        if review is not None:
            text = (
                f"with an argument of {len(text)} characters, too long to print: review it "
                f"whole in {review} (sha256 {digest(text)})"
            )
        rule = req.get("rule") or "the policy's default"
        return f"{req.get('member')} wants {req.get('tool')} {text} (rule {rule})"

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
        self,
        rid: str,
        *,
        allowed: bool,
        by: str,
        sha256: str = "",
        always: bool = False,
        **extra: Any,
    ) -> bool:
        """Answer request ``rid``, having been shown the argument whose showing has
        ``sha256`` (see :func:`shown_sha256`); False when it was answered already
        (first answer wins)."""
        if not (self.dir / f"{rid}.request.json").exists():
            raise KeyError(rid)
        data = {
            "allowed": allowed,
            "by": by,
            "always": always,
            "sha256": sha256,
            "answered_at": time.time(),
            **extra,
        }
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
    """The coordinator's :class:`~subagents.rules.policy.Approver`: asks through the queue."""

    def __init__(
        self,
        queue: ApprovalQueue,
        mode: Mode,
        *,
        journal: Callable[[JournalEntryModel], Any] | None = None,
        changed: Callable[[], None] | None = None,
    ) -> None:
        self.queue, self.mode = queue, mode
        self.journal = journal
        """Appends an entry to the run's journal: asks made, answered and abandoned."""
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
        sha = shown_sha256(request.input)
        self._note(ApprovalRequestedEntry(id=rid, sha256=sha, **_asked(request)))
        try:
            with anyio.move_on_after(timeout_s if timeout_s is not None else float("inf")):
                while True:
                    answer = self.queue.answer_of(rid)
                    if answer is not None:
                        return self._answered(request, rid, sha, answer)
                    await anyio.sleep(POLL_S)
            # Timed out, unless an answer came in the same instant: first answer wins.
            allow = request.ask_default == "allow"
            self.queue.answer(rid, allowed=allow, by="timeout", sha256=sha)
            return self._answered(request, rid, sha, self.queue.answer_of(rid) or {})
        except anyio.get_cancelled_exc_class():
            # No await here: the record is written before the cancellation goes on.
            if self.queue.answer(rid, allowed=False, by="abandoned", reason="member stopped"):
                self._note(
                    ApprovalAbandonedEntry(id=rid, reason="member stopped", **_asked(request))
                )
            raise
        finally:
            if self.changed is not None:
                self.changed()

    def _answered(
        self, request: ApprovalRequest, rid: str, sha: str, answer: dict[str, Any]
    ) -> Approval:
        """The approval an answer gives - a yes only to the argument this request
        showed - journalled with who gave it and when."""
        approval = _approval(answer)
        if approval.allowed and answer.get("sha256") != sha:
            approval = Approval(
                allowed=False, by=f"{approval.by}, to another argument than the one asked about"
            )
        at = datetime.fromtimestamp(float(answer.get("answered_at") or time.time()))
        self._note(
            ApprovalAnsweredEntry(
                id=rid,
                allowed=approval.allowed,
                always=approval.always,
                by=approval.by,
                who=str(answer.get("who") or ""),
                answered_at=at.isoformat(timespec="seconds"),
                sha256=sha,
                **_asked(request),
            )
        )
        return approval

    def abandon_earlier(self, journal: Callable[[ApprovalAbandonedEntry], Any]) -> None:
        """A resume: close the asks of the run's earlier life nobody answered, each
        journalled; their members run again and ask again."""
        why = "the run was resumed: the member runs again and asks again"
        for req in self.queue.abandon_unanswered(why):
            journal(
                ApprovalAbandonedEntry(
                    id=req["id"],
                    member=req.get("member"),
                    tool=req.get("tool"),
                    rule=req.get("rule"),
                    reason=why,
                )
            )

    def _note(self, entry: JournalEntryModel) -> None:
        if self.changed is not None:
            self.changed()
        if self.journal is not None:
            self.journal(entry)


def _asked(request: ApprovalRequest) -> dict[str, Any]:
    """Who asked for what, as every ask's journal entry names it."""
    return {"member": request.member, "tool": request.tool, "rule": request.rule}


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
                first = pending[0]
                queue.answer(
                    str(first["id"]),
                    allowed=key != "n",
                    always=key == "a",
                    by="terminal",
                    sha256=shown_sha256(first.get("input", {})),
                    who="the run's terminal",
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


def answerer() -> str:
    """Who this process answers as (its pid and user), written beside each answer."""
    try:
        user = getpass.getuser()
    except (KeyError, OSError):
        user = f"uid {os.getuid()}"
    return f"pid {os.getpid()}, user {user}"


def shown_sha256(args: Any) -> str:
    """The sha256 of an argument as a person is shown it (what an answer is bound to)."""
    return digest(shown(args))


def answered_line(entry: ApprovalAnsweredEntry) -> str:
    """An ``approval_answered`` journal entry, told to a person: what, how, by whom, when."""
    word = "approved" if entry.allowed else "refused"
    if entry.always:
        word += " (always, for its rule)"
    by, who = entry.by or "unknown", entry.who
    if by == "terminal":
        source = "the terminal prompt"
    elif by == "timeout":
        source = "the timeout (nobody answered in time: ask_default)"
    else:
        source = f"{by} ({who})" if who else by
    at = entry.answered_at[11:] or "?"
    return f"ask {entry.id} of {entry.member} ({entry.tool}) {word} by {visible(source)} at {at}"


def _write_atomic(path: Path, data: dict[str, Any]) -> None:
    tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex[:6]}")
    with open(tmp, "w", encoding="utf-8") as f:
        # ASCII: a model's argument may hold a lone surrogate, which no UTF-8 text holds.
        json.dump(data, f, default=str)
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
