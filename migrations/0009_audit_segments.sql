-- The audit log from here on: a batch's records stored together as one segment, their JSON
-- lines (the text the log shows, one per line) with the earliest and latest record time
-- (milliseconds since the epoch) and how many there are. A row per record cost the database
-- more than the call it recorded. Records stored before stay in audit_records and are read
-- beside these until the retention deletes them.
-- Portable SQL: the same migration runs on SQLite and PostgreSQL.
CREATE TABLE IF NOT EXISTS audit_segments (
    first_ms BIGINT NOT NULL,
    last_ms BIGINT NOT NULL,
    records BIGINT NOT NULL,
    lines TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS audit_segments_last_ms ON audit_segments (last_ms);
