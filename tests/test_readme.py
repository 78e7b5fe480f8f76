"""The README and docs/ say only what works: their job files validate with the real
parser, every ``fleet`` command and flag they show exists in the CLI, the quick-start
commands are the Makefile's, and the defaults they quote are the code's.

Why parse the prose rather than keep examples in separate files: a newcomer copies
from the page, so the page is what must stay right.
"""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path
from typing import Any

import pytest

from coordinator.cli import build_parser
from coordinator.cli.check import plan as check_plan
from coordinator.job.jobfile import load_job

ROOT = Path(__file__).resolve().parent.parent
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
FENCE = re.compile(r"^```(\w*)\n(.*?)^```", re.M | re.S)
INLINE = re.compile(r"`([^`\n]+)`")


def _toml_blocks() -> list[tuple[Path, int, str]]:
    found = []
    for doc in DOCS:
        for i, m in enumerate(FENCE.finditer(doc.read_text(encoding="utf-8"))):
            if m.group(1) == "toml":
                found.append((doc, i, m.group(2)))
    return found


def _snippets(text: str) -> list[str]:
    """Command-like text: indented code lines, fenced non-TOML lines, inline spans."""
    out: list[str] = []
    for m in FENCE.finditer(text):
        if m.group(1) != "toml":
            out += m.group(2).splitlines()
    prose = FENCE.sub("", text)
    out += [line for line in prose.splitlines() if line.startswith("    ")]
    out += INLINE.findall(prose)
    return out


def _subcommands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


def _options(parser: argparse.ArgumentParser) -> set[str]:
    return {s for a in parser._actions for s in a.option_strings}


def _fleet_uses() -> list[tuple[str, str]]:
    """(document name, command text) for each ``fleet ...`` a document shows."""
    uses = []
    for doc in DOCS:
        for snippet in _snippets(doc.read_text(encoding="utf-8")):
            snippet = snippet.split(" #", 1)[0]  # a shell comment is prose
            for m in re.finditer(r"(?:^|[\s/(])fleet\s+(.*?)(?=(?:\s[\w/.]*fleet\s)|$)", snippet):
                uses.append((doc.name, m.group(1)))
    return uses


@pytest.mark.parametrize(
    "doc,index,text",
    _toml_blocks(),
    ids=lambda v: v.name if isinstance(v, Path) else (str(v) if isinstance(v, int) else None),
)
def test_job_file_examples_validate(tmp_path: Path, doc: Path, index: int, text: str) -> None:
    # Place the file where the document says it lives (README: the repository root,
    # docs/*.md: docs/), with examples/ beside it, so relative repo paths resolve.
    (tmp_path / "examples").symlink_to(ROOT / "examples", target_is_directory=True)
    where = tmp_path / doc.parent.relative_to(ROOT)
    where.mkdir(parents=True, exist_ok=True)
    path = where / f"example-{index}.toml"
    path.write_text(text, encoding="utf-8")
    job, _ = load_job(path)  # raises JobError, naming the field, if the page is wrong
    assert job.member_count >= 1
    # And `fleet check` takes it as the page shows it (the model names too).
    plan = check_plan(job)
    assert plan["valid"] and not any(m.get("model_problem") for m in plan["members"])


def test_the_readme_has_a_job_file_example() -> None:
    assert any(doc.name == "README.md" for doc, _, _ in _toml_blocks())


def test_every_fleet_command_and_flag_shown_exists() -> None:
    parser = build_parser()
    commands = _subcommands(parser)
    uses = _fleet_uses()
    assert len(uses) > 20, uses  # the extraction itself works
    problems = []
    for doc, text in uses:
        words = text.split()
        if not words or not re.fullmatch(r"[a-z]+", words[0]):
            continue  # "fleet's", "fleet-base", prose
        sub = commands.get(words[0])
        if sub is None:
            problems.append(f"{doc}: 'fleet {text}': no command {words[0]!r}")
            continue
        name, rest = words[0], words[1:]
        # Down the subcommands as deep as the text names them (fleet sandbox prepared gc).
        while (nested := _subcommands(sub)) and rest and re.fullmatch(r"[a-z]+", rest[0]):
            if rest[0] not in nested:
                problems.append(f"{doc}: 'fleet {text}': no 'fleet {name} {rest[0]}'")
                break
            name, sub, rest = f"{name} {rest[0]}", nested[rest[0]], rest[1:]
        known = _options(sub)
        for flag in re.findall(r"(?<![\w-])--[a-z][a-z0-9-]*", text):
            if flag not in known:
                problems.append(f"{doc}: 'fleet {text}': 'fleet {name}' has no {flag}")
    assert not problems, "\n".join(problems)


def test_fake_api_flags_shown_exist(capsys: pytest.CaptureFixture[str]) -> None:
    from subagents.fake_api.__main__ import main

    with pytest.raises(SystemExit):
        main(["--help"])
    help_text = capsys.readouterr().out
    readme = (ROOT / "docs" / "models.md").read_text(encoding="utf-8")
    shown = re.findall(r"python -m subagents\.fake_api(.*)", readme)
    assert shown
    for line in shown:
        for flag in re.findall(r"--[a-z-]+", line):
            assert flag in help_text, f"python -m subagents.fake_api has no {flag}"


def test_quick_start_commands_are_the_makefiles() -> None:
    makefile = (ROOT / "Makefile").read_text(encoding="utf-8")
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    quick = readme.split("## Quick start", 1)[1].split("\n## ", 1)[0]
    for target in ("demo", "test"):
        assert f"    make {target} " in quick
        assert re.search(rf"^{target}:", makefile, re.M), f"no '{target}' target"
    question = re.search(r"^QUESTION \?= (.+)$", makefile, re.M).group(1)
    assert f'fleet research "{question}" --members 3' in quick
    assert '$(BIN)/fleet research "$(QUESTION)" --members 3' in makefile


def test_quoted_defaults_are_the_codes() -> None:
    from sandbox.spec import SandboxSpec
    from subagents.context.config import ContextConfig

    readme = " ".join(" ".join(d.read_text(encoding="utf-8") for d in DOCS).split())
    c = ContextConfig()

    def pct(x: float) -> str:
        return f"{round(x * 100)}%"

    expected = [
        f"the smaller of {pct(c.budget_window_fraction)} of the model's window and "
        f"{c.budget_cap_tokens:,} tokens",
        f"| {c.offload_result_tokens:,} tokens |",
        f"a {c.preview_lines}-line preview",
        f"the {c.keep_recent_writes} most recent are kept | {pct(c.clip_fraction)} |",
        f"(the {c.keep_recent_results} most recent stay) | trigger {pct(c.compact_fraction)}, "
        f"down to {pct(c.offload_target_fraction)} |",
        f"up to {c.reread_files} recently modified files are re-read "
        f"({c.reread_file_tokens:,} tokens each, {c.reread_total_tokens:,} in all)",
        f"capped at {c.memory_max_lines} lines or {c.memory_max_bytes // 1024} KB",
        f"(one file at most {c.memory_file_max_bytes // 1000} KB)",
    ]
    s = SandboxSpec()
    assert (s.memory, s.pids, s.cpus, s.tmpfs_size, s.workspace_size, s.ttl_s) == (
        "1g",
        256,
        1.0,
        "256m",
        "1g",
        3600.0,
    ), "the security model page quotes these defaults: update it with them"
    expected += [
        "limits of 256 processes, 1 GB memory",
        "and 1 CPU by default",
        "tmpfs `/tmp` (256 MB) and `/workspace` (1 GB)",
        "a TTL (1 hour)",
    ]
    missing = [e for e in expected if e not in readme]
    assert not missing, missing


def test_every_command_and_flag_of_the_cli_is_in_the_readme_reference() -> None:
    reference = (ROOT / "docs" / "cli.md").read_text(encoding="utf-8")
    missing = []
    for name, sub in _subcommands(build_parser()).items():
        nested = _subcommands(sub)
        pairs = [(f"{name} {k}", p) for k, p in nested.items()] or [(name, sub)]
        for full, parser in pairs:
            if f"fleet {full}" not in reference:
                missing.append(f"fleet {full}")
            for flag in _options(parser) - {"-h", "--help"}:
                if flag.startswith("--") and flag not in reference:
                    missing.append(f"fleet {full} {flag}")
    assert not missing, "the README's Commands section does not mention: " + ", ".join(missing)


def test_no_inline_code_span_crosses_a_line_break() -> None:
    # The command checks above read inline spans line by line; a span broken across
    # lines would hide the command in it from them.
    for doc in DOCS:
        prose = FENCE.sub("", doc.read_text(encoding="utf-8"))
        for line in prose.splitlines():
            if line.startswith("    "):
                continue
            assert line.count("`") % 2 == 0, f"{doc.name}: a code span is cut at: {line!r}"


def _python_blocks(section: str) -> list[str]:
    text = (ROOT / "docs" / "api.md").read_text(encoding="utf-8")
    start = text.index(f"# {section}\n")
    end = text.index("\n## Reference\n", start)
    return [m.group(2) for m in FENCE.finditer(text[start:end]) if m.group(1) == "python"]


@pytest.mark.docker
def test_the_python_api_examples_run_as_written(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    images: dict[str, str],
    docker_client: Any,
    cleanup: list[Path],
) -> None:
    """The "Python API" section's code blocks, run in order in one namespace from a
    directory with examples/ in it, as a reader would paste them: a run, a stream
    broken out of (the run ends interrupted) and resumed, one member cancelled, two runs
    on boxes kept ready between them."""
    monkeypatch.delenv("ANTHROPIC_API_KEY", raising=False)
    (tmp_path / "examples").symlink_to(ROOT / "examples", target_is_directory=True)
    monkeypatch.chdir(tmp_path)
    cleanup.append(tmp_path / "runs")
    blocks = _python_blocks("Python API")
    assert len(blocks) == 4
    names: dict[str, Any] = {}
    for block in blocks:
        exec(compile(block, "docs/api.md (Python API)", "exec"), names)
    assert (names["result"].status, names["result"].outcomes["coder"].status) == ("succeeded", "ok")
    assert names["status"] == "succeeded"
    summary = names["summary"]
    assert summary.status == "failed" and "the caller cancelled" in summary.outcomes["coder"].reason
    lives = {
        path.name: [json.loads(line)["event"] for line in open(path / "journal.jsonl")]
        for path in (tmp_path / "runs").iterdir()
        if path.is_dir() and (path / "journal.jsonl").exists()
    }
    streamed = [e for e in lives.values() if "run_interrupted" in e]
    assert names["statuses"] == ["succeeded", "succeeded"]
    assert len(lives) == 5 and len(streamed) == 1
    assert streamed[0].index("run_interrupted") < streamed[0].index("run_finished")


def test_every_coordinator_path_the_docs_name_exists_and_the_layout_lists_every_room() -> None:
    """A module moved without its docs would send a newcomer to a file that is not
    there; a room missing from "## Layout" would leave it off the map."""
    docs = [*DOCS, ROOT / "bench" / "README.md"]
    named = {
        (doc.relative_to(ROOT), path)
        for doc in docs
        for path in re.findall(r"coordinator/[\w/]+\.py", doc.read_text(encoding="utf-8"))
    }
    assert len(named) > 5, "the path reader found nothing: it is broken"
    missing = sorted(f"{doc}: {path}" for doc, path in named if not (ROOT / path).is_file())
    assert missing == [], "paths in the docs that are not in the tree:\n" + "\n".join(missing)
    layout = (ROOT / "docs" / "layout.md").read_text(encoding="utf-8")
    rooms = {p.name for p in (ROOT / "coordinator").iterdir() if (p / "__init__.py").is_file()}
    unlisted = sorted(room for room in rooms if f"`{room}/`" not in layout)
    assert unlisted == [], f"rooms docs/layout.md does not list: {unlisted}"
