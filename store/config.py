"""Store settings section: where the session log (SQLite, or PostgreSQL), Chroma collections and caches live."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import BaseModel, Field, SecretStr, field_validator


class BankConfig(BaseModel):
    """Rubric-bank settings (env: RUBRICEM_STORE__BANK__<FIELD>); the bank lives in the same Chroma as the documents."""

    collection: str = Field(default="rubric_bank", description="Chroma collection of the rubric bank.")
    embedding_model: str = Field(
        default="",
        description="Sentence-transformers model that embeds bank questions; empty = the bundled offline MiniLM "
        "(the paper used Qwen/Qwen3-Embedding-0.6B).",
    )
    top_k: int = Field(default=2, ge=1, le=20, description="Cross-episode items injected per question (paper: 2).")
    min_similarity: float = Field(
        default=0.4, ge=-1.0, le=1.0,
        description="Cosine similarity a cross-episode item needs to be injected (MiniLM: same kind of question "
        "~0.45-0.65, unrelated < 0.2).",
    )
    dedup_similarity: float = Field(
        default=0.97, ge=0.0, le=1.0,
        description="Questions at least this similar count as the same question: the newer item replaces the older.",
    )
    capacity: int = Field(default=100_000, ge=1, description="Most items kept; beyond it the lowest-retention go.")
    half_life_days: float = Field(
        default=90.0, gt=0.0, description="Eviction ages scores: retention = u * 0.5 ** (age_days / half_life_days)."
    )


class StoreConfig(BaseModel):
    """Persistence settings (env: RUBRICEM_STORE__<FIELD>)."""

    data_dir: Path = Field(
        default=Path.home() / ".rubricem",
        description="Folder for the session log, the embedded Chroma database and model caches.",
    )
    database_url: SecretStr | None = Field(
        default=None,
        description="PostgreSQL store, postgresql://user:password@host:5432/db: the session log, registry and chat "
        "threads live there (migrated on first use) and the retraining cycle lock is a PostgreSQL advisory lock, so "
        "schedulers on several hosts run one cycle at a time; empty = SQLite in data_dir.",
    )
    chroma_mode: Literal["embedded", "server"] = Field(
        default="embedded", description="embedded: Chroma PersistentClient under data_dir; server: a `chroma run` server."
    )
    chroma_host: str = Field(default="127.0.0.1", description="Chroma server host (chroma_mode=server).")
    chroma_port: int = Field(default=8001, description="Chroma server port (chroma_mode=server).")
    docs_collection: str = Field(default="documents", description="Chroma collection of the local document index.")
    embedding_model: str = Field(
        default="",
        description="Sentence-transformers model name or path for embeddings; empty = the bundled offline MiniLM.",
    )
    consent_default: bool = Field(
        default=True,
        description="Whether the sessions of people who have not chosen may be judged, trained on and reflected into "
        "the rubric bank (each person can change it for themselves, and per session).",
    )

    bank: BankConfig = BankConfig()

    @field_validator("database_url", mode="before")
    @classmethod
    def _empty_is_unset(cls, value: object) -> object:
        """An empty URL (e.g. `RUBRICEM_STORE__DATABASE_URL=` from compose) means SQLite, not a broken URL."""
        if isinstance(value, SecretStr):
            value = value.get_secret_value()
        return None if isinstance(value, str) and not value.strip() else value

    @property
    def sqlite_path(self) -> Path:
        """The session log database file (when no database_url is set)."""
        return self.data_dir / "rubricem.sqlite3"

    @property
    def chroma_path(self) -> Path:
        """The embedded Chroma folder."""
        return self.data_dir / "chroma"

    @property
    def model_cache(self) -> Path:
        """Converted model weights (SmolLM2 safetensors) and other caches."""
        return self.data_dir / "models"
