"""An engine that stops answering after the backend (or a box) was set up.

The backend's client is pointed at a socket nobody listens on - the state a client is
in once ``dockerd`` died - and every backend call must raise ``SandboxUnavailable``
with the one-paragraph message, never a ``requests``/``docker`` exception. A box whose
engine vanished is not called crashed: that word is kept for the engine's own verdict.
A warm pool keeps trying after engine trouble, but not for a snapshot that is gone.
"""

from __future__ import annotations

import socket
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import anyio
import docker
import docker.errors
import pytest
import requests.exceptions

from sandbox.docker import engine
from sandbox.docker.backend import DockerBackend
from sandbox.docker.engine import engine_down
from sandbox.errors import SandboxCrashed, SandboxUnavailable, SnapshotGone
from sandbox.pool import SandboxPool
from sandbox.spec import SandboxSpec

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture(autouse=True)
def fleet_home(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("FLEET_HOME", str(tmp_path / "fleet-home"))


@pytest.fixture
def dead_client() -> Iterator[docker.DockerClient]:
    """A client for a socket that does not exist (an explicit API version, so making it
    does not call the engine - like a client made before the engine died)."""
    client = docker.DockerClient(
        base_url=f"unix:///tmp/fleet-dead-{uuid.uuid4().hex[:8]}.sock", version="1.41", timeout=5
    )
    try:
        yield client
    finally:
        client.close()


@pytest.fixture
def dead_backend(dead_client: docker.DockerClient) -> DockerBackend:
    # The image names are only looked up by the engine, which never answers here.
    return DockerBackend(dead_client, images={"coding": "fleet-coding:gone"})


def assert_gone(exc: BaseException, client: docker.DockerClient) -> None:
    sock = client.api._custom_adapter.socket_path
    text = str(exc)
    assert type(exc) is SandboxUnavailable, repr(exc)
    assert f"the Docker engine at unix://{sock} stopped answering" in text, text
    assert "fleet setup" in text and "fleet resume" in text, text
    assert "\n" not in text and exc.__cause__ is None and exc.__suppress_context__


async def test_backend_calls_on_a_dead_engine_say_so(
    dead_backend: DockerBackend, dead_client: docker.DockerClient
) -> None:
    calls = {
        "list_boxes": lambda: dead_backend.list_boxes(),
        "list_boxes(run)": lambda: dead_backend.list_boxes(run="r1"),
        "remove_run": lambda: dead_backend.remove_run("r1"),
        "gc": lambda: dead_backend.gc(live_runs=set()),
        "create": lambda: dead_backend.create(SandboxSpec(), run="r1", member="m1"),
        "remove_container": lambda: dead_backend.remove_container("0123456789ab"),
    }
    for name, call in calls.items():
        with pytest.raises(SandboxUnavailable) as info:
            await call()
        assert_gone(info.value, dead_client), name


async def test_pool_refill_on_a_dead_engine_records_the_error_and_acquire_raises_it(
    dead_backend: DockerBackend, dead_client: docker.DockerClient
) -> None:
    spec = SandboxSpec()
    async with SandboxPool(dead_backend, spec, run="r1", min_idle=1, max_size=2) as pool:
        with anyio.fail_after(10):
            while pool.last_error is None:
                await pool._changed.wait()  # the refill loop notifies after a failure
        assert_gone(pool.last_error, dead_client)
        with pytest.raises(SandboxUnavailable) as info:
            await pool.acquire("m1")
        assert_gone(info.value, dead_client)
        assert pool.idle == 0


def test_only_an_unanswered_call_counts_as_the_engine_gone() -> None:
    assert engine_down(requests.exceptions.ConnectionError("Connection aborted."))
    assert engine_down(requests.exceptions.ReadTimeout("read timed out"))
    assert engine_down(ConnectionRefusedError(111, "refused"))
    wrapped = docker.errors.DockerException("Error while fetching server API version")
    wrapped.__cause__ = requests.exceptions.ConnectionError("refused")
    assert engine_down(wrapped)
    # The engine answered (and said no): that is the caller's to interpret.
    assert not engine_down(docker.errors.NotFound("No such container"))
    assert not engine_down(docker.errors.APIError("409 Conflict"))
    assert not engine_down(docker.errors.DockerException("bad argument"))
    assert not engine_down(ValueError("x"))


@pytest.mark.docker
async def test_a_box_whose_engine_vanished_is_unavailable_not_crashed(
    docker_client: docker.DockerClient, images: dict[str, str], run_id: str, dead_client
) -> None:
    backend = DockerBackend(docker_client, images=images)
    box = await backend.create(SandboxSpec(), run=run_id, member="m1")
    try:
        assert (await box.exec("true")).ok
        real_client = box.transport._client
        # The engine "dies": the transport's client no longer reaches it and the agent
        # stream (a socket of the old engine) is gone.
        box.transport._client, box.transport._api = dead_client, dead_client.api
        box.transport.close()
        with pytest.raises(SandboxUnavailable) as info:
            await box.check()
        assert_gone(info.value, dead_client)
        with pytest.raises(SandboxUnavailable) as info:
            await box.exec("true")
        assert_gone(info.value, dead_client)
        assert box.transport.crashed is None
        # The engine "comes back": the box was never judged crashed, so it still works.
        box.transport._client, box.transport._api = real_client, real_client.api
        await box.check()
        assert (await box.exec("echo back")).stdout.strip() == "back"
        # A box that really died while the engine answers is still SandboxCrashed.
        await anyio.to_thread.run_sync(lambda: docker_client.api.kill(box.id))
        with pytest.raises(SandboxCrashed):
            await box.check()
    finally:
        await box.close()


class _SlowEngine:
    """A socket in front of the real engine that holds back some of its answers: the
    engine does the work at once, but its answer reaches the client only after
    ``hold`` seconds - what a client sees of an engine that is up but loaded.
    ``slow(first_line)`` picks the requests to hold; each is held once."""

    def __init__(self, path: str, slow: Callable[[bytes], bool], hold: float) -> None:
        self.path, self.slow, self.hold = path, slow, hold
        self.held: list[bytes] = []
        self._server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._server.bind(path)
        self._server.listen(16)
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self._server.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        engine = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        engine.connect("/var/run/docker.sock")
        hold = threading.Event()

        def upstream() -> None:
            while data := conn.recv(65536):
                line = data.split(b"\r\n", 1)[0]
                if line[:1].isalpha() and self.slow(line) and line not in self.held:
                    self.held.append(line)
                    hold.set()
                engine.sendall(data)
            engine.shutdown(socket.SHUT_WR)

        threading.Thread(target=upstream, daemon=True).start()
        try:
            while data := engine.recv(65536):
                if hold.is_set():
                    time.sleep(self.hold)
                    hold.clear()
                conn.sendall(data)
        except OSError:
            pass
        finally:
            conn.close()
            engine.close()

    def close(self) -> None:
        self._server.close()


@pytest.fixture
def slow_engine(docker_client, tmp_path) -> Iterator[Callable[..., docker.DockerClient]]:
    made: list[tuple[_SlowEngine, docker.DockerClient]] = []

    def make(slow: Callable[[bytes], bool], *, hold: float, timeout: float) -> docker.DockerClient:
        proxy = _SlowEngine(str(tmp_path / f"slow-{len(made)}.sock"), slow, hold)
        client = docker.DockerClient(
            base_url=f"unix://{proxy.path}", version=docker_client.api.api_version, timeout=timeout
        )
        made.append((proxy, client))
        return client

    yield make
    for proxy, client in made:
        client.close()
        proxy.close()


@pytest.mark.docker
async def test_a_removal_the_engine_answers_after_the_timeout_still_removes_the_box(
    docker_client, images, run_id, slow_engine
) -> None:
    """A box's removal answered after the client's timeout, while the engine answers a
    ping: the box is gone and nothing is raised (it used to be 'stopped answering')."""
    backend = DockerBackend(docker_client, images=images)
    box = await backend.create(SandboxSpec(), run=run_id, member="m1")
    client = slow_engine(lambda line: line.startswith(b"DELETE "), hold=4.0, timeout=2)
    slow = DockerBackend(client, images=images)
    started = time.monotonic()
    await slow.remove_container(box.id)
    assert 2.0 <= time.monotonic() - started < 30
    with pytest.raises(docker.errors.NotFound):
        docker_client.api.inspect_container(box.id)
    # The same through the reaper, which ends a run's boxes.
    box = await backend.create(SandboxSpec(), run=run_id, member="m2")
    client = slow_engine(lambda line: line.startswith(b"DELETE "), hold=4.0, timeout=2)
    assert await DockerBackend(client, images=images).remove_run(run_id) == 1
    assert not docker_client.api.containers(all=True, filters={"label": f"fleet.run={run_id}"})


@pytest.mark.docker
async def test_a_call_too_slow_for_its_timeout_on_a_living_engine_says_overloaded(
    docker_client, images, run_id, slow_engine
) -> None:
    client = slow_engine(lambda line: b"/containers/json" in line, hold=4.0, timeout=2)
    with pytest.raises(SandboxUnavailable) as info:
        await DockerBackend(client, images=images).list_boxes(run=run_id)
    text = str(info.value)
    assert "answers but did not finish a call in time" in text and "max_parallel" in text, text
    assert "stopped answering" not in text and "\n" not in text


def test_a_removal_on_an_engine_that_stops_answering_is_not_waited_for(
    tmp_path, monkeypatch
) -> None:
    """Accepts connections, never answers: no ping comes back either, so the removal
    raises 'stopped answering' after one timeout and one ping, not after its patience."""
    monkeypatch.setattr(engine, "PING_TIMEOUT_S", 1)
    path = str(tmp_path / "mute.sock")
    mute = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    mute.bind(path)
    mute.listen(16)
    held: list[socket.socket] = []
    threading.Thread(
        target=lambda: [held.append(mute.accept()[0]) for _ in range(16)], daemon=True
    ).start()
    client = docker.DockerClient(base_url=f"unix://{path}", version="1.41", timeout=1)
    started = time.monotonic()
    try:
        with pytest.raises(SandboxUnavailable) as info:
            with engine.engine_calls(client):
                engine.remove_box(client, "0123456789ab")
    finally:
        client.close()
        mute.close()
    assert time.monotonic() - started < 10
    assert_gone(info.value, client)


async def test_a_pool_whose_snapshot_is_gone_stops_refilling_and_acquire_still_says_why() -> None:
    """A removed snapshot is gone for good: the pool tries once, not once a second for
    the rest of the run; a member that asks for a box still gets the error (its retry
    then sets the setup up again)."""
    ref = "fleet-prepared:" + "a" * 64

    class Gone:
        calls = 0

        async def create(self, spec: SandboxSpec, *, run: str, member: str) -> Any:
            Gone.calls += 1
            raise SnapshotGone(ref)

    spec = SandboxSpec(prepared=ref)
    async with SandboxPool(Gone(), spec, run="r1", min_idle=2, max_size=4) as pool:  # type: ignore[arg-type]
        with anyio.fail_after(10):
            while pool.last_error is None:
                await pool._changed.wait()
        await anyio.sleep(2.5)  # the engine-trouble pause is 1 s: two more tries before
        assert Gone.calls == 1
        pool.keep_idle(3)  # asking for more spares does not start it again
        await anyio.sleep(1.2)
        assert Gone.calls == 1
        with pytest.raises(SnapshotGone):
            await pool.acquire("m1")
        assert Gone.calls == 2 and pool.idle == 0
