"""The Docker engine: connect to it, and make it available on a fresh machine.

:func:`connect` is what every caller uses: it returns a pinged client or raises
:class:`~sandbox.errors.SandboxUnavailable` with one paragraph that says what to do.
:func:`ensure_engine` is the set-up path behind ``fleet setup``: when the engine does
not answer and we are root it installs Debian's ``docker.io`` (only if ``dockerd`` is
absent) and starts ``dockerd`` in the background, then waits until it answers. It
never does either as a non-root user - it explains instead - and it never touches an
engine that already answers, so a second run costs one ping.

The engine is found the way the ``docker`` CLI finds it: ``DOCKER_HOST`` when set,
else ``unix:///var/run/docker.sock``.

An engine that dies later, after a client was made, shows up as a ``requests``
connection error (or timeout) from whichever call comes next. :func:`engine_calls` is
the one place that turns those into :class:`SandboxUnavailable` ("the engine at ...
stopped answering"); every engine call site in the sandbox layer runs under it (the
backend, the reaper, run networks, the box transport). Docker API errors - the engine
answered and said no - pass through untouched, so a box that died while the engine is
up still becomes ``SandboxCrashed`` where the caller decides that.

Slow is not gone. A client gives up on a call after its timeout (60 s), and an engine
that is up but loaded - many boxes starting, a gVisor box being killed - can take
longer than that to remove a box. So a timeout is judged by a ping on a connection of
its own (10 s): only an engine that does not answer that either is reported as having
stopped; one that answers is reported as too slow for that call. Removal, which every
run's end and every failed start depends on, does not give up at the first timeout:
:func:`remove_box` asks again and waits, bounded, until the box is gone.
"""

from __future__ import annotations

import functools
import os
import shutil
import subprocess
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Concatenate, ParamSpec, TypeVar

import docker
import docker.errors
import requests.exceptions

from ..errors import SandboxUnavailable
from . import attached

DEFAULT_HOST = "unix:///var/run/docker.sock"
DOCKERD_LOG = "/var/log/dockerd.log"
START_TIMEOUT_S = 30.0
PING_TIMEOUT_S = 10
# How long a removal may take in all, across calls that time out, before it is an error.
REMOVE_PATIENCE_S = 300.0
# Host tools the image build needs besides the engine, as (binary, Debian package).
BUILD_TOOLS = (("debootstrap", "debootstrap"),)

Say = Callable[[str], None]
P = ParamSpec("P")
T = TypeVar("T")


def engine_host() -> str:
    """Where the engine is expected: ``DOCKER_HOST`` or the default socket."""
    return os.environ.get("DOCKER_HOST") or DEFAULT_HOST


def connect(base_url: str | None = None, *, timeout: float = 60.0) -> docker.DockerClient:
    """A Docker client that has answered a ping, or :class:`SandboxUnavailable`."""
    url = base_url or engine_host()
    try:
        client = docker.DockerClient(base_url=url, timeout=int(timeout))
        client.ping()
    except (docker.errors.DockerException, requests.exceptions.RequestException, OSError) as exc:
        raise SandboxUnavailable(unreachable_message(url, exc)) from None
    return client


def unreachable_message(url: str, exc: BaseException | None = None) -> str:
    """One paragraph: the engine at ``url`` does not answer, and what to do about it."""
    why = f" ({_short(exc)})" if exc is not None else ""
    if url.startswith("unix://"):
        sock = url.removeprefix("unix://")
        if not os.path.exists(sock):
            where = f"there is no socket at {sock}"
        elif not os.access(sock, os.R_OK | os.W_OK):
            where = (
                f"{sock} exists but this user may not use it (add the user to the 'docker' group)"
            )
        else:
            where = f"{sock} exists but the engine behind it does not answer"
    else:
        where = f"nothing answers at {url}"
    return (
        f"the Docker engine is not reachable: {where}{why}. Start it "
        f"(as root: 'setsid dockerd >{DOCKERD_LOG} 2>&1 &', or 'systemctl start docker'), "
        f"or install it first ('apt-get install -y docker.io'); 'fleet setup' run as root does "
        f"both. If the engine lives elsewhere, set DOCKER_HOST (now {url})."
    )


def engine_down(exc: BaseException | None) -> bool:
    """Whether ``exc`` means the engine did not answer at all (not that it said no)."""
    if exc is None or isinstance(exc, docker.errors.APIError):
        return False  # an HTTP answer: the engine is up
    if isinstance(
        exc, requests.exceptions.ConnectionError | requests.exceptions.Timeout | ConnectionError
    ):
        return True
    if isinstance(exc, docker.errors.DockerException):
        # The SDK wraps some transport failures (e.g. fetching the API version).
        return engine_down(exc.__cause__ or exc.__context__)
    return False


def client_url(client: docker.DockerClient) -> str:
    """The address ``client`` talks to, as ``DOCKER_HOST`` would spell it."""
    adapter = getattr(client.api, "_custom_adapter", None)
    socket_path = getattr(adapter, "socket_path", None)
    if socket_path:  # the SDK rewrites unix URLs to http+docker://localhost
        return f"unix://{socket_path}"
    return str(getattr(client.api, "base_url", None) or engine_host())


def gone_message(url: str, exc: BaseException) -> str:
    """One paragraph: the engine at ``url`` stopped answering, and what to do about it."""
    return (
        f"the Docker engine at {url} stopped answering ({_short(exc)}). Start it again "
        f"('fleet setup' as root does it, or 'setsid dockerd >{DOCKERD_LOG} 2>&1 &'), then "
        f"retry; a run it cut short continues with 'fleet resume RUN'."
    )


def slow_message(url: str, exc: BaseException) -> str:
    """One paragraph: the engine at ``url`` answers, but not a call within its timeout."""
    return (
        f"the Docker engine at {url} answers but did not finish a call in time ({_short(exc)}); "
        f"it is overloaded (too many boxes starting or stopping at once for this machine). "
        f"Lower the job's max_parallel, or retry; a run it cut short continues with "
        f"'fleet resume RUN'."
    )


def answers(client: docker.DockerClient) -> bool:
    """Whether the engine behind ``client`` answers a ping on a connection of its own
    within :data:`PING_TIMEOUT_S` (the client's own pool may be busy with slow calls)."""
    try:
        probe = docker.APIClient(
            base_url=client_url(client), version=client.api.api_version, timeout=PING_TIMEOUT_S
        )
    except docker.errors.DockerException:
        return False
    # A TLS engine's client certificate and CA go with it (a unix socket has neither).
    probe.cert, probe.verify = client.api.cert, client.api.verify
    try:
        return bool(probe.ping())
    except (docker.errors.DockerException, requests.exceptions.RequestException, OSError):
        return False
    finally:
        probe.close()


@contextmanager
def engine_calls(client: docker.DockerClient) -> Iterator[None]:
    """Run engine calls on ``client``; an engine that does not answer becomes
    :class:`SandboxUnavailable` (see the module docstring)."""
    try:
        yield
    except (docker.errors.DockerException, requests.exceptions.RequestException, OSError) as exc:
        if not engine_down(exc):
            raise
        url = client_url(client)
        if _timed_out(exc) and answers(client):
            raise SandboxUnavailable(slow_message(url, exc)) from None
        raise SandboxUnavailable(gone_message(url, exc)) from None


def _timed_out(exc: BaseException | None) -> bool:
    while exc is not None:
        if isinstance(exc, requests.exceptions.Timeout | TimeoutError):
            return True
        exc = exc.__cause__ or exc.__context__
    return False


def remove_box(
    client: docker.DockerClient, ident: str, *, patience: float = REMOVE_PATIENCE_S
) -> bool:
    """Remove container ``ident`` with its anonymous volumes, killing it if it runs.

    True if this call removed it; False if it was not there or another removal of it was
    under way (and has now finished). A call that times out while the engine still
    answers a ping is asked again until the container is gone or ``patience`` seconds
    have passed; an engine that stops answering raises, as every call does (run it under
    :func:`engine_calls`)."""
    attached.drop(ident)  # a stdio socket nobody took (the box never got a transport)
    deadline = time.monotonic() + patience
    removed_here = False
    while True:
        try:
            client.api.remove_container(ident, force=True, v=True)
            return True
        except docker.errors.NotFound:
            return removed_here
        except docker.errors.APIError as e:
            if "already in progress" not in str(e):
                raise
        except requests.exceptions.Timeout:
            if time.monotonic() > deadline or not answers(client):
                raise
            removed_here = True  # the engine may finish what this call started
            continue
        # Another removal is under way: wait for it (a second one would only be refused).
        while time.monotonic() < deadline:
            try:
                client.api.inspect_container(ident)
            except docker.errors.NotFound:
                return removed_here
            except requests.exceptions.Timeout:
                if not answers(client):
                    raise
            time.sleep(0.5)
        raise SandboxUnavailable(
            f"the Docker engine at {client_url(client)} has not removed box {ident[:12]} "
            f"after {patience:.0f} s; remove it with 'docker rm -f {ident[:12]}' or "
            f"'fleet sandbox gc'"
        )


def on_engine(
    fn: Callable[Concatenate[docker.DockerClient, P], T],
) -> Callable[Concatenate[docker.DockerClient, P], T]:
    """Decorator: :func:`engine_calls` around ``fn(client, ...)``."""

    @functools.wraps(fn)
    def wrapper(client: docker.DockerClient, *args: P.args, **kwargs: P.kwargs) -> T:
        with engine_calls(client):
            return fn(client, *args, **kwargs)

    return wrapper


def _short(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    return text[:160]


def is_root() -> bool:
    return os.geteuid() == 0


def apt_install(packages: list[str], say: Say) -> None:
    """Install Debian packages (root only); raises :class:`SandboxUnavailable` on failure."""
    say(f"installing {' '.join(packages)} with apt-get (one time)")
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    for cmd in (["apt-get", "update", "-q"], ["apt-get", "install", "-y", "-q", *packages]):
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False)
        if proc.returncode != 0:
            tail = "\n".join(proc.stderr.strip().splitlines()[-3:])
            raise SandboxUnavailable(
                f"'{' '.join(cmd)}' failed (exit {proc.returncode}): {tail}. Fix the package "
                f"sources (/etc/apt/sources.list) or install {' '.join(packages)} by hand, "
                f"then run 'fleet setup' again."
            )


def start_dockerd(say: Say, *, timeout: float = START_TIMEOUT_S) -> docker.DockerClient:
    """Start ``dockerd`` detached (new session, log file) and wait until it answers."""
    say(f"starting dockerd in the background (log: {DOCKERD_LOG})")
    with open(DOCKERD_LOG, "ab") as log:
        subprocess.Popen(
            ["dockerd"],
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=log,
            start_new_session=True,  # survives this process and its terminal
            close_fds=True,
        )
    deadline = time.monotonic() + timeout
    last: SandboxUnavailable | None = None
    while time.monotonic() < deadline:
        try:
            return connect(DEFAULT_HOST, timeout=10)
        except SandboxUnavailable as exc:
            last = exc
            time.sleep(0.3)
    raise SandboxUnavailable(
        f"dockerd was started but did not answer within {timeout:.0f} s; see {DOCKERD_LOG} "
        f"for why. ({last})"
    )


def ensure_engine(say: Say = print) -> docker.DockerClient:
    """A reachable engine: install and start it when absent and we are root.

    Raises :class:`SandboxUnavailable` (one paragraph saying what to do) when the
    engine is down and this process may not or cannot bring it up.
    """
    try:
        return connect()
    except SandboxUnavailable as exc:
        first_error = exc
    # Only the default local engine is ours to install or start; a DOCKER_HOST that
    # points elsewhere is someone else's, and we only report.
    if engine_host() != DEFAULT_HOST or not is_root():
        raise first_error
    if shutil.which("dockerd") is None:
        apt_install(["docker.io"], say)
    return start_dockerd(say)


def ensure_build_tools(say: Say = print) -> None:
    """Install the host tools the offline image build needs (root only)."""
    missing = [pkg for binary, pkg in BUILD_TOOLS if shutil.which(binary) is None]
    if not missing:
        return
    if not is_root():
        raise SandboxUnavailable(
            f"the image build needs {' '.join(missing)} on this machine; install it "
            f"('sudo apt-get install -y {' '.join(missing)}') and run 'fleet setup' again."
        )
    apt_install(missing, say)
