"""A sampler-trainer mismatch above `max_sampler_kl` (issue 37, bad input and faults): the update takes no optimizer
step, says why (the measured KL and the threshold), and still reports the mismatch metrics; in the loop the step is
logged, published and checkpointed like any other, and a run resumes after it."""

from __future__ import annotations

import asyncio
import json
import math
import re
from pathlib import Path
from typing import Any

import pytest
import torch

from learning.model import LoraSettings, load_trainable, trainable_parameters
from learning.sequences import TrainSequence, collate, response_logprobs
from learning.train_config import TrainConfig, load_config
from learning.update import UpdateStats, policy_update

SMALL_LORA = LoraSettings(r=4, alpha=8, targets=("q_proj", "v_proj"))
K3_OF_ONE_NAT = math.e - 2  # exp(Δ) − Δ − 1 at Δ = trainer − sampler = 1


@pytest.fixture(scope="module")
def trained(tiny_model_dir: Path) -> tuple[Any, Any]:
    """The tiny model with a LoRA adapter whose B is already non-zero (one plain step), so every later step moves
    every LoRA matrix."""
    model, tok = load_trainable(tiny_model_dir, lora=SMALL_LORA, gradient_checkpointing=False, seed=0)
    opt = torch.optim.AdamW(trainable_parameters(model), lr=1e-2)
    assert policy_update(model, opt, _plain(tok), pad_id=tok.pad_token_id, beta=0.0).skipped is None
    return model, tok


def _plain(tok: Any) -> list[TrainSequence]:
    prompt = tuple(tok("<|im_start|>user\nWho was Haymo?<|im_end|>\n<|im_start|>assistant\n")["input_ids"])
    out = []
    for text, adv in (("Haymo of Faversham was an English Franciscan.", 1.0), ("The answer is unknown.", -1.0)):
        resp = tuple(tok(text)["input_ids"])
        out.append(TrainSequence(prompt, resp, (1,) * len(resp), (3,) * len(resp), (adv,) * len(resp)))
    return out  # no sampler log-probs: NaN at every token


def _with_sampler(model: Any, tok: Any, seqs: list[TrainSequence], shift: float | None) -> TrainSequence:
    """Sampler log-probs `shift` nats below the trainer's own (None: none recorded), for the first of `seqs`."""
    s = seqs[0]
    if shift is None:
        return s
    model.eval()
    with torch.no_grad():
        lp = response_logprobs(model, collate([s], tok.pad_token_id), 1.0)[0]
    model.train()
    sampler = tuple(float(x) - shift for x in lp[: len(s.response_ids)])
    return TrainSequence(s.prompt_ids, s.response_ids, s.mask, s.stages, s.advantages, sampler)


def _update(model: Any, tok: Any, shifts: tuple[float | None, ...], max_sampler_kl: float | None,
            hold: str | None = None) -> tuple[UpdateStats, bool, int]:
    """One update on sequences with the given sampler shifts: (stats, whether any LoRA weight moved, the optimizer
    steps a fresh AdamW recorded)."""
    plain = _plain(tok)
    seqs = [_with_sampler(model, tok, [plain[i % len(plain)]], shift) for i, shift in enumerate(shifts)]
    opt = torch.optim.AdamW(trainable_parameters(model), lr=1e-2)
    before = {n: p.detach().clone() for n, p in model.named_parameters() if p.requires_grad}
    stats = policy_update(model, opt, seqs, pad_id=tok.pad_token_id, beta=0.001, tis_cap=2.0,
                          max_sampler_kl=max_sampler_kl, hold=hold)
    moved = any(not torch.equal(before[n], p.detach()) for n, p in model.named_parameters() if p.requires_grad)
    steps = max((int(st["step"]) for st in opt.state.values()), default=0)
    assert all(p.grad is None for p in model.parameters())  # nothing left behind for a later step
    return stats, moved, steps


def test_an_update_far_from_the_sampler_is_skipped_with_the_reason_and_leaves_the_weights(trained: Any) -> None:
    model, tok = trained
    stats, moved, steps = _update(model, tok, (1.0, 1.0), max_sampler_kl=0.05)
    assert not moved and steps == 0
    assert stats.skipped is not None and stats.skipped.startswith("sampler-trainer mismatch")
    said = re.fullmatch(r"sampler-trainer mismatch: KL\(sampler ‖ trainer\) (\S+) per token \(k3, (\d+) tokens\) "
                        r"above max_sampler_kl 0\.05", stats.skipped)
    assert said is not None, stats.skipped
    assert float(said[1]) == pytest.approx(K3_OF_ONE_NAT, abs=2e-3) and int(said[2]) == stats.trainable_tokens
    assert stats.metrics["sampler_kl"] == pytest.approx(K3_OF_ONE_NAT, abs=2e-3)  # still reported
    assert math.isfinite(stats.loss) and stats.grad_norm > 0  # the gradient pass ran; its gradient was dropped
    row = stats.as_dict("task")
    assert row["task/skipped"] == stats.skipped and row["task/sampler_kl"] == stats.metrics["sampler_kl"]
    json.dumps(row)  # the metrics.jsonl row


def test_a_held_step_measures_the_mismatch_without_a_gradient_and_names_the_mismatch_first(trained: Any) -> None:
    """A step with nothing to learn (every rollout scored the same) takes no step, but its samples' mismatch is still
    measured and recorded; a mismatch above the threshold is the reason given."""
    model, tok = trained
    stats, moved, steps = _update(model, tok, (0.1, -0.1), max_sampler_kl=0.05, hold="every group scored the same")
    assert not moved and steps == 0 and stats.skipped == "every group scored the same"
    assert 0 < stats.metrics["sampler_kl"] < 0.01 and stats.grad_norm == 0.0 and stats.trainable_tokens > 0
    stats, moved, _ = _update(model, tok, (1.0, 1.0), max_sampler_kl=0.05, hold="every group scored the same")
    assert not moved and stats.skipped is not None and stats.skipped.startswith("sampler-trainer mismatch")


def test_an_update_within_the_threshold_steps(trained: Any) -> None:
    model, tok = trained
    stats, moved, steps = _update(model, tok, (0.1, -0.1), max_sampler_kl=0.05)
    assert stats.skipped is None and moved and steps == 1
    assert 0 < stats.metrics["sampler_kl"] < 0.01  # k3 of ±0.1 nat: about 0.005


def test_no_threshold_never_skips(trained: Any) -> None:
    model, tok = trained
    for off in (None, math.inf):  # inf is how a TOML file (no null) turns the check off
        stats, moved, steps = _update(model, tok, (3.0, 3.0), max_sampler_kl=off)
        assert stats.skipped is None and moved and steps == 1
        assert stats.metrics["sampler_kl"] > 10


def test_tokens_without_sampler_logprobs_do_not_count(trained: Any) -> None:
    model, tok = trained
    stats, moved, steps = _update(model, tok, (None, None), max_sampler_kl=1e-9)
    assert stats.skipped is None and moved and steps == 1 and math.isnan(stats.metrics["sampler_kl"])
    # One far sequence beside one without sampler log-probs: the mean is over the far one's tokens alone.
    stats, moved, _ = _update(model, tok, (1.0, None), max_sampler_kl=0.05)
    assert not moved and stats.metrics["sampler_kl"] == pytest.approx(K3_OF_ONE_NAT, abs=2e-3)
    far_tokens = len(_plain(tok)[0].response_ids)
    assert stats.skipped is not None and f"(k3, {far_tokens} tokens)" in stats.skipped


def test_the_threshold_is_a_documented_config_field(tmp_path: Path) -> None:
    field = TrainConfig.model_fields["max_sampler_kl"]
    assert TrainConfig().max_sampler_kl == 0.05 and "0.05" in (field.description or "")
    toml = tmp_path / "run.toml"
    toml.write_text("max_sampler_kl = inf\n", encoding="utf-8")
    assert load_config(toml).max_sampler_kl == math.inf
    with pytest.raises(ValueError, match="max_sampler_kl"):
        load_config(None, None, max_sampler_kl=0.0)


@pytest.mark.slow
def test_the_loop_logs_a_skipped_step_keeps_the_weights_and_resumes_after_it(tiny_model_dir: Path,
                                                                            tmp_path: Path) -> None:
    """With a threshold no real sampler meets, every update is skipped: each step still writes its row (with the
    reason and the KL), publishes NAME@STEP and checkpoints, the adapter stays the initial one, and a longer run
    resumes from the last checkpoint."""
    from safetensors.torch import load_file

    from app.settings import Settings
    from app.training import build_trainer
    from learning.grpo import train
    from store.config import StoreConfig

    settings = Settings(store=StoreConfig(data_dir=tmp_path / "data")).model_copy(deep=True)
    settings = settings.model_copy(update={"agent": settings.agent.model_copy(update={
        "embedded_model_path": tiny_model_dir})})
    tiny = {"batch_questions": 1, "rollouts": 2, "max_tool_calls": 1, "plan_tokens": 24, "research_tokens": 16,
            "review_tokens": 16, "answer_tokens": 24, "n_questions": 4, "lr": 1e-3, "lora_r": 4,
            "gradient_checkpointing": False, "temperature": 1.0, "reflection": False, "max_sampler_kl": 1e-12}

    def run(steps: int) -> Any:
        cfg = load_config(None, None, name="skips", steps=steps, **tiny)
        parts, folder = build_trainer(settings, cfg)

        async def go() -> Any:
            try:
                return await train(cfg, parts, folder)
            finally:
                await parts.policy.aclose()

        return asyncio.run(go()), folder

    first, folder = run(2)
    rows = [json.loads(x) for x in (folder / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [0, 1] and first.version == "skips@2"
    for r in rows:
        assert r["task/sampler_kl"] >= 0  # measured (rounded to 6 decimals in the row; the tiny model's is ~1e-7)
        assert r["task/skipped"].startswith("sampler-trainer mismatch") and "max_sampler_kl 1e-12" in r["task/skipped"]
    start = load_file(str(folder / "adapters" / "skips@0" / "adapter_model.safetensors"))
    end = load_file(str(folder / "adapters" / "skips@2" / "adapter_model.safetensors"))
    assert start.keys() == end.keys() and all(torch.equal(start[k], end[k]) for k in start)
    resumed, _ = run(3)
    assert resumed.resumed_from == 1 and resumed.steps_done == 1 and resumed.version == "skips@3"
    rows = [json.loads(x) for x in (folder / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [0, 1, 2] and rows[-1]["task/skipped"].startswith("sampler-trainer")
