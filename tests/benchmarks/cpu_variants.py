"""Benchmark (not a test): llama.cpp's CPU backend variants on this machine, and the demo session on each (issue 47).

`make install` builds llama.cpp with several CPU variants (`learning.engines.llamacpp_build`); the product runs the
best one the CPU runs (`learning.engines.cpu_backend`). For every variant built and able to run here (or
`--variants`), each in its own child process with that variant forced (`RUBRICEM_AGENT__EMBEDDED_CPU_VARIANT`):

(a) prompt prefill, tokens/s, of 512- and 1,536-token prompts on the bundled Q4_1 GGUF and on its Q8_0 copy (the
    `embedded_base_q8` setting), each with no adapter and with the shipped SFT adapter as GGUF LoRA (what the demo
    serves), and one-token decode steps behind the short prompt;
(b) llama-cpp-python's own `Llama`: `--tokens` sampled tokens after the ~40-token prompt of `decode.py` (c), best of
    `--reps`: the reference rate the session targets are fractions of;
(c) greedy: `--greedy-tokens` tokens of that prompt with the SFT adapter, through the product's engine; their ids are
    compared across variants (`greedy_same_as`);
(d) with `--session`, on `--session-variants`: `make demo`'s session (default settings, 2 tool calls, short_form,
    seed 0) in a fresh process, as `make demo` runs it, `--session-reps` times (the fastest kept): wall time, sampled
    tokens, sampled tokens per wall second, and that rate over (b) of the same variant and of the variant the product
    chooses; with `--session-greedy` at temperature 0 as well, whose tokens are compared across variants.

Variants run one after another; measure on an idle machine (the load average is recorded before and after).

    .venv/bin/python tests/benchmarks/cpu_variants.py --session --session-greedy --out docs/decode/cpu_variants.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests" / "benchmarks"))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

from learning.engines import cpu_backend  # noqa: E402
from learning.engines.weights import bundled_gguf_path, ensure_tokenizer  # noqa: E402

MODEL_CACHE = ROOT / ".cache" / "models"
ENV_VARIANT = "RUBRICEM_AGENT__EMBEDDED_CPU_VARIANT"


def _child(cmd: list[str], variant: str, timeout: float = 900) -> dict[str, Any]:
    env = {**os.environ, ENV_VARIANT: variant, "PYTHONPATH": str(ROOT)}
    done = subprocess.run(cmd, env=env, cwd=ROOT, capture_output=True, text=True, timeout=timeout, check=False)
    lines = [x for x in done.stdout.splitlines() if x.startswith("{")]
    if done.returncode != 0 or not lines:
        return {"error": f"exit {done.returncode}: {done.stderr.strip()[-800:]}"}
    return json.loads(lines[-1])


def micro(variant: str, args: argparse.Namespace) -> dict[str, Any]:
    """(a)-(c) in this process, `variant` loaded first."""
    import llama_cpp

    from agent.protocols import ChatMessage
    from app.container import SHIPPED_SFT_ADAPTER
    from learning.engines.gguf_lora import cached_lora, cached_q8_base
    from learning.engines.llamacpp_engine import EmbeddedLlamaCppClient

    gguf = bundled_gguf_path()
    tok_dir = ensure_tokenizer(MODEL_CACHE)
    chosen = cpu_backend.load_cpu_backend(gguf, MODEL_CACHE / cpu_backend.RECORD_FILENAME, variant)
    lora = cached_lora(SHIPPED_SFT_ADAPTER, gguf, MODEL_CACHE / "gguf-lora")
    q8 = cached_q8_base(gguf, MODEL_CACHE / "gguf-lora")  # the base `embedded_base_q8` serves
    lora_q8 = cached_lora(SHIPPED_SFT_ADAPTER, q8, MODEL_CACHE / "gguf-lora")
    out: dict[str, Any] = {"variant": chosen.name if chosen else None, "threads": args.threads}
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    for label, model, adapter in (("base", gguf, None), ("sft_lora", gguf, lora), ("q8_base", q8, None),
                                  ("q8_sft_lora", q8, lora_q8)):
        llm = llama_cpp.Llama(str(model), n_ctx=4096, n_batch=512, n_threads=args.threads,
                              n_threads_batch=args.threads, lora_path=str(adapter) if adapter else None,
                              verbose=False)
        ids = llm.tokenize(text.encode())
        row: dict[str, Any] = {}
        for n in (512, 1536):
            best = 0.0
            for _ in range(args.reps):
                llm.reset()
                t = time.perf_counter()
                llm.eval(ids[:n])
                best = max(best, n / (time.perf_counter() - t))
            row[f"prefill_{n}_tok_s"] = round(best, 1)
        llm.reset()
        llm.eval(ids[:40])
        t = time.perf_counter()
        for tok in ids[40:40 + 64]:
            llm.eval([tok])
        row["decode_tok_s"] = round(64 / (time.perf_counter() - t), 1)
        out[label] = row
        llm.close()
    from decode import MESSAGES  # the ~40-token prompt of decode.py (c)

    llm = llama_cpp.Llama(str(gguf), n_ctx=2048, n_threads=args.threads, n_threads_batch=args.threads,
                          verbose=False, seed=0)
    from transformers import AutoTokenizer

    prompt = AutoTokenizer.from_pretrained(str(tok_dir)).apply_chat_template(
        [{"role": m.role, "content": m.content} for m in MESSAGES], tokenize=False, add_generation_prompt=True)
    llm.create_completion(prompt, max_tokens=8, temperature=0.0)  # warm-up
    rates = []
    for rep in range(args.reps):
        llm.reset()
        t = time.perf_counter()
        res = llm.create_completion(prompt, max_tokens=args.tokens, temperature=1.0, top_p=1.0, top_k=0, min_p=0.0,
                                    repeat_penalty=1.0, seed=rep)
        rates.append(int(res["usage"]["completion_tokens"]) / (time.perf_counter() - t))
    out["llama_sampled_tok_s"] = round(max(rates), 2)
    llm.close()
    client = EmbeddedLlamaCppClient(tok_dir, gguf, adapter_path=SHIPPED_SFT_ADAPTER,
                                    lora_cache=MODEL_CACHE / "gguf-lora", threads=args.threads,
                                    batch_threads=args.threads, cpu_variant=variant)
    import asyncio

    async def greedy() -> Any:
        ctx = await client.render_prompt([ChatMessage(role=m.role, content=m.content) for m in MESSAGES])
        return await client.generate(ctx, stop=[], max_tokens=args.greedy_tokens, temperature=0.0, seed=0)

    out["greedy_ids"] = list(asyncio.run(greedy()).token_ids)
    asyncio.run(client.aclose())
    return out


def run_session(args: argparse.Namespace, temperature: float | None) -> dict[str, Any]:
    import decode

    r = decode.session(argparse.Namespace(session_temperature=temperature, threads=args.threads, torch_threads=0))
    from learning.engines.cpu_backend import loaded_variant

    v = loaded_variant()
    return {"variant": v.name if v else None, **{k: r[k] for k in (
        "wall_s", "load_s", "sampled_tokens", "sampled_tok_per_wall_s", "generate_s", "max_prompt_tokens",
        "sampled_ids", "calls", "temperature")}}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--variants", default="", help="comma-separated variants (default: every one built that runs here)")
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--greedy-tokens", type=int, default=64)
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--session", action="store_true")
    ap.add_argument("--session-variants", default="",
                    help="variants to run the sessions on (default: the one the product chooses here, and haswell, "
                         "the AVX2 floor)")
    ap.add_argument("--session-reps", type=int, default=2,
                    help="sessions per variant; the fastest is reported, every wall time kept (default 2: this VM's "
                         "neighbours slow a run now and then, by up to 2.5x)")
    ap.add_argument("--session-greedy", action="store_true")
    ap.add_argument("--child", choices=["micro", "session", "session-greedy"], help=argparse.SUPPRESS)
    ap.add_argument("--out", default=str(ROOT / "docs" / "decode" / "cpu_variants.json"))
    args = ap.parse_args()
    if args.child:
        variant = os.environ[ENV_VARIANT]
        result = micro(variant, args) if args.child == "micro" else run_session(
            args, 0.0 if args.child == "session-greedy" else None)
        print(json.dumps(result), flush=True)
        return 0

    lib = cpu_backend.lib_dir()
    scored = cpu_backend.scored_variants(lib) if lib else []
    if not scored:
        print("this llama-cpp-python has no CPU variants (built without GGML_BACKEND_DL); run `make install`")
        return 1
    gguf = bundled_gguf_path()
    record = MODEL_CACHE / cpu_backend.RECORD_FILENAME
    chosen = cpu_backend.choose(scored, gguf, record)  # what the product runs here (probes recorded)
    wanted = [v for v in args.variants.split(",") if v] or [v.name for v in scored if v.score > 0]
    session_variants = {v for v in args.session_variants.split(",") if v} or {chosen.name, "haswell"}
    faulted = cpu_backend._read_record(record, cpu_backend.machine_record_key(lib))["faulted"]
    started, load_before = time.time(), os.getloadavg()
    base = [sys.executable, str(Path(__file__).resolve()), "--threads", str(args.threads), "--tokens",
            str(args.tokens), "--greedy-tokens", str(args.greedy_tokens), "--reps", str(args.reps), "--child"]
    rows: list[dict[str, Any]] = []
    for name in wanted:
        if name in faulted:
            rows.append({"variant": name, "skipped": f"faulted here: {faulted[name]}"})
            continue
        print(f"{name}: prefill, decode, Llama, greedy ...", flush=True)
        row: dict[str, Any] = {"variant": name, "score": next((v.score for v in scored if v.name == name), None),
                               "micro": _child([*base, "micro"], name)}
        m = row["micro"]
        if "error" not in m:
            print(f"  prefill 512/1536: base {m['base']['prefill_512_tok_s']}/{m['base']['prefill_1536_tok_s']}, "
                  f"SFT LoRA {m['sft_lora']['prefill_512_tok_s']}/{m['sft_lora']['prefill_1536_tok_s']} tok/s; "
                  f"decode {m['base']['decode_tok_s']} / {m['sft_lora']['decode_tok_s']}; "
                  f"Llama sampled {m['llama_sampled_tok_s']}", flush=True)
        for kind, flag in (("session", args.session), ("session_greedy", args.session_greedy)):
            if flag and name in session_variants:
                runs = [_child([*base, kind.replace("_", "-")], name) for _ in range(args.session_reps)]
                ok = [x for x in runs if "error" not in x]
                s = min(ok, key=lambda x: x["wall_s"]) if ok else runs[0]
                s["wall_s_all"] = [x.get("wall_s") for x in runs]
                row[kind] = s
                if "error" not in s:
                    print(f"  {kind}: {s['wall_s']} s (all: {s['wall_s_all']}), {s['sampled_tokens']} tokens, "
                          f"{s['sampled_tok_per_wall_s']} tok/s", flush=True)
        rows.append(row)

    def ref(name: str) -> float | None:
        r = next((x for x in rows if x["variant"] == name and "micro" in x and "error" not in x["micro"]), None)
        return r["micro"]["llama_sampled_tok_s"] if r else None

    first_greedy = next((r for r in rows if "micro" in r and "error" not in r["micro"]), None)
    first_session = next((r for r in rows if "error" not in r.get("session_greedy", {"error": 1})), None)
    for r in rows:
        if "micro" in r and "error" not in r["micro"] and first_greedy is not None:
            r["micro"]["greedy_same_as"] = {first_greedy["variant"]: r["micro"]["greedy_ids"] ==
                                            first_greedy["micro"]["greedy_ids"]}
        s = r.get("session")
        if s and "error" not in s and ref(r["variant"]):
            s["of_own_llama"] = round(s["sampled_tok_per_wall_s"] / ref(r["variant"]), 3)
            if ref(chosen.name):
                s["of_chosen_llama"] = round(s["sampled_tok_per_wall_s"] / ref(chosen.name), 3)
        g = r.get("session_greedy")
        if g and "error" not in g and first_session is not None:
            g["tokens_same_as"] = {first_session["variant"]: g["sampled_ids"] ==
                                   first_session["session_greedy"]["sampled_ids"]}
    result = {"when": time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(started)), "machine": platform.processor()
              or platform.machine(), "cpus": os.cpu_count(), "threads": args.threads, "chosen": chosen.name,
              "scores": {v.name: v.score for v in scored}, "faulted": faulted,
              "loadavg_before": [round(x, 2) for x in load_before], "rows": rows,
              "loadavg_after": [round(x, 2) for x in os.getloadavg()], "seconds": round(time.time() - started)}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=1), encoding="utf-8")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
