-- 0002: judgements carry their outcome (ok / failed), the judge kind and rubric version; per-question rubric buffers.
-- A failed judgement is a recorded failure (the session stays in "completed and not yet judged" and is retried);
-- only an ok judgement takes a session out of it.

ALTER TABLE judgements ADD COLUMN status TEXT NOT NULL DEFAULT 'ok' CHECK (status IN ('ok', 'failed'));
ALTER TABLE judgements ADD COLUMN error TEXT;
ALTER TABLE judgements ADD COLUMN judge_kind TEXT NOT NULL DEFAULT 'llm';
ALTER TABLE judgements ADD COLUMN rubric_version TEXT NOT NULL DEFAULT '';

-- One row per question (keyed by the SHA-256 of the normalised question): the persistent and active rubrics of the
-- stagewise judge, as JSON, with a version that increases on every save.
CREATE TABLE rubric_buffers (
    question_sha TEXT PRIMARY KEY,
    question     TEXT NOT NULL,
    payload_json TEXT NOT NULL,
    version      INTEGER NOT NULL CHECK (version >= 1),
    updated_at   TEXT NOT NULL
) WITHOUT ROWID;
