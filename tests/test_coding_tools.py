"""Coding tools and custom command tools in a real Docker box (fleet-coding image)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from loop_support import writer

from sandbox.docker.backend import DockerBackend
from sandbox.spec import SandboxSpec
from subagents.tools.base import ToolContext, ToolOutput
from subagents.tools.coding import coding_tools
from subagents.tools.registry import CustomToolSpec, ParamSpec, ToolRegistry, build_custom_tool
from subagents.tools.templates import TemplateError, compile_template

pytestmark = [pytest.mark.docker, pytest.mark.anyio]


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture
async def ctx(docker_client, images, run_id: str, tmp_path: Path) -> AsyncIterator[ToolContext]:
    backend = DockerBackend(docker_client, images=images)
    box = await backend.create(SandboxSpec(), run=run_id, member="coder")
    async with box:
        yield ToolContext(sandbox=box, run_dir=tmp_path, trace=writer(tmp_path), member="coder")


TEMPLATE = CustomToolSpec(
    name="count_words",
    description="Count the words of a text.",
    command="printf '%s' {text} | wc -w",
    parameters={"text": ParamSpec(description="The text.")},
)


@pytest.fixture
def tools() -> ToolRegistry:
    return ToolRegistry([*coding_tools(), build_custom_tool(TEMPLATE)])


async def call(tools: ToolRegistry, ctx: ToolContext, name: str, **args: object) -> ToolOutput:
    return await tools.call(name, args, ctx)


async def test_write_then_read_numbered_lines_with_offset_and_limit(tools, ctx) -> None:
    body = "".join(f"line {i}\n" for i in range(1, 31))
    wrote = await call(tools, ctx, "write_file", path="src/notes.txt", content=body)
    assert not wrote.is_error and wrote.files_written == ["/workspace/src/notes.txt"]
    out = await call(tools, ctx, "read_file", path="src/notes.txt", offset=10, limit=5)
    lines = out.text.splitlines()
    assert lines[:5] == [f"{n:>6}\tline {n}" for n in range(10, 15)]
    assert "lines 10-14 of 30" in lines[5] and "offset=15" in lines[5]
    past = await call(tools, ctx, "read_file", path="src/notes.txt", offset=99)
    assert past.is_error and "30 lines" in past.text


async def test_edit_file_refuses_missing_and_non_unique_matches(tools, ctx) -> None:
    await call(tools, ctx, "write_file", path="app.py", content="a = 1\nb = 1\nc = 2\n")
    missing = await call(tools, ctx, "edit_file", path="app.py", old_string="d = 1", new_string="x")
    assert missing.is_error and "not found" in missing.text and "0 matches" in missing.text
    twice = await call(tools, ctx, "edit_file", path="app.py", old_string="= 1", new_string="= 9")
    assert twice.is_error and "matches 2 places" in twice.text and "replace_all" in twice.text
    unchanged = await ctx.sandbox.read_file("/workspace/app.py")
    assert unchanged == b"a = 1\nb = 1\nc = 2\n"
    one = await call(tools, ctx, "edit_file", path="app.py", old_string="c = 2", new_string="c = 3")
    assert not one.is_error and "line 3" in one.text
    every = await call(
        tools, ctx, "edit_file", path="app.py", old_string="= 1", new_string="= 7", replace_all=True
    )
    assert not every.is_error and every.files_written == ["/workspace/app.py"]
    assert await ctx.sandbox.read_file("/workspace/app.py") == b"a = 7\nb = 7\nc = 3\n"
    nofile = await call(tools, ctx, "edit_file", path="nope.py", old_string="a", new_string="b")
    assert nofile.is_error and "no such file" in nofile.text


async def test_shell_reports_exit_code_and_keeps_partial_output_on_timeout(tools, ctx) -> None:
    failed = await call(tools, ctx, "shell", command="echo out; echo err >&2; exit 3")
    assert not failed.is_error  # a failing command is information for the model
    assert failed.text.startswith("exit code 3") and "out" in failed.text and "err" in failed.text
    slow = await call(tools, ctx, "shell", command="echo started; sleep 30", timeout_s=1)
    assert "timed out after 1 s" in slow.text and "started" in slow.text


async def test_glob_and_grep_find_files_and_lines(tools, ctx) -> None:
    await call(tools, ctx, "write_file", path="pkg/a.py", content="def foo():\n    return 1\n")
    await call(tools, ctx, "write_file", path="pkg/sub/b.py", content="x = foo()\n")
    await call(tools, ctx, "write_file", path="README.md", content="foo docs\n")
    found = await call(tools, ctx, "glob", pattern="**/*.py")
    assert sorted(found.text.splitlines()) == ["/workspace/pkg/a.py", "/workspace/pkg/sub/b.py"]
    hits = await call(tools, ctx, "grep", pattern=r"foo\(", glob="*.py")
    assert sorted(hits.text.splitlines()) == [
        "/workspace/pkg/a.py:1:def foo():",
        "/workspace/pkg/sub/b.py:1:x = foo()",
    ]
    none = await call(tools, ctx, "grep", pattern="nothing_here")
    assert not none.is_error and "no matches" in none.text
    bad = await call(tools, ctx, "grep", pattern="(unclosed")
    assert bad.is_error and "grep failed" in bad.text


async def test_paths_outside_the_box_roots_are_refused(tools, ctx) -> None:
    out = await call(tools, ctx, "read_file", path="/etc/passwd")
    assert out.is_error and "outside" in out.text
    up = await call(tools, ctx, "write_file", path="../../etc/x", content="x")
    assert up.is_error and "outside" in up.text


async def test_command_template_tool_quotes_arguments(tools, ctx) -> None:
    out = await call(tools, ctx, "count_words", text="a b; touch /workspace/pwned")
    assert not out.is_error and out.text.splitlines()[-2:] == ["stdout:", "4"]
    listing = await call(tools, ctx, "shell", command="ls /workspace")
    assert "pwned" not in listing.text
    missing = await call(tools, ctx, "count_words")
    assert missing.is_error and "- text: required argument missing; expected string" in missing.text
    schema = next(d for d in tools.definitions() if d["name"] == "count_words")["input_schema"]
    assert schema["required"] == ["text"]


def test_command_template_must_declare_its_placeholders() -> None:
    with pytest.raises(ValueError, match="does not declare"):
        CustomToolSpec(name="t", description="d", command="pytest {path}")


async def test_a_file_name_that_is_not_utf8_is_shown_escaped_and_usable_back(tools, ctx) -> None:
    made = await call(
        tools,
        ctx,
        "shell",
        command="printf 'caf\\n' > $'caf\\xe9.txt' && printf 'b\\n' > 'back\\slash.txt'",
    )
    assert made.text.startswith("exit code 0"), made.text
    found = await call(tools, ctx, "glob", pattern="*.txt")
    assert sorted(found.text.splitlines()) == [
        "/workspace/back\\\\slash.txt",
        "/workspace/caf\\xe9.txt",
    ]
    # Each name goes back into the tools as it was shown.
    read = await call(tools, ctx, "read_file", path="caf\\xe9.txt")
    assert not read.is_error and "caf" in read.text and "/workspace/caf\\xe9.txt" in read.text
    edit = await call(
        tools, ctx, "edit_file", path="back\\\\slash.txt", old_string="b", new_string="c"
    )
    assert not edit.is_error, edit.text
    assert await ctx.sandbox.read_file("/workspace/back\\slash.txt") == b"c\n"
    wrote = await call(tools, ctx, "write_file", path="new\\xff.txt", content="n\n")
    assert wrote.text.startswith("wrote /workspace/new\\xff.txt"), wrote.text
    listed = await call(tools, ctx, "shell", command="ls -b *.txt")
    assert "new\\377.txt" in listed.text and "caf\\351.txt" in listed.text
    hits = await call(tools, ctx, "grep", pattern="^(caf|n)$", context=1)
    assert sorted(hits.text.splitlines()) == [
        "--",
        "/workspace/caf\\xe9.txt:1:caf",
        "/workspace/new\\xff.txt:1:n",
    ]
    # A name that reaches text any other way (an error message) is escaped as well.
    gone = await call(tools, ctx, "read_file", path="/workspace/gone\\xfe")
    assert gone.is_error and "gone\\xfe" in gone.text
    for out in (found, read, edit, wrote, hits, gone):
        out.text.encode("utf-8")  # what the trace and the Messages API need


# Arguments a model could send to break out of a command template; each tries to
# create /tmp/pwn in the box.
PAYLOADS = [
    "$(touch /tmp/pwn)",
    "`touch /tmp/pwn`",
    "; touch /tmp/pwn",
    "&& touch /tmp/pwn",
    "|| touch /tmp/pwn",
    "| touch /tmp/pwn",
    "& touch /tmp/pwn",
    "x\ntouch /tmp/pwn",
    "x\r\ntouch /tmp/pwn",
    "'; touch /tmp/pwn; '",
    "'$(touch /tmp/pwn)'",
    '"; touch /tmp/pwn; "',
    '"$(touch /tmp/pwn)"',
    "'\"$(touch /tmp/pwn)\"'",
    "\\'; touch /tmp/pwn #",
    '\\"; touch /tmp/pwn #',
    "${IFS}touch${IFS}/tmp/pwn",
    "$(touch${IFS}/tmp/pwn)",
    "$((1+$(touch /tmp/pwn)))",
    "a[$(touch /tmp/pwn)]",
    ">(touch /tmp/pwn)",
    "<(touch /tmp/pwn)",
    "*",
    "/*",
    "~",
    "{a,b}",
    "$HOME",
    "a   b\tc",
    "\\",
    "",
    "-n",
    "--files0-from=/etc/passwd",
    "-e $(touch /tmp/pwn)",
    "x\x00; touch /tmp/pwn",
]
# The same tool in every quoting style; a style that would let quotes undo the
# argument's quoting is refused when the tool is defined, and its right spelling (which
# the refusal shows) is what runs.
STYLES = {
    "bare": "printf '%s\\n' {msg}",
    "double": "printf '%s\\n' \"{msg}\"",
    "single": "printf '%s\\n' '{msg}'",
    "inside double": "printf '%s\\n' \"<{msg}>\"",
    "inside single": "printf '%s\\n' '<{msg}>'",
}


def _template_tool(command: str, **param: object) -> CustomToolSpec:
    return CustomToolSpec(
        name="say",
        description="Print a message.",
        command=command,
        parameters={"msg": ParamSpec(**param)},  # type: ignore[arg-type]
    )


async def _pwned(ctx: ToolContext) -> bool:
    assert ctx.sandbox is not None
    return (await ctx.sandbox.exec(["test", "-e", "/tmp/pwn"])).exit_code == 0


@pytest.mark.parametrize("style", list(STYLES))
async def test_no_argument_escapes_a_command_template_in_any_quoting_style(ctx, style) -> None:
    command = STYLES[style]
    try:
        spec = _template_tool(command)
    except ValueError as exc:
        assert style != "bare" and "tool 'say': placeholder {msg} stands inside" in str(exc)
        with pytest.raises(TemplateError) as refused:
            compile_template("say", command)
        assert refused.value.fix is not None and repr(refused.value.fix) in str(exc)
        spec = _template_tool(refused.value.fix)  # the spelling the refusal shows
    tools = ToolRegistry([build_custom_tool(spec)])
    for payload in PAYLOADS:
        out = await call(tools, ctx, "say", msg=payload)
        assert not await _pwned(ctx), f"{style}: {payload!r} ran a command"
        if payload.startswith("-") or "\x00" in payload:
            assert out.is_error and "say was not run: argument 'msg'" in out.text, out.text
            continue
        assert not out.is_error, out.text
        printed = out.text.split("stdout:\n", 1)[1] if "stdout:\n" in out.text else ""
        wrapped = payload if style in ("bare", "double", "single") else f"<{payload}>"
        assert printed == wrapped.rstrip("\n"), (style, payload, out.text)


@pytest.mark.parametrize(
    ("command", "where"),
    [
        ("echo $(echo {msg})", "inside $(...) or backquotes"),
        ("echo `echo {msg}`", "inside $(...) or backquotes"),
        ("cat <(echo {msg})", "inside <(...) or >(...)"),
        ("cat <<EOF\n{msg}\nEOF", "inside a here-document"),
        ("echo $(( {msg} + 1 ))", "inside arithmetic"),
        ("[[ {msg} == x ]] && echo y", "inside [[ ]]"),
        ("echo ${x:-{msg}}", "is not a parameter name"),
        ("{msg} --version", "as the program to run"),
        ("eval echo {msg}", "is code that its command runs"),
        ("sh -c {msg}", "is code that its command runs"),
        ("bash -lc {msg} x", "is code that its command runs"),
        ("trap {msg} EXIT; true", "is code that its command runs"),
        ("echo {msg} $1", "reads the positional parameter '$1'"),
        ("echo x\\{msg}", "follows a backslash"),
        ("echo 'x", "is not a shell command line that can be read"),
    ],
)
def test_a_template_whose_placeholder_the_shell_would_read_again_is_refused(command, where):
    with pytest.raises(ValueError) as err:
        _template_tool(command)
    assert "tool 'say'" in str(err.value) and where in str(err.value), str(err.value)


async def test_an_argument_starting_with_a_dash_is_an_option_only_where_the_tool_says(
    ctx,
) -> None:
    plain = build_custom_tool(_template_tool("wc -l {msg}"))
    operand = build_custom_tool(
        CustomToolSpec(
            name="count",
            description="d",
            command="wc -l -- {msg}",
            parameters={"msg": ParamSpec()},
        )
    )
    options = build_custom_tool(
        CustomToolSpec(
            name="opts",
            description="d",
            command="ls {msg} /",
            parameters={"msg": ParamSpec(options=True)},
        )
    )
    tools = ToolRegistry([plain, operand, options])
    refused = await call(tools, ctx, "say", msg="--files0-from=/etc/passwd")
    assert refused.is_error and "starts with '-'" in refused.text and "root" not in refused.text
    as_name = await call(tools, ctx, "count", msg="--files0-from=/etc/passwd")
    assert as_name.is_error and "No such file" in as_name.text and "root" not in as_name.text
    chosen = await call(tools, ctx, "opts", msg="-d")
    assert not chosen.is_error and chosen.text.splitlines()[-1] == "/"
    negative = build_custom_tool(
        CustomToolSpec(
            name="head",
            description="d",
            command="seq 3 | head -n {n}",
            parameters={"n": ParamSpec(type="integer")},
        )
    )
    out = await call(ToolRegistry([negative]), ctx, "head", n=-1)
    assert not out.is_error and out.text.splitlines()[-2:] == ["1", "2"]
