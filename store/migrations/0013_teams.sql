-- 0013: teams (issue 49). Each team's policy learns from its own consenting sessions and is served from one base.
--
-- `teams.live_version` is the team's own live alias: NULL while the team has no promoted version of its own, and
-- then its people are served the global `live` version. `share_global` is the team's explicit opt-in to let the
-- global cycle train on its sessions too (off by default). `team_alias_history` records every move of a team's
-- alias; a NULL version or previous means "the global policy".
-- `users.team`: a person belongs to at most one team (NULL: none, the global policy).
-- `sessions.team`: the owner's team when the session started. It never changes afterwards, so a person moved to
-- another team leaves their past sessions with the team that trained, or will train, on them.
-- `policy_versions.team` and `retrain_cycles.team`: NULL for the global policy and its cycles.
CREATE TABLE teams (
    name          TEXT PRIMARY KEY,
    share_global  INTEGER NOT NULL DEFAULT 0 CHECK (share_global IN (0, 1)),
    live_version  TEXT REFERENCES policy_versions(name),
    created_at    TEXT NOT NULL
) WITHOUT ROWID;

CREATE TABLE team_alias_history (
    id          INTEGER PRIMARY KEY,
    team        TEXT NOT NULL,
    version     TEXT REFERENCES policy_versions(name),
    previous    TEXT REFERENCES policy_versions(name),
    action      TEXT NOT NULL CHECK (action IN ('promote', 'rollback')),
    reason      TEXT NOT NULL DEFAULT '',
    created_at  TEXT NOT NULL
);
CREATE INDEX team_alias_history_by_team ON team_alias_history (team, id);

ALTER TABLE users ADD COLUMN team TEXT REFERENCES teams(name);

ALTER TABLE sessions ADD COLUMN team TEXT;
CREATE INDEX sessions_by_team ON sessions (team, finished_at);

ALTER TABLE policy_versions ADD COLUMN team TEXT;

ALTER TABLE retrain_cycles ADD COLUMN team TEXT;
