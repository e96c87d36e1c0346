-- 0004: the policy registry (versions, the live alias and its history), retraining cycles and scheduler runs, and
-- the per-session training opt-out.

ALTER TABLE sessions ADD COLUMN training_opt_out INTEGER NOT NULL DEFAULT 0 CHECK (training_opt_out IN (0, 1));

CREATE TABLE policy_versions (
    name              TEXT PRIMARY KEY,            -- "base" or "policy@N"
    number            INTEGER NOT NULL UNIQUE CHECK (number >= 0),
    adapter_path      TEXT,                        -- NULL for the base model
    parent            TEXT REFERENCES policy_versions(name),
    training_run      TEXT NOT NULL DEFAULT '',
    data_window_json  TEXT NOT NULL DEFAULT '{}',
    eval_report_json  TEXT,
    status            TEXT NOT NULL CHECK (status IN ('candidate', 'promoted', 'rejected')),
    reason            TEXT,
    created_at        TEXT NOT NULL
);

CREATE TABLE policy_aliases (
    alias       TEXT PRIMARY KEY,
    version     TEXT NOT NULL REFERENCES policy_versions(name),
    updated_at  TEXT NOT NULL
) WITHOUT ROWID;

CREATE TABLE alias_history (
    id          INTEGER PRIMARY KEY,
    alias       TEXT NOT NULL,
    version     TEXT NOT NULL REFERENCES policy_versions(name),
    previous    TEXT REFERENCES policy_versions(name),
    action      TEXT NOT NULL CHECK (action IN ('init', 'promote', 'rollback')),
    reason      TEXT NOT NULL DEFAULT '',
    created_at  TEXT NOT NULL
);

CREATE TABLE retrain_cycles (
    cycle_id      TEXT PRIMARY KEY,
    trigger       TEXT NOT NULL,                   -- "cli", "scheduler"
    status        TEXT NOT NULL CHECK (status IN ('running', 'promoted', 'rejected', 'skipped', 'failed')),
    stage         TEXT NOT NULL DEFAULT 'start',   -- the last stage reached: start, judged, trained, registered, evaluated, done
    window_start  TEXT,                            -- sessions finished after this (exclusive) ...
    window_end    TEXT NOT NULL,                   -- ... and at or before this were used
    candidate     TEXT REFERENCES policy_versions(name),
    numbers_json  TEXT NOT NULL DEFAULT '{}',
    error         TEXT,
    started_at    TEXT NOT NULL,
    finished_at   TEXT
);
CREATE INDEX retrain_cycles_by_status ON retrain_cycles (status, started_at);
