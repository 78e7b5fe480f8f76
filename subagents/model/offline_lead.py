"""The ``lead`` offline policy: a deterministic lead, for demos and tests without a key.

It decides from the conversation alone (so it replays identically), in waves:

1. **wave 1** - one browser member per sub-question of the planner's offline plan,
   which the coordinator hands over as ``inputs.plan``;
2. wait for every member of the wave;
3. **the next wave**, from the members of the wave just ended - those a limit stopped
   too, through their partial result (what they had found when it stopped them):

   * one browser member per distinct open question that is a question about the job
     (it ends with ``?``, shares a topic word with the job's question and does not
     address an AI agent) and that no member's claim answers (no claim mentions most
     of its topic words) - asked only once over the run;
   * one coding member per distinct interactive session (``>>>`` code with its
     output) quoted in a claim: the session goes into its box as ``example.txt`` and
     ``python3 -m doctest example.txt`` is its check, whose exit code says whether the
     documented behaviour held;

   within the lead's limits (the brief says how many members and waves; a spawn the
   budget refuses is repeated with as many members as it says there is room for);
4. **finish** when a wave has nothing to follow up, or no wave or member is left:
   every claim of every browser member, cited to it (a partial result's too: the
   report marks those citations partial); the open questions that stayed open (only
   entries that are questions - a member's note such as "no passage matched" is not
   one), and the task of each browser member a limit stopped that no claim answers;
   the failures and checks in the summary.

Members' results are data. The policy acts on their structure only - a claim's
quote holding a session, an open question's topic words - never on what their
words ask for: a result saying "spawn twenty members" or "finish now" changes
nothing, since an open question that addresses an AI agent, or is not about the
job's question, is never followed up.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

from .base import ModelRequest
from .examples import example_in, one_line
from .offline import register_policy
from .offline_research import GENERIC, INJECTION, WORD, key_terms, stem

CHECK = "python3 -m doctest example.txt"
_LIMITS = re.compile(r"at most (\d+) members in at most (\d+) waves")
_STARTED = re.compile(r"^Wave (\d+) started: (.*?)\. Left:", re.M)
_ROOM = re.compile(r"room for (\d+) more")
_REPORT = re.compile(
    r"^member (\S+) \((\w+), wave (\d+)\) ended (\w+) after [^\n]*\n"
    r'<untrusted_page_content url="member:\1">\n(.*?)\n</untrusted_page_content>',
    re.M | re.S,
)


@dataclass
class Report:
    """What a wait told of one finished member."""

    member: str
    kind: str
    wave: int
    status: str
    body: dict[str, Any]

    @property
    def result(self) -> dict[str, Any]:
        """Its result, or the partial result of a member a limit stopped."""
        value = self.body.get("result") or self.body.get("partial_result")
        return value if isinstance(value, dict) else {}

    def claims(self) -> list[dict[str, Any]]:
        claims = self.result.get("claims")
        return [c for c in claims or [] if isinstance(c, dict)]

    def open_questions(self) -> list[str]:
        """Its open questions: the entries that are questions (not its notes)."""
        qs = self.result.get("open_questions") or []
        return [q.strip() for q in qs if isinstance(q, str) and q.strip().endswith("?")]


@dataclass
class _State:
    question: str = ""
    plan: list[str] = field(default_factory=list)
    max_members: int = 12
    max_waves: int = 3
    tasks: dict[str, str] = field(default_factory=dict)
    """Every member spawned so far -> its task."""
    examples: set[str] = field(default_factory=set)
    """The sessions spawned coding members check."""
    waves: int = 0
    reports: dict[str, Report] = field(default_factory=dict)
    last: tuple[str, str, bool] | None = None
    """The last tool call: (tool, its result text, is_error)."""


def _texts(content: Any) -> str:
    if isinstance(content, str):
        return content
    return "\n".join(b.get("text", "") for b in content or [] if isinstance(b, dict))


def read_state(request: ModelRequest) -> _State:
    st = _State()
    uses: dict[str, dict[str, Any]] = {}
    for i, msg in enumerate(request.messages):
        blocks = msg.get("content")
        blocks = [{"type": "text", "text": blocks}] if isinstance(blocks, str) else blocks or []
        for b in blocks:
            if i == 0 and b.get("type") == "text":
                _first_message(st, b.get("text", ""))
            elif b.get("type") == "tool_use":
                uses[b.get("id", "")] = b
            elif b.get("type") == "tool_result":
                use = uses.get(b.get("tool_use_id", ""), {})
                text = _texts(b.get("content"))
                st.last = (use.get("name", ""), text, bool(b.get("is_error")))
                _heard(st, use, text, bool(b.get("is_error")))
    return st


def _first_message(st: _State, text: str) -> None:
    if text.startswith("Inputs (JSON):"):
        try:
            inputs = json.loads(text.split("\n", 1)[1])
        except (IndexError, ValueError):
            return
        st.question = str(inputs.get("question", ""))
        st.plan = [str(q) for q in inputs.get("plan") or []]
    limits = _LIMITS.search(text)
    if limits:
        st.max_members, st.max_waves = int(limits.group(1)), int(limits.group(2))


def _heard(st: _State, use: dict[str, Any], text: str, is_error: bool) -> None:
    if use.get("name") == "spawn" and not is_error:
        started = _STARTED.search(text)
        if started:
            st.waves = max(st.waves, int(started.group(1)))
            ids = [part.split(" ")[0] for part in started.group(2).split(", ")]
            asked = (use.get("input") or {}).get("members") or []
            for mid, req in zip(ids, asked, strict=False):
                st.tasks[mid] = str(req.get("task", ""))
                st.examples.add(str((req.get("files") or {}).get("example.txt", "")))
    for m in _REPORT.finditer(text):
        try:
            body = json.loads(m.group(5))
        except ValueError:
            body = {}
        st.reports[m.group(1)] = Report(
            member=m.group(1),
            kind=m.group(2),
            wave=int(m.group(3)),
            status=m.group(4),
            body=body if isinstance(body, dict) else {},
        )


def _tool(name: str, **args: Any) -> list[dict[str, Any]]:
    return [{"type": "tool_use", "name": name, "input": args}]


def topic(text: str) -> set[str]:
    return {stem(t) for t in key_terms(text) if t not in GENERIC}


def _norm(text: str) -> str:
    return " ".join(text.lower().replace("?", " ").split())


def answered(question: str, reports: list[Report]) -> bool:
    """Some ok member's claim mentions most (two thirds) of the question's topic words."""
    want = topic(question)
    if not want:
        return True
    for r in reports:
        for c in r.claims():
            said = {stem(w) for w in WORD.findall(str(c.get("text", "")).lower())}
            if len(want & said) * 3 >= 2 * len(want):
                return True
    return False


def follow_ups(st: _State, wave: int) -> list[str]:
    """Open questions of ``wave`` worth a browser member (see the module docstring)."""
    about = topic(st.question)
    asked = {_norm(t) for t in st.tasks.values()}
    done = list(st.reports.values())
    out: list[str] = []
    for r in done:
        if r.wave != wave or r.kind != "browser":
            continue
        for q in r.open_questions():
            if INJECTION.search(q):
                continue
            if not topic(q) & about or _norm(q) in asked or answered(q, done):
                continue
            asked.add(_norm(q))
            out.append(q.strip())
    return out


def checks(st: _State, wave: int) -> list[dict[str, Any]]:
    """A coding member per distinct session quoted in ``wave``'s claims."""
    checked = set(st.examples)
    out: list[dict[str, Any]] = []
    for r in st.reports.values():
        if r.wave != wave or r.kind != "browser":
            continue
        for i, c in enumerate(r.claims()):
            example = example_in(str(c.get("quote", "")))
            if example is None or "[...]" in example:
                continue  # none, or cut to fit what a lead sees: not the page's session
            example += "\n"  # a file's last line ends with a newline
            url = str(c.get("source_url", ""))
            task = (
                f"Check a documented example by running it: example.txt in /workspace holds "
                f"an interactive session copied from {url} with the output the documentation "
                f"shows. Run `{CHECK}` and report whether the documented output held. Change "
                f"nothing. (Claim {i} of {r.member}: {one_line(str(c.get('text', '')), 120)})"
            )
            if example in checked:
                continue
            checked.add(example)
            out.append(
                {
                    "kind": "coding",
                    "task": task,
                    "files": {"example.txt": example},
                    "check": CHECK,
                    "checks_claim": {"member": r.member, "claim": i},
                }
            )
    return out


def next_wave(st: _State) -> list[dict[str, Any]]:
    if st.waves == 0:
        return [{"kind": "browser", "task": q} for q in st.plan]
    wave = st.waves
    members = [{"kind": "browser", "task": q} for q in follow_ups(st, wave)]
    return members + checks(st, wave)


def finish(st: _State) -> list[dict[str, Any]]:
    reports = list(st.reports.values())
    claims: list[dict[str, Any]] = []
    by_text: dict[str, dict[str, Any]] = {}
    for r in reports:
        for i, c in enumerate(r.claims()):
            key = _norm(str(c.get("text", "")))
            if key in by_text:
                by_text[key]["cites"].append({"member": r.member, "claim": i})
                continue
            by_text[key] = {
                "text": str(c.get("text", "")),
                "cites": [{"member": r.member, "claim": i}],
            }
            claims.append(by_text[key])
    about = topic(st.question)
    open_qs: list[str] = []
    for r in reports:
        for q in r.open_questions():
            if q not in open_qs and not (topic(q) & about and answered(q, reports)):
                open_qs.append(q)
    failed = [r for r in reports if r.status != "ok"]
    open_qs += [
        f"Not finished ({r.member} ended {r.status}): {st.tasks.get(r.member, '')}"
        for r in failed
        if r.kind == "browser" and not answered(st.tasks.get(r.member, ""), reports)
    ]
    ran = [r for r in reports if r.kind == "coding" and r.status == "ok"]
    held = sum(1 for r in ran if (r.result.get("verified") or {}).get("passed"))
    summary = (
        f"{st.waves} wave(s), {len(st.tasks)} member(s), {len(reports) - len(failed)} ended ok: "
        f"{len(claims)} claim(s) from the browser members"
    )
    if ran:
        summary += f"; {len(ran)} documented example(s) run, {held} held"
    if failed:
        summary += "; did not end ok: " + ", ".join(
            f"{r.member} ({r.status}{', partial result used' if r.result else ''})" for r in failed
        )
    summary += (
        ". Led by the offline lead (deterministic, no model): the members' own words, "
        "grouped and cited."
    )
    return _tool("finish", summary=summary, claims=claims, open_questions=open_qs)


def decide(st: _State) -> list[dict[str, Any]]:
    """The lead's next call (see the module docstring)."""
    if any(m not in st.reports for m in st.tasks):
        return _tool("wait", until="all")
    wanted = next_wave(st)
    room = st.max_members - len(st.tasks)
    if st.last is not None and st.last[0] == "spawn" and st.last[2]:
        more = _ROOM.search(st.last[1])  # refused: as many as there is room for, else done
        room = min(room, int(more.group(1))) if more else 0
    wanted = wanted[: max(0, room)]
    if wanted and st.waves < st.max_waves:
        return _tool("spawn", members=wanted)
    return finish(st)


def lead_policy(request: ModelRequest) -> list[dict[str, Any]]:
    """The ``lead`` policy (see the module docstring)."""
    return decide(read_state(request))


register_policy("lead", lead_policy)
