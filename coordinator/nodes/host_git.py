"""Every git command Fleet runs on the host, on a user's repository, goes through here.

A repository is data someone else may have written: its ``.git/config`` (and files it
includes) can name commands that git runs by itself - ``core.fsmonitor`` on every
``ls-files`` or ``status``, clean/smudge/process filters whenever file contents go in or
out (``git apply`` reads and writes the work tree through them), hooks, diff drivers
and ``diff.external``, ``core.sshCommand``, credential helpers, a pager or an editor.
``fleet code REPO`` must not run any of them on the host: the point of the box is that
what the repository holds runs only inside it.

How. Settings given on git's command line beat every configuration file, so each call
carries overrides (as ``GIT_CONFIG_COUNT``/``GIT_CONFIG_KEY_n``/``GIT_CONFIG_VALUE_n``,
which keep key and value apart, where ``-c`` would split a driver name holding ``=``):

* fixed keys that run a command (:data:`SAFE_CONFIG`) are switched off;
* drivers are named by the repository itself (``filter.NAME.clean``), so the
  configuration the command would see is listed first (``git config --list``, which
  reads files and runs nothing) and every driver command found there is blanked, with
  ``required`` filters made optional. An empty command is never run (git treats it as
  no driver).

The environment is git's own too: inherited ``GIT_*`` variables are dropped (a
``GIT_DIR`` left by a hook that started Fleet would point the command at another
repository), prompts and optional index locks are off. The user's own global and
system configuration are still read - they are not the repository's, and they hold
``safe.directory``, git's own guard against repositories owned by someone else, which
stays in force.

``git apply`` (``fleet code --apply``) goes further: it runs against an empty git
directory of Fleet's own with the repository as its work tree, so the repository's
configuration is not read at all, and that git directory's ``info/attributes`` (which
beats ``.gitattributes``) turns off every content conversion - filters, end-of-line
conversion, ``ident``, working-tree encodings. The patch was computed from the box's
raw bytes, so it must be applied to the raw bytes of the work tree.

Listing what goes into a coding member's box runs the same way (:func:`isolated`), on a
git directory of Fleet's own that holds copies of the repository's index and
``info/exclude`` (:mod:`coordinator.nodes.repo_list`): git then reads nothing of the
repository's ``.git`` - not its configuration or what that includes, nor a gitfile or
``core.worktree`` naming another place - so it cannot be sent outside the repository.
"""

from __future__ import annotations

import os
import subprocess
import tempfile
from collections.abc import Sequence
from pathlib import Path

from subagents.kinds.workspace_git import SAFE_CONFIG

__all__ = ["SAFE_CONFIG", "apply", "git"]

_DRIVER_KEYS = {
    "filter": ("clean", "smudge", "process"),
    "diff": ("command", "textconv"),
    "merge": ("driver",),
}
RAW_ATTRIBUTES = "* -text -filter -ident !eol !working-tree-encoding\n"
"""Attributes under which git reads and writes a file's bytes as they are."""


def _env(overrides: dict[str, str]) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GIT_")}
    env.update(GIT_TERMINAL_PROMPT="0", GIT_OPTIONAL_LOCKS="0", GIT_PAGER="cat")
    env["GIT_CONFIG_COUNT"] = str(len(overrides))
    for i, (key, value) in enumerate(overrides.items()):
        env[f"GIT_CONFIG_KEY_{i}"] = key
        env[f"GIT_CONFIG_VALUE_{i}"] = value
    return env


def _driver_overrides(listing: bytes) -> dict[str, str]:
    """Blank every driver command in a ``git config --list -z`` listing."""
    out: dict[str, str] = {}
    for entry in listing.split(b"\0"):
        key = entry.partition(b"\n")[0].decode("utf-8", "surrogateescape")
        section, _, rest = key.partition(".")
        name, _, var = rest.rpartition(".")
        if not name or section.lower() not in _DRIVER_KEYS:
            continue
        if var.lower() in _DRIVER_KEYS[section.lower()]:
            out[key] = ""
        if section.lower() == "filter" and var.lower() == "required":
            out[key] = "false"
    return out


def _run(cmd: Sequence[str], cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run(["git", *cmd], cwd=cwd, env=env, capture_output=True, check=False)


def git(repo: Path, *args: str) -> subprocess.CompletedProcess:
    """Run ``git ARGS`` in ``repo`` with no command of the repository's able to run.

    Returns the completed process (bytes out, never raises on a non-zero exit);
    :class:`OSError` when git is not installed.
    """
    listing = _run(["config", "--list", "-z"], repo, _env(SAFE_CONFIG))
    overrides = {**SAFE_CONFIG}
    if listing.returncode == 0:
        overrides.update(_driver_overrides(listing.stdout))
    return _run(args, repo, _env(overrides))


def own_gitdir(gitdir: Path) -> subprocess.CompletedProcess:
    """An empty git directory of Fleet's own at ``gitdir`` (``git init --bare``), for
    :func:`isolated`; its ``info/`` is there to write into."""
    # No template: nothing in it but what Fleet puts there.
    done = _run(
        ["init", "-q", "--bare", "--template=", str(gitdir)], gitdir.parent, _env(SAFE_CONFIG)
    )
    if done.returncode == 0:
        (gitdir / "info").mkdir(exist_ok=True)
    return done


def isolated(
    work_tree: Path, gitdir: Path, *args: str, stdin: bytes | None = None
) -> subprocess.CompletedProcess:
    """``git ARGS`` on ``work_tree`` with ``gitdir`` (made by :func:`own_gitdir`) as
    its git directory: nothing of the repository's own ``.git`` - its configuration,
    a gitfile naming another directory, ``core.worktree`` - is read at all."""
    env = _env(SAFE_CONFIG)
    env.update(GIT_DIR=str(gitdir), GIT_WORK_TREE=str(work_tree))
    return subprocess.run(
        ["git", *args], cwd=work_tree, env=env, input=stdin, capture_output=True, check=False
    )


def apply(repo: Path, patch: Path, *, check: bool = False) -> subprocess.CompletedProcess:
    """``git apply [--check] PATCH`` on ``repo``'s work tree, byte for byte.

    Run against a throw-away git directory (see the module docstring), so neither the
    repository's configuration nor its ``.gitattributes`` can run or convert anything.
    """
    with tempfile.TemporaryDirectory(prefix="fleet-apply-") as tmp:
        gitdir = Path(tmp) / "git"
        init = own_gitdir(gitdir)
        if init.returncode != 0:
            return init
        (gitdir / "info" / "attributes").write_text(RAW_ATTRIBUTES)
        args = ["apply", *(["--check"] if check else []), str(patch.resolve())]
        return isolated(repo, gitdir, *args)
