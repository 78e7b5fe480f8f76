"""``fleet check JOB.toml``: a job validated and its plan printed without running
anything - no Docker engine, no cluster, no model is contacted."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
FLEET = str(Path(sys.executable).with_name("fleet"))
EXAMPLES = sorted((ROOT / "examples").glob("*.toml"))


def _check(*args: str, **env: str) -> subprocess.CompletedProcess[str]:
    base = {
        k: v for k, v in os.environ.items() if not k.startswith(("ANTHROPIC_", "FLEET_CLUSTER"))
    }
    # An engine that is not there: check must not need one.
    base["DOCKER_HOST"] = "unix:///nonexistent/docker.sock"
    return subprocess.run(
        [FLEET, "check", *args], env=base | env, capture_output=True, text=True, timeout=60
    )


@pytest.mark.parametrize("job", EXAMPLES, ids=lambda p: p.name)
def test_every_example_checks_without_an_engine(job: Path) -> None:
    done = _check(str(job))
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("job ") and ": valid" in done.stdout.splitlines()[0]
    assert "nothing was run" in done.stdout


def test_the_plan_names_each_members_box_limits_and_what_docker_is_asked_for(tmp_path):
    repo = tmp_path / "repo"
    repo.mkdir()
    job = tmp_path / "job.toml"
    job.write_text(
        'name = "plan"\n[budget]\ntokens = 50000\n[merge]\n'
        '[[members]]\nid = "a"\nkind = "coding"\ntask = "t"\nrepo = "repo"\ntest = "pytest -q"\n'
        'attempts = 3\nsandbox = { memory = "2g", cpus = 2 }\nlimits = { max_turns = 12 }\n'
        '[[members]]\nid = "b"\nkind = "coding"\ntask = "t"\nrepo = "repo"\ntest = "pytest -q"\n'
        '[[members]]\nid = "web"\nkind = "browser"\ntask = "look"\nmodel = "claude-sonnet-4-6"\n'
        '[egress]\nallow = ["docs.python.org"]\n'
    )
    done = _check(str(job), "--json")
    assert done.returncode == 0, done.stderr
    plan = json.loads(done.stdout)
    a, b, web = plan["members"]
    assert b["id"] == "b" and "attempts" not in b  # one attempt: not shown
    assert (a["id"], a["kind"], a["attempts"], a["repo"]) == ("a", "coding", 3, str(repo))
    assert a["box"]["memory"] == "2g" and a["box"]["cpus"] == 2 and a["box"]["network"] == "none"
    assert a["limits"]["max_turns"] == 12 and a["test"] == "pytest -q"
    assert web["model"] == "claude-sonnet-4-6"
    assert web["box"]["network"] == "allowlist: docs.python.org"
    assert plan["merge"] == {"members": ["a", "b"], "test": "pytest -q"}
    assert plan["budget"]["tokens"] == 50000 and plan["egress"] == ["docs.python.org"]
    assert plan["runs_on"] == "this host"
    assert any(ref.startswith("fleet-coding:") for ref in plan["images"])
    assert any(ref.startswith("fleet-browser:") for ref in plan["images"])
    text = _check(str(job))
    assert "  a  coding  model" in text.stdout and "attempts: 3" in text.stdout
    clustered = _check(str(job), "--json", FLEET_CLUSTER="10.0.0.5:6379")
    assert json.loads(clustered.stdout)["runs_on"].startswith("the Ray cluster at 10.0.0.5:6379")


@pytest.mark.parametrize(
    ("text", "words"),
    [
        (
            'name = "x"\n[[members]]\nkind = "coding"\ntask = "t"\nattempts = 9\n',
            "members[0].attempts",
        ),
        (
            'name = "x"\n[[members]]\nkind = "coding"\ntask = "t"\nmodel = "replay:"\n',
            "members[0].model",
        ),
        ('name = "x"\n[[members]]\nkind = "nope"\ntask = "t"\n', "members[0].kind"),
        (
            'name = "x"\n[[members]]\nkind = "coding"\ntask = "t"\nrepo = "missing"\n',
            "members[0].repo",
        ),
    ],
    ids=["attempts", "model", "kind", "repo"],
)
def test_a_bad_job_is_refused_with_exit_2_and_the_field_named(tmp_path, text, words):
    job = tmp_path / "job.toml"
    job.write_text(text)
    done = _check(str(job))
    assert done.returncode == 2, done.stdout + done.stderr
    assert words in done.stderr and done.stdout == ""
