"""Benchmark (not a test): training tokens/s and peak memory of one optimizer step of our SFT trainer
(`learning.sft.train`) versus one TRL `SFTTrainer` step, on the same model, LoRA settings and batch, in one run.
Target: at least TRL's throughput at no more memory.

What is compared. The batch is the first `--batch` kept examples of the SFT data folder (`--data`), encoded once by
`learning.sft.train.encode` (the exact label mask: assistant tokens and the end-of-turn marker, tool outputs masked)
and, with `--max-len`, cut to their last `--max-len` tokens (the trained part follows a ~770-token system+user prompt,
so keeping the start would leave short cuts with nothing to train). Both sides get the same token ids and the same
trained positions through a JSON spec; each runs in its own subprocess (so its peak memory is its own) with the same
thread count, does `--warmup` steps, then `--reps` timed steps; the median is reported, with the process's CPU
seconds per step (steadier than wall time on a shared machine).

* ours: `learning.sft.train.sft_step`, the step `train_sft` runs. Model from `learning.model.load_trainable` with the preset's LoRA,
  dtype and activation checkpointing, `torch.optim.AdamW`, `accelerate.Accelerator.prepare`. Timed: for each
  sequence the forward (LM head only at trained positions) + backward of its summed NLL divided by the step's trained
  tokens (a token-level mean over the step), gradient clipping, the optimizer and scheduler steps, zero_grad. The
  lr is constant on both sides (train_sft's warm-up + cosine multiplier changes values, not cost).
* TRL: `SFTTrainer.train()` for warmup + reps steps on a pre-tokenised dataset: `input_ids` plus an
  `assistant_masks` column (1 where our label is trained; TRL 1.16 folds it into `labels`, and the script checks the
  prepared labels equal ours). Timed per step by a `TrainerCallback`, from `on_step_begin` to `on_step_end`:
  collation, `training_step` for each micro-batch (forward with TRL's fused LM head, which also only projects trained
  positions, plus its entropy/accuracy metrics; backward of the loss summed over trained tokens / the step's trained
  tokens, the same normalisation as ours), gradient clipping, the optimizer and scheduler steps. Config:
  per_device_train_batch_size `--micro-batch` (default 1: one sequence per forward like ours, so no padding),
  gradient_accumulation_steps batch / micro-batch, max_length None (already cut), packing and padding_free off, the
  same LoRA r/alpha/dropout/targets through `peft_config`, the same activation checkpointing (non-reentrant), AdamW
  with the preset's weight decay, constant lr, the preset's max_grad_norm, and on CPU use_cpu=True, report_to=[].

Dtype: both sides load the base weights in the preset's dtype (bfloat16 for `cpu` and `gpu-8b`, as `train_sft`
does) and run without autocast (TRL bf16=False, fp16=False); PEFT's default upcasts the LoRA weights to float32 on
both sides. Both sides train the same tokens; the throughput unit is every token of the step (as `train_sft`'s
`tokens_per_second`). The first step starts from the same weights (LoRA B = 0), so its logged loss should agree.
Peak memory, MFU and the table come from `grpo_step.py`'s helpers: on CPU the peak resident set (VmHWM, reset through
/proc/self/clear_refs) minus the resident set before the first step; on CUDA torch.cuda.max_memory_allocated minus
memory_allocated before it; MFU = 6 * N * tokens / s / peak FLOP/s (N without the input embedding; a frozen base
needs no weight gradients, so 6N overstates the work of LoRA training: compare MFU between sides only).

    .venv/bin/python tests/benchmarks/sft_step.py --batch 4 --max-len 1024 --reps 3
    .venv/bin/python tests/benchmarks/sft_step.py --device cuda --random-init-shape qwen3-8b --batch 16 \
        --max-len 0 --out sft_step_h100.json

Measured on 2 shared cores while another job ran; ratios only (SmolLM2-135M, preset cpu: bf16, LoRA r16, no
activation checkpointing; 2 sequences of 512 tokens, 1,024 tokens (774 trained) a step; first-step loss
2.4965 on both sides):

    nice -n 19 .venv/bin/python tests/benchmarks/sft_step.py --batch 2 --max-len 512 --warmup 1 --reps 2 --threads 1

    side  median s  tokens/s  CPU s  peak Δ     peak total
    ours  11.513    89.0      7.7    1,470 MiB  2,051 MiB
    trl   17.053    60.0      11.4   1,633 MiB  2,313 MiB
    ours/TRL: throughput x1.48 (by CPU time x1.49), peak memory delta x0.90

Needs `trl` (the `bench` extra: 1.16.0, which brings `datasets`). `--random-init-shape` models are shared with
grpo_step.py (same --model-cache default).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))
os.environ.setdefault("HF_HUB_OFFLINE", "1")

from grpo_step import SHAPES, PeakMemory, _result, _sync, model_flop_params, resolve_model, run_sides


# ------------------------------------------------------------------------------------------------------------ batch
def build_batch(model_dir: Path, data: Path, batch: int, max_len: int) -> dict[str, Any]:
    """The first `batch` kept examples, encoded with our exact label mask, cut to their last `max_len` tokens."""
    from transformers import AutoTokenizer

    from learning.sft.generate import kept_examples
    from learning.sft.train import IGNORE, encode

    tokenizer = AutoTokenizer.from_pretrained(str(model_dir))
    seqs: list[dict[str, list[int]]] = []
    for example in kept_examples(data):
        enc = encode(tokenizer, example)
        ids, labels = (enc.input_ids[-max_len:], enc.labels[-max_len:]) if max_len else (enc.input_ids, enc.labels)
        labels = [IGNORE, *labels[1:]]  # nothing predicts a cut sequence's first token: both losses count the same
        if any(x != IGNORE for x in labels):  # TRL drops a sequence with nothing to train; keep both sides equal
            seqs.append({"input_ids": ids, "labels": labels})
        if len(seqs) == batch:
            break
    if len(seqs) < batch:
        raise SystemExit(f"{data}: only {len(seqs)} usable kept examples, --batch is {batch}")
    return {"seqs": seqs, "tokens": sum(len(s["input_ids"]) for s in seqs),
            "trained_tokens": sum(sum(x != IGNORE for x in s["labels"]) for s in seqs)}


# ------------------------------------------------------------------------------------------------------ child: ours
def run_ours(spec: dict[str, Any]) -> dict[str, Any]:
    """Time our SFT step (train_sft's loop body) on a `load_trainable` LoRA model (runs in its own process)."""
    import torch
    from accelerate import Accelerator

    from learning.model import load_trainable, trainable_parameters
    from learning.sft.train import Encoded, sft_step

    cfg = _config(spec)
    torch.manual_seed(cfg.seed)
    model, _ = load_trainable(spec["model"], lora=cfg.lora, dtype=cfg.dtype,
                              gradient_checkpointing=cfg.gradient_checkpointing, seed=cfg.seed)
    accelerator = Accelerator(cpu=spec["device"] == "cpu")
    opt = torch.optim.AdamW(trainable_parameters(model), lr=cfg.learning_rate, weight_decay=cfg.weight_decay)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda _s: 1.0)  # constant, as TRL's side
    model, opt = accelerator.prepare(model, opt)
    batch = [Encoded(s["input_ids"], s["labels"]) for s in spec["batch"]["seqs"]]
    model.train()
    mem = PeakMemory(spec["device"])
    times, cpu_times, losses = [], [], []
    mem.start()
    for i in range(spec["warmup"] + spec["reps"]):
        _sync(spec["device"])
        t0, c0 = time.perf_counter(), time.process_time()
        loss, _norm = sft_step(model, opt, sched, batch, accelerator, cfg.max_grad_norm)
        _sync(spec["device"])
        if i >= spec["warmup"]:
            times.append(time.perf_counter() - t0)
            cpu_times.append(time.process_time() - c0)
        losses.append(loss)
    flop_params = model_flop_params(accelerator.unwrap_model(model))
    return _result(spec, times, cpu_times, mem, spec["batch"]["tokens"], losses, flop_params)


def _config(spec: dict[str, Any]) -> Any:
    """The preset with the command line's dtype / checkpointing overrides (both sides read their settings here)."""
    from learning.sft.train import preset

    return preset(spec["preset"], dtype=spec["dtype"], gradient_checkpointing=spec["gradient_checkpointing"])


# ------------------------------------------------------------------------------------------------------- child: TRL
def run_trl(spec: dict[str, Any]) -> dict[str, Any]:
    """Time TRL's SFTTrainer steps on the same pre-tokenised batch (runs in its own process)."""
    import torch
    from datasets import Dataset  # type: ignore[import-untyped]
    from peft import LoraConfig
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import SFTConfig, SFTTrainer

    from learning.sft.train import IGNORE

    cfg = _config(spec)
    device, seqs = spec["device"], spec["batch"]["seqs"]
    tokenizer = AutoTokenizer.from_pretrained(spec["model"])
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token  # as load_trainable does
    model = AutoModelForCausalLM.from_pretrained(spec["model"], dtype=getattr(torch, cfg.dtype))
    lora = cfg.lora
    peft_config = LoraConfig(r=lora.r, lora_alpha=lora.alpha, lora_dropout=lora.dropout,
                             target_modules=list(lora.targets), task_type="CAUSAL_LM")

    class StepTimer(TrainerCallback):
        """Wall and CPU time of each optimizer step, and the logged losses."""

        def __init__(self) -> None:
            self.times: list[float] = []
            self.cpu_times: list[float] = []
            self.losses: list[float] = []
            self.t0 = self.c0 = 0.0

        def on_step_begin(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
            _sync(device)
            self.t0, self.c0 = time.perf_counter(), time.process_time()

        def on_step_end(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
            _sync(device)
            self.times.append(time.perf_counter() - self.t0)
            self.cpu_times.append(time.process_time() - self.c0)

        def on_log(self, args: Any, state: Any, control: Any, logs: dict[str, Any] | None = None, **kw: Any) -> None:
            if logs and "loss" in logs:
                self.losses.append(float(logs["loss"]))

    micro = spec["micro_batch"]
    steps = spec["warmup"] + spec["reps"]
    dataset = Dataset.from_dict({"input_ids": [s["input_ids"] for s in seqs],
                                 "assistant_masks": [[int(x != IGNORE) for x in s["labels"]] for s in seqs]})
    with tempfile.TemporaryDirectory(prefix="sft-step-trl-") as out_dir:
        config = SFTConfig(
            output_dir=out_dir, per_device_train_batch_size=micro, gradient_accumulation_steps=len(seqs) // micro,
            max_steps=steps, learning_rate=cfg.learning_rate, lr_scheduler_type="constant", warmup_steps=0,
            weight_decay=cfg.weight_decay, optim="adamw_torch", max_grad_norm=cfg.max_grad_norm,
            max_length=None, packing=False, padding_free=False, shuffle_dataset=False,
            gradient_checkpointing=cfg.gradient_checkpointing, gradient_checkpointing_kwargs={"use_reentrant": False},
            use_cpu=device == "cpu", bf16=False, fp16=False, report_to=[], logging_steps=1, save_strategy="no",
            disable_tqdm=True, seed=cfg.seed, dataloader_num_workers=0,
        )
        timer = StepTimer()
        trainer = SFTTrainer(model=model, args=config, train_dataset=dataset, processing_class=tokenizer,
                             peft_config=peft_config, callbacks=[timer])
        prepared = sorted(map(list, trainer.train_dataset["labels"]))
        if prepared != sorted(s["labels"] for s in seqs):
            raise RuntimeError("TRL's prepared labels differ from ours: the two sides would train different tokens")
        mem = PeakMemory(device)
        mem.start()
        trainer.train()
        flop_params = model_flop_params(trainer.model)
    if len(timer.times) != steps:
        raise RuntimeError(f"TRL ran {len(timer.times)} steps, expected {steps}")
    warm = spec["warmup"]
    return _result(spec, timer.times[warm:], timer.cpu_times[warm:], mem, spec["batch"]["tokens"], timer.losses,
                   flop_params)


# ----------------------------------------------------------------------------------------------------------- parent
def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    """Command-line options (see the module docstring)."""
    from learning.sft.train import PRESETS

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--model", help="model folder (default: the converted SmolLM2)")
    p.add_argument("--random-init-shape", choices=sorted(SHAPES), help="randomly initialised model of this shape")
    p.add_argument("--tokenizer", help="tokenizer folder for --random-init-shape (default: SmolLM2's)")
    p.add_argument("--model-cache", default=str(Path(tempfile.gettempdir()) / "grpo_step_models"),
                   help="where random-init models are saved (once; shared with grpo_step.py)")
    p.add_argument("--data", default=str(ROOT / ".cache" / "sft" / "data"), help="SFT data folder (trajectories)")
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    p.add_argument("--preset", choices=sorted(PRESETS), help="SFT preset (default: cpu on cpu, gpu-8b on cuda)")
    p.add_argument("--dtype", help="weights dtype (default: the preset's)")
    p.add_argument("--gradient-checkpointing", action=argparse.BooleanOptionalAction,
                   help="activation checkpointing (default: the preset's)")
    p.add_argument("--batch", type=int, default=4, help="sequences in the optimizer step")
    p.add_argument("--micro-batch", type=int, default=1, help="TRL's sequences per forward (ours always runs 1)")
    p.add_argument("--max-len", type=int, default=1024, help="keep each sequence's last N tokens (0: whole)")
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--threads", type=int, help="torch threads per side (default: all cores)")
    p.add_argument("--sides", default="ours,trl", help="comma-separated: ours, trl")
    p.add_argument("--peak-tflops", type=float, default=989.0, help="peak dense bf16 TFLOP/s for MFU (H100 SXM)")
    p.add_argument("--out", help="write the JSON result here")
    p.add_argument("--child", choices=("ours", "trl"), help=argparse.SUPPRESS)
    p.add_argument("--spec", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child:
        return args
    if args.batch % args.micro_batch:
        p.error("--micro-batch must divide --batch")
    args.preset = args.preset or ("gpu-8b" if args.device == "cuda" else "cpu")
    defaults = PRESETS[args.preset]
    args.dtype = args.dtype or defaults.dtype
    if args.gradient_checkpointing is None:
        args.gradient_checkpointing = defaults.gradient_checkpointing
    return args


def main(argv: Sequence[str] | None = None) -> int:
    """Run both sides (or one side, as a child) and print the table."""
    args = parse_args(argv)
    if args.child:
        import torch

        spec = json.loads(Path(args.spec).read_text())
        torch.set_num_threads(spec["threads"])
        result = run_ours(spec) if args.child == "ours" else run_trl(spec)
        print("RESULT " + json.dumps(result), flush=True)
        return 0

    model_dir = resolve_model(args)
    batch = build_batch(model_dir, Path(args.data), args.batch, args.max_len)
    threads = args.threads or os.cpu_count() or 1
    spec = {
        "model": str(model_dir), "device": args.device, "preset": args.preset, "dtype": args.dtype,
        "gradient_checkpointing": args.gradient_checkpointing, "micro_batch": args.micro_batch,
        "warmup": args.warmup, "reps": args.reps, "threads": threads, "peak_tflops": args.peak_tflops, "batch": batch,
    }
    config = {k: v for k, v in spec.items() if k != "batch"} | {
        "batch": args.batch, "max_len": args.max_len, "data": args.data, "tokens": batch["tokens"],
        "trained_tokens": batch["trained_tokens"], "random_init_shape": args.random_init_shape,
    }
    return run_sides(__file__, args.sides, spec, config, args.out)

if __name__ == "__main__":
    raise SystemExit(main())
