"""A large job starts its first member in seconds, through the real ``fleet run``.

Once, every queued member cost an fsync'd journal line and two whole-list
comparisons before the first one started: 3,000 members waited about a minute,
10,000 more than eight (``bench/start.py`` has the figures).
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from process_support import popen

FLEET = str(Path(sys.executable).with_name("fleet"))
MEMBERS = 3_000


@pytest.mark.docker
@pytest.mark.slow
def test_a_job_of_3000_members_starts_its_first_member_within_seconds(
    tmp_path, images, docker_client
):
    from conftest import remove_run

    out = tmp_path / "runs"
    member = '[[members]]\nkind = "coding"\ntask = "Say hello."\n'
    job = tmp_path / "many.toml"
    job.write_text(
        f'name = "many"\noutput_dir = {json.dumps(str(out))}\n[model]\nname = "offline"\n'
        "[fanout]\nmax_parallel = 2\n" + member * MEMBERS
    )
    proc = popen([FLEET, "run", str(job), "--plain"], stderr=subprocess.PIPE, text=True)
    assert proc.stderr is not None
    made = first = None
    try:
        for line in proc.stderr:
            if line.startswith("fleet: run "):
                made = time.monotonic()
            if ": running" in line:
                first = time.monotonic()
                break
    finally:
        proc.send_signal(signal.SIGINT)
        rest = proc.stderr.read()
        proc.wait(timeout=120)
        for run in out.glob("many-*"):
            remove_run(docker_client, run.name)
    assert made is not None and first is not None, rest
    assert first - made < 20, f"{first - made:.1f}s from the run directory to the first member"
    assert proc.returncode == 130, rest
    (run,) = out.glob("many-*")
    events = [json.loads(line)["event"] for line in (run / "journal.jsonl").open()]
    assert events.count("member_queued") == MEMBERS and events[-1] == "run_interrupted"
