"""Fixtures shared by the training tests."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch


@pytest.fixture(scope="module")
def tiny_model_dir(smollm2_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A randomly initialised 2-layer model with SmolLM2's tokenizer and chat template: the loop's plumbing at a
    fraction of the cost (its text is noise, which the judge scores low but not uniformly)."""
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    out = tmp_path_factory.mktemp("tiny-model")
    config = AutoConfig.from_pretrained(str(smollm2_dir))
    config.update({"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
                   "num_key_value_heads": 2, "head_dim": 16})
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(config).save_pretrained(str(out))
    AutoTokenizer.from_pretrained(str(smollm2_dir)).save_pretrained(str(out))
    return out
