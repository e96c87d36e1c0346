"""What every flow test that runs the retrain gate checks: the gate decided from the scores it recorded.

Some flow tests run the gate at a wide tolerance because one training step cannot make a candidate measurably better
(test_retrain_loop.py's test_the_real_gate_promotes_a_better_candidate_... covers the decision at the default
tolerance on versions that really differ). Even there the decision must follow from the recorded evidence: the
candidate's and live's probe totals, their failed runs and the tolerance, stored with the version and the cycle.
"""

from __future__ import annotations

import math
from typing import Any

from store.registry import Registry


def assert_gate_decided(reg: Registry, cycle: Any, tolerance: float) -> dict[str, Any]:
    """Check the cycle's recorded gate report against the gate's rule; returns the report."""
    version = reg.get(cycle.candidate)
    report = version.eval_report
    assert report is not None, f"{cycle.candidate} has no gate report"
    cand, live = report["candidate"], report["live"]
    assert report["tolerance"] == tolerance
    assert cand["version"] == cycle.candidate and cand["runs"] >= 1 and live["runs"] >= 1
    assert 0.0 <= live["total"] <= 1.0 and (0.0 <= cand["total"] <= 1.0 or not math.isfinite(cand["total"]))
    assert cycle.numbers["candidate_score"] == cand["total"] and cycle.numbers["live_score"] == live["total"]
    expected = (math.isfinite(cand["total"]) and cand["failed_runs"] <= live["failed_runs"]
                and cand["total"] + tolerance >= live["total"])
    assert report["promote"] is expected, report
    assert cycle.status == ("promoted" if expected else "rejected"), (cycle.status, report)
    assert cycle.numbers["reason"] == report["reason"] and version.status == cycle.status
    return report
