"""Benchmark (not a test): the embedded llama.cpp engine on cores it shares, with and without the contention guard.

llama.cpp's worker threads busy-wait at every barrier of a forward pass, so a decode at more threads than the cores
left free waits a scheduler time slice per barrier (`learning.engines.threads.ContentionGuard`). This script
decodes the same greedy tokens through `EmbeddedLlamaCppClient` in five settings and prints each one's time and
its ratio to the idle one-thread run, all in one run on one machine:

    idle, 1 thread · idle, N threads (N = usable CPUs)
    beside a neighbour, 1 thread · N threads fixed (no guard) · N threads from a measured plan (guarded)

The neighbour is another process running torch matrix products on every CPU (what a training step or a second
decoder does to the cores). Every run decodes from a fresh prompt so that the KV cache is the same. The collapse is
bimodal (measured: 6 tokens at 2 threads took 0.48 s in one try and 17.7-18.3 s in three others, with the same
neighbour), so each setting beside the neighbour runs `--reps` times, the three in turn, and the table shows the
median and the slowest.

    .venv/bin/python tests/benchmarks/contention.py [--tokens 24] [--reps 6] [--out contention.json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from agent.protocols import ChatMessage  # noqa: E402
from learning.engines.llamacpp_engine import EmbeddedLlamaCppClient  # noqa: E402
from learning.engines.weights import bundled_gguf_path, ensure_converted  # noqa: E402
from learning.engines.threads import ContentionGuard, ThreadPlan, available_cpus  # noqa: E402

MESSAGES = [ChatMessage("system", "You are a helpful assistant."),
            ChatMessage("user", "Write a short history of the Franciscan order.")]
NEIGHBOUR = ("import torch\ntorch.set_num_threads({n})\na = torch.randn(1024, 1024)\n"
             "while True:\n    a @ a\n")


def decode_seconds(client: EmbeddedLlamaCppClient, tokens: int) -> tuple[float, tuple[int, ...]]:
    """Seconds to prefill the prompt and decode `tokens` greedy tokens, and the tokens."""
    ctx = asyncio.run(client.render_prompt(MESSAGES))
    client._invalidate_cache()  # a fresh prefill each run
    began = time.perf_counter()
    gen = asyncio.run(client.generate(ctx, stop=[], max_tokens=tokens, temperature=0.0))
    return time.perf_counter() - began, gen.token_ids


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tokens", type=int, default=24)
    p.add_argument("--reps", type=int, default=6)
    p.add_argument("--out", type=Path)
    a = p.parse_args(argv)
    cpus = available_cpus()
    gguf = bundled_gguf_path()
    model_dir = ensure_converted(ROOT / ".cache" / "models", gguf)
    cache = ROOT / ".cache" / "gguf-lora"
    one = EmbeddedLlamaCppClient(model_dir, gguf, lora_cache=cache, threads=1, batch_threads=1)
    many = EmbeddedLlamaCppClient(model_dir, gguf, lora_cache=cache, threads=cpus, batch_threads=cpus)
    rows: dict[str, list[float]] = {}
    same: list[bool] = []
    try:
        decode_seconds(many, 4)  # warm-up: thread pools, first-touch pages
        decode_seconds(one, 4)
        seconds, want = decode_seconds(one, a.tokens)
        rows["idle, 1 thread"] = [seconds]
        seconds, got = decode_seconds(many, a.tokens)
        rows[f"idle, {cpus} threads"] = [seconds]
        same.append(got == want)
        # The guard's measured step: a one-token step at `cpus` threads on the idle machine (prompt included: an
        # overestimate, so the guard trips later than the product's, never earlier).
        plan = ThreadPlan(cpus, cpus, "measured", timings={"decode": {str(cpus): seconds / max(1, a.tokens)}})
        guard = ContentionGuard(plan, "llama.cpp")
        neighbour = subprocess.Popen([sys.executable, "-c", NEIGHBOUR.format(n=cpus)])
        try:
            time.sleep(2.0)
            for _ in range(a.reps):
                for name, client, guarded in (("neighbour, 1 thread", one, None),
                                              (f"neighbour, {cpus} threads, no guard", many, None),
                                              (f"neighbour, {cpus} threads, guarded", many, guard)):
                    client.engine.guard = guarded
                    guard.until = 0.0  # each guarded run starts on the plan's count, as after a quiet minute
                    seconds, tokens = decode_seconds(client, a.tokens)
                    rows.setdefault(name, []).append(seconds)
                    same.append(tokens == want)
            many.engine.guard = None
        finally:
            neighbour.kill()
            neighbour.wait()
    finally:
        for client in (one, many):
            asyncio.run(client.aclose())
    base = rows["idle, 1 thread"][0]
    result = {"cpus": cpus, "tokens": a.tokens, "reps": a.reps,
              "seconds": {k: [round(x, 3) for x in v] for k, v in rows.items()},
              "median_ratio_to_idle_1_thread": {k: round(statistics.median(v) / base, 2) for k, v in rows.items()},
              "guard_trips": guard.trips, "same_tokens": all(same)}
    print(f"{'setting':<40} {'median':>9} {'slowest':>9}   median / idle 1 thread")
    for name, times in rows.items():
        median = statistics.median(times)
        print(f"{name:<40} {median:8.2f}s {max(times):8.2f}s   {median / base:6.2f}×")
    print(f"guard trips: {guard.trips} in {a.reps} guarded runs; the same greedy tokens in every run: {all(same)}")
    if a.out:
        a.out.write_text(json.dumps(result, indent=1))
    return result


if __name__ == "__main__":
    main()
