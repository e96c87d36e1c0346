-- 0009: durable sessions and plan approval (issue 21). The sessions table keeps its three statuses (a session that
-- is paused or was cut off is still 'running'; a rejected or unresumable one ends 'failed', so it is never trained
-- on); these two tables say why.
--
-- session_runs: the LangGraph thread of a session and where it stands. 'active' while it runs (or after a crash,
-- until `rubricem resume`), 'awaiting_approval' while the plan waits for the user, then 'finished', 'rejected'
-- (the user rejected the plan), 'expired' (nobody answered in time) or 'interrupted' (the checkpoint was missing or
-- unreadable; reason says which).
CREATE TABLE session_runs (
    session_id   TEXT PRIMARY KEY REFERENCES sessions(session_id) ON DELETE CASCADE,
    thread_id    TEXT NOT NULL,
    state        TEXT NOT NULL CHECK (state IN ('active', 'awaiting_approval', 'finished', 'rejected', 'expired',
                                                'interrupted')),
    reason       TEXT,
    pause_json   TEXT,
    expires_at   TEXT,
    updated_at   TEXT NOT NULL
) WITHOUT ROWID;

CREATE INDEX session_runs_state ON session_runs(state, updated_at);

-- plan_approvals: what the user decided about a plan. policy_plan is the policy's own plan text (its sampled turns
-- stay in the trajectory); approved_json the plan the user approved (rubric items, research note); user rubrics are
-- the approved rubric items, handed to the judge for this session with their owner.
CREATE TABLE plan_approvals (
    session_id     TEXT PRIMARY KEY REFERENCES sessions(session_id) ON DELETE CASCADE,
    action         TEXT NOT NULL CHECK (action IN ('accept', 'edit', 'reject')),
    owner          TEXT NOT NULL,
    policy_plan    TEXT NOT NULL,
    approved_json  TEXT NOT NULL,
    created_at     TEXT NOT NULL
) WITHOUT ROWID;
