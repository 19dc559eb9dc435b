//! Secrets the replicas share, kept in the database: made at random by whichever replica
//! needs one first (an insert that loses a race changes nothing), then read by all: the key
//! that seals a modern client's `requestState` (multi round-trip requests), so a retry that
//! reaches another replica can be read there, and the key of the audit log's hash of a
//! call's arguments, so equal arguments hash alike on every replica.

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use sqlx::Row;

use super::{Database, DatabaseError};

/// The name of the key that seals `requestState`.
pub const REQUEST_STATE_KEY: &str = "mrtr-request-state";

/// The name of the key of the audit log's HMAC of a call's arguments.
pub const AUDIT_KEY: &str = "audit-arguments";

impl Database {
    /// The shared 32-byte secret `name`, made now if no replica made it before.
    pub async fn shared_secret(&self, name: &str) -> Result<[u8; 32], DatabaseError> {
        let failed = |e: sqlx::Error| DatabaseError::Query(e.to_string());
        let fresh: [u8; 32] = rand::random();
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs() as i64);
        sqlx::query(
            "INSERT INTO shared_secrets (name, secret, created_at) VALUES ($1, $2, $3) \
             ON CONFLICT (name) DO NOTHING",
        )
        .bind(name.to_owned())
        .bind(URL_SAFE_NO_PAD.encode(fresh))
        .bind(now)
        .execute(&self.pool)
        .await
        .map_err(failed)?;
        let row = sqlx::query("SELECT secret FROM shared_secrets WHERE name = $1")
            .bind(name.to_owned())
            .fetch_one(&self.pool)
            .await
            .map_err(failed)?;
        let stored: String = row.try_get("secret").map_err(failed)?;
        URL_SAFE_NO_PAD
            .decode(stored)
            .ok()
            .and_then(|b| <[u8; 32]>::try_from(b).ok())
            .ok_or_else(|| DatabaseError::Query(format!("the shared secret {name} is corrupt")))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_secret_is_made_once_and_read_back() {
        let dir = tempfile::tempdir().unwrap();
        let url = format!("sqlite://{}/s.db?mode=rwc", dir.path().display());
        let one = Database::connect(&url).await.unwrap();
        let first = one.shared_secret(REQUEST_STATE_KEY).await.unwrap();
        assert_eq!(one.shared_secret(REQUEST_STATE_KEY).await.unwrap(), first);
        assert_ne!(one.shared_secret("other").await.unwrap(), first);
        drop(one);
        // Another process (a replica, a restart) on the same database reads the same.
        let two = Database::connect(&url).await.unwrap();
        assert_eq!(two.shared_secret(REQUEST_STATE_KEY).await.unwrap(), first);
    }
}
