"""Which engine decodes the embedded policy (`app.container.build_policy`, issue 37).

The default is llama.cpp whenever it can serve the same weights the trainer loads: the bundled SmolLM2 (its converted
folder names the GGUF it came from), or a folder given with a GGUF of its own. Weights without a GGUF fall back to
torch with one message when the engine is the default, and are refused with the reason when llamacpp was chosen.
"""

from __future__ import annotations

import asyncio
import shutil
from pathlib import Path

import pytest

from app.container import ConfigurationError, build_policy
from app.settings import Settings
from learning.engines.local_policy import TransformersPolicyClient
from store.config import StoreConfig

# llama-cpp-python comes with `make install` (the llamacpp extra) and every test here needs it, so its absence is a
# broken install: a plain import fails collection with the ImportError, in every mode. A module-level
# `pytest.importorskip` here skipped the whole module silently, even under RUBRICEM_TEST_STRICT=1 (issue 61).
import llama_cpp  # noqa: F401

from learning.engines.llamacpp_engine import EmbeddedLlamaCppClient  # noqa: E402


def _settings(tmp_path: Path, **agent: object) -> Settings:
    s = Settings(store=StoreConfig(data_dir=tmp_path / "data"))
    return s.model_copy(update={"agent": s.agent.model_validate({**s.agent.model_dump(exclude_unset=True), **agent})})


def test_the_default_engine_is_llamacpp_on_the_bundled_weights_with_the_sft_adapter(
        smollm2_dir: Path, tmp_path: Path) -> None:
    policy = build_policy(_settings(tmp_path, embedded_model_path=smollm2_dir, embedded_adapter_path=None,
                                    embedded_threads=1))
    try:
        assert isinstance(policy, EmbeddedLlamaCppClient)
        assert policy.engine.threads == 1
    finally:
        asyncio.run(policy.aclose())


def test_weights_without_a_gguf_fall_back_to_torch_unless_llamacpp_was_chosen(
        smollm2_dir: Path, tmp_path: Path) -> None:
    other = tmp_path / "other-model"
    shutil.copytree(smollm2_dir, other, ignore=shutil.ignore_patterns(".rubricem-converted.json"))
    said: list[str] = []
    policy = build_policy(_settings(tmp_path, embedded_model_path=other, embedded_threads=1), say=said.append)
    try:
        assert isinstance(policy, TransformersPolicyClient)
        assert any("Decoding with torch" in m and "EMBEDDED_GGUF_PATH" in m for m in said), said
    finally:
        asyncio.run(policy.aclose())
    with pytest.raises(ConfigurationError, match="EMBEDDED_ENGINE=llamacpp.*EMBEDDED_GGUF_PATH"):
        build_policy(_settings(tmp_path, embedded_model_path=other, embedded_engine="llamacpp"))


def test_a_folder_with_its_gguf_given_runs_on_llamacpp(smollm2_dir: Path, smollm2_gguf: Path, tmp_path: Path) -> None:
    other = tmp_path / "other-model"
    shutil.copytree(smollm2_dir, other, ignore=shutil.ignore_patterns(".rubricem-converted.json"))
    policy = build_policy(_settings(tmp_path, embedded_model_path=other, embedded_gguf_path=smollm2_gguf,
                                    embedded_engine="llamacpp", embedded_threads=1))
    try:
        assert isinstance(policy, EmbeddedLlamaCppClient)
    finally:
        asyncio.run(policy.aclose())


@pytest.mark.slow
def test_a_new_data_folder_reads_only_the_tokenizer_until_torch_needs_the_weights(
        smollm2_gguf: Path, tmp_path: Path) -> None:
    """Issue 47: the default engine decodes the GGUF itself, so a first `ask` writes the tokenizer and config only
    (seconds); the torch engine then completes the same folder with the weights."""
    from learning.engines.weights import MARKER_FILENAME, bundled_source, ensure_converted

    settings = _settings(tmp_path, embedded_threads=1)
    policy = build_policy(settings)
    folder = settings.store.model_cache / "smollm2-135m-instruct"
    try:
        assert isinstance(policy, EmbeddedLlamaCppClient)
        assert (folder / "tokenizer.json").is_file() and (folder / "config.json").is_file()
        assert not (folder / "model.safetensors").exists()  # no 60-second conversion before the first token
        assert bundled_source(folder) == smollm2_gguf
    finally:
        asyncio.run(policy.aclose())
    assert ensure_converted(settings.store.model_cache) == folder  # what training and the torch engine call
    assert (folder / "model.safetensors").is_file()
    assert '"weights": true' in (folder / MARKER_FILENAME).read_text(encoding="utf-8")
    assert sorted(p.name for p in settings.store.model_cache.iterdir() if p.name.startswith(".smollm2")) == [
        ".smollm2-135m-instruct.lock"]  # no temporary or set-aside folder left behind
    torch_policy = build_policy(_settings(tmp_path, embedded_engine="torch", embedded_threads=1))
    try:
        assert isinstance(torch_policy, TransformersPolicyClient)
    finally:
        asyncio.run(torch_policy.aclose())
