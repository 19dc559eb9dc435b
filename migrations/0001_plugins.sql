-- Plugins changed through the admin API, overlaid on the config file's plugins.
-- `spec` is the plugin's definition as JSON; a removed plugin has `removed` = 1 and no spec.
-- Portable SQL: the same migration runs on SQLite and PostgreSQL.
CREATE TABLE IF NOT EXISTS plugins (
    name TEXT PRIMARY KEY,
    spec TEXT,
    enabled INTEGER NOT NULL DEFAULT 1,
    removed INTEGER NOT NULL DEFAULT 0,
    updated_at BIGINT NOT NULL
);
