"""What ``fleet view`` serves beside the page: a run's change stamp, the list of runs,
the asks waiting on a person, and answers to them.

Live by polling, not server-sent events. The page asks ``data?since=STAMP`` every
couple of seconds while its run goes; the stamp is a hash of the names, sizes and
modification times of the files a run writes (journal, member traces and results,
report, approval files), so an unchanged run costs a few ``stat`` calls and a 204.
Polling suits what is being watched: the run directory is written by another process
(the coordinator) that tells nobody, so a push stream would itself have to poll the
disk, and would hold one thread of the server per open tab for the run's whole life;
a poll also survives a laptop's sleep or a restarted ``fleet view`` with nothing to
reconnect. The static ``--html`` page never polls: it has no server.

Answers go through :class:`coordinator.oversight.approvals.ApprovalQueue`, the same door as
``fleet approve``: the answer is bound to the sha256 of the showing the page was
given, and the server refuses it (409) when that is not the request's showing now.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from pathlib import Path
from typing import Any

from coordinator.oversight.approvals import ApprovalQueue, answerer, shown_sha256
from coordinator.rundir.run_lookup import is_run_dir, run_dirs

_WATCHED_DIRS = ("", "members", "approvals")
"""Folders of a run (and each member folder) whose files' stats make the stamp."""


def _stats(folder: Path) -> list[str]:
    out: list[str] = []
    try:
        entries = list(os.scandir(folder))
    except OSError:
        return out
    for e in entries:
        try:
            st = e.stat(follow_symlinks=False)
        except OSError:
            continue
        out.append(f"{e.name}\0{st.st_size}\0{st.st_mtime_ns}")
    return sorted(out)


def stamp(run_dir: Path) -> str:
    """A short hash that changes whenever the run writes something the page shows."""
    h = hashlib.sha256()
    for sub in _WATCHED_DIRS:
        h.update("\n".join(_stats(run_dir / sub)).encode("utf-8", "surrogateescape"))
    members = run_dir / "members"
    for name in sorted(p.name for p in members.iterdir()) if members.is_dir() else []:
        h.update("\n".join(_stats(members / name)).encode("utf-8", "surrogateescape"))
    return h.hexdigest()[:24]


def pending_asks(run_dir: Path) -> list[dict[str, Any]]:
    """The asks nobody has answered, each as a person is shown it and its sha256."""
    queue = ApprovalQueue(run_dir / "approvals")
    out = []
    for req in queue.pending():
        review = queue.review_file(req)
        out.append(
            {
                "id": str(req.get("id", "")),
                "member": str(req.get("member", "")),
                "tool": str(req.get("tool", "")),
                "rule": str(req.get("rule") or ""),
                "text": queue.describe(req),
                "sha256": shown_sha256(req.get("input", {})),
                "review": str(review.relative_to(run_dir)) if review is not None else "",
                "asked_at": req.get("asked_at", 0),
            }
        )
    return out


class AnswerRefused(Exception):
    """An answer from the page that was not recorded; ``code`` is the HTTP status."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code


VERDICTS = {"yes": (True, False), "no": (False, False), "always": (True, True)}


def answer_ask(run_dir: Path, body: dict[str, Any]) -> str:
    """Record the page's answer ``body`` (``id``, ``answer``, ``sha256``); the line told."""
    verdict = VERDICTS.get(str(body.get("answer")))
    if verdict is None:
        raise AnswerRefused(400, "answer must be yes, no or always")
    queue = ApprovalQueue(run_dir / "approvals")
    rid = str(body.get("id", ""))
    req = next((r for r in queue.pending() if str(r.get("id")) == rid), None)
    if req is None:
        raise AnswerRefused(409, f"ask {rid[:40]!r} is not waiting for an answer (answered?)")
    sha = shown_sha256(req.get("input", {}))
    if str(body.get("sha256", "")) != sha:
        raise AnswerRefused(409, "the ask is not what the page showed; reload and look again")
    allowed, always = verdict
    if not queue.answer(
        rid, allowed=allowed, always=always, by="fleet view", sha256=sha, who=answerer()
    ):
        raise AnswerRefused(409, f"ask {rid} was answered already")
    word = "always (this rule)" if always else "yes" if allowed else "no"
    return f"{rid}: {word} - {queue.describe(req)}"


def _question(run_dir: Path) -> str:
    try:
        job = json.loads((run_dir / "job.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return ""
    if not isinstance(job, dict):
        return ""
    for key in ("question", "task", "goal"):
        if isinstance(job.get(key), str) and job[key]:
            return str(job[key])[:500]
    return ""


class RunIndex:
    """The rows of ``fleet view``'s list of runs, each recomputed only when its run changed."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self._rows: dict[str, tuple[str, dict[str, Any]]] = {}

    def run_dir(self, run_id: str) -> Path | None:
        """The run called ``run_id`` directly under the root (nothing else is reachable)."""
        if not run_id or "/" in run_id or "\\" in run_id or run_id in (".", ".."):
            return None
        path = self.root / run_id
        return path if is_run_dir(path) and path.resolve().parent == self.root.resolve() else None

    def rows(self) -> list[dict[str, Any]]:
        """Every run under the root, newest first."""
        out = []
        for path in reversed(run_dirs(self.root)):
            mark = stamp(path)
            cached = self._rows.get(path.name)
            if cached is None or cached[0] != mark:
                cached = (mark, self._row(path))
                self._rows[path.name] = cached
            out.append(cached[1])
        return out

    @staticmethod
    def _row(path: Path) -> dict[str, Any]:
        # Imported here: the run directory's reader brings the job model (and the Docker
        # SDK with it), which `fleet view RUN` never needs.
        from coordinator.rundir.runs import RunDir
        from coordinator.traceview.load import load_run
        from coordinator.traceview.rollup import rollup_run

        run = RunDir(path)
        st = run.state()
        try:
            name = run.job().name
        except (OSError, ValueError):
            name = ""
        try:
            roll = rollup_run(load_run(str(path)))
            cost, asks = roll.totals.get("cost_usd", 0.0), len(pending_asks(path))
        except Exception:  # a torn run still gets its row; its figures show as unknown
            cost, asks = None, 0
        started = st.started or run.created
        end = st.finished or (time.time() if st.status == "running" else started)
        return {
            "id": path.name, "name": name, "question": _question(path), "status": st.status,
            "ok": sum(1 for s in st.members.values() if s == "ok"), "members": len(st.members),
            "started": started, "duration": max(0.0, end - started) if started else 0.0,
            "cost": cost, "asks": asks,
        }  # fmt: skip
