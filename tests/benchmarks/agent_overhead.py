"""Benchmark (not a test): the agent's own overhead as a share of a full session's wall time.

Overhead = wall time of `ResearchService.run` minus the time spent inside the policy (render, tokenize, generate)
minus the time spent inside search tools. What remains is the graph, the session log writes, prompt rendering,
tool-output formatting, citation checking and report building. Runs real sessions with the embedded SmolLM2 and the
real local_search over the bundled demo corpus, each on a fresh SQLite log.

    .venv/bin/python tests/benchmarks/agent_overhead.py [--sessions 3] [--out overhead.json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from agent.config import AgentConfig, RunOptions, StageTokenCaps  # noqa: E402
from agent.ingest import ensure_demo_corpus  # noqa: E402
from agent.tools.registry import build_tools  # noqa: E402
from app.service import ResearchService  # noqa: E402
from learning.engines.local_policy import TransformersPolicyClient  # noqa: E402
from learning.engines.weights import ensure_converted  # noqa: E402
from store.config import StoreConfig  # noqa: E402
from store.doc_index import DocIndex  # noqa: E402
from store.session_log import SessionLog  # noqa: E402

QUESTIONS = [
    "What language were books being translated into during the era of Haymo of Faversham?",
    "Are Christopher Nolan and Sathish Kalathil both film directors?",
    "Are both magazines, the Woman's Viewpoint and Pick Me Up, British publications?",
]


class Timer:
    """Accumulates seconds per category."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {"model": 0.0, "search": 0.0}

    async def timed(self, kind: str, coro: Any) -> Any:
        start = time.perf_counter()
        try:
            return await coro
        finally:
            self.seconds[kind] += time.perf_counter() - start


class TimedPolicy:
    """Forwards to the real policy and counts the time spent inside it."""

    def __init__(self, inner: Any, timer: Timer) -> None:
        self.inner, self.timer = inner, timer

    @property
    def policy_version(self) -> str:
        return str(self.inner.policy_version)

    async def render_prompt(self, messages: Sequence[Any]) -> Any:
        return await self.timer.timed("model", self.inner.render_prompt(messages))

    async def tokenize(self, text: str) -> Any:
        return await self.timer.timed("model", self.inner.tokenize(text))

    async def generate(self, context: Any, **kw: Any) -> Any:
        return await self.timer.timed("model", self.inner.generate(context, **kw))

    async def aclose(self) -> None:
        pass


class TimedTool:
    """Forwards to a real search tool and counts the time spent inside it."""

    def __init__(self, inner: Any, timer: Timer) -> None:
        self.inner, self.timer = inner, timer
        self.name, self.description = inner.name, inner.description

    async def __call__(self, query: str, attrs: Mapping[str, str], call_id: str) -> Any:
        return await self.timer.timed("search", self.inner(query, attrs, call_id))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sessions", type=int, default=3)
    ap.add_argument("--out", default="")
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="rubricem-bench-"))
    store = StoreConfig(data_dir=work)
    index = DocIndex(store)
    ensure_demo_corpus(index)
    policy = TransformersPolicyClient(ensure_converted(ROOT / ".cache" / "models"))
    options = RunOptions(format="short_form", max_tool_calls=2, seed=0, temperature=0.7,
                         token_caps=StageTokenCaps(plan=96, research=64, review=64, answer=96))
    rows = []
    for i in range(args.sessions):
        timer = Timer()
        tools = {n: TimedTool(t, timer) for n, t in build_tools(AgentConfig(), index).items()}
        log = SessionLog(work / f"bench-{i}.sqlite3")
        svc = ResearchService(TimedPolicy(policy, timer), tools, log, AgentConfig())  # type: ignore[arg-type]
        start = time.perf_counter()
        out = asyncio.run(svc.run(QUESTIONS[i % len(QUESTIONS)], options))
        wall = time.perf_counter() - start
        overhead = wall - timer.seconds["model"] - timer.seconds["search"]
        rows.append({"session": out.session_id, "wall_s": wall, "model_s": timer.seconds["model"],
                     "search_s": timer.seconds["search"], "overhead_s": overhead, "overhead_share": overhead / wall,
                     "turns": len(out.trajectory.turns), "tool_calls": len(out.trajectory.tool_calls)})
    print(f"{'session':<8} {'wall s':>8} {'model s':>8} {'search s':>9} {'overhead s':>11} {'share':>7} {'turns':>6}")
    for i, r in enumerate(rows):
        print(f"{i:<8} {r['wall_s']:8.2f} {r['model_s']:8.2f} {r['search_s']:9.3f} {r['overhead_s']:11.3f}"
              f" {100 * r['overhead_share']:6.2f}% {r['turns']:6d}")
    median = statistics.median(r["overhead_share"] for r in rows)
    print(f"median agent overhead: {100 * median:.2f}% of wall time")
    if args.out:
        Path(args.out).write_text(json.dumps({"rows": rows, "median_overhead_share": median}, indent=2))


if __name__ == "__main__":
    main()
