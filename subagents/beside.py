"""Run a coroutine with a helper task beside it, and let the coroutine's error out as itself.

An anyio task group wraps whatever its body raises in an ``ExceptionGroup``; the
harness and the node classify what a member's run raised by its type
(``SandboxCrashed`` -> ``crashed``, ``ModelError`` -> ``failed``, ...), so a run that
needs a task beside it - its box starting (:func:`coordinator.nodes.node.run_attempt`), its
box's set-up (:meth:`subagents.loop.loop.AgentLoop.run`) - goes through :func:`beside`,
which raises the run's own exception. The side task reports its own failures (it
must not raise): it is the run that decides what they mean.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, TypeVar

import anyio

T = TypeVar("T")


def leaves(exc: BaseException) -> list[BaseException]:
    """The errors inside (nested) exception groups, which task groups wrap them in, in
    order; ``[exc]`` for an error that is not a group. The one place that unwraps them."""
    if isinstance(exc, BaseExceptionGroup):
        return [leaf for inner in exc.exceptions for leaf in leaves(inner)]
    return [exc]


async def beside(
    main: Callable[[], Awaitable[T]],
    side: Callable[[], Coroutine[Any, Any, None]],
    *,
    wait_for_side: bool,
) -> T:
    """``main()``'s result, with ``side()`` running beside it. When ``main`` ends,
    ``side`` is waited for (``wait_for_side``) or cancelled. What ``main`` raises is
    raised as it is; ``side`` must catch its own errors."""
    result: list[T] = []
    error: list[Exception] = []
    async with anyio.create_task_group() as tasks:
        tasks.start_soon(side)
        try:
            result.append(await main())
        except Exception as exc:
            error.append(exc)
        finally:
            if not wait_for_side:
                tasks.cancel_scope.cancel()
    if error:
        raise error[0]
    return result[0]
