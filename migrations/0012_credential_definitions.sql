-- Credentials defined through the admin API, beside the config file's: the definition as the
-- API took it (JSON; a client secret only named, by file or environment variable), read by
-- every replica.
CREATE TABLE IF NOT EXISTS credential_definitions (
    name TEXT PRIMARY KEY,
    spec TEXT NOT NULL,
    updated_at_ms BIGINT NOT NULL
);
