-- 0003: reflection candidates (METHOD §6). One row per sampled candidate; a batch is one reflection run on one
-- judged, completed session (m candidates sampled from the same prompt). The trainer (reflection GRPO, D9) trains on
-- these rows, so the sampled token ids and logprobs are stored exactly, with the same BLOB encodings as `turns`:
--   prompt_token_ids, token_ids  BLOB  little-endian int32 array
--   logprobs                     BLOB  little-endian float64 array (empty, or one per token id)
-- `text` is exactly what `token_ids` spell. `forced_suffix` is text appended after sampling and never sampled (the
-- closing `</reflection_takeaways>` when the server dropped the stop string); the candidate that was validated,
-- judged and banked is text || forced_suffix. A whole batch is written in one transaction.

CREATE TABLE reflection_candidates (
    batch_id            TEXT NOT NULL,
    session_id          TEXT NOT NULL REFERENCES sessions (session_id) ON DELETE CASCADE,
    candidate           INTEGER NOT NULL CHECK (candidate >= 0),
    policy_version      TEXT NOT NULL,
    prompt_text         TEXT NOT NULL,
    prompt_token_ids    BLOB NOT NULL,
    prompt_sha          TEXT NOT NULL,
    temperature         REAL NOT NULL CHECK (temperature >= 0),
    max_tokens          INTEGER NOT NULL CHECK (max_tokens >= 1),
    seed                INTEGER,
    text                TEXT NOT NULL,
    forced_suffix       TEXT NOT NULL DEFAULT '',
    token_ids           BLOB NOT NULL,
    logprobs            BLOB NOT NULL,
    token_source        TEXT NOT NULL CHECK (token_source IN ('server', 'tokenizer', 'retokenized')),
    finish_reason       TEXT NOT NULL CHECK (finish_reason IN ('stop', 'length', 'abort', 'error')),
    valid               INTEGER NOT NULL CHECK (valid IN (0, 1)),
    validity_error      TEXT,
    diagnostic_accuracy REAL CHECK (diagnostic_accuracy IS NULL OR diagnostic_accuracy BETWEEN 0 AND 1),
    specificity         REAL CHECK (specificity IS NULL OR specificity BETWEEN 0 AND 1),
    scope_balance       REAL CHECK (scope_balance IS NULL OR scope_balance BETWEEN 0 AND 1),
    u_within            REAL CHECK (u_within IS NULL OR u_within BETWEEN 0 AND 1),
    u_cross             REAL CHECK (u_cross IS NULL OR u_cross BETWEEN 0 AND 1),
    u                   REAL CHECK (u IS NULL OR u BETWEEN 0 AND 1),
    justification       TEXT NOT NULL DEFAULT '',
    judge_model         TEXT NOT NULL,
    judge_error         TEXT,
    accepted            INTEGER NOT NULL DEFAULT 0 CHECK (accepted IN (0, 1)),
    bank_item_id        TEXT,
    created_at          TEXT NOT NULL,
    PRIMARY KEY (batch_id, candidate),
    CHECK ((valid = 1) = (validity_error IS NULL)),
    CHECK (valid = 1 OR u IS NULL),  -- an invalid candidate is never scored
    CHECK ((accepted = 1) = (bank_item_id IS NOT NULL)),
    CHECK (accepted = 0 OR (valid = 1 AND u IS NOT NULL))  -- only a valid, scored candidate reaches the bank
) WITHOUT ROWID;

CREATE INDEX reflection_candidates_by_session ON reflection_candidates (session_id, created_at);

-- At most one accepted candidate per batch.
CREATE UNIQUE INDEX reflection_candidates_one_accepted ON reflection_candidates (batch_id) WHERE accepted = 1;
