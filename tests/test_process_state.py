"""The suite's own guard (``tests/process_state.py``): a test that leaves the worker's
signal handlers, environment, working directory or umask changed fails, by name, and
the next test starts with them as they were."""

from __future__ import annotations

from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parent

LEAKY = """
import os, signal

import pytest


def test_sets_docker_host():
    os.environ["DOCKER_HOST"] = "unix:///secret/path.sock"


def test_ignores_sigusr1():
    signal.signal(signal.SIGUSR1, signal.SIG_IGN)


def test_changes_directory(tmp_path):
    os.chdir(tmp_path)


def test_changes_umask():
    os.umask(0o077)


def test_removes_a_variable():
    del os.environ["FLEET_PROBE"]


@pytest.fixture(scope="session")
def ray_address():
    os.environ["RAY_ADDRESS"] = "127.0.0.1:1"
    yield
    os.environ.pop("RAY_ADDRESS", None)  # undone already, by the guard


def test_a_session_fixture_sets_the_environment(ray_address):
    pass


def test_monkeypatch_is_undone_in_time(monkeypatch, tmp_path):
    monkeypatch.setenv("ANTHROPIC_API_KEY", "k")
    monkeypatch.chdir(tmp_path)


def test_the_next_test_starts_clean():
    assert "DOCKER_HOST" not in os.environ and os.environ["FLEET_PROBE"] == "1"
    assert signal.getsignal(signal.SIGUSR1) is signal.SIG_DFL
    assert os.getcwd() == os.environ["START_DIR"]
    old = os.umask(0o022)
    os.umask(old)
    assert old == 0o022
"""


def test_a_test_that_leaves_process_state_changed_fails_naming_it(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytester.makepyfile(test_leaky=LEAKY)
    monkeypatch.setenv("PYTHONPATH", str(TESTS))
    monkeypatch.setenv("FLEET_PROBE", "1")
    monkeypatch.setenv("START_DIR", str(pytester.path))
    result = pytester.runpytest_subprocess("-p", "process_state", "-q")
    result.assert_outcomes(passed=8, errors=6)
    out = result.stdout.str()
    for test, change in [
        ("test_sets_docker_host", "environment variable DOCKER_HOST set"),
        ("test_ignores_sigusr1", "the handler of SIGUSR1: <Handlers.SIG_DFL: 0> -> <Handlers.SIG_IGN: 1>"),
        ("test_changes_directory", f"the working directory: {pytester.path} -> "),
        ("test_changes_umask", "the umask: 0022 -> 0077"),
        ("test_removes_a_variable", "environment variable FLEET_PROBE unset"),
        ("test_a_session_fixture_sets_the_environment", "environment variable RAY_ADDRESS set"),
    ]:  # fmt: skip
        assert f"ERROR at teardown of {test}" in out, out
        assert change in out, out
    assert "secret/path.sock" not in out  # names, not values: a value may be a secret
