"""The swap probe's decision (learning/swap_probe.py, issue 63), by hand-computed cases: the k3 distance, agreement
with the trainer within the engine gap, and a difference from the previous version's reading."""

from __future__ import annotations

import math

import pytest

from learning.swap_probe import ProbeReading, SwapNotVerified, describe, distances, judge_swap, k3

TOL = 0.05


def _reading(ids: tuple[int, ...], lps: tuple[float, ...]) -> ProbeReading:
    return ProbeReading(ids, lps)


def test_k3_is_the_trainers_estimate_and_skips_non_finite_positions() -> None:
    # Δ = reference − served = 1 nat: e − 2; Δ = 0: 0
    value, n = k3([-2.0, -1.0, math.nan], [-1.0, -1.0, -3.0])
    assert n == 2 and value == pytest.approx((math.e - 2) / 2)
    assert math.isnan(k3([], [])[0]) and k3([], [])[1] == 0
    assert math.isnan(k3([math.inf], [-1.0])[0])
    with pytest.raises(ValueError):
        k3([-1.0], [])


def test_a_good_swap_agrees_with_the_trainer_and_differs_from_the_previous_version() -> None:
    new = _reading((5, 6, 7), (-1.0, -2.0, -0.5))
    trainer = (-1.01, -1.98, -0.5)  # the engine's rounding
    previous = _reading((5, 6, 9), (-1.2, -2.5, -3.0))  # same first two ids, other log-probs, then another id
    verdict = judge_swap(new, trainer, previous, TOL)
    assert verdict.verified and verdict.reason == ""
    d = verdict.distances
    assert d.tokens == 3 and d.to_new < 1e-3
    assert d.shared == 2 and d.diverged_at == 2
    assert d.to_previous == pytest.approx(((math.exp(-0.2) + 0.2 - 1) + (math.exp(-0.5) + 0.5 - 1)) / 2)


def test_a_stale_swap_is_caught_by_identical_readings_even_when_the_trainer_cannot_tell() -> None:
    """The engine serves the previous weights: its readings before and after are identical. The trainer's new
    version is close enough to the previous one that the first test alone would pass."""
    same = _reading((5, 6, 7), (-1.0, -2.0, -0.5))
    trainer = (-1.001, -2.002, -0.5)
    verdict = judge_swap(same, trainer, _reading((5, 6, 7), (-1.0, -2.0, -0.5)), TOL)
    assert not verdict.verified and "still serves the previous weights" in verdict.reason
    assert verdict.distances.to_previous == 0.0 and verdict.distances.diverged_at is None


def test_identical_readings_pass_only_when_the_update_is_too_small_for_an_engine_to_show() -> None:
    """A real first training step moved the probe by about 0.001 nats/token and llama.cpp read both versions
    identically (make test, 2026-12-07): with the trainer's previous version as close as that, identical readings
    prove nothing and the swap passes; with an update an engine can show, they still fail it."""
    same = _reading((5, 6, 7), (-1.0, -2.0, -0.5))
    trainer_new = (-1.001, -2.002, -0.5)
    tiny = judge_swap(same, trainer_new, _reading((5, 6, 7), (-1.0, -2.0, -0.5)), TOL, (-1.0, -2.0, -0.5))
    assert tiny.verified
    visible = judge_swap(same, trainer_new, _reading((5, 6, 7), (-1.0, -2.0, -0.5)), TOL, (-1.4, -2.6, -0.1))
    assert not visible.verified and "still serves the previous weights" in visible.reason


def test_a_swap_far_from_the_trainers_version_is_caught() -> None:
    """The engine serves something else than the trainer's new version (e.g. the old adapter under the new name,
    when the versions differ much), although its reading differs from the previous one."""
    new = _reading((5, 6, 7), (-0.2, -0.3, -0.1))
    trainer = (-1.5, -2.0, -1.4)
    verdict = judge_swap(new, trainer, _reading((5, 6, 8), (-0.1, -0.3, -0.2)), TOL)
    assert not verdict.verified and "above the engine gap allowed (0.05)" in verdict.reason
    assert verdict.distances.to_new > TOL


def test_readings_that_differ_only_in_length_differ() -> None:
    new = _reading((5, 6), (-1.0, -2.0))
    verdict = judge_swap(new, (-1.0, -2.0), _reading((5, 6, 7), (-1.0, -2.0, -0.3)), TOL)
    assert verdict.verified and verdict.distances.diverged_at == 2 and verdict.distances.to_previous == 0.0


def test_no_tokens_or_no_comparable_tokens_is_never_verified() -> None:
    empty = judge_swap(_reading((), ()), (), _reading((5,), (-1.0,)), TOL)
    assert not empty.verified and "no probe token" in empty.reason
    nan = judge_swap(_reading((5,), (math.nan,)), (-1.0,), _reading((6,), (-1.0,)), TOL)
    assert not nan.verified and "finite" in nan.reason
    with pytest.raises(ValueError):
        judge_swap(_reading((5,), (-1.0,)), (), _reading((5,), (-1.0,)), TOL)
    with pytest.raises(ValueError):
        judge_swap(_reading((5,), (-1.0,)), (-1.0,), _reading((5,), (-1.0,)), 0.0)
    with pytest.raises(ValueError):
        ProbeReading((1, 2), (-1.0,))


def test_the_error_and_its_record_name_the_engine_the_replica_and_both_distances() -> None:
    d = distances(_reading((5, 6), (-1.0, -2.0)), (-1.5, -2.0), _reading((5, 6), (-1.0, -2.0)))
    text = describe(d, "policy@2", "policy@1", TOL)
    assert "trainer's policy@2: 0.05327" in text and "previous version policy@1: 0" in text and "same ids" in text
    err = SwapNotVerified("boom", version="policy@2", engine="vllm", replica="http://a:8000", distances=d,
                          after_swap=True)
    assert err.record() == {"version": "policy@2", "engine": "vllm", "replica": "http://a:8000", "after_swap": True,
                            "to_new": round(d.to_new, 6), "to_previous": 0.0, "tokens": 2, "shared": 2,
                            "diverged_at": None}


def test_a_stale_swap_far_from_the_trainer_gives_both_reasons() -> None:
    same = _reading((5, 6), (-0.2, -0.3))
    verdict = judge_swap(same, (-1.5, -2.0), _reading((5, 6), (-0.2, -0.3)), TOL)
    assert not verdict.verified
    assert "above the engine gap allowed" in verdict.reason and "still serves the previous weights" in verdict.reason
