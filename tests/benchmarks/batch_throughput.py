"""Benchmark (not a test): `rubricem batch` throughput (completed sessions per minute) at several concurrencies
against a real llama-cpp-python server serving the bundled SmolLM2 (the test server of tests/conftest.py).

Each concurrency level runs the same questions through `app.batch.run_batch` into a fresh output folder (nothing is
skipped), after one untimed warm-up session (server prefix cache, embedding model). A probe first sends the same
short completion request 4 times one after another and 4 times at once: equal wall times mean the server answers one
request at a time (llama-cpp-python's server holds one lock around its single model; it has no parallel slots).

llama.cpp's libraries are checked against their recorded digests before the server starts (issue 65), as the tests'
`llamacpp_server` fixture does: a library that fails is not loaded, and the benchmark exits 2 naming the file and the
command that installs the libraries again.

    .venv/bin/python tests/benchmarks/batch_throughput.py [--questions 8] [--concurrency 1,4,16]
        [--max-tool-calls 1] [--server-cache] [--out throughput.json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from agent.config import RunOptions, StageTokenCaps
from app.batch import BatchItem, run_batch
from app.container import build
from app.settings import Settings
from learning.engines.llamacpp_build import LibraryRefused, verify_installed
from learning.engines.weights import bundled_gguf_path
from tests.servers import free_port, server_process

ALIAS = "smollm2"
QUESTIONS = [
    "Who was Haymo of Faversham?",
    "What is the Crab Nebula?",
    "Are Christopher Nolan and Sathish Kalathil both film directors?",
    "Are both magazines, the Woman's Viewpoint and Pick Me Up, British publications?",
    "What is a circadian rhythm?",
    "Where is the village of Allington in Wiltshire?",
    "What language were books being translated into during the era of Haymo of Faversham?",
    "Which constellation contains the Orion Nebula?",
    "What is a supernova remnant?",
    "Who directed the film Inception?",
    "What is the capital of Kerala?",
    "When was Pick Me Up magazine first published?",
    "What is the Taurus constellation named after?",
    "What does a Franciscan friar do?",
    "What is Salisbury Cathedral known for?",
    "Which films did Christopher Nolan direct before 2005?",
]


def server_cmd(port: int, cache: bool) -> list[str]:
    """The llama-cpp-python server as tests/conftest.py starts it (n_ctx 4096), optionally with its RAM state cache."""
    cmd = [sys.executable, "-m", "llama_cpp.server", "--model", str(bundled_gguf_path()), "--host", "127.0.0.1",
           "--port", str(port), "--n_ctx", "4096", "--model_alias", ALIAS, "--logits_all", "true",
           "--verbose", "false"]  # fmt: skip
    return cmd + (["--cache", "true"] if cache else [])


def probe(root: str, n: int = 4) -> dict[str, float]:
    """Wall time of n identical short completions sent sequentially, then all at once."""
    body = {"model": ALIAS, "prompt": "The three primary colours are", "max_tokens": 24, "temperature": 0.0}

    async def one(client: httpx.AsyncClient) -> None:
        (await client.post(f"{root}/v1/completions", json=body)).raise_for_status()

    async def go() -> dict[str, float]:
        async with httpx.AsyncClient(timeout=300) as client:
            await one(client)  # warm
            t0 = time.perf_counter()
            for _ in range(n):
                await one(client)
            seq = time.perf_counter() - t0
            t0 = time.perf_counter()
            await asyncio.gather(*(one(client) for _ in range(n)))
            return {"requests": n, "sequential_s": round(seq, 2), "concurrent_s": round(time.perf_counter() - t0, 2)}

    return asyncio.run(go())


def settings_for(root: str, data_dir: Path) -> Settings:
    """Policy on the llama.cpp server; a 4096-token context to match the server's n_ctx; short snippets."""
    return Settings.model_validate({
        "agent": {"policy_backend": "llamacpp", "policy_base_url": root, "policy_model": ALIAS,
                  "local_search_k": 2, "snippet_chars": 200},
        "store": {"data_dir": str(data_dir)},
    })  # fmt: skip


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--questions", type=int, default=8)
    ap.add_argument("--concurrency", default="1,4,16", help="comma-separated levels")
    ap.add_argument("--max-tool-calls", type=int, default=1)
    ap.add_argument("--server-cache", action="store_true", help="start the server with --cache true (RAM state cache)")
    ap.add_argument("--out", help="also write the results as JSON here")
    args = ap.parse_args()
    levels = [int(x) for x in args.concurrency.split(",")]
    questions = (QUESTIONS * (args.questions // len(QUESTIONS) + 1))[: args.questions]
    caps = StageTokenCaps(plan=16, research=24, review=16, answer=16)  # the smallest that still finish a run
    options = RunOptions(max_tool_calls=args.max_tool_calls, token_caps=caps, temperature=0.7,
                         context_tokens=4096)
    # The server runs sys.executable in this environment, so it loads llama.cpp from the folder `verify_installed`
    # checks by default (LLAMA_CPP_LIB_PATH or llama-cpp-python's `lib`). Check it against the recorded digests before
    # the server starts, as every load path of the project does (issue 65), so a library that fails is never loaded.
    # The project's own check, not a copy: LibraryRefused already names the file, why, and the rebuild command.
    try:
        verify_installed()
    except LibraryRefused as exc:
        print(f"the llama.cpp server is not started: {exc}", file=sys.stderr)
        return 2
    results: dict[str, Any] = {"questions": len(questions), "max_tool_calls": args.max_tool_calls,
                               "token_caps": caps.model_dump(), "server_cache": args.server_cache, "levels": []}
    with tempfile.TemporaryDirectory(prefix="batch-bench-") as tmp:
        tmpdir, port = Path(tmp), free_port()
        root = f"http://127.0.0.1:{port}"
        with server_process("llama.cpp server", server_cmd(port, args.server_cache), f"{root}/v1/models",
                            tmpdir / "server.log", 120.0, cwd=ROOT):
            results["probe"] = probe(root)
            print(f"probe: 4 requests sequential {results['probe']['sequential_s']}s, "
                  f"concurrent {results['probe']['concurrent_s']}s", file=sys.stderr)
            services = build(settings_for(root, tmpdir / "data"), say=lambda m: print(m, file=sys.stderr))

            async def go() -> None:
                try:
                    await run_batch(services.research, [BatchItem("warmup", questions[0])], tmpdir / "warmup",
                                    options=options)
                    for level in levels:
                        items = [BatchItem(f"q{i:03d}", q) for i, q in enumerate(questions, 1)]
                        s = await run_batch(services.research, items, tmpdir / f"c{level}", concurrency=level,
                                            options=options)
                        row = {"concurrency": level, "done": s.done, "failed": s.failed,
                               "seconds": round(s.seconds, 1), "sessions_per_min": round(s.throughput_per_min, 2)}
                        results["levels"].append(row)
                        print(f"concurrency {level:>2}: {s.done} done, {s.failed} failed in {s.seconds:.1f}s -> "
                              f"{s.throughput_per_min:.2f} sessions/min", file=sys.stderr, flush=True)
                finally:
                    await services.policy.aclose()

            asyncio.run(go())
    print("| concurrency | done | failed | seconds | sessions/min |\n|---:|---:|---:|---:|---:|")
    for r in results["levels"]:
        print(f"| {r['concurrency']} | {r['done']} | {r['failed']} | {r['seconds']} | {r['sessions_per_min']} |")
    if args.out:
        Path(args.out).write_text(json.dumps(results, indent=2) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
