"""The in-process decoder's loop guard: pure token arithmetic, no model."""

from __future__ import annotations

from learning.engines.sampling import LOOP_REPEATS, LOOP_WINDOW, LoopGuard


def _first_stop(tokens: list[int], guard: LoopGuard) -> int | None:
    """How many tokens were sampled when the guard fired (None: never)."""
    ids: list[int] = []
    for t in tokens:
        ids.append(t)
        if guard.looping(ids):
            return len(ids)
    return None


def test_a_verbatim_loop_stops_once_its_window_was_sampled_three_times() -> None:
    prefix = list(range(1000, 1040))  # 40 distinct tokens of ordinary text
    period = [7, 8, 9, 10, 11]
    tokens = prefix + period * 40
    # The window ending at token k repeats every 5 tokens once the loop fills a whole window: the first window made
    # only of loop tokens ends at 40 + 32, its copies at +5 and +10.
    assert (LOOP_WINDOW, LOOP_REPEATS) == (32, 3)
    assert _first_stop(tokens, LoopGuard()) == 40 + 32 + 5 + 5


def test_one_repeated_token_and_a_long_period_both_stop() -> None:
    assert _first_stop([5] * 100, LoopGuard()) == 32 + 2
    long_period = list(range(50))  # a copied 50-token passage, three times over
    assert _first_stop(long_period * 3, LoopGuard()) == 32 + 50 + 50


def test_text_that_repeats_a_window_only_twice_runs_on() -> None:
    quote = list(range(40))
    tokens = quote + list(range(100, 140)) + quote + list(range(200, 300))  # quoted once more, then new text
    assert _first_stop(tokens, LoopGuard()) is None
    assert _first_stop(list(range(500)), LoopGuard()) is None
