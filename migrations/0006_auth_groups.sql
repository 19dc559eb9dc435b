-- The groups a person was in when signing in (a local user's from the config, an upstream
-- person's from the provider's ID token), carried from the pending request to the code and
-- to each refresh token of the grant, so the access tokens issued later carry them too.
-- A JSON list of strings; NULL for rows from before, read as no groups.
-- Portable SQL: the same migration runs on SQLite and PostgreSQL.
ALTER TABLE oauth_pending ADD COLUMN groups TEXT;
ALTER TABLE oauth_codes ADD COLUMN groups TEXT;
ALTER TABLE oauth_refresh_tokens ADD COLUMN groups TEXT;
