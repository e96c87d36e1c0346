"""The compiled decode step (learning/engines/compiled_decode.py, `TransformersPolicyClient(compile=True)`).

Against today's eager kernels: the same greedy tokens, log-probs within bf16 rounding, prefix reuse across turns
over the static cache, cache buckets that grow, LoRA adapters swapped in without a new graph, and a failing compile
that falls back to the eager kernels with one warning. The inductor tests compile real graphs (minutes each on 2
cores the first time; inductor's on-disk cache makes later runs quick); the logic tests use dynamo's "eager"
backend (traced, not compiled) in float32, where the compiled path must agree with eager to float rounding.
"""

from __future__ import annotations

import asyncio
import logging
import shutil
import warnings
from pathlib import Path
from typing import Any

import pytest

from agent.protocols import ChatMessage, PromptContext
from learning.engines.compiled_decode import CompiledDecode
from learning.engines.local_policy import TransformersPolicyClient

REPO_ROOT = Path(__file__).resolve().parents[2]
SFT_ADAPTER = REPO_ROOT / "agent" / "adapters" / "smollm2-sft"
PASSAGE = " ".join(f"Item {i} is the colour number {i % 7} of the list." for i in range(60))
LONG = [ChatMessage("system", "You are a helpful assistant."),
        ChatMessage("user", PASSAGE + "\nWhich colour number has item 41? Explain.")]
SHORT = [ChatMessage("system", "You are a helpful assistant."),
         ChatMessage("user", "Name the colours of the rainbow, one per line.")]
# bf16: inductor keeps a fused kernel's intermediates in float32 where eager rounds every op's output to bf16, and
# sums the decomposed products in another order, so log-probs differ by more than between the eager kernels (0.1 in
# test_decode_kernels.py); measured up to 0.22 on these prompts. A near-tie can flip a greedy token the same way
# (eager decoding and an eager full forward disagree there too), so the prompts here are ones without such ties.
BF16_LOGPROB_ABS = 0.3


def _run(coro: Any) -> Any:
    return asyncio.run(coro)


def _greedy(client: TransformersPolicyClient, ctx: PromptContext, n: int = 24) -> Any:
    return _run(client.generate(ctx, stop=[], max_tokens=n, temperature=0.0))


def _scaled_copy(src: Path, dst: Path, factor: float) -> Path:
    """A copy of a LoRA adapter with its B matrices scaled: same rank, alpha and targets, other outputs."""
    from safetensors.torch import load_file, save_file

    shutil.copytree(src, dst)
    weights = load_file(str(dst / "adapter_model.safetensors"))
    save_file({k: v * factor if "lora_B" in k else v for k, v in weights.items()},
              str(dst / "adapter_model.safetensors"))
    return dst


@pytest.fixture(scope="module")
def alt_adapter(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _scaled_copy(SFT_ADAPTER, tmp_path_factory.mktemp("alt") / "alt", 1.5)


@pytest.fixture(scope="module")
def small_rank_adapter(smollm2_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A random r=4 LoRA on q/v only: not copyable into the shipped r=16 adapter."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    base: Any = AutoModelForCausalLM.from_pretrained(str(smollm2_dir), dtype=torch.float32)
    torch.manual_seed(3)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        model = get_peft_model(base, LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"],
                                                init_lora_weights=False))
    path = tmp_path_factory.mktemp("r4") / "r4"
    model.save_pretrained(str(path))
    return path


# -- inductor: the real compiled step -----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def pair(smollm2_dir: Path) -> Any:
    """(eager, compiled) bf16 clients on one thread with the shipped SFT adapter, the embedded default."""
    eager = TransformersPolicyClient(smollm2_dir, adapter_path=SFT_ADAPTER, version="sft", threads=1)
    compiled = TransformersPolicyClient(smollm2_dir, adapter_path=SFT_ADAPTER, version="sft", threads=1,
                                        compile=True)
    yield eager, compiled
    _run(eager.aclose())
    _run(compiled.aclose())


@pytest.mark.slow
def test_compiled_greedy_equals_eager_and_reuses_the_prefix_next_turn(pair: Any) -> None:
    eager, compiled = pair
    ctx = _run(eager.render_prompt(LONG))
    want, got = _greedy(eager, ctx), _greedy(compiled, ctx)
    assert got.token_ids == want.token_ids and len(got.token_ids) > 8
    assert got.logprobs == pytest.approx(want.logprobs, abs=BF16_LOGPROB_ABS)
    stats = compiled.compile_stats
    assert stats["enabled"] and stats["compiles"] == 1 and compiled.compile_seconds > 0
    assert stats["graphs"][0][0] == 1024  # ~860 prompt tokens + 24: the smallest bucket
    # the next turn extends the prompt: its prefix stays in the static cache and no new graph is needed
    tool = _run(eager.tokenize("\n<tool_output>Item 41 has colour number 6.</tool_output>\n"))
    ext = PromptContext("", ctx.token_ids + want.token_ids[:6] + tool)
    want2, got2 = _greedy(eager, ext, 16), _greedy(compiled, ext, 16)
    assert got2.token_ids == want2.token_ids
    assert got2.logprobs == pytest.approx(want2.logprobs, abs=BF16_LOGPROB_ABS)
    assert compiled._cache_static and compiled.compile_stats["compiles"] == 1


@pytest.mark.slow
def test_adapter_swap_copies_the_weights_without_a_new_graph(pair: Any, alt_adapter: Path) -> None:
    """A new adapter of the same shape is copied into the compiled graph's tensors: it serves exactly what an eager
    client that loaded it serves, and nothing compiles again (the backend is called once per new graph)."""
    eager, compiled = pair
    ctx = _run(eager.render_prompt(LONG))
    _greedy(compiled, ctx, 4)  # the graph exists (compiled here if this test runs alone)
    before = compiled.compile_stats["compiles"]
    sft = _greedy(eager, ctx)
    try:
        for client in pair:
            client.load_adapter(alt_adapter, "alt@1")
        want, got = _greedy(eager, ctx), _greedy(compiled, ctx)
        assert want.token_ids != sft.token_ids  # the swap changed the weights that serve
        assert got.policy_version == "alt@1" and got.token_ids == want.token_ids
        assert got.logprobs == pytest.approx(want.logprobs, abs=BF16_LOGPROB_ABS)
        assert compiled.compile_stats["compiles"] == before
    finally:
        for client in pair:
            client.load_adapter(SFT_ADAPTER, "sft@2")
    back = _greedy(compiled, ctx)
    assert back.token_ids == sft.token_ids and compiled.compile_stats["compiles"] == before


# -- fallback -----------------------------------------------------------------------------------------------------


def _broken_backend(gm: Any, example_inputs: Any) -> Any:
    raise RuntimeError("injected compiler failure")


@pytest.mark.slow
def test_failed_compile_falls_back_to_eager_with_one_warning(smollm2_dir: Path,
                                                             caplog: pytest.LogCaptureFixture) -> None:
    eager = TransformersPolicyClient(smollm2_dir, threads=1)
    broken = TransformersPolicyClient(smollm2_dir, threads=1, compile=True, compile_backend=_broken_backend)
    try:
        ctx = _run(eager.render_prompt(SHORT))
        want = _greedy(eager, ctx, 12)
        with caplog.at_level(logging.WARNING, logger="learning.engines.local_policy"):
            first, second = _greedy(broken, ctx, 12), _greedy(broken, ctx, 12)
        warned = [r for r in caplog.records if "compiled decode step is unavailable" in r.getMessage()]
        assert len(warned) == 1 and "injected compiler failure" in warned[0].getMessage()
        for got in (first, second):
            assert got.token_ids == want.token_ids and got.logprobs == want.logprobs  # today's kernels, bit for bit
        stats = broken.compile_stats
        assert not stats["enabled"] and stats["compiles"] == 1 and "injected" in stats["failure"]
    finally:
        _run(eager.aclose())
        _run(broken.aclose())


# -- the static cache's logic, traced by dynamo's eager backend, float32 -----------------------------------------


@pytest.mark.slow
def test_static_cache_buckets_grow_and_keep_the_prefix(smollm2_dir: Path) -> None:
    """Tiny buckets: a turn that outgrows its cache moves to the next bucket with the prefix copied, an unrelated
    prompt starts a fresh cache in the smallest bucket (its graph is reused), and a request too long for every
    bucket decodes eagerly; every result equals the eager client's to float32 rounding."""
    eager = TransformersPolicyClient(smollm2_dir, dtype="float32", threads=1)
    traced = TransformersPolicyClient(smollm2_dir, dtype="float32", threads=1, compile=True,
                                      compile_backend="eager", compile_buckets=(64, 128))

    def check(ctx: PromptContext, n: int) -> Any:
        want, got = _greedy(eager, ctx, n), _greedy(traced, ctx, n)
        assert got.token_ids == want.token_ids
        assert got.logprobs == pytest.approx(want.logprobs, abs=1e-4)
        return got

    try:
        ctx = _run(eager.render_prompt(SHORT))
        assert len(ctx.token_ids) + 12 <= 64
        first = check(ctx, 12)
        assert CompiledDecode.capacity(traced._cache) == 64 and traced.compile_stats["compiles"] == 1
        tool = _run(eager.tokenize("\n<tool_output>red, orange, yellow, green, blue, indigo, violet</tool_output>\n"))
        ext = PromptContext("", ctx.token_ids + first.token_ids + tool)
        assert 64 < len(ext.token_ids) + 12 <= 128
        check(ext, 12)
        assert CompiledDecode.capacity(traced._cache) == 128 and traced.compile_stats["compiles"] == 2
        assert traced._cache_ids[: len(ext.token_ids)] == list(ext.token_ids)
        check(_run(eager.render_prompt(SHORT[:1] + [ChatMessage("user", "Count to five.")])), 12)
        assert CompiledDecode.capacity(traced._cache) == 64 and traced.compile_stats["compiles"] == 2
        check(ctx, 100)  # 100 + the prompt exceed 128: this request decodes eagerly
        assert not traced._cache_static and traced.compile_stats["enabled"]
    finally:
        _run(eager.aclose())
        _run(traced.aclose())


def test_only_an_adapter_of_the_same_shape_is_copied_in(smollm2_dir: Path, alt_adapter: Path,
                                                        small_rank_adapter: Path) -> None:
    """With `compile`, the same rank/alpha/targets are copied into the loaded adapter (its PEFT name stays); any
    other adapter is loaded the ordinary way (a new name: the graph compiles again on the next step)."""
    client = TransformersPolicyClient(smollm2_dir, threads=1, compile=True, compile_backend="eager",
                                      adapter_path=SFT_ADAPTER, version="sft")
    try:
        assert client._adapter is not None
        name = client._adapter.name
        client.load_adapter(alt_adapter, "alt@1")
        assert client._adapter.name == name and client.policy_version == "alt@1"
        client.load_adapter(small_rank_adapter, "r4@1")
        assert client._adapter.name != name and client.policy_version == "r4@1"
    finally:
        _run(client.aclose())
