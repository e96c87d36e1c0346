"""SS-GRPO training on the real SmolLM2 with LoRA: one update's effect on the weights, the group/score plumbing, the
reflection branch's masks, and the whole loop with a crash and an exact resume."""

from __future__ import annotations

import asyncio
import json
import math
from pathlib import Path
from typing import Any

import pytest
import torch

from learning.advantages import paper_lambda
from learning.grpo import (
    Group,
    _drop_rows_after,
    _why_no_update,
    reflection_sequences,
    score_matrix,
    step_sequences,
    task_sequences,
)
from learning.judge.types import Judgement, StageResult
from learning.model import LoraSettings, load_trainable, trainable_parameters
from learning.sequences import TrainSequence
from learning.update import policy_update
from store.records import PromptRecord, Trajectory, Turn
from store.session_log import ReflectionCandidate, SessionLog

SMALL_LORA = LoraSettings(r=4, alpha=8, targets=("q_proj", "v_proj"))


def _sequences(tokenizer: Any) -> list[TrainSequence]:
    out = []
    for text, adv in (("Haymo of Faversham was an English Franciscan.", 1.0), ("The answer is unknown.", -1.0)):
        prompt = tuple(tokenizer("<|im_start|>user\nWho was Haymo?<|im_end|>\n<|im_start|>assistant\n")["input_ids"])
        resp = tuple(tokenizer(text)["input_ids"])
        n = len(resp)
        out.append(TrainSequence(prompt, resp, (1,) * n, (3,) * n, (adv,) * n))
    return out


def test_an_update_changes_every_lora_parameter_and_no_base_parameter(smollm2_dir: Path) -> None:
    model, tok = load_trainable(smollm2_dir, lora=SMALL_LORA, gradient_checkpointing=True, seed=0)
    lora_before = {n: p.detach().clone() for n, p in model.named_parameters() if p.requires_grad}
    base_before = {n: p.detach().clone() for n, p in model.named_parameters() if not p.requires_grad}
    assert lora_before and all("lora_" in n for n in lora_before)
    opt = torch.optim.AdamW(trainable_parameters(model), lr=1e-3)
    seqs = _sequences(tok)
    # LoRA's B starts at zero, so A has no gradient on the first step: two steps reach every LoRA matrix.
    stats = [policy_update(model, opt, seqs, pad_id=tok.pad_token_id, beta=0.001) for _ in range(2)]
    assert all(s.skipped is None and math.isfinite(s.loss) for s in stats)
    assert stats[0].trainable_tokens == sum(s.n_trainable for s in seqs) and stats[0].metrics["ratio_mean"] == 1.0
    after = dict(model.named_parameters())
    unchanged = [n for n, p in lora_before.items() if torch.equal(p, after[n].detach())]
    assert not unchanged, f"LoRA parameters that did not change: {unchanged[:3]}"
    changed_base = [n for n, p in base_before.items() if not torch.equal(p, after[n].detach())]
    assert not changed_base
    # Masked tokens contribute nothing: zeroing the mask leaves nothing to train.
    masked = [TrainSequence(s.prompt_ids, s.response_ids, (0,) * len(s.mask), (-1,) * len(s.mask),
                            (0.0,) * len(s.mask)) for s in seqs]
    assert policy_update(model, opt, masked, pad_id=tok.pad_token_id).skipped == "no trainable tokens"


def test_the_update_weights_tokens_by_the_truncated_sampler_ratio_when_asked(smollm2_dir: Path) -> None:
    """Sampler log-probs 1 nat below the trainer's give every token the capped weight e^1 → 2 with tis_cap=2; the
    same update without the cap has weight 1. The mismatch metrics measure the gap (mean and max 1, KL e − 2)."""
    model, tok = load_trainable(smollm2_dir, lora=SMALL_LORA, seed=0)
    opt = torch.optim.SGD(trainable_parameters(model), lr=0.0)  # the weights stay put: both runs see the same π_old
    plain = _sequences(tok)

    def shifted(by: float) -> list[TrainSequence]:
        return [TrainSequence(s.prompt_ids, s.response_ids, s.mask, s.stages, s.advantages,
                              tuple(x - by for x in _trainer_logprobs(model, tok, s))) for s in plain]

    with_cap = policy_update(model, opt, shifted(1.0), pad_id=tok.pad_token_id, beta=0.0, tis_cap=2.0)
    without = policy_update(model, opt, shifted(1.0), pad_id=tok.pad_token_id, beta=0.0, tis_cap=None)
    below = policy_update(model, opt, shifted(-0.5), pad_id=tok.pad_token_id, beta=0.0, tis_cap=2.0)
    assert with_cap.metrics["is_weight_mean"] == pytest.approx(2.0, abs=1e-3)
    assert without.metrics["is_weight_mean"] == 1.0
    assert below.metrics["is_weight_mean"] == pytest.approx(math.exp(-0.5), abs=2e-3)
    assert with_cap.loss == pytest.approx(2.0 * without.loss, rel=1e-3)  # ρ = 1: the loss is the weighted −A mean
    assert with_cap.metrics["sampler_logprob_gap"] == pytest.approx(1.0, abs=1e-3)
    assert with_cap.metrics["sampler_kl"] == pytest.approx(math.e - 2, abs=2e-3)
    no_sampler = policy_update(model, opt, plain, pad_id=tok.pad_token_id, beta=0.0, tis_cap=2.0)
    assert no_sampler.metrics["is_weight_mean"] == 1.0 and math.isnan(no_sampler.metrics["sampler_logprob_gap"])


def _trainer_logprobs(model: Any, tok: Any, s: TrainSequence) -> tuple[float, ...]:
    """The trainer's own log-probs of `s`'s response tokens (the same pass the update takes, no gradient)."""
    from learning.sequences import collate, response_logprobs

    model.eval()
    with torch.no_grad():
        lp = response_logprobs(model, collate([s], tok.pad_token_id), 1.0)[0]
    model.train()
    return tuple(float(x) for x in lp[: len(s.response_ids)])


def _judgement(sid: str, **scores: float | None) -> Judgement:
    return Judgement(session_id=sid, question="q", judge_model="m", judge_kind="offline",
                     stages={s: StageResult(stage=s, score=v) for s, v in scores.items()})  # type: ignore[arg-type]


def test_score_matrix_falls_back_to_the_answer_score_and_drops_rollouts_without_one() -> None:
    js = [_judgement("a", plan=0.5, research=None, review=0.25, answer=1.0),
          _judgement("b", plan=0.0, research=0.5, review=0.5, answer=None),
          _judgement("c", plan=1.0, research=1.0, review=1.0, answer=0.0)]
    scores, kept, counts = score_matrix(js)
    assert kept == [0, 2] and counts == {"no_answer_score": 1, "stage_fallbacks": 1}
    assert scores.tolist() == [[0.5, 1.0, 0.25, 1.0], [1.0, 1.0, 1.0, 0.0]]


def _traj(sid: str, logprob: float) -> Trajectory:
    turns = (
        Turn("plan", "sampled", "<structured_plan>p</structured_plan>", (1, 2, 3), (-0.1, -0.2, logprob), "p", "s"),
        Turn("research", "tool_output", "<tool_output>x</tool_output>", (4, 5), (), "p", "s", "tokenizer"),
        Turn("answer", "sampled", "<answer>a</answer>", (6, 7), (-0.3, -0.4), "p", "s"),
    )
    return Trajectory(sid, "q", PromptRecord("prompt", (9, 9), "s"), turns)


def test_task_sequences_map_stage_advantages_to_sampled_tokens_and_refuse_nan_logprobs() -> None:
    scores = torch.tensor([[1.0, 0.5, 0.5, 1.0], [0.0, 0.5, 0.5, 0.0], [0.5, 0.5, 0.5, 0.5]])
    group = Group("q", ["a", "b", "c"], [_traj("a", -0.5), _traj("b", -0.5), _traj("c", float("nan"))], scores)
    seqs, adv, bad = task_sequences(group, paper_lambda(), "ss-grpo")
    assert bad == 1 and len(seqs) == 2  # the rollout with a NaN sampler log-prob is never trained
    s = seqs[0]
    assert s.mask == (1, 1, 1, 0, 0, 1, 1) and s.stages == (0, 0, 0, -1, -1, 3, 3)
    assert s.advantages[:3] == (pytest.approx(float(adv[0, 0])),) * 3 and s.advantages[3:5] == (0.0, 0.0)
    assert s.advantages[5] == pytest.approx(float(adv[0, 3]))
    _, base, _ = task_sequences(group, paper_lambda(), "answer-only")
    assert torch.allclose(base[:, 0], base[:, 3])  # the baseline gives every stage the Answer advantage


def test_a_group_whose_rollouts_all_score_the_same_is_left_out_and_counted() -> None:
    same = Group("q", ["a", "b"], [_traj("a", -0.5), _traj("b", -0.5)], torch.tensor([[0.5, 0.5, 0.5, 0.5]] * 2))
    spread = Group("r", ["c", "d"], [_traj("c", -0.5), _traj("d", -0.5)],
                   torch.tensor([[1.0, 0.5, 0.5, 1.0], [0.0, 0.5, 0.5, 0.0]]))
    counts: dict[str, int] = {}
    seqs, idle = step_sequences([same, spread], paper_lambda(), "ss-grpo", counts)
    assert len(seqs) == 2 and len(idle) == 2 and counts["groups_skipped_same_score"] == 1
    assert all(a == 0.0 for s in idle for a in s.advantages)  # kept apart: only to measure the sampler mismatch
    # answer-only looks at the Answer score alone: equal Answer scores carry nothing even where the plan differs
    plan_only = Group("p", ["e", "f"], [_traj("e", -0.5), _traj("f", -0.5)],
                      torch.tensor([[1.0, 0.5, 0.5, 0.5], [0.0, 0.5, 0.5, 0.5]]))
    counts = {}
    assert step_sequences([plan_only], paper_lambda(), "answer-only", counts)[0] == []
    assert counts["groups_skipped_same_score"] == 1


def test_a_step_with_nothing_to_train_on_says_why() -> None:
    base = dict.fromkeys(("rollouts_failed", "groups_skipped_rollouts", "groups_skipped_judge",
                          "groups_skipped_scores", "groups_skipped_same_score"), 0)
    assert "every rollout failed (4 of 4)" in str(_why_no_update(base | {"rollouts_failed": 4}, 4))
    assert "scored the same (2 group(s))" in str(_why_no_update(base | {"groups_skipped_same_score": 2}, 8))
    mixed = _why_no_update(base | {"groups_skipped_judge": 1, "groups_skipped_same_score": 1}, 8)
    assert mixed is not None and "1 judge failures" in mixed and "1 all the same" in mixed
    assert _why_no_update(base, 4) is None
    assert "2 rollout(s) without sampler log-probs" in str(_why_no_update(base | {"nan_logprob_rollouts": 2}, 4))
    assert _why_no_update(base, 0) is None  # a process without questions this step has nothing to explain


def test_resuming_drops_the_rows_of_steps_after_the_checkpoint_and_a_torn_row(tmp_path: Path) -> None:
    path = tmp_path / "metrics.jsonl"
    path.write_text('{"step": 0, "x": 1}\n{"step": 1, "x": 2}\n{"step": 2, "x": 3}\n{"step": 3, "x"')
    _drop_rows_after(path, 1)
    assert path.read_text() == '{"step": 0, "x": 1}\n{"step": 1, "x": 2}\n'
    _drop_rows_after(tmp_path / "absent.jsonl", 0)  # nothing to do


def test_reflection_sequences_train_only_the_candidate_tokens_with_group_normalised_rewards(tmp_path: Path) -> None:
    from tests.reflection.helpers import add_session  # a completed session with an ok judgement

    log = SessionLog(tmp_path / "s.sqlite3")
    sid = add_session(log, "s-refl")
    prompt = PromptRecord("reflect on this", (5, 6, 7, 8), "sha")
    cands = [
        ReflectionCandidate(0, "<reflection_rubrics>a</reflection_rubrics><reflection_takeaways>b", (11, 12), "p",
                            (-0.5, -0.6), forced_suffix="</reflection_takeaways>", valid=True, u=0.8,
                            diagnostic_accuracy=0.8, specificity=0.8, scope_balance=0.8, u_within=0.8, u_cross=0.8),
        ReflectionCandidate(1, "no blocks", (13, 14, 15), "p", (-0.1, -0.1, -0.1), validity_error="no blocks"),
        ReflectionCandidate(2, "<reflection_rubrics>c</reflection_rubrics><reflection_takeaways>d"
                            "</reflection_takeaways>", (16,), "p", (-0.2,), valid=True, u=0.4,
                            diagnostic_accuracy=0.4, specificity=0.4, scope_balance=0.4, u_within=0.4, u_cross=0.4),
    ]
    batch = log.record_reflection_batch(sid, cands, prompt=prompt, judge_model="j", temperature=0.7, max_tokens=64)
    seqs, info = reflection_sequences(log, [batch])
    assert [s.prompt_ids for s in seqs] == [prompt.token_ids] * 3  # the trajectory/prompt is context only
    assert [s.response_ids for s in seqs] == [(11, 12), (13, 14, 15), (16,)]  # the forced suffix is not trained
    assert all(set(s.mask) == {1} for s in seqs)
    advs = [s.advantages[0] for s in seqs]
    assert advs[0] > advs[2] > advs[1] and abs(sum(advs)) < 1e-5  # invalid = reward 0, then group-normalised
    assert info["reflection/candidates"] == 3.0


@pytest.mark.slow
def test_the_loop_trains_checkpoints_and_resumes_a_crashed_run_exactly(tiny_model_dir: Path, tmp_path: Path) -> None:
    from app.settings import Settings
    from app.training import build_trainer
    from learning.grpo import train
    from learning.train_config import load_config
    from store.config import StoreConfig

    settings = Settings(store=StoreConfig(data_dir=tmp_path / "data")).model_copy(deep=True)
    settings = settings.model_copy(update={"agent": settings.agent.model_copy(update={
        "embedded_model_path": tiny_model_dir})})
    tiny = {"steps": 2, "batch_questions": 1, "rollouts": 2, "max_tool_calls": 1, "plan_tokens": 24,
            "research_tokens": 16, "review_tokens": 16, "answer_tokens": 24, "reflection_candidates": 2,
            "reflection_tokens": 24, "n_questions": 4, "curriculum_window": 1, "lr": 1e-3, "lora_r": 4,
            "gradient_checkpointing": False, "temperature": 1.0}

    def run(name: str, crash_at_call: int | None = None) -> Any:
        cfg = load_config(None, None, name=name, **tiny)
        parts, folder = build_trainer(settings, cfg)
        calls = [0]
        real = parts.run_session

        async def session(question: str, options: Any) -> Any:
            calls[0] += 1
            if crash_at_call is not None and calls[0] == crash_at_call:
                raise KeyboardInterrupt("simulated crash")  # a BaseException: nothing in the loop catches it
            return await real(question, options)

        parts.run_session = session

        async def go() -> Any:
            try:
                return await train(cfg, parts, folder)
            finally:
                await parts.policy.aclose()

        return asyncio.run(go()), folder

    straight, folder_a = run("straight")
    rows_a = [json.loads(x) for x in (folder_a / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows_a] == [0, 1] and straight.version == "straight@2"
    assert rows_a[0]["mode"] == "cross" and rows_a[1]["mode"] == "within" and rows_a[1]["replay"]
    assert all(math.isfinite(r["task/loss"]) for r in rows_a) and rows_a[1]["reflection/candidates"] == 2.0
    assert (folder_a / "adapters" / "straight@2" / "adapter_config.json").is_file()
    for r in rows_a:  # each rollout's total, one list per question; their mean is the mean of the stage rewards
        totals = [x for g in r["reward/rollout_totals"] for x in g]
        assert len(r["reward/rollout_totals"]) == r["groups"] and len(totals) == r["groups"] * tiny["rollouts"]
        mean_stages = sum(r[f"reward/{s}"] for s in ("plan", "research", "review", "answer")) / 4
        assert sum(totals) / len(totals) == pytest.approx(mean_stages, abs=1e-3)

    with pytest.raises(KeyboardInterrupt):
        run("crashed", crash_at_call=3)  # step 0 uses calls 1-2; the crash is in step 1's first rollout
    resumed, folder_b = run("crashed")
    assert resumed.resumed_from == 0 and resumed.steps_done == 1
    rows_b = [json.loads(x) for x in (folder_b / "metrics.jsonl").read_text().splitlines()]
    same = ("reward/plan", "reward/research", "reward/review", "reward/answer", "reward/rollout_totals", "task/loss",
            "task/tokens",
            "task/trainable_tokens", "reflection/loss", "reflection/mean_reward")
    assert {k: rows_b[-1][k] for k in same} == {k: rows_a[-1][k] for k in same}
    from safetensors.torch import load_file

    wa = load_file(str(folder_a / "adapters" / "straight@2" / "adapter_model.safetensors"))
    wb = load_file(str(folder_b / "adapters" / "crashed@2" / "adapter_model.safetensors"))
    assert wa.keys() == wb.keys() and all(torch.allclose(wa[k], wb[k], atol=1e-6) for k in wa)
