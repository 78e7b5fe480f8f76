"""Inspecting a run's traces: loading, rollups, member detail, text, HTML and live follow."""

from coordinator.traceview.detail import MemberDetail, member_detail
from coordinator.traceview.load import RunNotFound, RunTrace, load_run
from coordinator.traceview.rollup import MemberRollup, RunRollup, rollup_run

__all__ = [
    "MemberDetail",
    "MemberRollup",
    "RunNotFound",
    "RunRollup",
    "RunTrace",
    "load_run",
    "member_detail",
    "rollup_run",
]
