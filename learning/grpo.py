"""The SS-GRPO loop (RubricEM, arXiv 2605.10899 §3.3-3.4): stage-structured GRPO for the task policy plus the
reflection meta-policy on the same backbone.

Objective. For each question, n rollouts run through the real agent graph; the stagewise judge scores each rollout's
Plan, Research, Review and Answer stages R_{i,k} ∈ [0,1]. Stage returns G_{i,k} = Σ_{j≥k} Λ_{k,j} R_{i,j} (Λ causal,
upper-triangular) are normalised per stage across the group, A_{i,k} = (G_{i,k} − mean) / (std + ε), and every
sampled token of stage k gets A_{i,k}. The loss is PPO-clip with a KL3 penalty to the policy the run started
from (the init adapter, frozen; the base model for a fresh LoRA: learning/update.py), as a token-level masked mean
(METHOD D5). Vanilla GRPO is the special case of one terminal score broadcast to every token
(`credit = "answer-only"`): SS-GRPO differs by crediting each stage with its own score plus discounted credit from
the later stages it enables.

DeepRubric's GRPO (`reward = "deeprubric"`, METHOD §11.6) is the runnable baseline beside it: each question comes from
a query–rubric pair, each rollout gets one scalar reward against that pair's criteria (learning/deeprubric/reward.py),
group-normalised and given to every sampled token, exactly as the answer-only credit does. The stagewise judge still
judges each group (with the pair's criteria as persistent Answer-stage rubrics) only when reflections are on: the
reflection writer reads that judgement, which is logged but plays no part in the advantages. Without reflections the
group is not stage-judged at all (no second judge call per group: DeepRubric's compute is its rubric scorer alone). A rollout whose rubric term cannot be scored is
dropped from its group, like a rollout without an Answer score.

Reflection meta-policy. After a group is judged, one rollout (uniformly at random) is reflected on by the same
policy (m candidates, scored by the reflection judge); the best valid one enters the rubric bank and all candidates
are trained on their own tokens one step later (Phase A of the next step: one-step staleness), with group-normalised
rewards (D9). Rollouts retrieve bank items by the windowed curriculum: fresh batches cross-episode, replayed batches
within-episode (METHOD §8).

One step, top to bottom:
  1. Phase A: train on the reflection candidates written during the previous step.
  2. Roll out n trajectories per question (the policy serves the latest adapter).
  3. Judge each group; skip groups that cannot be scored, and groups whose rollouts all get the same advantages
     (every score equal under the credit mode: no learning signal), each counted. A step left with no group takes
     no optimizer step and says why in `task/skipped` (every rollout failed, none was scored, or all scored the same).
  4. Launch this step's reflections (they overlap the update below).
  5. Phase B: the SS-GRPO update. An update whose sampler-trainer KL exceeds `max_sampler_kl` (either phase) takes
     no optimizer step (learning/update.py); the step still publishes, logs its row (`task/skipped` or
     `reflection/skipped` with the measured KL and the threshold) and checkpoints, so the step counter and resume are
     those of any other step.
  6. Wait for the reflections, publish the new adapter to the policy (NAME@STEP), log metrics, checkpoint.

Held-out questions (learning/eval/heldout.py) never train: a question pool that holds one is refused before anything
loads, naming its id.

Checkpoints (accelerate `save_state`: weights, optimizer, RNG) also hold the run's session log (rollouts, judgements,
rubric buffers, reflection candidates), the run's bank and the step, so a crash resumes at the next step exactly.
Under `accelerate launch` every process takes its share of each step's questions; gradients are synchronised by the
configured engine (DeepSpeed ZeRO-3 or FSDP configs in learning/accelerate/).
"""

from __future__ import annotations

import asyncio
import json
import math
import random
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import torch

from agent.config import RunOptions, StageTokenCaps
from agent.protocols import PolicyClient
from learning.advantages import credit_lambda, credit_scores, group_advantages, stage_advantages, token_advantages
from learning.checkpoint import CheckpointError, latest_checkpoint, prune_checkpoints, save_checkpoint
from learning.curriculum import StepBatch, step_batch
from learning.errors import LearningError
from learning.eval.heldout import refuse_heldout
from learning.judge.types import Judgement, Rubric, TrajectoryJudge
from learning.memory import release_freed_memory
from learning.model import LoraSettings, load_trainable, save_adapter, trainable_parameters
from learning.sequences import TrainSequence, has_bad_logprobs, trajectory_stages_and_mask
from learning.train_config import TrainConfig
from learning.update import UpdateStats, policy_update
from store.records import STAGES, Trajectory
from store.rubric_bank import RubricBank
from store.session_log import SessionLog

RunSession = Callable[[str, RunOptions], Awaitable[tuple[str, Trajectory]]]
"""Runs one research session (writing it to the run's session log) and returns (session id, trajectory)."""

GroupReward = Callable[[str, Sequence[Trajectory]], Awaitable[Sequence[Any]]]
"""The scalar reward of each trajectory of a question's group: objects with `.reward` (float, or None when
unscorable) and `.as_metrics(prefix)` (learning.deeprubric.scorer.RubricReward)."""

Progress = Callable[[dict[str, Any]], None]


class TrainingError(LearningError):
    """The training run cannot start or continue (the message says why and what to do)."""


class Reflector(Protocol):
    """Writes reflections for a judged session (learning.reflection.writer.write_reflection bound to its parts)."""

    async def __call__(self, session_id: str, seed: int) -> str | None:
        """The stored candidate batch id, or None when nothing was stored."""
        ...


@dataclass
class TrainerParts:
    """What the loop uses, built by the app's composition root."""

    policy: PolicyClient  # rollouts and reflection sampling; must support `aload_adapter(path, version)`
    run_session: RunSession
    log: SessionLog  # the run's own session log
    judge: TrajectoryJudge
    model_dir: Path
    questions: list[str]
    reflect: Reflector | None = None
    bank: RubricBank | None = None  # the run's own bank collection
    persistent: Mapping[str, tuple[Rubric, ...]] = field(default_factory=dict)  # question -> persistent rubrics
    rubric_reward: GroupReward | None = None  # required by reward = "deeprubric"
    # A group's rollouts run at once against a serving engine (vLLM batches them continuously); one after another
    # on the in-process policy, which samples one sequence at a time anyway and keeps the order of its seeds.
    concurrent_rollouts: bool = False
    heldout: Mapping[str, str] = field(default_factory=dict)  # normalised held-out question -> its id (refused)


@dataclass
class Group:
    """The judged rollouts of one question."""

    question: str
    session_ids: list[str]
    trajectories: list[Trajectory]
    scores: torch.Tensor  # (n, K); reward = "deeprubric": the scalar reward in every column
    terms: list[dict[str, float]] = field(default_factory=list)  # deeprubric: each kept rollout's reward terms


@dataclass
class TrainSummary:
    """What `train` did."""

    run_dir: Path
    steps_done: int
    resumed_from: int | None
    adapter: Path | None
    version: str | None
    metrics_path: Path
    history: list[dict[str, Any]] = field(default_factory=list)


def rollout_seed(seed: int, step: int, question: int, rollout: int) -> int:
    """A deterministic sampling seed per rollout (resumed runs sample exactly what the crashed run would have)."""
    return (seed * 1_000_003 + step * 10_007 + question * 101 + rollout) % (2**31 - 1)


def run_options(cfg: TrainConfig, seed: int, mode: str) -> RunOptions:
    """Research options of a rollout: the run's budgets and temperature, bank retrieval per the curriculum."""
    return RunOptions(
        format=cfg.format, max_tool_calls=cfg.max_tool_calls, temperature=cfg.temperature, seed=seed,
        wall_clock_s=3600, context_tokens=cfg.context_tokens, inject_bank=mode != "none",
        bank_mode="auto" if mode == "none" else mode,  # type: ignore[arg-type]
        token_caps=StageTokenCaps(plan=cfg.plan_tokens, research=cfg.research_tokens, review=cfg.review_tokens,
                                  answer=cfg.answer_tokens),
    )


def score_matrix(judgements: Sequence[Judgement]) -> tuple[torch.Tensor, list[int], dict[str, int]]:
    """Stage scores (n_kept, K) of the usable judgements, their positions, and counts of what was dropped.

    A stage the judge could not score falls back to the Answer score (the paper's fallback, METHOD §5.2 C.4); a
    rollout without an Answer score is dropped. Absent stages arrive as R = 0 from the judge (D7).
    """
    rows: list[list[float]] = []
    kept: list[int] = []
    counts = {"no_answer_score": 0, "stage_fallbacks": 0}
    for i, j in enumerate(judgements):
        scores = j.stage_scores()
        answer = scores.get("answer")
        if answer is None or not math.isfinite(answer):
            counts["no_answer_score"] += 1
            continue
        row = []
        for s in STAGES:
            v = scores.get(s)
            if v is None or not math.isfinite(v):
                counts["stage_fallbacks"] += 1
                v = answer
            row.append(float(v))
        rows.append(row)
        kept.append(i)
    return torch.tensor(rows, dtype=torch.float32).reshape(len(rows), len(STAGES)), kept, counts


def task_sequences(group: Group, lam: torch.Tensor, credit: str) -> tuple[list[TrainSequence], torch.Tensor, int]:
    """Training sequences of a judged group, the (n, K) stage advantages, and how many rollouts had NaN logprobs."""
    adv = stage_advantages(credit_scores(group.scores, credit), lam)  # (n, K)
    seqs: list[TrainSequence] = []
    bad = 0
    for traj, a in zip(group.trajectories, adv, strict=True):
        if has_bad_logprobs(traj):
            bad += 1
            continue
        stages, mask, sampled = trajectory_stages_and_mask(traj)
        tok_adv = token_advantages(torch.tensor(stages, dtype=torch.long), a)  # (T,)
        seqs.append(TrainSequence(traj.prompt.token_ids, traj.token_ids, mask, stages,
                                  tuple(float(x) for x in tok_adv), sampled, "task"))
    return seqs, adv, bad


def step_sequences(groups: Sequence[Group], lam: torch.Tensor, credit: str, counts: dict[str, int]
                   ) -> tuple[list[TrainSequence], list[TrainSequence]]:
    """(the sequences to train on, the sequences of groups without signal) of a step's groups.

    A group whose rollouts all get zero advantage (every score equal under the credit mode) carries no learning
    signal: it is counted in `groups_skipped_same_score` and kept apart. A step with only such groups takes no
    optimizer step (training on them would only move the weights by the KL term and Adam's momentum); their
    sequences still serve to measure the sampler-trainer mismatch.
    """
    seqs: list[TrainSequence] = []
    idle: list[TrainSequence] = []
    for g in groups:
        s, _adv, bad = task_sequences(g, lam, credit)
        counts["nan_logprob_rollouts"] = counts.get("nan_logprob_rollouts", 0) + bad
        if any(a != 0 for q in s for a in q.advantages):  # the kept rollouts' tokens (NaN ones are already out)
            seqs += s
        else:
            counts["groups_skipped_same_score"] = counts.get("groups_skipped_same_score", 0) + 1
            idle += s
    return seqs, idle


def reflection_sequences(log: SessionLog, batch_ids: Sequence[str]) -> tuple[list[TrainSequence], dict[str, float]]:
    """Sequences of stored reflection candidates with group-normalised rewards (D9), reflection tokens only.

    Reward: the judge's u; an invalid candidate (not in the two-block format) gets 0, so the format is learned; a
    valid candidate the judge failed to score is left out of the normalisation (advantage 0).
    """
    seqs: list[TrainSequence] = []
    rewards_all: list[float] = []
    for batch_id in batch_ids:
        rows = log.reflection_candidates(batch_id=batch_id)
        rewards = [0.0 if not r.candidate.valid else (float("nan") if r.candidate.u is None else r.candidate.u)
                   for r in rows]
        adv = group_advantages(torch.tensor(rewards, dtype=torch.float32))  # (m,)
        for r, a in zip(rows, adv, strict=True):
            c = r.candidate
            n = len(c.token_ids)
            trainable = 1 if c.token_source != "retokenized" else 0
            lps = c.logprobs if len(c.logprobs) == n else tuple([float("nan")] * n)
            seqs.append(TrainSequence(r.prompt.token_ids, c.token_ids, (trainable,) * n, (0,) * n,
                                      (float(a) * trainable,) * n, lps, "reflection"))
        rewards_all += [x for x in rewards if not math.isnan(x)]
    mean_u = sum(rewards_all) / len(rewards_all) if rewards_all else float("nan")
    return seqs, {"reflection/candidates": float(len(seqs)), "reflection/mean_reward": mean_u}


async def collect_group(parts: TrainerParts, cfg: TrainConfig, sb: StepBatch, qi: int, counts: dict[str, int]
                        ) -> Group | None:
    """Roll out and judge one question; None (counted) when the group cannot train."""
    question = parts.questions[sb.indices[qi]]
    sids: list[str] = []
    trajs: list[Trajectory] = []

    def rollout(i: int) -> Awaitable[tuple[str, Trajectory]]:
        return parts.run_session(question, run_options(cfg, rollout_seed(cfg.seed, sb.step, qi, i), sb.mode))

    if parts.concurrent_rollouts:
        outcomes: list[Any] = list(await asyncio.gather(*(rollout(i) for i in range(cfg.rollouts)),
                                                        return_exceptions=True))
    else:
        outcomes = []
        for i in range(cfg.rollouts):
            try:
                outcomes.append(await rollout(i))
            except Exception as exc:  # noqa: BLE001 - recorded as failed in the log; the group goes on
                outcomes.append(exc)
    for outcome in outcomes:  # in rollout order, whichever finished first
        if isinstance(outcome, BaseException):
            if not isinstance(outcome, Exception):
                raise outcome
            counts["rollouts_failed"] += 1
            continue
        sid, traj = outcome
        sids.append(sid)
        trajs.append(traj)
        counts["malformed"] += int(traj.malformed or "answer" not in traj.stages_present)
    if len(trajs) < 2:
        counts["groups_skipped_rollouts"] += 1
        return None
    if cfg.reward == "deeprubric" and not (cfg.reflection and parts.reflect is not None):
        return await _rubric_reward_group(parts, question, sids, trajs, counts)  # nothing reads a stage judgement
    try:
        judgements = await parts.judge.judge_group(question, trajs, persistent=parts.persistent.get(question, ()))
    except Exception:  # noqa: BLE001 - an unavailable judge skips the group, it never stops the run
        counts["groups_skipped_judge"] += 1
        return None
    for sid, j in zip(sids, judgements, strict=True):
        parts.log.record_judgement(sid, j.judge_model, j.model_dump(mode="json"), judge_kind=j.judge_kind,
                                   rubric_version=j.rubric_version)
    if cfg.reward == "deeprubric":
        return await _rubric_reward_group(parts, question, sids, trajs, counts)
    scores, kept, dropped = score_matrix(judgements)
    counts["rollouts_unscored"] += dropped["no_answer_score"]
    counts["stage_fallbacks"] += dropped["stage_fallbacks"]
    if len(kept) < 2:
        counts["groups_skipped_scores"] += 1
        return None
    return Group(question, [sids[k] for k in kept], [trajs[k] for k in kept], scores)


async def _rubric_reward_group(parts: TrainerParts, question: str, sids: list[str], trajs: list[Trajectory],
                               counts: dict[str, int]) -> Group | None:
    """A group scored by the DeepRubric reward: the scalar in every stage column (plain GRPO with answer-only)."""
    if parts.rubric_reward is None:
        raise TrainingError("reward = 'deeprubric' needs TrainerParts.rubric_reward (a RubricReward over the pairs)")
    try:
        breakdowns = list(await parts.rubric_reward(question, trajs))
    except Exception:  # noqa: BLE001 - an unavailable scorer skips the group, it never stops the run
        counts["groups_skipped_judge"] += 1
        return None
    kept = [i for i, b in enumerate(breakdowns) if b.reward is not None and math.isfinite(b.reward)]
    counts["rollouts_unscored"] += len(trajs) - len(kept)
    if len(kept) < 2:
        counts["groups_skipped_scores"] += 1
        return None
    scores = torch.tensor([[float(breakdowns[i].reward)] * len(STAGES) for i in kept], dtype=torch.float32)
    return Group(question, [sids[i] for i in kept], [trajs[i] for i in kept], scores,
                 [breakdowns[i].as_metrics() for i in kept])


def start_digest(adapter: Path | None) -> str | None:
    """The identity of the adapter a run starts from (its KL anchor): the SHA-256 of its weights file; None for a
    fresh LoRA."""
    if adapter is None:
        return None
    from learning.engines.files import sha256_file

    files = sorted(Path(adapter).glob("adapter_model.*"))
    if not files:
        raise TrainingError(f"{adapter}: no adapter_model weights file to start from")
    return sha256_file(files[0])


def check_start(state: Mapping[str, Any], anchor: str | None, run_dir: Path) -> None:
    """Refuse to resume a run from another starting adapter than the one it began with: its trained weights would
    come back with another KL anchor. Checkpoints written before the anchor was recorded are let through."""
    if "start_adapter" in state and state["start_adapter"] != anchor:
        began = "none" if state["start_adapter"] is None else f"weights sha256 {str(state['start_adapter'])[:12]}…"
        now = "none" if anchor is None else f"{anchor[:12]}…"
        raise TrainingError(f"{run_dir} began from another starting adapter ({began}) than this run's init_adapter "
                            f"({now}): resume it with the adapter it began from, or use a new run folder")


def _drop_rows_after(metrics_path: Path, step: int) -> None:
    """Keep only the metrics rows of steps up to `step`: a run killed between writing a step's row and its checkpoint
    redoes that step on resume, and must not log it twice."""
    if not metrics_path.is_file():
        return
    lines = metrics_path.read_text(encoding="utf-8").splitlines()

    def keep(line: str) -> bool:
        try:
            return int(json.loads(line).get("step", -1)) <= step
        except (ValueError, AttributeError, TypeError):  # a row torn by the kill itself
            return False

    kept = [line for line in lines if line.strip() and keep(line)]
    if len(kept) != len(lines):
        tmp = metrics_path.with_suffix(".jsonl.tmp")
        tmp.write_text("".join(line + "\n" for line in kept), encoding="utf-8")
        tmp.replace(metrics_path)


def _why_no_update(counts: Mapping[str, int], rollouts: int) -> str | None:
    """Why a step had nothing to train on, from its counts (None: this process had no rollouts to account for)."""
    if rollouts and counts["rollouts_failed"] >= rollouts:
        return f"every rollout failed ({counts['rollouts_failed']} of {rollouts}); no optimizer step"
    causes = {"groups_skipped_rollouts": "too few rollouts", "groups_skipped_judge": "judge failures",
              "groups_skipped_scores": "too few scores", "groups_skipped_same_score": "all the same",
              "nan_logprob_rollouts": "rollout(s) without sampler log-probs"}
    found = {k: counts.get(k, 0) for k in causes if counts.get(k, 0)}
    if set(found) == {"groups_skipped_same_score"}:
        return (f"every group's rollouts scored the same ({found['groups_skipped_same_score']} group(s)): no "
                "learning signal; no optimizer step")
    if found:
        return ("no group to train on (skipped: " + ", ".join(f"{n} {causes[k]}" for k, n in found.items())
                + "); no optimizer step")
    return None


def _step_metrics(step: int, groups: Sequence[Group], counts: dict[str, int], task: UpdateStats,
                  refl: UpdateStats | None, refl_info: dict[str, float], seconds: float) -> dict[str, Any]:
    out: dict[str, Any] = {"step": step, "seconds": round(seconds, 2), "groups": len(groups)} | counts
    if groups:
        all_scores = torch.cat([g.scores for g in groups])  # (N, K)
        for k, s in enumerate(STAGES):
            out[f"reward/{s}"] = round(float(all_scores[:, k].mean()), 4)
        # How much the rollouts of one question differ (issue 45): the within-group SD, averaged over the groups, of
        # the Answer score (what answer-only credits) and of the mean of the stages; 0 means no learning signal.
        answer = STAGES.index("answer")
        out["reward/group_sd_answer"] = round(sum(float(g.scores[:, answer].std(unbiased=False)) for g in groups)
                                              / len(groups), 4)
        out["reward/group_sd_total"] = round(sum(float(g.scores.mean(dim=1).std(unbiased=False)) for g in groups)
                                             / len(groups), 4)
        # Each rollout's total (the mean of its stage scores), one list per question: the step's training reward
        # with an interval that treats questions and rollouts as random (issue 62's positive control).
        out["reward/rollout_totals"] = [[round(float(x), 4) for x in g.scores.mean(dim=1)] for g in groups]
        terms = [t for g in groups for t in g.terms]
        for key in dict.fromkeys(k for t in terms for k in t):
            values = [t[key] for t in terms if key in t]
            out[f"deeprubric/{key}"] = round(sum(values) / len(values), 4)
    out |= task.as_dict("task")
    if refl is not None:
        out |= refl.as_dict("reflection") | refl_info
    out["tokens_per_second"] = round((task.tokens + (refl.tokens if refl else 0)) / max(
        task.seconds + (refl.seconds if refl else 0), 1e-9), 1)
    return out


async def publish(parts: TrainerParts, model: Any, run_dir: Path, name: str, step: int) -> tuple[Path, str]:
    """Save the adapter as NAME@STEP and make the rollout policy serve it."""
    version = f"{name}@{step}"
    path = save_adapter(model, run_dir / "adapters" / version, meta={"version": version, "step": step})
    await parts.policy.aload_adapter(path, version)  # type: ignore[attr-defined]
    return path, version


async def train(cfg: TrainConfig, parts: TrainerParts, run_dir: Path, progress: Progress | None = None
                ) -> TrainSummary:
    """Run (or resume) SS-GRPO training in `run_dir`. See the module docstring."""
    from accelerate import Accelerator

    if not hasattr(parts.policy, "aload_adapter"):
        raise TrainingError("the rollout policy cannot load adapters; use the embedded backend or vLLM")
    if cfg.full_finetune:
        raise TrainingError("full fine-tuning cannot be published to the rollout policy in this version; use LoRA")
    if cfg.reward == "deeprubric" and parts.rubric_reward is None:
        raise TrainingError("reward = 'deeprubric' needs the pairs' reward scorer (app.training.build_trainer makes it "
                            "from a pairs.jsonl question file)")
    refuse_heldout(parts.questions, parts.heldout, "the training question pool")
    run_dir.mkdir(parents=True, exist_ok=True)
    metrics_path = run_dir / "metrics.jsonl"
    accelerator = Accelerator(cpu=not torch.cuda.is_available())
    lora = LoraSettings(r=cfg.lora_r, alpha=cfg.lora_alpha)
    # The KL anchor is the policy this run starts from: the init adapter, frozen beside the trained copy (issue 45).
    model, tokenizer = load_trainable(parts.model_dir, lora=lora, dtype=cfg.dtype, adapter=cfg.init_adapter,
                                      gradient_checkpointing=cfg.gradient_checkpointing, seed=cfg.seed,
                                      reference=cfg.beta > 0,
                                      reference_adapter=cfg.reference_adapter if cfg.beta > 0 else None)
    optimizer = torch.optim.AdamW(trainable_parameters(model), lr=cfg.lr, weight_decay=0.0)
    model, optimizer = accelerator.prepare(model, optimizer)
    credit = cfg.credit if cfg.reward == "stagewise" else "answer-only"  # DeepRubric: one scalar, plain GRPO
    lam = credit_lambda(credit)
    start, deferred, resumed = 0, [], None
    ckpt = latest_checkpoint(run_dir / "checkpoints", on_skip=lambda m: _say(progress, m))
    anchor = start_digest(cfg.init_adapter)
    if cfg.reference_adapter is not None:  # a resume must keep both the start and the anchor
        anchor = f"{anchor}+reference:{start_digest(cfg.reference_adapter)}"
    if ckpt is not None:
        check_start(ckpt.state, anchor, run_dir)  # before anything is restored
        state = ckpt.restore(accelerator, parts.log, parts.bank)
        start, deferred, resumed = state["step"] + 1, list(state.get("deferred", [])), state["step"]
        _say(progress, f"resumed from checkpoint step {state['step']}")
    elif any((run_dir / "checkpoints").glob("step-*")):
        raise TrainingError(f"{run_dir}/checkpoints holds no usable checkpoint; delete it to start afresh")
    if accelerator.is_main_process:
        _drop_rows_after(metrics_path, start - 1)  # rows of steps this run is about to redo
    adapter, version = await publish(parts, accelerator.unwrap_model(model), run_dir, cfg.name, start)
    history: list[dict[str, Any]] = []
    board = _tensorboard(run_dir) if accelerator.is_main_process else None
    for step in range(start, cfg.steps):
        began = time.perf_counter()
        sb = step_batch(step, pool=len(parts.questions), batch_size=cfg.batch_questions,
                        window=cfg.curriculum_window if cfg.reflection and parts.bank is not None else 0,
                        seed=cfg.seed, use_bank=cfg.reflection and parts.bank is not None)
        counts = dict.fromkeys(("rollouts_failed", "rollouts_unscored", "malformed", "stage_fallbacks",
                                "groups_skipped_rollouts", "groups_skipped_judge", "groups_skipped_scores",
                                "groups_skipped_same_score", "nan_logprob_rollouts"), 0)
        # Phase A: the reflection candidates written during the previous step (one-step staleness).
        refl_stats, refl_info = None, {}
        if deferred:
            refl_seqs, refl_info = reflection_sequences(parts.log, deferred)
            refl_stats = await asyncio.to_thread(_update, model, optimizer, refl_seqs, tokenizer, cfg, accelerator,
                                                 0.7)
        mine = range(accelerator.process_index, len(sb.indices), accelerator.num_processes)
        groups = [g for qi in mine if (g := await collect_group(parts, cfg, sb, qi, counts)) is not None]
        seqs, idle = step_sequences(groups, lam, credit, counts)
        signal, empty = bool(seqs), not (seqs or idle)
        if accelerator.num_processes > 1:
            # One decision for every process, or their collectives would hang: train only if some process has
            # signal and none has nothing at all (a process with no sequences cannot join the gradient sync).
            flags = accelerator.reduce(torch.tensor([float(signal), float(empty)], device=accelerator.device),
                                       reduction="sum")
            signal = bool(flags[0].item() > 0 and flags[1].item() == 0)
        why = _why_no_update(counts, len(mine) * cfg.rollouts)
        hold = None if signal else (why or "another process had nothing to train on; no optimizer step")
        seqs = (seqs or idle) if signal else idle
        reflections = asyncio.create_task(_reflect(parts, cfg, step, groups)) if cfg.reflection else None
        # Phase B: the SS-GRPO update (in a worker thread, so reflection sampling proceeds meanwhile).
        task_stats = await asyncio.to_thread(_update, model, optimizer, seqs, tokenizer, cfg, accelerator,
                                             cfg.temperature, hold)
        if not seqs:
            task_stats.skipped = why or task_stats.skipped
        deferred = await reflections if reflections is not None else []
        adapter, version = await publish(parts, accelerator.unwrap_model(model), run_dir, cfg.name, step + 1)
        row = _step_metrics(step, groups, counts, task_stats, refl_stats, refl_info, time.perf_counter() - began)
        row |= {"mode": sb.mode, "replay": sb.replay, "version": version, "reflection_batches": len(deferred)}
        if accelerator.is_main_process:
            with metrics_path.open("a", encoding="utf-8") as f:
                f.write(json.dumps(row) + "\n")
            if board is not None:
                for key, value in row.items():
                    if isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value):
                        board.add_scalar(key, value, step + 1)
        history.append(row)
        if progress is not None:
            progress(row)
        if (step + 1) % cfg.checkpoint_every == 0 or step + 1 == cfg.steps:
            save_checkpoint(run_dir / "checkpoints", step, accelerator, parts.log, parts.bank,
                            {"step": step, "deferred": deferred, "version": version, "start_adapter": anchor})
            prune_checkpoints(run_dir / "checkpoints", cfg.keep_checkpoints)
    return TrainSummary(run_dir, cfg.steps - start, resumed, adapter, version, metrics_path, history)


def _update(model: Any, optimizer: Any, seqs: list[TrainSequence], tokenizer: Any, cfg: TrainConfig,
            accelerator: Any, temperature: float, hold: str | None = None) -> UpdateStats:
    try:
        return policy_update(model, optimizer, seqs, pad_id=int(tokenizer.pad_token_id), clip=cfg.clip,
                             beta=cfg.beta, token_budget=cfg.token_budget, max_grad_norm=cfg.max_grad_norm,
                             temperature=temperature, backward=accelerator.backward, tis_cap=cfg.tis_cap,
                             max_sampler_kl=cfg.max_sampler_kl, hold=hold)
    finally:
        release_freed_memory()  # the update's multi-GB peak goes back to the OS, not kept by malloc (learning.memory)


async def _reflect(parts: TrainerParts, cfg: TrainConfig, step: int, groups: Sequence[Group]) -> list[str]:
    """One reflection batch per group, on a rollout chosen uniformly at random (METHOD §6.2)."""
    if parts.reflect is None:
        return []
    out: list[str] = []
    for qi, g in enumerate(groups):
        rng = random.Random(rollout_seed(cfg.seed, step, qi, 9_999))
        sid = g.session_ids[rng.randrange(len(g.session_ids))]
        try:
            batch = await parts.reflect(sid, rollout_seed(cfg.seed, step, qi, 7_777))
        except Exception:  # noqa: BLE001 - a failed reflection costs its training signal, never the run
            continue
        if batch is not None:
            out.append(batch)
    return out


def _tensorboard(run_dir: Path) -> Any:
    """A TensorBoard writer under run_dir/tensorboard when the tensorboard package is installed, else None."""
    try:
        from torch.utils.tensorboard import SummaryWriter
    except ImportError:
        return None
    return SummaryWriter(log_dir=str(run_dir / "tensorboard"))


def _say(progress: Progress | None, message: str) -> None:
    if progress is not None:
        progress({"message": message})


__all__ = ["CheckpointError", "Group", "TrainSummary", "TrainerParts", "TrainingError", "score_matrix",
           "task_sequences", "train"]
