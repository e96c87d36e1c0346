"""Benchmark (not a test): the trainer's resident memory across SS-GRPO updates, with and without handing freed
memory back to the OS (`learning.memory.release_freed_memory`, glibc malloc_trim), in one run.

Each side runs in its own subprocess on the converted SmolLM2 + LoRA r16 and does `--updates` policy updates on a
fresh random batch each time (8 sequences, prompts 900-1,300 and responses 100-250 tokens: the shapes of the
learning check's rollouts, so each update's peak differs a little, as in training). After every update it reports
the resident set (VmRSS); the trimming side trims first. The numbers are what a long-lived trainer or scheduler
process keeps between updates.

    .venv/bin/python tests/benchmarks/update_memory.py [--updates 5] [--token-budget 16384] [--grad-checkpointing]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))
os.environ.setdefault("HF_HUB_OFFLINE", "1")

from grpo_step import status_kib


def _rss_mib() -> int:
    return status_kib("VmRSS") // 1024


def child(args: argparse.Namespace) -> None:
    """One side: updates in a loop, printing one JSON line per update."""
    import torch

    from learning.engines.weights import ensure_converted
    from learning.memory import release_freed_memory
    from learning.model import LoraSettings, load_trainable, trainable_parameters
    from learning.sequences import TrainSequence
    from learning.update import policy_update

    torch.set_num_threads(args.threads)
    model_dir = ensure_converted(ROOT / ".cache" / "models")
    model, tok = load_trainable(model_dir, lora=LoraSettings(), dtype=args.dtype,
                                gradient_checkpointing=args.grad_checkpointing)
    optimizer = torch.optim.AdamW(trainable_parameters(model), lr=1e-4)
    rng = random.Random(args.seed)
    print(json.dumps({"update": 0, "rss_mib": _rss_mib()}), flush=True)
    for i in range(1, args.updates + 1):
        seqs = []
        for _ in range(8):
            p, r = rng.randint(900, 1300), rng.randint(100, 250)
            seqs.append(TrainSequence(tuple(rng.randrange(100, 40000) for _ in range(p)),
                                      tuple(rng.randrange(100, 40000) for _ in range(r)), (1,) * r, (3,) * r,
                                      tuple(rng.uniform(-1, 1) for _ in range(r))))
        stats = policy_update(model, optimizer, seqs, pad_id=int(tok.pad_token_id), token_budget=args.token_budget)
        if args.side == "trim":
            release_freed_memory()
        print(json.dumps({"update": i, "rss_mib": _rss_mib(), "tokens": stats.tokens,
                          "seconds": round(stats.seconds, 1)}), flush=True)


def main() -> int:
    """Run both sides and print the resident set after each update."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--updates", type=int, default=5)
    p.add_argument("--token-budget", type=int, default=16384, help="padded tokens per micro-batch")
    p.add_argument("--grad-checkpointing", action="store_true")
    p.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float32"))
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", help="write the JSON result here")
    p.add_argument("--side", choices=("keep", "trim"), help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.side:
        child(args)
        return 0
    result = {"options": {k: v for k, v in vars(args).items() if k not in ("side", "out")}}
    for side in ("keep", "trim"):
        cmd = [sys.executable, __file__, "--side", side, "--updates", str(args.updates), "--token-budget",
               str(args.token_budget), "--dtype", args.dtype, "--threads", str(args.threads), "--seed", str(args.seed)]
        if args.grad_checkpointing:
            cmd.append("--grad-checkpointing")
        out = subprocess.run(cmd, capture_output=True, text=True, check=True, cwd=ROOT).stdout
        result[side] = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
    print("update  RSS MiB (malloc keeps)  RSS MiB (trimmed)")
    for a, b in zip(result["keep"], result["trim"], strict=True):
        print(f"{a['update']:>6}  {a['rss_mib']:>20,}  {b['rss_mib']:>17,}")
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=1), encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
