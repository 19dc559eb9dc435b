-- The built-in authorization server's state (auth.mode = "builtin").
-- Codes, refresh tokens and client secrets are stored as SHA-256 hashes, never in the clear.
-- Portable SQL: the same migration runs on SQLite and PostgreSQL.
CREATE TABLE IF NOT EXISTS auth_keys (
    kid TEXT PRIMARY KEY,
    private_der TEXT NOT NULL,
    created_at BIGINT NOT NULL,
    retired_at BIGINT
);

CREATE TABLE IF NOT EXISTS oauth_clients (
    client_id TEXT PRIMARY KEY,
    secret_hash TEXT,
    name TEXT,
    redirect_uris TEXT NOT NULL,
    auth_method TEXT NOT NULL,
    grant_types TEXT NOT NULL,
    application_type TEXT NOT NULL,
    scope TEXT,
    created_at BIGINT NOT NULL
);

CREATE TABLE IF NOT EXISTS oauth_pending (
    id TEXT PRIMARY KEY,
    csrf_hash TEXT NOT NULL,
    request TEXT NOT NULL,
    subject TEXT,
    expires_at BIGINT NOT NULL
);

CREATE TABLE IF NOT EXISTS oauth_codes (
    code_hash TEXT PRIMARY KEY,
    client_id TEXT NOT NULL,
    subject TEXT NOT NULL,
    redirect_uri TEXT NOT NULL,
    resource TEXT NOT NULL,
    scope TEXT NOT NULL,
    challenge TEXT NOT NULL,
    expires_at BIGINT NOT NULL,
    used INTEGER NOT NULL DEFAULT 0
);

CREATE TABLE IF NOT EXISTS oauth_refresh_tokens (
    token_hash TEXT PRIMARY KEY,
    family TEXT NOT NULL,
    client_id TEXT NOT NULL,
    subject TEXT NOT NULL,
    resource TEXT NOT NULL,
    scope TEXT NOT NULL,
    expires_at BIGINT NOT NULL,
    used INTEGER NOT NULL DEFAULT 0,
    revoked INTEGER NOT NULL DEFAULT 0
);
CREATE INDEX IF NOT EXISTS oauth_refresh_tokens_family ON oauth_refresh_tokens (family);

CREATE TABLE IF NOT EXISTS oauth_consents (
    subject TEXT NOT NULL,
    client_id TEXT NOT NULL,
    scope TEXT NOT NULL,
    created_at BIGINT NOT NULL,
    PRIMARY KEY (subject, client_id, scope)
);
