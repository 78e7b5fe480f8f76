"""MCP servers of a member, through the real CLI: the stdio server of examples/mcp/ runs
inside the member's box and a scripted model (the real ``anthropic`` client against the
fake Messages API) calls its tools; a server that crashes mid-run, one that never
starts, a URL server off the allowlist, and deferred schemas loaded by tool_search."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from scripted_calls import tool_results

from coordinator.cli import main
from coordinator.rundir.runs import RunDir
from subagents.fake_api import tool_use
from subagents.trace import read_trace

EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "mcp"
SUBMIT = tool_use("submit_result", {"summary": "done", "tests_run": [], "notes": []})


def _job(tmp_path: Path, command: str, extra: str = "", files: Path = EXAMPLE) -> Path:
    text = f"""
name = "mcp"
output_dir = "{tmp_path / "runs"}"
[model]
name = "claude-sonnet-5"
[fanout]
retry = {{ attempts = 1 }}
[[members]]
id = "coder"
kind = "coding"
task = "Use the echo server."
limits = {{ max_turns = 8, deadline_s = 120 }}
[[members.mcp]]
name = "echo"
command = "{command}"
files = "{files}"
{extra}
"""
    path = tmp_path / "job.toml"
    path.write_text(text)
    return path


def said(origin: str, text: str) -> str:
    """A server's text as the model gets it: in an untrusted block naming its origin."""
    return f'<untrusted_page_content url="mcp://{origin}">\n{text}\n</untrusted_page_content>'


def scripted(*calls: tuple[str, dict[str, Any]]) -> Any:
    def policy(body: dict[str, Any]) -> Any:
        step = len(tool_results(body))
        return tool_use(*calls[step]) if step < len(calls) else SUBMIT

    return policy


def _results(run: RunDir) -> list[tuple[str, bool, str]]:
    trace = list(read_trace(run.member_dir("coder") / "trace.jsonl"))
    names = {e.call_id: e.tool for e in trace if e.type == "tool_call"}
    return [(names[e.call_id], e.is_error, e.output) for e in trace if e.type == "tool_result"]


@pytest.mark.docker
def test_a_scripted_model_calls_a_tool_of_a_server_in_its_box(tmp_path, images, fake_api, cleanup):
    api = fake_api(
        scripted(
            ("mcp__echo__echo", {"text": "hello from the model"}),
            ("mcp__echo__read_resource", {"uri": "note://readme"}),
            ("shell", {"command": "ps -eo uid,args | grep [e]cho_server"}),
        )
    )
    cleanup.append(tmp_path / "runs")
    assert main(["run", str(_job(tmp_path, "python3 echo_server.py")), "--plain"]) == 0
    (run,) = RunDir.list(tmp_path / "runs")
    offered = {t["name"]: t for t in api.requests[0]["tools"]}
    assert offered["mcp__echo__echo"]["input_schema"]["required"] == ["text"]
    assert "note://readme" in offered["mcp__echo__read_resource"]["description"]
    results = _results(run)
    assert results[0] == ("mcp__echo__echo", False, said("echo/echo", "hello from the model"))
    assert "inside the member's box" in results[1][2]
    # The server is a process of the member's box, as its user, where files went.
    assert "python3 echo_server.py" in results[2][2] and "1000" in results[2][2]
    # The model read the answer in its next request.
    assert "hello from the model" in json.dumps(api.requests[1]["messages"][-1])


@pytest.mark.docker
def test_a_server_whose_files_are_one_file_runs_beside_it(tmp_path, images, fake_api, cleanup):
    fake_api(scripted(("mcp__echo__echo", {"text": "one file"})))
    cleanup.append(tmp_path / "runs")
    job = _job(tmp_path, "python3 echo_server.py", files=EXAMPLE / "echo_server.py")
    assert main(["run", str(job), "--plain"]) == 0
    (run,) = RunDir.list(tmp_path / "runs")
    assert _results(run)[0] == ("mcp__echo__echo", False, said("echo/echo", "one file"))


@pytest.mark.docker
def test_a_server_that_crashes_mid_run_is_an_error_result_not_a_crashed_member(
    tmp_path, images, fake_api, cleanup
):
    fake_api(
        scripted(
            ("mcp__echo__echo", {"text": "before"}),
            ("mcp__echo__crash", {}),
            ("mcp__echo__echo", {"text": "after"}),
        )
    )
    cleanup.append(tmp_path / "runs")
    job = _job(tmp_path, "python3 echo_server.py --with-crash", "timeout_s = 5")
    assert main(["run", str(job), "--plain"]) == 0
    (run,) = RunDir.list(tmp_path / "runs")
    assert run.outcome("coder").status == "ok"
    results = _results(run)
    assert results[0][1:] == (False, said("echo/echo", "before"))
    assert results[1][1] is True  # the call that killed it
    assert results[2][1] is True and "'echo' has stopped" in results[2][2]
    assert "crashing on request" in results[2][2]  # its stderr tail
    errors = [e for e in read_trace(run.member_dir("coder") / "trace.jsonl") if e.type == "error"]
    assert any(e.error == "McpError" and "echo" in e.message for e in errors)


@pytest.mark.docker
def test_a_server_that_does_not_start_fails_the_member_naming_it_and_its_stderr(
    tmp_path, images, fake_api, cleanup
):
    fake_api(scripted())
    cleanup.append(tmp_path / "runs")
    job = _job(tmp_path, "python3 no_such_server.py")
    assert main(["run", str(job), "--plain"]) == 1
    (run,) = RunDir.list(tmp_path / "runs")
    result = run.outcome("coder")
    assert result.status == "failed"
    assert "MCP server 'echo' (python3 no_such_server.py) did not start" in result.reason
    assert "No such file or directory" in result.reason


def test_a_url_server_off_the_egress_allowlist_is_refused(tmp_path, capsys):
    job = tmp_path / "job.toml"
    job.write_text(
        'name = "t"\n[[members]]\nkind = "coding"\ntask = "x"\n'
        '[[members.mcp]]\nname = "remote"\nurl = "https://mcp.example.com/mcp"\n'
    )
    assert main(["run", str(job), "--output-dir", str(tmp_path / "runs")]) == 2
    err = capsys.readouterr().err
    assert "members[0].mcp[0].url" in err and "mcp.example.com:443 is not in egress.allow" in err
    assert not (tmp_path / "runs").exists()


@pytest.mark.docker
def test_many_tools_are_deferred_and_loaded_through_tool_search(
    tmp_path, images, fake_api, cleanup
):
    api = fake_api(
        scripted(
            ("tool_search", {"query": "mcp__echo__tool_7"}),
            ("mcp__echo__tool_7", {"id": "r1", "field": "owner"}),
        )
    )
    cleanup.append(tmp_path / "runs")
    job = _job(tmp_path, "python3 echo_server.py --extra-tools 20")
    assert main(["run", str(job), "--plain"]) == 0
    (run,) = RunDir.list(tmp_path / "runs")
    first = {t["name"]: t for t in api.requests[0]["tools"]}
    assert "mcp__echo__tool_7" not in first and "mcp__echo__echo" not in first
    assert "- mcp__echo__tool_7: Look up record 7" in first["tool_search"]["description"]
    later = {t["name"] for t in api.requests[1]["tools"]}
    assert "mcp__echo__tool_7" in later and "mcp__echo__tool_8" not in later
    results = _results(run)
    assert results[0][0] == "tool_search" and '"required": [' in results[0][2]
    assert results[1] == (
        "mcp__echo__tool_7",
        False,
        said("echo/tool_7", "tool_7: record r1 owner = ok"),
    )


@pytest.mark.docker
def test_a_url_server_on_the_allowlist_is_reached_only_through_the_egress_proxy(
    tmp_path, images, fake_api, cleanup
):
    fake_api(scripted())
    cleanup.append(tmp_path / "runs")
    job = tmp_path / "job.toml"
    # The URL is the run's own corpus box (an offline browser member makes the run start
    # it): the proxy reaches it on the run network, nothing leaves the machine, and the
    # corpus answers no MCP.
    job.write_text(
        f'name = "t"\noutput_dir = "{tmp_path / "runs"}"\n[model]\nname = "claude-sonnet-5"\n'
        "[fanout]\nretry = { attempts = 1 }\n"
        '[[members]]\nid = "reader"\nkind = "browser"\nmodel = "offline"\ntask = "asyncio"\n'
        "limits = { max_turns = 3 }\n"
        '[[members]]\nid = "coder"\nkind = "coding"\ntask = "x"\n'
        '[[members.mcp]]\nname = "remote"\nurl = "http://corpus:8080/mcp"\n'
    )
    main(["run", str(job), "--plain"])
    (run,) = RunDir.list(tmp_path / "runs")
    assert run.outcome("coder").status == "failed"
    reason = run.outcome("coder").reason
    # The host-side client reached the corpus through the run's egress proxy (the host
    # has no route to the run network's names): the corpus's answer is the failure.
    assert "MCP server 'remote' (http://corpus:8080/mcp) did not start" in reason
    assert "through the run's egress proxy" in reason


@pytest.mark.docker
def test_a_url_server_answers_through_the_runs_egress_proxy_and_only_its_allowed_host(
    tmp_path, images, docker_client, run_id
):
    """The example server in HTTP mode in a service box of the run; the host-side client
    reaches it through a proxy allowing it, and is refused through one that does not."""
    import anyio

    from sandbox.docker.backend import DockerBackend
    from sandbox.spec import SandboxSpec
    from subagents.tools.base import ToolContext
    from subagents.tools.mcp import McpServerSpec, McpStartFailed, serve_servers
    from subagents.trace import TraceWriter

    async def serve(spec: McpServerSpec, call: bool) -> Any:
        stop = anyio.Event()
        async with anyio.create_task_group() as tg:
            tools = await tg.start(serve_servers, [spec], None, stop)
            try:
                if call and not isinstance(tools, McpStartFailed):
                    trace = TraceWriter(tmp_path / "t.jsonl", run=run_id, member="m")
                    ctx = ToolContext(sandbox=None, run_dir=tmp_path, trace=trace, member="m")
                    (echo,) = [t for t in tools if t.name == "mcp__web__echo"]
                    return await echo.run(echo.Input(text="through the proxy"), ctx)
                return tools
            finally:
                stop.set()

    async def main() -> tuple[Any, Any]:
        backend = DockerBackend(docker_client, images=images)
        source = (EXAMPLE / "echo_server.py").read_text()
        box = await backend.create(
            SandboxSpec(kind="service"),
            run=run_id,
            member="mcpweb",
            command=["python3", "-c", source, "--http", "8080"],
        )
        listening = "import socket; socket.create_connection(('127.0.0.1', 8080), 1)"
        for _ in range(50):
            if (await box.exec(["python3", "-c", listening], timeout=5)).ok:
                break
            await anyio.sleep(0.1)
        url = "http://mcpweb:8080/mcp"
        allowed = await backend.egress_proxy(run_id, ["mcpweb:8080"])
        answer = await serve(McpServerSpec(name="web", url=url, proxy=allowed), call=True)
        other = await backend.egress_proxy(run_id, ["elsewhere:8080"])
        refused = await serve(McpServerSpec(name="web", url=url, proxy=other), call=False)
        return answer, refused

    answer, refused = anyio.run(main)
    assert answer.text == said("web/echo", "through the proxy") and not answer.is_error
    assert isinstance(refused, McpStartFailed)
    assert "MCP server 'web' (http://mcpweb:8080/mcp) did not start" in str(refused)
    assert "through the run's egress proxy" in str(refused)
