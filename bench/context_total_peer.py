"""The peer on ``bench/context_total.py``'s workload: one Deep Agents agent reads the pages.

Not run with the project's interpreter and never part of its lock: run by
``bench/context_total.py --peer /tmp/peer-venv/bin/python`` with a throwaway virtualenv
that has the peer (``python3 -m venv /tmp/peer-venv && /tmp/peer-venv/bin/pip install
deepagents==0.7.32``). It talks to the same fake Messages API (``ANTHROPIC_BASE_URL``,
inherited), whose model answers the same plan; the server counts what it receives.
The agent is the peer's default (``create_deep_agent`` with its own middleware: todos,
files, summarization, large-result eviction), given the same ``visit`` tool. Prints
the agent's final text (the needle's outcome).
"""

from __future__ import annotations

import argparse
import os

LINE = "0123456789 abcdefghij klmnopqrst uvwxyz ABCDEFGHIJ KLMNOPQRST UVWXYZ 0123456789\n"
"""The same page lines as ``bench/context.py``'s (80 characters, 20 tokens)."""


def visit(page: int, tokens: int, nonce: str) -> str:
    """Read one page."""
    half = LINE * max(1, tokens // 40)
    return f"page {page}\n{half}fact of page {page}: the key is K{page}-{nonce}\n{half}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True)
    parser.add_argument("--task", required=True)
    args = parser.parse_args()
    # The peer's packages are there only in the peer's virtualenv (``--help`` runs anywhere).
    from deepagents import create_deep_agent
    from langchain_anthropic import ChatAnthropic
    from langchain_core.tools import tool

    model = ChatAnthropic(
        model_name=args.model,
        base_url=os.environ["ANTHROPIC_BASE_URL"],
        api_key=os.environ["ANTHROPIC_API_KEY"],
        max_tokens=4_096,
        timeout=600,
        stop=None,
    )
    agent = create_deep_agent(model=model, tools=[tool(visit)], system_prompt="You read pages.")
    state = agent.invoke(
        {"messages": [{"role": "user", "content": args.task}]},
        config={"recursion_limit": 1_000},
    )
    print(state["messages"][-1].text)


if __name__ == "__main__":
    main()
