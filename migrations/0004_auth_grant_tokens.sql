-- Which tokens a grant produced, so that they can be revoked with it: a redeemed code keeps
-- its refresh token family and the id (`jti`) of its access token, and each refresh token the
-- access token issued with it. A redeemed code is kept until `kept_until` (when what it
-- produced has expired), so a replay found later still revokes them.
-- Portable SQL: the same migration runs on SQLite and PostgreSQL.
ALTER TABLE oauth_codes ADD COLUMN family TEXT;
ALTER TABLE oauth_codes ADD COLUMN access_jti TEXT;
ALTER TABLE oauth_codes ADD COLUMN access_expires_at BIGINT;
ALTER TABLE oauth_codes ADD COLUMN kept_until BIGINT;
ALTER TABLE oauth_refresh_tokens ADD COLUMN access_jti TEXT;
ALTER TABLE oauth_refresh_tokens ADD COLUMN access_expires_at BIGINT;
