"""A small MCP server on stdio, Python's standard library only: one tool, one resource.

Why the standard library: inside a Fleet box there is no package index, so a server
must bring nothing the image lacks; python3 is in the coding and browser images, and
this file is all the server there is (the job copies it in with ``files``). The
protocol is JSON-RPC 2.0, one message per line on stdin/stdout: ``initialize``,
``tools/list``, ``tools/call``, ``resources/list``, ``resources/read`` and ``ping``.

``--http PORT`` serves the same over streamable HTTP instead (POST ``/mcp``, one JSON
answer per request), to try a ``url`` server.

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


def answer(msg: dict, opts: argparse.Namespace) -> dict | None:
    """The JSON-RPC answer to one message (None for a notification)."""
    if "id" not in msg or "method" not in msg:
        return None  # a notification, or a response to nothing we asked
    try:
        return {"jsonrpc": "2.0", "id": msg["id"], "result": handle(msg, opts)}
    except NotImplementedError as exc:
        return {"jsonrpc": "2.0", "id": msg["id"], "error": {"code": -32601, "message": str(exc)}}
    except Exception as exc:
        return {"jsonrpc": "2.0", "id": msg["id"], "error": {"code": -32603, "message": str(exc)}}


def serve_stdio(opts: argparse.Namespace) -> None:
    for line in sys.stdin:
        if line.strip():
            reply = answer(json.loads(line), opts)
            if reply is not None:
                sys.stdout.write(json.dumps(reply) + "\n")
                sys.stdout.flush()


def serve_http(opts: argparse.Namespace) -> None:
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            if self.path.rstrip("/") != "/mcp":
                self.send_error(404)
                return
            body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            reply = answer(json.loads(body), opts)
            if reply is None:
                self.send_response(202)
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
            data = json.dumps(reply).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self) -> None:  # no server-to-client stream
            self.send_error(405)

        do_DELETE = do_GET

        def log_message(self, format: str, *args: object) -> None:
            pass

    ThreadingHTTPServer(("0.0.0.0", opts.http), Handler).serve_forever()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--extra-tools", type=int, default=0)
    parser.add_argument("--with-crash", action="store_true")
    parser.add_argument("--http", type=int, metavar="PORT", help="serve over HTTP on PORT")
    opts = parser.parse_args()
    if opts.http:
        serve_http(opts)
    else:
        serve_stdio(opts)


if __name__ == "__main__":
    main()
