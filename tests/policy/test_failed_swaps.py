"""A swap to a new policy version that fails part-way (issue 63, "Bad input and faults"): the version loaded before
keeps serving (the next generation is its own, under its name), nothing half-written is left where a later load would
trust it, and the error is the engines' `AdapterLoadError` naming the file that failed.

Every engine that serves an adapter in process, on real SmolLM2 weights: torch with the adapter applied and merged
into the weights, with the compiled step's hot swap; llama.cpp with a runtime GGUF LoRA and merged into a Q8_0 copy of
the model; and llama.cpp's saved system-message state. The faults are made at the file boundary only:

* an adapter's safetensors cut short (a copy or a save that stopped half-way);
* writes refused past a size (RLIMIT_FSIZE: the kernel answers EFBIG, as it answers ENOSPC on a full disk, to the
  write that crosses it). The tests run as root here, for whom a read-only folder refuses nothing;
* a cached GGUF that llama.cpp cannot load, recorded under its digest (a writer that stopped short without an error);
* an adapter of the loaded one's rank and targets whose file holds a matrix of another shape.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import resource
import shutil
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from agent.protocols import ChatMessage, Generation, PromptContext
from learning.engines.client import AdapterLoadError
from learning.engines.files import sha256_file
from learning.engines.gguf_lora import DIGEST_SUFFIX, GGUFConversionError, adapter_digest, convert_lora, recorded
from learning.engines.llamacpp_engine import EmbeddedLlamaCppClient
from learning.engines.local_policy import TransformersPolicyClient
from tests.adapters import scaled_adapter

REPO_ROOT = Path(__file__).resolve().parents[2]
SFT_ADAPTER = REPO_ROOT / "agent" / "adapters" / "smollm2-sft"
MESSAGES = [ChatMessage("system", "You are a helpful assistant."), ChatMessage("user", "Name three colors.")]
WRITE_LIMIT = 1 << 16  # bytes a file may grow to inside `writes_stop_at`: every file written here is larger


def _run(coro: Any) -> Any:
    return asyncio.run(coro)


@contextlib.contextmanager
def writes_stop_at(size: int) -> Iterator[None]:
    """Inside the block, a write of this process that would take a file past `size` bytes fails with EFBIG."""
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    handler = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # else the kernel's signal ends the process
    resource.setrlimit(resource.RLIMIT_FSIZE, (size, hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
        signal.signal(signal.SIGXFSZ, handler)


def _truncated(src: Path, dest: Path) -> Path:
    """A copy of the adapter folder `src` whose weights file stops half-way."""
    shutil.copytree(src, dest)
    weights = dest / "adapter_model.safetensors"
    data = weights.read_bytes()
    weights.write_bytes(data[: len(data) // 2])
    return dest


def _greedy(client: Any, ctx: PromptContext) -> Generation:
    return _run(client.generate(ctx, stop=[], max_tokens=12, temperature=0))


def _open_under(folder: Path) -> list[str]:
    """The files under `folder` this process still holds open (removed ones included)."""
    links = []
    for fd in os.listdir("/proc/self/fd"):
        with contextlib.suppress(OSError):
            links.append(os.readlink(f"/proc/self/fd/{fd}"))
    return [link for link in links if link.startswith(str(folder))]


def _serves_the_old(client: Any, ctx: Any, before: Any) -> Any:
    """After a refused swap: the client still names the old version ("sft") and its next greedy generation gives the
    same tokens as `before`, under that name. Returns that generation."""
    assert client.policy_version == "sft"
    after = _greedy(client, ctx)
    assert after.policy_version == "sft" and after.token_ids == before.token_ids
    return after


# -- one client per engine, each serving the SFT adapter as "sft"; every test leaves it so -----------------------------


@pytest.fixture(scope="module")
def torch_plain(smollm2_dir: Path) -> Iterator[TransformersPolicyClient]:
    client = TransformersPolicyClient(smollm2_dir, adapter_path=SFT_ADAPTER, version="sft", threads=1)
    yield client
    _run(client.aclose())


@pytest.fixture(scope="module")
def torch_merged(smollm2_dir: Path) -> Iterator[TransformersPolicyClient]:
    client = TransformersPolicyClient(smollm2_dir, adapter_path=SFT_ADAPTER, version="sft", threads=1,
                                      merge_adapter=True)
    yield client
    _run(client.aclose())


def _llama(smollm2_dir: Path, smollm2_gguf: Path, cache: Path, merge: bool) -> Iterator[EmbeddedLlamaCppClient]:
    client = EmbeddedLlamaCppClient(smollm2_dir, smollm2_gguf, adapter_path=SFT_ADAPTER, version="sft",
                                    lora_cache=cache, threads=1, batch_threads=1, merge_adapter=merge,
                                    persist_anchor=False)
    yield client
    _run(client.aclose())


@pytest.fixture(scope="module")
def llama_lora(smollm2_dir: Path, smollm2_gguf: Path, tmp_path_factory: pytest.TempPathFactory
               ) -> Iterator[EmbeddedLlamaCppClient]:
    yield from _llama(smollm2_dir, smollm2_gguf, tmp_path_factory.mktemp("lora"), merge=False)


@pytest.fixture(scope="module")
def llama_merged(smollm2_dir: Path, smollm2_gguf: Path, tmp_path_factory: pytest.TempPathFactory
                 ) -> Iterator[EmbeddedLlamaCppClient]:
    yield from _llama(smollm2_dir, smollm2_gguf, tmp_path_factory.mktemp("merged"), merge=True)


@pytest.mark.parametrize("engine", ["torch_plain", "torch_merged", "llama_lora", "llama_merged"])
def test_a_truncated_adapter_is_refused_by_its_file_and_the_old_version_serves(
        engine: str, request: pytest.FixtureRequest, tmp_path: Path) -> None:
    client = request.getfixturevalue(engine)
    ctx = _run(client.render_prompt(MESSAGES))
    before = _greedy(client, ctx)
    bad = _truncated(SFT_ADAPTER, tmp_path / "cut")
    weights = bad / "adapter_model.safetensors"
    with pytest.raises(AdapterLoadError, match=re.escape(str(weights))):
        client.load_adapter(bad, "cut")
    after = _serves_the_old(client, ctx, before)
    assert after.logprobs == pytest.approx(before.logprobs, abs=1e-5)  # the same weights, not just the same name


@pytest.mark.slow
@pytest.mark.parametrize("engine,kind", [("llama_lora", "lora"), ("llama_merged", "merged")])
def test_a_conversion_whose_write_fails_part_way_names_its_file_and_leaves_nothing_behind(
        engine: str, kind: str, request: pytest.FixtureRequest, smollm2_gguf: Path, tmp_path: Path) -> None:
    """The GGUF of a new adapter stops at WRITE_LIMIT bytes: no file of it stays in the cache (neither under its name
    nor as a temporary one, and none held open: a removed file kept open keeps its blocks on a full disk)."""
    client = request.getfixturevalue(engine)
    cache = client._lora_cache
    ctx = _run(client.render_prompt(MESSAGES))
    before = _greedy(client, ctx)
    doubled = scaled_adapter(SFT_ADAPTER, tmp_path / "doubled", 2.0)
    target = cache / f"{kind}-{adapter_digest(doubled, smollm2_gguf)}.gguf"
    with writes_stop_at(WRITE_LIMIT), pytest.raises(GGUFConversionError, match=re.escape(str(target))) as caught:
        client.load_adapter(doubled, "doubled")
    assert isinstance(caught.value.__cause__, OSError)  # EFBIG, or numpy's "9216 requested and 9200 written"
    assert _open_under(cache) == []  # while the error (and its traceback) is still held
    assert sorted(p.name for p in cache.iterdir() if target.name in p.name) == [f".{target.name}.lock"]
    _serves_the_old(client, ctx, before)


@pytest.mark.slow
@pytest.mark.parametrize("engine,kind", [("llama_lora", "lora"), ("llama_merged", "merged")])
def test_a_cached_gguf_llama_cpp_cannot_load_is_named_forgotten_and_converted_again(
        engine: str, kind: str, request: pytest.FixtureRequest, smollm2_gguf: Path, tmp_path: Path) -> None:
    """A file the cache vouches for (its digest recorded) that llama.cpp refuses: the old version serves, the file
    leaves the cache, and the next load of the adapter converts it again and serves it."""
    client = request.getfixturevalue(engine)
    cache = client._lora_cache
    ctx = _run(client.render_prompt(MESSAGES))
    before = _greedy(client, ctx)
    doubled = scaled_adapter(SFT_ADAPTER, tmp_path / "doubled", 2.0)
    target = cache / f"{kind}-{adapter_digest(doubled, smollm2_gguf)}.gguf"
    if kind == "lora":
        whole = convert_lora(doubled, smollm2_gguf, tmp_path / "whole.gguf").read_bytes()
    else:  # a merged model begins as the base model does
        with open(smollm2_gguf, "rb") as fh:
            whole = fh.read(2 << 20)
    target.write_bytes(whole[: len(whole) // 2])
    target.with_name(target.name + DIGEST_SUFFIX).write_text(sha256_file(target) + "\n")
    assert recorded(target)
    with pytest.raises(AdapterLoadError, match=re.escape(str(target))):
        client.load_adapter(doubled, "doubled")
    _serves_the_old(client, ctx, before)
    assert not target.exists() and not recorded(target)
    try:
        client.load_adapter(doubled, "doubled")
        assert client.policy_version == "doubled" and recorded(target)
        assert _greedy(client, ctx).policy_version == "doubled"
    finally:
        client.load_adapter(SFT_ADAPTER, "sft")


def test_a_saved_system_message_whose_write_fails_leaves_no_file_and_is_saved_next_time(
        smollm2_dir: Path, smollm2_gguf: Path, tmp_path: Path) -> None:
    """llama.cpp writes a system message's saved state straight to the name it is given; one cut short there by a
    full disk must not stay in the cache (a later load reads the cache for it)."""
    cache = tmp_path / "cache"
    client = EmbeddedLlamaCppClient(smollm2_dir, smollm2_gguf, lora_cache=cache, threads=1, batch_threads=1)
    try:
        ctx = _run(client.render_prompt(MESSAGES))
        with writes_stop_at(WRITE_LIMIT):
            first = _greedy(client, ctx)
        assert [p.name for p in cache.iterdir() if not p.name.endswith(".lock")] == []
    finally:
        _run(client.aclose())
    later = EmbeddedLlamaCppClient(smollm2_dir, smollm2_gguf, lora_cache=cache, threads=1, batch_threads=1)
    try:  # the next process prefills the system message again, and saves it this time
        assert _greedy(later, ctx).token_ids == first.token_ids
        saved = list(cache.glob("anchor-*.state"))
        assert len(saved) == 1 and recorded(saved[0]) and saved[0].stat().st_size > WRITE_LIMIT
    finally:
        _run(later.aclose())


def test_a_hot_swap_whose_matrices_do_not_fit_the_loaded_adapter_is_refused_and_the_old_version_serves(
        smollm2_dir: Path, tmp_path: Path) -> None:
    """With `compile`, an adapter of the loaded one's rank, alpha and targets is copied into its tensors; one matrix of
    another shape in its file must fail the swap, not the requests after it."""
    import torch
    from safetensors.torch import load_file, save_file

    # buckets shorter than any prompt here: every request decodes eagerly, and nothing is compiled
    client = TransformersPolicyClient(smollm2_dir, adapter_path=SFT_ADAPTER, version="sft", threads=1, compile=True,
                                      compile_backend="eager", compile_buckets=(8,))
    try:
        ctx = _run(client.render_prompt(MESSAGES))
        before = _greedy(client, ctx)
        bad = tmp_path / "misshaped"
        shutil.copytree(SFT_ADAPTER, bad)
        weights = load_file(str(bad / "adapter_model.safetensors"))
        key = next(k for k in sorted(weights) if ".layers.29." in k and "lora_A" in k)
        weights[key] = torch.zeros(weights[key].shape[0] + 8, weights[key].shape[1], dtype=weights[key].dtype)
        save_file(weights, str(bad / "adapter_model.safetensors"))
        with pytest.raises(AdapterLoadError, match=re.escape(str(bad))):
            client.load_adapter(bad, "misshaped")
        after = _serves_the_old(client, ctx, before)
        assert after.logprobs == pytest.approx(before.logprobs, abs=1e-5)
    finally:
        _run(client.aclose())
