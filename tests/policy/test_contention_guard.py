"""Backing off to one thread while the cores are oversubscribed (`learning.engines.threads.ContentionGuard`): the
rule on its own with a hand-driven clock, then inside the real llama.cpp and torch engines, where a step slower than
the guard allows switches the next forward to one thread, the plan's count comes back after the back-off, and the
tokens are those of a one-thread client.

How slow a contended step really is (the reason for the guard) is measured by tests/benchmarks/contention.py, not
asserted here: tests never assert on wall-clock time. The engine tests make every step "slow" by giving the guard a
measured step of a nanosecond.
"""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path
from typing import Any

import pytest

from agent.protocols import ChatMessage
from learning.engines.threads import ContentionGuard, ThreadPlan

MESSAGES = [ChatMessage("system", "You are a helpful assistant."),
            ChatMessage("user", "Name the colours of the rainbow, one per line.")]


class _Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def _plan(decode: int = 2, prefill: int = 2, step_s: float = 0.010, source: str = "measured") -> ThreadPlan:
    return ThreadPlan(decode=decode, prefill=prefill, source=source,
                      timings={"decode": {"1": 0.016, "2": step_s}, "prefill": {"1": 0.45, "2": 0.30}})


def test_a_step_six_times_slower_than_measured_backs_off_to_one_thread_for_a_minute(
    caplog: pytest.LogCaptureFixture,
) -> None:
    clock = _Clock()
    guard = ContentionGuard(_plan(), "llama.cpp", clock=clock)
    assert guard.active and guard.expected_step_s == 0.010 and guard.counts() == (2, 2)
    assert not guard.observe(0.049, 1, 2)  # 4.9× the measured 10 ms: a long context, noise
    assert not guard.observe(0.45, 1, 2)  # 45×, but under the 0.5 s floor: a one-off stall, not the collapse
    assert guard.counts() == (2, 2) and guard.trips == 0
    with caplog.at_level(logging.INFO, logger="learning.engines.threads"):
        assert guard.observe(1.8, 1, 2)  # what a contended step measured (tests/benchmarks/contention.py)
        assert guard.counts() == (1, 1)
        assert not guard.observe(5.0, 1, 1)  # one thread is never "too many"
        clock.now += guard.backoff_s - 0.1
        assert guard.counts() == (1, 1)
        clock.now += 0.2
        assert guard.counts() == (2, 2)  # the plan's count is tried again
        assert guard.observe(2.0, 1, 2) and guard.counts() == (1, 1) and guard.trips == 2
    levels = [r.levelno for r in caplog.records if "oversubscribed" in r.getMessage()]
    assert levels == [logging.WARNING, logging.INFO]  # warned once, then noted
    assert "llama.cpp: a forward of 1 token(s) took 1.80 s on 2 threads (0.010 s on an idle machine)" in caplog.text


def test_a_prompt_is_judged_against_the_measured_prompt_scaled_by_its_length() -> None:
    guard = ContentionGuard(_plan(), "llama.cpp", clock=_Clock())  # a 64-token prompt: 0.30 s on 2 threads
    assert guard.expected_s(29) == pytest.approx(0.30)  # a shorter prompt is allowed the whole 64-token time
    assert guard.expected_s(512) == pytest.approx(2.40)
    assert not guard.observe(1.79, 29, 2) and not guard.observe(14.0, 512, 2)
    assert guard.observe(3.0, 29, 2)  # a contended 29-token prompt (every call took ~3 s)
    assert ContentionGuard(ThreadPlan(1, 2, "cached", timings={"prefill": {"2": 0.3}}), "torch").active
    assert ContentionGuard(ThreadPlan(2, 1, "cached", timings={"decode": {"2": 0.01}}), "torch").expected_s(64) is None


def test_trips_that_follow_each_other_double_the_back_off_up_to_ten_minutes() -> None:
    clock = _Clock()
    guard = ContentionGuard(_plan(), "llama.cpp", clock=clock)
    spans = []
    for _ in range(6):  # the neighbour stays: each retry of the plan's count trips at once
        assert guard.observe(3.0, 1, 2)
        spans.append(guard.until - clock.now)
        clock.now = guard.until + 1
    assert spans == [60, 120, 240, 480, 600, 600]
    clock.now += 2 * guard.backoff_s  # a quiet spell longer than a back-off
    assert guard.observe(3.0, 1, 2) and guard.until - clock.now == 60 and guard.streak == 1


def test_a_step_below_the_floor_never_trips_even_against_a_tiny_measurement() -> None:
    guard = ContentionGuard(_plan(step_s=0.001), "torch", clock=_Clock())
    assert not guard.observe(0.05, 1, 2)  # 50× of 1 ms: the stall that tripped `make demo` on an idle machine
    assert not guard.observe(0.5, 1, 2)  # at the 0.5 s floor: not yet
    assert guard.observe(0.51, 1, 2)
    slower = ContentionGuard(_plan(step_s=0.1), "torch", clock=_Clock())  # above the floor the factor decides
    assert not slower.observe(0.6, 1, 2)  # exactly 6× of 100 ms: not yet
    assert slower.observe(0.61, 1, 2)


def test_only_a_measured_plan_of_several_threads_gets_a_guard() -> None:
    assert ContentionGuard.for_plan(_plan(), "llama.cpp") is not None
    assert ContentionGuard.for_plan(_plan(source="cached"), "llama.cpp") is not None
    assert ContentionGuard.for_plan(_plan(decode=1, prefill=2), "llama.cpp") is not None  # prompts on 2 threads
    assert ContentionGuard.for_plan(_plan(source="fixed"), "llama.cpp") is None  # a count given by hand is honoured
    assert ContentionGuard.for_plan(_plan(decode=1, prefill=1), "llama.cpp") is None  # nothing to back off from
    assert ContentionGuard.for_plan(ThreadPlan(2, 2, "cached", timings={}), "llama.cpp") is None  # no measurement
    untimed = ThreadPlan(3, 3, "measured", timings={"decode": {"1": 0.02, "2": 0.015}})
    assert ContentionGuard.for_plan(untimed, "llama.cpp") is None  # no timing at the chosen count


# -- inside the engines --------------------------------------------------------------------------------------------


def _always_slow(clock: _Clock, engine: str) -> ContentionGuard:
    """A guard that finds every multi-thread step slow: its measured step is a nanosecond and it has no floor."""
    return ContentionGuard(_plan(step_s=1e-9), engine, floor_s=0.0, clock=clock)


def test_llamacpp_backs_off_on_a_slow_step_and_returns_to_the_plan_with_the_same_tokens(
    smollm2_dir: Path, smollm2_gguf: Path, tmp_path: Path
) -> None:
    pytest.importorskip("llama_cpp")
    from learning.engines.llamacpp_engine import EmbeddedLlamaCppClient

    one = EmbeddedLlamaCppClient(smollm2_dir, smollm2_gguf, lora_cache=tmp_path, threads=1, batch_threads=1)
    two = EmbeddedLlamaCppClient(smollm2_dir, smollm2_gguf, lora_cache=tmp_path, threads=2, batch_threads=2)
    try:
        assert two.engine.guard is None  # fixed counts: no guard of its own
        clock = _Clock()
        two.engine.guard = guard = _always_slow(clock, "llama.cpp")
        ctx = asyncio.run(one.render_prompt(MESSAGES))
        want = asyncio.run(one.generate(ctx, stop=[], max_tokens=12, temperature=0.0))
        got = asyncio.run(two.generate(ctx, stop=[], max_tokens=12, temperature=0.0))
        assert guard.trips == 1  # the first one-token step at 2 threads, and none after: the rest ran on one
        assert (two.engine.threads, two.engine.batch_threads) == (1, 1)
        assert got.token_ids == want.token_ids
        clock.now += guard.backoff_s + 1
        asyncio.run(two.generate(ctx, stop=[], max_tokens=4, temperature=0.0))
        assert guard.trips == 2  # back on 2 threads, and backed off again at the first step
    finally:
        for client in (one, two):
            asyncio.run(client.aclose())


def test_torch_backs_off_on_a_slow_step_and_its_decode_steps_run_one_thread(
    smollm2_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import torch

    from learning.engines.local_policy import TransformersPolicyClient

    client = TransformersPolicyClient(smollm2_dir, threads=2)
    seen: list[tuple[int, int]] = []  # (new tokens, threads) per forward
    forward = client._model.forward

    def spy(*args: Any, **kwargs: Any) -> Any:
        seen.append((int(kwargs["input_ids"].shape[1]), torch.get_num_threads()))
        return forward(*args, **kwargs)

    monkeypatch.setattr(client._model, "forward", spy)
    try:
        assert client._guard is None  # fixed counts
        clock = _Clock()
        client._guard = guard = _always_slow(clock, "torch")
        ctx = asyncio.run(client.render_prompt(MESSAGES))
        asyncio.run(client.generate(ctx, stop=[], max_tokens=6, temperature=0.0))
        assert seen[0] == (len(ctx.token_ids), 2)  # the prompt, on the plan's count
        assert seen[1] == (1, 2)  # the first step, on 2 threads: slow, so …
        assert seen[2:] and all(s == (1, 1) for s in seen[2:])  # … the rest on one
        assert guard.trips == 1
    finally:
        asyncio.run(client.aclose())
