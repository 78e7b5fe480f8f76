"""A small MCP server on stdio, Python's standard library only: one tool, one resource.

Why the standard library: inside a Fleet box there is no package index, so a server
must bring nothing the image lacks; python3 is in the coding and browser images, and
this file is all the server there is (the job copies it in with ``files``). The
protocol is JSON-RPC 2.0, one message per line on stdin/stdout: ``initialize``,
``tools/list``, ``tools/call``, ``resources/list``, ``resources/read`` and ``ping``.

Tools: ``echo(text)`` answers with the text; ``--extra-tools N`` adds ``tool_1`` ...
``tool_N`` (each with a few typed arguments, to try deferred schemas); ``--with-crash``
adds ``crash``, which ends the server mid-call (to see what a member does when its
server dies). Resource: ``note://readme``, a short text.
"""

from __future__ import annotations

import argparse
import json
import sys

README = "This resource comes from the echo server running inside the member's box."


def tools(extra: int, crash: bool) -> list[dict]:
    out = [
        {
            "name": "echo",
            "description": "Answer with the text given.",
            "inputSchema": {
                "type": "object",
                "properties": {"text": {"type": "string", "description": "what to echo"}},
                "required": ["text"],
            },
        }
    ]
    for i in range(1, extra + 1):
        out.append(
            {
                "name": f"tool_{i}",
                "description": f"Look up record {i} of the inventory by id and field.",
                "inputSchema": {
                    "type": "object",
                    "properties": {
                        "id": {"type": "string", "description": "the record's id"},
                        "field": {
                            "type": "string",
                            "enum": ["name", "owner", "size", "updated"],
                            "description": "which field to return",
                        },
                        "limit": {"type": "integer", "minimum": 1, "maximum": 100},
                    },
                    "required": ["id", "field"],
                },
            }
        )
    if crash:
        out.append(
            {
                "name": "crash",
                "description": "End the server at once (for trying failure handling).",
                "inputSchema": {"type": "object", "properties": {}},
            }
        )
    return out


def handle(msg: dict, opts: argparse.Namespace) -> dict | None:
    method, params = msg.get("method"), msg.get("params") or {}
    if method == "initialize":
        return {
            "protocolVersion": params.get("protocolVersion", "2025-06-18"),
            "capabilities": {"tools": {}, "resources": {}},
            "serverInfo": {"name": "echo", "version": "1.0"},
        }
    if method == "ping":
        return {}
    if method == "tools/list":
        return {"tools": tools(opts.extra_tools, opts.with_crash)}
    if method == "tools/call":
        name, args = params.get("name"), params.get("arguments") or {}
        if name == "echo":
            return {"content": [{"type": "text", "text": str(args.get("text", ""))}]}
        if name == "crash" and opts.with_crash:
            sys.stderr.write("echo server: crashing on request\n")
            sys.stderr.flush()
            sys.exit(3)
        if name and name.startswith("tool_"):
            text = f"{name}: record {args.get('id')} {args.get('field')} = ok"
            return {"content": [{"type": "text", "text": text}]}
        return {"content": [{"type": "text", "text": f"no tool {name!r}"}], "isError": True}
    if method == "resources/list":
        return {"resources": [{"uri": "note://readme", "name": "readme", "mimeType": "text/plain"}]}
    if method == "resources/read":
        if params.get("uri") != "note://readme":
            raise LookupError(f"no resource {params.get('uri')!r}")
        return {"contents": [{"uri": "note://readme", "mimeType": "text/plain", "text": README}]}
    raise NotImplementedError(f"method {method!r} is not supported")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--extra-tools", type=int, default=0)
    parser.add_argument("--with-crash", action="store_true")
    opts = parser.parse_args()
    for line in sys.stdin:
        if not line.strip():
            continue
        msg = json.loads(line)
        if "id" not in msg or "method" not in msg:
            continue  # a notification, or a response to nothing we asked
        try:
            reply = {"jsonrpc": "2.0", "id": msg["id"], "result": handle(msg, opts)}
        except NotImplementedError as exc:
            reply = {
                "jsonrpc": "2.0",
                "id": msg["id"],
                "error": {"code": -32601, "message": str(exc)},
            }
        except Exception as exc:
            reply = {
                "jsonrpc": "2.0",
                "id": msg["id"],
                "error": {"code": -32603, "message": str(exc)},
            }
        sys.stdout.write(json.dumps(reply) + "\n")
        sys.stdout.flush()


if __name__ == "__main__":
    main()
