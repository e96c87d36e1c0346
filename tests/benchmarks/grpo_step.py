"""Benchmark (not a test): training tokens/s and peak memory of one SS-GRPO policy update versus one TRL
`GRPOTrainer` update, on the same model, LoRA settings and batch, in one run (issue 5).

What is compared. One fixed batch is built once (seeded) and written to a JSON file that both sides read: B/G prompts,
G completions each (token ids), one reward per completion and the group-normalised advantage TRL derives from it
((r - mean) / (sample std + 1e-4), broadcast to every completion token on our side, so both losses see the same
numbers). Each side runs in its own subprocess (so its peak memory is its own) with the same thread count, does
`--warmup` updates, then `--reps` timed updates; the median is reported, with the process's CPU seconds per
update (steadier than wall time on a shared machine).

* ours: `learning.update.policy_update(model, optimizer, seqs, ...)` on a `learning.model.load_trainable` PEFT LoRA
  model with `torch.optim.AdamW`. Timed: the whole call, which is collate, a no-grad forward for the old
  log-probs, a no-grad forward with the adapter disabled for the reference log-probs (beta > 0), the forward +
  backward of the PPO-clip + beta*KL3 token-level-mean loss (METHOD D5), gradient clipping, the optimizer step and
  the sampler-log-prob gap metric. On CUDA the default torch device is set to cuda first: `collate` builds the
  batch on the default device and `policy_update` does not move it to the model's.
* TRL: `GRPOTrainer.train()` for warmup + reps steps, with generation replaced through TRL's public `rollout_func`
  argument (it returns the fixed prompt/completion ids; no model call) and a reward function that looks the fixed
  reward up. Timed per step by a `TrainerCallback`, from `on_step_begin` to `on_step_end`: TRL's
  `_generate_and_score_completions` (the rollout lookup, decoding, rewards, advantages and the no-grad reference
  forward with the adapter disabled), `training_step` (forward + backward of the loss), gradient clipping, the
  optimizer step and the scheduler step. TRL's config: loss_type "dapo" (token-level mean over the update's
  tokens, the same normalisation as ours), beta and epsilon as ours, num_iterations = 1, so TRL takes
  old_per_token_logps = per_token_logps.detach() and runs no separate old-log-prob forward (ours always does one),
  the same LoRA r/alpha/dropout/targets through `peft_config`, the same gradient checkpointing (non-reentrant), AdamW
  (weight decay 0, constant lr), max_grad_norm 1, no autocast (bf16=False: both sides train in the weights' dtype),
  and, on CPU, use_cpu=True, report_to=[].

Both sides process the same non-padding tokens (prompt + completion), the throughput unit. Peak memory: on CPU the
peak resident set (VmHWM, reset through /proc/self/clear_refs before the first update) minus the resident set right
before the first update, so it holds the optimizer state and activations but not the weights; on CUDA
torch.cuda.max_memory_allocated minus memory_allocated before the first update. On CUDA MFU is also reported:
6 * N * tokens / seconds / peak FLOP/s, N = the base model's parameters without the input embedding (the usual
convention; the update actually runs more passes than 6N: reference and old-log-prob forwards and checkpoint
recomputation).

    .venv/bin/python tests/benchmarks/grpo_step.py --batch 4 --prompt-len 128 --completion-len 128 --reps 3
    .venv/bin/python tests/benchmarks/grpo_step.py --device cuda --random-init-shape qwen3-8b --batch 8 \
        --prompt-len 512 --completion-len 512 --out grpo_step_h100.json

Needs `trl` (1.16.0 was used; it brings `datasets`) in the environment. For --random-init-shape the weights are
written once under --model-cache (16 GB for qwen3-8b in bf16); --tokenizer names any small tokenizer folder.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import re
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")  # rollout_func is "experimental" in TRL 1.x

def _qwen3(hidden: int, intermediate: int, layers: int, heads: int, kv_heads: int, head_dim: int,
           tied: bool) -> dict[str, Any]:
    return {"hidden_size": hidden, "intermediate_size": intermediate, "num_hidden_layers": layers,
            "num_attention_heads": heads, "num_key_value_heads": kv_heads, "head_dim": head_dim,
            "tie_word_embeddings": tied}


# Model shapes for randomly initialised models (no hub access): Qwen3 family sizes from their published configs.
SHAPES: dict[str, dict[str, Any]] = {
    "qwen3-8b": _qwen3(4096, 12288, 36, 32, 8, 128, tied=False),
    "qwen3-4b": _qwen3(2560, 9728, 36, 32, 8, 128, tied=True),
    "qwen3-1.7b": _qwen3(2048, 6144, 28, 16, 8, 128, tied=True),
    "qwen3-0.6b": _qwen3(1024, 3072, 28, 16, 8, 128, tied=True),
    "qwen3-tiny": _qwen3(128, 384, 2, 4, 2, 32, tied=True),  # a few MB: exercises the random-init path on a CPU
}
FIRST_ID = 100  # random token ids start above the special tokens


# ----------------------------------------------------------------------------------------------------------- memory
def status_kib(field: str) -> int:
    text = Path("/proc/self/status").read_text()
    match = re.search(rf"^{field}:\s+(\d+)\s+kB", text, re.MULTILINE)
    return int(match.group(1)) if match else 0


class PeakMemory:
    """Peak memory of a region: CUDA allocator peak, or the process's peak resident set on Linux."""

    def __init__(self, device: str) -> None:
        self.device = device
        self.method = "cuda.max_memory_allocated" if device == "cuda" else "VmHWM"
        self.baseline = 0

    def start(self) -> None:
        """Record the baseline and reset the peak counter."""
        import torch

        if self.device == "cuda":
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            self.baseline = torch.cuda.memory_allocated()
            return
        try:  # "5" resets the peak RSS (VmHWM) of this process (Linux >= 4.0)
            Path("/proc/self/clear_refs").write_text("5")
        except OSError:
            self.method = "ru_maxrss (process lifetime peak: the delta is a lower bound)"
        self.baseline = status_kib("VmRSS") * 1024

    def peak(self) -> int:
        """Peak bytes since start()."""
        import torch

        if self.device == "cuda":
            torch.cuda.synchronize()
            return int(torch.cuda.max_memory_allocated())
        if self.method == "VmHWM":
            return status_kib("VmHWM") * 1024
        import resource

        return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024


def _sync(device: str) -> None:
    if device == "cuda":
        import torch

        torch.cuda.synchronize()


# ------------------------------------------------------------------------------------------------------------ batch
def build_batch(*, batch: int, group: int, prompt_len: int, completion_len: int, vocab: int, ragged: bool,
                seed: int) -> dict[str, Any]:
    """The fixed batch both sides train on: groups of `group` completions sharing a prompt.

    With `ragged`, each group's prompt length is uniform in [P/2, P] and each completion's in [C/2, C]; otherwise
    every sequence is exactly P + C tokens (no padding on either side).
    """
    rng = random.Random(seed)
    groups: list[dict[str, Any]] = []
    for _ in range(batch // group):
        p = rng.randint(max(1, prompt_len // 2), prompt_len) if ragged else prompt_len
        prompt = [rng.randrange(FIRST_ID, vocab) for _ in range(p)]
        completions: list[list[int]] = []
        rewards: list[float] = []
        logprobs: list[list[float]] = []
        for _ in range(group):
            c = rng.randint(max(1, completion_len // 2), completion_len) if ragged else completion_len
            completions.append([rng.randrange(FIRST_ID, vocab) for _ in range(c)])
            rewards.append(round(rng.random(), 4))
            logprobs.append([round(-3.0 * rng.random(), 4) for _ in range(c)])  # what a sampler would report
        groups.append({"prompt_ids": prompt, "completions": completions, "rewards": rewards,
                       "advantages": _trl_advantages(rewards), "sampler_logprobs": logprobs})
    completion_tokens = sum(len(ids) for g in groups for ids in g["completions"])
    return {"groups": groups, "tokens": completion_tokens + sum(len(g["prompt_ids"]) * group for g in groups),
            "completion_tokens": completion_tokens}


def _trl_advantages(rewards: Sequence[float]) -> list[float]:
    """TRL's default group advantage: (r - mean) / (sample std + 1e-4) (scale_rewards="group")."""
    mean = statistics.fmean(rewards)
    std = statistics.stdev(rewards) if len(rewards) > 1 else 0.0
    return [(r - mean) / (std + 1e-4) for r in rewards]


# ------------------------------------------------------------------------------------------------------------ model
def resolve_model(args: argparse.Namespace) -> Path:
    """The model folder: --model, a random-init model of --random-init-shape (saved once), or converted SmolLM2."""
    if args.random_init_shape:
        tokenizer = Path(args.tokenizer) if args.tokenizer else _smollm2_dir()
        return _random_init_model(args.random_init_shape, Path(args.model_cache), args.dtype, args.device, tokenizer)
    if args.model:
        return Path(args.model)
    return _smollm2_dir()


def _smollm2_dir() -> Path:
    """The converted SmolLM2 folder (converted from the bundled GGUF on first use)."""
    converted = ROOT / ".cache" / "models" / "smollm2-135m-instruct"
    if (converted / "tokenizer.json").is_file() and (converted / "model.safetensors").is_file():
        return converted
    from learning.engines.weights import ensure_converted

    return ensure_converted(ROOT / ".cache" / "models")


def _random_init_model(shape: str, cache: Path, dtype: str, device: str, tokenizer_dir: Path) -> Path:
    """Build a randomly initialised Qwen3 model of `shape` from a config in code and save it with a tokenizer.

    `load_trainable` takes a folder, so the random model is written once (to `cache/shape-dtype`) and reused. The
    tokenizer is any small one (SmolLM2's by default): only its pad/eos ids and decoding are used, and the random
    token ids stay below its vocabulary.
    """
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, Qwen3Config

    out = cache / f"{shape}-{dtype}"
    if (out / "benchmark-complete").is_file():
        return out
    tok = AutoTokenizer.from_pretrained(str(tokenizer_dir))
    config = Qwen3Config(vocab_size=151936, max_position_embeddings=40960, rms_norm_eps=1e-6,
                         rope_parameters={"rope_type": "default", "rope_theta": 1_000_000.0},
                         bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id,
                         pad_token_id=tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id,
                         **SHAPES[shape])
    started = time.perf_counter()
    # Initialise on the GPU when there is one: an 8B random init on a CPU takes minutes.
    with torch.device("cuda" if device == "cuda" else "cpu"):
        model = AutoModelForCausalLM.from_config(config, dtype=getattr(torch, dtype))
    tmp = out.with_name(out.name + f".tmp-{os.getpid()}")
    model.save_pretrained(str(tmp))
    tok.save_pretrained(str(tmp))
    del model
    if device == "cuda":
        torch.cuda.empty_cache()  # the children need the whole GPU
    (tmp / "benchmark-complete").write_text(shape)
    tmp.rename(out)
    print(f"random-init {shape} ({dtype}) saved to {out} in {time.perf_counter() - started:.0f} s", flush=True)
    return out


def model_flop_params(model: Any) -> int:
    """Parameters that do matmul work per token: all base parameters but the input embedding table (LoRA excluded).

    A tied LM head shares the table; it is counted once, as the LM head.
    """
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    total = sum(p.numel() for n, p in base.named_parameters() if "lora_" not in n)
    emb = base.get_input_embeddings().weight
    head = base.get_output_embeddings()
    tied = head is not None and head.weight is emb
    return total if tied else total - emb.numel()


# ------------------------------------------------------------------------------------------------------ child: ours
def run_ours(spec: dict[str, Any]) -> dict[str, Any]:
    """Time `policy_update` on a `load_trainable` LoRA model (runs in its own process)."""
    import torch

    from learning.model import LoraSettings, load_trainable, trainable_parameters
    from learning.sequences import TrainSequence
    from learning.update import policy_update

    device, batch = spec["device"], spec["batch"]
    lora = LoraSettings(r=spec["lora_r"], alpha=spec["lora_alpha"], dropout=0.0, targets=tuple(spec["targets"]))
    model, tokenizer = load_trainable(spec["model"], lora=lora, dtype=spec["dtype"],
                                      gradient_checkpointing=spec["gradient_checkpointing"])
    model.to(device)
    if device == "cuda":
        # policy_update's collate() builds its tensors with the default device and does not move them to the
        # model's device; making CUDA the default device is the only way to run it on a GPU unchanged.
        torch.set_default_device("cuda")
    optimizer = torch.optim.AdamW(trainable_parameters(model), lr=spec["lr"], weight_decay=0.0)
    seqs = []
    for g in batch["groups"]:
        for ids, adv, lps in zip(g["completions"], g["advantages"], g["sampler_logprobs"], strict=True):
            n = len(ids)
            # Four stages in equal spans, as a trajectory would have; the advantage is the same on each, so the
            # loss sees exactly TRL's numbers (the update's cost does not depend on the values).
            stages = tuple(min(3, 4 * t // n) for t in range(n))
            seqs.append(TrainSequence(tuple(g["prompt_ids"]), tuple(ids), (1,) * n, stages, (adv,) * n,
                                      tuple(lps) if spec["sampler_logprobs"] else ()))
    widest = max(len(s.prompt_ids) + len(s.response_ids) for s in seqs)
    token_budget = spec["micro_batch"] * widest  # micro-batches of `micro_batch` sequences, like TRL's
    mem = PeakMemory(device)
    times, cpu_times, losses, tokens = [], [], [], []
    mem.start()
    for i in range(spec["warmup"] + spec["reps"]):
        _sync(device)
        t0, c0 = time.perf_counter(), time.process_time()
        stats = policy_update(model, optimizer, seqs, pad_id=int(tokenizer.pad_token_id), clip=spec["clip"],
                              beta=spec["beta"], token_budget=token_budget, max_grad_norm=1.0)
        _sync(device)
        dt, dc = time.perf_counter() - t0, time.process_time() - c0
        if stats.skipped:
            raise RuntimeError(f"policy_update skipped the step: {stats.skipped}")
        if i >= spec["warmup"]:
            times.append(dt)
            cpu_times.append(dc)
        losses.append(stats.loss)
        tokens.append(stats.tokens)
    return _result(spec, times, cpu_times, mem, tokens[-1], losses, model_flop_params(model))


# ------------------------------------------------------------------------------------------------------- child: TRL
def run_trl(spec: dict[str, Any]) -> dict[str, Any]:
    """Time TRL's GRPOTrainer steps with generation replaced by the fixed batch (runs in its own process)."""
    import torch
    from datasets import Dataset  # type: ignore[import-untyped]
    from peft import LoraConfig
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    device, batch = spec["device"], spec["batch"]
    groups = batch["groups"]
    group_size = len(groups[0]["completions"])
    tokenizer = AutoTokenizer.from_pretrained(spec["model"])
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token  # as load_trainable does
    model = AutoModelForCausalLM.from_pretrained(spec["model"], dtype=getattr(torch, spec["dtype"]))
    peft_config = LoraConfig(r=spec["lora_r"], lora_alpha=spec["lora_alpha"], lora_dropout=0.0,
                             target_modules=list(spec["targets"]), task_type="CAUSAL_LM")
    rewards = {tuple(ids): r for g in groups for ids, r in zip(g["completions"], g["rewards"], strict=True)}

    def rollout(prompts: list[str], trainer: Any) -> dict[str, Any]:
        # The sampler hands each prompt of the step group_size times; return that group's fixed completions.
        seen: dict[str, int] = {}
        prompt_ids, completion_ids, logprobs = [], [], []
        for p in prompts:
            g, k = groups[int(p.split("-")[1])], seen.get(p, 0)
            seen[p] = k + 1
            prompt_ids.append(list(g["prompt_ids"]))
            completion_ids.append(list(g["completions"][k]))
            logprobs.append(list(g["sampler_logprobs"][k]))
        return {"prompt_ids": prompt_ids, "completion_ids": completion_ids,
                "logprobs": logprobs if spec["sampler_logprobs"] else None}

    def fixed_reward(prompts: list[Any], completions: list[Any], completion_ids: list[list[int]],
                     **kwargs: Any) -> list[float | None]:
        return [rewards[tuple(ids)] for ids in completion_ids]

    class StepTimer(TrainerCallback):
        """Wall time of each optimizer step (generation-and-scoring included) and the logged losses."""

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
    with tempfile.TemporaryDirectory(prefix="grpo-step-trl-") as out_dir:
        config = GRPOConfig(
            output_dir=out_dir, per_device_train_batch_size=micro,
            gradient_accumulation_steps=len(groups) * group_size // micro, num_generations=group_size,
            max_steps=steps, learning_rate=spec["lr"], lr_scheduler_type="constant", warmup_steps=0,
            weight_decay=0.0, optim="adamw_torch", max_grad_norm=1.0, beta=spec["beta"], epsilon=spec["clip"],
            loss_type="dapo", scale_rewards="group", num_iterations=1, temperature=1.0,
            gradient_checkpointing=spec["gradient_checkpointing"],
            gradient_checkpointing_kwargs={"use_reentrant": False}, use_cpu=device == "cpu", bf16=False,
            fp16=False, report_to=[], logging_steps=1, save_strategy="no", disable_tqdm=True, seed=0,
            dataloader_num_workers=0, log_completions=False,
        )
        dataset = Dataset.from_dict({"prompt": [f"group-{i}" for i in range(len(groups))]})
        timer = StepTimer()
        trainer = GRPOTrainer(model=model, reward_funcs=fixed_reward, args=config, train_dataset=dataset,
                              processing_class=tokenizer, peft_config=peft_config, rollout_func=rollout,
                              callbacks=[timer])
        mem = PeakMemory(device)
        mem.start()
        trainer.train()
        flop_params = model_flop_params(trainer.model)
    if len(timer.times) != steps:
        raise RuntimeError(f"TRL ran {len(timer.times)} steps, expected {steps}")
    warm = spec["warmup"]
    return _result(spec, timer.times[warm:], timer.cpu_times[warm:], mem, batch["tokens"], timer.losses,
                   flop_params)


def _result(spec: dict[str, Any], times: list[float], cpu_times: list[float], mem: PeakMemory, tokens: int,
            losses: list[float], flop_params: int) -> dict[str, Any]:
    peak = mem.peak()
    median = statistics.median(times)
    out: dict[str, Any] = {
        "seconds": [round(t, 4) for t in times], "median_s": round(median, 4), "tokens": tokens,
        # CPU seconds of the whole process (all threads): steadier than wall time on a shared machine
        "cpu_seconds": [round(t, 3) for t in cpu_times], "median_cpu_s": round(statistics.median(cpu_times), 3),
        "tokens_per_s": round(tokens / median, 2), "peak_bytes": peak, "baseline_bytes": mem.baseline,
        "peak_delta_bytes": peak - mem.baseline, "memory_method": mem.method, "losses": losses,
        "flop_params": flop_params,
    }
    if spec["device"] == "cuda":
        out["mfu"] = round(6 * flop_params * tokens / median / (spec["peak_tflops"] * 1e12), 4)
    return out


# ----------------------------------------------------------------------------------------------------------- parent
def _child(script: str, side: str, spec_path: Path, threads: int) -> dict[str, Any]:
    env = dict(os.environ, OMP_NUM_THREADS=str(threads), MKL_NUM_THREADS=str(threads), PYTHONUNBUFFERED="1")
    proc = subprocess.run([sys.executable, script, "--child", side, "--spec", str(spec_path)], env=env,
                          capture_output=True, text=True, check=False)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
    if proc.returncode != 0 or not lines:
        sys.stderr.write(proc.stdout[-4000:] + proc.stderr[-8000:])
        raise SystemExit(f"the {side} side failed (exit {proc.returncode})")
    return json.loads(lines[-1][len("RESULT "):])


def run_sides(script: str, sides: str, spec: dict[str, Any], config: dict[str, Any], out: str | None) -> int:
    """Run each side of `script` in its own child process, one at a time (never two heavy jobs at once), print the
    table and the ours/TRL ratios, write them to `out` if given; exit status 0 when every side's figure is finite.
    Shared by grpo_step.py and sft_step.py."""
    print(json.dumps(config), flush=True)
    results: dict[str, dict[str, Any]] = {}
    with tempfile.TemporaryDirectory(prefix=Path(script).stem + "-") as tmp:
        spec_path = Path(tmp) / "spec.json"
        spec_path.write_text(json.dumps(spec))
        for side in [s.strip() for s in sides.split(",") if s.strip()]:
            results[side] = _child(script, side, spec_path, spec["threads"])
            print(f"{side}: {json.dumps(results[side])}", flush=True)
    print(report(results, spec))
    saved: dict[str, Any] = {"config": config, "results": results}
    if "ours" in results and "trl" in results:
        o, t = results["ours"], results["trl"]
        saved["ours_over_trl"] = {"tokens_per_s": round(o["tokens_per_s"] / t["tokens_per_s"], 3),
                                  "tokens_per_cpu_s": round(t["median_cpu_s"] / max(o["median_cpu_s"], 1e-9), 3),
                                  "peak_delta_bytes": round(o["peak_delta_bytes"] / max(t["peak_delta_bytes"], 1), 3),
                                  "peak_bytes": round(o["peak_bytes"] / max(t["peak_bytes"], 1), 3)}
    if out:
        Path(out).write_text(json.dumps(saved, indent=2))
    return 0 if all(math.isfinite(r["tokens_per_s"]) for r in results.values()) else 1


def _mib(n: int) -> str:
    return f"{n / 2**20:,.0f} MiB"


def report(results: dict[str, dict[str, Any]], spec: dict[str, Any]) -> str:
    """A plain-text table of both sides and the ours/TRL ratios."""
    rows = [("side", "median s", "tokens/s", "CPU s", "peak Δ", "peak total",
             "MFU" if spec["device"] == "cuda" else "")]
    for side, r in results.items():
        rows.append((side, f"{r['median_s']:.3f}", f"{r['tokens_per_s']:,.1f}", f"{r['median_cpu_s']:.1f}",
                     _mib(r["peak_delta_bytes"]),
                     _mib(r["peak_bytes"]), f"{r['mfu']:.1%}" if "mfu" in r else ""))
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip() for row in rows]
    if "ours" in results and "trl" in results:
        o, t = results["ours"], results["trl"]
        lines.append(f"ours/TRL: throughput x{o['tokens_per_s'] / t['tokens_per_s']:.2f} "
                     f"(by CPU time x{t['median_cpu_s'] / max(o['median_cpu_s'], 1e-9):.2f}), "
                     f"peak memory delta x{o['peak_delta_bytes'] / max(t['peak_delta_bytes'], 1):.2f}")
    return "\n".join(lines)


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    """Command-line options (see the module docstring)."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--model", help="model folder (default: the converted SmolLM2)")
    p.add_argument("--random-init-shape", choices=sorted(SHAPES), help="randomly initialised model of this shape")
    p.add_argument("--tokenizer", help="tokenizer folder for --random-init-shape (default: SmolLM2's)")
    p.add_argument("--model-cache", default=str(Path(tempfile.gettempdir()) / "grpo_step_models"),
                   help="where random-init models are saved (once)")
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    p.add_argument("--dtype", help="weights dtype (default float32 on cpu, bfloat16 on cuda)")
    p.add_argument("--batch", type=int, default=4, help="sequences in the update (B)")
    p.add_argument("--group", type=int, default=4, help="completions per prompt (G, divides B)")
    p.add_argument("--micro-batch", type=int, help="sequences per forward/backward (default: B)")
    p.add_argument("--prompt-len", type=int, default=128)
    p.add_argument("--completion-len", type=int, default=128)
    p.add_argument("--ragged", action="store_true", help="vary prompt/completion lengths (padding on both sides)")
    p.add_argument("--lora-r", type=int, default=16)
    p.add_argument("--lora-alpha", type=int, help="default 2 * r")
    p.add_argument("--beta", type=float, default=0.001)
    p.add_argument("--clip", type=float, default=0.2)
    p.add_argument("--lr", type=float, default=2e-4)
    p.add_argument("--no-gradient-checkpointing", action="store_true")
    p.add_argument("--no-sampler-logprobs", action="store_true",
                   help="do not hand sampler log-probs to the update (ours then skips the sampler-gap metric)")
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--threads", type=int, help="torch threads per side (default: all cores)")
    p.add_argument("--sides", default="ours,trl", help="comma-separated: ours, trl")
    p.add_argument("--peak-tflops", type=float, default=989.0, help="peak dense bf16 TFLOP/s for MFU (H100 SXM)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", help="write the JSON result here")
    p.add_argument("--child", choices=("ours", "trl"), help=argparse.SUPPRESS)
    p.add_argument("--spec", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child:
        return args
    if args.batch % args.group:
        p.error("--group must divide --batch")
    args.micro_batch = args.micro_batch or args.batch
    if args.batch % args.micro_batch:
        p.error("--micro-batch must divide --batch")
    args.lora_alpha = args.lora_alpha or 2 * args.lora_r
    args.dtype = args.dtype or ("bfloat16" if args.device == "cuda" else "float32")
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

    from transformers import AutoConfig, AutoTokenizer

    from learning.model import DEFAULT_TARGETS

    model_dir = resolve_model(args)
    vocab = min(AutoConfig.from_pretrained(str(model_dir)).vocab_size,
                len(AutoTokenizer.from_pretrained(str(model_dir))))
    batch = build_batch(batch=args.batch, group=args.group, prompt_len=args.prompt_len,
                        completion_len=args.completion_len, vocab=vocab, ragged=args.ragged, seed=args.seed)
    threads = args.threads or os.cpu_count() or 1
    spec = {
        "model": str(model_dir), "device": args.device, "dtype": args.dtype, "lora_r": args.lora_r,
        "lora_alpha": args.lora_alpha, "targets": list(DEFAULT_TARGETS), "beta": args.beta, "clip": args.clip,
        "lr": args.lr, "gradient_checkpointing": not args.no_gradient_checkpointing, "micro_batch": args.micro_batch,
        "sampler_logprobs": not args.no_sampler_logprobs, "warmup": args.warmup, "reps": args.reps,
        "threads": threads, "peak_tflops": args.peak_tflops, "batch": batch,
    }
    config = {k: v for k, v in spec.items() if k != "batch"} | {
        "batch": args.batch, "group": args.group, "prompt_len": args.prompt_len,
        "completion_len": args.completion_len, "ragged": args.ragged, "tokens": batch["tokens"],
        "completion_tokens": batch["completion_tokens"], "random_init_shape": args.random_init_shape,
    }
    return run_sides(__file__, args.sides, spec, config, args.out)

if __name__ == "__main__":
    raise SystemExit(main())
