"""Stage-structured credit assignment for SS-GRPO: Λ-returns, stagewise group normalisation, token mapping.

Pure torch maths, no I/O (METHOD.md §5.3-5.6, decisions D4, D7, D9). The training loop and the reflection trainer
both use it; the answer-only ablation (plain GRPO) is one `CreditMode` away.
"""

from __future__ import annotations

from typing import Literal, get_args

import torch
from torch import Tensor

from store.records import STAGES

K_STAGES: int = len(STAGES)
"""Number of scaffold stages: plan, research, review, answer (the column order of every score matrix)."""

PAPER_LAMBDA: Tensor = torch.tensor(
    [
        [1.0, 0.4, 0.6, 0.8],
        [0.0, 1.0, 0.4, 0.8],
        [0.0, 0.0, 1.0, 0.8],
        [0.0, 0.0, 0.0, 1.0],
    ],
    dtype=torch.float32,
)
"""The paper's stage-dependence matrix Λ [REM App. F.1.2]: rows are the credited stage k, columns the scored stage j.

Treat it as read-only; call `paper_lambda()` for a copy you may modify.
"""

CreditMode = Literal["ss-grpo", "answer-only"]
"""ss-grpo: the paper's Λ over the four stage scores. answer-only: the Answer score for every stage with the identity
Λ, i.e. plain GRPO with terminal broadcast (the ablation baseline)."""

CREDIT_MODES: tuple[CreditMode, ...] = get_args(CreditMode)

ZERO_STD_RTOL: float = 1e-12
"""A group's std counts as zero (D4) when it is at most this times max(1, max |value|) of the group.

The returns are computed in float64, where rounding noise on equal values is ~1e-16 relative, so 1e-12 catches noise
from different summation orders without touching any real spread between judge scores (which are multiples of 1/12
or coarser in practice).
"""


def paper_lambda() -> Tensor:
    """Return a fresh copy of the paper's Λ (4×4, float32).

    Returns:
        The upper-triangular stage-dependence matrix of METHOD.md §5.3.
    """
    return PAPER_LAMBDA.clone()


def identity_lambda(k: int = K_STAGES) -> Tensor:
    """Return the k×k identity Λ: every stage keeps only its own score (no credit from later stages).

    Args:
        k: Number of stages.

    Returns:
        A float32 identity matrix.

    Raises:
        ValueError: If k < 1.
    """
    if k < 1:
        raise ValueError(f"identity_lambda needs k >= 1 stages, got {k}")
    return torch.eye(k, dtype=torch.float32)


def _check_real(name: str, t: Tensor) -> None:
    if t.dtype == torch.bool or t.is_complex():
        raise ValueError(f"{name} must be a real floating or integer tensor, got dtype {t.dtype}")


def _float_dtype(t: Tensor) -> torch.dtype:
    """The floating dtype results are returned in: the input's own, or float32 for integer inputs."""
    return t.dtype if t.is_floating_point() else torch.float32


def _check_lambda(lam: Tensor, k: int) -> None:
    _check_real("lam", lam)
    if lam.ndim != 2 or lam.shape[0] != lam.shape[1]:
        raise ValueError(f"lam must be a square (K, K) matrix, got shape {tuple(lam.shape)}")
    if lam.shape[0] != k:
        raise ValueError(f"lam is {lam.shape[0]}×{lam.shape[1]} but scores have K = {k} stage columns")
    if not bool(torch.isfinite(lam).all()):
        raise ValueError("lam contains NaN or inf")
    below = torch.tril(lam, diagonal=-1)
    if bool((below != 0).any()):
        rows, cols = torch.nonzero(below, as_tuple=True)
        raise ValueError(
            "lam must be upper triangular (causal: a stage takes credit only from itself and later stages); "
            f"found non-zero entries below the diagonal at (k, j) = {list(zip(rows.tolist(), cols.tolist()))}"
        )


def _check_scores(scores: Tensor) -> None:
    _check_real("scores", scores)
    if scores.ndim != 2:
        raise ValueError(f"scores must be an (n rollouts, K stages) matrix, got shape {tuple(scores.shape)}")
    if bool(torch.isnan(scores).any()):
        raise ValueError(
            "scores contain NaN; give an absent or unscored stage R = 0 before computing returns (METHOD D7), "
            "and drop rollouts that could not be judged at all"
        )
    if bool(torch.isinf(scores).any()):
        raise ValueError("scores contain inf")


def _returns64(scores: Tensor, lam: Tensor) -> Tensor:
    """G in float64: G[i, k] = Σ_j lam[k, j]·scores[i, j]; lam is upper triangular, so j runs over j ≥ k."""
    s = scores.to(torch.float64)  # (n, K)
    lam64 = lam.to(device=scores.device, dtype=torch.float64)  # (K, K)
    return s @ lam64.T  # (n, K)


def _normalise_columns(g: Tensor, eps: float) -> Tensor:
    """Per column: (g - mean) / (population std + eps); a column with zero std (D4) becomes exactly 0."""
    n = g.shape[0]
    if n == 0:
        return torch.zeros_like(g)
    mean = g.mean(dim=0, keepdim=True)  # (1, K)
    std = g.std(dim=0, correction=0, keepdim=True)  # (1, K) population std (D4)
    scale = g.abs().amax(dim=0, keepdim=True).clamp(min=1.0)  # (1, K)
    flat = std <= ZERO_STD_RTOL * scale  # (1, K) equal returns up to rounding noise
    adv = (g - mean) / (std + eps)  # (n, K)
    # Set zero-std columns explicitly instead of dividing rounding noise by eps (D4); n = 1 lands here too.
    return torch.where(flat, torch.zeros_like(adv), adv)


def _check_eps(eps: float) -> None:
    if not (eps >= 0.0 and eps < float("inf")):
        raise ValueError(f"eps must be a finite number >= 0, got {eps}")


def stage_returns(scores: Tensor, lam: Tensor) -> Tensor:
    """Λ-weighted stage returns G (METHOD.md §5.3).

    Args:
        scores: (n, K) judge scores R of n rollouts of one question, columns in stage order (plan, research,
            review, answer). An absent stage must already be 0 (D7).
        lam: (K, K) upper-triangular Λ, rows the credited stage k, columns the scored stage j.

    Returns:
        (n, K) tensor with G[i, k] = Σ_{j≥k} lam[k, j]·scores[i, j], in the scores' floating dtype (float32 for
        integer scores), on the scores' device.

    Raises:
        ValueError: On wrong shapes, a Λ that is not upper triangular or not finite, or NaN/inf scores.
    """
    _check_scores(scores)
    _check_lambda(lam, scores.shape[1])
    return _returns64(scores, lam).to(_float_dtype(scores))


def stage_advantages(scores: Tensor, lam: Tensor, eps: float = 1e-6) -> Tensor:
    """SS-GRPO advantages: Λ-returns normalised per stage across the rollouts of one question (§5.4, D4).

    A_{i,k} = (G_{i,k} − mean_i G_{·,k}) / (std_i G_{·,k} + eps) with the population std (ddof 0). A stage whose
    returns are all equal (std ≤ `ZERO_STD_RTOL`·max(1, max|G|), computed in float64) gets exactly 0 for every
    rollout; so does every stage of a group of one. An empty group gives an empty (0, K) result.

    Args:
        scores: (n, K) stage scores, as for `stage_returns`.
        lam: (K, K) upper-triangular Λ.
        eps: Added to the std (1e-6 in this project).

    Returns:
        (n, K) advantages in the scores' floating dtype; never NaN.

    Raises:
        ValueError: As `stage_returns`, or for a negative or non-finite eps.
    """
    _check_scores(scores)
    _check_lambda(lam, scores.shape[1])
    _check_eps(eps)
    return _normalise_columns(_returns64(scores, lam), eps).to(_float_dtype(scores))


def token_advantages(token_stages: Tensor, stage_adv: Tensor) -> Tensor:
    """Broadcast one rollout's stage advantages onto its tokens (§5.4: every token of B_{i,k} gets A_{i,k}).

    Args:
        token_stages: (T,) integer stage index 0..K-1 of each assistant token, or -1 for tokens without gradient
            (tool output, forced tags; see `store.records.token_stages`).
        stage_adv: (K,) advantages of this rollout's stages, e.g. one row of `stage_advantages`.

    Returns:
        (T,) advantages in stage_adv's floating dtype, exactly 0 wherever token_stages is -1.

    Raises:
        ValueError: If token_stages is not a 1-D integer tensor, stage_adv is not 1-D finite, or a stage id is
            outside -1..K-1.
    """
    if token_stages.ndim != 1 or token_stages.is_floating_point() or token_stages.is_complex():
        raise ValueError(
            f"token_stages must be a 1-D integer tensor, got shape {tuple(token_stages.shape)} dtype {token_stages.dtype}"
        )
    if token_stages.dtype == torch.bool:
        raise ValueError("token_stages must hold integer stage ids, not booleans")
    _check_real("stage_adv", stage_adv)
    if stage_adv.ndim != 1:
        raise ValueError(f"stage_adv must be a (K,) vector, got shape {tuple(stage_adv.shape)}")
    if not bool(torch.isfinite(stage_adv).all()):
        raise ValueError("stage_adv contains NaN or inf")
    k = stage_adv.shape[0]
    bad = (token_stages < -1) | (token_stages >= k)
    if bool(bad.any()):
        wrong = sorted(set(token_stages[bad].tolist()))
        raise ValueError(f"token_stages holds ids {wrong[:10]} outside -1..{k - 1} (K = {k} stages)")
    adv = stage_adv.to(_float_dtype(stage_adv))
    out = torch.zeros(token_stages.shape, dtype=adv.dtype, device=adv.device)  # (T,)
    if k == 0:
        return out
    stages = token_stages.to(adv.device)
    trained = stages >= 0  # (T,)
    # Index with a clamped copy, then select: -1 tokens get an exact 0, not whatever stage 0 holds.
    return torch.where(trained, adv[stages.clamp(min=0)], out)


def answer_only_scores(scores: Tensor) -> Tensor:
    """The ablation baseline's scores: the Answer score (last column) broadcast to all K stages.

    With `identity_lambda()` this is plain GRPO with terminal broadcast: every stage of rollout i gets the group
    normalised Answer score.

    Args:
        scores: (n, K) stage scores.

    Returns:
        (n, K) tensor whose every column equals scores[:, -1].

    Raises:
        ValueError: If scores is not an (n, K) matrix with K ≥ 1.
    """
    _check_real("scores", scores)
    if scores.ndim != 2 or scores.shape[1] < 1:
        raise ValueError(f"scores must be an (n rollouts, K ≥ 1 stages) matrix, got shape {tuple(scores.shape)}")
    return scores[:, -1:].expand(-1, scores.shape[1]).clone()


def _check_mode(mode: str) -> None:
    if mode not in CREDIT_MODES:
        raise ValueError(f"unknown credit mode {mode!r}; expected one of {CREDIT_MODES}")


def credit_lambda(mode: CreditMode, k: int = K_STAGES) -> Tensor:
    """Λ for a credit mode: the paper's for "ss-grpo", the identity for "answer-only".

    Args:
        mode: "ss-grpo" or "answer-only".
        k: Number of stages; the paper's Λ exists only for k = 4.

    Returns:
        A fresh (k, k) float32 Λ.

    Raises:
        ValueError: On an unknown mode, or "ss-grpo" with k != 4.
    """
    _check_mode(mode)
    if mode == "answer-only":
        return identity_lambda(k)
    if k != PAPER_LAMBDA.shape[0]:
        raise ValueError(f"the paper's Λ is {PAPER_LAMBDA.shape[0]}×{PAPER_LAMBDA.shape[0]}; got k = {k}")
    return paper_lambda()


def credit_scores(scores: Tensor, mode: CreditMode) -> Tensor:
    """Scores as a credit mode sees them: unchanged for "ss-grpo", the Answer score broadcast for "answer-only".

    Args:
        scores: (n, K) stage scores.
        mode: "ss-grpo" or "answer-only".

    Returns:
        (n, K) scores to feed to `stage_advantages` together with `credit_lambda(mode)`.

    Raises:
        ValueError: On an unknown mode or a malformed score matrix.
    """
    _check_mode(mode)
    if mode == "answer-only":
        return answer_only_scores(scores)
    _check_real("scores", scores)
    if scores.ndim != 2:
        raise ValueError(f"scores must be an (n rollouts, K stages) matrix, got shape {tuple(scores.shape)}")
    return scores.clone()


def credit_advantages(scores: Tensor, mode: CreditMode, eps: float = 1e-6) -> Tensor:
    """(n, K) advantages of one group under a credit mode; the training loop's single switch for the ablation.

    Args:
        scores: (n, K) stage scores (absent stages already 0, D7).
        mode: "ss-grpo" (paper Λ) or "answer-only" (plain GRPO on the Answer score).
        eps: Added to the std.

    Returns:
        `stage_advantages(credit_scores(scores, mode), credit_lambda(mode, K), eps)`.

    Raises:
        ValueError: As the functions it composes.
    """
    _check_mode(mode)
    _check_real("scores", scores)
    if scores.ndim != 2:
        raise ValueError(f"scores must be an (n rollouts, K stages) matrix, got shape {tuple(scores.shape)}")
    return stage_advantages(credit_scores(scores, mode), credit_lambda(mode, scores.shape[1]), eps)


def group_advantages(rewards: Tensor, eps: float = 1e-6) -> Tensor:
    """Plain GRPO normalisation of one group's scalar rewards (reflection candidates, D9).

    Same rule as D4: population std, `eps` added, a group with zero std gets exactly 0. NaN marks a candidate
    without a reward (invalid output, judge failure): it gets advantage 0 and is left out of the mean and std, so
    the rest are normalised among themselves. Fewer than two valid rewards give all zeros.

    Args:
        rewards: (m,) rewards u of the m candidates; NaN for unscored ones.
        eps: Added to the std.

    Returns:
        (m,) advantages in the rewards' floating dtype; never NaN.

    Raises:
        ValueError: If rewards is not 1-D, contains inf, or eps is negative or non-finite.
    """
    _check_real("rewards", rewards)
    if rewards.ndim != 1:
        raise ValueError(f"rewards must be a 1-D (m,) vector, got shape {tuple(rewards.shape)}")
    if bool(torch.isinf(rewards).any()):
        raise ValueError("rewards contain inf; use NaN for a candidate without a reward")
    _check_eps(eps)
    r = rewards.to(torch.float64)  # (m,)
    valid = ~torch.isnan(r)  # (m,)
    out = torch.zeros_like(r)
    if int(valid.sum()) > 0:
        adv = _normalise_columns(r[valid].unsqueeze(1), eps).squeeze(1)  # (m_valid,)
        out[valid] = adv
    return out.to(_float_dtype(rewards))
