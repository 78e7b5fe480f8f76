"""One rate governor for a whole cluster run: a Ray actor, and the nodes' proxies of it.

On one machine every member's model calls go through the process's governor
(:mod:`subagents.model.governor`). On a cluster the members run in the nodes'
processes, and a governor per node would each believe it had the account to itself:
N nodes would spend the account N times over and learn of it only from 429s. So the
run starts one :class:`GovernorService` actor and every node installs a source of
:class:`RemoteGovernor` proxies (:func:`install`): a node asks the actor before each
call and tells it how the call ended, about 1 ms a call beside calls of seconds.

What crosses Ray: the key's hash (never the key, which stays in each node's
environment), token estimates, the answer's status and its ``anthropic-ratelimit-*``
and ``retry-after`` headers. If the actor is lost (its node died), each node goes on
with a governor of its own rather than failing its members: pacing per node is worse
than one pace for the run, and far better than none.

Cancellation: a call cancelled while it waits for admission tells the actor, which
releases the slot if it was granted meanwhile - a cancelled member never holds one of
the run's calls in flight.
"""

from __future__ import annotations

import itertools
import logging
import os
from collections.abc import Callable, Mapping
from typing import Any

import ray

from subagents.model.governor import Permit, RateGovernor, use_source

log = logging.getLogger(__name__)
_HEADERS = ("anthropic-ratelimit-", "retry-after")


class GovernorService:
    """The actor's body: the run's governors, one per API key hash."""

    def __init__(self) -> None:
        self._governors: dict[str, RateGovernor] = {}
        self._permits: dict[str, Permit] = {}
        """Admitted calls by their caller's ticket, until released."""
        self._abandoned: set[str] = set()

    def _governor(self, digest: str) -> RateGovernor:
        governor = self._governors.get(digest)
        if governor is None:
            governor = self._governors[digest] = RateGovernor()
        return governor

    async def acquire(
        self, digest: str, ticket: str, input_tokens: int, max_tokens: int | None
    ) -> Permit | None:
        """Admit one call (waiting as the governor says); None if it was abandoned."""
        governor = self._governor(digest)
        permit = await governor.acquire(input_tokens, max_tokens)
        if ticket in self._abandoned:
            self._abandoned.discard(ticket)
            governor.release(permit, status=0)
            return None
        self._permits[ticket] = permit
        return permit

    def release(
        self,
        digest: str,
        ticket: str,
        status: int,
        headers: dict[str, str],
        retry_after: float | None,
        input_tokens: int | None,
        output_tokens: int | None,
    ) -> float:
        permit = self._permits.pop(ticket, None)
        if permit is None:
            return 0.0
        return self._governor(digest).release(
            permit,
            status=status,
            headers=headers,
            retry_after=retry_after,
            input_tokens=input_tokens,
            output_tokens=output_tokens,
        )

    def abandon(self, digest: str, ticket: str) -> None:
        """The caller stopped waiting: release its slot now or when it is granted."""
        permit = self._permits.pop(ticket, None)
        if permit is not None:
            self._governor(digest).release(permit, status=0)
        else:
            self._abandoned.add(ticket)

    def stats(self) -> dict[str, dict[str, float]]:
        """Each governor's counters (calls, 429s, 529s, seconds waited), by key hash."""
        return {digest: dict(g.stats) for digest, g in self._governors.items()}


_tickets = itertools.count()


class RemoteGovernor:
    """A node's proxy of the run's governor for one key (see the module docstring)."""

    patience_s = 900.0

    def __init__(self, actor: Any, digest: str) -> None:
        self.actor = actor
        self.digest = digest
        self._tickets: dict[int, str] = {}
        """id() of each admitted permit -> the ticket the actor knows it by."""
        self._local: RateGovernor | None = None
        """The governor this node falls back on once the actor is lost."""

    def _lost(self, exc: Exception) -> RateGovernor:
        if self._local is None:
            log.warning("the run's rate governor is lost (%s); this node paces alone", exc)
            self._local = RateGovernor()
        return self._local

    async def acquire(
        self,
        input_tokens: int,
        max_tokens: int | None = None,
        on_wait: Callable[[str, float], None] | None = None,
    ) -> Permit:
        if self._local is not None:
            return await self._local.acquire(input_tokens, max_tokens, on_wait)
        ticket = f"{os.getpid()}-{next(_tickets)}"
        try:
            permit = await self.actor.acquire.remote(self.digest, ticket, input_tokens, max_tokens)
        except ray.exceptions.RayActorError as exc:
            return await self._lost(exc).acquire(input_tokens, max_tokens, on_wait)
        except BaseException:
            self.actor.abandon.remote(self.digest, ticket)
            raise
        assert permit is not None  # only an abandoned ticket gets None, and we waited
        self._tickets[id(permit)] = ticket
        return permit

    def release(
        self,
        permit: Permit,
        *,
        status: int,
        headers: Mapping[str, str] | None = None,
        retry_after: float | None = None,
        input_tokens: int | None = None,
        output_tokens: int | None = None,
    ) -> float:
        ticket = self._tickets.pop(id(permit), None)
        if ticket is None:  # admitted by the local fallback
            assert self._local is not None
            return self._local.release(
                permit,
                status=status,
                headers=headers,
                retry_after=retry_after,
                input_tokens=input_tokens,
                output_tokens=output_tokens,
            )
        wanted = {
            k.lower(): v for k, v in (headers or {}).items() if k.lower().startswith(_HEADERS)
        }
        # Told without waiting for the answer: the pause it sets reaches this member
        # through its next acquire, which the actor holds until the pause is over.
        self.actor.release.remote(
            self.digest, ticket, status, wanted, retry_after, input_tokens, output_tokens
        )
        if status in (429, 529):
            return retry_after or 0.0
        return 0.0

    def cancel(self, permit: Permit) -> None:
        ticket = self._tickets.pop(id(permit), None)
        if ticket is not None:
            self.actor.abandon.remote(self.digest, ticket)
        elif self._local is not None:
            self._local.cancel(permit)


def start() -> Any:
    """The run's governor actor (on whichever node Ray picks; it needs no CPU)."""
    return ray.remote(GovernorService).options(num_cpus=0, max_restarts=0).remote()


def install(actor: Any) -> None:
    """Make this process's model calls ask the run's governor (on a node)."""
    proxies: dict[str, RemoteGovernor] = {}

    def source(digest: str) -> RemoteGovernor:
        proxy = proxies.get(digest)
        if proxy is None:
            proxy = proxies[digest] = RemoteGovernor(actor, digest)
        return proxy

    use_source(source)
