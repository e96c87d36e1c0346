-- 0007: where each session came from. Benchmark runs and gate probes are not users' questions: they must never be
-- judged for training, trained on or listed in the chat history (training on benchmark questions would contaminate
-- every later evaluation on them). Sessions written before this migration are marked 'api' (a direct caller).

ALTER TABLE sessions ADD COLUMN source TEXT NOT NULL DEFAULT 'api'
    CHECK (source IN ('chat', 'cli', 'batch', 'api', 'eval', 'probe', 'rollout'));

CREATE INDEX sessions_source ON sessions(source, created_at);
