"""Λ-returns, stagewise normalisation, token mapping and the answer-only ablation (METHOD.md §5.3-5.6, D4, D7, D9)."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from learning.advantages import (
    CREDIT_MODES,
    PAPER_LAMBDA,
    answer_only_scores,
    credit_advantages,
    credit_lambda,
    credit_scores,
    group_advantages,
    identity_lambda,
    paper_lambda,
    stage_advantages,
    stage_returns,
    token_advantages,
)
from store.records import Turn, token_stages

FAST = settings(max_examples=60, deadline=None)

# Judge scores are rationals with small denominators (D3: Σ w·s' / 2Σw); a 1/24 grid keeps every difference of
# returns either exactly 0 or >= 1/120, so no example sits on the zero-std tolerance boundary.
GRID = 24


@st.composite
def score_groups(draw: st.DrawFn, min_n: int = 1, max_n: int = 8, k: int = 4) -> torch.Tensor:
    n = draw(st.integers(min_n, max_n))
    cells = draw(st.lists(st.integers(0, GRID), min_size=n * k, max_size=n * k))
    return torch.tensor(cells, dtype=torch.float64).reshape(n, k) / GRID


@st.composite
def causal_lambdas(draw: st.DrawFn, k: int = 4) -> torch.Tensor:
    lam = torch.zeros(k, k, dtype=torch.float64)
    for i in range(k):
        lam[i, i] = 1.0
        for j in range(i + 1, k):
            lam[i, j] = draw(st.integers(0, 5)) / 5
    return lam


WORKED_R = torch.tensor(
    [[0.50, 0.75, 0.50, 0.60], [0.75, 0.50, 1.00, 0.80], [0.25, 0.25, 0.00, 0.20], [0.50, 0.50, 0.50, 0.40]]
)
WORKED_G = torch.tensor(
    [[1.58, 1.43, 0.98, 0.60], [2.19, 1.54, 1.64, 0.80], [0.51, 0.41, 0.16, 0.20], [1.32, 1.02, 0.82, 0.40]]
)
WORKED_A = torch.tensor(
    [
        [0.298, 0.745, 0.152, 0.447],
        [1.310, 0.993, 1.406, 1.342],
        [-1.476, -1.558, -1.406, -1.342],
        [-0.133, -0.181, -0.152, -0.447],
    ]
)


# --- Λ ---------------------------------------------------------------------------------------------------------------


def test_paper_lambda_is_the_papers_matrix_and_a_fresh_copy() -> None:
    expected = [[1, 0.4, 0.6, 0.8], [0, 1, 0.4, 0.8], [0, 0, 1, 0.8], [0, 0, 0, 1]]
    lam = paper_lambda()
    assert lam.dtype == torch.float32 and PAPER_LAMBDA.dtype == torch.float32
    assert torch.allclose(lam, torch.tensor(expected))
    assert torch.equal(torch.tril(lam, -1), torch.zeros(4, 4)) and torch.equal(lam.diagonal(), torch.ones(4))
    lam[0, 1] = 99.0
    assert PAPER_LAMBDA[0, 1].item() == pytest.approx(0.4)


def test_identity_lambda() -> None:
    assert torch.equal(identity_lambda(), torch.eye(4))
    assert torch.equal(identity_lambda(2), torch.eye(2))
    with pytest.raises(ValueError, match="k >= 1"):
        identity_lambda(0)


# --- worked example (§5.6) ------------------------------------------------------------------------------------------


def test_worked_example_returns() -> None:
    g = stage_returns(WORKED_R, PAPER_LAMBDA)
    assert g.dtype == torch.float32
    assert torch.allclose(g, WORKED_G, atol=5e-4)
    assert torch.allclose(g.mean(0), torch.tensor([1.4, 1.1, 0.9, 0.5]), atol=1e-5)
    assert torch.allclose(g.std(0, correction=0), torch.tensor([0.6031, 0.4430, 0.5263, 0.2236]), atol=5e-5)
    # The hand-checked cell of the spec.
    assert g[0, 0].item() == pytest.approx(0.50 + 0.4 * 0.75 + 0.6 * 0.50 + 0.8 * 0.60, abs=1e-6)


def test_worked_example_advantages_to_3dp() -> None:
    a = stage_advantages(WORKED_R, PAPER_LAMBDA)
    assert a.shape == (4, 4) and a.dtype == torch.float32
    assert torch.allclose(a, WORKED_A, atol=5e-4)
    assert (torch.round(a * 1000) / 1000 - WORKED_A).abs().max() < 1e-6  # rounds to the table's digits
    # Rollout 1's Research tokens get more credit than its Answer tokens; terminal broadcast would give +0.447.
    assert a[0, 1] > a[0, 3]
    terminal = credit_advantages(WORKED_R, "answer-only")
    assert torch.allclose(terminal[0], torch.full((4,), 0.447), atol=5e-4)


# --- stage_returns ---------------------------------------------------------------------------------------------------


@FAST
@given(scores=score_groups(), lam=causal_lambdas())
def test_returns_match_the_definition(scores: torch.Tensor, lam: torch.Tensor) -> None:
    g = stage_returns(scores, lam)
    n, k = scores.shape
    for i in range(n):
        for kk in range(k):
            expected = sum(lam[kk, j].item() * scores[i, j].item() for j in range(kk, k))
            assert g[i, kk].item() == pytest.approx(expected, abs=1e-12)


def test_absent_later_stage_lowers_earlier_returns() -> None:
    # D7: a missing Answer stage is scored 0 and, through Λ, lowers every earlier stage's return.
    full = torch.tensor([[0.5, 0.5, 0.5, 1.0]])
    no_answer = torch.tensor([[0.5, 0.5, 0.5, 0.0]])
    drop = stage_returns(full, PAPER_LAMBDA) - stage_returns(no_answer, PAPER_LAMBDA)
    assert torch.allclose(drop, torch.tensor([[0.8, 0.8, 0.8, 1.0]]))


def test_integer_scores_are_accepted_as_float32() -> None:
    g = stage_returns(torch.tensor([[1, 0, 0, 1]]), PAPER_LAMBDA)
    assert g.dtype == torch.float32
    assert torch.allclose(g, torch.tensor([[1.8, 0.8, 0.8, 1.0]]))


@pytest.mark.parametrize(
    ("scores", "lam", "message"),
    [
        (torch.zeros(4), PAPER_LAMBDA, r"\(n rollouts, K stages\)"),
        (torch.zeros(2, 3), PAPER_LAMBDA, "K = 3"),
        (torch.zeros(2, 4), torch.zeros(4, 3), "square"),
        (torch.zeros(2, 4), PAPER_LAMBDA.T.contiguous(), "upper triangular"),
        (torch.zeros(2, 4), torch.full((4, 4), float("nan")), "NaN"),
        (torch.tensor([[0.5, float("nan"), 0.5, 0.5]]), PAPER_LAMBDA, "D7"),
        (torch.tensor([[0.5, float("inf"), 0.5, 0.5]]), PAPER_LAMBDA, "inf"),
        (torch.zeros(2, 4, dtype=torch.bool), PAPER_LAMBDA, "dtype"),
    ],
)
def test_returns_reject_bad_input(scores: torch.Tensor, lam: torch.Tensor, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        stage_returns(scores, lam)
    with pytest.raises(ValueError, match=message):
        stage_advantages(scores, lam)


def test_lower_triangle_error_names_the_entries() -> None:
    lam = paper_lambda()
    lam[3, 1] = 0.5
    with pytest.raises(ValueError, match=r"\(3, 1\)"):
        stage_returns(torch.zeros(2, 4), lam)


# --- stage_advantages: properties ------------------------------------------------------------------------------------


@FAST
@given(scores=score_groups(min_n=2), lam=causal_lambdas())
def test_advantages_sum_to_zero_per_stage(scores: torch.Tensor, lam: torch.Tensor) -> None:
    a = stage_advantages(scores, lam)
    assert torch.isfinite(a).all()
    assert torch.allclose(a.sum(0), torch.zeros(4, dtype=a.dtype), atol=1e-9)
    # Columns that are not flat have population std std/(std + eps), i.e. 1 up to eps.
    g = stage_returns(scores, lam)
    for k in range(4):
        std = g[:, k].std(correction=0).item()
        if std > 1e-3:
            assert a[:, k].std(correction=0).item() == pytest.approx(std / (std + 1e-6), rel=1e-9)


@FAST
@given(
    scores=score_groups(),
    lam=causal_lambdas(),
    shift=st.lists(st.floats(-10, 10, allow_nan=False), min_size=4, max_size=4),
)
def test_advantages_invariant_to_a_constant_per_stage(
    scores: torch.Tensor, lam: torch.Tensor, shift: list[float]
) -> None:
    # Adding c_j to every rollout's stage-j score shifts G[:, k] by lam[k, j]·c_j for all rollouts alike.
    shifted = scores + torch.tensor(shift, dtype=scores.dtype)
    assert torch.allclose(stage_advantages(shifted, lam), stage_advantages(scores, lam), atol=1e-7)


@FAST
@given(scores=score_groups(), lam=causal_lambdas(), data=st.data())
def test_advantages_permutation_equivariant(scores: torch.Tensor, lam: torch.Tensor, data: st.DataObject) -> None:
    perm = torch.tensor(data.draw(st.permutations(range(scores.shape[0]))))
    assert torch.allclose(stage_advantages(scores[perm], lam), stage_advantages(scores, lam)[perm], atol=1e-12)


@FAST
@given(scores=score_groups(min_n=1), lam=causal_lambdas(), data=st.data())
def test_flat_stages_get_exactly_zero(scores: torch.Tensor, lam: torch.Tensor, data: st.DataObject) -> None:
    # Make stages k..K-1 equal across rollouts: then G[:, k:] is flat and those advantages must be exactly 0.
    k = data.draw(st.integers(0, 3))
    scores = scores.clone()
    scores[:, k:] = scores[0, k:].clone()
    for dtype in (torch.float64, torch.float32):
        a = stage_advantages(scores.to(dtype), lam.to(dtype))
        assert not torch.isnan(a).any()
        assert torch.equal(a[:, k:], torch.zeros_like(a[:, k:]))


def test_flat_stage_with_inexact_float_values_is_zero() -> None:
    # 0.1 is inexact in binary; summing three of them in different orders would leave ~1e-17 of "spread".
    scores = torch.full((7, 4), 0.1)
    assert torch.equal(stage_advantages(scores, PAPER_LAMBDA), torch.zeros(7, 4))


def test_single_rollout_and_empty_group() -> None:
    assert torch.equal(stage_advantages(torch.tensor([[0.3, 0.9, 0.1, 0.7]]), PAPER_LAMBDA), torch.zeros(1, 4))
    empty = stage_advantages(torch.zeros(0, 4), PAPER_LAMBDA)
    assert empty.shape == (0, 4)


def test_negative_eps_rejected() -> None:
    with pytest.raises(ValueError, match="eps"):
        stage_advantages(WORKED_R, PAPER_LAMBDA, eps=-1.0)


# --- token_advantages ------------------------------------------------------------------------------------------------


@FAST
@given(
    stages=st.lists(st.integers(-1, 3), max_size=64),
    adv=st.lists(st.floats(-1e6, 1e6, allow_nan=False), min_size=4, max_size=4),
)
def test_token_advantages_map_each_token_to_its_stage(stages: list[int], adv: list[float]) -> None:
    out = token_advantages(torch.tensor(stages, dtype=torch.long), torch.tensor(adv, dtype=torch.float64))
    assert out.shape == (len(stages),) and out.dtype == torch.float64
    for t, s in enumerate(stages):
        if s == -1:
            assert out[t].item() == 0.0
        else:
            assert out[t].item() == adv[s]


def test_untrained_tokens_get_exactly_zero_from_recorded_turns() -> None:
    turns = [
        Turn("plan", "forced", "<structured_plan>", (1,)),
        Turn("plan", "sampled", "p", (2, 3)),
        Turn("research", "sampled", "r", (4,)),
        Turn("research", "tool_output", "<tool_output>..</tool_output>", (5, 6, 7)),
        Turn("review", "sampled", "v", (8,)),
        Turn("answer", "forced", "<answer>", (9,)),
        Turn("answer", "sampled", "a", (10, 11)),
    ]
    stages = torch.tensor(token_stages(turns))
    adv = torch.tensor([0.5, -2.0, 3.0, 7.0])
    out = token_advantages(stages, adv)
    assert out.tolist() == [0.0, 0.5, 0.5, -2.0, 0.0, 0.0, 0.0, 3.0, 0.0, 7.0, 7.0]
    # Every trained token belongs to exactly one stage; untrained ones get nothing.
    assert ((stages >= 0) == torch.tensor([t.trainable for t in turns for _ in t.token_ids])).all()


@pytest.mark.parametrize(
    ("stages", "adv", "message"),
    [
        (torch.tensor([0, 4]), torch.zeros(4), r"\[4\] outside -1..3"),
        (torch.tensor([0, -2]), torch.zeros(4), "outside"),
        (torch.tensor([0.0, 1.0]), torch.zeros(4), "integer"),
        (torch.tensor([[0, 1]]), torch.zeros(4), "1-D"),
        (torch.tensor([True, False]), torch.zeros(4), "booleans"),
        (torch.tensor([0, 1]), torch.zeros(2, 2), r"\(K,\)"),
        (torch.tensor([0, 1]), torch.tensor([0.0, float("nan")]), "NaN"),
    ],
)
def test_token_advantages_reject_bad_input(stages: torch.Tensor, adv: torch.Tensor, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        token_advantages(stages, adv)


def test_token_advantages_empty_sequence() -> None:
    out = token_advantages(torch.zeros(0, dtype=torch.long), torch.ones(4))
    assert out.shape == (0,)


# --- answer-only ablation --------------------------------------------------------------------------------------------


@FAST
@given(scores=score_groups())
def test_answer_only_with_identity_is_plain_grpo(scores: torch.Tensor) -> None:
    a = stage_advantages(answer_only_scores(scores), identity_lambda())
    answer = scores[:, -1]
    grpo = group_advantages(answer)
    if answer.std(correction=0) > 0:
        reference = (answer - answer.mean()) / (answer.std(correction=0) + 1e-6)
        assert torch.allclose(grpo, reference, atol=1e-12)
    for k in range(4):
        assert torch.allclose(a[:, k], grpo, atol=1e-12)
    assert torch.equal(credit_advantages(scores, "answer-only"), a)


def test_credit_modes_switch_lambda_and_scores() -> None:
    assert CREDIT_MODES == ("ss-grpo", "answer-only")
    assert torch.equal(credit_lambda("ss-grpo"), PAPER_LAMBDA)
    assert torch.equal(credit_lambda("answer-only"), torch.eye(4))
    assert torch.equal(credit_scores(WORKED_R, "ss-grpo"), WORKED_R)
    assert torch.equal(credit_scores(WORKED_R, "answer-only"), WORKED_R[:, 3:].expand(4, 4))
    assert torch.allclose(credit_advantages(WORKED_R, "ss-grpo"), WORKED_A, atol=5e-4)
    answer_only = credit_scores(WORKED_R, "answer-only")
    answer_only[0, 0] = 5.0  # a copy, not a view of the caller's scores
    assert WORKED_R[0, 3].item() == pytest.approx(0.6)
    for bad in ("grpo", ""):
        with pytest.raises(ValueError, match="unknown credit mode"):
            credit_lambda(bad)  # type: ignore[arg-type]
        with pytest.raises(ValueError, match="unknown credit mode"):
            credit_scores(WORKED_R, bad)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="4×4"):
        credit_lambda("ss-grpo", k=3)


# --- group_advantages (reflection candidates, D9) --------------------------------------------------------------------


def test_group_advantages_basic_and_zero_std() -> None:
    u = torch.tensor([0.2, 0.8, 0.5])
    a = group_advantages(u)
    std = u.double().std(correction=0).item()
    expected = [(x - 0.5) / (std + 1e-6) for x in (0.2, 0.8, 0.5)]
    assert a.tolist() == pytest.approx(expected, abs=1e-6)
    assert torch.equal(group_advantages(torch.full((5,), 0.7)), torch.zeros(5))
    assert torch.equal(group_advantages(torch.tensor([0.4])), torch.zeros(1))
    assert group_advantages(torch.zeros(0)).shape == (0,)


@FAST
@given(
    cells=st.lists(st.one_of(st.none(), st.integers(0, GRID)), min_size=1, max_size=10),
)
def test_group_advantages_excludes_nan_candidates(cells: list[int | None]) -> None:
    u = torch.tensor([float("nan") if c is None else c / GRID for c in cells], dtype=torch.float64)
    a = group_advantages(u)
    valid = ~torch.isnan(u)
    assert not torch.isnan(a).any()
    assert torch.equal(a[~valid], torch.zeros(int((~valid).sum()), dtype=a.dtype))
    # The valid candidates are normalised among themselves, exactly as if the NaN ones were never there.
    assert torch.equal(a[valid], group_advantages(u[valid]))
    assert abs(a.sum().item()) < 1e-9


def test_group_advantages_all_nan_and_bad_input() -> None:
    assert torch.equal(group_advantages(torch.full((3,), float("nan"))), torch.zeros(3))
    with pytest.raises(ValueError, match="inf"):
        group_advantages(torch.tensor([0.1, float("inf")]))
    with pytest.raises(ValueError, match="1-D"):
        group_advantages(torch.zeros(2, 2))
