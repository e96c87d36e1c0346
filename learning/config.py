"""Learning settings section: the judge endpoint (separate from the policy endpoint) and its limits."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import BaseModel, Field, SecretStr


class JudgeConfig(BaseModel):
    """Judge settings (env: RUBRICEM_LEARNING__JUDGE__<FIELD>). No base_url = the offline (approximate) judge."""

    base_url: str | None = Field(
        default=None,
        description="OpenAI-compatible judge server root (e.g. https://api.openai.com, http://127.0.0.1:8002); "
        "empty = the offline approximate judge.",
    )
    model: str = Field(default="", description="Judge model name sent as `model`.")
    api_key: SecretStr | None = Field(default=None, description="Bearer token for the judge endpoint.")
    json_mode: Literal["json_schema", "json_object", "prompt"] = Field(
        default="json_schema",
        description="How JSON is requested: the endpoint's json_schema response format, json_object, or prompt only "
        "(strict parsing with one repair retry in every mode).",
    )
    concurrency: int = Field(default=4, ge=1, le=256, description="Judge calls in flight at once.")
    timeout_s: float = Field(default=120.0, gt=0, description="Per-call timeout, seconds.")
    max_retries: int = Field(default=5, ge=0, le=10, description="Retries on 429/5xx/timeouts (paper: 5).")
    max_tokens: int = Field(default=2048, ge=64, description="Completion budget of one judge call.")
    cache: bool = Field(default=True, description="Cache judge answers on disk by prompt hash and model.")
    price_input_per_mtok: float = Field(default=0.0, ge=0, description="USD per million prompt tokens (accounting).")
    price_output_per_mtok: float = Field(default=0.0, ge=0, description="USD per million completion tokens.")
    citation_support_check: bool = Field(
        default=False, description="Also ask the judge whether each cited claim is supported by its snippet."
    )
    trajectory_chars: int = Field(
        default=12000, ge=1000, description="Each trajectory is cut to this many characters in judge prompts."
    )


class RetrainConfig(BaseModel):
    """The online retraining cycle and its scheduler (env: RUBRICEM_LEARNING__RETRAIN__<FIELD>)."""

    min_new_sessions: int = Field(default=5, ge=1, description="A scheduled cycle runs only with this many new sessions.")
    interval_minutes: float = Field(default=0.0, ge=0, description="Run the scheduler every N minutes (0 = use cron).")
    cron: str = Field(default="0 3 * * *", description="Crontab schedule of the scheduler (default 03:00 daily).")
    steps: int = Field(default=4, ge=1, description="SS-GRPO steps per cycle.")
    rollouts: int = Field(default=4, ge=2, description="Rollouts per question per step.")
    batch_questions: int = Field(default=2, ge=1, description="Questions per training step.")
    lr: float = Field(default=1e-4, gt=0, description="Learning rate of the cycle's LoRA training.")
    seed_questions: Path | None = Field(default=None, description="Extra training questions (.txt or .jsonl).")
    probe_questions: Path | None = Field(
        default=None, description="Fixed probe set for the promotion gate (.txt or .jsonl); default: 4 bundled ones.")
    probe_samples: int = Field(default=1, ge=1, description="Research runs per probe question and version.")
    tolerance: float = Field(default=0.02, ge=0, le=1, description="Promote if candidate >= live - tolerance.")
    eval_judge_model: str = Field(
        default="", description="Held-out judge model for the gate (LLM judge only; empty = the training model with "
        "fresh rubrics).")
    sleep_policy_server: bool = Field(
        default=False, description="One-GPU mode: put vLLM to sleep while training, wake it after.")
    unload_grace_s: float = Field(default=60.0, ge=0, description="Seconds before an old adapter is unloaded.")
    max_token_caps: int = Field(default=96, ge=16, description="Per-stage token cap of training rollouts.")
    swap_probe_max_kl: float = Field(
        default=0.05, gt=0,
        description="Swap probe (issue 63): after a version is loaded on an engine or vLLM replica, its log-probs on a "
        "fixed probe prompt must be within this mean k3 KL(served || trainer) per token of the trainer's for that "
        "version (the bound max_sampler_kl puts on rollouts; sound engines measure 0.002-0.007), and must differ from "
        "the previous version's, or the version is not promoted.")
    swap_probe_tokens: int = Field(default=24, ge=4, le=512, description="Tokens the swap probe samples per reading.")
    swap_probe_deadline_s: float = Field(
        default=120.0, gt=0, description="How long the swap probe retries an engine or replica that cannot answer "
        "(down, restarting) before the swap fails with the reason; a swap is never promoted unverified.")
    keep_run_folders: int = Field(
        default=2, ge=0,
        description="Run folders (DATA_DIR/runs/<cycle>: questions, rollouts, checkpoints) and run bank collections "
        "of finished cycles kept after each cycle, newest first; older ones are removed (they hold copies of users' "
        "questions; the adapters stay in runs/adapters). 0 = remove each as soon as its cycle ends.")


class LearningConfig(BaseModel):
    """Learning settings (env: RUBRICEM_LEARNING__<SECTION>__<FIELD>)."""

    judge: JudgeConfig = Field(default_factory=JudgeConfig)
    cache_dir: Path | None = Field(default=None, description="Judge cache folder; empty = <data_dir>/judge-cache.")
    teacher_api_key: SecretStr | None = Field(
        default=None, description="API key of the `rubricem sft generate --teacher llm` endpoint (never logged).")
    retrain: RetrainConfig = Field(default_factory=RetrainConfig)
