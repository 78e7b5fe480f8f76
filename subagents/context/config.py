"""Thresholds of the context mechanisms, with their defaults (docs/members.md, "Context
management" table lists them).

Every threshold is relative to one working-set *budget* in tokens, separate from
the model's window: a 1M-token window does not mean the model attends well to 1M
tokens, so by default the budget is the smaller of 85% of the window and 150,000
tokens. The order in which the mechanisms act, each only if the one before did not
make enough room, is: offload one large result as it arrives; clip old write/edit
inputs past ``clip_fraction``; age results the model has moved past (as they leave
the recent window, past ``age_from_fraction``); past the compaction trigger (below
the budget, so the budget itself is never passed), offload older results, oldest
first, down to ``offload_target_fraction``; compact only if the context is still
over the trigger.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field


class ContextConfig(BaseModel):
    """How one member's context window is budgeted, offloaded, clipped and compacted."""

    model_config = ConfigDict(extra="forbid")

    budget_tokens: int | None = Field(default=None, ge=1_000)
    """Working-set budget in tokens; None means min(85% of the window, 150,000)."""
    budget_window_fraction: float = Field(default=0.85, gt=0, le=1)
    """Share of the model's window the default budget may use."""
    budget_cap_tokens: int = Field(default=150_000, ge=1_000)
    """Upper bound of the default budget, whatever the window."""

    offload_result_tokens: int = Field(default=20_000, ge=1)
    """A tool result over this many tokens is offloaded as it arrives (path + preview)."""
    preview_lines: int = Field(default=10, ge=0)
    """Lines of an offloaded result kept in the context as its preview."""
    preview_line_chars: int = Field(default=300, ge=20)
    """Each preview line is cut to this many characters (one-line JSON stays small)."""
    keep_recent_results: int = Field(default=3, ge=0)
    """The most recent tool results are never offloaded for being over budget, and
    (within ``keep_recent_tokens``) are not aged."""
    keep_recent_tokens: int = Field(default=20_000, ge=0)
    """Beyond the newest result, recent results stay whole only while they total at
    most this: a 15,000-token page the model has read and acted on is not re-sent in
    full (:mod:`subagents.context.aging`); small results keep the ``keep_recent_results``
    newest."""
    offload_target_fraction: float = Field(default=0.6, gt=0, le=1)
    """Over-budget offloading goes on, oldest result first, until the context is under
    this share of the budget: the gap to the trigger makes it act in batches, so the
    cached prompt prefix it rewrites is rewritten rarely, not every turn."""
    old_result_min_tokens: int = Field(default=1_000, ge=0)
    """Older results smaller than this stay inline: their pointer would save little."""
    age_from_fraction: float = Field(default=0.3, gt=0, le=1)
    """Past this share of the budget, results outside the recent window
    (``keep_recent_results``, ``keep_recent_tokens``) of at least
    ``old_result_min_tokens`` become brief pointers (size and path); an offload's
    preview is dropped once it is outside the window at any size
    (:mod:`subagents.context.aging`)."""
    age_fraction: float = Field(default=0.5, gt=0, le=1)
    """Aging acts only when it frees at least this share of what the rewrite sends to
    the prompt cache again (the tail from the first rewritten block to the end), so a
    page leaving the recent window ages at once and small results in batches; 1
    switches aging off. Half, not less: a rewritten tail is billed as a cache write
    (1.25x an input token) where it was a cache read (0.1x)."""

    clip_fraction: float = Field(default=0.85, gt=0, le=1)
    """Past this share of the budget, old write/edit inputs become pointers (never
    later than the compaction trigger: a larger value acts at the trigger)."""
    clip_tools: list[str] = Field(default_factory=lambda: ["write_file", "edit_file"])
    """Tools whose inputs are file contents already on disk once the call succeeded."""
    clip_min_chars: int = Field(default=2_000, ge=0)
    """Only tool inputs with more characters than this are clipped."""
    keep_recent_writes: int = Field(default=2, ge=0)
    """The most recent write/edit calls keep their inputs."""

    compact_fraction: float = Field(default=0.9, gt=0, le=1)
    """Compaction trigger as a share of the budget; over-budget offload acts first."""
    compaction_instructions: str | None = None
    """A job's own compaction prompt; replaces ours entirely when set."""
    summary_max_tokens: int = Field(default=4_000, ge=256)
    """Output limit of the summary call."""
    transcript_result_chars: int = Field(default=4_000, ge=200)
    """Tool results are cut to this many characters in the text the summarizer reads
    (the full transcript is saved on disk and referenced in the summary)."""
    reread_files: int = Field(default=5, ge=0)
    """After compaction, up to this many most recently modified files are re-read."""
    reread_file_tokens: int = Field(default=5_000, ge=0)
    """A re-read file over this many tokens comes back as its path only."""
    reread_total_tokens: int = Field(default=25_000, ge=0)
    """All re-read files together stay under this (and under 30% of the trigger)."""

    todos: bool | None = None
    """Offer ``write_todos`` and recite the list; None means the member kind's default."""
    recite_every: int = Field(default=5, ge=1)
    """Recite an unchanged, non-empty todo list every this many turns."""

    memory_max_lines: int = Field(default=200, ge=1)
    """Memory loaded at start is cut after this many lines..."""
    memory_max_bytes: int = Field(default=25_600, ge=256)
    """...or this many bytes, whichever comes first."""
    memory_file_max_bytes: int = Field(default=100_000, ge=1_024)
    """The memory tool refuses to write one file larger than this."""

    box_dir: str = "/tmp/fleet"
    """Where offloads, transcripts and the memory copy live in the box: outside
    /workspace, so they never show up in a coding member's patch or file listing."""
    server_side: Literal["compact", "clear_tool_uses"] | None = None
    """Also ask the API for server-side context management (passthrough)."""
