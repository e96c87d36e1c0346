-- 0001: the session log. One row per research session, its turns (the single assistant token sequence, in order),
-- its tool calls with the snippets they returned, and a minimal judgement table.
--
-- Encodings (see store/session_log.py):
--   *_token_ids  BLOB  little-endian int32 array (4 bytes per id)
--   logprobs     BLOB  little-endian IEEE-754 float64 array (8 bytes per value; bit-exact, NaN payloads included)
--   *_json       TEXT  JSON (ASCII-escaped)
--   timestamps   TEXT  UTC ISO-8601 with microseconds, fixed width, so text order is time order
--   free text    TEXT, or a UTF-8 BLOB (surrogatepass) for the rare Python str that is not valid Unicode
-- Migrations run inside one transaction; they must not contain PRAGMA statements or BEGIN/COMMIT.

CREATE TABLE sessions (
    session_id                  TEXT PRIMARY KEY,
    question                    TEXT NOT NULL,
    status                      TEXT NOT NULL CHECK (status IN ('running', 'completed', 'failed')),
    created_at                  TEXT NOT NULL,
    updated_at                  TEXT NOT NULL,  -- last write (turn, tool call, flags); drives stale detection
    finished_at                 TEXT,
    policy_version              TEXT NOT NULL,
    options_json                TEXT NOT NULL,
    prompt_text                 TEXT NOT NULL,
    prompt_token_ids            BLOB NOT NULL,
    prompt_sha                  TEXT NOT NULL,
    malformed                   INTEGER NOT NULL DEFAULT 0 CHECK (malformed IN (0, 1)),
    max_consecutive_tool_errors INTEGER NOT NULL DEFAULT 0 CHECK (max_consecutive_tool_errors >= 0),
    injected_bank_items_json    TEXT NOT NULL DEFAULT '[]',
    report                      TEXT,
    error                       TEXT,
    metrics_json                TEXT NOT NULL DEFAULT '{}',
    CHECK ((status = 'running') = (finished_at IS NULL))
);

CREATE INDEX sessions_by_created ON sessions (created_at);
CREATE INDEX sessions_by_status_finished ON sessions (status, finished_at);

CREATE TABLE turns (
    session_id     TEXT NOT NULL REFERENCES sessions (session_id) ON DELETE CASCADE,
    idx            INTEGER NOT NULL CHECK (idx >= 0),
    stage          TEXT NOT NULL CHECK (stage IN ('plan', 'research', 'review', 'answer')),
    kind           TEXT NOT NULL CHECK (kind IN ('sampled', 'forced', 'tool_output')),
    text           TEXT NOT NULL,
    token_ids      BLOB NOT NULL,
    logprobs       BLOB NOT NULL,
    policy_version TEXT NOT NULL,
    prompt_sha     TEXT NOT NULL,
    token_source   TEXT NOT NULL CHECK (token_source IN ('server', 'tokenizer', 'retokenized')),
    finish_reason  TEXT CHECK (finish_reason IS NULL OR finish_reason IN ('stop', 'length', 'abort', 'error')),
    created_at     TEXT NOT NULL,
    PRIMARY KEY (session_id, idx)
) WITHOUT ROWID;

CREATE TABLE tool_calls (
    session_id TEXT NOT NULL REFERENCES sessions (session_id) ON DELETE CASCADE,
    idx        INTEGER NOT NULL CHECK (idx >= 0),
    tool       TEXT NOT NULL,
    query      TEXT NOT NULL,
    attrs_json TEXT NOT NULL,
    error      TEXT,
    seconds    REAL NOT NULL,
    created_at TEXT NOT NULL,
    PRIMARY KEY (session_id, idx)
) WITHOUT ROWID;

-- Snippets get their own rows so citations can be checked by (session, snippet id) without decoding JSON.
CREATE TABLE snippets (
    session_id TEXT NOT NULL,
    call_idx   INTEGER NOT NULL,
    position   INTEGER NOT NULL CHECK (position >= 0),
    snippet_id TEXT NOT NULL,
    tool       TEXT NOT NULL,
    title      TEXT NOT NULL,
    text       TEXT NOT NULL,
    url        TEXT NOT NULL,
    PRIMARY KEY (session_id, call_idx, position),
    FOREIGN KEY (session_id, call_idx) REFERENCES tool_calls (session_id, idx) ON DELETE CASCADE
) WITHOUT ROWID;

CREATE INDEX snippets_by_id ON snippets (session_id, snippet_id);

-- Minimal on purpose: enough for "completed and not yet judged". The judge issue extends it in a later migration.
CREATE TABLE judgements (
    judgement_id INTEGER PRIMARY KEY AUTOINCREMENT,
    session_id   TEXT NOT NULL REFERENCES sessions (session_id) ON DELETE CASCADE,
    judge_model  TEXT NOT NULL,
    payload_json TEXT NOT NULL,
    created_at   TEXT NOT NULL
);

CREATE INDEX judgements_by_session ON judgements (session_id);
