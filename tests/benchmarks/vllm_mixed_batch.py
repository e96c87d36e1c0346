"""Benchmark (not a test): does a request's log-probs on the real vLLM (CPU build) depend on what shares its batch?

Why: in a two-worker suite run the contract test's base-model request ran while another worker's request on the SFT
adapter was in flight on the same server, and its first two log-probs were 0.43 and 1.69 nats away from the torch
trainer's (the rest within 0.04); alone it agrees within 0.25 everywhere. If a base request batched with an adapter
request (or the other way round) is computed with the wrong weights, then (a) sessions of two teams served at once get
outputs from the wrong weights, (b) the swap probe (`learning.swap_verify`) reads a wrong distance on a busy server,
and (c) the sampler log-probs that training's importance ratio uses are wrong for mixed batches. Upstream reports of
the same class of fault: vllm-project/vllm#16668 and #17766 (LoRA index mapping when prefill and decode share a step).

One server with the project's flags and two adapters per batch (the shared test server's spec), the shipped SFT
adapter loaded as `sft`. Greedy decoding of `--tokens` tokens from two fixed chat prompts, with log-probs:
- `alone`: each model on its own, `--reps` times (the noise floor: greedy on one server should repeat exactly);
- `together`: base and adapter sent at the same moment (they prefill in one step);
- `staggered`: the other model's request sent first, this one `--delay-s` later (one prefills while the other decodes);
- `beside_same_model`: the control for the two above, this request beside one on the same model (another prompt);
- `during_failed_load` / `after_failed_load`: while, and after, the server fails to load another base model's
  adapter (it fails inside the engine, "size of tensor");
- `after_other_model_same_prompt`: this model's prompt sent to the other model first, then this request (what the
  prefix cache keeps of the other model's run of the same prompt).
Each row gives, per condition, the largest and mean |log-prob - alone's| over the tokens both decoded, and whether
the sampled ids differ from alone's.

    .venv/bin/python tests/benchmarks/vllm_mixed_batch.py [--tokens 24] [--reps 3] [--out docs/vllm/mixed_batch.json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import sys
import tempfile
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

from agent.config import SHIPPED_SFT_ADAPTER  # noqa: E402
from app.policy_server import LocalVLLMServer, VLLMServerSpec, serving_dtype  # noqa: E402
from learning.engines.llamacpp_build import cpu_flags  # noqa: E402
from learning.engines.threads import cpu_model  # noqa: E402
from learning.engines.weights import ensure_converted  # noqa: E402
from tests.benchmarks.vllm_engine import say  # noqa: E402
from tests.servers import free_port  # noqa: E402

MODEL_CACHE = ROOT / ".cache" / "models"
PROMPTS = {  # two different prompts, so the two requests never share a prefix cache entry
    "policy": "Write a long, detailed essay about the history of the printing press in Europe.",
    "sft": "Explain step by step how a bill becomes a law in the United States Congress.",
}


async def rendered(client: httpx.AsyncClient, text: str) -> list[int]:
    resp = await client.post("/tokenize", json={"model": "policy", "add_generation_prompt": True,
                                                "add_special_tokens": False,
                                                "messages": [{"role": "user", "content": text}]})
    resp.raise_for_status()
    return list(resp.json()["tokens"])


async def complete(client: httpx.AsyncClient, model: str, prompt: list[int], tokens: int,
                   delay_s: float = 0.0) -> dict[str, Any]:
    if delay_s:
        await asyncio.sleep(delay_s)
    body = {"model": model, "prompt": prompt, "max_tokens": tokens, "temperature": 0.0, "logprobs": 1,
            "return_token_ids": True, "skip_special_tokens": False, "ignore_eos": True}
    resp = await client.post("/v1/completions", json=body)
    resp.raise_for_status()
    choice = resp.json()["choices"][0]
    return {"ids": list(choice["token_ids"]), "lps": [float(x) for x in choice["logprobs"]["token_logprobs"]]}


def gaps(ref: dict[str, Any], got: dict[str, Any]) -> dict[str, Any]:
    """How far `got` is from the `alone` reference, over the positions both decoded the same prefix."""
    same = 0
    for a, b in zip(ref["ids"], got["ids"], strict=False):
        if a != b:
            break
        same += 1
    diffs = [abs(a - b) for a, b in zip(ref["lps"][:same + 1], got["lps"][:same + 1], strict=False)]
    worst = max(range(len(diffs)), key=diffs.__getitem__) if diffs else None
    return {"max": round(max(diffs), 4) if diffs else None, "mean": round(sum(diffs) / len(diffs), 4) if diffs else None,
            "at": worst, "ids_same": got["ids"] == ref["ids"], "first_diverging_token": None if got["ids"] == ref["ids"]
            else same}


async def measure(url: str, tokens: int, reps: int, delay_s: float,
                  bad_adapter: Path | None) -> dict[str, Any]:
    async with httpx.AsyncClient(base_url=url, timeout=600) as client:
        prompts = {model: await rendered(client, text) for model, text in PROMPTS.items()}
        other = {"policy": "sft", "sft": "policy"}
        await complete(client, "policy", prompts["policy"], 4)  # warm-up
        await complete(client, "sft", prompts["sft"], 4)
        alone = {m: [await complete(client, m, prompts[m], tokens) for _ in range(reps)] for m in prompts}
        ref = {m: runs[0] for m, runs in alone.items()}
        rows: list[dict[str, Any]] = []
        for m in prompts:
            for run in alone[m][1:]:
                rows.append({"model": m, "condition": "alone", **gaps(ref[m], run)})
        for _ in range(reps):
            for m in prompts:
                mine, _theirs = await asyncio.gather(complete(client, m, prompts[m], tokens),
                                                     complete(client, other[m], prompts[other[m]], tokens))
                rows.append({"model": m, "condition": "together", **gaps(ref[m], mine)})
                _theirs, mine = await asyncio.gather(  # the other one decodes while this one prefills
                    complete(client, other[m], prompts[other[m]], tokens * 3),
                    complete(client, m, prompts[m], tokens, delay_s=delay_s))
                rows.append({"model": m, "condition": "staggered", **gaps(ref[m], mine)})
                # the control: the same model beside itself (another prompt), no adapter mixing
                mine, _same = await asyncio.gather(complete(client, m, prompts[m], tokens),
                                                   complete(client, m, prompts[other[m]], tokens * 3))
                rows.append({"model": m, "condition": "beside_same_model", **gaps(ref[m], mine)})
        for m in prompts:  # an adapter load that fails inside the engine while this request runs (issue 63)
            if bad_adapter is None:
                break
            load = client.post("/v1/load_lora_adapter", json={"lora_name": "bad", "lora_path": str(bad_adapter)})
            mine, failed = await asyncio.gather(complete(client, m, prompts[m], tokens), load)
            rows.append({"model": m, "condition": "during_failed_load", "load_status": failed.status_code,
                         **gaps(ref[m], mine)})
            rows.append({"model": m, "condition": "after_failed_load",
                         **gaps(ref[m], await complete(client, m, prompts[m], tokens))})
        for m in prompts:  # last: it may leave the other model's blocks for this prompt in the prefix cache
            await complete(client, other[m], prompts[m], tokens)  # THIS model's prompt on the other model, first
            rows.append({"model": m, "condition": "after_other_model_same_prompt",
                         **gaps(ref[m], await complete(client, m, prompts[m], tokens))})
        return {"rows": rows}


def summarise(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    out = []
    for model in PROMPTS:
        for cond in ("alone", "beside_same_model", "together", "staggered", "during_failed_load", "after_failed_load",
                     "after_other_model_same_prompt"):
            sel = [r for r in rows if r["model"] == model and r["condition"] == cond]
            if not sel:
                continue
            out.append({"model": model, "condition": cond, "n": len(sel),
                        "max_gap": max(r["max"] or 0.0 for r in sel),
                        "mean_gap": round(sum(r["mean"] or 0.0 for r in sel) / len(sel), 4),
                        "ids_differ": sum(not r["ids_same"] for r in sel)})
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tokens", type=int, default=24)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--delay-s", type=float, default=0.3, help="how long after the other request this one is sent")
    ap.add_argument("--dtype", default="auto", help="the served dtype (auto: by this CPU's features)")
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    model_dir = ensure_converted(MODEL_CACHE)
    dtype = serving_dtype(args.dtype, cpu_flags())  # what the server resolves "auto" to on this CPU
    spec = VLLMServerSpec(model_dir=model_dir, port=free_port(), dtype=args.dtype, max_loras=2)
    with tempfile.TemporaryDirectory(prefix="rubricem-mixed-") as tmp:
        say(f"starting vLLM ({dtype}) ...")
        server = LocalVLLMServer(spec, log_path=Path(tmp) / "vllm.log").start(timeout_s=900)
        try:
            with httpx.Client(base_url=server.url, timeout=300) as c:
                r = c.post("/v1/load_lora_adapter", json={"lora_name": "sft", "lora_path": str(SHIPPED_SFT_ADAPTER)})
                r.raise_for_status()
            say("measuring ...")
            from tests.adapters import reshaped_adapter  # another base model's adapter: vLLM fails it mid-load

            bad = reshaped_adapter(SHIPPED_SFT_ADAPTER, Path(tmp) / "other-base", hidden=1024)
            got = asyncio.run(measure(server.url, args.tokens, args.reps, args.delay_s, bad))
        finally:
            server.stop()
    result = {"cpu": cpu_model(), "machine": platform.machine(), "dtype": dtype, "tokens": args.tokens,
              "reps": args.reps, "delay_s": args.delay_s, "summary": summarise(got["rows"]), **got}
    for row in result["summary"]:
        print(json.dumps(row))
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(result, indent=1) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
