"""One policy-gradient update over a set of training sequences: old/ref log-probs, masked PPO-clip + KL3 loss with
gradient accumulation, gradient clipping, one optimizer step.

The loss is a token-level masked mean over every trainable token of the whole update (METHOD D5): each micro-batch's
masked mean is weighted by its share of the update's trainable tokens before backward, so splitting into
micro-batches does not change the gradient. There is one optimizer step per batch, so the "old" policy is the current
one: old log-probs are the gradient pass's own, detached (ρ = 1, the clip is inactive; no extra forward pass, as in
TRL with one iteration). The reference policy is the policy RL starts from (METHOD's KL anchor): when training
continues from an adapter (`rubricem train --init-adapter`, the online cycle from the live adapter, the learning curve
from the SFT adapter) it is that adapter, loaded a second time and frozen beside the trained one
(`learning.model.load_trainable(reference=True)`: no second copy of the base weights); for a fresh LoRA it is the
base model with the adapter disabled, which is the same thing (LoRA's B starts at zero); a plain model is its own
reference. Anchoring to the base instead, as this module did before issue 45, pulls an RL run from the SFT adapter
back towards the model that cannot follow the scaffold: its KL was 1.35 per token at step 0, before any update.

Which log-probs are π_old, and the train/inference mismatch. The update's π_old is the trainer's own recomputation,
never the sampler's: the ratio ρ must compare the same kernels, or every token would be "off-policy" by the numeric
gap between engines (vLLM's bf16 kernels against torch's), and ρ would clip on noise. But the tokens were drawn from
the sampler's distribution, not the trainer's, so with `tis_cap` set each token's surrogate is weighted by the
truncated importance ratio min(π_old / π_sampler, tis_cap) (`learning.loss.tis_weights`): the standard correction
for that mismatch. Tokens without a sampler log-prob get weight 1. The gap is reported as `sampler_logprob_gap` (mean
|Δ log p|), `sampler_logprob_gap_max` and `sampler_kl` (the k3 estimate of KL(sampler ‖ trainer) per token), and the
mean weight as `is_weight_mean`.

A mismatch too large to correct is a fault, not noise: with `max_sampler_kl` set, an update whose `sampler_kl` (the
mean k3 over the trainable tokens that have a sampler log-prob, across all processes) exceeds it takes no optimizer
step, and `UpdateStats.skipped` names the measured value and the threshold; the metrics are still reported, so the
step's row in metrics.jsonl shows both. Tokens without a sampler log-prob (NaN) do not count; an update with none never
skips. Measured per token on this repo's SmolLM2-135M (docs/vllm.md and issue 37): bf16 engines against the bf16
trainer ~0.002, llama.cpp's Q4_1 GGUF against the bf16 trainer ~0.006; faults are 20-100× that (log-probs reported at
temperature 0.7 for a trainer at 1.0: ~0.13; a sampler without the trainer's adapter: ~0.45), hence
`TrainConfig.max_sampler_kl` = 0.05. The check runs after the gradient pass and before `optimizer.step()`, from the
π_old that pass already computes (detached), rather than in a separate no-grad pass first: a pre-pass would add a
forward over the whole update to every step, while checking afterwards wastes a backward only on the rare step that is
skipped; the gradients of a skipped step are zeroed, like those of a non-finite one. Under several processes the sum
and count of k3 are all-reduced first, so every process takes the same decision (one stepping while another does not
would split the replicas).
"""

from __future__ import annotations

import contextlib
import math
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from learning.loss import policy_loss, tis_weights
from learning.model import REFERENCE_ADAPTER
from learning.sequences import Batch, TrainSequence, collate, micro_batches, response_logprobs


@dataclass
class UpdateStats:
    """What an update did (python numbers, ready for JSONL)."""

    loss: float = 0.0
    sequences: int = 0
    tokens: int = 0  # all non-padding tokens processed in the gradient pass (throughput unit)
    trainable_tokens: int = 0
    seconds: float = 0.0
    grad_norm: float = 0.0
    skipped: str | None = None  # why no optimizer step was taken
    metrics: dict[str, float] = field(default_factory=dict)

    def as_dict(self, prefix: str) -> dict[str, Any]:
        """Flat metrics with a prefix, e.g. task/loss."""
        out: dict[str, Any] = {f"{prefix}/{k}": v for k, v in self.metrics.items()}
        out.update({f"{prefix}/loss": self.loss, f"{prefix}/sequences": self.sequences, f"{prefix}/tokens": self.tokens,
                    f"{prefix}/trainable_tokens": self.trainable_tokens, f"{prefix}/seconds": round(self.seconds, 3),
                    f"{prefix}/grad_norm": self.grad_norm, f"{prefix}/skipped": self.skipped})
        return out


def reference_context(model: torch.nn.Module) -> contextlib.AbstractContextManager[Any]:
    """The reference policy: a PEFT model's frozen REFERENCE_ADAPTER when it has one (the adapter training started
    from), else the PEFT model with its adapter disabled; a plain model is its own reference.

    A DDP/accelerate wrapper is looked through (`.module`), or the adapter would stay on and the KL would be 0.
    """
    inner = getattr(model, "module", model)
    if REFERENCE_ADAPTER in (getattr(inner, "peft_config", None) or {}):
        return _active_adapter(inner, REFERENCE_ADAPTER)
    disable = getattr(inner, "disable_adapter", None)
    return disable() if callable(disable) else contextlib.nullcontext()


@contextlib.contextmanager
def _active_adapter(model: Any, name: str) -> Iterator[None]:
    """Run with adapter `name` active, then switch back to the one that was; which parameters require grad is
    restored too (PEFT's `set_adapter` marks the adapter it activates trainable and the others frozen)."""
    previous = model.active_adapter
    flags = [(p, p.requires_grad) for p in model.parameters()]
    try:
        model.set_adapter(name)
        yield
    finally:
        model.set_adapter(previous)
        for p, flag in flags:
            p.requires_grad_(flag)


@torch.no_grad()
def _fixed_logprobs(model: torch.nn.Module, batches: Sequence[Batch], temperature: float) -> list[torch.Tensor]:
    return [response_logprobs(model, b, temperature).detach() for b in batches]


def policy_update(
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    seqs: Sequence[TrainSequence],
    *,
    pad_id: int,
    clip: float = 0.2,
    beta: float = 0.001,
    token_budget: int = 8192,
    max_grad_norm: float = 1.0,
    temperature: float = 1.0,
    backward: Callable[[torch.Tensor], None] | None = None,
    tis_cap: float | None = None,
    max_sampler_kl: float | None = None,
    hold: str | None = None,
) -> UpdateStats:
    """Train once on `seqs` (sequences without trainable tokens are dropped).

    Args:
        model: the policy (a PEFT model for LoRA; the reference is `reference_context`'s).
        optimizer: over the trainable parameters.
        seqs: training sequences with per-token advantages.
        pad_id: the tokenizer's padding id.
        clip: PPO clip ε (D5: 0.2).
        beta: KL3 coefficient (D5: 0.001); 0 skips the reference pass.
        token_budget: padded tokens per micro-batch (memory knob).
        max_grad_norm: gradient clipping.
        temperature: the sampling temperature the log-probs are taken at.
        backward: `accelerator.backward` under accelerate (default: loss.backward()).
        tis_cap: weight each token's surrogate by min(π_old / π_sampler, tis_cap); None: no correction.
        max_sampler_kl: skip the optimizer step (`stats.skipped` says why) when the mean k3 KL(sampler ‖ trainer) per
            token exceeds it; None: never skip on the mismatch.
        hold: take no optimizer step, for this reason (e.g. every rollout scored the same): only the trainer's
            log-probs are computed, without gradients, so the sampler-trainer mismatch is still measured and
            recorded; a mismatch above `max_sampler_kl` is then the reason given.
    """
    started = time.perf_counter()
    stats = UpdateStats()
    seqs = [s for s in seqs if s.n_trainable > 0]
    device = next(model.parameters()).device
    if not seqs:
        if max_sampler_kl is not None:  # joins the other processes' mismatch all-reduce (a no-op on one process)
            _global_sampler_kl([], [], device)
        stats.skipped = "no trainable tokens"
        return stats
    batches = [collate(mb, pad_id, device) for mb in micro_batches(seqs, token_budget)]
    total = sum(float(b.mask.sum()) for b in batches)
    was_training = model.training
    if hold is not None:
        return _measured_only(model, batches, seqs, int(total), temperature, max_sampler_kl, hold, started,
                              was_training)
    model.eval()  # dropout off for the fixed pass
    ref: list[torch.Tensor | None] = [None] * len(batches)
    if beta > 0:
        with reference_context(model):
            ref = list(_fixed_logprobs(model, batches, temperature))
    model.train()
    olds: list[torch.Tensor] = []
    optimizer.zero_grad(set_to_none=True)
    sums: dict[str, float] = {}
    loss_total = 0.0
    try:
        for b, ref_lp in zip(batches, ref, strict=True):
            logp = response_logprobs(model, b, temperature)  # (B, T)
            old_lp = logp.detach()
            olds.append(old_lp)
            weights = None
            if tis_cap is not None and b.sampler_logprobs is not None:
                weights = tis_weights(old_lp, b.sampler_logprobs, b.mask, tis_cap)
            loss, m = policy_loss(logp, old_lp, old_lp if ref_lp is None else ref_lp, b.advantages, b.mask,
                                  clip=clip, beta=beta, is_weights=weights)
            share = float(b.mask.sum()) / total
            scaled = loss * share
            (backward or torch.Tensor.backward)(scaled)
            loss_total += float(scaled.detach())
            _accumulate(sums, m, share)
            stats.tokens += b.n_tokens
    except ValueError as exc:  # policy_loss refuses NaN/inf log-probs at trainable positions
        optimizer.zero_grad(set_to_none=True)
        model.train(was_training)
        stats.skipped = f"bad values in the update: {exc}"
        stats.seconds = time.perf_counter() - started
        return stats
    params = [p for p in model.parameters() if p.requires_grad]
    grad_norm = float(torch.nn.utils.clip_grad_norm_(params, max_grad_norm))
    kl, kl_tokens = _global_sampler_kl(batches, olds, device) if max_sampler_kl is not None else (math.nan, 0)
    if not math.isfinite(loss_total) or not math.isfinite(grad_norm):
        optimizer.zero_grad(set_to_none=True)  # never step on garbage
        stats.skipped = f"non-finite loss ({loss_total}) or gradient norm ({grad_norm})"
    elif max_sampler_kl is not None and kl > max_sampler_kl:  # NaN (no sampler log-probs) compares False
        optimizer.zero_grad(set_to_none=True)  # the tokens are not the trainer's policy's: no step on them
        stats.skipped = _mismatch(kl, kl_tokens, max_sampler_kl)
    else:
        optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    model.train(was_training)
    stats.loss, stats.grad_norm = loss_total, grad_norm
    stats.sequences, stats.trainable_tokens = len(seqs), int(total)
    stats.metrics = {k: round(v, 6) for k, v in sums.items()} | sampler_mismatch(batches, olds)
    stats.seconds = time.perf_counter() - started
    return stats


def _mismatch(kl: float, tokens: int, threshold: float) -> str:
    return (f"sampler-trainer mismatch: KL(sampler ‖ trainer) {kl:.4g} per token (k3, {tokens} tokens) above "
            f"max_sampler_kl {threshold:g}")


def _measured_only(model: torch.nn.Module, batches: Sequence[Batch], seqs: Sequence[TrainSequence], total: int,
                   temperature: float, max_sampler_kl: float | None, hold: str, started: float,
                   was_training: bool) -> UpdateStats:
    """A held step: the trainer's log-probs without gradients, the mismatch measured, no optimizer step."""
    model.eval()
    with torch.no_grad():
        olds = _fixed_logprobs(model, batches, temperature)
    model.train(was_training)
    stats = UpdateStats(sequences=len(seqs), trainable_tokens=total, tokens=sum(b.n_tokens for b in batches))
    kl, kl_tokens = (_global_sampler_kl(batches, olds, next(model.parameters()).device)
                     if max_sampler_kl is not None else (math.nan, 0))
    stats.skipped = _mismatch(kl, kl_tokens, max_sampler_kl) if max_sampler_kl is not None and kl > max_sampler_kl \
        else hold
    stats.metrics = sampler_mismatch(batches, olds)
    stats.seconds = time.perf_counter() - started
    return stats


def _accumulate(sums: dict[str, float], m: dict[str, float], share: float) -> None:
    """Combine one micro-batch's metrics: token-weighted means, min/max for the ratio bounds."""
    for k, v in m.items():
        if k == "ratio_min":
            sums[k] = min(sums.get(k, math.inf), v)
        elif k == "ratio_max":
            sums[k] = max(sums.get(k, -math.inf), v)
        elif k != "n_tokens":
            sums[k] = sums.get(k, 0.0) + v * share


def _sampler_deltas(batches: Sequence[Batch], old: Sequence[torch.Tensor]) -> torch.Tensor:
    """Δ = trainer − sampler log-prob at the trainable tokens where both are finite, flattened (CPU, float32)."""
    diffs: list[torch.Tensor] = []
    for b, lp in zip(batches, old, strict=True):
        if b.sampler_logprobs is None:
            continue
        usable = b.mask.bool() & torch.isfinite(b.sampler_logprobs) & torch.isfinite(lp)
        diffs.append((lp.float() - b.sampler_logprobs.float())[usable].cpu())
    return torch.cat(diffs) if diffs else torch.empty(0)


def _k3(d: torch.Tensor) -> torch.Tensor:
    """Per-token k3 estimate of KL(sampler ‖ trainer), exp(Δ) − Δ − 1 (unbiased for tokens drawn from the sampler)."""
    return torch.exp(d.clamp(-20, 20)) - d - 1


def sampler_mismatch(batches: Sequence[Batch], old: Sequence[torch.Tensor]) -> dict[str, float]:
    """The train/inference gap over trainable tokens that have a sampler log-prob (NaN when none do): mean and max
    |recomputed − sampler| log-prob, and the per-token k3 estimate of KL(sampler ‖ trainer) on the sampled tokens,
    exp(Δ) − Δ − 1 with Δ = trainer − sampler (unbiased for tokens drawn from the sampler)."""
    d = _sampler_deltas(batches, old)
    if d.numel() == 0:
        return {"sampler_logprob_gap": float("nan"), "sampler_logprob_gap_max": float("nan"),
                "sampler_kl": float("nan")}
    return {"sampler_logprob_gap": round(float(d.abs().mean()), 6),
            "sampler_logprob_gap_max": round(float(d.abs().max()), 6), "sampler_kl": round(float(_k3(d).mean()), 6)}


def _global_sampler_kl(batches: Sequence[Batch], old: Sequence[torch.Tensor], device: torch.device
                       ) -> tuple[float, int]:
    """The mean k3 over every process's tokens with a sampler log-prob, and their count; (NaN, 0) when none have
    one. Summed across processes when torch.distributed runs several, so all of them take the same decision."""
    k3 = _k3(_sampler_deltas(batches, old))
    totals = torch.tensor([float(k3.sum()), float(k3.numel())], dtype=torch.float64)
    dist = torch.distributed
    if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
        on_device = totals.to(device)
        dist.all_reduce(on_device)
        totals = on_device.cpu()
    total, count = float(totals[0]), int(totals[1])
    return (total / count if count else math.nan), count
