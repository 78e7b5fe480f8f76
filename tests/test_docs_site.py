"""The documentation site builds strictly: a page missing from the navigation, a link
to a page or an anchor that is not there, an API reference to an object that does not
exist - each fails the build, so it fails here (``make docs`` builds it the same way)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MKDOCS = Path(sys.executable).with_name("mkdocs")


def _build(config: Path, site: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(MKDOCS), "build", "--strict", "-f", str(config), "-d", str(site)],
        cwd=ROOT,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


def _fleet_check(job: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """``fleet check JOB`` run from the job's directory, as a reader would."""
    return subprocess.run(
        [str(MKDOCS.with_name("fleet")), "check", job.name],
        cwd=job.parent,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_the_site_builds_strictly_with_every_page_and_the_api_reference(tmp_path: Path) -> None:
    done = _build(ROOT / "mkdocs.yml", tmp_path / "site")
    assert done.returncode == 0, done.stderr[-3000:]
    api = (tmp_path / "site" / "api" / "index.html").read_text(encoding="utf-8")
    for name in ("run_async", "RunHandle", "RunNotStarted"):
        assert 'id="coordinator.' in api and name in api, name
    # The benchmarks page is bench/README.md itself, read at build time (no copy).
    bench = (tmp_path / "site" / "benchmarks" / "index.html").read_text(encoding="utf-8")
    assert "bench/budget.py" in bench and "fresh-machine rehearsal" in bench
    pages = {p.stem for p in (ROOT / "docs").glob("*.md")}
    built = {p.parent.name for p in (tmp_path / "site").glob("*/index.html")} | {"index"}
    assert pages <= built, pages - built


def test_a_broken_link_fails_the_build(tmp_path: Path) -> None:
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "index.md").write_text("# Home\n\nSee [the missing page](missing.md).\n")
    config = tmp_path / "mkdocs.yml"
    config.write_text(f"site_name: t\ndocs_dir: {docs}\nnav:\n  - Home: index.md\n")
    done = _build(config, tmp_path / "site")
    assert done.returncode != 0 and "missing.md" in done.stderr, done.stderr[-2000:]


def test_the_readmes_links_into_the_docs_reach_a_page_and_its_heading() -> None:
    import re

    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    broken = []
    for target in re.findall(r"\]\((docs/[^)]+)\)", readme):
        path, _, anchor = target.partition("#")
        page = ROOT / path
        if not page.is_file():
            broken.append(target)
            continue
        if anchor:  # GitHub's anchors: the heading, lowercased, spaces as dashes
            heads = re.findall(r"^#+ (.*)$", page.read_text(encoding="utf-8"), flags=re.M)
            slugs = {re.sub(r"[^\w\- ]", "", h.lower()).replace(" ", "-") for h in heads}
            if anchor not in slugs:
                broken.append(target)
    assert not broken, broken


def test_the_readmes_bad_job_output_is_what_fleet_prints(tmp_path: Path) -> None:
    """The README shows what a bad job file prints; the same mistake, made for real,
    prints exactly that (the only output block the pages show)."""
    import re

    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    block = re.search(
        r"\n((?:    fleet: job file job\.toml is invalid:\n)(?:     [^\n]*\n)+)", readme
    )
    assert block, "the README's bad-job output block is gone: update this test with it"
    shown = "\n".join(line[4:] for line in block.group(1).splitlines())
    (tmp_path / "job.toml").write_text(
        'name = "t"\n[fanout]\nretry = { on = ["failed"] }\n'
        '[[members]]\nkind = "coding"\ntask = "x"\n'
    )
    done = _fleet_check(tmp_path / "job.toml", dict(os.environ))
    assert done.returncode == 2
    assert done.stderr.strip() == shown.strip(), done.stderr


def test_every_test_the_security_page_names_exists() -> None:
    import ast
    import re

    page = (ROOT / "docs" / "security.md").read_text(encoding="utf-8")
    named = set(re.findall(r"`(tests/test_\w+\.py)::(test_\w+)`", page))
    assert len(named) >= 15, "the guarantees table is gone or the reader is broken"
    missing = []
    for path, name in sorted(named):
        file = ROOT / path
        tree = ast.parse(file.read_text(encoding="utf-8")) if file.is_file() else None
        defined = {
            n.name
            for n in (ast.walk(tree) if tree else [])
            if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef)
        }
        if name not in defined:
            missing.append(f"{path}::{name}")
    assert not missing, missing


def test_the_readmes_first_job_plan_is_what_fleet_check_prints(tmp_path: Path) -> None:
    """The README's first job file, saved where it says (the repository's top), and the
    plan it shows for it: `fleet check` prints that, paths and image tags aside."""
    import re

    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    job = re.search(r"## Your first job file.*?```toml\n(.*?)```", readme, re.S)
    plan = re.search(r"\n((?:    job asyncio-cancellation: valid\n)(?:    [^\n]*\n)+)", readme)
    assert job and plan, "the README's first job file or its plan is gone: update this test"
    shown = "\n".join(line[4:] for line in plan.group(1).splitlines())
    (tmp_path / "examples").symlink_to(ROOT / "examples", target_is_directory=True)
    (tmp_path / "my-job.toml").write_text(job.group(1))
    env = {k: v for k, v in os.environ.items() if k != "ANTHROPIC_API_KEY"}
    done = _fleet_check(tmp_path / "my-job.toml", env)
    assert done.returncode == 0, done.stderr
    printed = done.stdout.replace(str(ROOT), "<clone>").replace(str(tmp_path), "<clone>")
    printed = re.sub(r"(fleet-\w+):[0-9a-f]{12}", r"\1:<tag>", printed)
    assert printed.strip() == shown.strip(), printed
