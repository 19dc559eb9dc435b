-- Secrets every replica shares, each made once by whichever replica needs it first (the key
-- that seals a modern client's `requestState`, so a retry can reach any replica).
-- Portable SQL: the same migration runs on SQLite and PostgreSQL.
CREATE TABLE IF NOT EXISTS shared_secrets (
    name TEXT PRIMARY KEY,
    secret TEXT NOT NULL,
    created_at BIGINT NOT NULL
);
