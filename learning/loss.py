"""The SS-GRPO / GRPO policy loss: PPO-clip surrogate plus β·KL3, token-level masked mean (METHOD.md §5.5, D5, D6).

Pure torch, no I/O. Shared by the SS-GRPO loop and the reflection trainer; only the advantages differ between them.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

LOG_RATIO_CLAMP: float = 20.0
"""Both log-ratios (log π_θ − log π_old for ρ, log π_ref − log π_θ for KL3) are clamped to [−20, 20] before exp.

This keeps ρ and the KL3 term finite (e^20 ≈ 4.9e8) for extreme log-probabilities, so a single pathological token
cannot overflow the loss. A clamped token gets zero gradient through that term, like a clipped PPO token. With
sane logprobs the clamp never binds: the PPO clip limits useful ratios to [0.8, 1.2].
"""


def _check_inputs(tensors: dict[str, Tensor], mask: Tensor, clip: float, beta: float) -> None:
    shape = mask.shape
    if mask.ndim not in (1, 2):
        raise ValueError(f"policy_loss takes (T,) or (B, T) tensors, got mask of shape {tuple(shape)}")
    for name, t in tensors.items():
        if t.shape != shape:
            raise ValueError(f"{name} has shape {tuple(t.shape)} but mask has {tuple(shape)}; all must match")
        if not t.is_floating_point():
            raise ValueError(f"{name} must be a floating tensor, got dtype {t.dtype}")
    if mask.is_complex():
        raise ValueError(f"mask must be bool or 0/1, got dtype {mask.dtype}")
    if mask.dtype != torch.bool and not bool(((mask == 0) | (mask == 1)).all()):
        raise ValueError("mask must hold only 0 and 1 (or be a bool tensor)")
    if not (0.0 < clip < 1.0):
        raise ValueError(f"clip must be in (0, 1), got {clip}")
    if not (0.0 <= beta < float("inf")):
        raise ValueError(f"beta must be a finite number >= 0, got {beta}")


def tis_weights(old_logprobs: Tensor, sampler_logprobs: Tensor, mask: Tensor, cap: float) -> Tensor:
    """Truncated importance-sampling weights min(π_old / π_sampler, cap) per token (Yao et al., 2025, "Your
    efficient RL framework secretly brings you off-policy RL training"), detached.

    The tokens were drawn from the sampler's distribution (vLLM's kernels), while the update's π_old is the trainer's
    own recomputation (torch); the ratio corrects for the difference and the cap bounds its variance. Where the
    sampler reported no finite log-prob, or the token is not trainable, the weight is 1.
    """
    if cap <= 0 or not math.isfinite(cap):
        raise ValueError(f"the TIS cap must be a finite number > 0, got {cap}")
    old = old_logprobs.detach().float()
    sampler = sampler_logprobs.detach().to(old.device, torch.float32)
    usable = mask.to(device=old.device, dtype=torch.bool) & torch.isfinite(sampler) & torch.isfinite(old)
    log_ratio = torch.where(usable, old - sampler, torch.zeros((), device=old.device)).clamp(max=math.log(cap))
    return torch.where(usable, torch.exp(log_ratio), torch.ones((), device=old.device))


def policy_loss(
    logprobs: Tensor,
    old_logprobs: Tensor,
    ref_logprobs: Tensor,
    advantages: Tensor,
    mask: Tensor,
    clip: float = 0.2,
    beta: float = 0.001,
    is_weights: Tensor | None = None,
) -> tuple[Tensor, dict[str, float]]:
    """PPO-clip surrogate with the KL3 penalty, averaged over every trainable token of the batch.

    `is_weights` (constants, e.g. `tis_weights`) multiply each token's surrogate: the truncated importance-sampling
    correction for tokens sampled by another engine than the one computing π_old. The KL term is not weighted.

    Per trainable token t: ρ = exp(logprobs − old_logprobs), surrogate = min(ρ·A, clip(ρ, 1−clip, 1+clip)·A),
    k3 = exp(ref − logprobs) − (ref − logprobs) − 1, and loss_t = −surrogate + beta·k3. The loss is
    Σ_t mask_t·loss_t / Σ_t mask_t over all tokens of all sequences (DAPO-style token-level mean, D5), so long
    sequences weigh in proportion to their trainable tokens.

    Masked tokens contribute exactly 0 and receive exactly 0 gradient, whatever their values (NaN and inf
    included): their inputs are replaced with neutral values by `torch.where` before any arithmetic. Both
    log-ratios are clamped to ±`LOG_RATIO_CLAMP`. old_logprobs, ref_logprobs and advantages are treated as
    constants (detached). Computation runs in at least float32.

    Args:
        logprobs: Log-probabilities of the sampled tokens under the policy being trained; (T,) or (B, T).
        old_logprobs: The same under the policy that sampled them (π_old).
        ref_logprobs: The same under the frozen reference policy (KL anchor).
        advantages: Per-token advantages, e.g. from `learning.advantages.token_advantages`.
        mask: 1/True for trainable tokens, 0/False for prompt, tool output, forced tags and padding (D6).
        clip: PPO clip η; ρ is clipped to [1−η, 1+η] (0.2 in this project).
        beta: Weight of the KL3 penalty (0.001 in this project).

    Returns:
        The scalar loss (0 with a grad_fn still connected to logprobs when no token is trainable) and python-float
        metrics over the trainable tokens: clip_fraction (share of tokens whose clipped term was strictly smaller,
        i.e. clipping changed the objective), kl (mean k3), ratio_mean / ratio_min / ratio_max (of the clamped ρ;
        1.0 when there are no tokens), n_tokens, pg_loss (mean −surrogate), advantage_mean.

    Raises:
        ValueError: On mismatched shapes, non-floating inputs, a mask other than 0/1, clip outside (0, 1), a
            negative beta, or a NaN/inf value at a trainable position of any input.
    """
    inputs = {
        "logprobs": logprobs,
        "old_logprobs": old_logprobs,
        "ref_logprobs": ref_logprobs,
        "advantages": advantages,
    }
    _check_inputs(inputs, mask, clip, beta)
    m = mask.to(device=logprobs.device, dtype=torch.bool)  # (B, T) or (T,)

    # Work in at least float32: exp of a bf16 log-ratio is too coarse for the clip test.
    dtype = torch.promote_types(logprobs.dtype, torch.float32)
    zero = torch.zeros((), dtype=dtype, device=logprobs.device)

    def neutral(t: Tensor) -> Tensor:
        # where, not multiplication: NaN * 0 is NaN, and its gradient would be NaN too.
        return torch.where(m, t.to(dtype), zero)

    lp = neutral(logprobs)
    old = neutral(old_logprobs.detach())
    ref = neutral(ref_logprobs.detach())
    adv = neutral(advantages.detach())

    nonfinite = [name for name, t in zip(inputs, (lp, old, ref, adv)) if not bool(torch.isfinite(t.detach()).all())]
    if nonfinite:
        raise ValueError(f"NaN or inf at trainable (mask = 1) positions of: {', '.join(nonfinite)}")

    log_ratio = (lp - old).clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)  # 0 at masked tokens
    ratio = torch.exp(log_ratio)  # ρ, exactly 1 at masked tokens
    surr_unclipped = ratio * adv
    surr_clipped = ratio.clamp(1.0 - clip, 1.0 + clip) * adv
    surrogate = torch.minimum(surr_unclipped, surr_clipped)  # 0 at masked tokens (adv = 0)

    ref_log_ratio = (ref - lp).clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
    k3 = torch.exp(ref_log_ratio) - ref_log_ratio - 1.0  # KL3 estimator of KL(π_θ ‖ π_ref); 0 at masked tokens

    weight = neutral(is_weights.detach()) if is_weights is not None else torch.where(m, 1.0, zero)
    if is_weights is not None and not bool(torch.isfinite(weight).all()):
        raise ValueError("NaN or inf at trainable (mask = 1) positions of: is_weights")
    per_token = torch.where(m, -weight * surrogate + beta * k3, zero)
    n_tokens = m.sum()
    loss = per_token.sum() / n_tokens.clamp(min=1).to(dtype)

    with torch.no_grad():
        n = n_tokens.clamp(min=1).to(dtype)
        clipped = m & (surr_clipped < surr_unclipped)
        big = torch.tensor(float("inf"), dtype=dtype, device=lp.device)
        has = n_tokens > 0
        one = torch.ones((), dtype=dtype, device=lp.device)
        stats = torch.stack(
            [
                clipped.sum().to(dtype) / n,
                torch.where(m, k3, zero).sum() / n,
                torch.where(has, torch.where(m, ratio, zero).sum() / n, one),
                torch.where(has, torch.cat([torch.where(m, ratio, big).flatten(), big[None]]).min(), one),
                torch.where(has, torch.cat([torch.where(m, ratio, -big).flatten(), -big[None]]).max(), one),
                n_tokens.to(dtype),
                torch.where(m, -surrogate, zero).sum() / n,
                adv.sum() / n,
                torch.where(has, weight.sum() / n, one),
            ]
        ).tolist()  # one device sync for all metrics
    keys = ("clip_fraction", "kl", "ratio_mean", "ratio_min", "ratio_max", "n_tokens", "pg_loss", "advantage_mean",
            "is_weight_mean")
    return loss, dict(zip(keys, (float(v) for v in stats)))
