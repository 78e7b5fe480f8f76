"""``MemoryBox``: a box whose files live in dicts, for tests that need a Sandbox in
milliseconds, held to the same conformance suite as the real ones.

Its files and directories are dicts (``files``, ``modes``, ``dirs``), and its ``exec``
runs no process: it interprets one simple command at a time, for a small set of
programs (:data:`PROGRAMS`: ``echo``, ``printf``, ``cat``, ``pwd``, ``true``,
``false``, ``exit``, ``mkdir``, ``rm``, ``stat``) and for files of the box run by
path (``#!/bin/sh`` or no ``#!``: their lines, one simple command each). What it does
it does as the real box does - the same exit statuses (127 for a missing program,
126 for a file that is not executable or a directory), output caps, paths and errors.
What it cannot do it says, rather than pretend: a shell string with shell syntax
(pipes, lists, redirections, expansions, background jobs) is exit 127 with
``sh: ... MemoryBox has no shell`` on stderr, a program outside the set is 127
``command not found``. Why interpreted and not real processes in a temporary
directory: a subprocess would see the host's ``/tmp`` and the host's programs, so the
box would no longer be in memory, nor its paths the box's; the checks a fake cannot
keep (timeouts, process groups, signals, concurrency, shell syntax) are listed, each
with its reason, in ``tests/test_sandbox_conformance.py``'s ``MEMORY_EXCLUDED``.
"""

from __future__ import annotations

import posixpath
import re
import shlex
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from sandbox.base import ExecResult, FileInfo, Sandbox
from sandbox.errors import OutputLimitExceeded, SandboxClosed, SandboxCrashed, SandboxSpecError
from sandbox.spec import SandboxSpec

SHELL_SYNTAX = re.compile(r"[|&;<>()$`*?{}\[\]~\n]")
"""What in a command string would need a shell (outside quotes or not: a fake errs on
the side of saying it cannot)."""
NO_SHELL = "sh: {cmd!r}: MemoryBox has no shell (pipes, lists, redirections, expansions)\n"
MAX_SCRIPT_DEPTH = 8
"""Files run by path that run files by path: how deep before refusing (a loop)."""


class _Run:
    """One command's streams while it is interpreted."""

    def __init__(self, cwd: str, stdin: bytes) -> None:
        self.cwd, self.stdin = cwd, stdin
        self.out, self.err = bytearray(), bytearray()


class MemoryBox(Sandbox):
    """Files in dicts behind the Sandbox API; ``crashed=True`` makes every call fail as a
    box that died does."""

    def __init__(self, spec: SandboxSpec | None = None) -> None:
        self.id = self.name = "memory-box"
        self.spec = spec or SandboxSpec()
        self.files: dict[str, bytes] = {}
        self.modes: dict[str, int] = {}
        self.dirs: set[str] = {"/", *self.allowed_roots}
        self.crashed = False
        self.closed = False

    def _alive(self) -> None:
        if self.closed:
            raise SandboxClosed(f"sandbox {self.name} is closed")
        if self.crashed:
            raise SandboxCrashed(self.name, "killed")

    # ------------------------------------------------------------ files

    def _make_dirs(self, path: str) -> None:
        while path not in self.dirs:
            self.dirs.add(path)
            path = posixpath.dirname(path)

    def _put(self, full: str, data: bytes, mode: int | None) -> None:
        if full in self.dirs:
            raise IsADirectoryError(full)
        self._make_dirs(posixpath.dirname(full))
        self.modes[full] = mode if mode is not None else self.modes.get(full, 0o644)
        self.files[full] = data

    async def read_file(self, path: str, *, limit: int = 64 * 1024 * 1024) -> bytes:
        self._alive()
        full = self.resolve(path)
        if full not in self.files:
            raise FileNotFoundError(path)
        data = self.files[full]
        if len(data) > limit:
            raise OutputLimitExceeded(f"{path} is over {limit}", limit=limit, size=len(data))
        return data

    async def write_file(self, path: str, data: bytes | str, *, mode: int | None = None) -> None:
        self._alive()
        self._put(self.resolve(path), data.encode() if isinstance(data, str) else data, mode)

    async def list_dir(self, path: str) -> list[FileInfo]:
        self._alive()
        full = self.resolve(path)
        if full not in self.dirs:
            raise FileNotFoundError(path)
        entries = []
        for name in sorted(
            {
                posixpath.basename(p)
                for p in (*self.files, *self.dirs)
                if p != full and posixpath.dirname(p) == full
            }
        ):
            child = posixpath.join(full, name)
            is_dir = child in self.dirs
            size = 0 if is_dir else len(self.files[child])
            kind = "dir" if is_dir else "file"
            entries.append(FileInfo(name=name, path=child, type=kind, size=size, mtime=0.0))
        return entries

    async def upload(self, local: Path, remote: str) -> None:
        self._alive()
        target = self.resolve(remote)
        found = _host_tree(Path(local))
        if found is None:
            raise FileNotFoundError(str(local))
        if not found or found[0][0] != "":
            self._make_dirs(target)
        for rel, data, mode in found:
            dest = posixpath.join(target, rel) if rel else target
            if data is None:
                self._make_dirs(dest)
            else:
                self._put(dest, data, mode)

    async def download(self, remote: str, local: Path) -> None:
        self._alive()
        full = self.resolve(remote)
        if full in self.files:
            _write_host({Path(local): self.files[full]})
            return
        if full not in self.dirs:
            raise FileNotFoundError(remote)
        inside = full.rstrip("/") + "/"
        _write_host(
            {
                Path(local) / posixpath.relpath(p, full): d
                for p, d in self.files.items()
                if p.startswith(inside)
            }
        )

    async def check(self) -> None:
        self._alive()

    async def close(self) -> None:
        self.closed = True

    # ------------------------------------------------------------ exec

    async def exec(
        self,
        cmd: Any,
        *,
        timeout: float | None = 60.0,
        cwd: str | None = None,
        env: Mapping[str, str] | None = None,
        stdin: bytes | str | None = None,
        output_limit: int | None = None,
    ) -> ExecResult:
        self._alive()
        if not isinstance(cmd, str) and not list(cmd):
            raise SandboxSpecError("exec needs a command: the argv list is empty")
        here = posixpath.normpath(posixpath.join(self.spec.workdir, cwd or "."))
        data = stdin.encode() if isinstance(stdin, str) else (stdin or b"")
        run = _Run(here, data)
        if here in self.dirs:
            code = self._command(cmd, run, 0)
        else:
            run.err += f"{cwd}: No such file or directory\n".encode()
            code = 127
        cap = output_limit or self.spec.output_limit
        out, cut_out = _cap(bytes(run.out), cap)
        err, cut_err = _cap(bytes(run.err), cap)
        return ExecResult(exit_code=code, stdout=out, stderr=err, truncated=cut_out or cut_err)

    def _command(self, cmd: str | list[str], run: _Run, depth: int) -> int:
        if isinstance(cmd, str):
            if SHELL_SYNTAX.search(cmd):
                run.err += NO_SHELL.format(cmd=cmd).encode()
                return 127
            try:
                argv = shlex.split(cmd)
            except ValueError as e:
                run.err += f"sh: {e}\n".encode()
                return 2
            if not argv:
                return 0
        else:
            argv = list(cmd)
        name = argv[0]
        if "/" in name:
            return self._run_file(argv, run, depth)
        program = PROGRAMS.get(name)
        if program is None:
            run.err += f"{name}: command not found\n".encode()
            return 127
        return program(self, argv[1:], run)

    def _run_file(self, argv: list[str], run: _Run, depth: int) -> int:
        full = posixpath.normpath(posixpath.join(run.cwd, argv[0]))
        if full in self.dirs or (full in self.files and not self.modes.get(full, 0) & 0o111):
            run.err += f"{argv[0]}: Permission denied\n".encode()
            return 126
        if full not in self.files:
            run.err += f"{argv[0]}: No such file or directory\n".encode()
            return 127
        text = self.files[full].decode("utf-8", "replace")
        first = text.split("\n", 1)[0]
        if first.startswith("#!") and first[2:].strip() not in ("/bin/sh", "/bin/bash"):
            run.err += f"{argv[0]}: MemoryBox runs only sh scripts, not {first[2:]!r}\n".encode()
            return 126
        if depth >= MAX_SCRIPT_DEPTH:
            run.err += f"{argv[0]}: scripts nested too deep\n".encode()
            return 126
        code = 0
        for line in text.splitlines():
            if line.strip() and not line.lstrip().startswith("#"):
                code = self._command(line, run, depth + 1)
                if line.split()[0] == "exit":
                    break
        return code

    # ------------------------------------------------------------ programs

    def _echo(self, args: list[str], run: _Run) -> int:
        run.out += (" ".join(args) + "\n").encode()
        return 0

    def _printf(self, args: list[str], run: _Run) -> int:
        if not args:
            run.err += b"printf: usage: printf format [arguments]\n"
            return 2
        fmt, rest = _unescape(args[0]), args[1:]
        if b"%s" not in fmt:
            run.out += fmt
            return 0
        while True:
            parts = fmt.split(b"%s")
            out = parts[0]
            for part in parts[1:]:
                out += (rest.pop(0) if rest else "").encode() + part
            run.out += out
            if not rest:
                return 0

    def _cat(self, args: list[str], run: _Run) -> int:
        if not args:
            run.out += run.stdin
            return 0
        code = 0
        for name in args:
            full = posixpath.normpath(posixpath.join(run.cwd, name))
            if full in self.files:
                run.out += self.files[full]
            else:
                run.err += f"cat: {name}: No such file or directory\n".encode()
                code = 1
        return code

    def _pwd(self, args: list[str], run: _Run) -> int:
        run.out += f"{run.cwd}\n".encode()
        return 0

    def _exit(self, args: list[str], run: _Run) -> int:
        return int(args[0]) & 0xFF if args and args[0].isdigit() else 0

    def _mkdir(self, args: list[str], run: _Run) -> int:
        parents = "-p" in args
        for name in (a for a in args if not a.startswith("-")):
            full = self.resolve(posixpath.join(run.cwd, name))
            if full in self.files or (full in self.dirs and not parents):
                run.err += f"mkdir: cannot create directory '{name}': File exists\n".encode()
                return 1
            if not parents and posixpath.dirname(full) not in self.dirs:
                run.err += (
                    f"mkdir: cannot create directory '{name}': No such file or directory\n".encode()
                )
                return 1
            self._make_dirs(full)
        return 0

    def _rm(self, args: list[str], run: _Run) -> int:
        targets = (
            args[args.index("--") + 1 :]
            if "--" in args
            else [a for a in args if not a.startswith("-")]
        )
        for name in targets:
            full = self.resolve(posixpath.join(run.cwd, name))
            inside = full.rstrip("/") + "/"
            for path in [p for p in self.files if p == full or p.startswith(inside)]:
                del self.files[path]
                self.modes.pop(path, None)
            self.dirs -= {d for d in self.dirs if d.startswith(inside) or d == full}
            self.dirs |= {"/", *self.allowed_roots}
        return 0

    def _stat(self, args: list[str], run: _Run) -> int:
        if len(args) < 3 or args[0] != "-c" or args[1] not in ("%a", "%s"):
            run.err += b"stat: MemoryBox knows only 'stat -c %a|%s FILE...'\n"
            return 1
        code = 0
        for name in args[2:]:
            full = posixpath.normpath(posixpath.join(run.cwd, name))
            if full not in self.files:
                run.err += f"stat: cannot statx '{name}': No such file or directory\n".encode()
                code = 1
                continue
            value = f"{self.modes[full]:o}" if args[1] == "%a" else str(len(self.files[full]))
            run.out += f"{value}\n".encode()
        return code


PROGRAMS: dict[str, Callable[[MemoryBox, list[str], _Run], int]] = {
    "echo": MemoryBox._echo,
    "printf": MemoryBox._printf,
    "cat": MemoryBox._cat,
    "pwd": MemoryBox._pwd,
    "true": lambda box, args, run: 0,
    "false": lambda box, args, run: 1,
    "exit": MemoryBox._exit,
    "mkdir": MemoryBox._mkdir,
    "rm": MemoryBox._rm,
    "stat": MemoryBox._stat,
}
"""The programs a MemoryBox has, each as the real one for the arguments it takes."""


def _unescape(fmt: str) -> bytes:
    """printf's backslash escapes: ``\\n``, ``\\t``, ``\\\\`` and octal ``\\NNN``."""
    out, i = bytearray(), 0
    raw = fmt.encode()
    while i < len(raw):
        if raw[i : i + 1] == b"\\" and i + 1 < len(raw):
            nxt = raw[i + 1 : i + 2]
            octal = re.match(rb"[0-7]{1,3}", raw[i + 1 : i + 4])
            if octal:
                out.append(int(octal.group(), 8) & 0xFF)
                i += 1 + len(octal.group())
                continue
            out += {b"n": b"\n", b"t": b"\t", b"\\": b"\\"}.get(nxt, b"\\" + nxt)
            i += 2
            continue
        out += raw[i : i + 1]
        i += 1
    return bytes(out)


def _cap(data: bytes, limit: int) -> tuple[str, bool]:
    """The stream as the box returns it: UTF-8 with replacement, head and tail kept."""
    if len(data) <= limit:
        return data.decode("utf-8", "replace"), False
    half = limit // 2
    note = f"\n[... {len(data) - 2 * half} bytes cut ...]\n".encode()
    return (data[:half] + note + data[-half:]).decode("utf-8", "replace"), True


def _host_tree(local: Path) -> list[tuple[str, bytes | None, int]] | None:
    """A host file (``[("", data, mode)]``) or tree (relative path, data or None for a
    directory, mode), or None when ``local`` does not exist."""
    if not local.exists():
        return None
    if local.is_file():
        return [("", local.read_bytes(), local.stat().st_mode & 0o777)]
    out: list[tuple[str, bytes | None, int]] = []
    for item in sorted(local.rglob("*")):
        rel = item.relative_to(local).as_posix()
        if item.is_dir():
            out.append((rel, None, 0o755))
        elif item.is_file():
            out.append((rel, item.read_bytes(), item.stat().st_mode & 0o777))
    return out


def _write_host(files: dict[Path, bytes]) -> None:
    for path, data in files.items():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
