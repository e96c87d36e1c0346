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


class LearningConfig(BaseModel):
    """Learning settings (env: RUBRICEM_LEARNING__<SECTION>__<FIELD>)."""

    judge: JudgeConfig = Field(default_factory=JudgeConfig)
    cache_dir: Path | None = Field(default=None, description="Judge cache folder; empty = <data_dir>/judge-cache.")
