//! The authorization server's state in the gateway's database: [`SqlAuthStore`], the SQL
//! implementation of [`AuthStore`] (tables of `migrations/0002_auth.sql` and after, the same
//! on SQLite and PostgreSQL). Rows in, rows out: which codes, tokens and clients are valid is
//! decided by the auth code, never here. Single-use secrets are claimed with one `UPDATE`, so
//! of two replicas racing for a code or refresh token exactly one wins.

use sqlx::{AnyPool, Row};

use crate::auth::store::{
    AuthFuture, AuthStore, AuthStoreError, Client, Code, Issued, Pending, Refresh, StoredKey, Taken,
};
use crate::auth::{LEEWAY, now_secs};

impl From<sqlx::Error> for AuthStoreError {
    fn from(e: sqlx::Error) -> Self {
        AuthStoreError::Database(e.to_string())
    }
}

/// The SQL store, on the gateway's database pool.
pub struct SqlAuthStore {
    pool: AnyPool,
}

impl SqlAuthStore {
    /// A store on `pool`, whose migrations have run ([`super::Database::connect`]).
    pub fn new(pool: AnyPool) -> SqlAuthStore {
        SqlAuthStore { pool }
    }
}

fn list(v: &[String]) -> String {
    serde_json::to_string(v).expect("strings serialize")
}

fn unlist(s: &str) -> Result<Vec<String>, AuthStoreError> {
    serde_json::from_str(s).map_err(|e| AuthStoreError::Corrupt(e.to_string()))
}

/// A `groups` column: a JSON list, NULL (rows from before it existed) for none.
fn groups_of(row: &sqlx::any::AnyRow) -> Result<Vec<String>, AuthStoreError> {
    match row.try_get::<Option<String>, _>("groups")? {
        Some(g) => unlist(&g),
        None => Ok(Vec::new()),
    }
}

fn client_row(row: &sqlx::any::AnyRow) -> Result<Client, AuthStoreError> {
    Ok(Client {
        client_id: row.try_get("client_id")?,
        secret_hash: row.try_get("secret_hash")?,
        name: row.try_get("name")?,
        redirect_uris: unlist(&row.try_get::<String, _>("redirect_uris")?)?,
        auth_method: row.try_get("auth_method")?,
        grant_types: unlist(&row.try_get::<String, _>("grant_types")?)?,
        application_type: row.try_get("application_type")?,
        scope: row.try_get("scope")?,
        provisioned: false,
    })
}

fn code_row(row: &sqlx::any::AnyRow) -> Result<Code, AuthStoreError> {
    let issued = match (
        row.try_get::<Option<String>, _>("family")?,
        row.try_get::<Option<String>, _>("access_jti")?,
        row.try_get::<Option<i64>, _>("access_expires_at")?,
        row.try_get::<Option<i64>, _>("kept_until")?,
    ) {
        (Some(family), Some(access_jti), Some(access_expires_at), Some(kept_until)) => {
            Some(Issued {
                family,
                access_jti,
                access_expires_at,
                kept_until,
            })
        }
        _ => None,
    };
    Ok(Code {
        issued,
        code_hash: row.try_get("code_hash")?,
        client_id: row.try_get("client_id")?,
        subject: row.try_get("subject")?,
        redirect_uri: row.try_get("redirect_uri")?,
        resource: row.try_get("resource")?,
        scope: row.try_get("scope")?,
        challenge: row.try_get("challenge")?,
        expires_at: row.try_get("expires_at")?,
        groups: groups_of(row)?,
    })
}

fn refresh_row(row: &sqlx::any::AnyRow) -> Result<Refresh, AuthStoreError> {
    Ok(Refresh {
        token_hash: row.try_get("token_hash")?,
        family: row.try_get("family")?,
        client_id: row.try_get("client_id")?,
        subject: row.try_get("subject")?,
        resource: row.try_get("resource")?,
        scope: row.try_get("scope")?,
        expires_at: row.try_get("expires_at")?,
        groups: groups_of(row)?,
        access: match (
            row.try_get::<Option<String>, _>("access_jti")?,
            row.try_get::<Option<i64>, _>("access_expires_at")?,
        ) {
            (Some(jti), Some(exp)) => Some((jti, exp)),
            _ => None,
        },
    })
}

impl AuthStore for SqlAuthStore {
    fn keys(&self) -> AuthFuture<'_, Vec<StoredKey>> {
        Box::pin(async move {
            let rows = sqlx::query(
                "SELECT kid, private_der, created_at, retired_at FROM auth_keys ORDER BY created_at",
            )
            .fetch_all(&self.pool)
            .await?;
            rows.iter()
                .map(|r| {
                    Ok(StoredKey {
                        kid: r.try_get("kid")?,
                        private_der: r.try_get("private_der")?,
                        created_at: r.try_get("created_at")?,
                        retired_at: r.try_get("retired_at")?,
                    })
                })
                .collect()
        })
    }

    fn add_key<'a>(&'a self, key: &'a StoredKey) -> AuthFuture<'a, ()> {
        Box::pin(async move {
            sqlx::query(
                "INSERT INTO auth_keys (kid, private_der, created_at, retired_at) VALUES ($1, $2, $3, NULL)",
            )
            .bind(key.kid.clone())
            .bind(key.private_der.clone())
            .bind(key.created_at)
            .execute(&self.pool)
            .await?;
            Ok(())
        })
    }

    fn retire_key<'a>(&'a self, kid: &'a str, at: i64) -> AuthFuture<'a, ()> {
        Box::pin(async move {
            sqlx::query("UPDATE auth_keys SET retired_at = $1 WHERE kid = $2")
                .bind(at)
                .bind(kid.to_owned())
                .execute(&self.pool)
                .await?;
            Ok(())
        })
    }

    fn delete_key<'a>(&'a self, kid: &'a str) -> AuthFuture<'a, ()> {
        Box::pin(async move {
            sqlx::query("DELETE FROM auth_keys WHERE kid = $1")
                .bind(kid.to_owned())
                .execute(&self.pool)
                .await?;
            Ok(())
        })
    }

    fn add_client<'a>(&'a self, c: &'a Client) -> AuthFuture<'a, ()> {
        Box::pin(async move {
            sqlx::query(
                "INSERT INTO oauth_clients (client_id, secret_hash, name, redirect_uris, auth_method, \
                 grant_types, application_type, scope, created_at) \
                 VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)",
            )
            .bind(c.client_id.clone())
            .bind(c.secret_hash.clone())
            .bind(c.name.clone())
            .bind(list(&c.redirect_uris))
            .bind(c.auth_method.clone())
            .bind(list(&c.grant_types))
            .bind(c.application_type.clone())
            .bind(c.scope.clone())
            .bind(now_secs())
            .execute(&self.pool)
            .await?;
            Ok(())
        })
    }

    fn client<'a>(&'a self, client_id: &'a str) -> AuthFuture<'a, Option<Client>> {
        Box::pin(async move {
            let row = sqlx::query(
                "SELECT client_id, secret_hash, name, redirect_uris, auth_method, grant_types, \
                 application_type, scope FROM oauth_clients WHERE client_id = $1",
            )
            .bind(client_id.to_owned())
            .fetch_optional(&self.pool)
            .await?;
            row.as_ref().map(client_row).transpose()
        })
    }

    fn put_pending<'a>(&'a self, p: &'a Pending) -> AuthFuture<'a, ()> {
        Box::pin(async move {
            sqlx::query(
                "INSERT INTO oauth_pending (id, csrf_hash, request, subject, expires_at, groups) \
                 VALUES ($1, $2, $3, $4, $5, $6) \
                 ON CONFLICT (id) DO UPDATE SET subject = excluded.subject, \
                 request = excluded.request, groups = excluded.groups",
            )
            .bind(p.id.clone())
            .bind(p.csrf_hash.clone())
            .bind(p.request.clone())
            .bind(p.subject.clone())
            .bind(p.expires_at)
            .bind(list(&p.groups))
            .execute(&self.pool)
            .await?;
            Ok(())
        })
    }

    fn pending<'a>(&'a self, id: &'a str) -> AuthFuture<'a, Option<Pending>> {
        Box::pin(async move {
            let row = sqlx::query(
                "SELECT id, csrf_hash, request, subject, expires_at, groups FROM oauth_pending WHERE id = $1",
            )
            .bind(id.to_owned())
            .fetch_optional(&self.pool)
            .await?;
            row.map(|r| {
                Ok(Pending {
                    id: r.try_get("id")?,
                    csrf_hash: r.try_get("csrf_hash")?,
                    request: r.try_get("request")?,
                    subject: r.try_get("subject")?,
                    expires_at: r.try_get("expires_at")?,
                    groups: groups_of(&r)?,
                })
            })
            .transpose()
        })
    }

    fn take_pending<'a>(&'a self, id: &'a str) -> AuthFuture<'a, Option<Pending>> {
        Box::pin(async move {
            let Some(p) = self.pending(id).await? else {
                return Ok(None);
            };
            // The delete is the single-use check: of two concurrent takers, one removes it.
            let taken = sqlx::query("DELETE FROM oauth_pending WHERE id = $1")
                .bind(id.to_owned())
                .execute(&self.pool)
                .await?
                .rows_affected()
                == 1;
            Ok(taken.then_some(p))
        })
    }

    fn delete_pending<'a>(&'a self, id: &'a str) -> AuthFuture<'a, ()> {
        Box::pin(async move {
            sqlx::query("DELETE FROM oauth_pending WHERE id = $1")
                .bind(id.to_owned())
                .execute(&self.pool)
                .await?;
            Ok(())
        })
    }

    fn add_code<'a>(&'a self, c: &'a Code) -> AuthFuture<'a, ()> {
        Box::pin(async move {
            sqlx::query(
                "INSERT INTO oauth_codes (code_hash, client_id, subject, redirect_uri, resource, \
                 scope, challenge, expires_at, used, groups) \
                 VALUES ($1, $2, $3, $4, $5, $6, $7, $8, 0, $9)",
            )
            .bind(c.code_hash.clone())
            .bind(c.client_id.clone())
            .bind(c.subject.clone())
            .bind(c.redirect_uri.clone())
            .bind(c.resource.clone())
            .bind(c.scope.clone())
            .bind(c.challenge.clone())
            .bind(c.expires_at)
            .bind(list(&c.groups))
            .execute(&self.pool)
            .await?;
            Ok(())
        })
    }

    fn take_code<'a>(
        &'a self,
        code_hash: &'a str,
        issue: &'a Issued,
    ) -> AuthFuture<'a, Taken<Code>> {
        Box::pin(async move {
            // The update is the single-use check: of two concurrent exchanges, one changes
            // the row. It records what this redemption will issue in the same step, so a
            // replay, however soon, finds what to revoke.
            let claimed = sqlx::query(
                "UPDATE oauth_codes SET used = 1, family = $2, access_jti = $3, \
                 access_expires_at = $4, kept_until = $5 WHERE code_hash = $1 AND used = 0",
            )
            .bind(code_hash.to_owned())
            .bind(issue.family.clone())
            .bind(issue.access_jti.clone())
            .bind(issue.access_expires_at)
            .bind(issue.kept_until)
            .execute(&self.pool)
            .await?
            .rows_affected()
                == 1;
            let row = sqlx::query(
                "SELECT code_hash, client_id, subject, redirect_uri, resource, scope, challenge, \
                 expires_at, family, access_jti, access_expires_at, kept_until, groups \
                 FROM oauth_codes WHERE code_hash = $1",
            )
            .bind(code_hash.to_owned())
            .fetch_optional(&self.pool)
            .await?;
            Ok(match row.as_ref().map(code_row).transpose()? {
                Some(c) if claimed => Taken::Fresh(c),
                Some(c) => {
                    // Marked replayed, for a first redemption still issuing (see
                    // `code_replayed`).
                    sqlx::query("UPDATE oauth_codes SET used = 2 WHERE code_hash = $1")
                        .bind(code_hash.to_owned())
                        .execute(&self.pool)
                        .await?;
                    Taken::Reused(c)
                }
                None => Taken::Unknown,
            })
        })
    }

    fn code_replayed<'a>(&'a self, code_hash: &'a str) -> AuthFuture<'a, bool> {
        Box::pin(async move {
            let row =
                sqlx::query("SELECT 1 AS one FROM oauth_codes WHERE code_hash = $1 AND used = 2")
                    .bind(code_hash.to_owned())
                    .fetch_optional(&self.pool)
                    .await?;
            Ok(row.is_some())
        })
    }

    fn add_refresh<'a>(&'a self, r: &'a Refresh) -> AuthFuture<'a, ()> {
        Box::pin(async move {
            sqlx::query(
                "INSERT INTO oauth_refresh_tokens (token_hash, family, client_id, subject, resource, \
                 scope, expires_at, used, revoked, access_jti, access_expires_at, groups) \
                 VALUES ($1, $2, $3, $4, $5, $6, $7, 0, 0, $8, $9, $10)",
            )
            .bind(r.token_hash.clone())
            .bind(r.family.clone())
            .bind(r.client_id.clone())
            .bind(r.subject.clone())
            .bind(r.resource.clone())
            .bind(r.scope.clone())
            .bind(r.expires_at)
            .bind(r.access.as_ref().map(|a| a.0.clone()))
            .bind(r.access.as_ref().map(|a| a.1))
            .bind(list(&r.groups))
            .execute(&self.pool)
            .await?;
            Ok(())
        })
    }

    fn take_refresh<'a>(&'a self, token_hash: &'a str) -> AuthFuture<'a, Taken<Refresh>> {
        Box::pin(async move {
            let claimed = sqlx::query(
                "UPDATE oauth_refresh_tokens SET used = 1 \
                 WHERE token_hash = $1 AND used = 0 AND revoked = 0",
            )
            .bind(token_hash.to_owned())
            .execute(&self.pool)
            .await?
            .rows_affected()
                == 1;
            let row = sqlx::query(
                "SELECT token_hash, family, client_id, subject, resource, scope, expires_at, revoked, \
                 access_jti, access_expires_at, groups FROM oauth_refresh_tokens WHERE token_hash = $1",
            )
            .bind(token_hash.to_owned())
            .fetch_optional(&self.pool)
            .await?;
            let Some(row) = row else {
                return Ok(Taken::Unknown);
            };
            let revoked: i64 = row.try_get("revoked")?;
            let r = refresh_row(&row)?;
            Ok(if claimed {
                Taken::Fresh(r)
            } else if revoked != 0 {
                Taken::Unknown
            } else {
                Taken::Reused(r)
            })
        })
    }

    fn refresh<'a>(&'a self, token_hash: &'a str) -> AuthFuture<'a, Option<Refresh>> {
        Box::pin(async move {
            let row = sqlx::query(
                "SELECT token_hash, family, client_id, subject, resource, scope, expires_at, \
                 access_jti, access_expires_at, groups FROM oauth_refresh_tokens WHERE token_hash = $1",
            )
            .bind(token_hash.to_owned())
            .fetch_optional(&self.pool)
            .await?;
            row.as_ref().map(refresh_row).transpose()
        })
    }

    fn revoke_family<'a>(
        &'a self,
        family: &'a str,
        now: i64,
    ) -> AuthFuture<'a, Vec<(String, i64)>> {
        Box::pin(async move {
            sqlx::query("UPDATE oauth_refresh_tokens SET revoked = 1 WHERE family = $1")
                .bind(family.to_owned())
                .execute(&self.pool)
                .await?;
            let rows = sqlx::query(
                "SELECT access_jti, access_expires_at FROM oauth_refresh_tokens \
                 WHERE family = $1 AND access_jti IS NOT NULL AND access_expires_at >= $2",
            )
            .bind(family.to_owned())
            .bind(now - LEEWAY.as_secs() as i64)
            .fetch_all(&self.pool)
            .await?;
            rows.iter()
                .map(|r| Ok((r.try_get("access_jti")?, r.try_get("access_expires_at")?)))
                .collect()
        })
    }

    fn add_revocation<'a>(&'a self, jti: &'a str, expires_at: i64) -> AuthFuture<'a, ()> {
        Box::pin(async move {
            sqlx::query(
                "INSERT INTO oauth_revoked_tokens (jti, expires_at) VALUES ($1, $2) \
                 ON CONFLICT (jti) DO NOTHING",
            )
            .bind(jti.to_owned())
            .bind(expires_at)
            .execute(&self.pool)
            .await?;
            Ok(())
        })
    }

    fn revocations(&self, after: i64) -> AuthFuture<'_, Vec<(String, i64)>> {
        Box::pin(async move {
            let rows = sqlx::query(
                "SELECT jti, expires_at FROM oauth_revoked_tokens WHERE expires_at >= $1",
            )
            .bind(after)
            .fetch_all(&self.pool)
            .await?;
            rows.iter()
                .map(|r| Ok((r.try_get("jti")?, r.try_get("expires_at")?)))
                .collect()
        })
    }

    fn has_consent<'a>(
        &'a self,
        subject: &'a str,
        client_id: &'a str,
        scope: &'a str,
    ) -> AuthFuture<'a, bool> {
        Box::pin(async move {
            let row = sqlx::query(
                "SELECT 1 AS one FROM oauth_consents WHERE subject = $1 AND client_id = $2 AND scope = $3",
            )
            .bind(subject.to_owned())
            .bind(client_id.to_owned())
            .bind(scope.to_owned())
            .fetch_optional(&self.pool)
            .await?;
            Ok(row.is_some())
        })
    }

    fn add_consent<'a>(
        &'a self,
        subject: &'a str,
        client_id: &'a str,
        scope: &'a str,
    ) -> AuthFuture<'a, ()> {
        Box::pin(async move {
            sqlx::query(
                "INSERT INTO oauth_consents (subject, client_id, scope, created_at) VALUES ($1, $2, $3, $4) \
                 ON CONFLICT (subject, client_id, scope) DO NOTHING",
            )
            .bind(subject.to_owned())
            .bind(client_id.to_owned())
            .bind(scope.to_owned())
            .bind(now_secs())
            .execute(&self.pool)
            .await?;
            Ok(())
        })
    }

    fn purge(&self, now: i64) -> AuthFuture<'_, ()> {
        Box::pin(async move {
            for q in [
                "DELETE FROM oauth_pending WHERE expires_at < $1",
                "DELETE FROM oauth_codes WHERE expires_at < $1 AND (kept_until IS NULL OR kept_until < $1)",
                "DELETE FROM oauth_refresh_tokens WHERE expires_at < $1",
            ] {
                sqlx::query(q).bind(now).execute(&self.pool).await?;
            }
            sqlx::query("DELETE FROM oauth_revoked_tokens WHERE expires_at < $1")
                .bind(now - LEEWAY.as_secs() as i64)
                .execute(&self.pool)
                .await?;
            Ok(())
        })
    }
}
