"""Compaction: summarize the session and restart from the summary, losing nothing for good.

Only when offloading and clipping did not bring the context under the trigger.
The model writes a structured summary (session intent, constraints, decisions,
artifacts, unresolved problems, next steps) with our prompt, or with a job's own
instructions, which replace ours entirely. The full context is saved first as
JSONL (one message per line) in the run directory and in the box, and the summary
names that file, so a fact summarized away is one ``grep`` away.

The new context is one user message: the original task verbatim (the goal is
never paraphrased), the memory as it is now, the summary, the todo list and up to
five most recently modified files (a file over 5,000 tokens comes back as its
path only). It holds no tool_use at all, so no tool_use can be left without its
tool_result.

The summarizer reads the session rendered as plain text rather than as the raw
message list: it then needs no tool definitions (any model can summarize), cannot
call a tool by mistake, and long tool results can be cut for it (they are in the
transcript file). If the summary call fails, a mechanical summary (the calls made,
files written, last words of the agent) takes its place and the run goes on.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from sandbox.base import Sandbox
from sandbox.errors import SandboxError

from ..model.base import Model, ModelError, ModelRequest, ModelResponse
from ..tools.names import show
from .config import ContextConfig
from .tokens import CHARS_PER_TOKEN, estimate_text

SUMMARY_SYSTEM = (
    "You write the working summary of an agent's session so the agent can continue the "
    "same task from it after its context is cleared. Be factual and specific; never "
    "invent. Do not address the user and do not ask questions."
)
DEFAULT_PROMPT = """Summarize the session above so the agent can continue its task without it.
Write exactly these sections, in this order, as Markdown headings:

## Session intent
What the task is and what "done" means, in the task's own terms. Keep every explicit
requirement.
## Constraints
Rules, limits and preferences stated by the task or discovered along the way.
## Decisions
Choices made and why, including approaches tried and abandoned.
## Artifacts
Files created or changed (full paths), commands that matter, results found - with
exact names, numbers, identifiers and values the agent will need.
## Unresolved problems
Errors, failing tests, open questions - with their exact messages.
## Next steps
The concrete next actions, in order.

Keep exact values (paths, numbers, names, error text) verbatim. Drop tool output that
no longer matters. At most about 1,500 words."""
SUMMARY_TAG = "compaction_summary"
CONTINUE_NOTE = (
    "Continue the task from where you left off, using the summary above. The task is "
    "unchanged: do not ask for clarification and do not restart finished steps."
)


def render_transcript(messages: list[dict[str, Any]], result_chars: int) -> str:
    """The session as plain text for the summarizer; long tool results are cut."""
    out: list[str] = []
    for message in messages:
        role = message.get("role", "?")
        content = message.get("content", "")
        if isinstance(content, str):
            out.append(f"[{role}] {content}")
            continue
        for block in content:
            out.append(f"[{role}] {_render_block(block, result_chars)}")
    return "\n".join(out)


def _render_block(block: dict[str, Any], limit: int) -> str:
    kind = block.get("type")
    if kind == "text":
        return block.get("text", "")
    if kind == "tool_use":
        args = json.dumps(block.get("input", {}), ensure_ascii=False)
        if len(args) > limit:
            args = args[:limit] + f"... [{len(args):,} chars]"
        return f"tool call {block.get('name')} {args}"
    if kind == "tool_result":
        content = block.get("content", "")
        if not isinstance(content, str):
            content = "\n".join(b.get("text", f"<{b.get('type')}>") for b in content)
        if len(content) > limit:
            half = limit // 2
            content = f"{content[:half]}\n... [{len(content):,} chars, cut] ...\n{content[-half:]}"
        error = " (error)" if block.get("is_error") else ""
        return f"tool result{error}:\n{content}"
    return f"<{kind} block>"


async def summarize(
    model: Model, messages: list[dict[str, Any]], config: ContextConfig
) -> tuple[str, ModelResponse | None]:
    """The structured summary and the model's response (None when the fallback was used)."""
    prompt = config.compaction_instructions or DEFAULT_PROMPT
    transcript = render_transcript(messages, config.transcript_result_chars)
    request = ModelRequest(
        system=SUMMARY_SYSTEM,
        messages=[
            {
                "role": "user",
                "content": [
                    {"type": "text", "text": f"<session>\n{transcript}\n</session>"},
                    {"type": "text", "text": prompt},
                ],
            }
        ],
        max_tokens=config.summary_max_tokens,
    )
    try:
        response = await model.complete(request)
    except ModelError:
        return fallback_summary(messages), None
    text = "\n".join(
        getattr(b, "text", "") for b in response.message.content if getattr(b, "type", "") == "text"
    ).strip()
    if not text:
        return fallback_summary(messages), response
    return text, response


def fallback_summary(messages: list[dict[str, Any]]) -> str:
    """A mechanical summary used when the model cannot write one."""
    calls: list[str] = []
    last_words = ""
    for message in messages:
        content = message.get("content")
        if message.get("role") != "assistant" or not isinstance(content, list):
            continue
        for block in content:
            if block.get("type") == "tool_use":
                args = json.dumps(block.get("input", {}), ensure_ascii=False)[:160]
                calls.append(f"- {block.get('name')} {args}")
            elif block.get("type") == "text" and block.get("text", "").strip():
                last_words = block["text"].strip()[:1_500]
    return (
        "## Session intent\nSee the task above.\n"
        "## Artifacts\nTool calls made so far (most recent last):\n"
        + "\n".join(calls[-40:])
        + f"\n## Next steps\nThe agent's last words before compaction:\n{last_words or '-'}\n"
        "(This summary was produced mechanically because the summary call failed; the "
        "transcript file has everything.)"
    )


def transcript_jsonl(messages: list[dict[str, Any]]) -> str:
    """The context as JSONL, one message per line."""
    return "".join(json.dumps(m, ensure_ascii=False, default=str) + "\n" for m in messages)


@dataclass
class Reread:
    """A recently modified file brought back after compaction."""

    path: str
    text: str | None
    """Its content, or None when it is too large (path only) or unreadable."""
    note: str = ""


async def reread_files(
    sandbox: Sandbox | None, paths: list[str], *, per_file: int, total: int
) -> list[Reread]:
    """Read the files back from the box: over ``per_file`` tokens, path only."""
    out: list[Reread] = []
    used = 0
    for path in paths:
        if sandbox is None:
            out.append(Reread(path, None, "not re-read: no sandbox"))
            continue
        try:
            data = await sandbox.read_file(path, limit=per_file * CHARS_PER_TOKEN * 4 + 1)
        except FileNotFoundError:
            continue  # deleted since: nothing to re-read
        except (SandboxError, OSError):
            out.append(Reread(path, None, "too large or unreadable: read it if you need it"))
            continue
        text = data.decode("utf-8", errors="replace")
        tokens = estimate_text(text)
        if tokens > per_file or used + tokens > total:
            out.append(Reread(path, None, f"~{tokens:,} tokens: read it if you need it"))
            continue
        used += tokens
        out.append(Reread(path, text))
    return out


def build_context(
    *,
    task: str,
    memory: str,
    summary: str,
    transcript_path: str,
    number: int,
    how_to_read: str = "Search it (grep) or read it in pieces.",
    todos: str,
    files: list[Reread],
) -> list[dict[str, Any]]:
    """The new context after compaction: one user message, no tool_use."""
    blocks: list[dict[str, Any]] = [{"type": "text", "text": task}]
    if memory:
        blocks.append({"type": "text", "text": memory})
    blocks.append(
        {
            "type": "text",
            "text": (
                f'<{SUMMARY_TAG} number="{number}">\n'
                "Your context was compacted to stay within its working budget. Summary of "
                f"the work so far:\n\n{summary}\n\n"
                f"The full transcript before this point is saved at {transcript_path} (JSONL, "
                f"one message per line), to recover any detail this summary left out. "
                f"{how_to_read}\n</{SUMMARY_TAG}>"
            ),
        }
    )
    if todos:
        blocks.append({"type": "text", "text": todos})
    for f in files:
        if f.text is None:
            text = f"Recently modified file {show(f.path)} ({f.note})."
        else:
            text = f'<file path="{show(f.path)}" recently_modified="true">\n{f.text}\n</file>'
        blocks.append({"type": "text", "text": text})
    blocks.append({"type": "text", "text": CONTINUE_NOTE})
    return [{"role": "user", "content": blocks}]


def unmatched_tool_calls(messages: list[dict[str, Any]]) -> list[str]:
    """Ids of tool_use blocks without a tool_result in the next message, and of
    tool_result blocks without a tool_use in the previous one (empty when sound)."""
    problems: list[str] = []
    for i, message in enumerate(messages):
        content = message.get("content")
        if not isinstance(content, list):
            continue
        if message.get("role") == "assistant":
            uses = {b["id"] for b in content if b.get("type") == "tool_use"}
            nxt = messages[i + 1].get("content") if i + 1 < len(messages) else []
            results = {
                b.get("tool_use_id")
                for b in (nxt if isinstance(nxt, list) else [])
                if b.get("type") == "tool_result"
            }
            problems += sorted(uses - results)
        elif message.get("role") == "user":
            prev = messages[i - 1].get("content") if i > 0 else []
            uses = {
                b.get("id")
                for b in (prev if isinstance(prev, list) else [])
                if b.get("type") == "tool_use"
            }
            results = {b.get("tool_use_id") for b in content if b.get("type") == "tool_result"}
            problems += sorted(r for r in results - uses if r)
    return problems
