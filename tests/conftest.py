"""Shared fixtures for tests that need real parts (the Docker engine, Fleet's images).

Stable interface, used by every test module:

``docker_client`` (session)
    A connected ``docker.DockerClient``. When the engine cannot be reached the test
    is skipped, or *fails* under ``CI=true``: CI must never pass by skipping.
``images`` (session)
    ``dict[str, str]``: image name (``"base"``, ``"coding"``, ``"browser"``, ...) to
    its current reference (``"fleet-coding:1a2b3c4d5e6f"``). Builds whatever is missing
    or out of date through ``sandbox.images.build.ensure_images`` (a no-op, well under a
    second, when everything is up to date). A build that fails fails the test; a
    build that cannot run here (no root for debootstrap) skips it, or fails under CI.
``run_id`` (function)
    A unique run id (``"test-<12 hex>"``), marked live for its duration (so a
    concurrent ``fleet sandbox gc`` leaves its boxes alone). Label every container and
    network the test creates with ``fleet.run=<run_id>``; at teardown every container
    and network with that label is removed, whatever the test did.
``node_engine`` (session)
    A second Docker engine on this machine for the test cluster's nodes
    (``tests/node_engine.py``): its own socket, data root and networks, Fleet's current
    images copied in from the main engine (about 45 s, once). ``host`` (its
    ``DOCKER_HOST``), ``client()``; stopped and its data root removed at the end.
``node_client`` (session)
    A ``docker.DockerClient`` of ``node_engine``.
``ray_cluster`` (function; the cluster itself is made once a session)
    A Ray cluster on this machine - head + 2 nodes with ``fleet_slots`` whose Fleet
    processes use ``node_engine`` (``DOCKER_HOST``) and a ``FLEET_HOME`` and ``TMPDIR``
    of their own, never the coordinator's; token authentication on
    (``tests/ray_support.py``): its ``address``, its ``nodes``,
    ``add_node(slots, env)``/``remove_node(node)`` and ``name(node)``. Started only
    when a test asks for it (about 1 GB while it runs); Ray missing is a skip, or a
    failure under ``CI=true``.
``cleanup`` (function)
    A list to append output directories to; at teardown the boxes of every run under
    them are removed, whatever happened (for tests that start whole runs), from the
    node engine too when it runs.
``fake_api`` (function)
    ``start(policy)`` starts a fake Messages API on 127.0.0.1 and points the real
    ``anthropic`` client of this process (``ANTHROPIC_BASE_URL``, a test key) at it;
    every server started is stopped at teardown.

``make test`` runs the suite on four pytest-xdist workers (``-n 4`` on two cores: much
of the suite's time is spent waiting on boxes, Ray, subprocesses and timeouts, not on
the CPUs; 711 s against 818 s with two workers, one quiet machine; then 759 s against
826 s with three, back to back on a slow one, the CPUs 5% and 8% idle: bench/README.md). :func:`pytest_xdist_make_scheduler` hands out whole test modules, so a
module-scoped fixture is made once. The Ray tests - ``tests/test_cluster*.py`` and
the ``[ray]`` cases of the fan-out contract - come first, dealt out to two workers
(:func:`ray_groups`), each of which starts its own session test cluster: they are the
longest part of the suite, and on one worker they were its critical path.

Every test starts and ends with the worker's signal handlers, environment, working
directory and umask as they were (``tests/process_state.py`` fails one that leaves
them changed); a test that signals a process it started starts it with
``process_support.popen``, which resets the signals a background job inherits ignored.

``missing_dependency(reason)`` is the one rule for absent dependencies: skip locally,
fail under ``CI=true``. Call it from your own fixtures (``from conftest import
missing_dependency``) instead of ``pytest.skip``.
"""

from __future__ import annotations

import contextlib
import os
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

import pytest

if TYPE_CHECKING:
    import docker

    from subagents.fake_api import FakeMessagesAPI


pytest_plugins = ("process_state", "pytester")  # process_state: see below

# Ray reads these when it is imported (by whichever test imports it first): a Ray
# cluster started by the tests listens on 127.0.0.1 only, and sends no usage reports.
os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
# Ray sets this when it is imported: set now, the first test that imports Ray does not
# change the worker's environment (``process_state``).
os.environ.setdefault("RAY_CLIENT_MODE", "0")


def in_ci() -> bool:
    """True when running under CI, where a missing dependency is a failure."""
    return os.environ.get("CI", "").strip().lower() in {"1", "true", "yes"}


def missing_dependency(reason: str) -> NoReturn:
    """Skip the test for a missing dependency, or fail it under ``CI=true``."""
    if in_ci():
        pytest.fail(f"required dependency missing under CI: {reason}", pytrace=False)
    pytest.skip(reason)


def uses_ray(nodeid: str) -> bool:
    """Whether a test (by its node id) runs on the session's Ray test cluster."""
    path, _, name = nodeid.partition("::")
    return Path(path).name.startswith("test_cluster") or "[ray" in name


RAY_GROUPS = 2
"""Workers that run Ray tests, each with its own session test cluster: one worker alone
took longer over them than the rest of the suite took on the other."""

SPLIT_BY_TEST = {"test_cluster.py"}
"""Ray modules whose tests are shared out one by one (no module-scoped fixture, and
long enough that one module on one worker would be the suite's critical path); every
other Ray module goes to one worker whole."""


ON_DEMAND = ("browser", "corpus")
"""Fleet's images a node engine gets only when a test asks (``all_images_on_nodes``)."""

ALL_IMAGES = (
    "test_cluster.py::test_mixed_job_on_two_nodes_has_the_shape_of_a_local_run",
    "test_cluster.py::test_a_lead_jobs_members_run_on_the_nodes",
    "test_cluster_auth.py",  # fleet doctor asks every node for every image
)
"""The Ray tests (or modules) that ask for :data:`ON_DEMAND` on the nodes: all in the
first group, so that only its node engine copies those images (0.85 GB of 1.3). A test
that asks from another group still gets them, later and at that group's cost."""


def ray_groups(nodeids: list[str]) -> dict[str, str]:
    """Each Ray test's group (``ray-0``, ``ray-1``, ...): the Ray modules, and the tests
    of :data:`SPLIT_BY_TEST`, dealt out in turn in collection order; those of
    :data:`ALL_IMAGES` to ``ray-0``."""
    groups: dict[str, str] = {}
    keys: dict[str, str] = {}
    dealt = 0
    for nodeid in nodeids:
        if not uses_ray(nodeid):
            continue
        path = nodeid.partition("::")[0]
        key = nodeid if Path(path).name in SPLIT_BY_TEST else path
        if key not in keys:
            if key.endswith(ALL_IMAGES):
                keys[key] = "ray-0"
            else:
                keys[key] = f"ray-{dealt % RAY_GROUPS}"
                dealt += 1
        groups[nodeid] = keys[key]
    return groups


@pytest.hookimpl(optionalhook=True)  # with -p no:xdist there is no such hook
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """Whole modules per worker, the Ray tests first and in :data:`RAY_GROUPS` groups
    (see above). The scheduler sees only node ids, so the rule is by name
    (:func:`uses_ray`)."""
    from xdist.scheduler import LoadScopeScheduling

    class ModulesAndRay(LoadScopeScheduling):  # type: ignore[misc]
        _ray: dict[str, str] | None = None

        def _split_scope(self, nodeid: str) -> str:
            if self._ray is None:  # the collection is known once scopes are asked for
                self._ray = ray_groups(list(self.collection or []))
            return self._ray.get(nodeid) or nodeid.partition("::")[0]

    config.option.loadscopereorder = False  # collection order: the Ray tests first
    return ModulesAndRay(config, log)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The Ray tests first (a stable sort: the rest keep their order), so that the worker
    that takes them starts on the suite's longest part at once."""
    items.sort(key=lambda item: not uses_ray(item.nodeid))


@pytest.fixture(scope="session")
def docker_client() -> Iterator[docker.DockerClient]:
    """A connected Docker client (skip, or fail under CI, when the engine is down)."""
    from sandbox.docker.engine import connect
    from sandbox.errors import SandboxUnavailable

    try:
        client = connect()
    except SandboxUnavailable as exc:
        missing_dependency(str(exc))
    try:
        yield client
    finally:
        client.close()


@pytest.fixture(scope="session")
def images(docker_client: docker.DockerClient) -> dict[str, str]:
    """Every Fleet image, built when missing or out of date: name -> reference."""
    from sandbox.errors import SandboxUnavailable
    from sandbox.images.build import ensure_images
    from sandbox.images.catalog import ImageBuildFailed

    try:
        return ensure_images(None, client=docker_client)
    except ImageBuildFailed as exc:
        pytest.fail(f"building Fleet's images failed: {exc}", pytrace=False)
    except SandboxUnavailable as exc:  # e.g. the base image needs root to debootstrap
        missing_dependency(str(exc))


@pytest.fixture
def run_id(docker_client: docker.DockerClient) -> Iterator[str]:
    """A unique run id; every container and network labelled with it is removed after."""
    from sandbox.docker.reaper import mark_done, mark_live

    rid = f"test-{uuid.uuid4().hex[:12]}"
    mark_live(rid)
    try:
        yield rid
    finally:
        remove_run(docker_client, rid)
        mark_done(rid)


@pytest.fixture
def fake_api(
    monkeypatch: pytest.MonkeyPatch,
) -> Iterator[Callable[[Any], FakeMessagesAPI]]:
    """Start a fake API; the coordinator's real model adapter is pointed at it."""
    from subagents.fake_api import FakeMessagesAPI

    def start(policy: Any, **options: Any) -> FakeMessagesAPI:
        api = FakeMessagesAPI(policy, **options).start()
        monkeypatch.setenv("ANTHROPIC_API_KEY", "test-key")
        monkeypatch.setenv("ANTHROPIC_BASE_URL", api.url)
        started.append(api)
        return api

    started: list[FakeMessagesAPI] = []
    yield start
    for api in started:
        api.stop()


_NODE_ENGINES: list[Any] = []
"""The node engine once started (for ``cleanup``)."""


_RAY_PARTS = contextlib.ExitStack()
"""The worker's test cluster and node engine: closed as soon as its last Ray test has
ended (:func:`pytest_runtest_teardown`), not at the session's end. An idle test cluster
costs about a fifth of a CPU (its raylets, GCS and idle workers); kept for the rest of
the suite on both workers, that was some 300 s of CPU on two cores."""
_RAY_CLOSED: list[bool] = []


def _ray_part(context: Any) -> Any:
    if _RAY_CLOSED:
        pytest.fail(
            "the worker's Ray tests must run together: its test cluster was closed after "
            "its last one (conftest.pytest_xdist_make_scheduler keeps them together)",
            pytrace=False,
        )
    return _RAY_PARTS.enter_context(context)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    """After the worker's last Ray test (its function fixtures torn down first: their
    boxes on the node engine are gone), close its test cluster and node engine."""
    yield
    if uses_ray(item.nodeid) and (nextitem is None or not uses_ray(nextitem.nodeid)):
        _RAY_CLOSED.append(True)
        _RAY_PARTS.close()


@pytest.fixture(scope="session")
def node_engine(images: dict[str, str]) -> Iterator[Any]:
    """A Docker engine of the test cluster's nodes, with Fleet's images (see above)."""
    import shutil

    from node_engine import node_engine as start

    if shutil.which("dockerd") is None or os.geteuid() != 0:
        missing_dependency("a node engine needs dockerd and root ('fleet setup' as root)")
    first = {ref for name, ref in images.items() if name not in ON_DEMAND}
    engine = _ray_part(start(sorted(first)))
    _NODE_ENGINES.append(engine)
    _RAY_PARTS.callback(_NODE_ENGINES.remove, engine)
    try:
        yield engine
    finally:
        _RAY_PARTS.close()


@pytest.fixture
def all_images_on_nodes(node_engine: Any, images: dict[str, str]) -> None:
    """Every Fleet image on the node engine: the browser and corpus images are copied
    in by the first test that asks (see :data:`ALL_IMAGES`)."""
    node_engine.ensure(sorted(images[name] for name in ON_DEMAND))


@pytest.fixture(scope="session")
def node_client(node_engine: Any) -> Iterator[docker.DockerClient]:
    node_engine.loaded()
    client = node_engine.client()
    try:
        yield client
    finally:
        client.close()


@pytest.fixture(scope="session")
def ray_test_cluster(node_engine: Any) -> Iterator[Any]:
    """The session's Ray cluster (see ``ray_cluster``), started once."""
    import importlib.util

    if importlib.util.find_spec("ray") is None:
        missing_dependency("Ray is not installed; pip install -e '.[cluster]' (make setup does)")
    from ray_support import ray_cluster as start

    cluster = _ray_part(start(engine=node_engine))  # while the images are copied in
    node_engine.loaded()
    try:
        yield cluster
    finally:
        _RAY_PARTS.close()


@pytest.fixture
def ray_cluster(ray_test_cluster: Any, monkeypatch: pytest.MonkeyPatch) -> Any:
    """A Ray cluster on this machine: head + 2 nodes with ``fleet_slots`` on the node
    engine, token authentication on (see ``tests/ray_support.py``), started once a
    session. Its environment (``RAY_AUTH_MODE``, ``RAY_AUTH_TOKEN``, ...) is this
    process's for the test, so that Fleet, in this process or started by the test,
    reaches it. Ray missing is a skip, or a failure under CI."""
    for key, value in ray_test_cluster.env.items():
        monkeypatch.setenv(key, value)
    return ray_test_cluster


@pytest.fixture
def cleanup(docker_client: docker.DockerClient) -> Iterator[list[Path]]:
    """Run directories whose boxes are removed at teardown, whatever happened."""
    from coordinator.rundir.runs import RunDir

    roots: list[Path] = []
    yield roots
    clients = [docker_client] + [engine.client() for engine in _NODE_ENGINES]
    for root in roots:
        for run in RunDir.list(root):
            for client in clients:
                remove_run(client, run.id)
    for client in clients[1:]:
        client.close()


@pytest.fixture
def runs_dir(tmp_path: Path, docker_client: Any) -> Iterator[Path]:
    """An output directory whose runs' boxes are removed at teardown."""
    from coordinator.rundir.runs import RunDir

    out = tmp_path / "runs"
    yield out
    for run in RunDir.list(out):
        remove_run(docker_client, run.id)


def remove_run(client: docker.DockerClient, rid: str) -> None:
    """Remove every container, then every network, labelled ``fleet.run=<rid>``."""
    import docker.errors

    from sandbox.docker.engine import remove_box

    selector = {"label": f"fleet.run={rid}"}
    for container in client.containers.list(all=True, filters=selector):
        remove_box(client, container.id)  # waits out an engine slow to answer
    for network in client.networks.list(filters=selector):
        try:
            network.remove()
        except docker.errors.NotFound:
            pass
