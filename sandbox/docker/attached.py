"""Sockets attached to a box's stdio before it started, waiting for its transport.

A box whose agent is its PID 1 (:func:`sandbox.docker.container.create_container` with
``attach``) is reached through the container's own stdin and stdout: the host attaches
before the box starts, so the agent's first frame is never missed. The box is created in
one place (a run's pool, the early-box thread of ``fleet run``, a warm pool between
runs) and its transport opened in another, later, possibly on another thread; the
socket waits here, keyed by the container's id, and is taken once
(:meth:`sandbox.docker.transport.BoxTransport.start`). A box removed before anyone took
its socket has it closed (:func:`sandbox.docker.engine.remove_box`).

Only the first transport of a box uses it: the container's stdin closes when that
connection does (``StdinOnce``), the agent then ends, and any later agent of the box is
started with ``docker exec``, as for every box.
"""

from __future__ import annotations

import threading
from typing import Any

_held: dict[str, Any] = {}
_lock = threading.Lock()


def hold(ident: str, sock: Any) -> None:
    """Keep ``sock`` (docker-py's ``attach_socket`` result) for box ``ident``."""
    with _lock:
        old = _held.pop(ident, None)
        _held[ident] = sock
    if old is not None:
        _close(old)


def take(ident: str) -> Any | None:
    """The socket held for box ``ident``, handed out once (None: none, or taken)."""
    with _lock:
        return _held.pop(ident, None)


def drop(ident: str) -> None:
    """Close the socket of box ``ident`` if nobody took it (the box is being removed)."""
    with _lock:
        sock = _held.pop(ident, None)
    if sock is not None:
        _close(sock)


def held() -> int:
    """How many sockets wait for their transports."""
    with _lock:
        return len(_held)


def _close(sock: Any) -> None:
    try:
        getattr(sock, "_sock", sock).close()
    except OSError:
        pass
