-- 0014: what a session was served by and shared with, recorded as it starts (issue 65).
--
-- `sessions.share_global`: whether the session's team let the global policy learn from its sessions when the
-- session started (`teams.share_global`, read in the insert's transaction). NULL for a session of no team. The global
-- cycle trains on a team's session only when this is 1 and the team still shares: a team that opts in later never
-- hands over what its people asked while it did not, and a team that opts out stops sharing at once.
-- Sessions written before this migration take their team's setting as it is now, which is what the global cycle
-- read for them until now.
-- `sessions.serving_json`: which version serves the session and why (its owner's team, and the warning when the
-- team's own version could not serve it and the global one did), written with the session, so a session that then
-- fails or is cut off keeps it. NULL before this migration.
ALTER TABLE sessions ADD COLUMN share_global INTEGER CHECK (share_global IS NULL OR share_global IN (0, 1));

ALTER TABLE sessions ADD COLUMN serving_json TEXT;

UPDATE sessions SET share_global = (SELECT t.share_global FROM teams t WHERE t.name = sessions.team)
    WHERE team IS NOT NULL;
