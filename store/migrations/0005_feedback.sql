-- 0005: user feedback on a session's answer: a thumbs up/down and/or a free-text note ("what was missing or wrong").
-- Any number of rows per session (a user may come back to it). The judge turns non-empty notes into extra Answer-stage
-- rubrics for every session of the same question (learning/judge/feedback.py).

CREATE TABLE feedback (
    feedback_id INTEGER PRIMARY KEY AUTOINCREMENT,
    session_id  TEXT NOT NULL REFERENCES sessions (session_id) ON DELETE CASCADE,
    rating      TEXT CHECK (rating IS NULL OR rating IN ('up', 'down')),
    note        TEXT NOT NULL DEFAULT '',               -- stripped, <= 2000 characters; '' with a rating only
    created_at  TEXT NOT NULL,
    CHECK (rating IS NOT NULL OR length(note) > 0)      -- a row always says something
);

CREATE INDEX feedback_by_session ON feedback (session_id, feedback_id);
