"""What a repository's setup may say: a command, the hosts it may reach, a wheelhouse,
secrets for it alone, a time limit, the files its result depends on, and a refresh.

The model is the peers' one (Codex cloud environments, Claude's managed environments):
a setup runs once, with network, and the agent works offline in what it left; a cached
result is brought up to date by a short offline ``refresh`` instead of a new setup.
Fleet's setup differs in where its network goes: only to the ``allow`` hosts, through
the run's egress proxy, which refuses every other name and every private, loopback and
link-local address (:mod:`sandbox.inbox.egress_proxy`).

Checks that read the host (the wheelhouse exists, each secret is set) belong to the
job boundary (:mod:`coordinator.job.spec`), not to this model: a spec shipped to a
cluster node is the same spec there, whatever that node's environment holds.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import ClassVar

from pydantic import Field, field_validator

from ..spec import NetworkPolicy, _Strict, check_hosts

AUTO = "auto"
"""``setup = "auto"``: :data:`AUTO_COMMAND`, Fleet's default for a Python project."""
AUTO_COMMAND = (
    "set -e; python3 -m venv --system-site-packages .venv; "
    "for f in requirements*.txt requirements/*.txt; do "
    'if [ -f "$f" ]; then .venv/bin/pip install -r "$f"; fi; done; '
    "if [ -f pyproject.toml ] || [ -f setup.py ]; then .venv/bin/pip install -e '.[test]'; fi"
)
"""A virtualenv in ``/workspace/.venv`` that sees the image's packages (pytest), every
requirements file installed into it, then the project itself, editable, with its
``test`` extra (pip warns and goes on when there is none). Members find it first on their ``PATH`` (the snapshot says so)."""
DEFAULT_KEY_FILES: tuple[str, ...] = (
    "pyproject.toml",
    "setup.py",
    "setup.cfg",
    "requirements*.txt",
    "requirements/*.txt",
    "constraints*.txt",
    "Pipfile",
    "Pipfile.lock",
    "poetry.lock",
    "uv.lock",
    "pdm.lock",
    "package.json",
    "package-lock.json",
    "yarn.lock",
    "pnpm-lock.yaml",
)
"""Files of a repository (relative glob patterns) whose content is part of a setup's
key by default: its dependency manifests and lock files. A source file is not, so
editing code never sets up again."""
_SECRET_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,127}$")
_RESERVED_ENV = re.compile(r"^(PATH|HOME|FLEET_.*|PIP_FIND_LINKS|.*_PROXY|.*_proxy)$")
MIN_TIMEOUT_S = 1.0
MAX_TIMEOUT_S = 4 * 3600.0


class SetupSpec(_Strict):
    """A coding member's setup: run once per key in a box of the member's image,
    runtime and limits, from ``/workspace`` holding the repository; its result is the
    box members start from."""

    _EXAMPLE: ClassVar[str] = "SetupSpec(run='pip install -e .', allow=('pypi.org',))"

    run: str = Field(max_length=20_000)
    """The command (a shell string), or ``auto`` (:data:`AUTO_COMMAND`)."""
    allow: tuple[str, ...] = ()
    """Hosts the setup may reach (``pypi.org``, ``files.pythonhosted.org``), through the
    run's egress proxy; none: the setup has no network at all."""
    wheels: str | None = None
    """A host directory mounted read-only at ``/wheels`` for the setup, with
    ``PIP_FIND_LINKS`` pointing there: installs from a wheelhouse, offline."""
    secrets: tuple[str, ...] = ()
    """Names of host environment variables handed to the setup's command alone (a
    private index's token): never in the snapshot, its image, a log or a trace."""
    timeout_s: float = Field(default=900.0, ge=MIN_TIMEOUT_S, le=MAX_TIMEOUT_S)
    """Longest the setup command may run; past it the setup failed."""
    key_files: tuple[str, ...] = ()
    """More files (relative glob patterns) whose content the result depends on, beyond
    :data:`DEFAULT_KEY_FILES`."""
    refresh: str | None = Field(default=None, max_length=20_000)
    """A command run offline in each member's box after the repository is laid over
    the prepared tree (``pip install --no-deps -e .``), before the member starts."""

    @field_validator("run")
    @classmethod
    def _command(cls, v: str) -> str:
        if not v.strip():
            raise ValueError("the setup command is empty; write e.g. 'pip install -e .' or 'auto'")
        return v.strip()

    @field_validator("refresh")
    @classmethod
    def _refresh(cls, v: str | None) -> str | None:
        if v is not None and not v.strip():
            raise ValueError("the refresh command is empty; leave 'refresh' out instead")
        return v.strip() if v is not None else None

    @field_validator("allow")
    @classmethod
    def _hosts(cls, v: tuple[str, ...]) -> tuple[str, ...]:
        # One rule with every other allowlist: the proxy's own refusals and host shape.
        return check_hosts(v)

    @field_validator("secrets")
    @classmethod
    def _secret_names(cls, v: tuple[str, ...]) -> tuple[str, ...]:
        for name in v:
            if not _SECRET_RE.match(name):
                raise ValueError(f"{name!r} is not an environment variable name")
            if _RESERVED_ENV.match(name):
                raise ValueError(f"{name!r} is set by Fleet for the setup; name another variable")
        if len(set(v)) != len(v):
            raise ValueError("a secret is named twice")
        return v

    @field_validator("key_files")
    @classmethod
    def _patterns(cls, v: tuple[str, ...]) -> tuple[str, ...]:
        for pattern in v:
            parts = pattern.split("/")
            if not pattern or pattern.startswith("/") or any(p in ("", ".", "..") for p in parts):
                raise ValueError(
                    f"{pattern!r} is not a relative file pattern in the repository "
                    "(e.g. 'environment.yml' or 'requirements/*.in')"
                )
        return v

    @property
    def command(self) -> str:
        """The shell command that runs: :data:`AUTO_COMMAND` for ``auto``."""
        return AUTO_COMMAND if self.run == AUTO else self.run

    @property
    def network(self) -> NetworkPolicy:
        """The setup box's network: the ``allow`` hosts through the proxy, or none."""
        if not self.allow:
            return NetworkPolicy()
        return NetworkPolicy(egress="allowlist", allow=self.allow)


@dataclass
class PreparedInfo:
    """One prepared snapshot on an engine, as ``fleet sandbox prepared`` lists it."""

    key: str
    ref: str
    """The engine's reference (an image id on Docker)."""
    size: int
    """Bytes of its own (the tree it adds to its base image)."""
    created: float
    last_used: float
    setup: str
    """The setup command that made it."""
    base: str
    """The image it was made from."""
