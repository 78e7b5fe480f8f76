"""Prompt tokens a coding member's tools cost per model call with many MCP tools:
listed in full vs deferred behind tool_search (subagents/tools/tool_search.py).

The tools are the example server's (examples/mcp/echo_server.py with --extra-tools),
turned into the member's tools by the same classes a run uses; tokens are counted the
way the fake Messages API bills a request's tools (characters / 4 of each definition's
compact JSON, subagents/fake_api/usage.py). Run: .venv/bin/python bench/mcp_tools.py
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import sys
from pathlib import Path

# bench/sandbox.py would shadow the sandbox package when run as a script from bench/.
sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != os.path.dirname(__file__)]

from mcp import types  # noqa: E402

from subagents.fake_api.usage import estimate_tokens  # noqa: E402
from subagents.kinds import get_kind  # noqa: E402
from subagents.tools.mcp import McpServer, McpServerSpec, McpTool  # noqa: E402
from subagents.tools.registry import ToolRegistry  # noqa: E402
from subagents.tools.tool_search import ToolSearch, ToolView  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent


def server_tools(n: int) -> list[types.Tool]:
    spec = importlib.util.spec_from_file_location("echo", ROOT / "examples/mcp/echo_server.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return [
        types.Tool(name=t["name"], description=t["description"], input_schema=t["inputSchema"])
        for t in module.tools(n - 1, False)
    ]


def tokens(definitions: list[dict]) -> int:
    return sum(estimate_tokens(d) for d in definitions)


def measure(n: int) -> dict[str, int]:
    kind = get_kind("coding")
    server = McpServer(McpServerSpec(name="inventory", command="true"), None, None)
    mcp_tools = [McpTool(server, t) for t in server_tools(n)]
    builtin = tokens([t.definition() for t in kind.tools(kind.settings())])
    registry = ToolRegistry([*kind.tools(kind.settings()), *mcp_tools])
    full = tokens(registry.definitions())
    view = ToolView(registry, list(mcp_tools))
    if view.deferred:
        registry.add(ToolSearch(view))
    deferred = tokens(view.definitions())
    view.loaded.append(mcp_tools[-1].name)
    one_loaded = tokens(view.definitions())
    return {
        "mcp_tools": n,
        "builtin_only": builtin,
        "full": full,
        "deferred": deferred,
        "deferred_plus_one_loaded": one_loaded,
        "is_deferred": int(bool(view.deferred)),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--counts", default="5,10,11,50,200")
    args = parser.parse_args()
    rows = [measure(int(n)) for n in args.counts.split(",")]
    print(json.dumps(rows, indent=1))
    print(
        f"{'MCP tools':>9} {'deferred?':>9} {'full':>7} {'deferred':>9} {'+1 loaded':>9} {'saved':>6}"
    )
    for r in rows:
        saved = 1 - r["deferred"] / r["full"]
        print(
            f"{r['mcp_tools']:>9} {'yes' if r['is_deferred'] else 'no':>9} {r['full']:>7} "
            f"{r['deferred']:>9} {r['deferred_plus_one_loaded']:>9} {saved:>6.0%}"
        )


if __name__ == "__main__":
    main()
