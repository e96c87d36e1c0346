"""One-token decode step of the embedded SmolLM2 behind a long KV cache, per attention implementation.

Why: the decode benchmark (decode.py) found the step growing from ~55 ms at 64 tokens of context to ~164 ms at
3,000, and a research session decodes mostly at long context. This isolates the attention kernel: the same model,
the same `DynamicCache`, `sdpa` against `eager`, alternating so that load on the machine hits both alike.

    .venv/bin/python tests/benchmarks/attention_context.py [--context 64 1000 3000] [--steps 12] [--threads 1]

Prints the median step time per implementation and context length. Not a test: nothing is asserted.
"""

from __future__ import annotations

import argparse
import statistics
import time


def main() -> None:
    import torch
    from transformers import AutoModelForCausalLM, DynamicCache

    from app.settings import Settings
    from learning.engines.weights import ensure_converted

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--context", type=int, nargs="+", default=[64, 1000, 3000])
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--rounds", type=int, default=2, help="alternations of the two implementations")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    model_dir = ensure_converted(Settings().store.model_cache)
    models = {impl: AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.bfloat16,
                                                         attn_implementation=impl).eval()
              for impl in ("sdpa", "eager")}
    results: dict[tuple[str, int], list[float]] = {}
    gen = torch.Generator().manual_seed(0)
    for _ in range(args.rounds):
        for length in args.context:
            prompt = torch.randint(100, 40000, (1, length), generator=gen)
            for impl, model in models.items():
                with torch.inference_mode():
                    cache = DynamicCache(config=model.config)
                    model(input_ids=prompt, past_key_values=cache, use_cache=True, logits_to_keep=1)
                    token = torch.tensor([[500]])
                    for _ in range(args.steps):
                        t0 = time.perf_counter()
                        model(input_ids=token, past_key_values=cache, use_cache=True)
                        results.setdefault((impl, length), []).append(time.perf_counter() - t0)
    print(f"{'context':>8} {'sdpa ms':>9} {'eager ms':>9} {'sdpa/eager':>11}")
    for length in args.context:
        s = statistics.median(results[("sdpa", length)]) * 1000
        e = statistics.median(results[("eager", length)]) * 1000
        print(f"{length:>8} {s:>9.1f} {e:>9.1f} {s / e:>11.2f}")


if __name__ == "__main__":
    main()
