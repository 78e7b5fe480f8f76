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


def test_every_argument_of_the_run_commands_says_what_it_is_for() -> None:
    parser = cli.build_parser("run")
    action = next(a for a in parser._actions if a.dest == "command")
    for name in ("run", "research", "code", "resume", "runs"):
        for arg in action.choices[name]._actions:
            if arg.dest != "help":
                assert arg.help, f"fleet {name}: {arg.dest} has no help text"


def test_the_first_line_counts_one_member_in_the_singular(tmp_path, monkeypatch, capsys) -> None:
    import sys

    from coordinator import api
    from coordinator.job.jobfile import parse_job
    from coordinator.nodes.capacity import Parallelism
    from coordinator.runner import preflight
    from coordinator.runner.driver import RunOptions

    def checked(job, flags, **_):
        return Parallelism(job.member_count, f"{job.member_count} CPUs")

    monkeypatch.setattr(preflight, "preflight", checked)
    text = 'name = "one"\n[[members]]\nkind = "coding"\ntask = "t"\n'
    api.check_new(parse_job(text), text, RunOptions(out=sys.stderr), output_dir=tmp_path).open()
    assert "(1 member, 1 at once: 1 CPUs) in" in capsys.readouterr().err
    two = parse_job(text + text.split("\n", 1)[1])
    opts = RunOptions(out=sys.stderr)
    api.check_new(two, text, opts, output_dir=tmp_path).open()
    assert "(2 members, 2 at once: 2 CPUs) in" in capsys.readouterr().err
    assert opts.max_parallel == 2  # what the first line says is what the run uses
