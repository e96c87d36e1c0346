"""Benchmark (not a test): what tracing costs a full research session, with spans exported to a real trace server.

Each mode runs in a process of its own, since a process configures tracing once: "off" (no OTLP endpoint: no
exporter, non-recording spans) and "on" (OTEL_EXPORTER_OTLP_ENDPOINT set to a phoenix started here from `.phoenix/`,
`make phoenix`). Both build the app as the CLI does (`app.container.build`: the embedded SmolLM2 with the shipped SFT
adapter, the bundled demo corpus, the default stage caps) and research the same questions with the same seed, so they
sample the same tokens (checked); the wall time and the process's CPU time (all its threads, the exporter's too) of
`ResearchService.run` are compared per question, the modes alternating. Wall times on a shared 2-core machine drift
by more than 1 % between runs, so it also measures what the spans themselves cost: the time to open and end one span
with the exporter on, times the spans a session made (counted in phoenix), as a share of the session's wall time.

    .venv/bin/python tests/benchmarks/tracing_overhead.py [--questions 2] [--rounds 1] [--out tracing.json]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

QUESTIONS = [
    "What language were books being translated into during the era of Haymo of Faversham?",
    "Are Christopher Nolan and Sathish Kalathil both film directors?",
    "Are both magazines, the Woman's Viewpoint and Pick Me Up, British publications?",
]
SEED = 7
MICRO_SPANS = 2000


def worker(questions: list[str], out: Path) -> None:
    """One mode: build the app from the environment, research each question, time it; with tracing on, also time
    bare spans."""
    import asyncio

    from agent import telemetry
    from app.container import build
    from app.settings import Settings

    services = build(Settings())  # configures tracing from OTEL_EXPORTER_OTLP_ENDPOINT, indexes the corpus once
    options = services.settings.agent.defaults.model_copy(update={"seed": SEED})
    rows: list[dict[str, Any]] = []

    async def go() -> None:
        try:
            for q in questions:
                start, cpu = time.perf_counter(), time.process_time()
                outcome = await services.research.run(q, options, source="eval")
                wall, cpu = time.perf_counter() - start, time.process_time() - cpu
                ids = [i for t in outcome.trajectory.turns for i in t.token_ids]
                rows.append({"question": q, "session_id": outcome.session_id, "wall_s": wall, "cpu_s": cpu,
                             "tokens": len(ids),
                             "tokens_sha": hashlib.sha256(json.dumps(ids).encode()).hexdigest()[:16]})
        finally:
            await services.policy.aclose()

    asyncio.run(go())
    micro = None
    if telemetry.tracing_enabled():
        start = time.perf_counter()
        for _ in range(MICRO_SPANS):  # a stage span holding a policy-call span: two spans, with their attributes
            with telemetry.stage_span("bench"), telemetry.policy_call(stage="bench", model="embedded",
                                                                      input_tokens=100, max_tokens=64) as call:
                call.finish(output_tokens=10, finish_reason="stop")
        micro = (time.perf_counter() - start) / (2 * MICRO_SPANS)
    out.write_text(json.dumps({"rows": rows, "seconds_per_span": micro, "tracing": telemetry.tracing_enabled()}))


def run_mode(mode: str, questions: list[str], data: Path, endpoint: str, work: Path) -> dict[str, Any]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RUBRICEM_", "OTEL_"))}
    env.update({"RUBRICEM_STORE__DATA_DIR": str(data), "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
                "TOKENIZERS_PARALLELISM": "false"})
    if mode == "on":
        env["OTEL_EXPORTER_OTLP_ENDPOINT"] = endpoint
    out = work / f"{mode}-{time.monotonic_ns()}.json"
    cmd = [sys.executable, __file__, "--worker", str(out), "--worker-questions", json.dumps(questions)]
    subprocess.run(cmd, cwd=ROOT, env=env, check=True)
    result = json.loads(out.read_text())
    assert result["tracing"] == (mode == "on"), result
    return dict(result)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--questions", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=1, help="off/on pairs per question (the order alternates)")
    ap.add_argument("--out", default="")
    ap.add_argument("--worker", default="", help=argparse.SUPPRESS)
    ap.add_argument("--worker-questions", default="[]", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        worker(json.loads(args.worker_questions), Path(args.worker))
        return

    from tests.phoenix import running_phoenix, why_missing

    if (reason := why_missing()) is not None:
        sys.exit(reason)
    work = Path(tempfile.mkdtemp(prefix="rubricem-trace-bench-"))
    (work / "phoenix").mkdir()
    data = work / "data"
    questions = QUESTIONS[: args.questions]
    pairs: list[tuple[dict[str, Any], dict[str, Any]]] = []
    with running_phoenix(work / "phoenix") as phoenix:
        run_mode("off", questions[:1], data, phoenix.endpoint, work)  # warm-up: index the corpus, fill page caches
        for r in range(args.rounds):
            order = ["off", "on"] if r % 2 == 0 else ["on", "off"]
            got = {mode: run_mode(mode, questions, data, phoenix.endpoint, work) for mode in order}
            pairs.append((got["off"], got["on"]))
        spans = phoenix.wait_for("research_session", count=len(questions) * args.rounds)
    per_trace: dict[str, int] = {}
    for s in spans:
        per_trace[s["context"]["trace_id"]] = per_trace.get(s["context"]["trace_id"], 0) + 1
    trace_of = {s["attributes"].get("rubricem.session.id"): s["context"]["trace_id"]
                for s in spans if s["name"] == "research_session"}

    rows = []
    for off, on in pairs:
        for a, b in zip(off["rows"], on["rows"], strict=True):
            n_spans = per_trace.get(trace_of.get(b["session_id"], ""), 0)
            span_cost = n_spans * on["seconds_per_span"]
            rows.append({"question": a["question"][:40], "off_s": a["wall_s"], "on_s": b["wall_s"],
                         "ratio": b["wall_s"] / a["wall_s"], "cpu_ratio": b["cpu_s"] / a["cpu_s"],
                         "same_tokens": a["tokens_sha"] == b["tokens_sha"],
                         "tokens": b["tokens"], "spans": n_spans, "span_cost_s": span_cost,
                         "span_cost_share": span_cost / b["wall_s"]})
    print(f"{'question':<42} {'off s':>8} {'on s':>8} {'on/off':>7} {'cpu on/off':>10} {'same tokens':>11} "
          f"{'spans':>6} {'span cost':>10} {'share':>8}")
    for r in rows:
        print(f"{r['question']:<42} {r['off_s']:8.2f} {r['on_s']:8.2f} {r['ratio']:7.4f} {r['cpu_ratio']:10.4f} "
              f"{str(r['same_tokens']):>11} {r['spans']:6d} {1000 * r['span_cost_s']:8.2f}ms "
              f"{100 * r['span_cost_share']:7.4f}%")
    ratio = sum(r["on_s"] for r in rows) / sum(r["off_s"] for r in rows)
    cpu_ratio = statistics.median(r["cpu_ratio"] for r in rows)
    per_span = statistics.median(on["seconds_per_span"] for _, on in pairs)
    print(f"wall time on/off over all sessions: {ratio:.4f} ({100 * (ratio - 1):+.2f} %; includes run-to-run noise)")
    print(f"process CPU time on/off, median: {cpu_ratio:.4f} ({100 * (cpu_ratio - 1):+.2f} %)")
    print(f"one span with the exporter on: {1e6 * per_span:.1f} µs; spans' share of a session's wall time: "
          f"{100 * max(r['span_cost_share'] for r in rows):.4f} % at most (target < 1 %)")
    if args.out:
        Path(args.out).write_text(json.dumps({"rows": rows, "wall_ratio": ratio, "cpu_ratio": cpu_ratio,
                                              "seconds_per_span": per_span}, indent=2))


if __name__ == "__main__":
    main()
