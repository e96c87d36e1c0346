"""Persistence layer: the shared record types, store settings, the session log (SQLite or PostgreSQL) and the store
errors.

Imports nothing from the rest of the project and never imports torch (checked by the boundary tests).

Names are imported on first use (PEP 562), so importing one light submodule (the records, say) does not
load the session log's database drivers and pydantic settings.
"""

from typing import TYPE_CHECKING

from store.lazy import lazy_exports

if TYPE_CHECKING:
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

_EXPORTS: dict[str, str] = {
    "StoreConfig": "store.config",
    "DuplicateSession": "store.errors",
    "InvalidInput": "store.errors",
    "LockHeld": "store.errors",
    "MigrationError": "store.errors",
    "SessionNotCompleted": "store.errors",
    "SessionNotFound": "store.errors",
    "SessionNotRunning": "store.errors",
    "SessionStateError": "store.errors",
    "StorageError": "store.errors",
    "StoreBusy": "store.errors",
    "StoreClosed": "store.errors",
    "StoreError": "store.errors",
    "StoreUnreachable": "store.errors",
    "STAGES": "store.records",
    "FinishReason": "store.records",
    "PromptRecord": "store.records",
    "SessionRecord": "store.records",
    "SessionStatus": "store.records",
    "Snippet": "store.records",
    "Stage": "store.records",
    "TokenSource": "store.records",
    "ToolCallRecord": "store.records",
    "Trajectory": "store.records",
    "Turn": "store.records",
    "TurnKind": "store.records",
    "loss_mask": "store.records",
    "sha256_text": "store.records",
    "stage_spans": "store.records",
    "token_stages": "store.records",
    "SessionLog": "store.session_log",
    "SessionSummary": "store.session_log",
}

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


__getattr__, __dir__ = lazy_exports(globals(), _EXPORTS)
