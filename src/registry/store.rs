//! Where registry changes made through the admin API are kept: the seam is [`PluginStore`];
//! [`SqlPluginStore`] keeps them in SQLite (a file, by default) or PostgreSQL (when
//! `database_url` says so), both through sqlx with the same migrations, run at start-up.
//!
//! The store holds an overlay on the config file's plugins, one row per plugin name: a
//! definition (added or changed through the API, enabled or not) or a removal.

use std::collections::BTreeMap;
use std::future::Future;
use std::pin::Pin;

use sqlx::AnyPool;
use sqlx::Row;
use sqlx::any::AnyPoolOptions;

use crate::config::{PluginConfig, PluginSpec};

/// The API's change to one plugin.
#[derive(Debug, Clone)]
pub enum Overlay {
    /// A definition from the API (a new plugin, or a config-file one replaced).
    Put {
        config: Box<PluginConfig>,
        enabled: bool,
    },
    /// A config-file plugin enabled or disabled: its definition stays the file's.
    Toggle { enabled: bool },
    /// A config-file plugin removed.
    Removed,
}

#[derive(Debug, Clone, thiserror::Error)]
pub enum StoreError {
    #[error("database error: {0}")]
    Database(String),
    #[error("database migration failed: {0}")]
    Migration(String),
    #[error("a stored plugin `{name}` is unreadable: {reason}")]
    Corrupt { name: String, reason: String },
}

impl From<sqlx::Error> for StoreError {
    fn from(e: sqlx::Error) -> Self {
        StoreError::Database(e.to_string())
    }
}

pub type StoreFuture<'a, T> = Pin<Box<dyn Future<Output = Result<T, StoreError>> + Send + 'a>>;

pub trait PluginStore: Send + Sync + 'static {
    /// Every overlay row, by plugin name.
    fn load(&self) -> StoreFuture<'_, BTreeMap<String, Overlay>>;
    /// Records a plugin's definition.
    fn put<'a>(&'a self, config: &'a PluginConfig, enabled: bool) -> StoreFuture<'a, ()>;
    /// Records a config-file plugin's enabled flag.
    fn toggle<'a>(&'a self, name: &'a str, enabled: bool) -> StoreFuture<'a, ()>;
    /// Records a config-file plugin's removal.
    fn remove<'a>(&'a self, name: &'a str) -> StoreFuture<'a, ()>;
    /// Forgets whatever is recorded for a name (an API plugin removed).
    fn forget<'a>(&'a self, name: &'a str) -> StoreFuture<'a, ()>;
    /// Whether the database answers (readiness).
    fn ping(&self) -> StoreFuture<'_, ()>;
}

/// How long opening the database may take.
const CONNECT_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

/// The SQL store (SQLite or PostgreSQL).
pub struct SqlPluginStore {
    pool: AnyPool,
}

impl SqlPluginStore {
    /// Connects and runs the migrations.
    pub async fn connect(url: &str) -> Result<SqlPluginStore, StoreError> {
        sqlx::any::install_default_drivers();
        let cannot_open =
            |e: String| StoreError::Database(format!("cannot open {}: {e}", redact(url)));
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
        let pool = AnyPoolOptions::new()
            .max_connections(if url.starts_with("sqlite") { 1 } else { 5 })
            // A database that does not answer fails the start (or a request) in seconds, not
            // after sqlx's default half minute.
            .acquire_timeout(CONNECT_TIMEOUT);
        // An in-memory SQLite database lives as long as its one connection: keep it forever.
        let pool = if url.starts_with("sqlite::memory:") {
            pool.min_connections(1)
                .idle_timeout(None)
                .max_lifetime(None)
        } else {
            pool
        };
        let pool = pool
            .connect(url)
            .await
            .map_err(|e| cannot_open(e.to_string()))?;
        sqlx::migrate!("./migrations")
            .run(&pool)
            .await
            .map_err(|e| StoreError::Migration(e.to_string()))?;
        Ok(SqlPluginStore { pool })
    }

    /// The database pool, shared with the authorization store.
    pub fn pool(&self) -> AnyPool {
        self.pool.clone()
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

fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64)
}

impl PluginStore for SqlPluginStore {
    fn load(&self) -> StoreFuture<'_, BTreeMap<String, Overlay>> {
        Box::pin(async move {
            let rows = sqlx::query("SELECT name, spec, enabled, removed FROM plugins")
                .fetch_all(&self.pool)
                .await?;
            let mut out = BTreeMap::new();
            for row in rows {
                let name: String = row.try_get("name")?;
                let removed: i64 = row.try_get("removed")?;
                let spec: Option<String> = row.try_get("spec")?;
                let enabled: i64 = row.try_get("enabled")?;
                let overlay = if removed != 0 {
                    Overlay::Removed
                } else if spec.is_none() {
                    Overlay::Toggle {
                        enabled: enabled != 0,
                    }
                } else {
                    let corrupt = |reason: String| StoreError::Corrupt {
                        name: name.clone(),
                        reason,
                    };
                    let spec: PluginSpec = serde_json::from_str(spec.as_deref().unwrap_or(""))
                        .map_err(|e| corrupt(e.to_string()))?;
                    Overlay::Put {
                        config: Box::new(spec.into_config(name.clone())),
                        enabled: enabled != 0,
                    }
                };
                out.insert(name, overlay);
            }
            Ok(out)
        })
    }

    fn put<'a>(&'a self, config: &'a PluginConfig, enabled: bool) -> StoreFuture<'a, ()> {
        Box::pin(async move {
            let spec =
                serde_json::to_string(&PluginSpec::from_config(config)).expect("serializable");
            sqlx::query(
                "INSERT INTO plugins (name, spec, enabled, removed, updated_at) VALUES ($1, $2, $3, 0, $4) \
                 ON CONFLICT (name) DO UPDATE SET spec = excluded.spec, enabled = excluded.enabled, \
                 removed = 0, updated_at = excluded.updated_at",
            )
            .bind(config.name.clone())
            .bind(spec)
            .bind(i64::from(enabled))
            .bind(now_ms())
            .execute(&self.pool)
            .await?;
            Ok(())
        })
    }

    fn remove<'a>(&'a self, name: &'a str) -> StoreFuture<'a, ()> {
        Box::pin(async move {
            sqlx::query(
                "INSERT INTO plugins (name, spec, enabled, removed, updated_at) VALUES ($1, NULL, 0, 1, $2) \
                 ON CONFLICT (name) DO UPDATE SET spec = NULL, enabled = 0, removed = 1, updated_at = excluded.updated_at",
            )
            .bind(name.to_owned())
            .bind(now_ms())
            .execute(&self.pool)
            .await?;
            Ok(())
        })
    }

    fn toggle<'a>(&'a self, name: &'a str, enabled: bool) -> StoreFuture<'a, ()> {
        Box::pin(async move {
            sqlx::query(
                "INSERT INTO plugins (name, spec, enabled, removed, updated_at) VALUES ($1, NULL, $2, 0, $3) \
                 ON CONFLICT (name) DO UPDATE SET spec = NULL, enabled = excluded.enabled, removed = 0, updated_at = excluded.updated_at",
            )
            .bind(name.to_owned())
            .bind(i64::from(enabled))
            .bind(now_ms())
            .execute(&self.pool)
            .await?;
            Ok(())
        })
    }

    fn forget<'a>(&'a self, name: &'a str) -> StoreFuture<'a, ()> {
        Box::pin(async move {
            sqlx::query("DELETE FROM plugins WHERE name = $1")
                .bind(name.to_owned())
                .execute(&self.pool)
                .await?;
            Ok(())
        })
    }

    fn ping(&self) -> StoreFuture<'_, ()> {
        Box::pin(async move {
            sqlx::query("SELECT 1").execute(&self.pool).await?;
            Ok(())
        })
    }
}

/// A store that keeps the overlay in memory only (changes are lost at exit): for tests and
/// for running without a database.
#[derive(Default)]
pub struct MemoryPluginStore(std::sync::Mutex<BTreeMap<String, Overlay>>);

impl PluginStore for MemoryPluginStore {
    fn load(&self) -> StoreFuture<'_, BTreeMap<String, Overlay>> {
        let all = self.0.lock().expect("store lock").clone();
        Box::pin(std::future::ready(Ok(all)))
    }

    fn put<'a>(&'a self, config: &'a PluginConfig, enabled: bool) -> StoreFuture<'a, ()> {
        let put = Overlay::Put {
            config: Box::new(config.clone()),
            enabled,
        };
        self.0
            .lock()
            .expect("store lock")
            .insert(config.name.clone(), put);
        Box::pin(std::future::ready(Ok(())))
    }

    fn remove<'a>(&'a self, name: &'a str) -> StoreFuture<'a, ()> {
        self.0
            .lock()
            .expect("store lock")
            .insert(name.to_owned(), Overlay::Removed);
        Box::pin(std::future::ready(Ok(())))
    }

    fn toggle<'a>(&'a self, name: &'a str, enabled: bool) -> StoreFuture<'a, ()> {
        self.0
            .lock()
            .expect("store lock")
            .insert(name.to_owned(), Overlay::Toggle { enabled });
        Box::pin(std::future::ready(Ok(())))
    }

    fn forget<'a>(&'a self, name: &'a str) -> StoreFuture<'a, ()> {
        self.0.lock().expect("store lock").remove(name);
        Box::pin(std::future::ready(Ok(())))
    }

    fn ping(&self) -> StoreFuture<'_, ()> {
        Box::pin(std::future::ready(Ok(())))
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
    async fn sqlite_round_trip() {
        let dir = tempfile::tempdir().unwrap();
        let url = format!("sqlite://{}/t.db?mode=rwc", dir.path().display());
        let store = SqlPluginStore::connect(&url).await.unwrap();
        let mut p = PluginConfig::new("a", "cmd", vec!["x".into()]);
        p.env.insert("TOKEN".into(), "${GITHUB_TOKEN}".into());
        store.put(&p, false).await.unwrap();
        store.remove("gone").await.unwrap();
        drop(store);
        let store = SqlPluginStore::connect(&url).await.unwrap();
        let all = store.load().await.unwrap();
        match &all["a"] {
            Overlay::Put { config, enabled } => {
                assert_eq!(**config, p);
                assert!(!enabled);
            }
            other => panic!("{other:?}"),
        }
        assert!(matches!(all["gone"], Overlay::Removed));
        store.toggle("filed", false).await.unwrap();
        assert!(matches!(
            store.load().await.unwrap()["filed"],
            Overlay::Toggle { enabled: false }
        ));
        store.forget("filed").await.unwrap();
        assert!(!store.load().await.unwrap().contains_key("filed"));
        store.put(&p, true).await.unwrap();
        assert!(matches!(
            store.load().await.unwrap()["a"],
            Overlay::Put { enabled: true, .. }
        ));
    }
}
