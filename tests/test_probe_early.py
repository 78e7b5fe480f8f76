"""The cluster's token probe started early (``sandbox.cluster.auth.probe_soon``).

A command that knows its cluster's address starts the probe's process at once, and
its later check takes that answer: for the same address only, while fresh; one never
asked for is ended with its home at exit. No cluster is needed here: nothing listens
at the addresses used, which the probe must report as such (and its own process turns
the address into Ray's form, so a bad one is named by it).
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from coordinator.cli import main
from sandbox.cluster import auth

NOBODY = "127.0.0.1:1"
"""No process listens on port 1 here: the GCS is unreachable."""
EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


@pytest.fixture
def started(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[Any]]:
    """Every probe process started, in order (and none left from another test)."""
    monkeypatch.setattr(auth, "_early", {})
    made: list[Any] = []
    real = auth._Asking

    class Counted(real):  # type: ignore[misc, valid-type]
        def __init__(self, address: str) -> None:
            super().__init__(address)
            made.append(self)

    monkeypatch.setattr(auth, "_Asking", Counted)
    yield made
    auth._discard_early()


def test_the_early_probe_answers_its_address_and_no_other(started: list[Any]) -> None:
    auth.probe_soon(NOBODY)
    auth.probe_soon(NOBODY)  # asked twice: still one process
    assert [a.address for a in started] == [NOBODY]
    found = auth.probe(NOBODY)
    assert (found.state, found.address) == ("unreachable", NOBODY)
    assert "Connection refused" in found.detail
    assert len(started) == 1 and not Path(started[0].home).exists()
    # Taken once: the next check of the same address, and any other, asks again.
    assert auth.probe(NOBODY).state == "unreachable"
    assert auth.probe("127.0.0.1:2").state == "unreachable"
    assert [a.address for a in started] == [NOBODY, NOBODY, "127.0.0.1:2"]


def test_a_stale_early_probe_is_ended_and_asked_again(
    started: list[Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    auth.probe_soon(NOBODY)
    monkeypatch.setattr(auth, "FRESH_S", 0.0)
    assert auth.probe(NOBODY).state == "unreachable"
    early, now = started
    assert early.proc.returncode is not None and not Path(early.home).exists()
    assert now.proc.returncode == 0


def test_an_early_probe_never_asked_for_ends_with_its_home(started: list[Any]) -> None:
    auth.probe_soon(NOBODY)
    (early,) = started
    auth._discard_early()  # what the process does at exit
    assert early.proc.returncode is not None and not Path(early.home).exists()
    assert auth._early == {}


def test_addresses_that_are_no_heads_are_named(started: list[Any]) -> None:
    client = auth.probe("ray://10.0.0.1:10001")
    assert client.state == "unreachable" and "is a Ray Client address" in client.detail
    assert started == []  # refused before any process
    auth.probe_soon("ray://10.0.0.1:10001")
    assert started == [] and auth._early == {}
    bad = auth.probe("no-port-here")
    assert bad.state == "unreachable", bad
    assert "no-port-here is not a Ray head's address HOST:PORT" in bad.detail


def test_a_run_on_a_cluster_takes_the_probe_its_command_line_started(
    started: list[Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: Any
) -> None:
    monkeypatch.delenv("FLEET_CLUSTER", raising=False)
    shutil.copytree(EXAMPLES / "sample-repo", tmp_path / "sample-repo")
    job = tmp_path / "job.toml"
    job.write_text(
        'name = "t"\n[model]\nname = "offline"\n[[members]]\nid = "c"\nkind = "coding"\n'
        'task = "t"\nrepo = "sample-repo"\n'
    )
    out = str(tmp_path / "runs")
    rc = main(["run", str(job), "--output-dir", out, "--plain", "--cluster", NOBODY])
    assert rc == 2
    said = " ".join(capsys.readouterr().err.split())
    assert f"cannot reach the Ray cluster at {NOBODY}: Connection refused" in said, said
    assert [a.address for a in started] == [NOBODY]  # the command line's, and no other
    # FLEET_CLUSTER names a run's cluster too.
    monkeypatch.setenv("FLEET_CLUSTER", NOBODY)
    assert main(["run", str(job), "--output-dir", out, "--plain"]) == 2
    assert [a.address for a in started] == [NOBODY, NOBODY]


@pytest.mark.parametrize(
    "printed",
    [
        'print(\'{"state": "token"\')',  # cut short: not JSON
        'print(\'{"state": "token "}\')',  # a look-alike of the one word that lets a run go on
        "print('[\"token\"]')",  # JSON, not an object
        "import sys; sys.stderr.write('e' * (4 << 20)); print('x' * (4 << 20))",  # huge, no answer
    ],
)
def test_an_answer_that_is_not_the_probes_is_never_taken_for_token_required(
    started: list[Any], printed: str
) -> None:
    """Whatever the probe's process prints, only a whole ``{"state": "token"}`` says the
    cluster requires the token: anything else is ``unknown``, with a bounded reason."""
    asking = auth._Asking(NOBODY)
    asking.proc.kill()
    asking.proc.communicate()
    asking.proc = subprocess.Popen(
        [sys.executable, "-c", printed],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    found = asking.result()
    assert found.state == "unknown", found
    assert found.detail.startswith("the check failed: ") and len(found.detail) <= 240
    assert auth.refusal(NOBODY, found) is not None  # a run does not go on
    assert not Path(asking.home).exists()
