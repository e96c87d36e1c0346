-- 0008: people. Every session, chat thread row and feedback row has an owner (an account name, an OIDC e-mail or
-- subject, or 'local' for the CLI and a loopback UI); rows written before this migration belong to 'local'.
-- `users` holds named accounts (bcrypt hashes for password logins, never the password) and each person's consent to
-- learn from their sessions (NULL: the deployment default, RUBRICEM_STORE__CONSENT_DEFAULT).
-- `data_deletions` records each deletion of a person's data without its content (the subject only as a SHA-256, so
-- no row names them afterwards); bank items derived from the deleted sessions live in Chroma, outside this database's
-- transaction, so the ids still to remove stay listed until a (retried, idempotent) removal succeeds.
-- `version_data_deletions` marks the policy versions whose training window held sessions later deleted: what an
-- adapter learned cannot be taken out of it.

ALTER TABLE sessions ADD COLUMN owner TEXT NOT NULL DEFAULT 'local';
CREATE INDEX sessions_owner ON sessions(owner, created_at);

ALTER TABLE chat_threads ADD COLUMN owner TEXT NOT NULL DEFAULT 'local';
ALTER TABLE feedback ADD COLUMN owner TEXT NOT NULL DEFAULT 'local';

CREATE TABLE users (
    user_id        TEXT PRIMARY KEY,
    kind           TEXT NOT NULL CHECK (kind IN ('password', 'oidc', 'local')),
    role           TEXT NOT NULL CHECK (role IN ('user', 'admin')),
    password_hash  TEXT,
    consent        INTEGER CHECK (consent IS NULL OR consent IN (0, 1)),
    created_at     TEXT NOT NULL,
    CHECK ((kind = 'password') = (password_hash IS NOT NULL))
) WITHOUT ROWID;

CREATE TABLE data_deletions (
    deletion_id        TEXT PRIMARY KEY,
    subject_sha        TEXT NOT NULL,
    requested_by       TEXT NOT NULL,
    counts_json        TEXT NOT NULL,
    pending_bank_json  TEXT NOT NULL DEFAULT '{}',
    created_at         TEXT NOT NULL,
    bank_done_at       TEXT
);

CREATE TABLE version_data_deletions (
    version      TEXT NOT NULL REFERENCES policy_versions(name),
    deletion_id  TEXT NOT NULL REFERENCES data_deletions(deletion_id),
    PRIMARY KEY (version, deletion_id)
) WITHOUT ROWID;
