"""Benchmark (not a test): what durable sessions (LangGraph checkpoints, issue 21) cost on a full session.

Each question runs twice on the embedded default (SmolLM2 with the shipped SFT adapter in-process, the real
local_search over the bundled demo corpus, a fresh SQLite log): once with checkpoints (`DurableSessions`, the
checkpoint file beside the log, pruned at the end) and once without, same seed. Reported per session:

- checkpoint_s: time spent awaiting the checkpointer (opening and set-up, every aput / aput_writes / aget_tuple,
  the prune), as a share of the checkpointed session's wall time. An upper bound of what it adds to the critical
  path: LangGraph writes checkpoints in the background while the next node runs;
- the wall times of both runs (their difference is noisier than checkpoint_s: sampling dominates a session).

    .venv/bin/python tests/benchmarks/checkpoint_overhead.py [--sessions 3] [--out overhead.json] [--wall-clock S]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

import app.service as service_module  # noqa: E402
from agent.checkpoint import CheckpointTarget, open_checkpointer  # noqa: E402
from agent.config import AgentConfig, RunOptions  # noqa: E402
from agent.ingest import ensure_demo_corpus  # noqa: E402
from agent.tools.registry import build_tools  # noqa: E402
from app.durable import DurableSessions  # noqa: E402
from app.service import ResearchService  # noqa: E402
from learning.engines.local_policy import TransformersPolicyClient  # noqa: E402
from learning.engines.weights import ensure_converted  # noqa: E402
from store.config import StoreConfig  # noqa: E402
from store.doc_index import DocIndex  # noqa: E402
from store.session_log import SessionLog  # noqa: E402
from store.session_log.checkpoints import SessionRuns  # noqa: E402

QUESTIONS = [
    "What language were books being translated into during the era of Haymo of Faversham?",
    "Are Christopher Nolan and Sathish Kalathil both film directors?",
    "Are both magazines, the Woman's Viewpoint and Pick Me Up, British publications?",
]
TIMED = ("aget_tuple", "aput", "aput_writes", "adelete_thread")


class CheckpointClock:
    """Seconds spent awaiting the checkpointer, and how many calls."""

    def __init__(self) -> None:
        self.seconds, self.calls = 0.0, 0

    def wrap(self, fn: Any) -> Any:
        async def timed(*a: Any, **kw: Any) -> Any:
            start = time.perf_counter()
            try:
                return await fn(*a, **kw)
            finally:
                self.seconds += time.perf_counter() - start
                self.calls += 1
        return timed


CLOCK = CheckpointClock()


@asynccontextmanager
async def timed_checkpointer(target: CheckpointTarget) -> AsyncIterator[Any]:
    start = time.perf_counter()
    async with open_checkpointer(target) as saver:
        CLOCK.seconds += time.perf_counter() - start  # connect + PRAGMAs + setup
        for name in TIMED:
            setattr(saver, name, CLOCK.wrap(getattr(saver, name)))
        yield saver


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sessions", type=int, default=3)
    ap.add_argument("--out", default="")
    ap.add_argument("--durable-first", action="store_true", help="run the checkpointed session of each pair first")
    ap.add_argument("--wall-clock", type=float, default=900.0, help="each run's time limit (raise it on busy cores)")
    args = ap.parse_args()
    service_module.open_checkpointer = timed_checkpointer  # type: ignore[assignment]  # count the saver's time
    work = Path(tempfile.mkdtemp(prefix="rubricem-bench-"))
    store = StoreConfig(data_dir=work)
    index = DocIndex(store)
    ensure_demo_corpus(index)
    adapter = ROOT / "agent" / "adapters" / "smollm2-sft"
    policy = TransformersPolicyClient(ensure_converted(ROOT / ".cache" / "models"), adapter_path=adapter)
    # The embedded default's budgets (token caps, 10 tool calls); short_form answers, seeded.
    options = RunOptions(format="short_form", seed=0, temperature=0.7, wall_clock_s=args.wall_clock)
    tools = build_tools(AgentConfig(), index)
    rows = []
    for i in range(args.sessions):
        question = QUESTIONS[i % len(QUESTIONS)]
        walls: dict[str, float] = {}
        for mode in ("durable", "plain") if args.durable_first else ("plain", "durable"):
            log = SessionLog(work / f"bench-{i}-{mode}.sqlite3")
            target = CheckpointTarget(sqlite_path=work / f"ckpt-{i}.sqlite3")
            durable = DurableSessions(target, SessionRuns(log)) if mode == "durable" else None
            svc = ResearchService(policy, tools, log, AgentConfig(), durable=durable)
            CLOCK.seconds, CLOCK.calls = 0.0, 0
            start = time.perf_counter()
            out = asyncio.run(svc.run(question, options))
            walls[mode] = time.perf_counter() - start
            turns = len(out.trajectory.turns)
            if mode == "durable":
                ckpt_s, ckpt_calls = CLOCK.seconds, CLOCK.calls
        rows.append({"question": question, "plain_wall_s": walls["plain"], "durable_wall_s": walls["durable"],
                     "checkpoint_s": ckpt_s, "checkpoint_calls": ckpt_calls,
                     "checkpoint_share": ckpt_s / walls["durable"], "turns": turns})
        print(json.dumps(rows[-1]), flush=True)  # a row as soon as its pair of sessions is done
    print(f"{'session':<8} {'plain s':>8} {'durable s':>10} {'ckpt s':>8} {'calls':>6} {'share':>7} {'turns':>6}")
    for i, r in enumerate(rows):
        print(f"{i:<8} {r['plain_wall_s']:8.2f} {r['durable_wall_s']:10.2f} {r['checkpoint_s']:8.3f}"
              f" {r['checkpoint_calls']:6d} {100 * r['checkpoint_share']:6.2f}% {r['turns']:6d}")
    median = statistics.median(r["checkpoint_share"] for r in rows)
    print(f"median checkpoint time: {100 * median:.2f}% of a session's wall time")
    if args.out:
        Path(args.out).write_text(json.dumps({"rows": rows, "median_checkpoint_share": median}, indent=2))


if __name__ == "__main__":
    main()
