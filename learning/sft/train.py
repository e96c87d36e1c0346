"""`rubricem sft train`: supervised fine-tuning on teacher trajectories, loss only on model-written tokens.

Masking (METHOD §10.5, D6): the training sequence is the student's chat template applied to the three messages. The
label mask is computed from the character offsets of the tokens of that exact sequence: a token is trained only when
all of its characters lie inside the assistant message (plus the end-of-turn marker that closes it) and outside
every `<tool_output>` span. System and user tokens, tool outputs, and a token that straddles a boundary get no
gradient. Pieces are never tokenised separately.

The loss is a token-level mean over every trained token of an optimizer step (DAPO-style, as in `learning.loss`).
Data order is a seeded permutation per epoch, so step `s` always sees the same sequences; a checkpoint holds the
trainable weights, optimizer, scheduler and step, and a resumed run takes exactly the step an uninterrupted one would.
Presets: `gpu-8b` is METHOD §10.6 (5 epochs, lr 4e-5 cosine with 10% warm-up, effective batch 16 per device, 16,384
tokens, bf16, weight decay 0); `cpu` finishes on 2 cores in about an hour for the bundled questions (a higher LoRA
learning rate, as usual for small LoRA runs, and 2 epochs).
"""

from __future__ import annotations

import hashlib
import json
import math
import random
import shutil
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import torch

from learning.head_loss import linear_cross_entropy, split_head
from learning.memory import release_freed_memory
from learning.model import LoraSettings, load_trainable, save_adapter, trainable_parameters
from learning.sft.trajectory import example_spans

IGNORE = -100
CHECKPOINTS = "checkpoints"
METRICS = "metrics.jsonl"


class SFTError(ValueError):
    """Bad SFT data or settings (the message says which example or field)."""


@dataclass(frozen=True, slots=True)
class SFTConfig:
    """SFT hyper-parameters (see the module docstring for the presets)."""

    preset: str = "cpu"
    epochs: float = 2.0
    learning_rate: float = 2e-4
    warmup_ratio: float = 0.1
    grad_accum: int = 8
    max_seq: int = 8192
    dtype: str = "bfloat16"
    weight_decay: float = 0.0
    max_grad_norm: float = 1.0
    lora: LoraSettings | None = field(default_factory=LoraSettings)
    seed: int = 0
    save_every: int = 10
    keep_checkpoints: int = 2
    gradient_checkpointing: bool = True


PRESETS: dict[str, SFTConfig] = {
    # 2 cores: no activation checkpointing (a 5.5k-token sequence needs about 11 GB resident), and half an epoch over
    # two wordings per question (one trajectory a question on average) at a higher LoRA rate: about an hour.
    "cpu": SFTConfig(epochs=0.5, learning_rate=4e-4, grad_accum=4, gradient_checkpointing=False),
    "gpu-8b": SFTConfig(preset="gpu-8b", epochs=5.0, learning_rate=4e-5, grad_accum=16, max_seq=16384,
                        lora=LoraSettings(r=64, alpha=128), save_every=50),
    "tiny": SFTConfig(preset="tiny", epochs=1.0, learning_rate=1e-3, grad_accum=1, save_every=1),  # tests
}


def preset(name: str, **overrides: Any) -> SFTConfig:
    """A preset with overrides (None values are ignored)."""
    if name not in PRESETS:
        raise SFTError(f"unknown SFT preset {name!r}; known: {', '.join(PRESETS)}")
    return replace(PRESETS[name], **{k: v for k, v in overrides.items() if v is not None})


# -- the exact label mask ----------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Encoded:
    """One tokenised training sequence."""

    input_ids: list[int]
    labels: list[int]  # IGNORE where no gradient

    @property
    def trained(self) -> int:
        """Number of trained label positions."""
        return sum(1 for x in self.labels if x != IGNORE)


def trainable_ranges(tokenizer: Any, example: Mapping[str, Any]) -> tuple[str, list[tuple[int, int]]]:
    """(the full training text, the [start, end) character ranges whose tokens are trained)."""
    messages = example["messages"]
    if [m.get("role") for m in messages] != ["system", "user", "assistant"]:
        raise SFTError(f"example {example.get('id')!r}: expected system, user and assistant messages")
    spans = example_spans(example)
    text = tokenizer.apply_chat_template(messages, tokenize=False)
    prefix = tokenizer.apply_chat_template(messages[:2], tokenize=False, add_generation_prompt=True)
    content = messages[2]["content"]
    start = len(prefix)
    if not text.startswith(prefix) or text[start : start + len(content)] != content:
        raise SFTError("the chat template does not place the assistant message verbatim after the prompt")
    end = start + len(content)
    eos = tokenizer.eos_token or ""
    if eos and text.startswith(eos, end):
        end += len(eos)  # the end-of-turn marker the model must learn to write
    ranges, pos = [], start
    for a, b in spans:
        if a + start > pos:
            ranges.append((pos, a + start))
        pos = b + start
    ranges.append((pos, end))
    return text, [(a, b) for a, b in ranges if b > a]


def encode(tokenizer: Any, example: Mapping[str, Any]) -> Encoded:
    """Tokenise the exact training text once and mask every token not wholly inside a trained range."""
    text, ranges = trainable_ranges(tokenizer, example)
    enc = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
    ids, offsets = list(enc["input_ids"]), enc["offset_mapping"]
    labels = []
    r = 0
    for tok, (a, b) in zip(ids, offsets, strict=True):
        while r < len(ranges) and ranges[r][1] <= a:
            r += 1
        inside = r < len(ranges) and b > a and ranges[r][0] <= a and b <= ranges[r][1]
        labels.append(tok if inside else IGNORE)
    return Encoded(ids, labels)


def data_sha(examples: Sequence[Mapping[str, Any]]) -> str:
    """A short hash of the training conversations (recorded in the adapter's provenance)."""
    h = hashlib.sha256()
    for ex in examples:
        h.update(json.dumps(ex["messages"], sort_keys=True).encode())
        h.update(json.dumps(ex.get("tool_spans", [])).encode())
    return h.hexdigest()[:16]


# -- training ----------------------------------------------------------------------------------------------------------


def schedule(step: int, total: int, warmup_ratio: float) -> float:
    """Linear warm-up then cosine decay to 0: the learning-rate multiplier at optimizer step `step` (from 0)."""
    warm = max(1, math.ceil(total * warmup_ratio)) if warmup_ratio > 0 else 0
    if step < warm:
        return (step + 1) / warm
    progress = (step - warm) / max(1, total - warm)
    return 0.5 * (1.0 + math.cos(math.pi * min(1.0, progress)))


def order(n: int, epochs: float, seed: int) -> list[int]:
    """The example index of every sequence position: one seeded permutation per (started) epoch."""
    out: list[int] = []
    for e in range(math.ceil(epochs)):
        perm = list(range(n))
        random.Random(seed * 1_000_003 + e).shuffle(perm)
        out.extend(perm)
    return out[: max(1, round(n * epochs))]


@dataclass
class SFTResult:
    """What a training run produced."""

    adapter: Path
    steps: int
    metrics: list[dict[str, Any]]
    meta: dict[str, Any]
    model: Any = None  # the trained model (PEFT-wrapped for LoRA), for callers that keep using it


def _sequence_loss(model: Any, enc: Encoded, device: torch.device) -> tuple[torch.Tensor, int]:
    """Summed next-token NLL over trained positions; the LM head runs only where a label is trained.

    On one process (the model not wrapped for DDP/FSDP/DeepSpeed) with a plain bias-free head, the decoder runs alone
    and the head's loss is `learning.head_loss.linear_cross_entropy`: the same value and gradients without the
    vocabulary-sized logits (at 8B shape this was the difference in peak memory against TRL's fused head). Otherwise
    the model's own forward with `logits_to_keep` (a wrapper's forward must run for its hooks).
    """
    ids = torch.tensor([enc.input_ids], device=device)
    labels = torch.tensor(enc.labels[1:], device=device)
    keep = (labels != IGNORE).nonzero().squeeze(-1)  # position t predicts token t+1
    if keep.numel() == 0:
        return torch.zeros((), device=device), 0
    split = split_head(model)
    if split is not None:
        decoder, head = split
        hidden = decoder(input_ids=ids, use_cache=False).last_hidden_state[0, keep]
        return linear_cross_entropy(hidden, head.weight, labels[keep]), int(keep.numel())
    out = model(input_ids=ids, logits_to_keep=keep, use_cache=False)
    logits = out.logits[0].float()
    return torch.nn.functional.cross_entropy(logits, labels[keep], reduction="sum"), int(keep.numel())


def sft_step(model: Any, opt: Any, sched: Any, batch: Sequence[Encoded], accelerator: Any,
             max_grad_norm: float) -> tuple[float, float]:
    """One optimizer step over `batch`: the loss is the token-level mean over every trained token of the step (each
    sequence's summed NLL divided by the step's trained-token count), then clipping, the optimizer and scheduler
    steps. Returns (mean loss, gradient norm before clipping)."""
    params = trainable_parameters(model)
    n_tokens = sum(e.trained for e in batch)
    loss_sum = 0.0
    for enc in batch:
        loss, n = _sequence_loss(model, enc, accelerator.device)
        if n:
            accelerator.backward(loss / max(1, n_tokens))
            loss_sum += float(loss.detach())
    norm = accelerator.clip_grad_norm_(params, max_grad_norm)
    opt.step()
    sched.step()
    opt.zero_grad(set_to_none=True)
    return loss_sum / max(1, n_tokens), float(norm)


def _save_checkpoint(root: Path, step: int, model: Any, opt: Any, sched: Any, keep: int) -> Path:
    folder = root / CHECKPOINTS / f"step-{step:06d}"
    tmp = folder.with_name(folder.name + ".tmp")
    tmp.mkdir(parents=True, exist_ok=True)
    trainable = {n: p.detach().cpu() for n, p in model.named_parameters() if p.requires_grad}
    torch.save(trainable, tmp / "trainable.pt")
    torch.save(opt.state_dict(), tmp / "optimizer.pt")
    torch.save(sched.state_dict(), tmp / "scheduler.pt")
    (tmp / "state.json").write_text(json.dumps({"step": step}))
    if folder.exists():
        shutil.rmtree(folder)
    tmp.rename(folder)
    done = sorted(p for p in (root / CHECKPOINTS).glob("step-*") if not p.name.endswith(".tmp"))
    for old in done[:-keep]:
        shutil.rmtree(old, ignore_errors=True)
    return folder


def latest_checkpoint(root: Path) -> Path | None:
    """The newest complete checkpoint folder (one with state.json), if any."""
    found = sorted(p for p in (root / CHECKPOINTS).glob("step-*") if (p / "state.json").is_file()
                   and not p.name.endswith(".tmp"))
    return found[-1] if found else None


def train_sft(
    examples: Sequence[Mapping[str, Any]],
    model_dir: Path,
    out_dir: Path,
    cfg: SFTConfig,
    *,
    init_adapter: Path | None = None,
    max_steps: int | None = None,
    on_step: Callable[[dict[str, Any]], None] = lambda _row: None,
    accelerator: Any = None,
) -> SFTResult:
    """Train (or resume) SFT into `out_dir`; the adapter is written to `out_dir/adapter`.

    Args:
        examples: kept examples (`learning.sft.generate.kept_examples`).
        init_adapter: continue from this LoRA adapter instead of a fresh one.
        max_steps: stop after this many optimizer steps in total (a partial run; resume continues it).
        on_step: called with each step's metrics row.

    Raises:
        SFTError: no examples, an example longer than `max_seq` (never truncated), or a malformed example.
    """
    from accelerate import Accelerator

    if not examples:
        raise SFTError("no training examples (generate trajectories first: rubricem sft generate)")
    torch.manual_seed(cfg.seed)
    model, tokenizer = load_trainable(model_dir, lora=cfg.lora, dtype=cfg.dtype, adapter=init_adapter,
                                      gradient_checkpointing=cfg.gradient_checkpointing, seed=cfg.seed)
    encoded = []
    for ex in examples:
        enc = encode(tokenizer, ex)
        if len(enc.input_ids) > cfg.max_seq:
            raise SFTError(f"example {ex.get('id')!r} has {len(enc.input_ids)} tokens, more than max_seq "
                           f"{cfg.max_seq}; it is refused, never truncated")
        encoded.append(enc)
    seq_order = order(len(encoded), cfg.epochs, cfg.seed)
    total = math.ceil(len(seq_order) / cfg.grad_accum)
    accelerator = accelerator or Accelerator(cpu=not torch.cuda.is_available())
    params = trainable_parameters(model)
    opt = torch.optim.AdamW(params, lr=cfg.learning_rate, weight_decay=cfg.weight_decay)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: schedule(s, total, cfg.warmup_ratio))
    model, opt = accelerator.prepare(model, opt)
    out_dir.mkdir(parents=True, exist_ok=True)
    start = 0
    ckpt = latest_checkpoint(out_dir)
    if ckpt is not None:
        state = torch.load(ckpt / "trainable.pt", weights_only=True)
        named = dict(accelerator.unwrap_model(model).named_parameters())
        with torch.no_grad():
            for n, t in state.items():
                named[n].copy_(t)
        opt.load_state_dict(torch.load(ckpt / "optimizer.pt", weights_only=True))
        sched.load_state_dict(torch.load(ckpt / "scheduler.pt", weights_only=True))
        start = int(json.loads((ckpt / "state.json").read_text())["step"])
        on_step({"message": f"resumed from checkpoint step {start}"})
    metrics_path = out_dir / METRICS
    if start == 0 and metrics_path.exists():
        metrics_path.unlink()
    elif metrics_path.exists():  # drop rows past the checkpoint (they will be redone)
        rows = [json.loads(x) for x in metrics_path.read_text().splitlines() if x.strip()]
        metrics_path.write_text("".join(json.dumps(r) + "\n" for r in rows if r["step"] <= start))
    stop = min(total, max_steps) if max_steps is not None else total
    model.train()
    for step in range(start, stop):
        t0 = time.monotonic()
        batch = [encoded[i] for i in seq_order[step * cfg.grad_accum : (step + 1) * cfg.grad_accum]]
        mean_loss, norm = sft_step(model, opt, sched, batch, accelerator, cfg.max_grad_norm)
        n_tokens = sum(e.trained for e in batch)
        seconds = time.monotonic() - t0
        # Without this the process kept what malloc freed: 14.6 GB resident by step 7 of a 1-thread CPU run on the
        # 23 GB machine (learning.memory has the same measurement for the GRPO update).
        release_freed_memory()
        row = {"step": step + 1, "of": total, "loss": mean_loss, "lr": sched.get_last_lr()[0],
               "grad_norm": norm, "trained_tokens": n_tokens,
               "tokens": sum(len(e.input_ids) for e in batch), "seconds": round(seconds, 3),
               "tokens_per_second": round(sum(len(e.input_ids) for e in batch) / max(seconds, 1e-9), 1)}
        with open(metrics_path, "a", encoding="utf-8") as fh:
            fh.write(json.dumps(row) + "\n")
        on_step(row)
        if (step + 1) % cfg.save_every == 0 or step + 1 == stop:
            _save_checkpoint(out_dir, step + 1, accelerator.unwrap_model(model), opt, sched, cfg.keep_checkpoints)
    rows = [json.loads(x) for x in metrics_path.read_text().splitlines() if x.strip()] if metrics_path.exists() else []
    meta = {
        "version": f"sft-{data_sha(examples)}-s{stop}",
        "kind": "sft",
        "preset": cfg.preset,
        "config": {k: v for k, v in asdict(cfg).items() if k != "lora"} | {"lora": asdict(cfg.lora) if cfg.lora
                                                                            else None},
        "examples": len(examples),
        "data_sha": data_sha(examples),
        "steps": stop,
        "total_steps": total,
        "final_loss": rows[-1]["loss"] if rows else None,
        "first_loss": rows[0]["loss"] if rows else None,
        "teachers": sorted({str(ex.get("teacher", "?")) for ex in examples}),
        "init_adapter": str(init_adapter) if init_adapter is not None else None,
    }
    adapter = save_adapter(accelerator.unwrap_model(model), out_dir / "adapter", meta)
    return SFTResult(adapter, stop, rows, meta, accelerator.unwrap_model(model))


def plot_loss(rows: Iterable[Mapping[str, Any]], path: Path) -> Path | None:
    """The loss curve as a PNG (None when matplotlib is not installed)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    rows = list(rows)
    fig, ax = plt.subplots(figsize=(6, 3.5))
    ax.plot([r["step"] for r in rows], [r["loss"] for r in rows], marker=".")
    ax.set_xlabel("optimizer step")
    ax.set_ylabel("loss (mean NLL of trained tokens)")
    ax.set_title("SFT loss")
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
