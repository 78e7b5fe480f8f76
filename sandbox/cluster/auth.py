"""Whether a Ray cluster lets in only the holders of its token.

Ray runs whatever code a process that reaches its GCS port sends it, on any node,
as the node's user: on a Fleet node that is root with the Docker socket and the node's
``ANTHROPIC_API_KEY``. Ray's token authentication (2.52 and later) closes that door:
with ``RAY_AUTH_MODE=token`` in the environment of every Ray process, each request to
the GCS, the raylets and the dashboard must carry the cluster's token, read from
``RAY_AUTH_TOKEN``, else the file ``RAY_AUTH_TOKEN_PATH`` names, else
``~/.ray/auth_token``. Fleet connects only to a cluster that refuses a process
without the token, unless the user says otherwise in so many words
(``--insecure-cluster-without-auth``).

How it is checked. Nothing this process can read says how the cluster runs: the mode
is an environment variable of each Ray process, not part of any configuration a
client can ask for, and this process's own ``RAY_AUTH_MODE`` says only what it would
send. So Fleet asks the way an intruder would: :func:`probe` starts a separate
process with no token anywhere (``RAY_AUTH_MODE=disabled``, no ``RAY_AUTH_TOKEN`` or
``RAY_AUTH_TOKEN_PATH``, a ``HOME`` without ``~/.ray``) that opens a GCS client to the
address and reads one key. An answer proves the cluster open; Ray's authentication
error proves the token required; anything else - nothing listening, a timeout,
another error - proves neither and is reported as such, never taken for "required".
A separate process because this one cannot unlearn its token: Ray read the mode and
the token when it was imported, and they are what lets it connect afterwards.

Probing the head is enough. A Ray process serves with the same mode it connects
with, and one that sends no token cannot join a head that requires one, so every
node of a cluster whose GCS requires the token requires it too; a GCS that does not
is an open cluster whatever its nodes do. The probe dials the address ``ray.init``
would dial: Ray replaces a loopback address by the machine's own one unless
``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0``, and a cluster bound to loopback is then out of
reach - said at once instead of after Ray's minute of retries.

Run as ``python -m sandbox.cluster.auth ADDRESS`` it is that probe, printing one
JSON line: the address Ray dials for ``ADDRESS`` and what the GCS there answered; it
imports only Ray's address rules and GCS client. It turns the address into Ray's form
itself, so that a command can start it the moment it knows the address
(:func:`probe_soon`, from ``coordinator/cli/early.py``), before it has imported Ray:
its half second then runs beside the command's own start instead of before
``ray.init``. The answer is taken only by the same process, for the same address,
within :data:`FRESH_S`; any other asks again.
"""

from __future__ import annotations

import argparse
import atexit
import contextlib
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

State = Literal["token", "open", "unreachable", "unknown"]

PROBE_S = 30.0
"""How long the probe process may take in all (Ray's import is about a second)."""
FRESH_S = 60.0
"""How long an answer started early (:func:`probe_soon`) may be taken for the cluster's
state; an older one is asked again."""
DIAL_S = 5.0
"""How long the probe waits for the GCS port to accept a connection."""
TOKEN_VARS = ("RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH")
INSECURE_FLAG = "--insecure-cluster-without-auth"

HOW_TO_TURN_ON = (
    "Turn token authentication on: generate a token once ('ray get-auth-token "
    "--generate' writes ~/.ray/auth_token), give the same token to every host of the "
    "cluster and to this machine (that file, or RAY_AUTH_TOKEN, or RAY_AUTH_TOKEN_PATH "
    "naming a file), set RAY_AUTH_MODE=token for every 'ray start' and for fleet, and "
    "start the cluster's Ray processes again"
)


@dataclass(frozen=True)
class Probe:
    """What a process without the token met at a cluster's GCS."""

    state: State
    """``token``: refused for want of the token; ``open``: let in; ``unreachable``:
    nothing answered (or the address is not a head's); ``unknown``: something
    answered, neither way."""
    address: str
    """The address dialled (Ray's form of the one given)."""
    detail: str = ""
    """Why, in a few words, for ``unreachable`` and ``unknown``."""


def add_insecure_flag(p: argparse.ArgumentParser) -> None:
    """The one way to use a Ray cluster that lets in a process without its token."""
    p.add_argument(
        INSECURE_FLAG,
        action="store_true",
        help="use the Ray cluster even if it runs code for anyone who reaches it (no "
        "token authentication); without this, such a cluster is refused",
    )


def dial_address(address: str) -> str:
    """The GCS address ``ray.init(address=...)`` dials for ``address``; ValueError for
    one that is not a head's ``HOST:PORT`` (``auto`` finds this machine's cluster)."""
    if address.startswith("ray://"):
        raise ValueError(_client_address(address))
    from ray._private import services

    try:
        dialled = services.canonicalize_bootstrap_address_or_die(address)
    except (ConnectionError, ValueError) as exc:
        raise ValueError(f"{address} is not a Ray head's address HOST:PORT ({exc})") from None
    return str(dialled)


class _Asking:
    """The probe's process for one address, started: :meth:`result` waits for its
    answer (and removes its home), :meth:`discard` ends it unasked."""

    def __init__(self, address: str) -> None:
        self.address, self.started = address, time.monotonic()
        env = {k: v for k, v in os.environ.items() if k not in TOKEN_VARS}
        env["RAY_AUTH_MODE"] = "disabled"
        root = str(Path(__file__).resolve().parents[2])
        env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH")) if p)
        self.home = tempfile.mkdtemp(prefix="fleet-probe-")
        env["HOME"] = self.home  # no ~/.ray/auth_token to fall back on
        try:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "sandbox.cluster.auth", address],
                env=env,
                cwd=self.home,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
        except BaseException:
            shutil.rmtree(self.home, ignore_errors=True)
            raise

    def result(self) -> Probe:
        try:
            left = PROBE_S - (time.monotonic() - self.started)
            out, err = self.proc.communicate(timeout=max(left, 0.1))
        except subprocess.TimeoutExpired:
            self.discard()
            return Probe("unknown", self.address, f"the check did not finish within {PROBE_S:g}s")
        finally:
            shutil.rmtree(self.home, ignore_errors=True)
        try:
            found = json.loads(out.strip().splitlines()[-1])
            state, detail = found["state"], str(found.get("detail", ""))
            dialled = str(found.get("address") or self.address)
        except (IndexError, ValueError, KeyError, TypeError, AttributeError):
            state, detail, dialled = "", "", self.address
        if state not in ("token", "open", "unreachable", "unknown"):
            tail = (err.strip().splitlines() or ["no output"])[-1][:200]
            return Probe("unknown", dialled, f"the check failed: {tail}")
        return Probe(state, dialled, detail)

    def discard(self) -> None:
        with contextlib.suppress(OSError):
            self.proc.kill()
        with contextlib.suppress(subprocess.TimeoutExpired, OSError, ValueError):
            self.proc.communicate(timeout=5)
        shutil.rmtree(self.home, ignore_errors=True)


_early: dict[str, _Asking] = {}
_early_lock = threading.Lock()


def probe_soon(address: str) -> None:
    """Start the probe of ``address`` now, for this process's :func:`probe` of the same
    address to take within :data:`FRESH_S` (a command starts it as soon as it knows the
    address, so the probe's process runs beside the command's own start)."""
    if address.startswith("ray://"):
        return  # refused without a probe
    with _early_lock:
        if address not in _early:
            _early[address] = _Asking(address)


@atexit.register
def _discard_early() -> None:
    """A probe started early and never asked for (the command failed first) is ended."""
    with _early_lock:
        left = list(_early.values())
        _early.clear()
    for asking in left:
        asking.discard()


def probe(address: str) -> Probe:
    """Ask the cluster at ``address`` for one key from a process without the token:
    the answer of the probe :func:`probe_soon` started for it, when that is fresh,
    else of one started now."""
    if address.startswith("ray://"):
        return Probe("unreachable", address, _client_address(address))
    with _early_lock:
        asking = _early.pop(address, None)
    if asking is not None and time.monotonic() - asking.started > FRESH_S:
        asking.discard()
        asking = None
    return (asking or _Asking(address)).result()


def _client_address(address: str) -> str:
    return (
        f"{address} is a Ray Client address; give the head's GCS address HOST:PORT "
        "(what 'ray start --head' prints, port 6379 by default)"
    )


def _ask(given: str) -> dict[str, str]:
    """The probe itself, in the process without the token: the address ``ray.init``
    would dial for ``given`` (Ray is imported here, not in the command's process), then
    one key asked of it."""
    try:
        address = dial_address(given)
    except ValueError as exc:
        return {"state": "unreachable", "detail": str(exc), "address": given}
    found = _ask_at(address)
    found["address"] = address
    return found


def _ask_at(address: str) -> dict[str, str]:
    host, _, port = address.rpartition(":")
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=DIAL_S).close()
    except OSError as exc:
        return {"state": "unreachable", "detail": f"{exc.strerror or exc} at {address}"}
    except ValueError:
        return {"state": "unreachable", "detail": f"{address} is not HOST:PORT"}
    from ray._raylet import GcsClient  # type: ignore[attr-defined]  # not in Ray's stub
    from ray.exceptions import AuthenticationError

    try:
        client = GcsClient(address=address)
        client.internal_kv_get(b"fleet-auth-probe", None, timeout=DIAL_S)
    except AuthenticationError:
        return {"state": "token"}
    except Exception as exc:
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:200]
        return {"state": "unknown", "detail": f"{type(exc).__name__}: {first}"}
    return {"state": "open"}


def refusal(address: str, found: Probe, *, insecure: bool = False) -> str | None:
    """Why Fleet does not connect to the cluster (one paragraph), or None when it may:
    the token is required there and this process can send it - or the cluster may be
    open and the user said ``insecure`` (then :func:`warning` says what that means)."""
    if found.state == "token":
        if os.environ.get("RAY_AUTH_MODE", "").strip().lower() == "token":
            return None
        return (
            f"the Ray cluster at {address} requires its token, and this process would "
            "not send one (RAY_AUTH_MODE is not 'token' here); set RAY_AUTH_MODE=token "
            "and give this process the cluster's token (RAY_AUTH_TOKEN, "
            "RAY_AUTH_TOKEN_PATH or ~/.ray/auth_token)"
        )
    if found.state == "unreachable":
        return (
            f"cannot reach the Ray cluster at {address}: {found.detail}"
            f"{_loopback_hint(address, found)}; start its head with 'ray start --head' and "
            "give the address it prints"
        )
    if insecure:
        return None
    if found.state == "open":
        return (
            f"the Ray cluster at {address} lets in anyone who can reach it: a process "
            "without a token connected to it, and could run code on every node as the "
            "node's user - for a Fleet node, root with the Docker socket and the node's "
            f"API key. {HOW_TO_TURN_ON}. To use it anyway, knowing that whoever reaches "
            f"its ports can do the same, pass {INSECURE_FLAG}."
        )
    return (
        f"could not tell whether the Ray cluster at {address} requires a token: "
        f"{found.detail}. Fleet runs members only on a cluster that refuses a process "
        f"without its token; check the address, or pass {INSECURE_FLAG} to go on "
        "without knowing."
    )


def own_token_refused(address: str, found: Probe) -> str | None:
    """Ray's words when a cluster that requires the token refuses this process's (a
    wrong or missing one), else None: said at once, where ``ray.init`` would retry for
    20 s and then report only that it could not connect. The token goes to the address
    this process puts in Ray's form itself, as ``ray.init`` will: not to the probe's
    word for it."""
    if found.state != "token":
        return None
    from ray._raylet import GcsClient  # type: ignore[attr-defined]  # not in Ray's stub
    from ray.exceptions import AuthenticationError

    try:
        dialled = dial_address(address)
    except ValueError:
        return None  # ray.init says what it is
    try:
        GcsClient(address=dialled).internal_kv_get(b"fleet-auth-probe", None, timeout=DIAL_S)
    except AuthenticationError as exc:
        return (str(exc).strip().splitlines() or ["refused"])[0][:200]
    except Exception:
        return None  # not about the token: ray.init says what it is
    return None


def warning(address: str, found: Probe) -> str | None:
    """What going on with ``insecure`` means, when the cluster is not known to be closed."""
    if found.state == "token":
        return None
    what = (
        "lets in anyone who can reach it"
        if found.state == "open"
        else ("may let in anyone who can reach it")
    )
    return (
        f"warning: the Ray cluster at {address} {what} (no token authentication), and "
        f"{INSECURE_FLAG} says to use it anyway: whoever reaches its ports can run code "
        "on its nodes"
    )


def _loopback_hint(address: str, found: Probe) -> str:
    """A loopback address Ray turned into the machine's own: say how to keep it."""

    def loopback(addr: str) -> bool:
        host = addr.rpartition(":")[0].strip("[]")
        return host == "localhost" or host == "::1" or host.startswith("127.")

    if not loopback(address) or loopback(found.address):
        return ""
    return (
        f" (Ray dials {found.address} for {address}: for a cluster bound to loopback, "
        "set RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0 here as for its 'ray start')"
    )


if __name__ == "__main__":
    print(json.dumps(_ask(sys.argv[1])), flush=True)
