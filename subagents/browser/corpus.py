"""Start the offline research corpus as a service box on a run's network.

The corpus (``fleet-corpus``, served by ``images/corpus/corpus_server.py``) answers
on the run network as ``corpus:8080``; browser members reach it through their egress proxy
like any allowlisted site, with :data:`CORPUS_ALLOW` on their allowlist and
:data:`~subagents.browser.config.DEFAULT_SEARCH_URL` as their search page.
"""

from __future__ import annotations

import anyio

from sandbox.base import Sandbox, SandboxBackend
from sandbox.docker.boxops import probe, probe_client, probe_failed
from sandbox.docker.firewall import SERVICE_PORT
from sandbox.errors import SandboxUnavailable
from sandbox.spec import SandboxSpec

CORPUS_MEMBER = "corpus"
CORPUS_PORT = SERVICE_PORT
"""A service box's port: the only one the run's proxies may open to it."""
CORPUS_ALLOW = f"{CORPUS_MEMBER}:{CORPUS_PORT}"
"""The allowlist entry that lets a browser box reach the corpus."""


async def start_corpus(
    backend: SandboxBackend,
    run: str,
    *,
    image: str | None = None,
    member: str = CORPUS_MEMBER,
    ready_timeout_s: float = 30.0,
) -> Sandbox:
    """Create the corpus service box and return it once its search page answers."""
    if image is None:
        from sandbox.images.catalog import image_ref

        image = await anyio.to_thread.run_sync(image_ref, "corpus")
    spec = SandboxSpec(kind="service", image=image, memory="512m", cpus=0.5)
    box = await backend.create(spec, run=run, member=member)
    try:
        await wait_ready(box, ready_timeout_s)
    except BaseException:
        with anyio.CancelScope(shield=True):
            await box.close()
        raise
    return box


async def wait_ready(box: Sandbox, timeout_s: float) -> None:
    """Poll ``/healthz`` of the corpus box from the host (by its run-network address;
    :func:`sandbox.docker.boxops.probe`)."""
    ip = getattr(box, "ip", None)
    if not ip:
        raise SandboxUnavailable(f"corpus box {box.name} has no address on the run network")
    url = f"http://{ip}:{CORPUS_PORT}/healthz"
    last = ""
    with anyio.move_on_after(timeout_s):
        async with probe_client() as client:
            while True:
                try:
                    if (await probe(client, url))[0] == 200:
                        return
                except probe_failed() as exc:
                    last = type(exc).__name__
                await box.check()
                await anyio.sleep(0.1)
    raise SandboxUnavailable(
        f"the corpus in box {box.name} did not answer {url} within {timeout_s:g}s ({last}); "
        f"see 'docker logs {box.name}'"
    )
