"""Benchmark (not a test): the real vLLM (CPU build, `make vllm`) against the embedded torch policy and in-process
llama.cpp, in one run on this machine (issue 33). Each part can be chosen with --parts:

* decode: new tokens per second at T 0.7 for one sequence and the aggregate of 8 concurrent ones: vLLM on the base
  weights and with the shipped SFT adapter; the embedded policy (one `generate`, and a `generate_group` of 8); and
  llama.cpp in process (one sequence).
* mismatch: the train/inference gap. vLLM samples sequences with the adapter; the trainer (`learning.model`
  `load_trainable`, bf16, the same adapter) recomputes the log-probs of the same tokens at the same temperature:
  mean and max |Δ log p| and the per-token KL(sampler ‖ trainer) (k3 estimate). The embedded sampler against the
  same trainer is the reference row (same engine).
* session: the demo question (`make demo`'s settings, seed 3) on vLLM with the adapter and on the embedded default.
* batch: 8 questions through `app.batch.run_batch` on vLLM at concurrency 1, 4 and 8, and the same 8 one after
  another on the embedded policy; sampled tokens per second of wall time.
* merged: the adapter folded into the weights and served by a second vLLM as its base model (no LoRA kernels):
  decode rates and the demo session (not in the default --parts).
* rollouts (issue 63; not in the default --parts): sessions per hour of the rollout-engine candidates in one run,
  the same 8 questions and caps: the embedded default one at a time, vLLM with a runtime LoRA adapter and vLLM on
  merged weights (the largest --levels at once), and rollouts per hour over a training step with the merged path's
  merge and restart included.
* cycle: one retrain cycle (2 sessions, 1 SS-GRPO step, 2 rollouts, the probe) with rollouts on vLLM and on the
  embedded policy; the cycle's wall time and the training step's own seconds.

The vLLM server is started once by `app.policy_server` with the project's defaults (tuned flags: every core bound,
no reserved core, --max-lora-rank 16, --max-loras 1, processed logprobs); `--vllm-defaults` starts it with vLLM's
own CPU defaults instead (one reserved core, rank 64) for the comparison.

    .venv/bin/python tests/benchmarks/vllm_engine.py [--parts decode,mismatch,session,batch,cycle]
        [--tokens 256] [--out docs/vllm/engine.json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import platform
import signal
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

from agent.config import SHIPPED_SFT_ADAPTER, AgentConfig, RunOptions, StageTokenCaps  # noqa: E402
from agent.policy import VLLMPolicyClient  # noqa: E402
from agent.protocols import ChatMessage, PromptContext  # noqa: E402
from app.policy_server import LocalVLLMServer, VLLMServerSpec  # noqa: E402
from app.settings import Settings  # noqa: E402
from learning.engines.weights import ensure_converted  # noqa: E402
from store.config import StoreConfig  # noqa: E402
from tests.servers import free_port  # noqa: E402

MODEL_CACHE = ROOT / ".cache" / "models"
ADAPTER_ALIAS = "smollm2-sft"
MESSAGES = [ChatMessage("system", "You are a helpful assistant."),
            ChatMessage("user", "Write a long, detailed essay about the history of the printing press in Europe.")]
DEMO_Q = "What language were books being translated into during the era of Haymo of Faversham?"
BATCH_QUESTIONS = [
    "Who was Haymo of Faversham?", "What is the Franciscan order?", "Who founded the Franciscan order?",
    "When was the University of Paris founded?", "What is a papal bull?", "Who was Pope Gregory IX?",
    "What language was the Vulgate written in?", "What is the Latin Church?",
]


def say(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


async def _rates(generate: Any, n: int, reps: int) -> dict[str, float]:
    """Best-of-`reps` tokens/s of one call (n = 1) or of n concurrent calls (aggregate)."""
    best, tokens = 0.0, 0
    for rep in range(reps):
        t = time.perf_counter()
        gens = await asyncio.gather(*(generate(1000 * rep + i) for i in range(n)))
        dt = time.perf_counter() - t
        k = sum(len(g.token_ids) for g in gens)
        if k / dt > best:
            best, tokens = k / dt, k
    return {"tok_per_s": round(best, 1), "tokens": tokens}


def decode(server: LocalVLLMServer, args: argparse.Namespace, model_dir: Path) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []

    async def vllm_rows() -> None:
        client = VLLMPolicyClient(server.url, "policy", timeout_s=1200, max_retries=0)
        try:
            ctx = await client.render_prompt(MESSAGES)
            for adapter in (False, True):
                if adapter:
                    await client.aload_adapter(SHIPPED_SFT_ADAPTER, ADAPTER_ALIAS)
                await client.generate(ctx, stop=[], max_tokens=8, temperature=0.0)  # warm-up

                def gen(seed: int) -> Any:
                    return client.generate(ctx, stop=[], max_tokens=args.tokens, temperature=0.7, seed=seed)

                for n in (1, 8):
                    r = await _rates(gen, n, args.reps)
                    rows.append({"engine": "vllm", "adapter": adapter, "sequences": n, **r})
                    say(f"decode vllm adapter={adapter} n={n}: {r['tok_per_s']} tok/s")
            await client.aunload_adapter()
        finally:
            await client.aclose()

    asyncio.run(vllm_rows())
    import torch

    from learning.engines.local_policy import TransformersPolicyClient

    torch.set_num_threads(args.threads)
    policy = TransformersPolicyClient(model_dir)
    ctx: PromptContext = asyncio.run(policy.render_prompt(MESSAGES))
    for adapter in (False, True):
        if adapter:
            policy.load_adapter(SHIPPED_SFT_ADAPTER, ADAPTER_ALIAS)
        asyncio.run(policy.generate(ctx, stop=[], max_tokens=8, temperature=0.0))
        for n in (1, 8):
            best, tokens = 0.0, 0
            for rep in range(args.reps):
                t = time.perf_counter()
                if n == 1:
                    gens = [asyncio.run(policy.generate(ctx, stop=[], max_tokens=args.tokens, temperature=0.7,
                                                        seed=rep))]
                else:
                    gens = asyncio.run(policy.generate_group(ctx, n, stop=[], max_tokens=args.tokens,
                                                             temperature=0.7, seeds=[100 * rep + i for i in range(n)]))
                dt = time.perf_counter() - t
                k = sum(len(g.token_ids) for g in gens)
                if k / dt > best:
                    best, tokens = k / dt, k
            rows.append({"engine": "embedded", "adapter": adapter, "sequences": n,
                         "tok_per_s": round(best, 1), "tokens": tokens})
            say(f"decode embedded adapter={adapter} n={n}: {best:.1f} tok/s")
    asyncio.run(policy.aclose())
    try:
        from llama_cpp import Llama

        from learning.engines.weights import bundled_gguf_path
    except ImportError:
        return rows
    llm = Llama(model_path=str(bundled_gguf_path()), n_ctx=4096, n_threads=args.threads, verbose=False)
    prompt = llm.tokenize(ctx.text.encode(), add_bos=False, special=True)
    llm.create_completion(prompt, max_tokens=8, temperature=0.0)
    best = 0.0
    for rep in range(args.reps):
        t = time.perf_counter()
        out = llm.create_completion(prompt, max_tokens=args.tokens, temperature=0.7, seed=rep)
        best = max(best, out["usage"]["completion_tokens"] / (time.perf_counter() - t))
    rows.append({"engine": "llamacpp", "adapter": False, "sequences": 1, "tok_per_s": round(best, 1)})
    say(f"decode llama.cpp n=1: {best:.1f} tok/s")
    return rows


def mismatch(server: LocalVLLMServer, args: argparse.Namespace, model_dir: Path) -> list[dict[str, Any]]:
    """vLLM's (and the embedded sampler's) log-probs against the trainer's recomputation of the same tokens."""
    import torch

    from learning.engines.local_policy import TransformersPolicyClient
    from learning.model import LoraSettings, load_trainable
    from learning.sequences import TrainSequence, collate, response_logprobs

    temperature = 0.7

    async def vllm_samples() -> tuple[tuple[int, ...], list[Any]]:
        client = VLLMPolicyClient(server.url, "policy", timeout_s=1200, max_retries=0)
        try:
            ctx = await client.render_prompt(MESSAGES)
            await client.aload_adapter(SHIPPED_SFT_ADAPTER, ADAPTER_ALIAS)
            gens = await asyncio.gather(*(client.generate(ctx, stop=[], max_tokens=args.mismatch_tokens,
                                                          temperature=temperature, seed=s) for s in range(8)))
            await client.aunload_adapter()
            return ctx.token_ids, list(gens)
        finally:
            await client.aclose()

    prompt, vllm_gens = asyncio.run(vllm_samples())
    embedded = TransformersPolicyClient(model_dir, adapter_path=SHIPPED_SFT_ADAPTER)
    ectx = PromptContext(text="", token_ids=tuple(prompt))
    emb_gens = asyncio.run(embedded.generate_group(ectx, 8, stop=[], max_tokens=args.mismatch_tokens,
                                                   temperature=temperature, seeds=list(range(8))))
    asyncio.run(embedded.aclose())
    model, tok = load_trainable(model_dir, lora=LoraSettings(), adapter=SHIPPED_SFT_ADAPTER, dtype="bfloat16",
                                gradient_checkpointing=False)
    model.eval()
    rows = []
    for name, gens in (("vllm", vllm_gens), ("embedded", emb_gens)):
        deltas: list[float] = []
        for g in gens:
            n = len(g.token_ids)
            seq = TrainSequence(tuple(prompt), tuple(g.token_ids), (1,) * n, (0,) * n, (0.0,) * n)
            with torch.no_grad():
                lp = response_logprobs(model, collate([seq], int(tok.pad_token_id)), temperature)[0, :n]
            deltas += [float(a) - float(b) for a, b in zip(lp.tolist(), g.logprobs, strict=True)
                       if math.isfinite(b)]
        d = torch.tensor(deltas)
        k3 = torch.exp(d) - d - 1
        row = {"sampler": name, "tokens": len(deltas), "mean_abs": round(float(d.abs().mean()), 4),
               "max_abs": round(float(d.abs().max()), 4), "kl_k3": round(float(k3.mean()), 5),
               "tis_weight_mean_cap2": round(float(torch.exp(d).clamp(max=2).mean()), 4),
               "temperature": temperature}
        rows.append(row)
        say(f"mismatch {name}: {row}")
    return rows


def merged(args: argparse.Namespace, tmp: Path, model_dir: Path) -> list[dict[str, Any]]:
    """The shipped adapter folded into the weights (PEFT `merge_and_unload`, bf16) and served by a second vLLM as its
    base model: no LoRA kernels in the decode step. Decode rates and the demo session on it."""
    server, _ = _merged_server(tmp, model_dir)
    rows: list[dict[str, Any]] = []
    try:
        async def rates() -> None:
            client = VLLMPolicyClient(server.url, "policy", timeout_s=1200, max_retries=0)
            try:
                ctx = await client.render_prompt(MESSAGES)
                await client.generate(ctx, stop=[], max_tokens=8, temperature=0.0)
                for n in (1, 8):
                    r = await _rates(lambda seed: client.generate(ctx, stop=[], max_tokens=args.tokens,
                                                                  temperature=0.7, seed=seed), n, args.reps)
                    rows.append({"engine": "vllm-merged", "sequences": n, **r})
                    say(f"decode vllm merged n={n}: {r['tok_per_s']} tok/s")
            finally:
                await client.aclose()

        asyncio.run(rates())
        rows += [dict(r, engine="vllm-merged") for r in _sessions([("vllm-merged", server.url, "policy")], tmp,
                                                                   model_dir)]
    finally:
        server.stop()
    return rows


def _merged_server(tmp: Path, model_dir: Path) -> tuple[LocalVLLMServer, dict[str, float]]:
    """A second vLLM serving the shipped adapter folded into the weights (PEFT `merge_and_unload`, bf16) as its base
    model, and what that swap costs: the merge and save, and the server's start (a training step would pay both to
    serve its new version this way)."""
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer

    t = time.perf_counter()
    folder = tmp / "smollm2-sft-merged"
    base = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.bfloat16)
    PeftModel.from_pretrained(base, str(SHIPPED_SFT_ADAPTER)).merge_and_unload().save_pretrained(str(folder))
    AutoTokenizer.from_pretrained(str(model_dir)).save_pretrained(str(folder))
    merge_s = time.perf_counter() - t
    t = time.perf_counter()
    server = LocalVLLMServer(VLLMServerSpec(model_dir=folder, port=free_port()), log_path=tmp / "merged.log")
    server.start(timeout_s=600)
    costs = {"merge_seconds": round(merge_s, 1), "start_seconds": round(time.perf_counter() - t, 1)}
    say(f"merged vLLM ready: {costs}")
    return server, costs


def rollouts(server: LocalVLLMServer, tmp: Path, model_dir: Path, level: int) -> dict[str, Any]:
    """Issue 63, item 1: sessions per hour for each rollout-engine candidate, in one run, on the same questions, caps
    and sampling: the sequential path (the embedded default, one session at a time, as the learning benchmarks run
    their rollouts), vLLM with the version as a runtime LoRA adapter, and vLLM serving the version's merged weights,
    `level` sessions at once on each server. The merged path pays a merge and a server start per new version
    (`swap`); `per_step` gives each candidate's rollouts per hour over a training step of 8 questions x 4 rollouts,
    that cost included."""
    merged_server, swap = _merged_server(tmp, model_dir)
    try:
        rows = _batch_rows(tmp, model_dir, [("embedded", None, "policy", 1), ("vllm-lora", server.url,
                                                                             ADAPTER_ALIAS, level),
                                           ("vllm-merged", merged_server.url, "policy", level)], server)
    finally:
        merged_server.stop()
    step_rollouts = 32
    per_step = []
    for r in rows:
        seconds = step_rollouts * 3600 / r["sessions_per_hour"] + (swap["merge_seconds"] + swap["start_seconds"]
                                                                   if r["engine"] == "vllm-merged" else 0.0)
        per_step.append({"engine": r["engine"], "step_seconds": round(seconds, 1),
                         "rollouts_per_hour": round(step_rollouts * 3600 / seconds, 1)})
    base = next(p["rollouts_per_hour"] for p in per_step if p["engine"] == "embedded")
    for p in per_step:
        p["x_sequential"] = round(p["rollouts_per_hour"] / base, 2)
    return {"sessions": rows, "swap": swap, "per_step": per_step}


def _settings(data: Path, model_dir: Path, vllm_url: str | None, model: str = "policy") -> Settings:
    if vllm_url is None:
        return Settings(store=StoreConfig(data_dir=data))
    return Settings(agent=AgentConfig(policy_backend="vllm", policy_base_url=vllm_url, policy_model=model,
                                      embedded_model_path=model_dir, policy_timeout_s=1200),
                    store=StoreConfig(data_dir=data))


def _sampled(turns: Any) -> int:
    return sum(len(t.token_ids) for t in turns if t.kind == "sampled")


async def _with_adapter(url: str) -> None:
    client = VLLMPolicyClient(url, "policy", max_retries=0)
    try:
        await client.ensure_adapter(ADAPTER_ALIAS, SHIPPED_SFT_ADAPTER)
    finally:
        await client.aclose()


def session(server: LocalVLLMServer, tmp: Path, model_dir: Path) -> list[dict[str, Any]]:
    asyncio.run(_with_adapter(server.url))
    return _sessions([("vllm", server.url, ADAPTER_ALIAS), ("embedded", None, "policy")], tmp, model_dir)


def _sessions(engines: list[tuple[str, str | None, str]], tmp: Path, model_dir: Path) -> list[dict[str, Any]]:
    """The demo question (`make demo`'s options, seed 3) once per engine: (name, vLLM URL or None, served model)."""
    from app.container import build

    options = RunOptions(format="short_form", max_tool_calls=2, seed=3)
    rows = []
    for engine, url, model in engines:
        settings = _settings(tmp / f"session-{engine}", model_dir, url, model)
        services = build(settings, say=say)

        async def go() -> Any:
            try:
                return await services.research.run(DEMO_Q, settings.agent.defaults.model_copy(
                    update=options.model_dump(exclude_unset=True)))
            finally:
                await services.policy.aclose()

        t = time.perf_counter()
        out = asyncio.run(go())
        dt = time.perf_counter() - t
        rec = services.log.get(out.session_id)
        n = _sampled(rec.trajectory.turns)
        rows.append({"engine": engine, "seconds": round(dt, 1), "sampled_tokens": n,
                     "tok_per_s": round(n / dt, 1), "version": rec.policy_version})
        say(f"session {engine}: {dt:.1f}s, {n} sampled tokens ({rec.policy_version})")
    return rows


def batch(server: LocalVLLMServer, tmp: Path, model_dir: Path, levels: list[int]) -> list[dict[str, Any]]:
    runs = [("vllm", server.url, ADAPTER_ALIAS, level) for level in levels] + [("embedded", None, "policy", 1)]
    return _batch_rows(tmp, model_dir, runs, server)


def _batch_rows(tmp: Path, model_dir: Path, runs: list[tuple[str, str | None, str, int]],
                server: LocalVLLMServer) -> list[dict[str, Any]]:
    """BATCH_QUESTIONS through `run_batch` once per run: (name, vLLM URL or None for the embedded default, served
    model, concurrency)."""
    from app.batch import BatchItem, run_batch
    from app.container import build
    from store.session_log import SessionLog

    asyncio.run(_with_adapter(server.url))
    options = RunOptions(format="short_form", max_tool_calls=2, temperature=0.7,
                         token_caps=StageTokenCaps(plan=96, research=48, review=64, answer=96))
    rows = []
    for engine, url, model, level in runs:
        data = tmp / f"batch-{engine}-{level}"
        services = build(_settings(data, model_dir, url, model), say=say)
        items = [BatchItem(f"q{i:03d}", q) for i, q in enumerate(BATCH_QUESTIONS, 1)]

        async def go() -> Any:
            try:
                return await run_batch(services.research, items, data / "out", concurrency=level, options=options)
            finally:
                await services.policy.aclose()

        summary = asyncio.run(go())
        log = SessionLog(data / "rubricem.sqlite3") if (data / "rubricem.sqlite3").exists() else services.log
        tokens = sum(_sampled(log.get(s.session_id).trajectory.turns) for s in log.list_sessions(limit=100))
        rows.append({"engine": engine, "concurrency": level, "done": summary.done, "failed": summary.failed,
                     "seconds": round(summary.seconds, 1), "sampled_tokens": tokens,
                     "tok_per_s": round(tokens / summary.seconds, 1),
                     "sessions_per_hour": round(3600 * summary.done / summary.seconds, 1),
                     "embedded_engine": None if url else services.settings.agent.embedded_engine})
        say(f"batch {engine} c={level}: {rows[-1]}")
    return rows


def cycle(server: LocalVLLMServer, tmp: Path, model_dir: Path) -> list[dict[str, Any]]:
    from app.container import build
    from app.scheduler import run_cycle
    from learning.config import LearningConfig, RetrainConfig

    rows = []
    caps = StageTokenCaps(plan=48, research=24, review=32, answer=48)
    for engine, url in (("vllm", server.url), ("embedded", None)):
        data = tmp / f"cycle-{engine}"
        probes = tmp / "probes.txt"
        probes.write_text("Who was Haymo of Faversham?\n")
        base = _settings(data, model_dir, url)
        retrain = RetrainConfig(steps=1, rollouts=4, batch_questions=1, max_token_caps=64, probe_questions=probes,
                                probe_samples=1, min_new_sessions=2, unload_grace_s=0)
        settings = base.model_copy(update={"learning": LearningConfig(retrain=retrain), "agent": base.agent.model_copy(
            update={"defaults": RunOptions(max_tool_calls=1, token_caps=caps, temperature=0.7)})})
        for q in BATCH_QUESTIONS[:2]:
            services = build(settings, say=say)

            async def ask(question: str = q, s: Any = services) -> None:
                try:
                    await s.research.run(question, settings.agent.defaults)
                finally:
                    await s.policy.aclose()

            asyncio.run(ask())
        t = time.perf_counter()
        result = asyncio.run(run_cycle(settings, trigger="cli", force=True, say=say))
        dt = time.perf_counter() - t
        metrics = [json.loads(x) for x in (data / "runs" / result.cycle.cycle_id / "metrics.jsonl").read_text()
                   .splitlines()] if (data / "runs" / result.cycle.cycle_id / "metrics.jsonl").exists() else []
        step = metrics[0] if metrics else {}
        rows.append({"engine": engine, "cycle_seconds": round(dt, 1), "status": result.cycle.status,
                     "step_seconds": step.get("seconds"), "update_seconds": step.get("task/seconds"),
                     "sampler_logprob_gap": step.get("task/sampler_logprob_gap"),
                     "sampler_kl": step.get("task/sampler_kl"), "is_weight_mean": step.get("task/is_weight_mean")})
        say(f"cycle {engine}: {rows[-1]}")
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--parts", default="decode,mismatch,session,batch,cycle")
    ap.add_argument("--tokens", type=int, default=256, help="new tokens per decode generation")
    ap.add_argument("--mismatch-tokens", type=int, default=128)
    ap.add_argument("--reps", type=int, default=1)
    ap.add_argument("--threads", type=int, default=2, help="embedded torch and llama.cpp threads")
    ap.add_argument("--levels", default="1,4,8", help="batch concurrency levels on vLLM")
    ap.add_argument("--vllm-defaults", action="store_true", help="vLLM's own CPU defaults instead of the tuned flags")
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # a kill still stops the vLLM server (finally below)
    parts = args.parts.split(",")
    model_dir = ensure_converted(MODEL_CACHE)
    results: dict[str, Any] = {"machine": {"cpus": os.cpu_count(), "platform": platform.platform()},
                               "tokens": args.tokens, "vllm_defaults": args.vllm_defaults}
    spec = VLLMServerSpec(model_dir=model_dir, port=free_port())
    if args.vllm_defaults:
        spec = VLLMServerSpec(model_dir=model_dir, port=free_port(), max_lora_rank=64, cpu_bind="auto",
                              reserved_cpus=1)
    with tempfile.TemporaryDirectory(prefix="vllm-bench-") as tmp_name:
        tmp = Path(tmp_name)
        t = time.perf_counter()
        server = LocalVLLMServer(spec, log_path=tmp / "vllm.log").start(timeout_s=600)
        results["vllm_start_seconds"] = round(time.perf_counter() - t, 1)
        say(f"vLLM ready in {results['vllm_start_seconds']}s on {server.url}")
        steps = {"decode": lambda: decode(server, args, model_dir),
                 "mismatch": lambda: mismatch(server, args, model_dir),
                 "session": lambda: session(server, tmp, model_dir),
                 "batch": lambda: batch(server, tmp, model_dir, [int(x) for x in args.levels.split(",")]),
                 "cycle": lambda: cycle(server, tmp, model_dir),
                 "merged": lambda: merged(args, tmp, model_dir),
                 "rollouts": lambda: rollouts(server, tmp, model_dir, max(int(x) for x in args.levels.split(",")))}
        try:
            for name in parts:
                results[name] = steps[name]()
                _write(results, args.out)  # each part as soon as it is measured
        finally:
            server.stop()
    print(json.dumps(results, indent=2))
    return 0


def _write(results: dict[str, Any], out: Path | None) -> None:
    if out is not None:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    sys.exit(main())
