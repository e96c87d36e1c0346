"""The GGUF LoRA cache (learning/engines/gguf_lora.py, issue 46 item 9): llama.cpp reads a cached conversion only
after it was checked against the digest recorded when it was written, and only from a folder no other user can write.

A tiny Llama GGUF (one block, two heads) and tiny PEFT LoRA adapters stand for the bundled model and a trained
adapter: the conversion and the cache are the real ones, no model is loaded.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest

from learning.engines.gguf_lora import GGUFConversionError, adapter_digest, cached_lora, convert_lora

WIDTH, RANK = 8, 2


@pytest.fixture
def base_gguf(tmp_path: Path) -> Path:
    import gguf

    path = tmp_path / "base.gguf"
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_uint32("llama.attention.head_count", 2)
    writer.add_uint32("llama.attention.head_count_kv", 2)
    for name in ("attn_q", "attn_v"):
        writer.add_tensor(f"blk.0.{name}.weight", np.zeros((WIDTH, WIDTH), dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def make_adapter(folder: Path, seed: int) -> Path:
    """A PEFT LoRA adapter of q_proj and v_proj with weights drawn from `seed`."""
    from safetensors.numpy import save_file

    rng = np.random.default_rng(seed)
    folder.mkdir(parents=True)
    (folder / "adapter_config.json").write_text(json.dumps({"peft_type": "LORA", "r": RANK, "lora_alpha": 4}))
    tensors = {}
    for proj in ("q_proj", "v_proj"):
        key = f"base_model.model.model.layers.0.self_attn.{proj}"
        tensors[f"{key}.lora_A.weight"] = rng.standard_normal((RANK, WIDTH)).astype(np.float32)
        tensors[f"{key}.lora_B.weight"] = rng.standard_normal((WIDTH, RANK)).astype(np.float32)
    save_file(tensors, str(folder / "adapter_model.safetensors"))
    return folder


def test_a_cached_conversion_that_was_changed_is_converted_again_before_llama_cpp_reads_it(
        tmp_path: Path, base_gguf: Path) -> None:
    adapter = make_adapter(tmp_path / "trained", seed=1)
    cache = tmp_path / "cache"
    first = cached_lora(adapter, base_gguf, cache)
    converted = first.read_bytes()
    assert cached_lora(adapter, base_gguf, cache) == first  # unchanged: reused, not converted again
    # Another adapter's conversion (a valid GGUF LoRA llama.cpp would load) put in its place: by someone with write
    # access to the cache, or left by a crash between two writers.
    planted = convert_lora(make_adapter(tmp_path / "other", seed=2), base_gguf, tmp_path / "planted.gguf")
    first.write_bytes(planted.read_bytes())
    served = cached_lora(adapter, base_gguf, cache)
    assert served.read_bytes() == converted, "llama.cpp would read a conversion that is not this adapter's"


def test_a_cached_conversion_that_is_a_link_is_not_followed(tmp_path: Path, base_gguf: Path) -> None:
    adapter = make_adapter(tmp_path / "trained", seed=1)
    cache = tmp_path / "cache"
    converted = cached_lora(adapter, base_gguf, cache).read_bytes()
    planted = convert_lora(make_adapter(tmp_path / "other", seed=2), base_gguf, tmp_path / "planted.gguf")
    target = cache / f"lora-{adapter_digest(adapter, base_gguf)}.gguf"
    target.unlink()
    target.symlink_to(planted)
    served = cached_lora(adapter, base_gguf, cache)
    assert not served.is_symlink() and served.read_bytes() == converted


@pytest.mark.parametrize("mode", [0o777, 0o775, 0o757])
def test_a_cache_folder_other_users_can_write_is_never_used(tmp_path: Path, base_gguf: Path, mode: int) -> None:
    adapter = make_adapter(tmp_path / "trained", seed=1)
    cache = tmp_path / "shared-cache"
    cache.mkdir()
    os.chmod(cache, mode)  # group- or world-writable: another user can put any file there
    planted = convert_lora(make_adapter(tmp_path / "other", seed=2), base_gguf, tmp_path / "planted.gguf")
    (cache / f"lora-{adapter_digest(adapter, base_gguf)}.gguf").write_bytes(planted.read_bytes())
    with pytest.raises(GGUFConversionError, match="other users can write") as refused:
        cached_lora(adapter, base_gguf, cache)
    assert str(cache) in str(refused.value)


def test_a_cache_folder_inside_a_folder_others_can_write_is_never_used(tmp_path: Path, base_gguf: Path) -> None:
    adapter = make_adapter(tmp_path / "trained", seed=1)
    shared = tmp_path / "shared"
    shared.mkdir()
    os.chmod(shared, 0o777)  # not sticky: anyone can rename our cache folder away and put their own in its place
    with pytest.raises(GGUFConversionError, match="other users can write"):
        cached_lora(adapter, base_gguf, shared / "cache")
    assert not (shared / "cache").exists()


def test_a_new_cache_folder_is_private(tmp_path: Path, base_gguf: Path) -> None:
    adapter = make_adapter(tmp_path / "trained", seed=1)
    served = cached_lora(adapter, base_gguf, tmp_path / "models" / "gguf-lora")
    assert served.parent.stat().st_mode & 0o077 == 0
