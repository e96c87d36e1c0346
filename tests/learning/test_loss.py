"""PPO-clip + KL3 policy loss with a token-level masked mean (METHOD.md §5.5, D5, D6)."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from learning.loss import LOG_RATIO_CLAMP, policy_loss, tis_weights

FAST = settings(max_examples=60, deadline=None)
NAN = float("nan")
INF = float("inf")

METRIC_KEYS = {"clip_fraction", "kl", "ratio_mean", "ratio_min", "ratio_max", "n_tokens", "pg_loss", "advantage_mean",
               "is_weight_mean"}


def _leaf(values: list[float] | torch.Tensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    return torch.as_tensor(values, dtype=dtype).clone().requires_grad_(True)


def test_hand_computed_example() -> None:
    # Token 3 is masked and holds garbage; the rest are worked out by hand below.
    logprobs = _leaf([-1.0, -0.5, -2.0, NAN, -0.1])
    old = torch.tensor([-1.0, -1.0, -1.5, INF, -0.3])
    ref = torch.tensor([-1.2, -0.5, -1.0, NAN, -0.1])
    adv = torch.tensor([1.0, 2.0, -1.0, NAN, -0.5])
    mask = torch.tensor([1, 1, 1, 0, 1])
    loss, metrics = policy_loss(logprobs, old, ref, adv, mask, clip=0.2, beta=0.1)

    # Token 0: ρ = 1, A = 1 -> surrogate 1.
    # Token 1: ρ = e^0.5 = 1.6487 > 1.2, A = 2 -> clipped: 1.2·2 = 2.4.
    # Token 2: ρ = e^-0.5 = 0.6065 < 0.8, A = -1 -> clipped: min(-0.6065, -0.8) = -0.8.
    # Token 4: ρ = e^0.2 = 1.2214, A = -0.5 -> unclipped is smaller: -0.6107.
    surrogate = [1.0, 2.4, -0.8, -0.5 * math.exp(0.2)]
    # k3 = e^d - d - 1 with d = ref - logprobs = (-0.2, 0, 1, 0).
    k3 = [math.exp(-0.2) + 0.2 - 1, 0.0, math.e - 2, 0.0]
    expected = sum(-s + 0.1 * k for s, k in zip(surrogate, k3)) / 4
    assert loss.item() == pytest.approx(expected, abs=1e-6)
    assert loss.item() == pytest.approx((-1.0 - 2.4 + 0.8 + 0.61070138 + 0.1 * (0.01873075 + 0.71828183)) / 4, abs=1e-6)

    assert set(metrics) == METRIC_KEYS and all(isinstance(v, float) for v in metrics.values())
    assert metrics["n_tokens"] == 4.0
    assert metrics["clip_fraction"] == pytest.approx(0.5)
    assert metrics["kl"] == pytest.approx(sum(k3) / 4, abs=1e-6)
    assert metrics["pg_loss"] == pytest.approx(-sum(surrogate) / 4, abs=1e-6)
    assert metrics["advantage_mean"] == pytest.approx(1.5 / 4)
    assert metrics["ratio_min"] == pytest.approx(math.exp(-0.5), rel=1e-6)
    assert metrics["ratio_max"] == pytest.approx(math.exp(0.5), rel=1e-6)
    assert metrics["ratio_mean"] == pytest.approx((1 + math.exp(0.5) + math.exp(-0.5) + math.exp(0.2)) / 4, rel=1e-6)

    loss.backward()
    grad = logprobs.grad
    assert grad is not None and torch.isfinite(grad).all()
    # d/dlogp of (−ρA + β·k3)/N: clipped tokens lose the policy term; k3' = 1 − e^d.
    expected_grad = [
        (-1.0 + 0.1 * (1 - math.exp(-0.2))) / 4,
        0.0,
        0.1 * (1 - math.e) / 4,
        0.0,
        (0.5 * math.exp(0.2)) / 4,
    ]
    assert grad.tolist() == pytest.approx(expected_grad, abs=1e-6)
    assert grad[3].item() == 0.0


def test_clip_fraction_on_crafted_tokens() -> None:
    log_ratio = torch.log(torch.tensor([1.5, 0.5, 1.5, 1.1, 0.5, 3.0]))
    adv = torch.tensor([1.0, -1.0, -1.0, 1.0, 1.0, 1.0])
    # 1.5 & A>0: clipped.  0.5 & A<0: clipped.  1.5 & A<0: unclipped term is smaller.  1.1: inside.
    # 0.5 & A>0: unclipped term is smaller.  The last token (ρ = 3) is masked and must not count.
    mask = torch.tensor([True, True, True, True, True, False])
    old = torch.zeros(6)
    _, metrics = policy_loss(_leaf(log_ratio), old, log_ratio.clone(), adv, mask)
    assert metrics["clip_fraction"] == pytest.approx(2 / 5)
    assert metrics["ratio_max"] == pytest.approx(1.5, rel=1e-6)
    assert metrics["ratio_min"] == pytest.approx(0.5, rel=1e-6)


@FAST
@given(
    rows=st.integers(1, 3),
    cols=st.integers(1, 12),
    data=st.data(),
)
def test_on_policy_without_kl_is_minus_the_mean_advantage(rows: int, cols: int, data: st.DataObject) -> None:
    n = rows * cols
    lp = data.draw(st.lists(st.floats(-30, 0), min_size=n, max_size=n))
    adv = data.draw(st.lists(st.floats(-5, 5), min_size=n, max_size=n))
    mask = data.draw(st.lists(st.booleans(), min_size=n, max_size=n))
    logprobs = torch.tensor(lp, dtype=torch.float64).reshape(rows, cols)
    advantages = torch.tensor(adv, dtype=torch.float64).reshape(rows, cols)
    m = torch.tensor(mask).reshape(rows, cols)
    loss, metrics = policy_loss(_leaf(logprobs, torch.float64), logprobs, logprobs, advantages, m)
    count = int(m.sum())
    expected = -advantages[m].sum().item() / count if count else 0.0
    assert loss.item() == pytest.approx(expected, abs=1e-12)
    assert metrics["n_tokens"] == count
    assert metrics["kl"] == 0.0 and metrics["clip_fraction"] == 0.0
    assert metrics["ratio_min"] == metrics["ratio_max"] == metrics["ratio_mean"] == 1.0
    assert metrics["advantage_mean"] == pytest.approx(-expected, abs=1e-12)


def test_token_level_mean_over_the_whole_batch() -> None:
    # D5 (DAPO): Σ over every trainable token / their number, not a mean of per-sequence means.
    logprobs = torch.tensor([[-1.0, -1.0, -1.0, -1.0], [-1.0, -1.0, -1.0, -1.0]])
    adv = torch.tensor([[1.0, 1.0, 1.0, 1.0], [4.0, 0.0, 0.0, 0.0]])
    mask = torch.tensor([[1, 1, 1, 1], [1, 0, 0, 0]])
    loss, metrics = policy_loss(_leaf(logprobs), logprobs, logprobs, adv, mask)
    assert loss.item() == pytest.approx(-(4 * 1.0 + 4.0) / 5)  # per-sequence means would give -(1 + 4) / 2
    flat, _ = policy_loss(
        _leaf(logprobs.flatten()), logprobs.flatten(), logprobs.flatten(), adv.flatten(), mask.flatten()
    )
    assert flat.item() == pytest.approx(loss.item())
    assert metrics["n_tokens"] == 5.0


def test_bool_and_float_masks_agree() -> None:
    lp = torch.tensor([-0.3, -1.7, -0.2])
    old = torch.tensor([-0.4, -1.0, -0.2])
    ref = torch.tensor([-0.5, -1.5, -0.1])
    adv = torch.tensor([0.5, -1.0, 2.0])
    a, ma = policy_loss(_leaf(lp), old, ref, adv, torch.tensor([True, False, True]))
    b, mb = policy_loss(_leaf(lp), old, ref, adv, torch.tensor([1.0, 0.0, 1.0]))
    assert a.item() == b.item() and ma == mb


EXTREME = st.one_of(st.sampled_from([-1e4, -1e-8, -50.0, 0.0, -1.0, -700.0]), st.floats(-1e4, 0))
GARBAGE = st.sampled_from([NAN, INF, -INF, 1e30])


@FAST
@given(
    n=st.integers(1, 16),
    dtype=st.sampled_from([torch.float32, torch.float64, torch.bfloat16]),
    data=st.data(),
)
def test_gradients_finite_for_extreme_logprobs_and_masked_garbage(
    n: int, dtype: torch.dtype, data: st.DataObject
) -> None:
    mask = torch.tensor(data.draw(st.lists(st.booleans(), min_size=n, max_size=n)))

    def column(values: st.SearchStrategy[float]) -> torch.Tensor:
        drawn = data.draw(st.lists(values, min_size=n, max_size=n))
        junk = data.draw(st.lists(GARBAGE, min_size=n, max_size=n))
        # Trainable positions get extreme-but-valid values; masked ones get NaN/inf/huge garbage.
        return torch.where(mask, torch.tensor(drawn), torch.tensor(junk)).to(dtype)

    logprobs = column(EXTREME).requires_grad_(True)
    old, ref = column(EXTREME), column(EXTREME)
    adv = column(st.floats(-10, 10))
    loss, metrics = policy_loss(logprobs, old, ref, adv, mask)
    assert torch.isfinite(loss)
    assert all(math.isfinite(v) for v in metrics.values())
    assert metrics["ratio_max"] <= math.exp(LOG_RATIO_CLAMP) * (1 + 1e-6)
    loss.backward()
    grad = logprobs.grad
    assert grad is not None and torch.isfinite(grad).all()
    assert torch.equal(grad[~mask], torch.zeros_like(grad[~mask]))


def test_no_trainable_tokens_gives_zero_loss_that_still_backpropagates() -> None:
    logprobs = _leaf([NAN, -1.0, INF])
    loss, metrics = policy_loss(logprobs, torch.zeros(3), torch.full((3,), NAN), torch.ones(3), torch.zeros(3))
    assert loss.item() == 0.0
    assert loss.grad_fn is not None
    loss.backward()
    assert logprobs.grad is not None
    assert torch.equal(logprobs.grad, torch.zeros(3))
    assert metrics["n_tokens"] == 0.0 and metrics["clip_fraction"] == 0.0 and metrics["kl"] == 0.0
    assert all(math.isfinite(v) for v in metrics.values())

    empty = _leaf(torch.zeros(1, 0))
    loss, metrics = policy_loss(empty, torch.zeros(1, 0), torch.zeros(1, 0), torch.zeros(1, 0), torch.zeros(1, 0))
    loss.backward()
    assert loss.item() == 0.0 and metrics["n_tokens"] == 0.0


def test_kl3_penalty_is_non_negative_and_pulls_towards_the_reference() -> None:
    logprobs = _leaf([-1.0, -3.0])
    ref = torch.tensor([-2.0, -1.0])
    loss, metrics = policy_loss(logprobs, logprobs.detach(), ref, torch.zeros(2), torch.ones(2), beta=1.0)
    k3 = [math.exp(-1) + 1 - 1, math.exp(2) - 2 - 1]
    assert metrics["kl"] == pytest.approx(sum(k3) / 2, rel=1e-6) and min(k3) >= 0
    loss.backward()
    assert logprobs.grad is not None
    # Gradient descent lowers logp where it is above the reference and raises it where it is below.
    assert logprobs.grad[0] > 0 and logprobs.grad[1] < 0


def test_log_ratio_is_clamped() -> None:
    logprobs = _leaf([0.0, -100.0])
    old = torch.tensor([-50.0, 0.0])
    loss, metrics = policy_loss(logprobs, old, logprobs.detach(), torch.tensor([-1.0, 1.0]), torch.ones(2))
    assert metrics["ratio_max"] == pytest.approx(math.exp(LOG_RATIO_CLAMP), rel=1e-5)
    assert metrics["ratio_min"] == pytest.approx(math.exp(-LOG_RATIO_CLAMP), rel=1e-5)
    assert torch.isfinite(loss)
    loss.backward()
    assert logprobs.grad is not None and torch.isfinite(logprobs.grad).all()


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"old_logprobs": torch.zeros(4)}, "shape"),
        ({"mask": torch.tensor([1, 0, 2])}, "0 and 1"),
        ({"mask": torch.tensor([1.0, 0.5, 0.0])}, "0 and 1"),
        ({"mask": torch.zeros(1, 1, 3)}, r"\(T,\) or \(B, T\)"),
        ({"advantages": torch.tensor([1, 0, 1])}, "floating"),
        ({"logprobs": torch.tensor([-1.0, NAN, -1.0])}, "logprobs"),
        ({"ref_logprobs": torch.tensor([-1.0, -1.0, INF])}, "ref_logprobs"),
        ({"advantages": torch.tensor([NAN, 0.0, 0.0])}, "advantages"),
        ({"clip": 0.0}, "clip"),
        ({"clip": 1.5}, "clip"),
        ({"beta": -0.1}, "beta"),
    ],
)
def test_bad_input_rejected(kwargs: dict[str, object], message: str) -> None:
    args: dict[str, object] = {
        "logprobs": torch.full((3,), -1.0),
        "old_logprobs": torch.full((3,), -1.0),
        "ref_logprobs": torch.full((3,), -1.0),
        "advantages": torch.zeros(3),
        "mask": torch.ones(3),
    }
    args.update(kwargs)
    with pytest.raises(ValueError, match=message):
        policy_loss(**args)  # type: ignore[arg-type]


def test_tis_weights_are_the_capped_ratio_of_trainer_to_sampler_and_one_where_there_is_nothing_to_correct() -> None:
    old = torch.tensor([[-1.0, -2.0, -0.5, -3.0, -1.0]])
    sampler = torch.tensor([[-1.5, -1.0, NAN, -9.0, -2.0]])
    mask = torch.tensor([[1, 1, 1, 1, 0]])
    w = tis_weights(old, sampler, mask, cap=2.0)
    # e^{0.5}; e^{-1}; no sampler value; e^{6} capped at 2; not trainable.
    assert torch.allclose(w, torch.tensor([[math.exp(0.5), math.exp(-1.0), 1.0, 2.0, 1.0]]))
    with pytest.raises(ValueError, match="TIS cap"):
        tis_weights(old, sampler, mask, cap=0.0)


def test_is_weights_scale_each_tokens_policy_gradient_and_not_the_kl() -> None:
    """On-policy (ρ = 1) without KL, d loss / d logp_t = −w_t·A_t / n: the weights scale each token's gradient."""
    lp = _leaf([-1.0, -2.0, -0.5])
    adv = torch.tensor([1.0, -2.0, 0.5])
    mask = torch.ones(3)
    w = torch.tensor([1.5, 0.25, 1.0])
    loss, m = policy_loss(lp, lp.detach(), lp.detach(), adv, mask, beta=0.0, is_weights=w)
    loss.backward()
    assert torch.allclose(lp.grad, -(w * adv) / 3)
    assert m["is_weight_mean"] == pytest.approx(float(w.mean()))
    # The KL3 term is not weighted: with the surrogate's advantages at 0 the weights change nothing.
    lp2, ref = _leaf([-1.0, -2.0, -0.5]), torch.tensor([-1.2, -1.0, -0.1])
    zero = torch.zeros(3)
    plain, _ = policy_loss(lp2, lp2.detach(), ref, zero, mask, beta=0.5)
    weighted, _ = policy_loss(lp2, lp2.detach(), ref, zero, mask, beta=0.5, is_weights=w)
    assert float(plain.detach()) == pytest.approx(float(weighted.detach())) and float(plain.detach()) > 0
    with pytest.raises(ValueError, match="is_weights"):
        policy_loss(lp2, lp2.detach(), ref, adv, mask, is_weights=torch.tensor([1.0, NAN, 1.0]))
