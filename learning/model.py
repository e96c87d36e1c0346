"""The trainable policy: a Hugging Face causal LM with a PEFT LoRA adapter (or full fine-tuning), saved as adapters
the serving side can load (`TransformersPolicyClient.load_adapter`, vLLM's runtime LoRA endpoint)."""

from __future__ import annotations

import json
import os
import shutil
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

DEFAULT_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
TRAINED_ADAPTER = "default"  # PEFT's name for the adapter it creates or loads first: the one that trains
REFERENCE_ADAPTER = "reference"  # the frozen copy of the starting adapter the KL term anchors to (learning.update)


@dataclass(frozen=True, slots=True)
class LoraSettings:
    """LoRA shape (PEFT LoraConfig fields)."""

    r: int = 16
    alpha: int = 32
    dropout: float = 0.0
    targets: tuple[str, ...] = DEFAULT_TARGETS


def load_trainable(
    model_dir: Path | str,
    *,
    lora: LoraSettings | None,
    dtype: str = "float32",
    adapter: Path | None = None,
    gradient_checkpointing: bool = True,
    seed: int = 0,
    reference: bool = False,
    reference_adapter: Path | None = None,
) -> tuple[Any, Any]:
    """(model, tokenizer): the base model with a trainable LoRA adapter (fresh, or `adapter` to continue from), or
    the full model trainable when `lora` is None.

    With `reference` and an `adapter`, the same adapter is also loaded a second time, frozen, as REFERENCE_ADAPTER:
    the starting policy that RL's KL term anchors to (`learning.update.reference_context`). It shares the base
    weights with the trained adapter (one copy of the base; a rank-16 SmolLM2 adapter adds 4.9M parameters), takes
    no gradient, is never saved (`save_adapter` writes the trained adapter only) and is not in a plain accelerate
    checkpoint (it keeps the parameters that require grad; DeepSpeed and FSDP save their whole state, it included,
    harmlessly): a resumed run loads it again from `adapter`, and `learning.grpo` refuses a resume whose init
    adapter is not the one the run started from.
    A fresh adapter needs no copy: LoRA's B starts at zero, so the base with the adapter disabled is the start.
    `reference_adapter` (with `reference` and an `adapter`) loads another adapter as the anchor instead: a long run
    continued from its own committed adapter still anchors to where it began (issue 62).
    """
    if reference_adapter is not None and (adapter is None or not reference):
        raise ValueError("reference_adapter needs an adapter to continue from and reference=True")
    from peft import LoraConfig, PeftModel, get_peft_model
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(model_dir))
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=getattr(torch, dtype))
    if gradient_checkpointing:
        enable = getattr(model, "activation_checkpointing_enable", None)  # transformers >= 5.2 name
        if enable is not None:
            enable(activation_checkpointing_kwargs={"use_reentrant": False})
        else:
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        model.config.use_cache = False
    if lora is None:
        return model, tokenizer
    with warnings.catch_warnings():  # peft touches a transformers property deprecated in v5 (FutureWarning)
        warnings.simplefilter("ignore", FutureWarning)
        if adapter is not None:
            model = PeftModel.from_pretrained(model, str(adapter), is_trainable=True)
            if reference:  # is_trainable=False: PEFT loads it frozen and leaves the trained adapter active
                anchor = reference_adapter if reference_adapter is not None else adapter
                model.load_adapter(str(anchor), adapter_name=REFERENCE_ADAPTER, is_trainable=False)
        else:
            torch.manual_seed(seed)  # LoRA A matrices are random: the same seed gives the same start
            config = LoraConfig(r=lora.r, lora_alpha=lora.alpha, lora_dropout=lora.dropout,
                                target_modules=list(lora.targets), task_type="CAUSAL_LM")
            model = get_peft_model(model, config)
    if gradient_checkpointing:
        model.enable_input_require_grads()  # checkpointed blocks need a grad-requiring input when the base is frozen
    return model, tokenizer


def trainable_parameters(model: torch.nn.Module) -> list[torch.nn.Parameter]:
    """The parameters the optimizer updates."""
    return [p for p in model.parameters() if p.requires_grad]


def save_adapter(model: Any, out_dir: Path, meta: dict[str, Any] | None = None) -> Path:
    """Write the adapter (or full weights) to `out_dir` atomically: a temporary sibling folder renamed into place.

    A reader never sees a half-written adapter (the hot swap and the registry rely on this).
    """
    out_dir = Path(out_dir)
    tmp = out_dir.with_name(f".{out_dir.name}.tmp-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        if REFERENCE_ADAPTER in (getattr(model, "peft_config", None) or {}):
            model.save_pretrained(str(tmp), selected_adapters=[TRAINED_ADAPTER])  # never the frozen reference
        else:
            model.save_pretrained(str(tmp))
    if meta is not None:
        (tmp / "rubricem.json").write_text(json.dumps(meta, indent=2))
    if out_dir.exists():
        old = out_dir.with_name(f".{out_dir.name}.old-{os.getpid()}")
        out_dir.rename(old)
        tmp.rename(out_dir)
        shutil.rmtree(old, ignore_errors=True)
    else:
        tmp.rename(out_dir)
    return out_dir
