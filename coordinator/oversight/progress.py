"""Live progress: one row per member - status, turn, tokens in/out, elapsed, last action.

Fed by two streams the run already produces: every member's trace events (a
``TraceWriter`` listener) and the run journal (queued, started, retried, finished).
On a terminal the table is redrawn in place with plain ANSI cursor moves (no extra
dependency), at most a few times a second; anywhere else (a pipe, CI, a log file)
it prints one plain line per state change, so logs stay readable and greppable.
The final summary table and the run directory path are printed either way.

Asks of the members' tool policies are shown under the table (a terminal) or as a
line each (elsewhere), their arguments whole (:meth:`ApprovalQueue.describe`), and so
is each answer: approved or refused, by whom and when. Everything a model or a box
wrote (arguments, last actions, reasons) passes :func:`~coordinator.oversight.visible.visible`
first: no escape sequence of theirs reaches the terminal. On a terminal the lines
under the table are cut to its width by us, so the redraw knows how many rows to
move up over.
"""

from __future__ import annotations

import shutil
import sys
import time
import unicodedata
from dataclasses import dataclass, field
from typing import Any, TextIO

import anyio

from subagents.results.outcome import MemberOutcome

from ..journal.entries import (
    AnyEntry,
    ApprovalAnsweredEntry,
    MemberFinishedEntry,
    MemberQueuedEntry,
    MemberRetryEntry,
    MemberStartedEntry,
)
from .approvals import ApprovalQueue, answered_line
from .visible import visible

_DONE = {"ok", "failed", "timed_out", "crashed", "cancelled", "incomplete", "skipped"}
_COLOURS = {
    "ok": "32",
    "failed": "31",
    "timed_out": "33",
    "crashed": "31",
    "cancelled": "90",
    "incomplete": "33",
    "skipped": "90",
    "waiting (budget)": "90",
    "retrying": "35",
    "running": "36",
}


@dataclass
class Row:
    member: str
    status: str = "queued"
    turn: int = 0
    tokens_in: int = 0
    tokens_out: int = 0
    started: float | None = None
    ended: float | None = None
    last: str = ""
    whole: bool = False
    """Show ``last`` uncut: it names a kept box, which the user will want to copy."""
    reason: str = ""
    attempts: int = 0
    recorded: float | None = None
    """Duration recorded by an earlier life of the run (a resume shows it, not 0)."""
    wave: int | None = None
    """A lead run: the wave that started this member (None elsewhere)."""

    def elapsed(self, now: float) -> float:
        if self.recorded is not None:
            return self.recorded
        if self.started is None:
            return 0.0
        return (self.ended or now) - self.started


def _k(n: int) -> str:
    return f"{n / 1000:.1f}k" if n >= 1000 else str(n)


def _action(event: Any) -> str:
    t = getattr(event, "type", "")
    if t == "tool_call":
        args = ", ".join(f"{v}" for v in list(event.input.values())[:1])
        return f"{event.tool}({args[:40]})"
    if t == "model_call":
        return f"model -> {event.stop_reason or '?'}"
    if t == "compaction":
        return f"compacted {_k(event.tokens_before)} -> {_k(event.tokens_after)}"
    if t == "offload":
        return f"offloaded {_k(event.tokens)} tokens"
    if t == "sandbox" and event.action in ("create", "close", "keep"):
        if event.action == "keep":
            return f"box kept: {event.box}"
        return "box up" if event.action == "create" else "box removed"
    if t == "sandbox" and event.action == "setup_start":
        return "setting up the repository (waits on its setup)"
    if t == "sandbox" and event.action == "setup":
        if not event.detail.get("ok"):
            return "setup failed"
        if event.detail.get("reused"):
            return "setup reused (prepared snapshot)"
        return f"set up in {event.duration_s:.1f} s"
    if t == "rate_wait" and not event.waited_s:
        return f"waiting ~{event.expected_s:.0f} s: {event.reason}"
    if t == "tool_result" and event.is_error:
        return f"{event.tool} error"
    if t == "model_switch":
        return f"overloaded: now on {event.to}"
    return ""


@dataclass
class Progress:
    """The progress view of one run."""

    members: list[str]
    out: TextIO = field(default_factory=lambda: sys.stderr)
    tty: bool | None = None
    rows: dict[str, Row] = field(default_factory=dict)
    approvals: ApprovalQueue | None = None
    """The run's asks waiting for a person, shown under the table (None: no waiting)."""
    approve_hint: str = "fleet approve RUN"
    answers: list[str] = field(default_factory=list)
    """The latest answers to asks, as told (a terminal shows the last few)."""
    _shown_asks: set[str] = field(default_factory=set)
    _drawn: int = 0
    _dirty: bool = True
    _t0: float = field(default_factory=time.monotonic)

    def __post_init__(self) -> None:
        if self.tty is None:
            self.tty = bool(getattr(self.out, "isatty", lambda: False)())
        for m in self.members:
            self.rows.setdefault(m, Row(m))

    # -- feeds -------------------------------------------------------------------------

    def on_event(self, event: Any) -> None:
        """TraceWriter listener."""
        row = self.rows.setdefault(event.member, Row(event.member))
        t = getattr(event, "type", "")
        if t == "model_call":
            if not event.closing:  # the closing call after a limit is not a turn
                row.turn = max(row.turn, event.turn)
            row.tokens_in += event.input_tokens + event.cache_read_tokens + event.cache_write_tokens
            row.tokens_out += event.output_tokens
        what = _action(event)
        if what:
            row.last = what
            row.whole = t == "sandbox" and event.action == "keep"
            self._dirty = True

    def on_journal(self, entry: AnyEntry) -> None:
        """Journal listener (member state changes)."""
        match entry:
            case ApprovalAnsweredEntry(member=str(m)) if m:
                self.rows.setdefault(m, Row(m))
                self._answered(entry)
                return
            case MemberQueuedEntry(member=m) if entry.waiting:
                row = self.rows.setdefault(m, Row(m))
                row.status = f"waiting ({entry.waiting})"
            case MemberQueuedEntry(member=m):
                row = self.rows.setdefault(m, Row(m))
                if entry.wave is not None:  # shown in the table, not worth a plain line
                    row.wave, self._dirty = entry.wave, True
                return
            case MemberStartedEntry(member=m):
                row = self.rows.setdefault(m, Row(m))
                row.status, row.attempts = "running", entry.attempt or 1
                row.started = row.started or time.monotonic()
                row.ended = None
            case MemberRetryEntry(member=m):
                row = self.rows.setdefault(m, Row(m))
                row.status, row.reason = "retrying", entry.reason
            case MemberFinishedEntry(member=m):
                row = self.rows.setdefault(m, Row(m))
                row.status, row.reason = entry.status, entry.reason
                row.ended = time.monotonic()
            case _:
                return
        self._dirty = True
        if not self.tty:
            self._plain(row)

    def restore(self, member: str, status: str, outcome: MemberOutcome | None) -> None:
        """A member finished before a resume: show its recorded turns, tokens and time
        (from its ``result.json``), marked as such, instead of an empty row."""
        row = self.rows.setdefault(member, Row(member))
        row.status = status
        if outcome is not None:
            row.turn = outcome.turns
            row.tokens_in = (
                outcome.input_tokens + outcome.cache_read_tokens + outcome.cache_write_tokens
            )
            row.tokens_out = outcome.output_tokens
            row.recorded = outcome.duration_s
            row.reason = outcome.reason
        row.last = "finished before the resume"
        self._dirty = True
        if not self.tty:
            self._plain(row)

    def _answered(self, entry: ApprovalAnsweredEntry) -> None:
        line = answered_line(entry)
        self.answers = [*self.answers[-2:], line]
        self._dirty = True
        if not self.tty:
            now = time.monotonic() - self._t0
            print(f"[{now:6.1f}s] {line}", file=self.out, flush=True)

    def approvals_changed(self) -> None:
        """An ask appeared or was answered: redraw; in plain mode, print new asks once."""
        self._dirty = True
        if self.tty or self.approvals is None:
            return
        for req in self.approvals.pending():
            if req["id"] not in self._shown_asks:
                self._shown_asks.add(req["id"])
                now = time.monotonic() - self._t0
                print(
                    f"[{now:6.1f}s] approval needed: {self.approvals.describe(req)}; answer "
                    f"with '{self.approve_hint} --id {req['id']}'",
                    file=self.out,
                    flush=True,
                )

    def _ask_lines(self) -> list[str]:
        lines = list(self.answers)
        queue = self.approvals
        pending = queue.pending() if queue is not None else []
        if queue is None or not pending:
            return lines
        lines.append(
            f"waiting for approval ({len(pending)}): y = yes, n = no, a = always for its rule"
        )
        lines += [f"{'>' if i == 0 else ' '} {queue.describe(r)}" for i, r in enumerate(pending)]
        return [*lines, f"  (or from another terminal: {self.approve_hint} --id ID)"]

    # -- output ------------------------------------------------------------------------

    def _plain(self, row: Row) -> None:
        now = time.monotonic()
        line = f"[{now - self._t0:6.1f}s] {row.member}: {row.status}"
        if row.status in _DONE or row.status == "retrying":
            line += f" after {row.elapsed(now):.1f}s, {row.turn} turns, {_k(row.tokens_in)} in / {_k(row.tokens_out)} out"
            if row.reason:
                line += f" - {visible(row.reason)}"
            if row.recorded is not None:
                line += " (finished before the resume)"
        if row.attempts > 1 and row.status == "running":
            line += f" (attempt {row.attempts})"
        print(line, file=self.out, flush=True)

    def table(self, *, colour: bool = False) -> list[str]:
        now = time.monotonic()
        width = max([len(m) for m in self.rows] + [6])
        # WAVE only on a lead run: the wave (the lead's spawn call) each member came in.
        waves = any(r.wave is not None for r in self.rows.values())
        head = f"{'member':<{width}}  {'wave ' if waves else ''}{'status':<10} {'turn':>4} {'in':>7} {'out':>7} {'time':>7}  last action"
        lines = [head]
        for r in self.rows.values():
            status = f"{r.status:<10}"
            if colour and r.status in _COLOURS:
                status = f"\x1b[{_COLOURS[r.status]}m{status}\x1b[0m"
            last = r.reason if r.status in _DONE and r.status != "ok" else r.last
            if not (r.whole and last is r.last):
                last = last[:60]
            last = visible(last)
            wave = (f"{r.wave:>4} " if r.wave is not None else "     ") if waves else ""
            lines.append(
                f"{r.member:<{width}}  {wave}{status} {r.turn:>4} {_k(r.tokens_in):>7} "
                f"{_k(r.tokens_out):>7} {r.elapsed(now):>6.1f}s  {last}"
            )
        return lines

    def draw(self) -> None:
        """Redraw the table in place (terminal only)."""
        if not self.tty or not self._dirty:
            return
        width = max(20, shutil.get_terminal_size().columns - 1)
        lines = self.table(colour=True) + [
            part for line in self._ask_lines() for part in _rows(line, width)
        ]
        buf = f"\x1b[{self._drawn}F" if self._drawn else ""
        buf += "".join(f"\x1b[2K{line}\n" for line in lines)
        if len(lines) < self._drawn:  # the ask lines went: clear what they left below
            buf += "\x1b[J"
        self.out.write(buf)
        self.out.flush()
        self._drawn = len(lines)
        self._dirty = False

    async def run(self, interval: float = 0.25) -> None:
        """Keep the table fresh until cancelled (the elapsed column ticks)."""
        while True:
            self._dirty = True
            self.draw()
            await anyio.sleep(interval)

    def summary(self, run_dir: str, verdict: str) -> str:
        """The final table, the verdict and where the run directory is."""
        if self.tty:
            self._dirty = True
            self.draw()
            lines = []
        else:
            lines = self.table()
        lines += ["", verdict, f"run directory: {run_dir}"]
        return "\n".join(lines)


def _rows(line: str, width: int) -> list[str]:
    """``line`` cut into pieces that each fit on one terminal row of ``width`` columns
    (a wide character takes two)."""
    rows, cur, used = [], "", 0
    for c in line:
        w = (
            2
            if unicodedata.east_asian_width(c) in ("W", "F")
            else 0
            if unicodedata.combining(c)
            else 1
        )
        if used + w > width:
            rows.append(cur)
            cur, used = "", 0
        cur += c
        used += w
    return [*rows, cur]
