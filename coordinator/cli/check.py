"""``fleet check JOB.toml [--json]``: a job validated and its plan shown, nothing run.

The same reading as ``fleet run`` (:func:`~coordinator.job.jobfile.load_job`: the TOML,
every field, paths against the job file, a ``[merge]``'s members): exit 2 with each
problem named as ``fleet run`` would name it, else exit 0 and the plan - each member with
its kind, model, box (image, runtime, CPU, memory, network), limits, repository, test,
setup, attempts, tools and policy; the research or lead question; the budget, the egress
allowlist, the quorum and how many run at once; where members would run; the images
Docker would be asked for. No Docker engine, Ray cluster or model is contacted: image
references are computed from the files they are built from.
"""

from __future__ import annotations

import argparse
import json
import os
from typing import Any

from subagents.kinds import get_kind
from subagents.model import ModelError, parse_model, resolve_model

from ..errors import UsageError
from ..job.jobfile import JobError, load_job
from ..job.spec import Job, MemberJob


def register(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "check", help="validate a job file and print its plan, without running anything"
    )
    p.add_argument("job", help="path to a job .toml file")
    p.add_argument("--json", action="store_true", help="print the plan as JSON")
    p.set_defaults(func=cmd_check)


def cmd_check(args: argparse.Namespace) -> int:
    try:
        job, _ = load_job(args.job)
    except JobError as exc:
        raise UsageError(str(exc)) from None
    found = plan(job)
    problems = [m["model_problem"] for m in found["members"] if m.get("model_problem")]
    if problems:
        raise UsageError(f"job file {args.job} is invalid:\n  " + "\n  ".join(problems))
    from ..runner.preflight import check_budget

    check_budget(job)  # a line that cannot carry one first call: as `fleet run` refuses it
    print(json.dumps(found, indent=2) if args.json else render(found))
    return 0


def _model(name: str, where: str) -> tuple[str, str | None]:
    """The model a name resolves to, or the problem with it."""
    try:
        choice = parse_model(resolve_model(name))
    except ModelError as exc:
        return name, f"{where}: {exc}"
    return choice.name, None


def _member(job: Job, i: int, m: MemberJob) -> dict[str, Any]:
    from sandbox.spec import NetworkPolicy

    kind = get_kind(m.kind)
    network = (
        NetworkPolicy(egress="allowlist", allow=tuple(job.egress.allow))
        if kind.reads_web
        else NetworkPolicy()
    )
    box = m.sandbox.box(kind.box_kind, network=network, runtime=job.sandbox.runtime)
    model, problem = _model(m.model or job.model.name, f"members[{i}].model")
    entry: dict[str, Any] = {
        "id": m.id,
        "kind": m.kind,
        "model": model,
        "box": {
            "image": box.image or f"fleet-{kind.box_kind} (Fleet's)",
            "runtime": box.runtime,
            "cpus": box.cpus,
            "memory": box.memory,
            "pids": box.pids,
            "network": "none"
            if network.egress == "none"
            else "allowlist: " + ", ".join(network.allow),
        },
        "limits": m.limits.model_dump(),
    }
    for name in ("repo", "test"):
        if getattr(m, name):
            entry[name] = getattr(m, name)
    if m.setup is not None:
        entry["setup"] = m.setup.model_dump(exclude_defaults=True)
    if m.attempts != 1:
        entry["attempts"] = m.attempts
    if m.tools:
        entry["tools"] = [t.name for t in m.tools]
    if m.mcp:
        entry["mcp"] = [s.name for s in m.mcp]
    if m.policy is not None:
        entry["policy"] = m.policy.model_dump(exclude_defaults=True)
    if m.memory is not None:
        entry["memory"] = m.memory.profile
    if problem:
        entry["model_problem"] = problem
    return entry


def plan(job: Job) -> dict[str, Any]:
    """What ``fleet run`` would do with ``job`` (see the module docstring), as data."""
    from sandbox.images.catalog import current_refs

    from ..runner.preflight import needed_images

    members = [_member(job, i, m) for i, m in enumerate(job.members)]
    out: dict[str, Any] = {"name": job.name, "valid": True, "members": members}
    if job.research is not None:
        out["research"] = {"question": job.research.question, "members": job.research.members}
    if job.lead is not None:
        lead = job.lead
        out["lead"] = {
            "question": lead.question,
            "first_wave": lead.members,
            "max_members": lead.max_members,
            "max_waves": lead.max_waves,
            "kinds": list(lead.kinds),
        }
    if job.merge is not None and job.merge.enabled:
        out["merge"] = {
            "members": [m.id for m in job.merged_members()],
            "test": job.merge_test(),
        }
    out["fanout"] = {
        "members": job.member_count,
        "min_success": job.fanout.min_success,
        "max_parallel": job.fanout.max_parallel or "chosen from the engine's host at run time",
        "fail_fast": job.fanout.fail_fast,
        "retry": job.fanout.retry.model_dump(),
    }
    if job.budget is not None:
        out["budget"] = job.budget.model_dump(exclude_none=True)
    out["egress"] = list(job.egress.allow)
    out["policy"] = job.policy.model_dump(exclude_defaults=True)
    cluster = os.environ.get("FLEET_CLUSTER", "").strip()
    out["runs_on"] = f"the Ray cluster at {cluster} (FLEET_CLUSTER)" if cluster else "this host"
    names = needed_images(job)
    try:
        refs = current_refs(names) if names else {}
    except Exception:  # a Fleet installed without images/: the names are still right
        refs = {n: n for n in names}
    out["images"] = [refs.get(n, n) for n in names]
    out["output_dir"] = job.output_dir
    return out


def render(found: dict[str, Any]) -> str:
    """The plan as a person reads it."""
    lines = [f"job {found['name']}: valid"]
    for m in found["members"]:
        box, lim = m["box"], m["limits"]
        lines.append(
            f"  {m['id']}  {m['kind']}  model {m['model']}  box {box['image']} "
            f"({box['runtime']}, {box['cpus']:g} CPU, {box['memory']}, network {box['network']})"
        )
        tokens = f", {lim['max_tokens']:,} tokens" if lim.get("max_tokens") else ""
        lines.append(
            f"      limits: {lim['max_turns']} turns, {lim['deadline_s']:g} s{tokens}, "
            f"result {lim['result_tokens']} tokens"
        )
        for key in ("repo", "test", "attempts", "setup", "tools", "mcp", "policy", "memory"):
            if key in m:
                value = m[key]
                shown = ", ".join(value) if isinstance(value, list) else value
                lines.append(f"      {key}: {shown}")
    for key in ("research", "lead", "merge"):
        if key in found:
            lines.append(f"{key}: " + ", ".join(f"{k} {v}" for k, v in found[key].items()))
    f = found["fanout"]
    lines.append(
        f"quorum: {f['min_success']} of {f['members']} ok; at once: {f['max_parallel']}; "
        f"retry on {', '.join(f['retry']['on']) or 'nothing'} up to {f['retry']['attempts']} attempts"
    )
    if "budget" in found:
        lines.append("budget: " + ", ".join(f"{k} {v}" for k, v in found["budget"].items()))
    lines.append(f"egress allowlist: {', '.join(found['egress']) or 'none'}")
    lines.append(f"runs on: {found['runs_on']}")
    lines.append(f"images: {', '.join(found['images']) or 'none'}")
    lines.append("nothing was run: 'fleet run' takes the same file")
    return "\n".join(lines)
