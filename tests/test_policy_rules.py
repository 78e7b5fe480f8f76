"""Tool policy rules: what a rule matches, the order deny > ask > allow, merging a
member's policy into the job's, and the job-file errors for a bad rule."""

from __future__ import annotations

import pytest

from coordinator.jobfile import JobError, parse_job
from subagents.policy import MemberPolicy, ToolPolicy, rule_matches, simple_commands


@pytest.mark.parametrize(
    ("rule", "tool", "args", "hit"),
    [
        ("shell", "shell", {"command": "ls"}, True),
        ("shell:rm *", "shell", {"command": "rm -rf build"}, True),
        ("shell:rm *", "shell", {"command": "rmdir build"}, False),
        ("shell:rm *", "shell", {"command": "make && rm -rf /workspace/x"}, True),
        ("shell:rm *", "shell", {"command": "ls; FOO=1 rm x"}, True),
        ("shell:rm *", "shell", {"command": "echo $(rm -f y)"}, True),
        ("shell:rm *", "shell", {"command": "bash -c 'cd /tmp && rm -r z'"}, True),
        ("shell:rm *", "shell", {"command": "echo 'rm -rf /'"}, False),
        ("shell:git push*", "shell", {"command": "git push origin main"}, True),
        ("write_file:/workspace/.git/**", "write_file", {"path": ".git/config"}, True),
        ("write_file:/workspace/.git/**", "write_file", {"path": "src/../.git/hooks/x"}, True),
        ("write_file:/workspace/.git/**", "write_file", {"path": "/workspace/.git"}, True),
        ("write_file:/workspace/.git/**", "write_file", {"path": ".gitignore"}, False),
        ("write_file:/workspace/*.py", "write_file", {"path": "a/b.py"}, False),
        ("write_file:/workspace/**/*.py", "write_file", {"path": "a/b.py"}, True),
        ("mcp__docs__*", "mcp__docs__search", {"q": "x"}, True),
        ("mcp__docs__*", "mcp__other__search", {"q": "x"}, False),
        ("mcp__fs__write:/etc/*", "mcp__fs__write", {"path": "/etc/passwd"}, True),
        ("navigate:http://corpus:8080/*", "navigate", {"url": "http://corpus:8080/a"}, True),
    ],
)
def test_what_a_rule_matches(rule, tool, args, hit):
    assert rule_matches(rule, tool, args) is hit


def test_first_match_wins_in_the_order_deny_ask_allow():
    p = ToolPolicy(allow=["shell"], ask=["shell:rm *"], deny=["shell:rm -rf /*"])
    assert p.check("shell", {"command": "rm -rf /etc"}).action == "deny"
    assert p.check("shell", {"command": "rm x"}).action == "ask"
    assert p.check("shell", {"command": "ls"}) == p.check("shell", {"command": "pwd"})
    assert p.check("shell", {"command": "ls"}).action == "allow"
    assert p.check("read_file", {"path": "a"}).rule == ""  # the default


def test_an_allow_rule_must_cover_every_command_of_a_line():
    p = ToolPolicy(default="deny", allow=["shell:ls*"])
    assert p.check("shell", {"command": "ls -la"}).action == "allow"
    assert p.check("shell", {"command": "ls; curl x | sh"}).action == "deny"


def test_submit_result_is_never_gated():
    assert ToolPolicy(deny=["*"]).check("submit_result", {}).action == "allow"
    assert ToolPolicy(deny=["*"]).check("shell", {"command": "ls"}).action == "deny"


def test_a_members_policy_adds_rules_and_replaces_only_what_it_sets():
    job = ToolPolicy(deny=["shell:git push*"], ask_timeout_s=30)
    merged = job.merged(MemberPolicy(allow=["shell"], ask=["write_file"], ask_default="allow"))
    assert merged.deny == ["shell:git push*"] and merged.allow == ["shell"]
    assert merged.ask_default == "allow" and merged.ask_timeout_s == 30
    # The job's deny still wins over the member's allow.
    assert merged.check("shell", {"command": "git push"}).action == "deny"


def test_simple_commands_split_a_command_line():
    assert simple_commands("a && b | c; d\ne || (f)") == ["a", "b", "c", "d", "e", "f"]
    assert simple_commands("env X=1 nohup rm -f 'a b'") == ["rm -f a b"]


def test_a_bad_rule_in_a_job_file_names_the_field():
    text = 'name = "t"\n[policy]\nask = ["shell: x", "not a rule!"]\n[[members]]\nkind = "coding"\ntask = "x"\n'
    with pytest.raises(JobError) as err:
        parse_job(text)
    assert "policy.ask" in str(err.value) and "'not a rule!' is not a rule" in str(err.value)
    member = 'name = "t"\n[[members]]\nkind = "coding"\ntask = "x"\npolicy = { dney = ["shell"] }\n'
    with pytest.raises(JobError) as err:
        parse_job(member)
    assert "members[0].policy.dney" in str(err.value) and "deny, ask, allow" in str(err.value)


def test_a_members_policy_read_back_from_the_run_keeps_the_jobs_settings():
    text = (
        'name = "t"\n[policy]\nask_timeout_s = 30\nask_default = "allow"\n'
        '[[members]]\nkind = "coding"\ntask = "x"\npolicy = { ask = ["shell:rm *"] }\n'
    )
    job = parse_job(text)
    again = type(job).model_validate_json(job.model_dump_json())  # as the run keeps it
    for j in (job, again):
        merged = j.policy.merged(j.members[0].policy)
        assert merged.ask_timeout_s == 30 and merged.ask_default == "allow"
        assert merged.ask == ["shell:rm *"]
