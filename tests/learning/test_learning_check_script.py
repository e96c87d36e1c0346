"""The learning-check script: its statistics on hand-made samples, and one tiny end-to-end run (slow).

The full check (docs/learning_check/) takes about 50 minutes on 2 cores, too long for CI; the slow test runs the
same code path at one step so the script cannot rot unnoticed.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

from tests.scripts import load_script

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "tests" / "benchmarks" / "learning_check.py"


@pytest.fixture(scope="module")
def lc() -> ModuleType:
    return load_script(SCRIPT)


def sample(lc: ModuleType, question: int, sample_no: int, total: float) -> object:
    scores = {"plan": total, "research": total, "review": total, "answer": total, "total": total}
    return lc.SampleResult(question, sample_no, 0, scores, ["answer"], False, 0, "")


def test_eval_steps_always_include_base_and_last(lc: ModuleType) -> None:
    assert lc.eval_steps(7, 7) == [0, 7]
    assert lc.eval_steps(7, 3) == [0, 3, 6, 7]
    assert lc.eval_steps(4, 0) == [0, 1, 2, 3, 4]


def test_paired_difference_averages_samples_per_question(lc: ModuleType) -> None:
    base = [sample(lc, q, s, 0.2) for q in range(4) for s in range(2)]
    # question 0's two samples average 0.5; the others rise to 0.3
    after = [sample(lc, 0, 0, 0.4), sample(lc, 0, 1, 0.6)] + [sample(lc, q, s, 0.3) for q in (1, 2, 3) for s in (0, 1)]
    d = lc.paired_difference(base, after, "total", 500, 0)
    assert d["questions"] == 4
    assert d["mean"] == pytest.approx((0.3 + 0.1 * 3) / 4)
    assert d["ci_low"] <= d["mean"] <= d["ci_high"]
    assert d["p_sign_flip"] == pytest.approx(2 / 16)  # all four positive: only all-same-sign flips are as extreme


def test_paired_difference_without_common_questions_is_nan_not_an_error(lc: ModuleType) -> None:
    d = lc.paired_difference([sample(lc, 0, 0, 0.1)], [sample(lc, 1, 0, 0.9)], "total", 100, 0)
    assert d["questions"] == 0 and math.isnan(d["mean"])


def test_steps_to_target_is_the_first_step_above_base_plus_delta(lc: ModuleType) -> None:
    def point(step: int, total: float) -> object:
        return lc.EvalPoint(step, f"v@{step}", 0.0, {"total": total}, {})

    points = [point(0, 0.30), point(2, 0.31), point(4, 0.33), point(6, 0.40)]
    assert lc.steps_to_target(points, 0.30, 0.02) == 4
    assert lc.steps_to_target(points, 0.30, 0.20) is None


def test_pooled_difference_counts_each_runs_questions_as_their_own_units(lc: ModuleType) -> None:
    from dataclasses import asdict

    def report(base_total: float, final_total: float) -> dict:
        points = [{"samples": [asdict(sample(lc, q, 0, v)) for q in range(3)]} for v in (base_total, final_total)]
        return {"modes": [{"credit": "ss-grpo", "eval": points}]}

    d = lc.pooled_difference([report(0.2, 0.3), report(0.4, 0.4)], "ss-grpo", "total", 200, 0)
    assert d["questions"] == 6  # question 0 of run 1 and question 0 of run 2 are different units
    assert d["mean"] == pytest.approx((3 * 0.1 + 3 * 0.0) / 6)
    with pytest.raises(ValueError, match="answer-only"):
        lc.pooled_difference([report(0.2, 0.3)], "answer-only", "total")


@pytest.mark.slow
def test_one_step_run_writes_a_complete_report(smollm2_dir: Path, tmp_path: Path) -> None:
    out, data = tmp_path / "out", tmp_path / "data"
    cmd = [sys.executable, str(SCRIPT), "--steps", "1", "--eval-every", "1", "--heldout", "1", "--eval-samples", "1",
           "--n-questions", "3", "--batch-questions", "1", "--rollouts", "2", "--caps", "8,8,8,12",
           "--max-tool-calls", "1", "--snippets", "1", "--snippet-chars", "120", "--threads", "1",
           "--model-dir", str(smollm2_dir), "--data-dir", str(data), "--out", str(out)]
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    proc = subprocess.run(cmd, check=False, capture_output=True, text=True, timeout=900, env=env, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads((out / "learning_check.json").read_text(encoding="utf-8"))
    assert (out / "learning_check.png").stat().st_size > 0
    assert [m["credit"] for m in report["modes"]] == ["ss-grpo", "answer-only"]
    for mode in report["modes"]:
        assert [p["step"] for p in mode["eval"]] == [0, 1]  # the shared base point, then the step-1 adapter
        assert mode["eval"][0] == report["base"]
        assert len(mode["train_rows"]) == 1
        assert Path(mode["adapter"]).is_dir()
        for point in mode["eval"]:
            assert len(point["samples"]) == 1
            assert all(0.0 <= v <= 1.0 for v in point["mean"].values())
    assert set(report["summary"]) == {"ss-grpo", "answer-only"}
    assert "Δtotal" in proc.stdout
