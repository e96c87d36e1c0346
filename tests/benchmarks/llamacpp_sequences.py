"""How much several sequences in one llama.cpp context buy on this machine (issue 45, item 2): a script, not a test.

The learning curve's rollouts and evaluation sessions are decoded by llama.cpp one sequence at a time. Decoding a
group's rollouts at once would put S sequences in one context and decode one token of each per `llama_decode`. That
pays only if a batched step costs much less than S single steps, so this measures it directly, through the same C API
the embedded engine uses (`learning.engines.llamacpp_engine`): the bundled Q4_1 SmolLM2, optionally with the shipped SFT
adapter as a GGUF LoRA (what rollouts run), S sequences each holding a `--context`-token prompt, then `--steps`
decode steps of S tokens. Prefill is timed on 512-token chunks (it is one large batch already: nothing to gain).

    .venv/bin/python tests/benchmarks/llamacpp_sequences.py --out docs/speed/llamacpp_sequences.json

Ratios within one run are what to read (aggregate tokens/s at S against S = 1); absolute rates move with the machine.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
SFT_ADAPTER = ROOT / "agent" / "adapters" / "smollm2-sft"


def measure(gguf: Path, lora: Path | None, threads: int, context: int, sequences: list[int], steps: int
            ) -> list[dict[str, Any]]:
    """Aggregate decode tokens/s for each S in `sequences`, and the prefill rate."""
    import llama_cpp.llama_cpp as lc
    import numpy as np

    lc.llama_backend_init()
    model = lc.llama_model_load_from_file(str(gguf).encode(), lc.llama_model_default_params())
    n_vocab = lc.llama_vocab_n_tokens(lc.llama_model_get_vocab(model))
    adapter = lc.llama_adapter_lora_init(model, str(lora).encode()) if lora is not None else None
    rows = []
    try:
        for s_count in sequences:
            cp = lc.llama_context_default_params()
            cp.n_ctx = (context + steps + 16) * s_count
            cp.n_batch = cp.n_ubatch = 512
            cp.n_seq_max = s_count
            cp.n_threads = cp.n_threads_batch = threads
            ctx = lc.llama_init_from_model(model, cp)
            batch = lc.llama_batch_init(512, 0, s_count)
            try:
                if adapter is not None:
                    lc.llama_set_adapters_lora(ctx, (lc.llama_adapter_lora_p_ctypes * 1)(adapter), 1,
                                               (ctypes.c_float * 1)(1.0))
                prefill_s, prefill_tokens = 0.0, 0
                for seq in range(s_count):
                    for c0 in range(0, context, 512):
                        n = min(512, context - c0)
                        batch.n_tokens = n
                        for j in range(n):
                            i = c0 + j
                            batch.token[j] = 1000 + (i * 7 + seq * 13) % 20000
                            batch.pos[j], batch.n_seq_id[j], batch.seq_id[j][0] = i, 1, seq
                            batch.logits[j] = i == context - 1
                        began = time.perf_counter()
                        if lc.llama_decode(ctx, batch) != 0:
                            raise RuntimeError("llama_decode failed in prefill")
                        prefill_s += time.perf_counter() - began
                        prefill_tokens += n
                began = time.perf_counter()
                for k in range(steps):
                    batch.n_tokens = s_count
                    for seq in range(s_count):
                        batch.token[seq] = 2000 + k + seq
                        batch.pos[seq], batch.n_seq_id[seq], batch.seq_id[seq][0] = context + k, 1, seq
                        batch.logits[seq] = True
                    if lc.llama_decode(ctx, batch) != 0:
                        raise RuntimeError("llama_decode failed in decode")
                    for seq in range(s_count):  # the copy the engine makes of every row it samples from
                        np.ctypeslib.as_array(lc.llama_get_logits_ith(ctx, seq), shape=(n_vocab,)).copy()
                seconds = time.perf_counter() - began
            finally:
                lc.llama_batch_free(batch)
                lc.llama_free(ctx)
            rows.append({"sequences": s_count, "decode_tok_s": round(steps * s_count / seconds, 1),
                         "step_ms": round(1000 * seconds / steps, 2),
                         "prefill_tok_s": round(prefill_tokens / prefill_s, 1)})
            print(json.dumps(rows[-1]), flush=True)
    finally:
        if adapter is not None:
            lc.llama_adapter_lora_free(adapter)
        lc.llama_model_free(model)
    base = rows[0]["decode_tok_s"]
    for r in rows:
        r["decode_speedup"] = round(r["decode_tok_s"] / base, 2)
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--threads", default="2,1", help="llama.cpp thread counts to measure (default 2,1)")
    ap.add_argument("--contexts", default="300,1500", help="prompt tokens held per sequence (default 300,1500)")
    ap.add_argument("--sequences", default="1,2,4,8", help="sequences per context (default 1,2,4,8)")
    ap.add_argument("--steps", type=int, default=48, help="decode steps per measurement (default 48)")
    ap.add_argument("--out", type=Path, default=None)
    a = ap.parse_args()
    from learning.engines.gguf_lora import cached_lora
    from learning.engines.weights import bundled_gguf_path
    from learning.engines.threads import cpu_model

    gguf = bundled_gguf_path()
    lora = cached_lora(SFT_ADAPTER, gguf, ROOT / ".cache" / "lora-gguf")
    sequences = [int(x) for x in a.sequences.split(",")]
    results = []
    t0 = time.perf_counter()
    for threads in (int(x) for x in a.threads.split(",")):
        for context in (int(x) for x in a.contexts.split(",")):
            for name, path in (("sft-lora", lora), ("base", None)):
                print(f"# threads {threads}, context {context}, {name}", flush=True)
                results.append({"threads": threads, "context": context, "weights": name,
                                "rows": measure(gguf, path, threads, context, sequences, a.steps)})
    report = {"what": "llama.cpp decode with S sequences in one context (tests/benchmarks/llamacpp_sequences.py)",
              "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "cpus": os.cpu_count(),
              "cpu": cpu_model(), "loadavg_before": os.getloadavg(),
              "gguf": gguf.name, "steps": a.steps, "results": results, "seconds": round(time.perf_counter() - t0, 1)}
    if a.out is not None:
        a.out.parent.mkdir(parents=True, exist_ok=True)
        a.out.write_text(json.dumps(report, indent=1))
    for r in results:
        print(f"threads {r['threads']} context {r['context']:5d} {r['weights']:8s}: " + ", ".join(
            f"S={x['sequences']} {x['decode_tok_s']} tok/s (x{x['decode_speedup']})" for x in r["rows"])
            + f"; prefill {r['rows'][0]['prefill_tok_s']} tok/s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
