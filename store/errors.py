"""Store error hierarchy: every failure of the persistence layer is one of these, never a bare sqlite3/psycopg error.

    StoreError
    ├── InvalidInput           a value cannot be stored or queried as given (nothing written); a ValueError
    ├── SessionNotFound        no session has that id; also a LookupError
    ├── DuplicateSession       create_session with an id that already exists
    ├── SessionStateError      the session's status forbids the operation
    │   ├── SessionNotRunning  writing turns / flags to, or finishing, a session that already finished
    │   └── SessionNotCompleted  judging a session that is not "completed"
    ├── MigrationError         a schema migration failed (and was rolled back), or the schema is unknown
    ├── StorageError           the database failed: unreadable or corrupt SQLite file, disk full, I/O error, a
    │   │                      PostgreSQL error or lost connection
    │   ├── StoreBusy          the database stayed locked by another writer past busy_timeout
    │   ├── ConnectionLost     a PostgreSQL connection broke inside a transaction (rolled back; a turn is retried once)
    │   └── StoreUnreachable   the PostgreSQL server cannot be reached, refuses the login or has no such database
    ├── LockHeld               a named lock (the retraining cycle's) is held by another session
    ├── DeletedMeanwhile       a save of what was derived from people's data met a deletion made since it was read
    └── StoreClosed            the store was used after close()

Messages never contain a database password.

The service catches `StoreError` once (a system failure) and marks the run failed where it still can.
"""

from __future__ import annotations


class StoreError(Exception):
    """Base of every error raised by the store package."""


class InvalidInput(StoreError, ValueError):
    """A value cannot be stored or used as a query argument; nothing was written."""


class SessionNotFound(StoreError, LookupError):
    """No session with the given id exists in the log."""

    def __init__(self, session_id: str) -> None:
        """Remember the id that was asked for."""
        super().__init__(f"no session with id {session_id!r}")
        self.session_id = session_id


class DuplicateSession(StoreError):
    """A session with the requested id already exists."""

    def __init__(self, session_id: str) -> None:
        """Remember the id that was taken."""
        super().__init__(f"a session with id {session_id!r} already exists")
        self.session_id = session_id


class SessionStateError(StoreError):
    """The session's current status does not allow the requested operation."""

    def __init__(self, session_id: str, status: str, action: str) -> None:
        """Remember the session, its status and what was refused."""
        super().__init__(f"cannot {action}: session {session_id!r} is {status!r}")
        self.session_id = session_id
        self.status = status
        self.action = action


class SessionNotRunning(SessionStateError):
    """The session already finished (completed or failed): it is immutable, e.g. finishing it twice."""


class SessionNotCompleted(SessionStateError):
    """Only completed sessions can be judged (failed ones are never trained on)."""


class MigrationError(StoreError):
    """A migration failed and was rolled back, the migration files are inconsistent, or the schema is newer."""


class StorageError(StoreError):
    """The database reported an error: an unreadable SQLite file or not a database, disk full, I/O error, a
    PostgreSQL error or a lost connection."""


class StoreBusy(StorageError):
    """Another connection held the write lock for longer than busy_timeout."""


class ConnectionLost(StorageError):
    """The connection to the PostgreSQL store broke during a transaction (server restart, network, an administrator
    ending the session): that transaction rolled back; a fresh connection may succeed."""


class StoreUnreachable(StorageError):
    """The PostgreSQL store cannot be reached or refuses the connection (server down, wrong password, no such
    database); raised when the store is opened, before anything is written."""


class LockHeld(StoreError):
    """Another session holds the named lock (e.g. another host runs the retraining cycle)."""


class DeletedMeanwhile(StoreError):
    """A data deletion was recorded after the caller read what it is saving (a judge's rubric buffer): the save
    would bring back what the deletion removed, so nothing was written. Deletion wins; the next run starts over."""


class StoreClosed(StoreError):
    """The SessionLog was used after close()."""

    def __init__(self) -> None:
        """Use a fixed message."""
        super().__init__("the session log is closed")
