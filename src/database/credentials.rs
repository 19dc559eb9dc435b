//! People's credentials in the gateway's database: [`SqlCredentialStore`], the SQL
//! implementation of [`CredentialStore`] (the `credentials` table of
//! `migrations/0010_credentials.sql`). Only sealed values pass through here.

use sqlx::any::AnyRow;
use sqlx::{AnyPool, Row};

use crate::credentials::store::{Registered, Request};
use crate::credentials::{CredentialStore, StoreError, StoreFuture, Stored};

/// The SQL store (SQLite or PostgreSQL), on the gateway's database pool.
pub struct SqlCredentialStore {
    pool: AnyPool,
}

impl SqlCredentialStore {
    pub fn new(pool: AnyPool) -> SqlCredentialStore {
        SqlCredentialStore { pool }
    }
}

fn failed(e: sqlx::Error) -> StoreError {
    StoreError::Database(e.to_string())
}

/// The table's columns, in the order [`row`] reads them.
macro_rules! columns {
    () => {
        "subject, name, sealed, connected_at_ms, expires_at_ms, scopes"
    };
}

fn row(r: &AnyRow) -> Result<Stored, StoreError> {
    Ok(Stored {
        subject: r.try_get("subject").map_err(failed)?,
        name: r.try_get("name").map_err(failed)?,
        sealed: r.try_get("sealed").map_err(failed)?,
        connected_at_ms: r.try_get("connected_at_ms").map_err(failed)?,
        expires_at_ms: r.try_get("expires_at_ms").map_err(failed)?,
        scopes: r.try_get("scopes").map_err(failed)?,
    })
}

impl CredentialStore for SqlCredentialStore {
    fn get<'a>(&'a self, subject: &'a str, name: &'a str) -> StoreFuture<'a, Option<Stored>> {
        Box::pin(async move {
            let found = sqlx::query(concat!(
                "SELECT ",
                columns!(),
                " FROM credentials WHERE subject = $1 AND name = $2"
            ))
            .bind(subject.to_owned())
            .bind(name.to_owned())
            .fetch_optional(&self.pool)
            .await
            .map_err(failed)?;
            found.as_ref().map(row).transpose()
        })
    }

    fn put<'a>(&'a self, r: &'a Stored) -> StoreFuture<'a, ()> {
        Box::pin(async move {
            sqlx::query(concat!(
                "INSERT INTO credentials (",
                columns!(),
                ") VALUES ($1, $2, $3, $4, $5, $6) \
                 ON CONFLICT (subject, name) DO UPDATE SET sealed = excluded.sealed, \
                 connected_at_ms = excluded.connected_at_ms, expires_at_ms = excluded.expires_at_ms, \
                 scopes = excluded.scopes, refreshing_until_ms = NULL"
            ))
            .bind(r.subject.clone())
            .bind(r.name.clone())
            .bind(r.sealed.clone())
            .bind(r.connected_at_ms)
            .bind(r.expires_at_ms)
            .bind(r.scopes.clone())
            .execute(&self.pool)
            .await
            .map_err(failed)?;
            Ok(())
        })
    }

    fn swap<'a>(&'a self, r: &'a Stored, was: &'a str) -> StoreFuture<'a, bool> {
        Box::pin(async move {
            let done = sqlx::query(
                "UPDATE credentials SET sealed = $1, expires_at_ms = $2, scopes = $3, \
                 refreshing_until_ms = NULL WHERE subject = $4 AND name = $5 AND sealed = $6",
            )
            .bind(r.sealed.clone())
            .bind(r.expires_at_ms)
            .bind(r.scopes.clone())
            .bind(r.subject.clone())
            .bind(r.name.clone())
            .bind(was.to_owned())
            .execute(&self.pool)
            .await
            .map_err(failed)?;
            Ok(done.rows_affected() == 1)
        })
    }

    fn delete_if<'a>(
        &'a self,
        subject: &'a str,
        name: &'a str,
        was: &'a str,
    ) -> StoreFuture<'a, bool> {
        Box::pin(async move {
            let done = sqlx::query(
                "DELETE FROM credentials WHERE subject = $1 AND name = $2 AND sealed = $3",
            )
            .bind(subject.to_owned())
            .bind(name.to_owned())
            .bind(was.to_owned())
            .execute(&self.pool)
            .await
            .map_err(failed)?;
            Ok(done.rows_affected() == 1)
        })
    }

    fn claim_refresh<'a>(
        &'a self,
        subject: &'a str,
        name: &'a str,
        sealed: &'a str,
        now_ms: i64,
        until_ms: i64,
    ) -> StoreFuture<'a, bool> {
        Box::pin(async move {
            // One statement claims it: of two replicas at once, one gets it; and only the
            // value as it was read (one refreshed meanwhile is not refreshed again).
            let done = sqlx::query(
                "UPDATE credentials SET refreshing_until_ms = $1 WHERE subject = $2 AND name = $3 \
                 AND sealed = $5 AND (refreshing_until_ms IS NULL OR refreshing_until_ms < $4)",
            )
            .bind(until_ms)
            .bind(subject.to_owned())
            .bind(name.to_owned())
            .bind(now_ms)
            .bind(sealed.to_owned())
            .execute(&self.pool)
            .await
            .map_err(failed)?;
            Ok(done.rows_affected() == 1)
        })
    }

    fn release_refresh<'a>(&'a self, subject: &'a str, name: &'a str) -> StoreFuture<'a, ()> {
        Box::pin(async move {
            sqlx::query(
                "UPDATE credentials SET refreshing_until_ms = NULL WHERE subject = $1 AND name = $2",
            )
            .bind(subject.to_owned())
            .bind(name.to_owned())
            .execute(&self.pool)
            .await
            .map_err(failed)?;
            Ok(())
        })
    }

    fn delete<'a>(&'a self, subject: Option<&'a str>, name: &'a str) -> StoreFuture<'a, u64> {
        Box::pin(async move {
            let done = match subject {
                Some(s) => {
                    sqlx::query("DELETE FROM credentials WHERE subject = $1 AND name = $2")
                        .bind(s.to_owned())
                        .bind(name.to_owned())
                        .execute(&self.pool)
                        .await
                }
                None => {
                    sqlx::query("DELETE FROM credentials WHERE name = $1")
                        .bind(name.to_owned())
                        .execute(&self.pool)
                        .await
                }
            }
            .map_err(failed)?;
            Ok(done.rows_affected())
        })
    }

    fn of_subject<'a>(&'a self, subject: &'a str) -> StoreFuture<'a, Vec<Stored>> {
        Box::pin(async move {
            let rows = sqlx::query(concat!(
                "SELECT ",
                columns!(),
                " FROM credentials WHERE subject = $1 ORDER BY name"
            ))
            .bind(subject.to_owned())
            .fetch_all(&self.pool)
            .await
            .map_err(failed)?;
            rows.iter().map(row).collect()
        })
    }

    fn of_credential<'a>(&'a self, name: &'a str) -> StoreFuture<'a, Vec<Stored>> {
        Box::pin(async move {
            let rows = sqlx::query(concat!(
                "SELECT ",
                columns!(),
                " FROM credentials WHERE name = $1 ORDER BY subject"
            ))
            .bind(name.to_owned())
            .fetch_all(&self.pool)
            .await
            .map_err(failed)?;
            rows.iter().map(row).collect()
        })
    }

    fn definitions(&self) -> StoreFuture<'_, Vec<(String, String)>> {
        Box::pin(async move {
            let rows = sqlx::query("SELECT name, spec FROM credential_definitions ORDER BY name")
                .fetch_all(&self.pool)
                .await
                .map_err(failed)?;
            rows.iter()
                .map(|r| {
                    Ok((
                        r.try_get("name").map_err(failed)?,
                        r.try_get("spec").map_err(failed)?,
                    ))
                })
                .collect()
        })
    }

    fn registration<'a>(
        &'a self,
        name: &'a str,
        issuer: &'a str,
        registered: Option<&'a Registered>,
        now_ms: i64,
    ) -> StoreFuture<'a, Option<Registered>> {
        Box::pin(async move {
            if let Some(r) = registered {
                sqlx::query(
                    "INSERT INTO oauth_registrations \
                     (credential, issuer, client_id, created_at_ms, client_secret, auth_method) \
                     VALUES ($1, $2, $3, $4, $5, $6) ON CONFLICT (credential, issuer) DO NOTHING",
                )
                .bind(name.to_owned())
                .bind(issuer.to_owned())
                .bind(r.client_id.clone())
                .bind(now_ms)
                .bind(r.sealed_secret.clone())
                .bind(r.auth_method.clone())
                .execute(&self.pool)
                .await
                .map_err(failed)?;
            }
            let row = sqlx::query(
                "SELECT client_id, client_secret, auth_method FROM oauth_registrations \
                 WHERE credential = $1 AND issuer = $2",
            )
            .bind(name.to_owned())
            .bind(issuer.to_owned())
            .fetch_optional(&self.pool)
            .await
            .map_err(failed)?;
            row.map(|r| {
                Ok(Registered {
                    client_id: r.try_get("client_id").map_err(failed)?,
                    sealed_secret: r.try_get("client_secret").map_err(failed)?,
                    auth_method: r.try_get("auth_method").map_err(failed)?,
                })
            })
            .transpose()
        })
    }

    fn forget_registration<'a>(
        &'a self,
        name: &'a str,
        issuer: &'a str,
        client_id: &'a str,
    ) -> StoreFuture<'a, ()> {
        Box::pin(async move {
            sqlx::query(
                "DELETE FROM oauth_registrations \
                 WHERE credential = $1 AND issuer = $2 AND client_id = $3",
            )
            .bind(name.to_owned())
            .bind(issuer.to_owned())
            .bind(client_id.to_owned())
            .execute(&self.pool)
            .await
            .map_err(failed)?;
            Ok(())
        })
    }

    fn put_definition<'a>(
        &'a self,
        name: &'a str,
        spec: &'a str,
        now_ms: i64,
    ) -> StoreFuture<'a, ()> {
        Box::pin(async move {
            sqlx::query(
                "INSERT INTO credential_definitions (name, spec, updated_at_ms) VALUES ($1, $2, $3) \
                 ON CONFLICT (name) DO UPDATE SET spec = excluded.spec, updated_at_ms = excluded.updated_at_ms",
            )
            .bind(name.to_owned())
            .bind(spec.to_owned())
            .bind(now_ms)
            .execute(&self.pool)
            .await
            .map_err(failed)?;
            Ok(())
        })
    }

    fn delete_definition<'a>(&'a self, name: &'a str) -> StoreFuture<'a, bool> {
        Box::pin(async move {
            let done = sqlx::query("DELETE FROM credential_definitions WHERE name = $1")
                .bind(name.to_owned())
                .execute(&self.pool)
                .await
                .map_err(failed)?;
            Ok(done.rows_affected() == 1)
        })
    }

    fn open_request<'a>(&'a self, r: &'a Request) -> StoreFuture<'a, ()> {
        Box::pin(async move {
            // Requests a day past their expiry are of no use to anyone.
            sqlx::query("DELETE FROM credential_requests WHERE expires_at_ms < $1")
                .bind(r.created_at_ms - 86_400_000)
                .execute(&self.pool)
                .await
                .map_err(failed)?;
            sqlx::query(
                "INSERT INTO credential_requests \
                 (id, subject, name, created_at_ms, expires_at_ms, scopes) \
                 VALUES ($1, $2, $3, $4, $5, $6)",
            )
            .bind(r.id.clone())
            .bind(r.subject.clone())
            .bind(r.name.clone())
            .bind(r.created_at_ms)
            .bind(r.expires_at_ms)
            .bind(r.scopes.clone())
            .execute(&self.pool)
            .await
            .map_err(failed)?;
            Ok(())
        })
    }

    fn take_request<'a>(&'a self, id: &'a str, now_ms: i64) -> StoreFuture<'a, Option<Request>> {
        Box::pin(async move {
            // One statement marks it used: of two takes at once, one finds it.
            let done = sqlx::query(
                "UPDATE credential_requests SET used_at_ms = $1 \
                 WHERE id = $2 AND used_at_ms IS NULL AND expires_at_ms > $1",
            )
            .bind(now_ms)
            .bind(id.to_owned())
            .execute(&self.pool)
            .await
            .map_err(failed)?;
            if done.rows_affected() != 1 {
                return Ok(None);
            }
            request(&self.pool, id, true, now_ms).await
        })
    }

    fn peek_request<'a>(&'a self, id: &'a str, now_ms: i64) -> StoreFuture<'a, Option<Request>> {
        Box::pin(async move { request(&self.pool, id, false, now_ms).await })
    }
}

/// The request `id`: the one just used at `now_ms` (`used`), or one still open then.
async fn request(
    pool: &AnyPool,
    id: &str,
    used: bool,
    now_ms: i64,
) -> Result<Option<Request>, StoreError> {
    let sql = if used {
        "SELECT id, subject, name, created_at_ms, expires_at_ms, scopes FROM credential_requests \
             WHERE id = $1 AND used_at_ms = $2"
    } else {
        "SELECT id, subject, name, created_at_ms, expires_at_ms, scopes FROM credential_requests \
             WHERE id = $1 AND used_at_ms IS NULL AND expires_at_ms > $2"
    };
    let found = sqlx::query(sql)
        .bind(id.to_owned())
        .bind(now_ms)
        .fetch_optional(pool)
        .await
        .map_err(failed)?;
    found
        .map(|r| {
            Ok(Request {
                id: r.try_get("id").map_err(failed)?,
                subject: r.try_get("subject").map_err(failed)?,
                name: r.try_get("name").map_err(failed)?,
                created_at_ms: r.try_get("created_at_ms").map_err(failed)?,
                expires_at_ms: r.try_get("expires_at_ms").map_err(failed)?,
                scopes: r.try_get("scopes").map_err(failed)?,
            })
        })
        .transpose()
}
