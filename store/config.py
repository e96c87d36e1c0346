"""Store settings section: where the SQLite session log, Chroma collections and caches live."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import BaseModel, Field


class StoreConfig(BaseModel):
    """Persistence settings (env: RUBRICEM_STORE__<FIELD>)."""

    data_dir: Path = Field(
        default=Path.home() / ".rubricem",
        description="Folder for the session log, the embedded Chroma database and model caches.",
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

    @property
    def sqlite_path(self) -> Path:
        """The session log database file."""
        return self.data_dir / "rubricem.sqlite3"

    @property
    def chroma_path(self) -> Path:
        """The embedded Chroma folder."""
        return self.data_dir / "chroma"

    @property
    def model_cache(self) -> Path:
        """Converted model weights (SmolLM2 safetensors) and other caches."""
        return self.data_dir / "models"
