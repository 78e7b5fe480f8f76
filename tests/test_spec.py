"""Job files: valid ones load; each kind of bad one exits 2 naming the field, no traceback."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from pydantic import ValidationError

from coordinator.cli import main
from coordinator.fanout.fanout import to_member_spec
from coordinator.job.jobfile import JobError, load_job, parse_job
from sandbox.spec import NetworkPolicy, SandboxSpec
from subagents.browser.config import BrowserConfig
from subagents.kinds.coding import CodingSettings
from subagents.spec import Limits, MemberSpec

FLEET = str(Path(sys.executable).with_name("fleet"))
GOOD = 'name = "ok"\n[[members]]\nkind = "coding"\ntask = "t"\n'

# (what is wrong, job text, the field path the message must name, a word it must say)
BAD = [
    ("toml syntax", 'name = "unterminated\n', "(syntax)", "not valid TOML"),
    ("unknown top-level key", GOOD + 'colour = "red"\n', "members[0].colour", "not a known field"),
    (
        "unknown section key",
        'name = "x"\nbogus = 1\n[research]\nquestion = "q"\n',
        "bogus",
        "not a known field",
    ),
    (
        "bad member kind",
        'name = "x"\n[[members]]\nkind = "robot"\ntask = "t"\n',
        "members[0].kind",
        "'robot' is not allowed",
    ),
    ("missing task", 'name = "x"\n[[members]]\nkind = "coding"\n', "members[0].task", "required"),
    (
        "blank task",
        'name = "x"\n[[members]]\nkind = "coding"\ntask = "   "\n',
        "members[0].task",
        "blank",
    ),
    ("no members and no research", 'name = "x"\n', "members", "no [[members]]"),
    (
        "duplicate member ids",
        'name = "x"\n[[members]]\nid = "a"\nkind = "coding"\ntask = "t"\n'
        '[[members]]\nid = "a"\nkind = "coding"\ntask = "u"\n',
        "members[1].id",
        "used twice",
    ),
    (
        "zero parallelism",
        'name = "x"\n[research]\nquestion = "q"\n[fanout]\nmax_parallel = 0\n',
        "fanout.max_parallel",
        "greater than or equal to 1",
    ),
    (
        "quorum above member count",
        'name = "x"\n[research]\nquestion = "q"\nmembers = 2\n[fanout]\nmin_success = 3\n',
        "fanout.min_success",
        "only 2 member",
    ),
    (
        "retrying the task's own failure",
        'name = "x"\n[research]\nquestion = "q"\n[fanout.retry]\non = ["failed"]\n',
        "fanout.retry.on[0]",
        "'failed' is not allowed",
    ),
    (
        "bad memory size",
        GOOD + 'sandbox = { memory = "lots" }\n',
        "members[0].sandbox.memory",
        "not a size",
    ),
    (
        "bad egress host",
        'name = "x"\n[research]\nquestion = "q"\n[egress]\nallow = ["a b"]\n',
        "egress.allow",
        "not a host name",
    ),
    (
        "egress port past 65535",
        'name = "x"\n[research]\nquestion = "q"\n[egress]\nallow = ["docs.python.org:70000"]\n',
        "egress.allow",
        "not a TCP port",
    ),
    (
        "egress to localhost",
        'name = "x"\n[research]\nquestion = "q"\n[egress]\nallow = ["localhost:8080"]\n',
        "egress.allow",
        "names the loopback address",
    ),
    (
        "egress to the metadata address",
        'name = "x"\n[research]\nquestion = "q"\n[egress]\nallow = ["169.254.169.254"]\n',
        "egress.allow",
        "link-local",
    ),
    (
        "egress to a private literal",
        'name = "x"\n[research]\nquestion = "q"\n[egress]\nallow = ["corpus:8080", "10.1.2.3"]\n',
        "egress.allow",
        "a private address",
    ),
    (
        "negative turn limit",
        GOOD + "limits = { max_turns = -1 }\n",
        "members[0].limits.max_turns",
        "greater than or equal to 1",
    ),
    (
        "repo on a browser member",
        'name = "x"\n[[members]]\nkind = "browser"\ntask = "t"\nrepo = "."\n',
        "members[0].repo",
        "only for coding members",
    ),
    (
        "test command on a browser member",
        'name = "x"\n[[members]]\nkind = "browser"\ntask = "t"\ntest = "make"\n',
        "members[0].test",
        "only for coding members",
    ),
    ("wrong type for a section", 'name = "x"\nresearch = "q"\n', "research", "valid dictionary"),
    (
        "too many research members",
        'name = "x"\n[research]\nquestion = "q"\nmembers = 99\n',
        "research.members",
        "less than or equal to 32",
    ),
    (
        "search URL without placeholder",
        'name = "x"\n[research]\nquestion = "q"\n[egress]\nsearch_url = "http://corpus:8080/"\n',
        "egress.search_url",
        "{query}",
    ),
    (
        "search URL not http",
        'name = "x"\n[research]\nquestion = "q"\n[egress]\nsearch_url = "ftp://corpus/?q={query}"\n',
        "egress.search_url",
        "http(s) URL",
    ),
    (
        "result schema not an object",
        GOOD + 'result_schema = { type = "string" }\n',
        "members[0].result_schema",
        'type = "object"',
    ),
    (
        "words where a number goes",
        GOOD + 'limits = { max_turns = "ten" }\n',
        "members[0].limits.max_turns",
        "valid integer",
    ),
    (
        "model as a string, not a table",
        'name = "x"\nmodel = "claude-sonnet-5"\n[research]\nquestion = "q"\n',
        "model",
        "valid dictionary",
    ),
    (
        "[members] table instead of [[members]]",
        'name = "x"\n[members]\nkind = "coding"\ntask = "t"\n',
        "members",
        "valid list",
    ),
    (
        "negative parallelism",
        'name = "x"\n[research]\nquestion = "q"\n[fanout]\nmax_parallel = -2\n',
        "fanout.max_parallel",
        "(got -2)",
    ),
    (
        "retry as a bare number",
        'name = "x"\n[research]\nquestion = "q"\n[fanout]\nretry = 3\n',
        "fanout.retry",
        "valid dictionary",
    ),
    ("empty file", "", "name", "required"),
    (
        "a lead beside explicit members",
        GOOD + '[lead]\nquestion = "q"\n',
        "members",
        "its lead spawns the members itself",
    ),
    (
        "a lead's first wave past its max_members",
        'name = "x"\n[lead]\nquestion = "q"\nmembers = 5\nmax_members = 2\n',
        "lead.members",
        "the first wave (5) is more than max_members (2)",
    ),
    (
        "a lead member cap over the run's budget",
        'name = "x"\n[lead]\nquestion = "q"\ntoken_budget = 50000\n'
        "member_limits = { max_tokens = 90000 }\n",
        "lead.member_limits.max_tokens",
        "more than the whole token_budget (50000)",
    ),
    (
        "a lead that may spawn a lead",
        'name = "x"\n[lead]\nquestion = "q"\nkinds = ["lead"]\n',
        "lead.kinds[0]",
        "'lead' is not allowed",
    ),
    (
        "files for a browser member",
        'name = "x"\n[[members]]\nkind = "browser"\ntask = "t"\nfiles = { "a.py" = "1" }\n',
        "members[0].files",
        "only for coding members",
    ),
    (
        "a file name that climbs out of /workspace",
        GOOD + 'files = { "../a.py" = "1" }\n',
        "members[0].files",
        "is not a relative file name",
    ),
    (
        "a member taking the lead's id",
        'name = "x"\n[[members]]\nid = "lead"\nkind = "coding"\ntask = "t"\n',
        "members[0].id",
        "the lead's id",
    ),
]


@pytest.mark.parametrize(("what", "text", "field", "words"), BAD, ids=[b[0] for b in BAD])
def test_bad_job_file_exits_2_naming_the_field(tmp_path, capsys, what, text, field, words):
    if what == "unknown top-level key":
        text = GOOD.replace('task = "t"\n', 'task = "t"\ncolour = "red"\n')
    path = tmp_path / "job.toml"
    path.write_text(text)
    assert main(["run", str(path)]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err
    assert f"  {field}:" in err or f"  {field} " in err, err
    assert words in err, err
    if field != "(syntax)":
        assert "example of right:" in err or "known fields here: " in err, err
    assert not (tmp_path / "runs").exists()  # nothing was started


def test_missing_job_file_exits_2(tmp_path, capsys):
    assert main(["run", str(tmp_path / "nope.toml")]) == 2
    assert "no such file" in capsys.readouterr().err


def test_repo_path_is_checked_relative_to_the_job_file(tmp_path):
    (tmp_path / "job.toml").write_text(
        'name = "x"\n[[members]]\nkind = "coding"\ntask = "t"\nrepo = "missing-dir"\n'
    )
    with pytest.raises(JobError) as err:
        load_job(tmp_path / "job.toml")
    assert "members[0].repo" in str(err.value) and "not a directory" in str(err.value)
    (tmp_path / "proj").mkdir()
    (tmp_path / "job.toml").write_text(
        'name = "x"\n[[members]]\nkind = "coding"\ntask = "t"\nrepo = "proj"\n'
    )
    job, _ = load_job(tmp_path / "job.toml")
    assert job.members[0].repo == str((tmp_path / "proj").resolve())


def test_a_mixed_job_gets_default_ids_and_policy():
    job = parse_job(
        'name = "mixed"\n[research]\nquestion = "q"\nmembers = 2\n'
        '[[members]]\nkind = "coding"\ntask = "t"\n[[members]]\nkind = "browser"\ntask = "u"\n'
    )
    assert [m.id for m in job.members] == ["coding-1", "browser-2"]
    assert job.member_count == 4
    assert job.fanout.retry.on == ["crashed", "overloaded"]
    assert job.egress.allow == ["corpus:8080"]


def test_a_job_member_reaches_the_harness_with_its_settings_and_box_typed(
    tmp_path,
):
    job = parse_job(
        'name = "x"\n[egress]\nsearch_url = "http://corpus:8080/find?q={query}"\n'
        '[[members]]\nkind = "coding"\ntask = "t"\ntest = "pytest -q"\n'
        'inputs = { topic = "asyncio" }\nsandbox = { memory = "512M", keep = true }\n'
        '[[members]]\nkind = "browser"\ntask = "u"\n'
    )
    coder, reader = (
        to_member_spec(m, model="offline", max_tokens=4096, egress=job.egress, memory_root=tmp_path)
        for m in job.members
    )
    # Inputs are the task's facts only; the kind's settings are not among them.
    assert coder.inputs == {"topic": "asyncio"} and reader.inputs == {}
    assert coder.settings == CodingSettings(test="pytest -q")
    assert isinstance(reader.settings, BrowserConfig)
    assert reader.settings.search_url == "http://corpus:8080/find?q={query}"
    # The box is a SandboxSpec, built once from the kind's defaults and the job's changes.
    assert coder.sandbox == SandboxSpec(kind="coding", memory="512m", keep=True)
    assert reader.sandbox == SandboxSpec(
        kind="browser", network=NetworkPolicy(egress="allowlist", allow=("corpus:8080",))
    )
    # A spec crosses to a worker as JSON and comes back typed.
    for spec in (coder, reader):
        again = MemberSpec.model_validate_json(spec.model_dump_json())
        assert again == spec and type(again.settings) is type(spec.settings)
        assert isinstance(again.sandbox, SandboxSpec)


@pytest.mark.parametrize(
    "field, value", [("max_turns", 1001), ("deadline_s", 90_000.0), ("result_tokens", 30_000)]
)
def test_the_harness_refuses_the_limits_a_job_file_refuses(tmp_path, field, value):
    """One Limits class: a member made through the API has the job file's bounds."""
    text = (
        f'name = "x"\n[[members]]\nkind = "coding"\ntask = "t"\nlimits = {{ {field} = {value} }}\n'
    )
    with pytest.raises(JobError) as err:
        parse_job(text)
    assert f"members[0].limits.{field}: input should be less than or equal to" in str(err.value)
    with pytest.raises(ValidationError):
        MemberSpec(id="m", kind="coding", task="t", limits={field: value})


def test_a_job_member_keeps_its_limits_with_the_harness_deadline_earlier(tmp_path):
    job = parse_job(
        'name = "x"\n[model]\nmax_tokens = 2048\n[[members]]\nkind = "coding"\ntask = "t"\n'
        "limits = { max_turns = 7, max_tokens = 9000, deadline_s = 1000, result_tokens = 300 }\n"
    )
    spec = to_member_spec(
        job.members[0], model="offline", max_tokens=2048, egress=job.egress, memory_root=tmp_path
    )
    assert spec.limits == Limits(max_turns=7, max_tokens=9000, deadline_s=940, result_tokens=300)
    assert spec.max_output_tokens == 2048


def test_a_member_spec_refuses_a_box_of_another_kind():
    assert MemberSpec(id="r", kind="browser", task="t").sandbox.kind == "browser"
    with pytest.raises(ValidationError) as err:
        MemberSpec(id="r", kind="browser", task="t", sandbox=SandboxSpec(memory="2g"))
    assert "a browser member runs in a 'browser' box" in str(err.value)


def test_bad_input_through_the_real_entry_point_prints_no_traceback(tmp_path):
    path = tmp_path / "job.toml"
    path.write_text('name = "x"\n[[members]]\nkind = "robot"\ntask = "t"\n')
    proc = subprocess.run([FLEET, "run", str(path)], capture_output=True, text=True)
    assert proc.returncode == 2
    assert "Traceback" not in proc.stderr and "members[0].kind" in proc.stderr
    proc = subprocess.run(
        [FLEET, "research", "q", "--allow-domain", "bad host!"],
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 2
    assert "--allow-domain" in proc.stderr and "Traceback" not in proc.stderr


@pytest.mark.parametrize(
    "entry",
    [
        "localhost",
        "sub.localhost:80",
        "127.0.0.1",
        "169.254.169.254:80",
        "10.0.0.5",
        "0.0.0.0",
        "100.100.100.200",
        "0x7f000001:80",
        "127.1",
    ],
)
def test_allowlist_entries_refused_when_read_are_the_ones_the_proxy_refuses(entry):
    """The job check and the proxy apply one rule: what one refuses, the other does too."""
    from sandbox.inbox.egress_proxy import Denied, Policy
    from sandbox.inbox.egress_rules import entry_refusal

    assert entry_refusal(entry)
    host, _, port = entry.partition(":")
    with pytest.raises(Denied):  # its address (looked up for a name) is refused, or its form
        Policy([entry], local_net=None, deny_ips=[]).resolve(host, int(port or 80))


def test_an_allowlist_the_proxy_always_refuses_is_bad_input_through_the_real_cli(tmp_path):
    out = tmp_path / "runs"
    for allow in ("169.254.169.254", "corpus:65536"):
        proc = subprocess.run(
            [FLEET, "research", "q", "--allow-domain", allow, "--output-dir", str(out)],
            capture_output=True,
            text=True,
        )
        assert proc.returncode == 2, proc.stderr
        assert "Traceback" not in proc.stderr and "--allow-domain" in proc.stderr
        assert f"'{allow}' can never be reached" in proc.stderr
    assert not out.exists()


def test_a_model_that_cannot_be_used_is_bad_input_before_any_run(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("ANTHROPIC_")}
    out = tmp_path / "runs"
    proc = subprocess.run(
        [
            FLEET,
            "research",
            "How do tasks end?",
            "--allow-domain",
            "docs.python.org",
            "--model",
            "gpt-9",
            "--output-dir",
            str(out),
        ],
        capture_output=True,
        text=True,
        env=env,
    )
    assert proc.returncode == 2, proc.stderr
    err = proc.stderr.strip()
    assert "\n" not in err and "Traceback" not in err  # one paragraph
    assert err.startswith("fleet: --model (model.name): no API key for model 'gpt-9'")
    assert "ANTHROPIC_API_KEY" in err
    assert not out.exists()  # no run was started
    job = tmp_path / "job.toml"
    job.write_text(f'output_dir = "{out}"\n' + GOOD + 'model = "claude-sonnet-5"\n')
    proc = subprocess.run([FLEET, "run", str(job)], capture_output=True, text=True, env=env)
    assert proc.returncode == 2 and "members[0].model: no API key" in proc.stderr, proc.stderr
    assert not out.exists()
