-- 0011: a deletion of a person's data recorded against the retraining cycles that held it (issue 34).
--
-- A cycle copies its window's questions into its run folder (DATA_DIR/runs/<cycle>: questions.jsonl, the rollouts'
-- session log, its checkpoints' copies) and its own Chroma collection (<bank>_run_<cycle>), and a cycle running when
-- the deletion commits registers its version only afterwards. One row per (cycle, deletion) says both: the cycle's
-- run folder and run collection are removed once the cycle has finished (by the deletion itself, by the next
-- deletion, or by the cycle's own clean-up on the host that ran it), and the version the cycle registers carries the
-- deletion's mark (`store.registry.Registry.register` copies these rows into version_data_deletions).
CREATE TABLE cycle_data_deletions (
    cycle_id     TEXT NOT NULL REFERENCES retrain_cycles(cycle_id),
    deletion_id  TEXT NOT NULL REFERENCES data_deletions(deletion_id),
    PRIMARY KEY (cycle_id, deletion_id)
) WITHOUT ROWID;
