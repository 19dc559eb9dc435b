-- Each person's own credentials for the services behind the plugins: one row per subject
-- and credential, the value sealed (XChaCha20-Poly1305 under a key that is not in the
-- database, bound to the subject and the credential's name). Portable SQL: the same
-- migration runs on SQLite and PostgreSQL.
CREATE TABLE IF NOT EXISTS credentials (
    subject TEXT NOT NULL,
    name TEXT NOT NULL,
    sealed TEXT NOT NULL,
    connected_at_ms BIGINT NOT NULL,
    expires_at_ms BIGINT,
    scopes TEXT,
    PRIMARY KEY (subject, name)
);
CREATE INDEX IF NOT EXISTS credentials_by_name ON credentials (name);

-- A person asked to connect a credential: the link's id (random, single-use), whom it was
-- made for and which credential, until when it may be used, and when it was.
CREATE TABLE IF NOT EXISTS credential_requests (
    id TEXT PRIMARY KEY,
    subject TEXT NOT NULL,
    name TEXT NOT NULL,
    created_at_ms BIGINT NOT NULL,
    expires_at_ms BIGINT NOT NULL,
    used_at_ms BIGINT
);
