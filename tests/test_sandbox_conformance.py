"""What every :class:`~sandbox.base.Sandbox` must do: one suite, run over each of them.

The contract (``sandbox/base.py``) in checks: commands (exit codes, output, timeouts,
output caps, programs that cannot start, cwd, environment, stdin, concurrent calls,
processes left behind), files (round trips, modes, limits, paths outside the box's
roots, directories), trees in and out, and the life of a box (check, close, a box
removed under it). A new backend is done when it passes them: add it to ``VARIANTS``.

The variants: the Docker box under ``runc`` and under gVisor (``runsc``), the
deferred box (``sandbox/deferred.py``, what a member holds while its box starts) in
front of a Docker box it is given only after the first call is waiting, and the
in-memory test box (``tests/memory_box.py``), which runs no process: the checks it
cannot keep are named in :data:`MEMORY_EXCLUDED`, each with its reason, and are not
generated for it (``pytest_generate_tests``); a test holds that list to checks that
exist and to the reasons the fake gives.

The Docker variants share one box per runtime for the module (:data:`OWN_BOX` names
the checks that end theirs and get their own), emptied and checked alive before each
check: a box's start and removal cost more than most checks (76.6 s of the module's
time with a box per check, 21 s shared).
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest
from conftest import missing_dependency
from memory_box import MemoryBox

from sandbox.base import Sandbox
from sandbox.deferred import DeferredSandbox
from sandbox.docker import gvisor
from sandbox.docker.backend import DockerBackend
from sandbox.errors import (
    OutputLimitExceeded,
    PathRefused,
    SandboxClosed,
    SandboxCrashed,
    SandboxSpecError,
)
from sandbox.spec import SandboxSpec

pytestmark = [pytest.mark.docker, pytest.mark.anyio]

VARIANTS = ["runc", "gvisor", "deferred", "memory"]

_NO_PROCESS = "MemoryBox runs no process"
_NO_SHELL = "MemoryBox has no shell"
MEMORY_EXCLUDED: dict[str, str] = {
    "test_exec_runs_a_shell_string_with_pipes_and_keeps_the_exit_code": f"{_NO_SHELL}: a pipe",
    "test_a_timeout_returns_124_with_the_output_so_far": f"{_NO_PROCESS}: nothing runs long",
    "test_a_timeout_ends_the_whole_process_group": f"{_NO_PROCESS}: no process group",
    "test_output_over_the_cap_keeps_its_head_and_tail": f"{_NO_SHELL}: a list of commands",
    "test_exec_takes_cwd_environment_and_stdin": f"{_NO_SHELL}: expansions and a pipe to od",
    "test_commands_run_at_the_same_time": f"{_NO_PROCESS}: a shell loop waiting for another",
    "test_processes_a_command_leaves_running_are_ended_and_counted": f"{_NO_PROCESS}: no setsid",
    "test_a_command_killed_by_a_signal_is_128_plus_n": f"{_NO_PROCESS}: no signals",
    "test_a_write_the_user_may_not_make_is_permission_error_and_leaves_nothing": (
        f"{_NO_SHELL}: chmod in a list; and it has no users to refuse a write"
    ),
    "test_list_dir_is_sorted_with_each_entrys_type": f"{_NO_SHELL}: ln -s in a list",
    "test_an_environment_given_to_one_command_is_not_kept_for_the_next": (
        f"{_NO_SHELL}: a parameter expansion"
    ),
}
"""Checks the in-memory box is not held to, with why: each needs a process, a signal or
a shell, none of which a box of dicts has (``tests/memory_box.py``)."""


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """Every check over every variant, but the in-memory box's exclusions."""
    if "box" in metafunc.fixturenames:
        excluded = metafunc.function.__name__ in MEMORY_EXCLUDED
        variants = [v for v in VARIANTS if not (v == "memory" and excluded)]
        metafunc.parametrize("box", variants, indirect=True)


@pytest.fixture(scope="module")
def anyio_backend() -> str:
    return "asyncio"


OWN_BOX = {
    "test_a_box_removed_under_its_user_raises_crashed_not_an_engine_error",
    "test_close_is_idempotent_and_a_closed_box_refuses_calls",
}
"""Checks that end their box: each gets one of its own. The others share one Docker box
per runtime for the module, its ``/workspace`` and ``/tmp`` emptied before each check
and its liveness checked (a box's start and removal cost more than most checks), so
each still starts from an empty box of its own as far as it can see."""

EMPTY = (
    "chmod -R u+w /workspace /tmp 2>/dev/null; "
    "rm -rf /workspace/..?* /workspace/.[!.]* /workspace/* /tmp/..?* /tmp/.[!.]* /tmp/*; "
    '[ -z "$(ls -A /workspace)" ] && [ -z "$(ls -A /tmp)" ]'
)
"""Empties the shared box's writable roots; fails when anything is left."""


class _Shared:
    """The module's Docker boxes, one per runtime, made when first asked for."""

    def __init__(self, run: str) -> None:
        self.run = run
        self.boxes: dict[str, Sandbox] = {}

    async def get(self, runtime: str, backend: DockerBackend) -> Sandbox:
        made = self.boxes.get(runtime)
        if made is not None and made.looks_alive():
            try:
                await made.check()
                emptied = await made.exec(["sh", "-c", EMPTY], cwd="/")
                assert emptied.ok, emptied  # a check left what the next one would see
                return made
            except SandboxCrashed:
                pass
        if made is not None:
            await made.close()
        spec = SandboxSpec(runtime="gvisor") if runtime == "gvisor" else SandboxSpec()
        made = await backend.create(spec, run=self.run, member=f"conf-{runtime}")
        self.boxes[runtime] = made
        return made


@pytest.fixture(scope="module")
def shared(docker_client: Any) -> Iterator[_Shared]:
    """The module's shared boxes (a plain fixture: :func:`box` asks for it by name, which
    an async one cannot be); removed with their run at the module's end."""
    from conftest import remove_run

    from sandbox.docker.reaper import mark_done, mark_live

    held = _Shared(f"test-{uuid.uuid4().hex[:12]}")
    mark_live(held.run)
    try:
        yield held
    finally:
        remove_run(docker_client, held.run)
        mark_done(held.run)


@pytest.fixture
async def box(request: pytest.FixtureRequest) -> AsyncIterator[Sandbox]:
    variant = request.param
    if variant == "memory":
        memory = MemoryBox()
        try:
            yield memory
        finally:
            await memory.close()
        return
    docker_client = request.getfixturevalue("docker_client")
    images = request.getfixturevalue("images")
    if variant == "gvisor" and gvisor.missing_runtimes(docker_client.info()):
        missing_dependency("the engine lacks Fleet's gVisor runtimes; run 'fleet setup --gvisor'")
    backend = DockerBackend(docker_client, images=images)
    runtime = "gvisor" if variant == "gvisor" else "runc"
    spec = SandboxSpec(runtime=runtime)
    own = request.function.__name__ in OWN_BOX
    if own:
        made = await backend.create(
            spec, run=request.getfixturevalue("run_id"), member=f"conf-{variant}"
        )
    else:
        held = request.getfixturevalue("shared")
        made = await held.get(runtime, backend)
    try:
        if variant == "deferred":
            deferred = DeferredSandbox(spec, "conf")
            async with anyio.create_task_group() as tg:

                async def give() -> None:
                    await anyio.sleep(0.05)  # the first call below is waiting by then
                    deferred.set(made)

                tg.start_soon(give)
                assert (await deferred.exec("echo up")).stdout == "up\n"
            yield deferred
        else:
            yield made
    finally:
        if own:
            await made.close()


def remove_under(box: Sandbox, docker_client: Any) -> None:
    """Take the box away from under its user: its container removed, or a MemoryBox's
    dicts dropped as a box that died drops them."""
    if isinstance(box, MemoryBox):
        box.crashed = True
    else:
        docker_client.api.remove_container(box.id, force=True)


# ------------------------------------------------------------------ exec


async def test_exec_runs_an_argv_list_without_a_shell(box: Sandbox) -> None:
    res = await box.exec(["printf", "%s|", "a b", "$HOME", ";"])
    assert (res.exit_code, res.stdout, res.stderr) == (0, "a b|$HOME|;|", "")
    assert res.ok and not res.timed_out and not res.truncated


async def test_exec_runs_a_shell_string_with_pipes_and_keeps_the_exit_code(box: Sandbox) -> None:
    res = await box.exec("echo one two | wc -w; echo err >&2; exit 3")
    assert (res.exit_code, res.stdout.strip(), res.stderr) == (3, "2", "err\n")
    assert not res.ok


async def test_a_timeout_returns_124_with_the_output_so_far(box: Sandbox) -> None:
    res = await box.exec("echo started; sleep 30; echo never", timeout=1)
    assert res.timed_out and res.exit_code == 124
    assert res.stdout == "started\n"


async def test_a_timeout_ends_the_whole_process_group(box: Sandbox) -> None:
    res = await box.exec("(sleep 311 &); sleep 312 & sleep 313", timeout=1)
    assert res.timed_out
    left = await box.exec("ps -eo args | grep 'sleep 31[123]' || true")
    assert left.stdout == "", left.stdout


async def test_output_over_the_cap_keeps_its_head_and_tail(box: Sandbox) -> None:
    res = await box.exec("echo HEAD; seq 1 200000; echo TAIL", output_limit=4096)
    assert res.truncated and res.exit_code == 0
    assert res.stdout.startswith("HEAD\n") and res.stdout.rstrip().endswith("TAIL")
    assert len(res.stdout.encode()) < 3 * 4096


async def test_a_missing_program_is_127_naming_it_as_argv_and_as_a_string(box: Sandbox) -> None:
    for cmd in (["no-such-program-x", "a"], "no-such-program-x a"):
        res = await box.exec(cmd)
        assert res.exit_code == 127, (cmd, res)
        assert "no-such-program-x" in res.stderr


async def test_a_file_that_is_not_executable_is_126_permission_denied(box: Sandbox) -> None:
    await box.write_file("notexec.sh", "echo hi\n", mode=0o644)
    res = await box.exec(["./notexec.sh"])
    assert res.exit_code == 126 and "Permission denied" in res.stderr, res


async def test_a_directory_as_the_program_is_126(box: Sandbox) -> None:
    await box.exec(["mkdir", "-p", "adir"])
    res = await box.exec(["./adir"])
    assert res.exit_code == 126, res


async def test_an_executable_with_no_shebang_runs_with_sh(box: Sandbox) -> None:
    await box.write_file("plain", "echo from-sh\n", mode=0o755)
    res = await box.exec(["./plain"])
    assert (res.exit_code, res.stdout) == (0, "from-sh\n"), res


async def test_exec_takes_cwd_environment_and_stdin(box: Sandbox) -> None:
    res = await box.exec("pwd; echo $FLEET_X; cat", cwd="/tmp", env={"FLEET_X": "x1"}, stdin="in")
    assert res.stdout == "/tmp\nx1\nin"
    raw = await box.exec(["od", "-An", "-tx1"], stdin=b"\x00\xff")
    assert raw.stdout.split() == ["00", "ff"]


async def test_the_default_cwd_is_the_workdir(box: Sandbox) -> None:
    assert (await box.exec("pwd")).stdout == f"{box.spec.workdir}\n"


async def test_output_that_is_not_utf8_is_replaced_not_raised(box: Sandbox) -> None:
    res = await box.exec(["printf", "a\\377b"])
    assert res.exit_code == 0 and res.stdout == "a\ufffdb"


async def test_commands_run_at_the_same_time(box: Sandbox) -> None:
    """Each waits for the other's file: only concurrent calls can both finish."""
    wait = "touch /tmp/{0}; i=0; while [ ! -e /tmp/{1} ] && [ $i -lt 400 ]; do sleep 0.05; i=$((i+1)); done; [ -e /tmp/{1} ]"
    results: dict[str, int] = {}

    async def one(mine: str, other: str) -> None:
        results[mine] = (await box.exec(wait.format(mine, other), timeout=30)).exit_code

    async with anyio.create_task_group() as tg:
        tg.start_soon(one, "conc-a", "conc-b")
        tg.start_soon(one, "conc-b", "conc-a")
    assert results == {"conc-a": 0, "conc-b": 0}


async def test_processes_a_command_leaves_running_are_ended_and_counted(box: Sandbox) -> None:
    res = await box.exec("setsid sleep 321 > /dev/null 2>&1 < /dev/null & echo left")
    assert res.stdout == "left\n" and res.leftovers >= 1
    assert (await box.exec("ps -eo args | grep 'sleep 32[1]' || true")).stdout == ""


async def test_a_command_killed_by_a_signal_is_128_plus_n(box: Sandbox) -> None:
    res = await box.exec("kill -TERM $$")
    assert res.exit_code == 128 + 15, res


# ------------------------------------------------------------------ files


async def test_a_file_written_reads_back_byte_for_byte(box: Sandbox) -> None:
    data = bytes(range(256)) * 10
    await box.write_file("deep/er/blob.bin", data)  # parents are made
    assert await box.read_file("deep/er/blob.bin") == data
    assert await box.read_file("/workspace/deep/er/blob.bin") == data


async def test_a_new_file_is_0644_unless_a_mode_is_given(box: Sandbox) -> None:
    await box.write_file("m1", "x")
    await box.write_file("m2", "x", mode=0o600)
    modes = (await box.exec(["stat", "-c", "%a", "m1", "m2"])).stdout.split()
    assert modes == ["644", "600"]


async def test_a_replaced_file_keeps_its_mode(box: Sandbox) -> None:
    await box.write_file("run.sh", "echo 1\n", mode=0o755)
    await box.write_file("run.sh", "echo 2\n")
    assert (await box.exec(["stat", "-c", "%a", "run.sh"])).stdout.strip() == "755"
    assert (await box.exec(["./run.sh"])).stdout == "2\n"


async def test_a_missing_file_is_file_not_found(box: Sandbox) -> None:
    with pytest.raises(FileNotFoundError):
        await box.read_file("nothing-here")


async def test_a_read_over_its_limit_is_refused(box: Sandbox) -> None:
    await box.write_file("big", b"x" * 10_000)
    with pytest.raises(OutputLimitExceeded):
        await box.read_file("big", limit=1_000)
    assert len(await box.read_file("big", limit=10_000)) == 10_000


@pytest.mark.parametrize("path", ["/etc/passwd", "../etc/passwd", "/workspace/../etc/x", "/"])
async def test_paths_outside_the_roots_are_refused_for_every_file_call(
    box: Sandbox, path: str, tmp_path: Path
) -> None:
    with pytest.raises(PathRefused):
        await box.read_file(path)
    with pytest.raises(PathRefused):
        await box.write_file(path, "x")
    with pytest.raises(PathRefused):
        await box.list_dir(path)
    with pytest.raises(PathRefused):
        await box.download(path, tmp_path / "out")


async def test_writing_onto_a_directory_is_is_a_directory_error(box: Sandbox) -> None:
    await box.exec(["mkdir", "-p", "here"])
    with pytest.raises(IsADirectoryError):
        await box.write_file("here", "x")


async def test_a_write_the_user_may_not_make_is_permission_error_and_leaves_nothing(
    box: Sandbox,
) -> None:
    await box.exec("mkdir -p ro && echo old > ro/f && chmod 555 ro && chmod 444 ro/f")
    with pytest.raises(PermissionError):
        await box.write_file("ro/new", "x")
    listing = await box.list_dir("ro")
    assert [e.name for e in listing] == ["f"]  # no temporary file left behind
    assert await box.read_file("ro/f") == b"old\n"


async def test_list_dir_is_sorted_with_each_entrys_type(box: Sandbox) -> None:
    await box.exec("mkdir -p ls/b_dir && echo 1 > ls/c_file && ln -s c_file ls/a_link")
    listing = await box.list_dir("ls")
    assert [(e.name, e.type) for e in listing] == [
        ("a_link", "link"),
        ("b_dir", "dir"),
        ("c_file", "file"),
    ]
    assert listing[2].size == 2 and listing[2].path == "/workspace/ls/c_file"


async def test_a_tree_goes_in_and_comes_out_whole(box: Sandbox, tmp_path: Path) -> None:
    src = tmp_path / "src"
    (src / "pkg" / "sub").mkdir(parents=True)
    (src / "pkg" / "a.py").write_text("print('a')\n")
    (src / "pkg" / "sub" / "b.bin").write_bytes(b"\0\1\2")
    tool = src / "tool.sh"
    tool.write_text("echo tool\n")
    tool.chmod(0o755)
    await box.upload(src, "/workspace/tree")
    assert (await box.exec(["./tree/tool.sh"])).stdout == "tool\n"
    out = tmp_path / "out"
    await box.download("/workspace/tree", out)
    got = {p.relative_to(out).as_posix(): p.read_bytes() for p in out.rglob("*") if p.is_file()}
    assert got == {
        "pkg/a.py": b"print('a')\n",
        "pkg/sub/b.bin": b"\0\1\2",
        "tool.sh": b"echo tool\n",
    }


async def test_tmp_is_a_root_too(box: Sandbox) -> None:
    await box.write_file("/tmp/t.txt", "tmp")
    assert await box.read_file("/tmp/t.txt") == b"tmp"
    assert "/tmp" in box.allowed_roots and "/workspace" in box.allowed_roots


# ------------------------------------------------------------------ life


async def test_check_passes_on_a_live_box(box: Sandbox) -> None:
    await box.check()
    assert box.looks_alive()


async def test_a_box_removed_under_its_user_raises_crashed_not_an_engine_error(
    box: Sandbox, request: pytest.FixtureRequest
) -> None:
    engine = None if isinstance(box, MemoryBox) else request.getfixturevalue("docker_client")
    remove_under(box, engine)
    with pytest.raises(SandboxCrashed):
        await box.check()
    with pytest.raises(SandboxCrashed):
        await box.exec("true")
    with pytest.raises(SandboxCrashed):
        await box.read_file("anything")


async def test_close_is_idempotent_and_a_closed_box_refuses_calls(box: Sandbox) -> None:
    target = box if not isinstance(box, DeferredSandbox) else await box.ready()
    await target.close()
    await target.close()
    with pytest.raises(SandboxClosed):
        await box.exec("true")
    with pytest.raises(SandboxClosed):
        await box.read_file("x")


async def test_an_environment_given_to_one_command_is_not_kept_for_the_next(box: Sandbox) -> None:
    assert (await box.exec("echo ${FLEET_ONCE:-unset}", env={"FLEET_ONCE": "1"})).stdout == "1\n"
    assert (await box.exec("echo ${FLEET_ONCE:-unset}")).stdout == "unset\n"


async def test_text_is_written_as_utf8(box: Sandbox) -> None:
    await box.write_file("u.txt", "na\u00efve \u2713")
    assert await box.read_file("u.txt") == "na\u00efve \u2713".encode()


async def test_an_empty_argv_is_a_spec_error(box: Sandbox) -> None:
    with pytest.raises(SandboxSpecError):
        await box.exec([])


async def test_a_missing_directory_or_tree_is_file_not_found(box: Sandbox, tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        await box.list_dir("no-such-dir")
    with pytest.raises(FileNotFoundError):
        await box.download("/workspace/no-such-tree", tmp_path / "out")
    with pytest.raises(FileNotFoundError):
        await box.upload(tmp_path / "no-such-local", "/workspace/x")


# ------------------------------------------------------------------ the fake's exclusions


def test_the_memory_box_exclusions_name_real_checks_and_leave_most_in() -> None:
    checks = {name for name in globals() if name.startswith("test_")}
    assert set(MEMORY_EXCLUDED) <= checks, set(MEMORY_EXCLUDED) - checks
    assert all(
        why.startswith(("MemoryBox runs no process", "MemoryBox has no shell"))
        for why in MEMORY_EXCLUDED.values()
    )
    box_checks = [n for n in checks if "box" in globals()[n].__code__.co_varnames[:1]]
    assert len(box_checks) - len(MEMORY_EXCLUDED) >= 20  # the fake is held to most of them


@pytest.mark.anyio
async def test_the_memory_box_says_what_it_cannot_run_rather_than_pretend() -> None:
    box = MemoryBox()
    piped = await box.exec("echo one two | wc -w")
    assert piped.exit_code == 127 and "MemoryBox has no shell" in piped.stderr, piped
    for unknown in ("sleep 30", ["kill", "-TERM", "1"], ["ln", "-s", "a", "b"]):
        res = await box.exec(unknown)
        assert res.exit_code == 127 and "command not found" in res.stderr, res
    await box.write_file("run.py", "#!/usr/bin/python3\nprint(1)\n", mode=0o755)
    res = await box.exec(["./run.py"])
    assert res.exit_code == 126 and "only sh scripts" in res.stderr, res
