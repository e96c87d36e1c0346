"""The embedded policy's decode kernels (learning/engines/decode_kernels.py) compute what transformers' eager path
computes.

The fast path (grouped-query attention read in place, ATen's native matrix-vector products) against the reference
path (eager attention with `repeat_kv`, oneDNN): the same token ids and log-probs for fixed seeds, greedy and
sampled, on the base weights and with a LoRA adapter, for one sequence and for a group.
"""

from __future__ import annotations

import asyncio
import shutil
from pathlib import Path
from typing import Any

import pytest

from agent.protocols import ChatMessage, PromptContext
from learning.engines.decode_kernels import gqa_attention, onednn_disabled
from learning.engines.local_policy import TransformersPolicyClient

REPO_ROOT = Path(__file__).resolve().parents[2]
SFT_ADAPTER = REPO_ROOT / "agent" / "adapters" / "smollm2-sft"
PASSAGE = " ".join(f"Item {i} is the colour number {i % 7} of the list." for i in range(60))
MESSAGES = [ChatMessage("system", "You are a helpful assistant."),
            ChatMessage("user", PASSAGE + "\nWhich colour number has item 41? Explain.")]


def _run(coro: Any) -> Any:
    return asyncio.run(coro)


@pytest.mark.parametrize("q_len", [1, 3])
def test_gqa_attention_equals_eager_attention(q_len: int) -> None:
    """Against transformers' own eager attention (which repeats the key/value heads), with a padding mask."""
    import torch
    from transformers.models.llama.modeling_llama import eager_attention_forward

    torch.manual_seed(0)
    b, kv_heads, groups, length, d = 2, 3, 3, 40, 16
    module = torch.nn.Module()
    module.num_key_value_groups = groups  # type: ignore[assignment]
    module.eval()
    query = torch.randn(b, kv_heads * groups, q_len, d, dtype=torch.float64)
    key = torch.randn(b, kv_heads, length, d, dtype=torch.float64)
    value = torch.randn(b, kv_heads, length, d, dtype=torch.float64)
    mask = torch.zeros(b, 1, q_len, length, dtype=torch.float64)
    mask[1, :, :, :5] = torch.finfo(torch.float64).min  # row 1 is left-padded
    mask[:, :, :, length - q_len:] += torch.triu(torch.full((q_len, q_len), -1e9, dtype=torch.float64), 1)
    for m in (None, mask):
        want, _ = eager_attention_forward(module, query, key, value, m, scaling=d ** -0.5)
        got, weights = gqa_attention(module, query, key, value, m, scaling=d ** -0.5)
        assert weights is None and got.shape == want.shape == (b, q_len, kv_heads * groups, d)
        assert torch.allclose(got, want, atol=1e-12), (got - want).abs().max()


def test_gqa_attention_refuses_what_it_does_not_compute() -> None:
    import torch

    module = torch.nn.Module()
    x = torch.zeros(1, 3, 1, 4)
    with pytest.raises(ValueError, match="plain causal attention only"):
        gqa_attention(module, x, x[:, :1], x[:, :1], None, scaling=1.0, sliding_window=4)


def test_onednn_switch_is_restored_even_on_error() -> None:
    import torch.backends.mkldnn as mkldnn

    before = bool(mkldnn.enabled)
    with pytest.raises(RuntimeError), onednn_disabled():
        assert not mkldnn.enabled
        raise RuntimeError("boom")
    assert bool(mkldnn.enabled) == before
    with onednn_disabled(active=False):
        assert bool(mkldnn.enabled) == before


def test_onednn_switch_survives_overlapping_holders_in_two_threads() -> None:
    """Two decoders in two threads, the first finishing while the second is still inside: oneDNN stays off until
    the last one leaves, and is on again after both (a naive save/restore would leave it off for good)."""
    import threading

    import torch.backends.mkldnn as mkldnn

    assert mkldnn.enabled
    inside, release = threading.Event(), threading.Event()
    seen: list[bool] = []

    def second() -> None:
        with onednn_disabled():
            inside.set()
            release.wait(10)
            seen.append(bool(mkldnn.enabled))

    with onednn_disabled():
        t = threading.Thread(target=second)
        t.start()
        assert inside.wait(10)
    assert not mkldnn.enabled  # the second holder is still inside
    release.set()
    t.join(10)
    assert seen == [False] and mkldnn.enabled


def _client(smollm2_dir: Path, dtype: str, fast: bool, adapter: Path | None) -> TransformersPolicyClient:
    """Both paths on torch's default thread count in every phase (the tolerances below were measured so; the
    measured per-phase counts of learning/engines/threads.py round bf16 products differently)."""
    import torch

    kernels = {"decode_attention": "gqa", "decode_matmul": "native"} if fast else \
        {"decode_attention": "eager", "decode_matmul": "onednn"}
    return TransformersPolicyClient(smollm2_dir, dtype=dtype, adapter_path=adapter, threads=torch.get_num_threads(),
                                    **kernels)


def _outputs(client: TransformersPolicyClient) -> list[Any]:
    ctx: PromptContext = _run(client.render_prompt(MESSAGES))
    greedy = _run(client.generate(ctx, stop=[], max_tokens=24, temperature=0.0))
    sampled = _run(client.generate(ctx, stop=[], max_tokens=24, temperature=1.0, seed=7))
    group = _run(client.generate_group(ctx, n=3, stop=[], max_tokens=16, temperature=1.0, seeds=[1, 2, 3]))
    return [greedy, sampled, *group]


@pytest.mark.parametrize("adapter", ["none", "sft"])
def test_fast_decode_equals_the_eager_path_fp32(smollm2_dir: Path, adapter: str, tmp_path: Path) -> None:
    """float32: identical token ids, log-probs equal to 1e-4, with and without the shipped LoRA adapter."""
    path = None
    if adapter == "sft":
        path = tmp_path / "sft"
        shutil.copytree(SFT_ADAPTER, path)
    runs = []
    for fast in (False, True):
        client = _client(smollm2_dir, "float32", fast, path)
        try:
            runs.append(_outputs(client))
        finally:
            _run(client.aclose())
    for ref, got in zip(*runs, strict=True):
        assert got.token_ids == ref.token_ids
        assert got.logprobs == pytest.approx(ref.logprobs, abs=1e-4)


def test_fast_decode_keeps_greedy_tokens_in_bf16(smollm2_dir: Path) -> None:
    """bfloat16, the embedded default with the shipped adapter: the same greedy tokens; the log-probs differ only
    by bf16 rounding of the products (the kernels sum in different orders)."""
    runs = []
    for fast in (False, True):
        client = _client(smollm2_dir, "bfloat16", fast, SFT_ADAPTER)
        try:
            ctx = _run(client.render_prompt(MESSAGES))
            runs.append(_run(client.generate(ctx, stop=[], max_tokens=24, temperature=0.0)))
        finally:
            _run(client.aclose())
    ref, got = runs
    assert got.token_ids == ref.token_ids
    # bf16 rounding depends on how the sums are split over threads: within 0.1 on 2 threads, and one token 0.106 off
    # on 1 (an xdist worker's share of 2 cores, 2026-12-07); greedy tokens are the same on both.
    assert got.logprobs == pytest.approx(ref.logprobs, abs=0.15)


def test_merged_adapter_serves_the_adapter_and_swaps_back_to_the_exact_base(smollm2_dir: Path, tmp_path: Path) -> None:
    """`merge_adapter`: the adapter folded into the weights serves what the unmerged adapter serves (float32: to
    rounding), and after swaps and an unload the base weights are exactly the original ones."""
    adapter = tmp_path / "sft"
    shutil.copytree(SFT_ADAPTER, adapter)
    plain = TransformersPolicyClient(smollm2_dir, dtype="float32")
    merged = TransformersPolicyClient(smollm2_dir, dtype="float32", merge_adapter=True)
    try:
        ctx = _run(plain.render_prompt(MESSAGES[:1] + [ChatMessage("user", "Who wrote the Iliad? Search first.")]))

        def greedy(client: TransformersPolicyClient) -> Any:
            return _run(client.generate(ctx, stop=[], max_tokens=12, temperature=0.0))

        base = greedy(plain)
        plain.load_adapter(adapter, "sft@1")
        want = greedy(plain)
        assert want.token_ids != base.token_ids  # the adapter changes what is generated
        for version in ("sft@1", "sft@2"):  # a swap unmerges the old adapter before the new one is merged
            merged.load_adapter(adapter, version)
            got = greedy(merged)
            assert got.policy_version == version and got.token_ids == want.token_ids
            assert got.logprobs == pytest.approx(want.logprobs, abs=1e-4)
            scored = _run(merged.score(ctx, got.token_ids, temperature=0.0))
            assert scored == pytest.approx(got.logprobs, abs=1e-4)
        merged.unload_adapter()
        again = greedy(merged)
        assert again.token_ids == base.token_ids and again.logprobs == base.logprobs  # bit for bit
    finally:
        _run(plain.aclose())
        _run(merged.aclose())


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"decode_attention": "flash"}, "decode_attention must be 'gqa', 'eager' or 'sdpa'"),
    ({"decode_matmul": "mkl"}, "decode_matmul must be 'native' or 'onednn'"),
])
def test_unknown_decode_kernels_are_refused_before_loading(smollm2_dir: Path, kwargs: dict[str, str],
                                                           message: str) -> None:
    with pytest.raises(ValueError, match=message):
        TransformersPolicyClient(smollm2_dir, **kwargs)  # type: ignore[arg-type]


def test_unknown_decode_kernel_setting_is_a_clear_configuration_error(monkeypatch: pytest.MonkeyPatch) -> None:
    from pydantic import ValidationError

    from app.settings import Settings

    monkeypatch.setenv("RUBRICEM_AGENT__EMBEDDED_DECODE_MATMUL", "mkl")
    with pytest.raises(ValidationError, match="embedded_decode_matmul"):
        Settings()
