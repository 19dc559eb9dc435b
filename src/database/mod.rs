//! The gateway's one database: a SQLite file by default, PostgreSQL when `database_url` says
//! so, both through sqlx with the same migrations (`migrations/`, embedded in the binary).
//! [`Database::connect`] opens it and runs the migrations, once, at start-up; then it lends
//! the stores that keep their state in it, each behind the trait its user defines:
//! [`Database::plugin_store`] to the registry ([`PluginStore`], implemented in [`plugins`])
//! and [`Database::auth_store`] to the authorization server ([`AuthStore`], implemented in
//! [`auth`]), [`Database::audit_store`] to the audit log ([`AuditStore`], in [`audit`]) and
//! [`Database::credential_store`] to the credential broker ([`CredentialStore`], in
//! [`credentials`]).
//! It also keeps the secrets the replicas share ([`secrets`]).
//!
//! This is the only module that speaks SQL. It sits above the stores' traits and below the
//! gateway that wires them: it never decides what a plugin or a token is, and neither the
//! registry nor auth ever reaches up to it.

pub mod audit;
pub mod auth;
pub mod credentials;
pub mod plugins;
pub mod secrets;

use std::sync::Arc;
use std::time::Duration;

use sqlx::AnyPool;
use sqlx::any::AnyPoolOptions;

use crate::audit::AuditStore;
use crate::auth::store::AuthStore;
use crate::credentials::CredentialStore;
use crate::registry::store::PluginStore;

pub use audit::SqlAuditStore;
pub use auth::SqlAuthStore;
pub use credentials::SqlCredentialStore;
pub use plugins::SqlPluginStore;

/// How long opening the database may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// Why the database could not be opened.
#[derive(Debug, Clone, thiserror::Error)]
pub enum DatabaseError {
    /// No connection: `url` is shown without its password.
    #[error("database error: cannot open {url}: {reason}")]
    Open { url: String, reason: String },
    /// The migrations did not run (for example, one applied earlier was changed since).
    #[error("database migration failed: {0}")]
    Migration(String),
    /// A query failed (the shared secrets, read at start).
    #[error("database error: {0}")]
    Query(String),
}

/// The open, migrated database, lending its stores.
pub struct Database {
    /// Shared by every store: one pool per process (a single connection for SQLite, which
    /// allows one writer at a time anyway).
    pool: AnyPool,
}

/// Every connection to a SQLite file: write-ahead logging, so a commit appends to one file
/// (the log, synced) instead of writing a rollback journal and the database, and readers do
/// not wait on the writer. The mode is kept in the file.
const FILE_PRAGMAS: &[&str] = &["PRAGMA journal_mode = WAL"];

impl Database {
    /// Connects and runs the migrations.
    pub async fn connect(url: &str) -> Result<Database, DatabaseError> {
        sqlx::any::install_default_drivers();
        let cannot_open = |reason: String| DatabaseError::Open {
            url: redact(url),
            reason,
        };
        // One connection first, so a failure says why (the pool only says it timed out).
        match tokio::time::timeout(
            CONNECT_TIMEOUT,
            <sqlx::AnyConnection as sqlx::Connection>::connect(url),
        )
        .await
        {
            Err(_) => {
                return Err(cannot_open(format!(
                    "no answer within {} s",
                    CONNECT_TIMEOUT.as_secs()
                )));
            }
            Ok(Err(e)) => return Err(cannot_open(e.to_string())),
            Ok(Ok(conn)) => {
                let _ = sqlx::Connection::close(conn).await;
            }
        }
        let pool = options(url)
            .connect(url)
            .await
            .map_err(|e| cannot_open(e.to_string()))?;
        sqlx::migrate!("./migrations")
            .run(&pool)
            .await
            .map_err(|e| DatabaseError::Migration(e.to_string()))?;
        Ok(Database { pool })
    }

    /// The registry's overlay of admin API changes (its `ping` is the readiness check).
    pub fn plugin_store(&self) -> Arc<dyn PluginStore> {
        Arc::new(SqlPluginStore::new(self.pool.clone()))
    }

    /// The audit log's records.
    pub fn audit_store(&self) -> Arc<dyn AuditStore> {
        Arc::new(SqlAuditStore::new(self.pool.clone()))
    }

    /// People's credentials, sealed.
    pub fn credential_store(&self) -> Arc<dyn CredentialStore> {
        Arc::new(SqlCredentialStore::new(self.pool.clone()))
    }

    /// The authorization server's state.
    pub fn auth_store(&self) -> Arc<dyn AuthStore> {
        Arc::new(SqlAuthStore::new(self.pool.clone()))
    }

    /// The pool itself, for tools that write rows directly (the fuzz targets' fixtures); the
    /// gateway goes through the stores.
    #[doc(hidden)]
    pub fn pool(&self) -> &AnyPool {
        &self.pool
    }
}

/// A pool's options for `url` (for a SQLite file, [`FILE_PRAGMAS`] run on each connection as
/// it opens).
fn options(url: &str) -> AnyPoolOptions {
    let file = url.starts_with("sqlite") && !url.starts_with("sqlite::memory:");
    let pragmas = if file { FILE_PRAGMAS } else { &[] };
    let options = AnyPoolOptions::new()
        .max_connections(if url.starts_with("sqlite") { 1 } else { 5 })
        // A database that does not answer fails the start (or a request) in seconds, not
        // after sqlx's default half minute.
        .acquire_timeout(CONNECT_TIMEOUT)
        .after_connect(move |conn, _| {
            Box::pin(async move {
                for pragma in pragmas {
                    sqlx::query(*pragma).execute(&mut *conn).await?;
                }
                Ok(())
            })
        });
    // An in-memory SQLite database lives as long as its one connection: keep it forever.
    if url.starts_with("sqlite::memory:") {
        options
            .min_connections(1)
            .idle_timeout(None)
            .max_lifetime(None)
    } else {
        options
    }
}

/// A database URL without its password, for messages.
pub fn redact(url: &str) -> String {
    match (url.find("://"), url.rfind('@')) {
        (Some(scheme), Some(at)) if at > scheme => {
            let creds = &url[scheme + 3..at];
            match creds.split_once(':') {
                Some((user, _)) => format!("{}{user}:***{}", &url[..scheme + 3], &url[at..]),
                None => url.to_owned(),
            }
        }
        _ => url.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_lose_their_passwords_in_messages() {
        assert_eq!(
            redact("postgres://u:secret@h:5432/db"),
            "postgres://u:***@h:5432/db"
        );
        assert_eq!(redact("sqlite://gw.db?mode=rwc"), "sqlite://gw.db?mode=rwc");
    }

    #[tokio::test]
    async fn a_database_that_does_not_open_says_where_without_the_password() {
        let e = Database::connect("postgres://u:secret@127.0.0.1:1/db")
            .await
            .err()
            .expect("nothing listens on port 1");
        let shown = e.to_string();
        assert!(
            shown.starts_with("database error: cannot open postgres://u:***@127.0.0.1:1/db: "),
            "{shown}"
        );
        assert!(!shown.contains("secret"), "{shown}");
    }

    /// A SQLite file is in write-ahead logging, every commit synced.
    #[tokio::test]
    async fn a_sqlite_file_logs_ahead() {
        let dir = tempfile::tempdir().unwrap();
        let url = format!("sqlite://{}/gw.db?mode=rwc", dir.path().display());
        let db = Database::connect(&url).await.unwrap();
        let row = sqlx::query("PRAGMA journal_mode").fetch_one(&db.pool).await;
        let mode: String = sqlx::Row::try_get(&row.unwrap(), 0).unwrap();
        assert_eq!(mode, "wal");
        // 2 is FULL.
        let row = sqlx::query("PRAGMA synchronous").fetch_one(&db.pool).await;
        let sync: i64 = sqlx::Row::try_get(&row.unwrap(), 0).unwrap();
        assert_eq!(sync, 2);
    }

    #[tokio::test]
    async fn both_stores_share_one_in_memory_database() {
        let db = Database::connect("sqlite::memory:").await.unwrap();
        let plugins = db.plugin_store();
        let auth = db.auth_store();
        plugins.ping().await.unwrap();
        plugins.remove("gone").await.unwrap();
        assert!(auth.keys().await.unwrap().is_empty());
        assert!(plugins.load().await.unwrap().contains_key("gone"));
    }
}
