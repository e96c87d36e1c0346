"""Settings of one SS-GRPO training run (`rubricem train --config FILE.toml` or `--preset NAME`).

Defaults are the small CPU values; the paper's values (METHOD §5.7) are noted per field. A TOML file holds any subset
of the fields at top level.
"""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from learning.errors import LearningError


class TrainConfigError(LearningError, ValueError):
    """The training configuration file or preset is unusable."""


class TrainConfig(BaseModel):
    """One training run."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(default="ssgrpo", pattern=r"^[A-Za-z0-9_.-]{1,64}$",
                      description="Run name: adapters are served as NAME@STEP.")
    out_dir: Path | None = Field(default=None, description="Run folder (default: DATA_DIR/runs/NAME).")
    model_dir: Path | None = Field(default=None, description="Base model folder (default: the bundled SmolLM2).")
    init_adapter: Path | None = Field(default=None, description="Start from this LoRA adapter (e.g. the live one).")
    reference_adapter: Path | None = Field(
        default=None, description="The KL anchor when it is not init_adapter: a long run continued on a new machine "
        "from an adapter it committed keeps anchoring to the adapter the whole run began from (issue 62). Needs "
        "init_adapter; default: init_adapter itself.")
    questions: Path | None = Field(
        default=None, description="Question pool: .txt (one per line), .jsonl with a 'question' field, or a DeepRubric "
        "pairs.jsonl (its rubrics become each question's persistent Answer-stage rubrics); default: questions built "
        "from the bundled Wikipedia corpus.")
    n_questions: int = Field(default=24, ge=2, description="Size of the bundled question pool.")
    heldout_questions: int = Field(default=0, ge=0, description="Questions kept out of training for evaluation.")
    steps: int = Field(default=4, ge=1, description="Optimizer steps (paper: 600 ablations, 1400 final).")
    batch_questions: int = Field(default=2, ge=1, description="Distinct questions per step (paper: 32).")
    rollouts: int = Field(default=4, ge=2, description="Rollouts per question n (paper: 8).")
    credit: Literal["ss-grpo", "answer-only"] = Field(
        default="ss-grpo", description="ss-grpo: stage returns mixed by the paper's Λ; answer-only: plain GRPO on the "
        "Answer score (ablation baseline).")
    reward: Literal["stagewise", "deeprubric"] = Field(
        default="stagewise", description="stagewise: the stagewise judge's stage scores, credited per `credit`; "
        "deeprubric: DeepRubric's scalar reward (METHOD §11.6) against each question's pair, given to every sampled "
        "token as plain GRPO (needs `questions` = a pairs.jsonl).")
    lr: float = Field(default=2e-4, gt=0, description="AdamW learning rate (paper, full 8B: 5e-7).")
    lora_r: int = Field(default=16, ge=1, description="LoRA rank.")
    lora_alpha: int = Field(default=32, ge=1, description="LoRA alpha.")
    full_finetune: bool = Field(default=False, description="Train every weight instead of a LoRA adapter.")
    clip: float = Field(default=0.2, gt=0, lt=1, description="PPO clip ε (D5).")
    beta: float = Field(default=0.001, ge=0, description="KL3 coefficient β (D5).")
    tis_cap: float | None = Field(default=2.0, gt=0, description="Truncated importance sampling: weight each "
                                  "token's surrogate by min(π_old / π_sampler, cap), π_old being the trainer's "
                                  "recomputation and π_sampler what the serving engine reported (vLLM or the "
                                  "embedded policy); null turns the correction off.")
    max_sampler_kl: float | None = Field(
        default=0.05, gt=0, description="Skip an update (no optimizer step; metrics.jsonl's task/skipped or "
        "reflection/skipped gives the value and the threshold) whose sampler-trainer mismatch, the mean k3 estimate "
        "of KL(sampler || trainer) per token over the tokens with a sampler log-prob (`sampler_kl`), exceeds this. "
        "0.05 nats sits about 8x above the numeric gap of a sound engine on SmolLM2-135M (bf16 vLLM or torch: ~0.002; "
        "llama.cpp's Q4_1 GGUF: ~0.006) and below the faults (log-probs at the wrong temperature: ~0.13; a sampler "
        "missing the trainer's adapter: ~0.45). null (inf in a TOML file) never skips.")
    max_grad_norm: float = Field(default=1.0, gt=0)
    temperature: float = Field(default=1.0, gt=0, description="Rollout sampling temperature (paper: 1.0).")
    max_tool_calls: int = Field(default=2, ge=1, le=10, description="Tool calls per rollout (paper: 10).")
    plan_tokens: int = Field(default=96, ge=8)
    research_tokens: int = Field(default=48, ge=8)
    review_tokens: int = Field(default=64, ge=8)
    answer_tokens: int = Field(default=96, ge=8)
    context_tokens: int = Field(default=4096, ge=512)
    format: Literal["exact_answer", "short_form", "long_form"] = "short_form"
    token_budget: int = Field(default=4096, ge=256, description="Padded tokens per micro-batch.")
    dtype: Literal["float32", "bfloat16"] = Field(default="float32", description="Trainer weights dtype.")
    gradient_checkpointing: bool = True
    reflection: bool = Field(default=True, description="Train the reflection meta-policy and fill the bank.")
    reflection_candidates: int = Field(default=4, ge=2, description="Reflection candidates m (paper: 8).")
    reflection_tokens: int = Field(default=160, ge=16)
    reflection_threshold: float = Field(default=0.5, ge=0, le=1, description="Minimum u to enter the bank.")
    curriculum_window: int = Field(default=3, ge=0, description="K of the windowed curriculum (0: no replay).")
    checkpoint_every: int = Field(default=1, ge=1)
    keep_checkpoints: int = Field(default=2, ge=1)
    seed: int = 0
    judge: Literal["auto", "offline", "llm"] = Field(
        default="auto", description="auto: the LLM judge when one is configured, else the offline judge.")
    verifiable_weight: float = Field(
        default=0.0, ge=0, le=1, description="Weight w of the verifiable term in the Answer-stage reward for training "
        "questions that carry a gold answer (a .jsonl question file's 'answers' or 'answer', and optional "
        "'gold_titles'): R_answer' = (1 - w) R_answer + w v, v the mean of the answer's token F1 and the share of "
        "its references that are gold passages (learning/judge/verifiable.py). Recorded in every judgement "
        "('verifiable'); 0 turns it off. Held-out evaluation never uses it.")

    @model_validator(mode="after")
    def _reward_needs_pairs(self) -> TrainConfig:
        if self.reward == "deeprubric" and self.questions is None:
            raise ValueError("reward = 'deeprubric' scores answers against query-rubric pairs: set questions to a "
                             "pairs.jsonl (rubricem deeprubric build writes one)")
        if self.verifiable_weight > 0 and self.reward != "stagewise":
            raise ValueError("verifiable_weight mixes into the stagewise judge's Answer score; reward = "
                             f"'{self.reward}' never reads it: set verifiable_weight = 0 or reward = 'stagewise'")
        if self.reference_adapter is not None and self.init_adapter is None:
            raise ValueError("reference_adapter anchors a run continued from init_adapter: set init_adapter too")
        return self


PRESETS: dict[str, dict[str, object]] = {
    # A few steps on the embedded SmolLM2 with the offline judge, minutes on a laptop CPU.
    "cpu-smoke": {"name": "cpu-smoke", "steps": 2, "batch_questions": 1, "rollouts": 2, "max_tool_calls": 1,
                  "plan_tokens": 48, "research_tokens": 32, "review_tokens": 32, "answer_tokens": 48,
                  "reflection_candidates": 2, "reflection_tokens": 96, "n_questions": 8, "curriculum_window": 1},
}


def load_config(path: Path | None = None, preset: str | None = None, **overrides: object) -> TrainConfig:
    """A TrainConfig from a preset and/or a TOML file (file values win), then keyword overrides.

    Raises:
        TrainConfigError: unknown preset, unreadable file, or invalid values (the message names the field).
    """
    values: dict[str, object] = {}
    if preset is not None:
        if preset not in PRESETS:
            raise TrainConfigError(f"unknown preset {preset!r}; choose from {sorted(PRESETS)}")
        values.update(PRESETS[preset])
    if path is not None:
        try:
            values.update(tomllib.loads(Path(path).read_text(encoding="utf-8")))
        except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
            raise TrainConfigError(f"cannot read training config {path}: {exc}") from exc
    values.update({k: v for k, v in overrides.items() if v is not None})
    try:
        return TrainConfig.model_validate(values)
    except ValidationError as exc:
        problems = "; ".join(f"{'.'.join(str(p) for p in e['loc'])}: {e['msg']}" for e in exc.errors(
            include_input=False))
        raise TrainConfigError(f"invalid training config: {problems}") from exc
