"""The KL anchor is the policy RL starts from (issue 45): from an adapter, that adapter, frozen beside the trained
copy; from a fresh LoRA, the base model. Real SmolLM2, the shipped SFT adapter, real PEFT and the real update."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

from learning.model import REFERENCE_ADAPTER, LoraSettings, load_trainable, save_adapter, trainable_parameters
from learning.sequences import TrainSequence
from learning.update import policy_update

SFT_ADAPTER = Path(__file__).resolve().parents[2] / "agent" / "adapters" / "smollm2-sft"


def _sequences(tokenizer: object) -> list[TrainSequence]:
    """Two short responses to one prompt, one pushed up and one pushed down (a group's two signs)."""
    prompt = tuple(tokenizer("Who was Haymo of Faversham? Answer briefly.")["input_ids"])  # type: ignore[operator]
    out = []
    for text, adv in (("He was an English Franciscan friar and a scholastic.", 1.0),
                      ("He was a famous painter from Rome who lived in 1900.", -1.0)):
        ids = tuple(tokenizer(text)["input_ids"])  # type: ignore[operator]
        n = len(ids)
        out.append(TrainSequence(prompt, ids, (1,) * n, (3,) * n, (adv,) * n, (float("nan"),) * n, "task"))
    return out


def _train(model: object, tokenizer: object, steps: int, lr: float = 1e-4) -> list[float]:
    """The per-token KL to the reference recorded by each of `steps` updates (taken before that update's step)."""
    opt = torch.optim.AdamW(trainable_parameters(model), lr=lr, weight_decay=0.0)  # type: ignore[arg-type]
    seqs = _sequences(tokenizer)
    kls = []
    for _ in range(steps):
        pad = int(tokenizer.pad_token_id)  # type: ignore[attr-defined]
        stats = policy_update(model, opt, seqs, pad_id=pad, beta=0.001)  # type: ignore[arg-type]
        assert stats.skipped is None, stats.skipped
        kls.append(stats.metrics["kl"])
    return kls


@pytest.fixture(scope="module")
def from_adapter(smollm2_dir: Path) -> tuple[object, object]:
    torch.manual_seed(0)
    return load_trainable(smollm2_dir, lora=LoraSettings(), dtype="float32", adapter=SFT_ADAPTER,
                          gradient_checkpointing=False, reference=True)


def test_kl_is_zero_at_the_start_from_an_adapter_and_grows_as_it_moves(from_adapter: tuple[object, object],
                                                                      tmp_path: Path) -> None:
    model, tokenizer = from_adapter
    named = dict(model.named_parameters())  # type: ignore[attr-defined]
    ref_before = {n: p.detach().clone() for n, p in named.items() if f".{REFERENCE_ADAPTER}." in n}
    assert ref_before, "the reference adapter was not loaded"
    assert not any(named[n].requires_grad for n in ref_before)
    n_trained = sum(p.numel() for p in trainable_parameters(model))  # type: ignore[arg-type]
    n_ref = sum(t.numel() for t in ref_before.values())
    assert n_trained == n_ref  # the optimizer sees the trained adapter only, and the copy is the adapter's size

    kls = _train(model, tokenizer, steps=4)
    assert kls[0] == pytest.approx(0.0, abs=1e-6), kls  # step 0: the policy is its reference
    assert kls[1] > 1e-5 and kls[3] > kls[1], kls  # the adapter moves away, the anchor stays
    for n, p in model.named_parameters():  # type: ignore[attr-defined]
        if n in ref_before:
            assert torch.equal(p, ref_before[n]), f"the frozen reference moved: {n}"
            assert not p.requires_grad

    saved = save_adapter(model, tmp_path / "adapter")
    assert (saved / "adapter_model.safetensors").is_file()
    assert not (saved / REFERENCE_ADAPTER).exists()  # publishing writes the trained adapter, never the anchor
    from safetensors.torch import load_file

    keys = load_file(str(saved / "adapter_model.safetensors")).keys()
    assert keys and not any(REFERENCE_ADAPTER in k for k in keys)


def test_the_old_anchor_the_base_model_is_far_from_an_sft_start(smollm2_dir: Path) -> None:
    """Why the change matters: without the frozen copy the anchor is the base (adapter disabled), and the KL at
    step 0 is large before any update (the learning curve's rows recorded 1.35 per token)."""
    model, tokenizer = load_trainable(smollm2_dir, lora=LoraSettings(), dtype="float32", adapter=SFT_ADAPTER,
                                      gradient_checkpointing=False, reference=False)
    kl0 = _train(model, tokenizer, steps=1)[0]
    assert math.isfinite(kl0) and kl0 > 0.01, kl0


def test_a_fresh_lora_is_anchored_to_the_base_and_starts_at_zero(smollm2_dir: Path) -> None:
    model, tokenizer = load_trainable(smollm2_dir, lora=LoraSettings(), dtype="float32", adapter=None,
                                      gradient_checkpointing=False, reference=True, seed=0)
    assert REFERENCE_ADAPTER not in model.peft_config  # no copy needed: B = 0 makes the base the start
    kls = _train(model, tokenizer, steps=3)
    assert kls[0] == pytest.approx(0.0, abs=1e-6), kls
    assert kls[2] > 1e-5, kls


def test_a_resume_from_another_starting_adapter_is_refused(tmp_path: Path) -> None:
    from learning.grpo import TrainingError, check_start, start_digest

    sft = start_digest(SFT_ADAPTER)
    assert sft is not None and sft == start_digest(SFT_ADAPTER) and start_digest(None) is None
    check_start({"step": 3, "start_adapter": sft}, sft, tmp_path)  # the same start: resumes
    check_start({"step": 3}, sft, tmp_path)  # a checkpoint from before the anchor was recorded: resumes
    with pytest.raises(TrainingError, match="began from another starting adapter"):
        check_start({"step": 3, "start_adapter": sft}, None, tmp_path)
    other = tmp_path / "other"
    other.mkdir()
    (other / "adapter_model.safetensors").write_bytes(b"not the same weights")
    with pytest.raises(TrainingError, match=r"\(weights sha256 .*\) than this run's init_adapter"):
        check_start({"step": 3, "start_adapter": sft}, start_digest(other), tmp_path)
    with pytest.raises(TrainingError, match="no adapter_model weights file"):
        start_digest(tmp_path)


def test_a_run_continued_from_its_own_adapter_keeps_its_first_anchor(from_adapter: tuple[object, object],
                                                                     smollm2_dir: Path, tmp_path: Path) -> None:
    """Issue 62: a long run continued on a new machine from the adapter it committed loads that adapter to train and
    the adapter the run began from as its anchor, so the KL goes on from where it was instead of starting at 0."""
    from learning.grpo import start_digest
    from learning.train_config import load_config

    model, tokenizer = load_trainable(smollm2_dir, lora=LoraSettings(), dtype="float32", adapter=SFT_ADAPTER,
                                      gradient_checkpointing=False, reference=True)
    _train(model, tokenizer, steps=3)
    saved = save_adapter(model, tmp_path / "step-3")
    assert start_digest(saved) != start_digest(SFT_ADAPTER)
    kl_saved = _train(model, tokenizer, steps=1)[0]  # recorded before that update: the KL of the saved weights

    again, tok = load_trainable(smollm2_dir, lora=LoraSettings(), dtype="float32", adapter=saved,
                                gradient_checkpointing=False, reference=True, reference_adapter=SFT_ADAPTER)
    continued = _train(again, tok, steps=1)[0]
    assert kl_saved > 1e-5 and continued == pytest.approx(kl_saved, rel=0.05), (kl_saved, continued)
    plain, tok2 = load_trainable(smollm2_dir, lora=LoraSettings(), dtype="float32", adapter=saved,
                                 gradient_checkpointing=False, reference=True)
    assert _train(plain, tok2, steps=1)[0] == pytest.approx(0.0, abs=1e-6)  # without it the anchor would reset

    with pytest.raises(ValueError, match="reference_adapter needs an adapter"):
        load_trainable(smollm2_dir, lora=LoraSettings(), adapter=None, reference=True, reference_adapter=SFT_ADAPTER)
    with pytest.raises(ValueError, match="set init_adapter too"):
        load_config(None, None, reference_adapter=SFT_ADAPTER)
