"""What a shell command line runs, as far as it can be told without running it: the
commands the ``shell`` rules of a tool policy (:mod:`subagents.policy`) are checked on.

The line is parsed with tree-sitter's bash grammar, the grammar editors and code hosts
read bash with, rather than a tokenizer of our own: compound commands (``{ ...; }``,
``if``, loops, ``case``, functions), pipelines, ``!``, subshells, command and process
substitutions, here-documents and redirections come out as bash sees them, and every
simple command found anywhere in that tree is reported. A tokenizer that splits at
``;`` and ``|`` misses most of these (``{ touch x; }`` hid ``touch`` behind ``{``).

Each command is then looked through its wrappers: ``env``, ``nice``, ``nohup``,
``timeout``, ``time``, ``command``, ``builtin``, ``exec``, ``xargs``, ``sudo``,
``doas``, ``stdbuf``, ``setsid``, ``chroot``, ``ionice``, ``taskset``, ``flock``,
``busybox``, ``coproc`` and ``find -exec`` run the command they are given (the wrapper
is reported too, and so is the command it runs); ``bash``/``sh``/... ``-c``, ``eval``,
``trap``, ``env -S`` and a shell fed a here-document run a string, which is parsed in
turn, up to :data:`MAX_DEPTH` levels deep.

What cannot be known before the line runs is a *hole*: a variable, a substitution, a
glob, a brace or tilde expansion, ``$'...'``. A command is a tuple of words, a word a
tuple of characters where ``None`` is a hole standing for any text. Some lines cannot be
read with confidence at all - a parse error, a command name with a hole (``$c x``),
a shell reading a script from a pipe or from ``/dev/stdin``, ``source``-ing one,
``alias``, ``mapfile -C``, arithmetic on variables (bash evaluates a variable's text as
an expression, and ``a[$(cmd)]`` in that text runs ``cmd``), an assignment to
``PATH``, ``BASH_ENV`` or ``LD_*``, a wrapper option this module does not know, nesting
past :data:`MAX_DEPTH`: each yields :data:`UNKNOWN`, a command that is all hole.

The policy reads holes so that it fails closed: a deny or ask rule matches a command
when some text in its holes would make it match (:func:`may_match`), an allow rule only
when the command has no hole and matches (:func:`must_match`). So ``echo $HOME`` stays
clear of ``deny = ["shell:rm *"]``, ``rm $f`` does not, and ``$c x`` matches every deny
rule and no allow rule.

This is a reading of what the line says, not of what the programs it starts do: a
script written, then run, or ``python -c`` doing the same work, is the command
``python``. The box is the isolation boundary; the policy is the job owner's guard.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable
from dataclasses import dataclass, field

import tree_sitter_bash
from tree_sitter import Language, Node, Parser

Shape = tuple[str | None, ...]
"""Text one character per element; ``None`` is a hole: any text, spaces included."""

MAX_DEPTH = 4
"""Command strings inside command strings (``bash -c "eval '...'"``) looked into;
deeper ones are :data:`UNKNOWN`."""
MAX_CHARS = 100_000
"""Longer lines are not parsed: :data:`UNKNOWN`."""
_MAX_NODES = 50_000
_HOLE: Shape = (None,)


@dataclass(frozen=True)
class Invocation:
    """One command the line runs: its words as spelled (assignments and redirections
    left out)."""

    words: tuple[Shape, ...]
    function: bool = False
    """Its name is a function the line defined before, at its top level: what the
    call runs is the function's body, whose commands are reported themselves."""

    def shapes(self, *, by_name: bool) -> list[Shape]:
        """The command as one text (words joined by spaces); ``by_name`` adds it with
        the program's path cut to its name (``/usr/bin/touch x`` -> ``touch x``)."""
        out = [_join(self.words)]
        name = _literal(self.words[0]) if self.words else None
        if by_name and name is not None and "/" in name:
            base = tuple(name.rsplit("/", 1)[-1])
            out.append(_join((base, *self.words[1:])))
        return out


UNKNOWN = Invocation((_HOLE,))
"""A command that cannot be told: any program, any arguments."""


@functools.lru_cache(maxsize=64)
def commands_of(line: str) -> tuple[Invocation, ...]:
    """:func:`invocations` of a whole line, kept for the next rule that asks."""
    return tuple(invocations(line))


def invocations(line: str, depth: int = 0) -> list[Invocation]:
    """Every command ``line`` runs (see the module docstring), wrappers reported too."""
    if depth > MAX_DEPTH or len(line) > MAX_CHARS:
        return [UNKNOWN]
    root = parse_bash(line)
    out = [UNKNOWN] if root.has_error else []
    functions = _top_level_functions(root)
    stack, seen = [root], 0
    while stack:
        node = stack.pop()
        seen += 1
        if seen > _MAX_NODES:
            return [*out, UNKNOWN]
        kind = node.type
        if kind == "command":
            out += _command(node, depth, functions)
        elif kind in ("raw_string", "string_content"):
            text = _text(node)[1:-1] if kind == "raw_string" else _text(node)
            if "$(" in text or "`" in text:  # code in quotes that an evaluation may run
                out += invocations(text, depth + 1)
        elif kind == "variable_assignment" and _dangerous_assignment(node):
            out.append(UNKNOWN)
        elif _arithmetic_on_variables(node):
            out.append(UNKNOWN)
        stack.extend(reversed(node.children))
    return out


def may_match(pattern: str, shape: Shape) -> bool:
    """Whether some text in the holes of ``shape`` makes the glob ``pattern`` (``*``
    any run of characters, ``?`` one) match it whole: a search of the product of the
    two patterns for a common end."""
    p, s = pattern.strip(), _strip(shape)
    stack, seen = [(0, 0)], {(0, 0)}
    while stack:
        i, j = stack.pop()
        if i == len(p) and j == len(s):
            return True
        steps = []
        if i < len(p) and p[i] == "*":
            steps.append((i + 1, j))
        if j < len(s) and s[j] is None:
            steps.append((i, j + 1))
        if i < len(p) and j < len(s):
            a, b = p[i], s[j]
            if a in "*?" or b is None or a == b:
                steps.append((i if a == "*" else i + 1, j if b is None else j + 1))
        for step in steps:
            if step not in seen:
                seen.add(step)
                stack.append(step)
    return False


def must_match(pattern: str, shape: Shape) -> bool:
    """Whether ``shape`` has no hole and the glob ``pattern`` matches it whole."""
    if any(c is None for c in shape):
        return False
    regex = "".join(
        ".*" if c == "*" else "." if c == "?" else re.escape(c) for c in pattern.strip()
    )
    return re.fullmatch(regex, "".join(c for c in _strip(shape) if c), re.S) is not None


# ---------------------------------------------------------------- reading the tree


@functools.cache
def _parser() -> Parser:
    return Parser(Language(tree_sitter_bash.language()))


def parse_bash(text: str) -> Node:
    """The root of ``text``'s bash syntax tree (``has_error`` when bash would refuse it
    or the grammar cannot read it)."""
    return _parser().parse(text.encode("utf-8", "surrogatepass")).root_node


def _text(node: Node) -> str:
    return (node.text or b"").decode("utf-8", "surrogateescape")


def _literal(word: Shape) -> str | None:
    return None if any(c is None for c in word) else "".join(c for c in word if c)


def _join(words: tuple[Shape, ...]) -> Shape:
    out: list[str | None] = []
    for i, word in enumerate(words):
        if i:
            out.append(" ")
        out += word
    return tuple(out)


def _strip(shape: Shape) -> Shape:
    start, end = 0, len(shape)
    while start < end and _space(shape[start]):
        start += 1
    while end > start and _space(shape[end - 1]):
        end -= 1
    return shape[start:end]


def _space(c: str | None) -> bool:
    return c is not None and c.isspace()


_BRACES = re.compile(r"\{[^{}]*(,|\.\.)[^{}]*\}")


def _shape(node: Node) -> Shape:
    """What a word becomes once bash has expanded it, holes where it cannot be told."""
    kind = node.type
    if kind in ("word", "number"):
        text = _text(node)
        if _BRACES.search(text):
            return _HOLE
        return _unquoted(text)
    if kind == "raw_string":
        return tuple(_text(node)[1:-1])
    if kind == "string":
        out: list[str | None] = []
        for child in node.named_children:
            if child.type == "string_content":
                out += re.sub(r'\\([$`"\\\n])', lambda m: m.group(1).strip("\n"), _text(child))
            else:
                out.append(None)
        return tuple(out)
    if kind == "concatenation":
        if _BRACES.search(_text(node)):
            return _HOLE
        return tuple(c for part in node.named_children for c in _shape(part))
    return _HOLE  # expansions, substitutions, $'...', $"...", and anything unforeseen


def _unquoted(text: str) -> Shape:
    """An unquoted word: backslashes removed, globs and a leading ``~`` as holes."""
    out: list[str | None] = []
    i = 0
    while i < len(text):
        c = text[i]
        if c == "\\" and i + 1 < len(text):
            if text[i + 1] != "\n":
                out.append(text[i + 1])
            i += 2
            continue
        out.append(None if c in "*?[" or (c == "~" and i == 0) else c)
        i += 1
    return tuple(out)


def _top_level_functions(root: Node) -> dict[str, int]:
    """Functions the line defines outside every condition: name -> where it ends."""
    return {
        _text(name): child.end_byte
        for child in root.named_children
        if child.type == "function_definition"
        and (name := child.child_by_field_name("name")) is not None
    }


_DANGEROUS_NAMES = re.compile(
    r"^(PATH|BASH_ENV|ENV|SHELLOPTS|BASHOPTS|PS4|IFS|LD_\w*|BASH_FUNC_.*)$"
)


def _dangerous_assignment(node: Node) -> bool:
    """An assignment that changes which program a name runs or what a shell runs first."""
    name = node.child_by_field_name("name")
    return name is not None and bool(_DANGEROUS_NAMES.match(_text(name)))


_ARITH_TEST = {"-eq", "-ne", "-lt", "-le", "-gt", "-ge"}


def _arithmetic_on_variables(node: Node) -> bool:
    kind = node.type
    arithmetic = (
        kind in ("arithmetic_expansion", "c_style_for_statement", "subscript")
        or (kind == "compound_statement" and node.child_count > 0 and node.children[0].type == "((")
        or (
            kind == "test_command"  # [[ ]] evaluates -eq's sides; [ ] does not
            and node.child_count > 0
            and node.children[0].type == "[["
            and any(_text(n) in _ARITH_TEST for n in _descendants(node, "test_operator"))
        )
    )
    if not arithmetic:
        return False
    for n in _descendants(node, None):
        if n.type in ("variable_name", "simple_expansion", "expansion"):
            return True
        if n.type == "word" and re.match(r"^[A-Za-z_]", _text(n)):
            return True
    return False


def _descendants(node: Node, kind: str | None) -> list[Node]:
    out: list[Node] = []
    stack = list(node.children)
    while stack and len(out) < _MAX_NODES:
        n = stack.pop()
        if kind is None or n.type == kind:
            out.append(n)
        stack.extend(n.children)
    return out


# ------------------------------------------------------------------- one command


def _command(node: Node, depth: int, functions: dict[str, int]) -> list[Invocation]:
    words: list[Shape] = []
    stdin: str | None = None
    stdin_given = False
    for child in node.named_children:
        kind = child.type
        if kind in ("variable_assignment", "comment"):
            continue
        if kind == "command_name":
            words.append(_shape(child.named_children[0]) if child.named_children else _HOLE)
        elif kind == "file_redirect":
            words += _redirect_arguments(child)
        elif kind in ("herestring_redirect", "heredoc_redirect"):
            stdin_given, stdin = True, _stdin_text(child)
        else:
            words.append(_shape(child))
    parent = node.parent
    if parent is not None and parent.type == "redirected_statement":
        for child in parent.named_children:
            if child.type in ("herestring_redirect", "heredoc_redirect"):
                stdin_given, stdin = True, _stdin_text(child)
            elif child.type == "file_redirect":
                words += _redirect_arguments(child)
    if not words:
        return []
    end = functions.get(_literal(words[0]) or "")
    defined = end is not None and end <= node.start_byte
    reading = _Reading(depth, stdin if stdin_given else None)
    return reading.unwrap(words, defined)


def _redirect_arguments(redirect: Node) -> list[Shape]:
    """Words after a redirection's target, which bash takes as arguments (``echo >f x``)."""
    targets = [c for c in redirect.named_children if c.type != "file_descriptor"]
    return [_shape(c) for c in targets[1:]]


def _stdin_text(redirect: Node) -> str | None:
    """A here-document's or here-string's text when it has no expansions, else None."""
    if redirect.type == "heredoc_redirect":
        body = next((c for c in redirect.named_children if c.type == "heredoc_body"), None)
        if body is None:
            return ""
        if any(c.type != "heredoc_content" for c in body.named_children):
            return None
        return _text(body)
    shapes = [_shape(c) for c in redirect.named_children]
    return _literal(shapes[0]) if shapes else None


# ------------------------------------------------------------------- wrappers


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
class _Reading:
    depth: int
    stdin: str | None
    """What the command reads on its standard input when the line says (a static
    here-document or here-string), else None: a pipe, a file, the caller's."""
    found: list[Invocation] = field(default_factory=list)

    def unwrap(self, words: list[Shape], function: bool = False) -> list[Invocation]:
        for step in range(MAX_DEPTH * 4):
            if not words:
                return self.found
            self.found.append(Invocation(tuple(words), function))
            name = _literal(words[0])
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
        if base == "coproc" and len(rest) > 1 and _literal(rest[1]) in _SYNTAX:
            raise _Unknown  # coproc NAME { ...; }
        if base == "env":
            while rest and (word := _literal(rest[0])) is not None and re.match(r"^\w+=", word):
                if _DANGEROUS_NAMES.match(word.split("=", 1)[0]):
                    raise _Unknown
                rest = rest[1:]
        if base == "xargs":
            rest = [*rest, _HOLE] if rest else rest  # arguments it reads, then adds
        return rest

    def _skip_options(self, o: _Options, args: list[Shape]) -> list[Shape]:
        i = 0
        while i < len(args):
            word = _literal(args[i])
            if word is None:
                raise _Unknown
            if word == "--":
                i += 1
                break
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
        if any(_literal(w) is None for w in rest[: o.positionals]):
            raise _Unknown
        return rest[o.positionals :]

    @staticmethod
    def _next(args: list[Shape], i: int) -> str:
        word = _literal(args[i]) if i < len(args) else None
        if word is None:
            raise _Unknown
        return word

    def _code(self, text: str | None) -> None:
        """A command string the command runs: parsed, one level deeper."""
        if text is None:
            raise _Unknown
        self.found += invocations(text, self.depth + 1)

    def _shell(self, args: list[Shape]) -> list[Shape] | None:
        flags: set[str] = set()
        i = 0
        while i < len(args):
            word = _literal(args[i])
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
            self._code(_literal(rest[0]) if rest else None)
        elif "s" in flags or not rest:
            self._code(self.stdin)
        else:
            self._script(rest[0])
        return None

    def _script(self, word: Shape) -> None:
        """A script file run: a program like any other, unless it is a stream."""
        path = _literal(word)
        if path is None or path.startswith(("/dev/", "/proc/")):
            raise _Unknown

    def _eval(self, args: list[Shape]) -> None:
        self._code(_literal(_join(tuple(args))))

    def _trap(self, args: list[Shape]) -> None:
        first = _literal(args[0]) if args else ""
        if first is None:
            raise _Unknown
        if args and not first.startswith("-"):
            self._code(first)

    def _source(self, args: list[Shape]) -> None:
        if not args:
            raise _Unknown
        self._script(args[0])

    def _alias(self, args: list[Shape]) -> None:
        if any(_literal(a) is None or "=" in (_literal(a) or "") for a in args):
            raise _Unknown

    def _mapfile(self, args: list[Shape]) -> None:
        if any(_literal(a) is None or (_literal(a) or "").startswith("-C") for a in args):
            raise _Unknown

    def _find(self, args: list[Shape]) -> None:
        i = 0
        while i < len(args):
            if _literal(args[i]) in ("-exec", "-execdir", "-ok", "-okdir"):
                j = i + 1
                while j < len(args) and _literal(args[j]) not in (";", "+"):
                    j += 1
                run = [(_HOLE if "{}" in (_literal(w) or "{}") else w) for w in args[i + 1 : j]]
                if not run or _literal(run[0]) is None:
                    raise _Unknown
                inner = _Reading(self.depth, None)
                self.found += inner.unwrap(run)
                i = j
            i += 1
