"""One policy-gradient update over a set of training sequences: old/ref log-probs, masked PPO-clip + KL3 loss with
gradient accumulation, gradient clipping, one optimizer step.

The loss is a token-level masked mean over every trainable token of the whole update (METHOD D5): each micro-batch's
masked mean is weighted by its share of the update's trainable tokens before backward, so splitting into
micro-batches does not change the gradient. There is one optimizer step per batch, so the "old" policy is the current
one: old log-probs are the gradient pass's own, detached (ρ = 1, the clip is inactive; no extra forward pass, as in
TRL with one iteration). The reference policy is the base model: the LoRA adapter disabled (no second copy).

Which log-probs are π_old, and the train/inference mismatch. The update's π_old is the trainer's own recomputation,
never the sampler's: the ratio ρ must compare the same kernels, or every token would be "off-policy" by the numeric
gap between engines (vLLM's bf16 kernels against torch's), and ρ would clip on noise. But the tokens were drawn from
the sampler's distribution, not the trainer's, so with `tis_cap` set each token's surrogate is weighted by the
truncated importance ratio min(π_old / π_sampler, tis_cap) (`learning.loss.tis_weights`): the standard correction
for that mismatch. Tokens without a sampler log-prob get weight 1. The gap is reported as `sampler_logprob_gap` (mean
|Δ log p|), `sampler_logprob_gap_max` and `sampler_kl` (the k3 estimate of KL(sampler ‖ trainer) per token), and the
mean weight as `is_weight_mean`.
"""

from __future__ import annotations

import contextlib
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from learning.loss import policy_loss, tis_weights
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
    """The reference policy: a PEFT model with its adapter disabled; a plain model is its own reference.

    A DDP/accelerate wrapper is looked through (`.module`), or the adapter would stay on and the KL would be 0.
    """
    disable = getattr(getattr(model, "module", model), "disable_adapter", None)
    return disable() if callable(disable) else contextlib.nullcontext()


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
) -> UpdateStats:
    """Train once on `seqs` (sequences without trainable tokens are dropped).

    Args:
        model: the policy (a PEFT model for LoRA; its adapter-disabled self is the reference).
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
    """
    started = time.perf_counter()
    stats = UpdateStats()
    seqs = [s for s in seqs if s.n_trainable > 0]
    if not seqs:
        stats.skipped = "no trainable tokens"
        return stats
    device = next(model.parameters()).device
    batches = [collate(mb, pad_id, device) for mb in micro_batches(seqs, token_budget)]
    total = sum(float(b.mask.sum()) for b in batches)
    was_training = model.training
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
    if not math.isfinite(loss_total) or not math.isfinite(grad_norm):
        optimizer.zero_grad(set_to_none=True)  # never step on garbage
        stats.skipped = f"non-finite loss ({loss_total}) or gradient norm ({grad_norm})"
    else:
        optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    model.train(was_training)
    stats.loss, stats.grad_norm = loss_total, grad_norm
    stats.sequences, stats.trainable_tokens = len(seqs), int(total)
    stats.metrics = {k: round(v, 6) for k, v in sums.items()} | sampler_mismatch(batches, olds)
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


def sampler_mismatch(batches: Sequence[Batch], old: Sequence[torch.Tensor]) -> dict[str, float]:
    """The train/inference gap over trainable tokens that have a sampler log-prob (NaN when none do): mean and max
    |recomputed − sampler| log-prob, and the per-token k3 estimate of KL(sampler ‖ trainer) on the sampled tokens,
    exp(Δ) − Δ − 1 with Δ = trainer − sampler (unbiased for tokens drawn from the sampler)."""
    diffs: list[torch.Tensor] = []
    for b, lp in zip(batches, old, strict=True):
        if b.sampler_logprobs is None:
            continue
        usable = b.mask.bool() & torch.isfinite(b.sampler_logprobs) & torch.isfinite(lp)
        diffs.append((lp.float() - b.sampler_logprobs.float())[usable])
    d = torch.cat(diffs) if diffs else torch.empty(0)
    if d.numel() == 0:
        return {"sampler_logprob_gap": float("nan"), "sampler_logprob_gap_max": float("nan"),
                "sampler_kl": float("nan")}
    k3 = torch.exp(d.clamp(-20, 20)) - d - 1
    return {"sampler_logprob_gap": round(float(d.abs().mean()), 6),
            "sampler_logprob_gap_max": round(float(d.abs().max()), 6), "sampler_kl": round(float(k3.mean()), 6)}
