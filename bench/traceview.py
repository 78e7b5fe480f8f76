"""Trace page speed: generate the HTML page of a 16 members x 200 turns run.

    .venv/bin/python bench/traceview.py [--members 16] [--turns 200] [--repeat 5]

Builds a synthetic run directory once (tests/tracegen.py: real trace events written
through TraceWriter, with offloads, compactions, screenshots and a failed member),
then times ``fleet trace RUN --html`` end to end in-process (read every trace.jsonl,
roll up, render, write) and prints the median and p95 wall time, the page size, and
the same for the text rollup and the OTel replay. Targets: page <= 3 s, <= 5 MB.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# The script's own directory holds bench/sandbox.py, which would shadow the sandbox
# package: put the tests directory (for tracegen) in its place.
sys.path[0] = str(ROOT / "tests")
sys.path.insert(1, str(ROOT))

import tracegen  # noqa: E402

from coordinator.traceview import load_run, rollup_run  # noqa: E402
from coordinator.traceview.html import write_page  # noqa: E402


def _timed(fn, repeat: int) -> list[float]:  # type: ignore[no-untyped-def]
    out = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t0)
    return out


def _report(label: str, times: list[float]) -> None:
    times = sorted(times)
    p95 = times[min(len(times) - 1, round(0.95 * (len(times) - 1)))]
    print(
        f"{label:<34} median {statistics.median(times):6.3f} s   p95 {p95:6.3f} s   (n={len(times)})"
    )


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--members", type=int, default=16)
    ap.add_argument("--turns", type=int, default=200)
    ap.add_argument("--repeat", type=int, default=5)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        t0 = time.perf_counter()
        exp = tracegen.make_run(Path(tmp), members=args.members, turns=args.turns)
        events = sum(1 for p in exp.run_dir.glob("members/*/trace.jsonl") for _ in p.open())
        trace_mb = sum(p.stat().st_size for p in exp.run_dir.glob("members/*/trace.jsonl")) / 1e6
        print(f"run: {args.members} members x {args.turns} turns, {events} events, "
              f"{trace_mb:.1f} MB of trace.jsonl (generated in {time.perf_counter() - t0:.1f} s)")  # fmt: skip
        out = Path(tmp) / "page.html"
        sizes = []

        def page() -> None:
            sizes.append(write_page(load_run(exp.run_dir), out))

        _report("html page (load+render+write)", _timed(page, args.repeat))
        print(f"{'html page size':<34} {sizes[-1] / 1e6:.2f} MB")
        _report(
            "text rollup (load+rollup)",
            _timed(lambda: rollup_run(load_run(exp.run_dir)), args.repeat),
        )
        try:
            from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

            from coordinator.traceview import otel
        except ImportError:
            print("otel replay: skipped (the 'otel' extra is not installed)")
        else:
            run = load_run(exp.run_dir)
            _report("otel replay (in-memory exporter)",
                    _timed(lambda: otel.export_run(run, exporter=InMemorySpanExporter()), 3))  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
