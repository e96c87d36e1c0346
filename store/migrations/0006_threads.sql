-- 0006: chat threads of the research UI. A follow-up question is its own session; this table links it to the
-- thread it was asked in (position 0 is the opening question) so the UI can reopen the whole conversation.

CREATE TABLE chat_threads (
    session_id  TEXT PRIMARY KEY REFERENCES sessions(session_id) ON DELETE CASCADE,
    thread_id   TEXT NOT NULL,
    position    INTEGER NOT NULL CHECK (position >= 0),
    created_at  TEXT NOT NULL,
    UNIQUE (thread_id, position)
) WITHOUT ROWID;

CREATE INDEX chat_threads_thread ON chat_threads(thread_id, position);
