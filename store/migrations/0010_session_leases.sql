-- 0010: a lease on running sessions (issue 34). The process that runs a session renews heartbeat_at and lease_until
-- every few seconds; lease_owner names that process. `rubricem resume` takes a session over only once its lease has
-- expired (its process is gone), so two processes never append turns to one trajectory. A running session whose
-- lease has expired and that is not paused is shown as 'interrupted' (resumable when it was checkpointed; the crash
-- sweep fails the others). Sessions already running when this migration runs are given a lease that has already
-- expired: the processes that ran them are older than this code and never renew it.
ALTER TABLE sessions ADD COLUMN heartbeat_at TEXT;
ALTER TABLE sessions ADD COLUMN lease_until TEXT;
ALTER TABLE sessions ADD COLUMN lease_owner TEXT;

UPDATE sessions SET heartbeat_at = updated_at, lease_until = updated_at WHERE status = 'running';

CREATE INDEX sessions_lease ON sessions(status, lease_until);
