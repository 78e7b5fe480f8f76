"""Typed sandbox specs: what a box is allowed to be and do.

Policy lives here as data (limits, user, network, read-only root), never as code
paths in a backend: a backend reads a :class:`SandboxSpec` and applies all of it.
"""

from __future__ import annotations

import re
from typing import ClassVar, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)

from .errors import SandboxSpecError
from .inbox.egress_rules import entry_refusal
from .strict import Strict

BoxKind = Literal["coding", "browser", "service"]
Runtime = Literal["runc", "gvisor"]

_HOST_RE = re.compile(
    r"^(\*\.)?[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?(\.[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?)*(:\d{1,5})?$"
)
SHM_BYTES = 64 * 1024 * 1024
"""Size of a box's ``/dev/shm`` (Docker's default, set explicitly so the limit counts it)."""
_SIZE_RE = re.compile(r"^\d+(\.\d+)?[kmgKMG]?$")

# Docker's image reference grammar (distribution/reference): [domain/]path[:tag][@digest].
_PATH_PART = re.compile(r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*")
_DOMAIN = re.compile(
    r"[a-zA-Z0-9](?:[a-zA-Z0-9-]*[a-zA-Z0-9])?(?:\.[a-zA-Z0-9](?:[a-zA-Z0-9-]*[a-zA-Z0-9])?)*"
    r"(?::[0-9]+)?"
)
_TAG = re.compile(r"\w[\w.-]{0,127}", re.ASCII)
_DIGEST = re.compile(r"[A-Za-z][A-Za-z0-9]*(?:[-_+.][A-Za-z][A-Za-z0-9]*)*:[0-9a-fA-F]{32,}")
_IMAGE_ID = re.compile(r"sha256:[0-9a-f]{64}")


def image_reference_problem(ref: str) -> str | None:
    """Why ``ref`` is not a plain image reference (``name[:tag][@digest]`` or an image
    id), or None. Plain only: a reference is handed to the engine as a name, so
    anything else (spaces, options, upper case) fails there, box after box."""
    if _IMAGE_ID.fullmatch(ref):
        return None
    name, at, digest = ref.partition("@")
    slash, colon = name.rfind("/"), name.rfind(":")
    tag = None
    if colon > slash:
        name, tag = name[:colon], name[colon + 1 :]
    parts = name.split("/")
    if len(parts) > 1 and ("." in parts[0] or ":" in parts[0] or parts[0] == "localhost"):
        domain, parts = parts[0], parts[1:]
        if not _DOMAIN.fullmatch(domain):
            return f"{domain!r} is not a registry host"
    if len(name) > 255 or not all(_PATH_PART.fullmatch(p) for p in parts):
        return "the name must be lowercase letters and digits separated by '/', '.', '_' or '-'"
    if tag is not None and not _TAG.fullmatch(tag):
        return f"{tag!r} is not a tag (letters, digits, '_', '.', '-'; at most 128)"
    if at and not _DIGEST.fullmatch(digest):
        return f"{digest!r} is not a digest (sha256:<hex>)"
    return None


def check_image_reference(ref: str | None) -> str | None:
    """A field validator's body: ``ref`` unchanged, or ``ValueError`` saying what is wrong."""
    if ref is None:
        return None
    why = image_reference_problem(ref)
    if why:
        raise ValueError(
            f"{ref!r} is not a plain image reference: {why}; write name[:tag], "
            "e.g. 'python:3.12-slim' or 'registry.example.org/team/tools:1.4'"
        )
    return ref


def parse_size(text: str | int) -> int:
    """Bytes from ``"512m"``, ``"1g"``, ``"64k"`` or a plain integer."""
    if isinstance(text, int):
        return text
    t = text.strip().lower()
    mult = {"k": 1024, "m": 1024**2, "g": 1024**3}.get(t[-1:], 1)
    num = t[:-1] if t[-1:] in "kmg" else t
    return int(float(num) * mult)


def spec_error(model: type[BaseModel], exc: ValidationError) -> SandboxSpecError:
    """One paragraph naming every bad field, what was wrong, and the fields there are.

    ``problems`` on the error keeps ``(field, message)`` pairs for callers that render
    their own (the job-file reader).
    """
    problems: list[tuple[str, str]] = []
    got: dict[str, str] = {}
    for err in exc.errors():
        where = ".".join(str(p) for p in err["loc"]) or model.__name__
        inner = (err.get("ctx") or {}).get("error")
        if isinstance(inner, SandboxSpecError) and inner.problems:
            problems += [(f"{where}.{w}", m) for w, m in inner.problems]  # a nested model's
            got.update({f"{where}.{w}": g for w, g in inner.got.items()})
        elif err["type"] == "extra_forbidden":
            problems.append((where, f"not a field of {model.__name__}"))
        else:
            msg = err["msg"].removeprefix("Value error, ")
            problems.append((where, msg))
            got[where] = repr(err.get("input"))
    text = "; ".join(f"{w}: {m}" + (f" (got {got[w]})" if w in got else "") for w, m in problems)
    known = ", ".join(model.model_fields)
    example = getattr(model, "_EXAMPLE", "")
    return SandboxSpecError(
        f"invalid {model.__name__}: {text}. Its fields: {known}; e.g. {example}.",
        problems=problems,
        got=got,
    )


def check_hosts(hosts: tuple[str, ...]) -> tuple[str, ...]:
    """An allowlist's entries, lower case; ``ValueError`` for one that is not a host
    name or that the egress proxy would refuse every time."""
    out = []
    for host in hosts:
        h = host.strip().lower()
        # First the proxy's own rule (it would refuse this host every time), which
        # also says what an address in disguise (0x7f000001, a@b, [::1]) really is.
        why = entry_refusal(h)
        if why:
            raise ValueError(
                f"{host!r} can never be reached: {why}; list a host the boxes may reach, "
                "e.g. 'docs.python.org' or 'corpus:8080'"
            )
        if not _HOST_RE.match(h):
            raise ValueError(
                f"{host!r} is not a host name; write e.g. 'docs.python.org' or 'corpus:8080'"
            )
        out.append(h)
    return tuple(out)


class _Strict(Strict):
    """Direct construction raises :class:`SandboxSpecError` (a ``ValueError``), not
    pydantic's multi-line error, so API users get the same one paragraph as the CLI."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    @classmethod
    def _invalid(cls, exc: ValidationError) -> Exception:
        return spec_error(cls, exc)


class NetworkPolicy(_Strict):
    """Where a box may connect to."""

    _EXAMPLE: ClassVar[str] = "NetworkPolicy(egress='allowlist', allow=('docs.python.org',))"

    egress: Literal["none", "allowlist"] = "none"
    """``none``: no network at all. ``allowlist``: the box sits on its run's internal
    network and reaches only the hosts in ``allow`` (through the run's egress proxy)."""
    allow: tuple[str, ...] = ()
    """Host names (optionally ``:port``, or ``*.example.org``) the box may reach."""

    @field_validator("allow")
    @classmethod
    def _hosts_are_names(cls, v: tuple[str, ...]) -> tuple[str, ...]:
        return check_hosts(v)

    @model_validator(mode="after")
    def _allow_needs_allowlist(self) -> NetworkPolicy:
        if self.egress == "none" and self.allow:
            raise ValueError("'allow' lists hosts but egress is 'none'; set egress = 'allowlist'")
        return self


class SandboxSpec(_Strict):
    """One box: image, limits, user, filesystem and network policy.

    Defaults are the secure ones: 1 CPU, 1 GiB memory, 256 pids, read-only root,
    tmpfs ``/tmp``, a size-limited ``/workspace``, no network. Invalid input raises
    :class:`~sandbox.errors.SandboxSpecError`.
    """

    _EXAMPLE: ClassVar[str] = "SandboxSpec(kind='coding', cpus=1.0, memory='1g', pids=256)"

    kind: BoxKind = "coding"
    """What the box is for; picks the default image and how the box is started."""
    image: str | None = None
    """Image reference; ``None`` means Fleet's own image for ``kind``."""
    cpus: float = Field(default=1.0, gt=0, le=64)
    """CPU quota in cores."""
    memory: str = "1g"
    """Memory for the box's programs (``512m``, ``1g``); swap is not added on top. The
    box's memory limit is this plus what ``/tmp``, ``/workspace`` and ``/dev/shm`` can
    hold (:attr:`box_memory_bytes`), so a full disk is a full disk, not an OOM kill."""
    pids: int = Field(default=256, ge=16, le=65536)
    """Maximum number of processes and threads in the box."""
    tmpfs_size: str = "256m"
    """Size of the tmpfs mounted on ``/tmp``."""
    workspace_size: str = "1g"
    """Size limit of the writable ``/workspace``."""
    env: dict[str, str] = Field(default_factory=dict)
    """Extra environment for every command (never put secrets here)."""
    workdir: str = "/workspace"
    """Default working directory of ``exec``."""
    network: NetworkPolicy = NetworkPolicy()
    """Egress policy; browser boxes need ``egress='allowlist'``."""
    labels: dict[str, str] = Field(default_factory=dict)
    """Extra labels; ``fleet.*`` labels are set by Fleet and cannot be given here."""
    ttl_s: float = Field(default=3600.0, gt=0)
    """Seconds after creation after which ``fleet sandbox gc`` may remove the box."""
    output_limit: int = Field(default=1024 * 1024, ge=1024)
    """Bytes kept per output stream of one ``exec`` (head and tail kept)."""
    keep: bool = False
    """Keep the box after its owner ends, for debugging (``gc`` still removes it)."""
    runtime: Runtime = "runc"
    """The box's OCI runtime: ``runc`` (the host kernel, behind seccomp) or ``gvisor``
    (gVisor's user-space kernel between the box and the host; see :mod:`sandbox.docker.gvisor`)."""
    prepared: str | None = None
    """A prepared snapshot (:mod:`sandbox.prepared`): the box starts from it, its tree
    copied into ``/workspace`` before the box is handed out."""
    wheels: str | None = None
    """A host directory mounted read-only at ``/wheels`` (a setup box's wheelhouse);
    nothing else of the host is ever mounted."""

    @field_validator("memory", "tmpfs_size", "workspace_size")
    @classmethod
    def _size(cls, v: str) -> str:
        if not _SIZE_RE.match(v.strip()):
            raise ValueError(f"{v!r} is not a size; write e.g. '512m' or '1g'")
        if parse_size(v) < 4 * 1024 * 1024:
            raise ValueError(f"{v!r} is too small; at least '4m'")
        return v.strip().lower()

    @field_validator("image")
    @classmethod
    def _image(cls, v: str | None) -> str | None:
        return check_image_reference(v)

    @field_validator("prepared")
    @classmethod
    def _prepared(cls, v: str | None) -> str | None:
        return check_image_reference(v)

    @field_validator("wheels")
    @classmethod
    def _wheels(cls, v: str | None) -> str | None:
        if v is not None and not v.startswith("/"):
            raise ValueError(f"wheels {v!r} must be an absolute host path")
        return v

    @field_validator("labels")
    @classmethod
    def _no_reserved_labels(cls, v: dict[str, str]) -> dict[str, str]:
        bad = [k for k in v if k.startswith("fleet.")]
        if bad:
            raise ValueError(f"labels {bad} use the reserved 'fleet.' prefix")
        return v

    @field_validator("workdir")
    @classmethod
    def _abs_workdir(cls, v: str) -> str:
        if not v.startswith("/"):
            raise ValueError(f"workdir {v!r} must be an absolute path such as '/workspace'")
        return v

    @property
    def pool_key(self) -> str:
        """Boxes of equal specs are interchangeable: the key of a warm pool, of a
        node's pooled boxes and of a prewarmed box (one definition for all three)."""
        return self.model_dump_json()

    @property
    def memory_bytes(self) -> int:
        return parse_size(self.memory)

    @property
    def box_memory_bytes(self) -> int:
        """The box's memory limit: ``memory`` for programs plus the size of every tmpfs
        mount (their pages are charged as memory; see :mod:`sandbox.docker.container`)."""
        tmpfs = parse_size(self.tmpfs_size) + parse_size(self.workspace_size) + SHM_BYTES
        return self.memory_bytes + tmpfs
