"""The `fleet` entry point: lazy command loading stays in step with the modules."""

from __future__ import annotations

import subprocess
import sys

from coordinator import cli


def _commands(parser) -> set[str]:
    action = next(a for a in parser._actions if a.dest == "command")
    return set(action.choices)


def test_every_command_has_a_home_and_each_home_defines_it() -> None:
    everything = _commands(cli.build_parser())
    assert everything == set(cli.COMMAND_HOMES)
    for command in everything:
        assert command in _commands(cli.build_parser(command))


def test_setup_does_not_import_the_model_client() -> None:
    code = (
        "import sys; from coordinator import cli; cli.build_parser('sandbox');"
        "print('anthropic' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_ctrl_c_while_a_command_module_imports_prints_one_line(monkeypatch, capsys) -> None:
    def interrupted(command=None):
        raise KeyboardInterrupt

    monkeypatch.setattr(cli, "build_parser", interrupted)
    assert cli.main(["research", "q"]) == 130
    err = capsys.readouterr().err
    assert err == "fleet: interrupted\n"
