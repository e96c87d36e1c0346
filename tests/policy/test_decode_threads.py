"""The embedded policy's thread counts (learning/engines/threads.py): chosen from measured timings, cached per machine
key, fixed counts honoured, and the same greedy tokens whatever the counts."""

from __future__ import annotations

import asyncio
import json
import threading
from pathlib import Path
from typing import Any

import pytest

from agent.protocols import ChatMessage
from learning.engines import threads as th
from learning.engines.local_policy import TransformersPolicyClient
from learning.engines.threads import ThreadPlan

MESSAGES = [ChatMessage("system", "You are a helpful assistant."),
            ChatMessage("user", "Name the colours of the rainbow, one per line.")]


def _run(coro: Any) -> Any:
    return asyncio.run(coro)


# -- choosing ------------------------------------------------------------------------------------------------------


def test_choose_takes_the_fastest_and_prefers_fewer_threads_on_a_tie() -> None:
    assert th.choose({1: 0.050, 2: 0.061}) == 1  # the 2-core machine's decode step
    assert th.choose({1: 0.300, 2: 0.170, 4: 0.120, 8: 0.125}) == 4
    assert th.choose({1: 0.100, 2: 0.099}) == 1  # 1 % faster is within the tolerance: fewer threads win
    assert th.choose({1: 0.100, 2: 0.090}) == 2
    assert th.choose({3: 1.0}) == 3
    with pytest.raises(ValueError):
        th.choose({})


def test_candidate_counts_cover_the_cpus_up_to_the_cap() -> None:
    assert th.candidate_counts(1) == [1]
    assert th.candidate_counts(2) == [1, 2]
    assert th.candidate_counts(8) == list(range(1, 9))
    many = th.candidate_counts(64)
    assert len(many) == th.MAX_CANDIDATES and many[0] == 1 and many[-1] == 64 and many == sorted(set(many))


class _FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_measure_plan_picks_each_phase_from_its_own_timings_and_restores_the_count() -> None:
    """Decode fastest on 1 thread, prompts on 2: the plan follows the timings, one phase at a time."""
    import torch

    clock = _FakeClock()
    decode_s = {1: 0.050, 2: 0.060}
    prefill_s = {1: 0.400, 2: 0.220}

    def decode_step() -> None:
        clock.now += decode_s[torch.get_num_threads()]

    def prefill() -> None:
        clock.now += prefill_s[torch.get_num_threads()]

    before = torch.get_num_threads()
    plan = th.measure_plan([1, 2], decode_step, prefill, clock=clock)
    assert (plan.decode, plan.prefill, plan.source) == (1, 2, "measured")
    assert plan.timings == {"decode": {"1": 0.05, "2": 0.06}, "prefill": {"1": 0.4, "2": 0.22}}
    assert torch.get_num_threads() == before


def test_measure_plan_drops_a_hopeless_count_and_keeps_to_its_budget() -> None:
    """A count whose decode step is many times slower (a thread team on cores other processes hold) is not timed
    again, and rounds stop once the budget is spent."""
    import torch

    clock = _FakeClock()
    calls: dict[int, int] = {}

    def decode_step() -> None:
        n = torch.get_num_threads()
        calls[n] = calls.get(n, 0) + 1
        clock.now += {1: 0.06, 2: 2.4}[n]

    plan = th.measure_plan([1, 2], decode_step, lambda: None, budget_s=0.5, rounds=100, clock=clock)
    assert plan.decode == 1 and calls[2] == 1 and "2" not in plan.timings["prefill"]
    assert calls[1] < 100  # the budget ended the rounds


# -- caching -------------------------------------------------------------------------------------------------------


def test_plan_is_cached_and_measured_again_for_another_key(tmp_path: Path) -> None:
    path = tmp_path / "models" / th.PLAN_FILENAME
    measured: list[str] = []

    def measure(plan: ThreadPlan) -> Any:
        def run() -> ThreadPlan:
            measured.append("x")
            return plan

        return run

    first = th.cached_plan(path, "cpu A | bfloat16", measure(ThreadPlan(1, 2, "measured", {"decode": {"1": 0.05}})))
    assert first.source == "measured" and len(measured) == 1 and path.is_file()
    again = th.cached_plan(path, "cpu A | bfloat16", measure(ThreadPlan(7, 7, "measured")))
    assert (again.decode, again.prefill, again.source) == (1, 2, "cached") and len(measured) == 1
    assert again.timings == {"decode": {"1": 0.05}}
    other = th.cached_plan(path, "cpu A | float32", measure(ThreadPlan(2, 2, "measured")))  # a new key measures
    assert (other.decode, other.source) == (2, "measured") and len(measured) == 2
    assert set(json.loads(path.read_text())) == {"cpu A | bfloat16", "cpu A | float32"}  # both kept
    path.write_text("{not json")
    assert th.cached_plan(path, "cpu A | bfloat16", measure(ThreadPlan(3, 3, "measured"))).decode == 3


def test_plan_in_an_unwritable_place_is_measured_without_failing(tmp_path: Path) -> None:
    """A model folder whose parent cannot hold the plan (here: the parent is a file, which stops root too)."""
    blocker = tmp_path / "not-a-folder"
    blocker.write_text("")
    measured: list[int] = []

    def measure() -> ThreadPlan:
        measured.append(1)
        return ThreadPlan(1, 1, "measured")

    for _ in range(2):
        assert th.cached_plan(blocker / th.PLAN_FILENAME, "k", measure).decode == 1
    assert len(measured) == 2  # nothing stored: measured at every start


def test_machine_key_names_cpu_count_torch_and_dtype() -> None:
    import torch

    key = th.machine_key("bfloat16", "smollm2")
    assert f"{th.available_cpus()}cpu" in key and torch.__version__ in key and "bfloat16" in key
    assert th.machine_key("float32", "smollm2") != key


# -- the client ----------------------------------------------------------------------------------------------------


@pytest.fixture
def model_in_tmp(smollm2_dir: Path, tmp_path: Path) -> Path:
    """The converted model under a folder of its own, so the plan file lands in tmp_path."""
    link = tmp_path / "models" / smollm2_dir.name
    link.parent.mkdir()
    link.symlink_to(smollm2_dir, target_is_directory=True)
    return link


def _no_probe(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(self: Any) -> ThreadPlan:
        raise AssertionError("the client measured although it should not have")

    monkeypatch.setattr(TransformersPolicyClient, "_probe_threads", refuse)


def test_explicit_count_is_honoured_in_every_phase(smollm2_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """threads=N: no measuring, N threads for the prompt and every decode step; `prefill_threads` overrides the
    prompt's count; the worker thread gets its own count back after the request."""
    import torch

    _no_probe(monkeypatch)
    seen: list[tuple[int, int]] = []  # (new tokens, threads) per forward

    def client_with(**kw: Any) -> TransformersPolicyClient:
        client = TransformersPolicyClient(smollm2_dir, **kw)
        model_forward = client._model.forward

        def spy(*args: Any, **kwargs: Any) -> Any:
            seen.append((int(kwargs["input_ids"].shape[1]), torch.get_num_threads()))
            return model_forward(*args, **kwargs)

        client._model.forward = spy
        return client

    for kw, prompt_threads in (({"threads": 1}, 1), ({"threads": 1, "prefill_threads": 2}, 2)):
        seen.clear()
        client = client_with(**kw)
        assert client.threads == ThreadPlan(1, prompt_threads, "fixed")
        ctx = _run(client.render_prompt(MESSAGES))
        after: list[int] = []

        def request() -> None:
            torch.set_num_threads(2)
            client._generate_locked(ctx.token_ids, (), 4, 0.0, None)
            after.append(torch.get_num_threads())

        t = threading.Thread(target=request)
        t.start()
        t.join(120)
        assert seen[0] == (len(ctx.token_ids), prompt_threads)
        assert seen[1:] and all(s == (1, 1) for s in seen[1:])
        assert after == [2]
        _run(client.aclose())


def test_measured_counts_come_from_the_plan_file_and_give_the_same_greedy_tokens(
    model_in_tmp: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """threads=None measures once per machine key (a real probe), stores the plan next to the model, and later
    clients read it; generation on the measured counts gives the greedy tokens of torch's default count."""
    import torch

    default = torch.get_num_threads()
    measured = TransformersPolicyClient(model_in_tmp)
    plan_file = model_in_tmp.parent / th.PLAN_FILENAME
    assert measured.threads.source == "measured" and plan_file.is_file()
    key = th.machine_key("bfloat16", model_in_tmp.name)
    assert json.loads(plan_file.read_text())[key]["decode"] == measured.threads.decode
    _no_probe(monkeypatch)
    cached = TransformersPolicyClient(model_in_tmp, threads=0)
    assert cached.threads.source == "cached"
    assert (cached.threads.decode, cached.threads.prefill) == (measured.threads.decode, measured.threads.prefill)
    before = TransformersPolicyClient(model_in_tmp, threads=default)  # what every phase ran before
    try:
        ctx = _run(before.render_prompt(MESSAGES))
        want = _run(before.generate(ctx, stop=[], max_tokens=8, temperature=0.0))
        got = _run(measured.generate(ctx, stop=[], max_tokens=8, temperature=0.0))
        assert got.token_ids == want.token_ids
        assert got.logprobs == pytest.approx(want.logprobs, abs=0.1)  # bf16 products split over other threads
    finally:
        for client in (measured, cached, before):
            _run(client.aclose())


def test_bad_thread_counts_are_refused(smollm2_dir: Path) -> None:
    for bad in (-1, 1.5, True):
        with pytest.raises(ValueError, match="threads must be an int"):
            TransformersPolicyClient(smollm2_dir, threads=bad)  # type: ignore[arg-type]
