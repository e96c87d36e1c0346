"""Benchmark (not a test; issue 49 item 5): serving throughput of the real vLLM (CPU build, `make vllm`) with 1, 2 and
4 team adapters loaded at once and concurrent requests spread across them, against the base weights alone.

One server is started by `app.policy_server` with the project's flags and `--max-loras 4`. Four adapters of the same
shape are loaded at runtime: the shipped SFT adapter and three copies with every LoRA B scaled (0.9, 1.1, 0.8), so
they are four distinct adapters, as four teams' would be. For each adapter count A (0 = the base weights) and each
concurrency C, C requests are sent at once, request k pinned to adapter k mod A by name (`agent.protocols.Served`,
as a session of that team is), every one sampling `--tokens` new tokens at T 0.7 with its own seed; the figure is
new tokens per second of wall time over the whole round (best of `--reps`), with the median request latency.
Each round checks, from the server's own request log (`--enable-log-requests`), that every request was served by the
adapter it named.

    .venv/bin/python tests/benchmarks/vllm_adapters.py --out docs/teams/vllm_adapters.json
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import re
import signal
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

from agent.config import SHIPPED_SFT_ADAPTER  # noqa: E402
from agent.policy import VLLMPolicyClient  # noqa: E402
from agent.protocols import ChatMessage, Served  # noqa: E402
from app.policy_server import LocalVLLMServer, VLLMServerSpec  # noqa: E402
from learning.engines.threads import cpu_model  # noqa: E402
from learning.engines.weights import ensure_converted  # noqa: E402
from tests.adapters import scaled_adapter  # noqa: E402
from tests.servers import free_port  # noqa: E402

FACTORS = (1.0, 0.9, 1.1, 0.8)  # the four "teams'" adapters: the SFT adapter and three scaled copies
MESSAGES = [ChatMessage("system", "You are a helpful research assistant."),
            ChatMessage("user", "Plan the research for: what language were books being translated into during the "
                                "era of Haymo of Faversham?")]
_LOGGED = re.compile(r"Received request \S+: params: SamplingParams\(.*?\bseed=(\d+),.*?"
                     r"lora_request: (?:None|LoRARequest\(lora_name='([^']*)')")


def say(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def logged(log: Path, since: int) -> dict[int, str]:
    """seed -> the adapter the server says served it ("" = base), for requests logged after byte `since`."""
    text = log.read_bytes()[since:].decode("utf-8", "replace")
    return {int(m.group(1)): m.group(2) or "" for m in _LOGGED.finditer(text)}


async def rounds(server: LocalVLLMServer, log: Path, names: list[str], a: argparse.Namespace) -> list[dict[str, Any]]:
    client = VLLMPolicyClient(server.url, "policy", timeout_s=1800, max_retries=0)
    rows: list[dict[str, Any]] = []
    try:
        ctx = await client.render_prompt(MESSAGES)
        for n_adapters in a.adapters:
            pins = [Served(n, n, None) for n in names[:n_adapters]] or [Served("base", "policy", None)]
            for pin in pins:  # warm-up: each adapter's first request builds its LoRA buffers
                await client.generate(ctx, stop=[], max_tokens=4, temperature=0.0, served=pin)
            for conc in a.concurrency:
                best: dict[str, Any] | None = None
                for rep in range(a.reps):
                    since = log.stat().st_size
                    seeds = [10_000 * (rep + 1) + 100 * n_adapters + k for k in range(conc)]

                    async def one(k: int) -> tuple[int, float]:
                        t = time.perf_counter()
                        g = await client.generate(ctx, stop=[], max_tokens=a.tokens, temperature=0.7,
                                                  seed=seeds[k], served=pins[k % len(pins)])
                        return len(g.token_ids), time.perf_counter() - t

                    began = time.perf_counter()
                    outs = await asyncio.gather(*(one(k) for k in range(conc)))
                    wall = time.perf_counter() - began
                    await asyncio.sleep(0.5)  # the log line is written as the request arrives; let it flush
                    served = logged(log, since)
                    expected = {seeds[k]: (pins[k % len(pins)].model if n_adapters else "") for k in range(conc)}
                    wrong = {s: served.get(s) for s, name in expected.items() if served.get(s) != name}
                    if wrong:
                        raise SystemExit(f"requests served by the wrong adapter (seed: served): {wrong}")
                    tokens = sum(k for k, _ in outs)
                    row = {"adapters": n_adapters, "concurrency": conc, "tokens": tokens,
                           "tok_per_s": round(tokens / wall, 1), "wall_s": round(wall, 2),
                           "latency_p50_s": round(statistics.median(s for _, s in outs), 2),
                           "checked_in_log": len(expected)}
                    if best is None or row["tok_per_s"] > best["tok_per_s"]:
                        best = row
                assert best is not None
                rows.append(best)
                say(f"adapters {n_adapters} concurrency {conc}: {best['tok_per_s']} tok/s "
                    f"(p50 latency {best['latency_p50_s']} s)")
    finally:
        await client.aclose()
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--adapters", default="0,1,2,4", help="adapter counts (0 = the base weights)")
    ap.add_argument("--concurrency", default="1,4,8")
    ap.add_argument("--tokens", type=int, default=96, help="new tokens per request")
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--out", type=Path)
    a = ap.parse_args()
    a.adapters = [int(x) for x in a.adapters.split(",")]
    a.concurrency = [int(x) for x in a.concurrency.split(",")]
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # a kill still stops the server (finally below)
    model_dir = ensure_converted(ROOT / ".cache" / "models")
    spec = VLLMServerSpec(model_dir=model_dir, port=free_port(), max_loras=max(1, *a.adapters),
                          extra_args=("--enable-log-requests",))
    results: dict[str, Any] = {"command": " ".join(sys.argv), "cpu": cpu_model(), "cores": os.cpu_count(),
                               "platform": platform.platform(), "tokens": a.tokens, "reps": a.reps,
                               "max_loras": spec.max_loras}
    with tempfile.TemporaryDirectory(prefix="vllm-adapters-") as tmp_name:
        tmp = Path(tmp_name)
        log = tmp / "vllm.log"
        began = time.perf_counter()
        server = LocalVLLMServer(spec, log_path=log).start(timeout_s=600)
        results["start_seconds"] = round(time.perf_counter() - began, 1)
        say(f"vLLM ready in {results['start_seconds']} s")
        try:
            names = [f"team-{k}" for k in range(max(a.adapters))]

            async def load() -> list[float]:
                client = VLLMPolicyClient(server.url, "policy", timeout_s=600, max_retries=0)
                seconds = []
                try:
                    for k, name in enumerate(names):
                        folder = scaled_adapter(SHIPPED_SFT_ADAPTER, tmp / name, FACTORS[k % len(FACTORS)])
                        t = time.perf_counter()
                        await client.ensure_adapter(name, folder)
                        seconds.append(round(time.perf_counter() - t, 2))
                finally:
                    await client.aclose()
                return seconds

            results["load_seconds"] = asyncio.run(load())
            results["rounds"] = asyncio.run(rounds(server, log, names, a))
        finally:
            server.stop()
    text = json.dumps(results, indent=1)
    if a.out is not None:
        a.out.parent.mkdir(parents=True, exist_ok=True)
        a.out.write_text(text + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
