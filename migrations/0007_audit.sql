-- The audit log: one row per tools/call, prompts/get, resources/read and admin action, kept
-- for `audit.retention_days`. Times in milliseconds since the epoch, durations in
-- microseconds. `arguments` is the call's arguments as sent (audit.include_arguments) or
-- `hmac-sha256:<hex>` of them.
-- `id` is unique by construction (time and 64 random bits) and only ever read back, so it has
-- no index of its own: one index less to keep on every insert.
-- Portable SQL: the same migration runs on SQLite and PostgreSQL.
CREATE TABLE IF NOT EXISTS audit_records (
    id TEXT NOT NULL,
    at_ms BIGINT NOT NULL,
    kind TEXT NOT NULL,
    subject TEXT,
    session TEXT,
    client TEXT,
    plugin TEXT,
    target TEXT,
    outcome TEXT NOT NULL,
    error_code BIGINT,
    duration_us BIGINT NOT NULL,
    arguments TEXT,
    replica TEXT
);
CREATE INDEX IF NOT EXISTS audit_records_at_ms ON audit_records (at_ms);
