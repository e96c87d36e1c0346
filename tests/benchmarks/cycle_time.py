"""Benchmark (not a test): how long one retraining cycle takes on the embedded default, by stage.

Runs N real research sessions (embedded SmolLM2, bundled corpus), then one `retrain` cycle with the configured step
budget, and prints the cycle's stage timings. Judging is the only stage whose cost grows with the number of new
sessions (the step budget and the probe set are fixed), so the time per 100 sessions is reported as
judge_seconds / N * 100 + train_seconds + gate_seconds, labelled as that extrapolation.

    .venv/bin/python tests/benchmarks/cycle_time.py [--sessions 4] [--steps 1] [--out cycle.json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from agent.config import AgentConfig, RunOptions, StageTokenCaps  # noqa: E402
from app.container import build  # noqa: E402
from app.scheduler import run_cycle  # noqa: E402
from app.settings import Settings  # noqa: E402
from learning.config import LearningConfig, RetrainConfig  # noqa: E402
from learning.engines.weights import ensure_converted  # noqa: E402
from learning.questions import bundled_questions  # noqa: E402
from store.config import StoreConfig  # noqa: E402


def main() -> None:
    """Sessions, one cycle, timings."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sessions", type=int, default=4)
    ap.add_argument("--steps", type=int, default=1)
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    data = Path(tempfile.mkdtemp(prefix="cycle-bench-"))
    small = RunOptions(format="short_form", max_tool_calls=1, temperature=0.7, seed=1, wall_clock_s=600,
                       token_caps=StageTokenCaps(plan=48, research=24, review=32, answer=48), context_tokens=4096)
    retrain = RetrainConfig(steps=args.steps, rollouts=2, batch_questions=2, max_token_caps=32,
                            tolerance=1.0,  # a timing benchmark: every phase runs, whatever the gate would decide
                            unload_grace_s=0)
    settings = Settings(agent=AgentConfig(embedded_model_path=ensure_converted(ROOT / ".cache" / "models"),
                                          defaults=small),
                        store=StoreConfig(data_dir=data), learning=LearningConfig(retrain=retrain))

    async def sessions() -> float:
        services = build(settings)
        began = time.monotonic()
        try:
            for q in bundled_questions(args.sessions, seed=5):
                await services.research.run(q, small)
        finally:
            await services.policy.aclose()
        return time.monotonic() - began

    session_s = asyncio.run(sessions())
    began = time.monotonic()
    result = asyncio.run(run_cycle(settings, trigger="cli", force=True, say=lambda m: print(m, file=sys.stderr)))
    cycle_s = time.monotonic() - began
    n = result.cycle.numbers
    per_100 = n["judge_seconds"] / args.sessions * 100 + n["train_seconds"] + n["gate_seconds"]
    out = {"sessions": args.sessions, "session_seconds": round(session_s, 1), "cycle_seconds": round(cycle_s, 1),
           "status": result.cycle.status, "judge_seconds": n["judge_seconds"], "train_seconds": n["train_seconds"],
           "gate_seconds": n["gate_seconds"], "steps": args.steps,
           "extrapolated_cycle_seconds_per_100_sessions": round(per_100, 1)}
    print(json.dumps(out, indent=2))
    if args.out:
        args.out.write_text(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
