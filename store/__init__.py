"""Persistence layer: the shared record types, store settings, the session log (SQLite or PostgreSQL) and the store
errors.

Imports nothing from the rest of the project and never imports torch (checked by the boundary tests).
"""

from store.config import StoreConfig
from store.errors import (
    DuplicateSession,
    InvalidInput,
    LockHeld,
    MigrationError,
    SessionNotCompleted,
    SessionNotFound,
    SessionNotRunning,
    SessionStateError,
    StorageError,
    StoreBusy,
    StoreClosed,
    StoreError,
    StoreUnreachable,
)
from store.records import (
    STAGES,
    FinishReason,
    PromptRecord,
    SessionRecord,
    SessionStatus,
    Snippet,
    Stage,
    TokenSource,
    ToolCallRecord,
    Trajectory,
    Turn,
    TurnKind,
    loss_mask,
    sha256_text,
    stage_spans,
    token_stages,
)
from store.session_log import SessionLog, SessionSummary

__all__ = [
    "DuplicateSession",
    "FinishReason",
    "InvalidInput",
    "LockHeld",
    "MigrationError",
    "PromptRecord",
    "STAGES",
    "SessionLog",
    "SessionNotCompleted",
    "SessionNotFound",
    "SessionNotRunning",
    "SessionRecord",
    "SessionStateError",
    "SessionStatus",
    "SessionSummary",
    "Snippet",
    "Stage",
    "StorageError",
    "StoreBusy",
    "StoreClosed",
    "StoreConfig",
    "StoreError",
    "StoreUnreachable",
    "TokenSource",
    "ToolCallRecord",
    "Trajectory",
    "Turn",
    "TurnKind",
    "loss_mask",
    "sha256_text",
    "stage_spans",
    "token_stages",
]
