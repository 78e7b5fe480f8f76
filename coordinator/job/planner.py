"""The planning step: a research question split into N sub-questions, one per member.

With a real model the split is one forced tool call (``submit_plan``) whose schema
asks for exactly N self-contained sub-questions; a plan that comes back short is
topped up from the offline planner rather than failing the run. Offline, the split
is deterministic: the question's own clauses first ("how are tasks cancelled, and
how does shielding work?" is two questions already; a clause that leans on the first
one - "..., and how can a program refuse it?" - carries the first one along, since a
member sees only its own sub-question), then fixed research angles
(definitions, mechanics, pitfalls, examples...) applied to the question's topic.
Deterministic means the demo and the tests plan the same members every time, and a
resumed run could re-plan identically (it does not need to: the plan is saved).
"""

from __future__ import annotations

import re

from subagents.model.base import Model, ModelError, ModelRequest

_ANGLES = (
    "What are the key concepts and definitions behind: {topic}?",
    "How does it work in practice - the API, its parameters and behaviour - for: {topic}?",
    "What pitfalls, errors and edge cases does the documentation warn about for: {topic}?",
    "What examples does the documentation give for: {topic}?",
    "What related features or alternatives are documented for: {topic}?",
    "What changed between versions, or is deprecated, regarding: {topic}?",
)
_STOP = set(
    "a an and are as at be by can do does did for from get gets how i in is it its of on or "
    "the their them there this to use used using what when where which who why with work "
    "works".split()
)
_PLAN_TOOL = {
    "name": "submit_plan",
    "description": "Submit the research plan: one self-contained sub-question per researcher.",
    "input_schema": {
        "type": "object",
        "properties": {
            "sub_questions": {
                "type": "array",
                "items": {"type": "string", "minLength": 10},
                "description": "Distinct sub-questions that together answer the question.",
            }
        },
        "required": ["sub_questions"],
    },
}


def topic_of(question: str) -> str:
    """The question's content words, in order (for angle templates)."""
    words = re.findall(r"[A-Za-z0-9_.'-]+", question)
    keep = [w for w in words if w.lower() not in _STOP]
    return " ".join(keep) or question.strip()


def clauses(question: str) -> list[str]:
    """Independent questions inside one question ("..., and how ...?")."""
    parts = re.split(
        r"\?\s+|,?\s+and\s+(?=(?:how|what|why|when|which|where|who|does|do|is|are|can)\b)",
        question.strip(),
        flags=re.I,
    )
    out = []
    for p in parts:
        p = p.strip(" ,;?")
        if len(p.split()) >= 3:
            out.append(p[0].upper() + p[1:] + "?")
    return out


_PRONOUN = re.compile(r"\b(?:it|its|they|them|their|this|these|those)\b", re.I)


def with_subject(found: list[str]) -> list[str]:
    """Later clauses that lean on the first one ("..., and how can a program refuse
    it?") carry it along: a member sees only its own sub-question, and 'refuse it'
    alone sends it to unrelated pages. A clause is carried when it has a pronoun
    ("how does shield work?" names its own subject and stays as it is)."""
    main = found[0]
    out = [main]
    for clause in found[1:]:
        if _PRONOUN.search(clause):
            clause = f"{clause} (This is about: {main})"
        out.append(clause)
    return out


def offline_plan(question: str, n: int) -> list[str]:
    """Exactly ``n`` distinct sub-questions, deterministically."""
    plan: list[str] = []
    found = clauses(question)
    if len(found) > 1:
        found = with_subject(found)
    if len(found) > 1:
        plan.extend(found[:n])
    elif n == 1:
        return [question.strip()]
    topic = topic_of(question)
    i = 0
    while len(plan) < n:
        angle = _ANGLES[i % len(_ANGLES)].format(topic=topic)
        if i >= len(_ANGLES):
            angle += f" (part {i // len(_ANGLES) + 1})"
        plan.append(angle)
        i += 1
    return plan


async def model_plan(question: str, n: int, model: Model, *, max_tokens: int = 2048) -> list[str]:
    """Ask ``model`` for ``n`` sub-questions; raises :class:`ModelError` when it cannot."""
    prompt = (
        f"Split this research question into exactly {n} distinct, self-contained "
        f"sub-questions. Each will go to a separate researcher who sees only their "
        f"sub-question and can browse documentation. Together they must cover the "
        f"question; they should overlap as little as possible.\n\nQuestion: {question}"
    )
    request = ModelRequest(
        system="You plan research for a team of researchers. Answer only with submit_plan.",
        messages=[{"role": "user", "content": prompt}],
        tools=[_PLAN_TOOL],
        tool_choice={"type": "tool", "name": "submit_plan"},
        max_tokens=max_tokens,
    )
    response = await model.complete(request)
    for block in response.message.content:
        if block.type == "tool_use" and block.name == "submit_plan":
            subs = block.input.get("sub_questions") if isinstance(block.input, dict) else None
            if isinstance(subs, list):
                clean = [s.strip() for s in subs if isinstance(s, str) and s.strip()]
                unique = list(dict.fromkeys(clean))[:n]
                for extra in offline_plan(question, n):
                    if len(unique) >= n:
                        break
                    if extra not in unique:
                        unique.append(extra)
                return unique
    raise ModelError("the planning model did not call submit_plan", retryable=False)


async def plan(question: str, n: int, *, model: Model | None) -> tuple[list[str], str]:
    """Sub-questions and who planned them (``offline`` or the model's name)."""
    if model is None or model.offline:
        return offline_plan(question, n), "offline"
    return await model_plan(question, n, model), model.profile.name
