-- Revoked access tokens (RFC 7009), by `jti`, kept until the token would have expired anyway,
-- so a restarted gateway and every replica refuse them too.
-- Portable SQL: the same migration runs on SQLite and PostgreSQL.
CREATE TABLE IF NOT EXISTS oauth_revoked_tokens (
    jti TEXT PRIMARY KEY,
    expires_at BIGINT NOT NULL
);
CREATE INDEX IF NOT EXISTS oauth_revoked_tokens_expires_at ON oauth_revoked_tokens (expires_at);
