-- A record may stand for several requests refused together (a batch over a rate limit, say):
-- `count` says how many; NULL for a record of one request.
-- Portable SQL: the same migration runs on SQLite and PostgreSQL.
ALTER TABLE audit_records ADD COLUMN count BIGINT;
