"""Benchmark (not a test): the embedded policy's decode engines against the machine's memory bandwidth and llama.cpp.

In one process, one after another (issues 16 and 37), at the machine's natural thread count by default:

(a) memory bandwidth: a numpy copy of a large array (bytes read + bytes written per second; the limits use it), and
    a read-only float32 `sum` for reference (both single-threaded, best of 5);
(b) every embedded engine of `--engines` (default all): `torch` (transformers bf16, decode threads measured as the
    product measures them), `torch-compiled` (the compiled decode step, with its compile time), `llamacpp`
    (`EmbeddedLlamaCppClient` on the bundled Q4_1 GGUF), `llamacpp-merged` (the same, the adapter merged into a Q8_0
    copy instead of a runtime LoRA: `merge_adapter`) and `llamacpp-bf16` (the GGUF de-quantized to bf16: the torch
    engine's exact weights). Tokens/s greedy and sampled, on the base weights and with the shipped
    LoRA adapter agent/adapters/smollm2-sft (converted to GGUF LoRA for llama.cpp; the swap time is recorded), for
    one sequence (`generate`) and for groups (`generate_group`, aggregate tokens/s);
(c) llama-cpp-python's own `Llama` in process on the bundled GGUF, greedy and sampled, at `--threads`: the
    reference rate the session targets are fractions of;
(d) every figure as a fraction of its bandwidth limit: bytes per token = the weights read per decode step (parameter
    bytes in the precision in use; the GGUF file size for llama.cpp), limit = bandwidth / bytes per token, times the
    group size for a batched torch group (one weight pass serves every row of a step; llama.cpp rows run in turn);
(e) the sampler-trainer gap of each llama.cpp engine (`--mismatch-samples`): continuations sampled with the SFT
    adapter at temperatures 1.0 and 0.8, re-scored by the torch engine in bf16 (the trainer's arithmetic); mean and
    max |Δ log p| and the k3 KL estimate per token that `TrainConfig.max_sampler_kl` bounds;
(f) with `--session`, one full research session per engine at the demo's settings (`make demo`: the default
    Settings, the shipped SFT adapter, --max-tool-calls 2, short_form) and its sampled tokens per second of session
    wall time, as a fraction of (c)'s sampled rate (`targets`). It writes sessions into the configured data folder,
    as the demo does.
(g) with `--compare-kernels`, the torch session once per decode-kernel setting (with `--session-temperature 0`:
    greedy, so equal settings must give equal tokens), and whether each run's tokens equal the first's.

Tokens/s count the new tokens each call returned over its whole wall time (a ~40-token prompt's prefill included,
for every engine). A generation may end before `--tokens` at EOS; the rate counts what was generated.

On a machine shared with other jobs the figures collapse for every engine that runs more threads than there are
idle cores (a thread team waits for its descheduled members at every step: llama.cpp with 2 threads fell to 3.5
tok/s beside another job on the 2-core machine); measure on an idle machine and say its load (`loadavg_*`).

    .venv/bin/python tests/benchmarks/decode.py --tokens 128 --groups 4 --reps 2 --session --out docs/decode/engines.json
    .venv/bin/python tests/benchmarks/decode.py --engines torch --threads 1 --skip-llamacpp --groups 4 --reps 1 \
        --session-temperature 0 --compare-kernels sdpa:onednn,eager:onednn,gqa:native,gqa:native:merge
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

from agent.protocols import ChatMessage, PromptContext  # noqa: E402
from learning.engines.local_policy import TransformersPolicyClient  # noqa: E402
from learning.engines.weights import bundled_gguf_path, ensure_converted  # noqa: E402

ADAPTER = ROOT / "agent" / "adapters" / "smollm2-sft"
MODEL_CACHE = ROOT / ".cache" / "models"
MESSAGES = [
    ChatMessage("system", "You are a helpful assistant."),
    ChatMessage("user", "Write a long, detailed essay about the history of the printing press in Europe."),
]
DEMO_Q = "What language were books being translated into during the era of Haymo of Faversham?"


def bandwidth(mib: int, reps: int) -> dict[str, float]:
    """Best of `reps` copies of a `mib`-MiB array (GB/s counting the read and the write) and read-only sums."""
    import numpy as np

    n = mib * 2**20
    src = np.ones(n // 4, dtype=np.float32)
    dst = np.empty_like(src)
    np.copyto(dst, src)  # touch every page first
    copy, read = [], []
    for _ in range(reps):
        t = time.perf_counter()
        np.copyto(dst, src)
        copy.append(2 * n / (time.perf_counter() - t) / 1e9)
        t = time.perf_counter()
        float(src.sum())
        read.append(n / (time.perf_counter() - t) / 1e9)
    return {"array_mib": mib, "copy_gbps": round(max(copy), 2), "read_gbps": round(max(read), 2)}


def _weight_bytes(policy: TransformersPolicyClient, merged: bool = False) -> int:
    """Bytes of the weights a decode step reads; a merged adapter's own matrices are not read (they are folded in)."""
    model = policy._model
    return sum(p.numel() * p.element_size() for name, p in model.named_parameters()  # tied embeddings count once
               if not (merged and "lora_" in name))


ENGINES = ("torch", "torch-compiled", "llamacpp", "llamacpp-q8", "llamacpp-merged", "llamacpp-bf16")
# llamacpp: the bundled Q4_1 GGUF (the product's default); llamacpp-q8: its Q8_0 copy (`embedded_base_q8`), adapters
# as GGUF LoRA on either; llamacpp-merged: the adapter merged into a Q8_0 copy; llamacpp-bf16: a de-quantized GGUF


def dense_gguf() -> Path:
    """The bundled GGUF de-quantized to bf16 (the torch engine's exact weights), written once into the model cache."""
    from learning.engines.gguf_lora import write_dense_gguf

    path = MODEL_CACHE / "smollm2-135m-instruct.bf16.gguf"
    if not path.is_file():
        write_dense_gguf(bundled_gguf_path(), path, "bf16")
    return path


def make_policy(engine: str, args: argparse.Namespace) -> Any:
    """The embedded policy on `engine`, at the benchmark's thread count."""
    model_dir = ensure_converted(MODEL_CACHE)
    if engine.startswith("llamacpp"):
        from learning.engines.llamacpp_engine import EmbeddedLlamaCppClient

        gguf = dense_gguf() if engine == "llamacpp-bf16" else bundled_gguf_path()
        return EmbeddedLlamaCppClient(model_dir, gguf, lora_cache=MODEL_CACHE / "gguf-lora", threads=args.threads,
                                      batch_threads=args.threads, merge_adapter=engine == "llamacpp-merged",
                                      base_q8=engine == "llamacpp-q8",
                                      cpu_variant=os.environ.get("RUBRICEM_AGENT__EMBEDDED_CPU_VARIANT") or None)
    kw: dict[str, Any] = {"compile": True} if engine == "torch-compiled" else {}
    return TransformersPolicyClient(model_dir, dtype=args.dtype, merge_adapter=args.merge_adapter,
                                    threads=args.torch_threads or None, **kw)


def _bytes_per_step(engine: str, policy: Any, adapter: bool, merged: bool) -> int:
    if engine == "llamacpp-merged" and adapter:
        from learning.engines.gguf_lora import cached_merged

        return cached_merged(ADAPTER, bundled_gguf_path(), MODEL_CACHE / "gguf-lora").stat().st_size
    if engine == "llamacpp-q8":
        return policy._gguf.stat().st_size  # the cached Q8_0 copy it serves
    if engine.startswith("llamacpp"):
        return (dense_gguf() if engine == "llamacpp-bf16" else bundled_gguf_path()).stat().st_size
    return _weight_bytes(policy, merged=adapter and merged)


def embedded(args: argparse.Namespace, bw: float, engine: str = "torch") -> list[dict[str, Any]]:
    t = time.perf_counter()
    policy = make_policy(engine, args)
    load_s = time.perf_counter() - t
    ctx: PromptContext = asyncio.run(policy.render_prompt(MESSAGES))
    rows = []
    for adapter in (False, True):
        if adapter:
            t = time.perf_counter()
            policy.load_adapter(ADAPTER, "smollm2-sft")
            swap_s = time.perf_counter() - t
        wbytes = _bytes_per_step(engine, policy, adapter, args.merge_adapter)
        t = time.perf_counter()
        asyncio.run(policy.generate(ctx, stop=[], max_tokens=8, temperature=0.0))  # warm-up (and compile)
        warm_s = time.perf_counter() - t
        for temperature in (0.0, 1.0):
            for n in (1, *args.groups):
                rates, tokens = [], []
                for rep in range(args.reps):
                    seeds = [1000 * rep + i for i in range(n)]
                    t = time.perf_counter()
                    if n == 1:
                        gens = [asyncio.run(policy.generate(ctx, stop=[], max_tokens=args.tokens,
                                                            temperature=temperature, seed=seeds[0]))]
                    else:
                        gens = asyncio.run(policy.generate_group(ctx, n, stop=[], max_tokens=args.tokens,
                                                                 temperature=temperature, seeds=seeds))
                    dt = time.perf_counter() - t
                    k = sum(len(g.token_ids) for g in gens)
                    rates.append(k / dt)
                    tokens.append(k)
                rate = max(rates)  # the least disturbed repetition (the machine is shared)
                groups_batch = not engine.startswith("llamacpp")  # llama.cpp rows run one after another
                limit = (n if groups_batch else 1) * bw / wbytes
                rows.append({
                    "engine": engine, "dtype": {"llamacpp": "Q4_1 gguf", "llamacpp-bf16": "bf16 gguf",
                                                "llamacpp-merged": "Q4_1 gguf, Q8_0 merged"}.get(engine, args.dtype),
                    "adapter": adapter,
                    "mode": "greedy" if temperature == 0 else "sampled", "n": n, "tokens": tokens,
                    "tok_s": round(rate, 2), "tok_s_all": [round(r, 2) for r in rates], "bytes_per_step": wbytes,
                    "limit_tok_s": round(limit, 1), "of_limit": round(rate / limit, 3),
                    "load_s": round(load_s, 2), "warmup_s": round(warm_s, 2),
                    "adapter_swap_s": round(swap_s, 2) if adapter else None,
                    "compile_s": getattr(policy, "compile_seconds", None),
                })  # fmt: skip
                print(f"  {engine} adapter={adapter!s:5} {rows[-1]['mode']:7} n={n}: {rate:7.1f} tok/s", flush=True)
    asyncio.run(policy.aclose())
    return rows


MISMATCH_PROMPTS = [
    MESSAGES,
    [ChatMessage("system", "You are a research assistant. Plan, search, then answer with citations."),
     ChatMessage("user", "Who founded the University of Paris, and which religious orders taught there in the 1220s?")],
]


def mismatch(args: argparse.Namespace, engine: str) -> dict[str, Any]:
    """Sampler against trainer on the shipped SFT adapter: continuations sampled by `engine`, re-scored by the torch
    engine in bf16 with the same adapter (the trainer's arithmetic: unmerged LoRA, sdpa, one teacher-forced pass).
    Mean and max |Δ log p| and the k3 estimate of KL(sampler ‖ trainer) per token, the figure `max_sampler_kl`
    is compared with."""
    import math

    sampler = make_policy(engine, args)
    sampler.load_adapter(ADAPTER, "smollm2-sft")
    trainer = TransformersPolicyClient(ensure_converted(MODEL_CACHE), dtype="bfloat16", adapter_path=ADAPTER,
                                       version="smollm2-sft")
    out: dict[str, Any] = {"engine": engine, "adapter": "smollm2-sft", "by_temperature": {}}
    for temperature in (1.0, 0.8):
        diffs: list[float] = []
        for pi, messages in enumerate(MISMATCH_PROMPTS):
            ctx = asyncio.run(sampler.render_prompt(messages))
            for seed in range(args.mismatch_samples):
                g = asyncio.run(sampler.generate(ctx, stop=[], max_tokens=args.tokens, temperature=temperature,
                                                 seed=100 * pi + seed))
                theirs = asyncio.run(trainer.score(ctx, g.token_ids, temperature=temperature))
                diffs += [b - a for a, b in zip(g.logprobs, theirs, strict=True)]
        k3 = [math.exp(max(-20.0, min(20.0, d))) - d - 1 for d in diffs]
        out["by_temperature"][str(temperature)] = {
            "tokens": len(diffs), "mean_abs_gap": round(sum(abs(d) for d in diffs) / len(diffs), 4),
            "max_abs_gap": round(max(abs(d) for d in diffs), 3), "sampler_kl_k3": round(sum(k3) / len(k3), 5)}
        print(f"  mismatch {engine} T={temperature}: {out['by_temperature'][str(temperature)]}", flush=True)
    asyncio.run(sampler.aclose())
    asyncio.run(trainer.aclose())
    return out


def llamacpp(args: argparse.Namespace, bw: float) -> list[dict[str, Any]]:
    from llama_cpp import Llama

    gguf = bundled_gguf_path()
    llm = Llama(model_path=str(gguf), n_ctx=2048, n_threads=args.threads, n_threads_batch=args.threads,
                verbose=False, seed=0)
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(ensure_converted(MODEL_CACHE)))
    text = tokenizer.apply_chat_template([{"role": m.role, "content": m.content} for m in MESSAGES], tokenize=False,
                                         add_generation_prompt=True)
    fbytes = gguf.stat().st_size
    rows = []
    llm.create_completion(text, max_tokens=8, temperature=0.0)  # warm-up
    for temperature in (0.0, 1.0):
        rates, tokens = [], []
        for rep in range(args.reps):
            llm.reset()  # no prompt cache between repetitions: every run prefills, like the embedded runs
            t = time.perf_counter()
            out = llm.create_completion(text, max_tokens=args.tokens, temperature=temperature, top_p=1.0, top_k=0,
                                        min_p=0.0, repeat_penalty=1.0, seed=rep)
            dt = time.perf_counter() - t
            k = int(out["usage"]["completion_tokens"])
            rates.append(k / dt)
            tokens.append(k)
        rate = max(rates)
        limit = bw / fbytes
        rows.append({
            "engine": "llama.cpp", "dtype": "Q4_1 gguf", "adapter": False, "mode": "greedy" if temperature == 0
            else "sampled", "n": 1, "tokens": tokens, "tok_s": round(rate, 2),
            "tok_s_all": [round(r, 2) for r in rates], "bytes_per_step": fbytes, "limit_tok_s": round(limit, 1),
            "of_limit": round(rate / limit, 3),
        })  # fmt: skip
        print(f"  llama.cpp {rows[-1]['mode']:7}: {rate:7.1f} tok/s", flush=True)
    llm.close()
    return rows


def session(args: argparse.Namespace, engine: str | None = None) -> dict[str, Any]:
    """One `rubricem ask` at the demo's settings, in process; sampled tokens over the session's wall time. With
    `engine`, on that embedded engine (else on the configured one)."""
    from agent.config import RunOptions
    from app.container import build
    from app.settings import Settings

    settings = Settings()
    if engine is not None:
        agent = settings.agent.model_copy(update={
            "embedded_engine": "llamacpp" if engine.startswith("llamacpp") else "torch",
            "embedded_compile": engine == "torch-compiled",
            "embedded_gguf_path": dense_gguf() if engine == "llamacpp-bf16" else None,
            "embedded_merge_adapter": engine == "llamacpp-merged" if engine.startswith("llamacpp")
            else settings.agent.embedded_merge_adapter,
            "embedded_base_q8": engine == "llamacpp-q8",
            "embedded_threads": args.threads if engine.startswith("llamacpp") else args.torch_threads})
        settings = settings.model_copy(update={"agent": agent})
    values = settings.agent.defaults.model_dump() | {"max_tool_calls": 2, "format": "short_form", "seed": 0}
    if args.session_temperature is not None:
        values["temperature"] = args.session_temperature
    options = RunOptions.model_validate(values)
    t0 = time.perf_counter()
    services = build(settings, say=lambda *_: None, progress=None)
    loaded = time.perf_counter() - t0
    calls: list[dict[str, Any]] = []  # every policy.generate of the session: prompt length, new tokens, seconds
    policy, generate = services.policy, services.policy.generate

    async def timed(context: PromptContext, **kw: Any) -> Any:
        t = time.perf_counter()
        gen = await generate(context, **kw)
        calls.append({"prompt_tokens": len(context.token_ids), "new_tokens": len(gen.token_ids),
                      "seconds": round(time.perf_counter() - t, 3)})
        return gen

    policy.generate = timed  # an instance attribute shadows the method for this benchmark only

    async def go() -> Any:
        try:
            return await services.research.run(DEMO_Q, options, source="cli")
        finally:
            await services.policy.aclose()

    t = time.perf_counter()
    outcome = asyncio.run(go())
    wall = time.perf_counter() - t
    sampled = [x for x in outcome.trajectory.turns if x.kind == "sampled"]
    k = sum(len(x.token_ids) for x in sampled)
    gen_s = sum(c["seconds"] for c in calls)
    return {"engine": engine or settings.agent.embedded_engine, "question": DEMO_Q,
            "temperature": options.temperature,
            "decode_kernels": [settings.agent.embedded_decode_attention, settings.agent.embedded_decode_matmul],
            "merged_adapter": settings.agent.embedded_merge_adapter,
            "sampled_ids": [list(x.token_ids) for x in sampled],
            "load_s": round(loaded, 1), "wall_s": round(wall, 1), "sampled_tokens": k,
            "sampled_turns": len(sampled), "tool_calls": len(outcome.trajectory.tool_calls),
            "sampled_tok_per_wall_s": round(k / wall, 2), "generate_calls": len(calls),
            "generate_s": round(gen_s, 1), "generate_share_of_wall": round(gen_s / wall, 3),
            "tok_per_generate_s": round(sum(c["new_tokens"] for c in calls) / gen_s, 2) if gen_s else None,
            "max_prompt_tokens": max((c["prompt_tokens"] for c in calls), default=0), "calls": calls}


def compare_kernels(args: argparse.Namespace) -> list[dict[str, Any]]:
    """The demo session once per decode-kernel pair, in this order; wall times and whether the tokens equal the
    first run's (under greedy decoding they should, up to bf16 rounding of the kernels' sums)."""
    runs: list[dict[str, Any]] = []
    for pair in args.compare_kernels.split(","):
        attention, matmul, *merge = pair.split(":")
        os.environ["RUBRICEM_AGENT__EMBEDDED_DECODE_ATTENTION"] = attention
        os.environ["RUBRICEM_AGENT__EMBEDDED_DECODE_MATMUL"] = matmul
        os.environ["RUBRICEM_AGENT__EMBEDDED_MERGE_ADAPTER"] = "true" if merge == ["merge"] else "false"
        print(f"session with decode kernels {pair} ...", flush=True)
        s = session(args, "torch")
        s["same_tokens_as_first"] = s["sampled_ids"] == runs[0]["sampled_ids"] if runs else True
        s["speedup_vs_first"] = round(runs[0]["wall_s"] / s["wall_s"], 2) if runs else 1.0
        print(f"  {s['sampled_tokens']} tokens in {s['wall_s']} s (generate {s['generate_s']} s, "
              f"{s['tok_per_generate_s']} tok/s inside); same tokens as the first: {s['same_tokens_as_first']}; "
              f"x{s['speedup_vs_first']} against it", flush=True)
        runs.append(s)
    for key in ("RUBRICEM_AGENT__EMBEDDED_DECODE_ATTENTION", "RUBRICEM_AGENT__EMBEDDED_DECODE_MATMUL",
                "RUBRICEM_AGENT__EMBEDDED_MERGE_ADAPTER"):
        os.environ.pop(key, None)
    return runs


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tokens", type=int, default=64, help="new tokens per generation (default 64)")
    ap.add_argument("--groups", default="4,8", help="group sizes for generate_group (default 4,8)")
    ap.add_argument("--reps", type=int, default=2, help="repetitions per figure; the best is kept (default 2)")
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1,
                    help="llama.cpp threads (default: every CPU, the machine's natural count)")
    ap.add_argument("--torch-threads", type=int, default=0,
                    help="the torch engine's decode threads (default 0: measured, as the product does)")
    ap.add_argument("--engines", default=",".join(ENGINES),
                    help=f"embedded engines to measure, of {','.join(ENGINES)} (default all)")
    ap.add_argument("--session-engines", default=None,
                    help="with --session, the engines to run the session on (default: every one of --engines)")
    ap.add_argument("--mismatch-samples", type=int, default=3,
                    help="sampled continuations per prompt and temperature for the sampler-trainer gap (0: skip)")
    ap.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"])
    ap.add_argument("--bandwidth-mib", type=int, default=512, help="array size for the bandwidth probe")
    ap.add_argument("--session", action="store_true", help="also time one research session at the demo's settings")
    ap.add_argument("--session-temperature", type=float, default=None,
                    help="the session's temperature (default: the demo's; 0 = greedy, for --compare-kernels)")
    ap.add_argument("--compare-kernels", default=None, metavar="A:M[:merge],...",
                    help="run the session once per decode-kernel pair (attention:matmul, e.g. "
                         "sdpa:onednn,eager:onednn,gqa:native,gqa:native:merge; ':merge' serves the adapter merged), "
                         "one after the other, and compare their tokens")
    ap.add_argument("--merge-adapter", action="store_true",
                    help="serve the adapter merged into the weights in the tokens/s rows (the session follows the "
                         "RUBRICEM_AGENT__EMBEDDED_MERGE_ADAPTER setting)")
    ap.add_argument("--skip-llamacpp", action="store_true")
    ap.add_argument("--out", default=str(ROOT / "docs" / "decode" / "decode.json"))
    args = ap.parse_args()
    args.groups = [int(g) for g in args.groups.split(",") if g.strip()]
    args.engines = [e for e in args.engines.split(",") if e.strip()]
    if unknown := set(args.engines) - set(ENGINES):
        ap.error(f"unknown engines {sorted(unknown)}; choose from {','.join(ENGINES)}")

    started = time.time()
    load_before = os.getloadavg()
    print("memory bandwidth ...", flush=True)
    bw = bandwidth(args.bandwidth_mib, reps=5)
    print(f"  copy {bw['copy_gbps']} GB/s, read {bw['read_gbps']} GB/s", flush=True)
    limit_bw = bw["copy_gbps"] * 1e9
    rows: list[dict[str, Any]] = []
    for engine in args.engines:
        print(f"embedded policy on {engine} ...", flush=True)
        rows += embedded(args, limit_bw, engine)
    if not args.skip_llamacpp:
        print("llama.cpp in process ...", flush=True)
        rows += llamacpp(args, limit_bw)
    result: dict[str, Any] = {
        "when": time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(started)), "machine": platform.processor() or
        platform.machine(), "cpus": os.cpu_count(), "threads": args.threads, "tokens": args.tokens,
        "reps": args.reps, "loadavg_before": [round(x, 2) for x in load_before], "bandwidth": bw,
        "bandwidth_used_for_limits_gbps": bw["copy_gbps"], "rows": rows,
    }  # fmt: skip

    def find(engine: str, mode: str, n: int, adapter: bool = False) -> dict[str, Any] | None:
        return next((r for r in rows if (r["engine"], r["mode"], r["n"], r["adapter"]) == (engine, mode, n, adapter)),
                    None)

    targets: dict[str, Any] = {}
    one = find("torch", "sampled", 1)
    if one:
        targets["one_sequence_of_limit"] = one["of_limit"]
        for g in args.groups:
            grp = find("torch", "sampled", g)
            if grp:
                targets[f"group{g}_vs_one"] = round(grp["tok_s"] / one["tok_s"], 2)
    lc = find("llama.cpp", "sampled", 1)
    if one and lc:
        targets["torch_one_vs_llamacpp"] = round(one["tok_s"] / lc["tok_s"], 3)
    if args.compare_kernels:
        result["kernel_sessions"] = compare_kernels(args)
    if args.mismatch_samples:
        result["mismatch"] = [mismatch(args, e) for e in args.engines if e.startswith("llamacpp")]
    if args.session:
        result["sessions"] = []
        for engine in (args.session_engines.split(",") if args.session_engines else args.engines):
            print(f"one research session at the demo's settings on {engine} ...", flush=True)
            s = session(args, engine)
            result["sessions"].append(s)
            print(f"  {s['sampled_tokens']} sampled tokens in {s['wall_s']} s: {s['sampled_tok_per_wall_s']} tok/s; "
                  f"{s['generate_calls']} generate calls took {s['generate_s']} s ({s['tok_per_generate_s']} tok/s "
                  f"inside them), prompts up to {s['max_prompt_tokens']} tokens", flush=True)
            if lc:
                targets[f"session_vs_llamacpp[{engine}]"] = round(s["sampled_tok_per_wall_s"] / lc["tok_s"], 3)
    result["targets"] = targets
    result["loadavg_after"] = [round(x, 2) for x in os.getloadavg()]
    result["seconds"] = round(time.time() - started, 1)

    print(f"\nbandwidth (numpy copy, read+write): {bw['copy_gbps']} GB/s; load average before "
          f"{result['loadavg_before'][0]}, after {result['loadavg_after'][0]}")
    head = f"{'engine':14} {'weights':10} {'adapter':7} {'mode':7} {'n':>2} {'tok/s':>8} {'limit':>8} {'of limit':>8}"
    print(head)
    print("-" * len(head))
    for r in rows:
        print(f"{r['engine']:14} {r['dtype']:10} {'yes' if r['adapter'] else 'no':7} {r['mode']:7} {r['n']:>2} "
              f"{r['tok_s']:>8.1f} {r['limit_tok_s']:>8.1f} {r['of_limit']:>8.3f}")
    print("targets:", json.dumps(targets))
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1) + "\n", encoding="utf-8")
    print(f"written to {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
