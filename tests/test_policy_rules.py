"""Tool policy rules: what a rule matches, the order deny > ask > allow, merging a
member's policy into the job's, and the job-file errors for a bad rule."""

from __future__ import annotations

import shlex

import anyio
import pytest

from coordinator.job.jobfile import JobError, parse_job
from coordinator.oversight.approvals import ApprovalQueue, FileApprover
from subagents.commandline.commands import invocations
from subagents.rules.policy import ApprovalRequest, MemberPolicy, ToolPolicy, rule_matches


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


def _texts(line: str) -> list[str]:
    return ["".join(c or "?" for c in i.shapes(by_name=False)[0]) for i in invocations(line)]


def test_a_command_line_is_read_as_bash_reads_it():
    assert _texts("a && b | c; d\ne || (f)") == ["a", "b", "c", "d", "e", "f"]
    assert _texts("env X=1 nohup rm -f 'a b'") == [
        "env X=1 nohup rm -f a b",
        "nohup rm -f a b",
        "rm -f a b",
    ]
    assert _texts("echo $HOME *.py") == ["echo ? ?.py"]  # holes: what only running it can tell


# Every way found to run `touch` past a deny rule on it; each must be refused.
TOUCH_SPELLINGS = [
    "touch /tmp/pwn",
    "{ touch /tmp/pwn; }",
    "if true; then touch /tmp/pwn; fi",
    "if touch /tmp/pwn; then :; fi",
    "! touch /tmp/pwn",
    "for i in 1; do touch /tmp/pwn; done",
    "while touch /tmp/pwn; do break; done",
    "case x in x) touch /tmp/pwn;; esac",
    "(touch /tmp/pwn)",
    "true && touch /tmp/pwn",
    "false || touch /tmp/pwn",
    "echo | touch /tmp/pwn",
    "touch /tmp/pwn &",
    "nice touch /tmp/pwn",
    "nice -n 5 touch /tmp/pwn",
    "nohup touch /tmp/pwn",
    "timeout 5 touch /tmp/pwn",
    "timeout -s KILL 5 touch /tmp/pwn",
    "time touch /tmp/pwn",
    "time -p touch /tmp/pwn",
    "env touch /tmp/pwn",
    "env -i A=1 touch /tmp/pwn",
    "env -u HOME -- touch /tmp/pwn",
    "env - touch /tmp/pwn",
    "env -S 'touch /tmp/pwn'",
    "command touch /tmp/pwn",
    "builtin touch /tmp/pwn",
    "exec touch /tmp/pwn",
    "echo /tmp/pwn | xargs touch",
    "echo /tmp/pwn | xargs -0 -n 1 touch",
    "sudo touch /tmp/pwn",
    "sudo -u root touch /tmp/pwn",
    "doas touch /tmp/pwn",
    "stdbuf -oL touch /tmp/pwn",
    "setsid touch /tmp/pwn",
    "chroot / touch /tmp/pwn",
    "busybox touch /tmp/pwn",
    "find /tmp -maxdepth 0 -exec touch /tmp/pwn \\;",
    "/usr/bin/touch /tmp/pwn",
    "./touch /tmp/pwn",
    "\\touch /tmp/pwn",
    '"to"uch /tmp/pwn',
    "t''ouch /tmp/pwn",
    "'touch' /tmp/pwn",
    "bash -c 'touch /tmp/pwn'",
    "bash -lc 'touch /tmp/pwn'",
    "sh -c 'touch /tmp/pwn'",
    "dash -c 'touch /tmp/pwn'",
    "sh -c \"bash -c 'touch /tmp/pwn'\"",
    "eval 'touch /tmp/pwn'",
    "eval touch /tmp/pwn",
    "trap 'touch /tmp/pwn' EXIT",
    "f() { touch /tmp/pwn; }; f",
    "echo $(touch /tmp/pwn)",
    "echo `touch /tmp/pwn`",
    "X=$(touch /tmp/pwn)",
    "X=$(touch /tmp/pwn) ls",
    "cat <(touch /tmp/pwn)",
    "echo >(touch /tmp/pwn)",
    "cat <<EOF\n$(touch /tmp/pwn)\nEOF",
    "bash <<EOF\ntouch /tmp/pwn\nEOF",
    "bash <<< 'touch /tmp/pwn'",
    "echo 'touch /tmp/pwn' | bash",
    "echo 'touch /tmp/pwn' | sh -s",
    "bash /dev/stdin <<< 'touch /tmp/pwn'",
    "source <(echo touch /tmp/pwn)",
    ". /dev/stdin <<< 'touch /tmp/pwn'",
    "c=touch; $c /tmp/pwn",
    "${c:-touch} /tmp/pwn",
    "$(echo touch) /tmp/pwn",
    "/usr/bin/tou* /tmp/pwn",
    "{touch,/tmp/pwn}",
    "$'\\x74ouch' /tmp/pwn",
    "alias t=touch; t /tmp/pwn",
    "x='a[$(touch /tmp/pwn)]'; echo $((x))",
    "x='a[$(touch /tmp/pwn)]'; [[ $x -eq 1 ]]",
    "PATH=/tmp/bin:$PATH; tuch /tmp/pwn",
    "mapfile -C 'touch /tmp/pwn' -c 1 < /etc/hostname",
    "echo hi >/dev/null; touch /tmp/pwn",
    "echo >/dev/null touch; touch /tmp/pwn",
    "touch\\\n /tmp/pwn",
    "touch${IFS}/tmp/pwn",
    "time { touch /tmp/pwn; }",
    "coproc touch /tmp/pwn",
    "coproc N { touch /tmp/pwn; }",
    "until touch /tmp/pwn; do break; done",
    "select a in b; do touch /tmp/pwn; break; done <<< 1",
    "function g { touch /tmp/pwn; }; g",
    'a=(touch /tmp/pwn); "${a[@]}"',
    "true |& touch /tmp/pwn",
    "echo ok 2>$(touch /tmp/pwn)",
    "exec -a x touch /tmp/pwn",
]


@pytest.mark.parametrize("line", TOUCH_SPELLINGS)
def test_a_deny_rule_catches_the_command_however_it_is_spelled(line):
    assert len(TOUCH_SPELLINGS) >= 32
    decision = ToolPolicy(deny=["shell:touch *"]).check("shell", {"command": line})
    assert decision.action == "deny", line


@pytest.mark.parametrize(
    "line",
    [
        "echo touch",
        "echo 'touch /tmp/pwn'",
        "cat touch.txt",
        "mytouch /tmp/x",
        "echo $HOME",
        "ls *.py",
        "grep -r touch .",
        "for f in a b; do echo $f; done",
        "[ -f x ] && echo yes",
    ],
)
def test_a_deny_rule_leaves_other_commands_alone(line):
    assert ToolPolicy(deny=["shell:touch *"]).check("shell", {"command": line}).action == "allow"


ALLOWLIST = ToolPolicy(default="deny", allow=["shell:sleep *", "shell:echo *", "shell:ls*"])


@pytest.mark.parametrize(
    ("line", "action"),
    [
        ("sleep 3; echo done", "allow"),
        ("sleep 1 && ls -la | echo x", "allow"),
        ("if ls; then echo yes; else echo no; fi", "allow"),
        ("f() { echo hi; }; f", "allow"),
        ("sleep 3; touch x", "deny"),
        ("echo $(touch x)", "deny"),
        ("echo hi | sh", "deny"),
        ("bash -c 'echo hi'", "deny"),  # bash itself is not on the list
        ("$c hi", "deny"),
        ("echo $HOME", "deny"),  # a hole never matches an allow rule
        ("/tmp/evil/echo hi", "deny"),  # another program named echo
        ("f; f() { echo; }", "deny"),  # f runs before it is defined
        ("PATH=/tmp echo hi", "deny"),
        ("echo 'unterminated", "deny"),
        ("X=1", "deny"),  # runs nothing an allow rule names
    ],
)
def test_a_line_made_only_of_allowed_commands_is_allowed(line, action):
    assert ALLOWLIST.check("shell", {"command": line}).action == action, line


def test_a_line_nested_past_what_is_read_fails_closed():
    line = "echo hi"
    for _ in range(6):
        line = f"sh -c {shlex.quote(line)}"
    assert ToolPolicy(deny=["shell:touch *"]).check("shell", {"command": line}).action == "deny"
    everything = ToolPolicy(default="deny", allow=["shell:sh *", "shell:echo *"])
    assert everything.check("shell", {"command": line}).action == "deny"
    shallow = "sh -c 'sh -c \"echo hi\"'"
    assert everything.check("shell", {"command": shallow}).action == "allow"


def test_tool_names_match_in_any_case():
    assert (
        ToolPolicy(deny=["SHELL:touch *"]).check("shell", {"command": "touch x"}).action == "deny"
    )
    assert ToolPolicy(deny=["Read_File"]).check("read_file", {"path": "a"}).action == "deny"
    assert ToolPolicy(deny=["mcp__Docs__*"]).check("mcp__docs__get", {}).action == "deny"


def test_arguments_nested_past_what_is_read_fail_closed():
    deep: object = "/etc/secret"
    for _ in range(8):
        deep = {"x": deep}
    many = ["a"] * 100 + ["/etc/secret"]
    for args in ({"q": deep}, {"q": many}):
        denied = ToolPolicy(deny=["mcp__fs__read:/etc/*"])
        assert denied.check("mcp__fs__read", args).action == "deny"
        allowed = ToolPolicy(default="deny", allow=["mcp__fs__read:*"])
        assert allowed.check("mcp__fs__read", args).action == "deny"
    shallow = ToolPolicy(deny=["mcp__fs__read:/etc/*"])
    assert shallow.check("mcp__fs__read", {"q": {"x": "/workspace/a"}}).action == "allow"


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


def test_an_always_answer_covers_only_calls_its_rule_surely_matches(tmp_path):
    policy = ToolPolicy(ask=["shell:rm *"])
    sure = policy.check("shell", {"command": "rm -rf build"})
    unread = policy.check("shell", {"command": "$c -rf build"})
    assert (sure.action, sure.sure) == ("ask", True)
    assert (unread.action, unread.rule, unread.sure) == ("ask", "shell:rm *", False)
    queue = ApprovalQueue(tmp_path)
    queue.add_always("shell:rm *")
    approver = FileApprover(queue, "default")

    async def answer(decision, command):
        request = ApprovalRequest(
            member="m",
            call_id="c",
            tool="shell",
            input={"command": command},
            rule=decision.rule,
            sure=decision.sure,
        )
        return await approver.ask(request, None)

    assert anyio.run(answer, sure, "rm -rf build").by == "always"
    refused = anyio.run(answer, unread, "$c -rf build")
    assert (refused.allowed, refused.by) == (False, "no terminal")
