"""Kinds know themselves: the coordinator asks a kind's traits, never branches on its name.

A job may name any kind that runs in a box - the built-in ``browser`` and ``coding``, or
one a program registered - and what a member of it needs (its box, whether it returns a
patch, whether it reads the web) comes from the kind. Asking costs no import of the
kind's module: a browser kind's brings Playwright with it.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from pydantic import BaseModel

import coordinator as fleet
from coordinator.job.spec import Job, MemberJob
from coordinator.nodes.capacity import job_boxes
from coordinator.nodes.prewarm import _first_wave
from coordinator.runner.preflight import needed_images
from subagents import kinds
from subagents.kinds import BUILTIN_TRAITS, Kind, get_kind, kind_is, member_kinds, trait

ROOT = Path(__file__).resolve().parent.parent


class _Notes(BaseModel):
    notes: str


@pytest.fixture(autouse=True)
def only_built_in_kinds() -> Iterator[None]:
    """The registry as a fresh process has it: other tests in this worker register
    kinds of their own (and keep them), which every list here would name."""
    others = {n: k for n, k in kinds._KINDS.items() if n not in BUILTIN_TRAITS}
    for name in others:
        del kinds._KINDS[name]
    try:
        yield
    finally:  # built-in kinds registered meanwhile stay: their modules are imported
        for name in [n for n in kinds._KINDS if n not in BUILTIN_TRAITS]:
            del kinds._KINDS[name]
        kinds._KINDS.update(others)


@pytest.fixture
def reviewer() -> Iterator[Kind]:
    """A kind of the program's own: it works on a repository in a coding box."""
    kind = kinds.register_kind(
        Kind(
            name="reviewer",
            system_prompt="Review the repository.",
            tools=lambda settings: [],
            result_model=_Notes,
            box_kind="coding",
            returns_patch=True,
        )
    )
    try:
        yield kind
    finally:
        kinds._KINDS.pop("reviewer", None)


def test_the_built_in_kinds_are_built_from_the_traits_they_are_asked_for() -> None:
    for name, traits in BUILTIN_TRAITS.items():
        kind = get_kind(name)
        for which in ("box_kind", "needs_box", "returns_patch", "reads_web", "todos", "file_tools"):
            assert trait(name, which) == getattr(kind, which), (name, which)
        assert set(traits) <= {"box_kind", "needs_box", "returns_patch", "reads_web", "todos",
                               "file_tools"}  # fmt: skip


def test_asking_a_kind_imports_no_kinds_module_and_no_playwright() -> None:
    # The early boxes are chosen from the job file's text as the process starts: what
    # they ask of the kinds must not cost the import of a kind's tools.
    code = (
        "import sys\n"
        "from subagents.kinds import trait, kind_is, member_kinds\n"
        "from coordinator.nodes.prewarm import _first_wave\n"
        "assert trait('browser', 'box_kind') == 'browser' and kind_is('browser', 'reads_web')\n"
        "assert not kind_is('browser', 'returns_patch') and kind_is('coding', 'returns_patch')\n"
        "assert member_kinds() == ['browser', 'coding']\n"
        "raw = {'name': 'j', 'members': [{'kind': 'coding'}, {'kind': 'browser'}]}\n"
        "assert [b.kind for b in _first_wave(raw)[1]] == ['coding', 'browser']\n"
        "print(sorted(m for m in sys.modules if m.startswith(('subagents.kinds.', 'playwright',"
        " 'subagents.tools', 'subagents.durable'))))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"


def test_a_job_names_only_kinds_with_a_box_and_says_which_there_are() -> None:
    with pytest.raises(fleet.JobError) as refused:
        MemberJob(kind="lead", task="t")  # the lead is a run's own, never a member
    assert "kind: 'lead' is not allowed; input should be 'browser' or 'coding'" in str(
        refused.value
    )
    with pytest.raises(fleet.JobError, match="'reviewer' is not allowed"):
        MemberJob(kind="reviewer", task="t")
    with pytest.raises(fleet.JobError) as huge:
        MemberJob(kind="x" * 1_000_000, task="t")  # named back, not printed back whole
    assert len(str(huge.value)) < 500 and "(1,000,000 characters)" in str(huge.value)
    with pytest.raises(KeyError, match="'box' is not a trait"):
        trait("coding", "box")
    assert not kind_is("no-such-kind", "returns_patch")  # a newer Fleet's run, read here


def test_a_registered_kind_is_asked_like_a_built_in_one(reviewer: Kind) -> None:
    assert member_kinds() == ["browser", "coding", "reviewer"]
    member = MemberJob(kind="reviewer", task="Review it.", repo=".", test="true")
    assert member.kind == "reviewer"
    with pytest.raises(fleet.JobError, match="'browser', 'coding' or 'reviewer'"):
        MemberJob(kind="auditor", task="t")
    # Its box, its images, its place in a merge come from its traits.
    job = Job(name="j", members=[member])
    assert [b.kind for b in job_boxes(job)] == ["coding"]
    assert needed_images(job) == ["coding"]
    # Fields for members that work on a repository are its too; a browser's are not.
    with pytest.raises(fleet.JobError, match="'repo' is only for coding members"):
        MemberJob(kind="browser", task="t", repo=".")


def test_early_boxes_follow_the_kinds_box_and_skip_what_no_kind_names() -> None:
    raw = {
        "name": "j",
        "fanout": {"max_parallel": 4},
        "research": {"question": "q", "members": 2},
        "members": [
            {"kind": "coding", "task": "t"},
            {"kind": "browser", "task": "t"},
            {"kind": "lead", "task": "t"},  # refused by the job's check later: no box now
            {"kind": "nonsense", "task": "t"},
            {"kind": ["not", "a", "name"], "task": "t"},
        ],
    }
    name, boxes, first = _first_wave(raw)
    assert name == "j"
    assert boxes == []  # max_parallel is the job's own: nothing to choose
    assert [e.spec.kind for e in first] == ["coding"]
    del raw["fanout"]
    _, boxes, first = _first_wave(raw)
    assert sorted(b.kind for b in boxes) == ["browser", "browser", "browser", "coding"]
    assert [e.spec.kind for e in first] == ["coding"]
