"""Wrappers: commands that run another command (``nice``, ``env``, ``timeout``, ``sudo``,
``xargs``, ``find -exec``, ...) or a command string (``bash -c``, ``eval``, ``trap``,
``env -S``, a shell fed a here-document), looked through so that the command they run
is checked too (:mod:`.commands`).

Each wrapper's options are spelled out (:class:`_Options`), so the word where its
command starts is found as the wrapper would find it; an option not known here, or a
word that cannot be told, makes the rest :data:`UNKNOWN` rather than a guess.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field

from .words import DANGEROUS_NAMES, HOLE, UNKNOWN, Invocation, Shape, join_words, literal

_MAX_WRAPPERS = 16
"""Wrappers in a row looked through (``nice nohup timeout 5 ...``); more are unknown."""


@dataclass(frozen=True)
class _Options:
    """How a wrapper's options are spelled, so that the command after them is found."""

    flags: str = ""
    """Short options without a value."""
    valued: str = ""
    """Short options taking a value (attached or the next word)."""
    long_flags: frozenset[str] = frozenset()
    long_valued: frozenset[str] = frozenset()
    positionals: int = 0
    """Words between the options and the command (timeout's duration, chroot's root)."""
    numeric: bool = False
    """``-5`` is an option (nice)."""
    code: str = ""
    """Short options whose value is a command string (env -S, flock -c)."""
    long_code: frozenset[str] = frozenset()


def _o(*names: str) -> frozenset[str]:
    return frozenset(names)


_WRAPPERS: dict[str, _Options] = {
    "env": _Options(
        "i0v",
        "uC",
        _o(
            "ignore-environment", "null", "debug", "block-signal", "default-signal", "ignore-signal"
        ),
        _o("unset", "chdir"),
        code="S",
        long_code=_o("split-string"),
    ),
    "nice": _Options("", "n", long_valued=_o("adjustment"), numeric=True),
    "nohup": _Options(),
    "timeout": _Options(
        "v",
        "sk",
        _o("preserve-status", "foreground", "verbose"),
        _o("signal", "kill-after"),
        positionals=1,
    ),
    "time": _Options(
        "pavq", "fo", _o("portability", "verbose", "append", "quiet"), _o("format", "output")
    ),
    "command": _Options("pvV"),
    "builtin": _Options(),
    "exec": _Options("cl", "a"),
    "coproc": _Options(),
    "busybox": _Options(),
    "sudo": _Options(
        "AbEeHiKklnPSsVv",
        "CDghprTtUu",
        _o(
            "askpass",
            "background",
            "edit",
            "set-home",
            "login",
            "remove-timestamp",
            "reset-timestamp",
            "non-interactive",
            "preserve-groups",
            "stdin",
            "shell",
            "validate",
            "preserve-env",
        ),
        _o(
            "close-from",
            "chdir",
            "group",
            "host",
            "prompt",
            "role",
            "type",
            "command-timeout",
            "other-user",
            "user",
        ),
    ),
    "doas": _Options("ns", "uC"),
    "stdbuf": _Options("", "ioe", long_valued=_o("input", "output", "error")),
    "setsid": _Options("cfw", "", _o("ctty", "fork", "wait")),
    "chroot": _Options("", "", _o("skip-chdir"), _o("userspec", "groups"), positionals=1),
    "ionice": _Options("t", "cnpPu", _o("ignore"), _o("class", "classdata", "pid", "pgid", "uid")),
    "taskset": _Options("acp", "", _o("all-tasks", "cpu-list", "pid"), positionals=1),
    "flock": _Options(
        "sxnuoFe",
        "wE",
        _o("shared", "exclusive", "nonblock", "unlock", "close", "no-fork", "verbose"),
        _o("timeout", "wait", "conflict-exit-code"),
        positionals=1,
        code="c",
        long_code=_o("command"),
    ),
    "xargs": _Options(
        "0prtxeil",
        "aEdILnPs",
        _o("null", "interactive", "no-run-if-empty", "verbose", "exit", "open-tty", "show-limits"),
        _o(
            "arg-file",
            "delimiter",
            "eof",
            "replace",
            "max-lines",
            "max-args",
            "max-procs",
            "max-chars",
            "process-slot-var",
        ),
    ),
}
_SHELLS = {"sh", "bash", "dash", "zsh", "ksh", "ash", "mksh", "rbash", "posh"}
_SYNTAX = {
    *"{}()!",
    "[[",
    "((",
    "if",
    "then",
    "else",
    "elif",
    "fi",
    "for",
    "while",
    "until",
    "do",
    "done",
    "case",
    "esac",
    "select",
    "function",
    "time",
    "coproc",
}
"""Reserved words and braces: read as a command's name, the grammar has missed a
compound command (``time { ...; }``). ``time`` and ``coproc`` may start a command."""
_KEYWORD_WRAPPERS = {"time", "coproc"}
_SHELL_FLAGS = set("abefhkmnptuvxBCEHPTilrsDc")
_NEEDS_COMMAND = {"xargs", "chroot", "coproc", "busybox"}


class _Unknown(Exception):
    """The rest of this command cannot be told."""


@dataclass
class Unwrapping:
    """One command looked through its wrappers: the commands it runs, in :attr:`found`."""

    parse: Callable[[str, int], list[Invocation]]
    """Reads a command string the command runs, at a depth (:func:`.commands.invocations`)."""
    depth: int
    stdin: str | None
    """What the command reads on its standard input when the line says (a static
    here-document or here-string), else None: a pipe, a file, the caller's."""
    found: list[Invocation] = field(default_factory=list)

    def unwrap(self, words: list[Shape], function: bool = False) -> list[Invocation]:
        """The command of ``words`` and those it runs, :data:`UNKNOWN` where that cannot
        be told; ``function``: its name is a function the line defined before."""
        for step in range(_MAX_WRAPPERS):
            if not words:
                return self.found
            self.found.append(Invocation(tuple(words), function))
            name = literal(words[0])
            if name is None or (name in _SYNTAX and (step or name not in _KEYWORD_WRAPPERS)):
                # `time { ...; }`: shell syntax where a program's name was expected, a
                # compound command the grammar read as words
                return [*self.found, UNKNOWN]
            base = name.rsplit("/", 1)[-1]
            try:
                rest = self._inner(base, words[1:])
            except _Unknown:
                return [*self.found, UNKNOWN]
            if rest is None:
                return self.found
            if not rest and base in _NEEDS_COMMAND:
                rest = [tuple("echo")] if base == "xargs" else [tuple("sh")]
                if base != "xargs" and self.stdin is None:
                    return [*self.found, UNKNOWN]
            words, function = rest, False
        return [*self.found, UNKNOWN]

    def _inner(self, base: str, args: list[Shape]) -> list[Shape] | None:
        """The command ``base`` runs in turn (None: nothing seen); code it runs is
        parsed into :attr:`found`; :class:`_Unknown` when it cannot be told."""
        special: dict[str, Callable[[list[Shape]], list[Shape] | None]] = {
            "eval": self._eval,
            "trap": self._trap,
            "source": self._source,
            ".": self._source,
            "alias": self._alias,
            "mapfile": self._mapfile,
            "readarray": self._mapfile,
            "find": self._find,
        }
        if base in _SHELLS:
            return self._shell(args)
        if base in special:
            return special[base](args)
        options = _WRAPPERS.get(base)
        if options is None:
            return None
        rest = self._skip_options(options, args)
        if base == "coproc" and len(rest) > 1 and literal(rest[1]) in _SYNTAX:
            raise _Unknown  # coproc NAME { ...; }
        if base == "env":
            while rest and (word := literal(rest[0])) is not None and re.match(r"^\w+=", word):
                if DANGEROUS_NAMES.match(word.split("=", 1)[0]):
                    raise _Unknown
                rest = rest[1:]
        if base == "xargs":
            rest = [*rest, HOLE] if rest else rest  # arguments it reads, then adds
        return rest

    def _skip_options(self, o: _Options, args: list[Shape]) -> list[Shape]:
        i = 0
        while i < len(args):
            word = literal(args[i])
            if word is None:
                raise _Unknown
            if word == "--":
                i += 1
                break
            if word == "-":  # env's old spelling of -i
                i += 1
                continue
            if word.startswith("--"):
                key, eq, value = word[2:].partition("=")
                if key in o.long_code:
                    value = value if eq else self._next(args, i := i + 1)
                    self._code(value)
                    return []
                if key in o.long_valued and not eq:
                    i += 1
                elif key not in o.long_flags and key not in o.long_valued:
                    raise _Unknown
                i += 1
                continue
            if word.startswith("-") and len(word) > 1:
                if o.numeric and word[1:].isdigit():
                    i += 1
                    continue
                j = 1
                while j < len(word):
                    c = word[j]
                    if c in o.code or c in o.valued:
                        value = word[j + 1 :] or self._next(args, i := i + 1)
                        if c in o.code:
                            self._code(value)
                            return []
                        break
                    if c not in o.flags:
                        raise _Unknown
                    j += 1
                i += 1
                continue
            break
        rest = args[i:]
        if len(rest) < o.positionals:
            return []
        if any(literal(w) is None for w in rest[: o.positionals]):
            raise _Unknown
        return rest[o.positionals :]

    @staticmethod
    def _next(args: list[Shape], i: int) -> str:
        word = literal(args[i]) if i < len(args) else None
        if word is None:
            raise _Unknown
        return word

    def _code(self, text: str | None) -> None:
        """A command string the command runs: parsed, one level deeper."""
        if text is None:
            raise _Unknown
        self.found += self.parse(text, self.depth + 1)

    def _shell(self, args: list[Shape]) -> list[Shape] | None:
        flags: set[str] = set()
        i = 0
        while i < len(args):
            word = literal(args[i])
            if word is None:
                raise _Unknown
            if word in ("--", "-"):
                i += 1
                break
            if word in ("-o", "+o", "-O", "+O", "--rcfile", "--init-file"):
                i += 2
                continue
            if word.startswith("--"):
                i += 1
                continue
            if word[:1] in "-+" and len(word) > 1:
                if not set(word[1:]) <= _SHELL_FLAGS:
                    raise _Unknown
                flags |= set(word[1:])
                i += 1
                continue
            break
        rest = args[i:]
        if "c" in flags:
            self._code(literal(rest[0]) if rest else None)
        elif "s" in flags or not rest:
            self._code(self.stdin)
        else:
            self._script(rest[0])
        return None

    def _script(self, word: Shape) -> None:
        """A script file run: a program like any other, unless it is a stream."""
        path = literal(word)
        if path is None or path.startswith(("/dev/", "/proc/")):
            raise _Unknown

    def _eval(self, args: list[Shape]) -> None:
        self._code(literal(join_words(tuple(args))))

    def _trap(self, args: list[Shape]) -> None:
        first = literal(args[0]) if args else ""
        if first is None:
            raise _Unknown
        if args and not first.startswith("-"):
            self._code(first)

    def _source(self, args: list[Shape]) -> None:
        if not args:
            raise _Unknown
        self._script(args[0])

    def _alias(self, args: list[Shape]) -> None:
        if any(literal(a) is None or "=" in (literal(a) or "") for a in args):
            raise _Unknown

    def _mapfile(self, args: list[Shape]) -> None:
        if any(literal(a) is None or (literal(a) or "").startswith("-C") for a in args):
            raise _Unknown

    def _find(self, args: list[Shape]) -> None:
        i = 0
        while i < len(args):
            if literal(args[i]) in ("-exec", "-execdir", "-ok", "-okdir"):
                j = i + 1
                while j < len(args) and literal(args[j]) not in (";", "+"):
                    j += 1
                run = [(HOLE if "{}" in (literal(w) or "{}") else w) for w in args[i + 1 : j]]
                if not run or literal(run[0]) is None:
                    raise _Unknown
                inner = Unwrapping(self.parse, self.depth, None)
                self.found += inner.unwrap(run)
                i = j
            i += 1
