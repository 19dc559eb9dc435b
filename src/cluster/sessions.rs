//! Session records in Redis: `<prefix>session:<id>`, one JSON value each, with the replica that
//! owns the session and an expiry of the session's idle timeout, refreshed while it lives.
//!
//! A record read back is checked: bounded in size, parsed, its version one this gateway
//! speaks; anything else is treated as no record.

use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use redis::AsyncCommands;
use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;

use super::{Cluster, ClusterError};
use crate::metrics::RedisOp;
use crate::protocol;
use crate::session::store::StoreFuture;
use crate::session::{SessionRecord, SessionStore, SessionStoreError};

/// The largest record read back: `initialize` params beyond this are not a client's.
const MAX_RECORD_BYTES: usize = 256 * 1024;

/// A record as kept in Redis.
#[derive(Serialize, Deserialize)]
struct Stored<'a> {
    /// The owning replica.
    replica: &'a str,
    version: &'a str,
    #[serde(borrow)]
    init_params: &'a RawValue,
    #[serde(borrow)]
    owner: Option<std::borrow::Cow<'a, str>>,
    created_ms: u64,
    last_used_ms: u64,
}

fn millis(t: SystemTime) -> u64 {
    t.duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

/// The records of the cluster's sessions (see the module's doc).
pub struct RedisSessionStore {
    cluster: Arc<Cluster>,
    /// How long a record lives without being touched, in milliseconds: the session idle
    /// timeout, so a record outlives its session only when its owner died with it.
    ttl_ms: u64,
}

impl RedisSessionStore {
    pub(super) fn new(cluster: Arc<Cluster>, ttl: Duration) -> RedisSessionStore {
        RedisSessionStore {
            cluster,
            ttl_ms: ttl.as_millis().clamp(1000, u64::MAX as u128) as u64,
        }
    }

    fn ttl_ms(&self) -> u64 {
        self.ttl_ms
    }
}

fn store_error(e: ClusterError) -> SessionStoreError {
    SessionStoreError::Unavailable(e.to_string())
}

/// The raw record of a session, bounded.
async fn read(cluster: &Cluster, id: &str) -> Result<Option<Vec<u8>>, ClusterError> {
    let key = cluster.key(&["session", id]);
    let mut c = cluster.conn.clone();
    let raw: Option<Vec<u8>> = cluster
        .call(RedisOp::SessionRead, async move { c.get(key).await })
        .await?;
    Ok(raw.filter(|r| r.len() <= MAX_RECORD_BYTES))
}

/// The replica a session's record names, if there is a record.
pub(super) async fn owner(cluster: &Cluster, id: &str) -> Result<Option<String>, ClusterError> {
    let Some(raw) = read(cluster, id).await? else {
        return Ok(None);
    };
    #[derive(Deserialize)]
    struct OwnerOnly {
        replica: String,
    }
    Ok(serde_json::from_slice::<OwnerOnly>(&raw)
        .ok()
        .map(|s| s.replica))
}

impl SessionStore for RedisSessionStore {
    fn put(&self, record: SessionRecord) -> StoreFuture<'_, ()> {
        Box::pin(async move {
            let stored = Stored {
                replica: &self.cluster.replica,
                version: record.version,
                init_params: &record.init_params,
                owner: record.owner.as_deref().map(std::borrow::Cow::Borrowed),
                created_ms: millis(record.created),
                last_used_ms: millis(record.last_used),
            };
            let value = serde_json::to_vec(&stored).expect("a record serializes");
            let key = self.cluster.key(&["session", &record.id]);
            let mut c = self.cluster.conn.clone();
            let ttl = self.ttl_ms();
            self.cluster
                .call(RedisOp::SessionWrite, async move {
                    c.pset_ex::<_, _, ()>(key, value, ttl).await
                })
                .await
                .map_err(store_error)
        })
    }

    fn get<'a>(&'a self, id: &'a str) -> StoreFuture<'a, Option<SessionRecord>> {
        Box::pin(async move {
            let Some(raw) = read(&self.cluster, id).await.map_err(store_error)? else {
                return Ok(None);
            };
            let Ok(s) = serde_json::from_slice::<Stored>(&raw) else {
                tracing::warn!(session = %id, "a session record in Redis does not parse; ignored");
                return Ok(None);
            };
            let Some(version) = protocol::CLIENT_VERSIONS.iter().find(|v| **v == s.version) else {
                return Ok(None);
            };
            let at = |ms: u64| UNIX_EPOCH + Duration::from_millis(ms);
            Ok(Some(SessionRecord {
                id: Arc::from(id),
                version,
                init_params: Arc::from(s.init_params.to_owned()),
                owner: s.owner.map(std::borrow::Cow::into_owned),
                created: at(s.created_ms),
                last_used: at(s.last_used_ms),
            }))
        })
    }

    fn touch<'a>(&'a self, id: &'a str, _at: SystemTime) -> StoreFuture<'a, ()> {
        Box::pin(async move {
            let key = self.cluster.key(&["session", id]);
            let mut c = self.cluster.conn.clone();
            let ttl = self.ttl_ms() as i64;
            self.cluster
                .call(RedisOp::SessionWrite, async move {
                    c.pexpire::<_, ()>(key, ttl).await
                })
                .await
                .map_err(store_error)
        })
    }

    fn remove<'a>(&'a self, id: &'a str) -> StoreFuture<'a, ()> {
        Box::pin(async move {
            let key = self.cluster.key(&["session", id]);
            let mut c = self.cluster.conn.clone();
            self.cluster
                .call(
                    RedisOp::SessionWrite,
                    async move { c.del::<_, ()>(key).await },
                )
                .await
                .map_err(store_error)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A subject with characters JSON escapes (`DOMAIN\user`, quotes) still parses back: a
    /// borrowed `&str` could not hold it, and every cross-replica request of that user's
    /// sessions got 404.
    #[test]
    fn regression_a_record_whose_owner_needs_escapes_parses_back() {
        let params = RawValue::from_string(r#"{"a":1}"#.into()).unwrap();
        let stored = Stored {
            replica: "r1",
            version: "2025-11-25",
            init_params: &params,
            owner: Some(std::borrow::Cow::Borrowed("DOMAIN\\user \"x\"")),
            created_ms: 1,
            last_used_ms: 2,
        };
        let bytes = serde_json::to_vec(&stored).unwrap();
        let back: Stored = serde_json::from_slice(&bytes).expect("parses back");
        assert_eq!(back.owner.as_deref(), Some("DOMAIN\\user \"x\""));
        assert_eq!(back.replica, "r1");
    }
}
