"""Every swap is verified (issue 63, item 2), on the in-process engines with real adapters: the shipped SFT adapter
is the previous version, a scaled copy of it the new one, and the trainer's reference is the real trainer's
arithmetic (`learning.swap_verify.TrainerReference`: `load_trainable` + `response_logprobs`).

A good swap passes the probe on llama.cpp and on torch. A swap whose served weights did not change is caught and
named: the old adapter's files loaded under the new version's name, and, on llama.cpp, a stale converted GGUF in
the engine's cache for the new adapter (a load that reports success and serves the old weights). A probe that
cannot reach its engine retries until its deadline, then fails with the reason, without running the swap.
The promotion path on top (`rubricem promote`, the cycle's activation) is tests/app/test_swap_promotion.py."""

from __future__ import annotations

import asyncio
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from agent.config import SHIPPED_SFT_ADAPTER
from agent.policy import VLLMPolicyClient
from agent.protocols import Served
from learning.swap_probe import SwapNotVerified
from learning.swap_verify import ProbeVersion, TrainerReference, probe_targets, verify_swap
from tests.adapters import scaled_adapter
from tests.servers import free_port

import llama_cpp  # noqa: F401  (a broken install fails collection, as in test_llamacpp_engine.py)

from learning.engines.gguf_lora import DIGEST_SUFFIX, adapter_digest, cached_lora  # noqa: E402
from learning.engines.llamacpp_engine import EmbeddedLlamaCppClient  # noqa: E402
from learning.engines.local_policy import TransformersPolicyClient  # noqa: E402

TOL = 0.05  # RetrainConfig.swap_probe_max_kl's default
TOKENS = 12  # fewer than the default 24: the readings are exact on these engines, and the suite shares 2 cores
OLD, NEW = "policy@1", "policy@2"


def _version(name: str, folder: Path) -> ProbeVersion:
    return ProbeVersion(name, Served(name, name, str(folder)), folder)


@pytest.fixture(scope="module")
def reference(smollm2_dir: Path) -> Iterator[TrainerReference]:
    ref = TrainerReference(smollm2_dir)
    yield ref
    ref.close()


@pytest.fixture(scope="module")
def new_adapter(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return scaled_adapter(SHIPPED_SFT_ADAPTER, tmp_path_factory.mktemp("adapters") / "new", 0.5)


@pytest.fixture(scope="module")
def lora_cache(smollm2_dir: Path, smollm2_gguf: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A cache of this module's own (the stale-conversion test writes into it), seeded with the SFT adapter's
    conversion from the product's shared cache when it is there (converting again costs minutes on a busy machine)."""
    cache = tmp_path_factory.mktemp("lora")
    shared = smollm2_dir.parent / "gguf-lora"
    name = f"lora-{adapter_digest(SHIPPED_SFT_ADAPTER, smollm2_gguf)}.gguf"
    if (shared / name).is_file() and (shared / (name + DIGEST_SUFFIX)).is_file():
        shutil.copy(shared / name, cache / name)
        shutil.copy(shared / (name + DIGEST_SUFFIX), cache / (name + DIGEST_SUFFIX))
    return cache


@pytest.fixture(scope="module")
def llama(smollm2_dir: Path, smollm2_gguf: Path, lora_cache: Path) -> Iterator[EmbeddedLlamaCppClient]:
    client = EmbeddedLlamaCppClient(smollm2_dir, smollm2_gguf, adapter_path=SHIPPED_SFT_ADAPTER, version=OLD,
                                    lora_cache=lora_cache, threads=1, batch_threads=1)
    yield client
    asyncio.run(client.aclose())


def _verify(client: Any, reference: TrainerReference, new_adapter: Path, swap: Any) -> Any:
    async def go() -> Any:
        return await verify_swap(probe_targets(client), _version(NEW, new_adapter),
                                 _version(OLD, SHIPPED_SFT_ADAPTER), reference, swap=swap, tolerance=TOL,
                                 deadline_s=30, tokens=TOKENS)

    return asyncio.run(go())


def _assert_caught(err: SwapNotVerified, engine: str) -> None:
    text = str(err)
    assert f"the swap to {NEW} is not verified on {engine} replica in-process" in text
    assert f"distance to the trainer's {NEW}:" in text and f"distance to the previous version {OLD}:" in text
    assert "still serves the previous weights" in text and f"{NEW} is not promoted" in text
    assert err.engine == engine and err.replica == "in-process" and err.distances is not None and err.after_swap
    assert err.distances.diverged_at is None and err.distances.to_previous == 0.0


def test_llamacpp_a_good_swap_passes_the_probe(llama: EmbeddedLlamaCppClient, reference: TrainerReference,
                                               new_adapter: Path) -> None:
    checks = _verify(llama, reference, new_adapter, lambda: llama.aload_adapter(new_adapter, NEW))
    d = checks["llama.cpp in-process"]
    assert d.tokens > 0 and d.to_new <= TOL and (d.diverged_at is not None or d.to_previous > 0)
    assert llama.policy_version == NEW


def test_llamacpp_the_old_adapters_files_under_the_new_name_are_caught(
        llama: EmbeddedLlamaCppClient, reference: TrainerReference, new_adapter: Path) -> None:
    with pytest.raises(SwapNotVerified) as err:  # the stale adapter: the old files loaded under the new name
        _verify(llama, reference, new_adapter, lambda: llama.aload_adapter(SHIPPED_SFT_ADAPTER, NEW))
    _assert_caught(err.value, "llama.cpp")


def test_llamacpp_a_load_that_reports_success_but_serves_a_stale_conversion_is_caught(
        llama: EmbeddedLlamaCppClient, reference: TrainerReference, smollm2_gguf: Path, lora_cache: Path,
        tmp_path: Path) -> None:
    """The engine's cache holds, under the new adapter's key, the old adapter's conversion (recorded as valid): the
    load answers success and names the new version, and the old weights serve. The new adapter is one of this
    test's own, never converted before (nothing else of it is cached)."""
    new_adapter = scaled_adapter(SHIPPED_SFT_ADAPTER, tmp_path / "new", 0.25)
    old_gguf = cached_lora(SHIPPED_SFT_ADAPTER, smollm2_gguf, lora_cache)
    stale = old_gguf.with_name(f"lora-{adapter_digest(new_adapter, smollm2_gguf)}.gguf")
    shutil.copy(old_gguf, stale)
    shutil.copy(old_gguf.with_name(old_gguf.name + DIGEST_SUFFIX), stale.with_name(stale.name + DIGEST_SUFFIX))
    assert cached_lora(new_adapter, smollm2_gguf, lora_cache) == stale  # the cache hands out the stale file
    with pytest.raises(SwapNotVerified) as err:
        _verify(llama, reference, new_adapter, lambda: llama.aload_adapter(new_adapter, NEW))
    _assert_caught(err.value, "llama.cpp")
    assert llama.policy_version == NEW  # the engine believes it serves the new version


def test_torch_a_good_swap_passes_and_old_files_under_the_new_name_are_caught(
        smollm2_dir: Path, reference: TrainerReference, new_adapter: Path) -> None:
    client = TransformersPolicyClient(smollm2_dir, adapter_path=SHIPPED_SFT_ADAPTER, version=OLD, threads=1)
    try:
        checks = _verify(client, reference, new_adapter, lambda: client.aload_adapter(new_adapter, NEW))
        d = checks["torch in-process"]
        assert d.tokens > 0 and d.to_new <= 1e-3  # the trainer's own arithmetic, up to the decode kernels
        with pytest.raises(SwapNotVerified) as err:
            _verify(client, reference, new_adapter, lambda: client.aload_adapter(SHIPPED_SFT_ADAPTER, NEW))
        _assert_caught(err.value, "torch")
    finally:
        asyncio.run(client.aclose())


def test_a_probe_that_cannot_reach_its_engine_retries_until_the_deadline_then_fails_with_the_reason(
        reference: TrainerReference, new_adapter: Path) -> None:
    url = f"http://127.0.0.1:{free_port()}"  # nothing listens: a replica that is down
    client = VLLMPolicyClient(url, "policy", max_retries=0, timeout_s=5)
    swapped: list[bool] = []

    async def swap() -> None:
        swapped.append(True)

    async def go() -> None:
        try:
            await verify_swap(probe_targets(client), _version(NEW, new_adapter), _version(OLD, SHIPPED_SFT_ADAPTER),
                              reference, swap=swap, tolerance=TOL, deadline_s=1.0, tokens=8, backoff_s=0.1)
        finally:
            await client.aclose()

    with pytest.raises(SwapNotVerified) as err:
        asyncio.run(go())
    text = str(err.value)
    assert f"not verified on vllm replica {url}" in text and "could not run within 1s" in text
    assert "cannot reach the policy server" in text and f"{NEW} is not promoted" in text
    assert swapped == [] and not err.value.after_swap  # never swapped, never passed
