"""The result gate and cap, as pure functions (the loop tests cover them end to end)."""

from __future__ import annotations

import json

from loop_support import Answer

from subagents.results.result import ResultGate, estimate_tokens, truncate_to_cap


def test_truncation_fits_the_cap_keeps_short_fields_and_marks_every_cut() -> None:
    data = {
        "summary": "short and kept",
        "claims": [{"text": f"claim {i} " + "detail " * 200, "url": f"u{i}"} for i in range(30)],
    }
    out = truncate_to_cap(data, 500)
    assert estimate_tokens(json.dumps(out)) <= 500
    assert out["summary"] == "short and kept"
    cut = [c for c in out["claims"] if "truncated by Fleet" in c["text"]]
    assert cut and all(c["url"].startswith("u") for c in out["claims"])


def test_truncation_drops_trailing_list_items_when_strings_cannot_shrink() -> None:
    data = {"tags": [f"t{i}" for i in range(2_000)]}
    out = truncate_to_cap(data, 200)
    assert estimate_tokens(json.dumps(out)) <= 200
    assert out["tags"][:3] == ["t0", "t1", "t2"] and len(out["tags"]) < 2_000


def test_gate_rejects_invalid_then_asks_once_to_condense_then_truncates() -> None:
    gate = ResultGate(Answer, cap_tokens=100)
    bad = gate.submit({"answer": 1})
    assert bad.is_error and gate.accepted is None
    big = {"answer": "x " * 1_000}
    first = gate.submit(big)
    assert first.is_error and "cap is 100" in first.text and gate.accepted is None
    second = gate.submit(big)
    assert not second.is_error and gate.truncated
    assert gate.accepted is not None and estimate_tokens(json.dumps(gate.accepted)) <= 100
