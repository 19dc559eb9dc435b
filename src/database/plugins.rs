//! The registry's overlay in the gateway's database: [`SqlPluginStore`], the SQL
//! implementation of [`PluginStore`] (the `plugins` table of `migrations/0001_plugins.sql`,
//! one row per plugin name). Rows in, rows out: what a row means for the running plugins is
//! the registry's to decide, never this module's.

use std::collections::BTreeMap;

use sqlx::{AnyPool, Row};

use crate::config::{PluginConfig, PluginSpec};
use crate::registry::store::{Overlay, PluginStore, StoreError, StoreFuture};

impl From<sqlx::Error> for StoreError {
    fn from(e: sqlx::Error) -> Self {
        StoreError::Database(e.to_string())
    }
}

/// The SQL store (SQLite or PostgreSQL), on the gateway's database pool.
pub struct SqlPluginStore {
    pool: AnyPool,
}

impl SqlPluginStore {
    /// A store on `pool`, whose migrations have run ([`super::Database::connect`]).
    pub fn new(pool: AnyPool) -> SqlPluginStore {
        SqlPluginStore { pool }
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::database::Database;

    #[tokio::test]
    async fn sqlite_round_trip() {
        let dir = tempfile::tempdir().unwrap();
        let url = format!("sqlite://{}/t.db?mode=rwc", dir.path().display());
        let store = Database::connect(&url).await.unwrap().plugin_store();
        let mut p = PluginConfig::new("a", "cmd", vec!["x".into()]);
        p.env.insert("TOKEN".into(), "${GITHUB_TOKEN}".into());
        store.put(&p, false).await.unwrap();
        store.remove("gone").await.unwrap();
        drop(store);
        let store = Database::connect(&url).await.unwrap().plugin_store();
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
