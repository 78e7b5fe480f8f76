"""CPU of one model call as the coordinator pays it: the SDK's request path against a plain HTTP client.

    .venv/bin/python bench/model_call.py [--turns 100] [--calls 90] [--rounds 3]

One :class:`~subagents.model.claude.AnthropicModel` asks the fake Messages API (in
*another process*, so its work is not counted) ``--calls`` times; the conversation
starts at ``--turns`` turns (a ``shell`` call and its 1 KB result each) and grows by
one turn a call, as a member's does. The figure is this process's CPU
(``process_time``: every thread) per call, median over the calls after the first five
(connection and caches warm). Three ways, alternating round by round:

- ``sdk``: ``AnthropicModel.complete`` as Fleet runs it (the body built and encoded
  by :mod:`subagents.model.wire`, sent by the ``anthropic`` client's ``post`` on its
  aiohttp transport, the stream read by the client's own SSE decoder).
- ``post``: the same ``complete`` with the request sent by the client's ``post``
  (what Fleet did before :mod:`subagents.model.sdk_request` prepared it once per
  client; a client with middleware or credential auth still does).
- ``aiohttp``: the same ``complete`` - same parameters, same body bytes, same event
  gathering, same rate governor - with only the request sent by one plain
  ``aiohttp.ClientSession`` and the SSE lines split by hand.

``post - sdk`` is what preparing the request once saves a call; ``sdk - aiohttp`` is
what the SDK's request path still costs; the ``aiohttp`` column is
a floor for any client that speaks HTTP from Python on this machine. Network: only
127.0.0.1.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import anyio

# The script's own directory holds bench/sandbox.py, which would shadow the sandbox package.
sys.path[0] = str(Path(__file__).resolve().parent.parent)

from subagents.model.base import ModelRequest  # noqa: E402
from subagents.model.claude import _STREAM_HEADERS, AnthropicModel, _as_message  # noqa: E402
from subagents.model.message import Message  # noqa: E402
from subagents.model.wire import StreamedMessage  # noqa: E402

SHELL = {
    "name": "shell",
    "description": "Run a command in the box.",
    "input_schema": {
        "type": "object",
        "properties": {"command": {"type": "string"}},
        "required": ["command"],
    },
}


SYSTEM = "You are a coder. " * 50


def serve() -> None:
    """The fake API, answering every call with a ``shell`` tool call; stops at EOF."""
    from subagents.fake_api import FakeMessagesAPI, tool_use

    api = FakeMessagesAPI(lambda body: tool_use("shell", {"command": "ls /"})).start()
    api.record = lambda entry: None  # type: ignore[method-assign]  # keep no bodies
    print(api.url, flush=True)
    sys.stdin.read()
    api.stop()


def turn(t: int) -> list[dict[str, Any]]:
    call: dict[str, Any] = {"type": "tool_use", "id": f"toolu_{t:06d}", "name": "shell"}
    call["input"] = {"command": f"ls -la /workspace/dir{t}"}
    result = {"type": "tool_result", "tool_use_id": call["id"], "content": "x" * 1000}
    return [{"role": "assistant", "content": [call]}, {"role": "user", "content": [result]}]


class PlainAiohttp(AnthropicModel):
    """``complete`` with the request sent by a plain aiohttp session (the floor)."""

    session: Any = None

    async def _stream_once(self, params: dict[str, Any], body: bytes | None) -> tuple[Message, Any]:
        import aiohttp

        assert body is not None
        if self.session is None:
            self.session = aiohttp.ClientSession()
        headers = {
            "content-type": "application/json",
            "x-api-key": "bench",
            "anthropic-version": "2023-06-01",
            **_STREAM_HEADERS,
        }
        gathered = StreamedMessage()
        url = str(self.client.base_url.join("v1/messages"))
        async with self.session.post(url, data=body, headers=headers) as response:
            assert response.status == 200, response.status
            async for line in response.content:
                if line.startswith(b"data: "):
                    gathered.add(json.loads(line[6:]))
            return _as_message(gathered.final()), response.headers

    async def aclose(self) -> None:
        if self.session is not None:
            await self.session.close()
        await super().aclose()


async def per_call_ms(kind: str, url: str, turns: int, calls: int) -> float:
    cls = PlainAiohttp if kind == "aiohttp" else AnthropicModel
    model = cls("claude-sonnet-5", api_key="bench", base_url=url)
    if kind == "post":
        model._direct_request = None  # the fallback: every call through client.post
    messages: list[dict[str, Any]] = [{"role": "user", "content": "List the directories."}]
    for t in range(turns):
        messages += turn(t)
    samples: list[float] = []
    try:
        for i in range(calls + 5):
            # As the loop builds it (conversation.py): the messages are its own, not
            # validated again.
            request = ModelRequest.model_construct(
                system=SYSTEM, messages=messages, tools=[SHELL], max_tokens=4096,
                temperature=None, tool_choice=None, context_management=None,
            )  # fmt: skip
            started = time.process_time()
            response = await model.complete(request)
            samples.append((time.process_time() - started) * 1_000)
            assert response.message.content[0].type == "tool_use"
            messages = [*messages, *turn(turns + i)]
    finally:
        await model.aclose()
    return statistics.median(samples[5:])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--turns", type=int, default=100, help="turns of history at the first call")
    ap.add_argument("--calls", type=int, default=90)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.serve:
        serve()
        return
    server = subprocess.Popen(
        [sys.executable, __file__, "--serve"], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
        text=True,
    )  # fmt: skip
    try:
        assert server.stdout is not None
        url = server.stdout.readline().strip()
        print("load average:", " ".join(f"{x:.2f}" for x in os.getloadavg()))
        print(
            f"\nCPU per model call (ms, median of {args.calls}), {args.turns}+ turns of history\n"
        )
        print("| round | sdk | post | aiohttp | post - sdk | sdk - aiohttp |")
        print("|---:|---:|---:|---:|---:|---:|")
        for r in range(1, args.rounds + 1):
            sdk = anyio.run(per_call_ms, "sdk", url, args.turns, args.calls)
            post = anyio.run(per_call_ms, "post", url, args.turns, args.calls)
            plain = anyio.run(per_call_ms, "aiohttp", url, args.turns, args.calls)
            print(
                f"| {r} | {sdk:.2f} | {post:.2f} | {plain:.2f} | {post - sdk:.2f} | "
                f"{sdk - plain:.2f} |",
                flush=True,
            )
        print("\nload average after:", " ".join(f"{x:.2f}" for x in os.getloadavg()))
    finally:
        if server.stdin is not None:
            server.stdin.close()
        server.wait(timeout=10)


if __name__ == "__main__":
    main()
