"""`rubricem eval --runs N` as a user runs it (subprocess, the embedded default and the bundled demo corpus): one
shipped held-out question, tiny token caps, two seeds; the printed and written means and standard deviations are the
ones of the two runs' own summaries, and every item has its tokens and cost."""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

import pytest

from tests.eval.support import HELDOUT

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_eval_over_two_seeds_prints_and_writes_mean_std_tokens_and_cost(smollm2_dir: Path, tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("RUBRICEM_")}
    env.update({
        "RUBRICEM_STORE__DATA_DIR": str(tmp_path / "data"),
        "RUBRICEM_AGENT__EMBEDDED_MODEL_PATH": str(smollm2_dir),  # skip a second conversion
        "RUBRICEM_AGENT__DEFAULTS__TOKEN_CAPS__PLAN": "32",
        "RUBRICEM_AGENT__DEFAULTS__TOKEN_CAPS__RESEARCH": "24",
        "RUBRICEM_AGENT__DEFAULTS__TOKEN_CAPS__REVIEW": "24",
        "RUBRICEM_AGENT__DEFAULTS__TOKEN_CAPS__ANSWER": "32",
        # A table that does not list the policy: the embedded one runs in this process and still costs 0.
        "RUBRICEM_PRICES": json.dumps({"some-api-model": {"input_per_mtok": 1.0, "output_per_mtok": 2.0}}),
        "HF_HUB_OFFLINE": "1",
    })  # fmt: skip
    out = tmp_path / "eval"
    p = subprocess.run([sys.executable, "-m", "app.cli", "eval", "hotpotqa", "--data", str(HELDOUT), "--limit", "1",
                        "--runs", "2", "--max-tool-calls", "1", "--adapter", "none", "--out", str(out)],
                       cwd=ROOT, env=env, capture_output=True, text=True, timeout=600, check=False)
    assert p.returncode == 0, p.stderr[-3000:]
    assert "run 1/2 [1/1]" in p.stderr and "run 2/2 [1/1]" in p.stderr
    per_run = [json.loads((out / f"run-{k}" / "summary.json").read_text()) for k in (1, 2)]
    top = json.loads((out / "summary.json").read_text())
    assert top["seeds"] == [0, 1] and [r["out_dir"] for r in top["runs"]] == [str(out / "run-1"), str(out / "run-2")]
    assert not (out / "items.jsonl").exists()  # the runs keep their own items
    assert {"em", "f1", "cover_em"} <= top["metrics"].keys()
    for name, mean in top["metrics"].items():
        values = [r["metrics"][name] for r in per_run]
        std = statistics.stdev(values)
        assert mean == pytest.approx(statistics.mean(values)) and top["metrics_std"][name] == pytest.approx(std)
        assert f"  {name:<22} {mean:.4f} ± {std:.4f}\n" in p.stdout
    for k in (1, 2):
        (item,) = [json.loads(x) for x in (out / f"run-{k}" / "items.jsonl").read_text().splitlines()]
        assert item["tokens"]["policy_calls"] > 0 and item["tokens"]["policy_prompt"] > item["tokens"]["policy_sampled"]
        assert item["policy_model"] == "embedded" and item["cost_usd"] == {"policy": 0.0, "judge": 0.0, "total": 0.0}
    total = sum(r["tokens"]["policy_prompt"] for r in per_run)
    assert top["tokens"]["policy_prompt"] == total and f"tokens policy {total} in / " in p.stdout
    assert "cost $0 (policy embedded $0, judge $0)" in p.stdout
