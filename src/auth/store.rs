//! The authorization server's state, behind [`AuthStore`]: signing keys, registered clients,
//! authorization requests waiting for the user, codes, refresh tokens, revoked access tokens
//! and remembered consent.
//! [`SqlAuthStore`] keeps them through sqlx in the gateway's database (SQLite or PostgreSQL,
//! `migrations/`), so replicas share them. Codes, refresh tokens and client secrets are kept
//! only as hashes.

use std::future::Future;
use std::pin::Pin;

use sqlx::{AnyPool, Row};

#[derive(Debug, Clone, thiserror::Error)]
pub enum AuthStoreError {
    #[error("database error: {0}")]
    Database(String),
    #[error("stored authorization data is unreadable: {0}")]
    Corrupt(String),
}

impl From<sqlx::Error> for AuthStoreError {
    fn from(e: sqlx::Error) -> Self {
        AuthStoreError::Database(e.to_string())
    }
}

pub type AuthFuture<'a, T> = Pin<Box<dyn Future<Output = Result<T, AuthStoreError>> + Send + 'a>>;

#[derive(Debug, Clone)]
pub struct StoredKey {
    pub kid: String,
    /// PKCS#8 DER, base64url.
    pub private_der: String,
    pub created_at: i64,
    pub retired_at: Option<i64>,
}

/// A registered client.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Client {
    pub client_id: String,
    /// SHA-256 of the secret; `None` for a public client.
    pub secret_hash: Option<String>,
    pub name: Option<String>,
    pub redirect_uris: Vec<String>,
    /// `none`, `client_secret_basic` or `client_secret_post`.
    pub auth_method: String,
    pub grant_types: Vec<String>,
    pub application_type: String,
    /// The scopes it may be given (RFC 7591 `scope`); `None`: any offered here.
    pub scope: Option<String>,
    /// Provisioned by the operator (`[[auth.clients]]`, never stored): the only clients that
    /// may use `client_credentials`. Its secret hash is argon2.
    pub provisioned: bool,
}

/// An authorization request waiting for the user to sign in and decide.
#[derive(Debug, Clone)]
pub struct Pending {
    pub id: String,
    pub csrf_hash: String,
    /// The validated request, as JSON.
    pub request: String,
    /// The user who signed in (after the login step).
    pub subject: Option<String>,
    pub expires_at: i64,
}

/// An issued authorization code.
#[derive(Debug, Clone)]
pub struct Code {
    pub code_hash: String,
    pub client_id: String,
    pub subject: String,
    pub redirect_uri: String,
    pub resource: String,
    pub scope: String,
    pub challenge: String,
    pub expires_at: i64,
    /// What its redemption produced (set when it is taken): revoked if it comes back.
    pub issued: Option<Issued>,
}

/// The tokens a code's redemption gives: recorded with the code before they are issued.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Issued {
    /// The refresh token family (whether or not a refresh token is issued).
    pub family: String,
    pub access_jti: String,
    pub access_expires_at: i64,
    /// How long the redeemed code is kept to recognize a replay.
    pub kept_until: i64,
}

/// An issued refresh token. Each use gives a new one in the same family.
#[derive(Debug, Clone)]
pub struct Refresh {
    pub token_hash: String,
    pub family: String,
    pub client_id: String,
    pub subject: String,
    pub resource: String,
    pub scope: String,
    pub expires_at: i64,
    /// The access token issued with it (`jti`, expiry), revoked with its family.
    pub access: Option<(String, i64)>,
}

/// What taking a single-use secret found.
#[derive(Debug, Clone)]
pub enum Taken<T> {
    /// Unused until now; it is used from now on.
    Fresh(T),
    /// Used before: a replay.
    Reused(T),
    Unknown,
}

pub trait AuthStore: Send + Sync + 'static {
    fn keys(&self) -> AuthFuture<'_, Vec<StoredKey>>;
    fn add_key<'a>(&'a self, key: &'a StoredKey) -> AuthFuture<'a, ()>;
    fn retire_key<'a>(&'a self, kid: &'a str, at: i64) -> AuthFuture<'a, ()>;
    fn delete_key<'a>(&'a self, kid: &'a str) -> AuthFuture<'a, ()>;

    fn add_client<'a>(&'a self, client: &'a Client) -> AuthFuture<'a, ()>;
    fn client<'a>(&'a self, client_id: &'a str) -> AuthFuture<'a, Option<Client>>;

    fn put_pending<'a>(&'a self, p: &'a Pending) -> AuthFuture<'a, ()>;
    fn pending<'a>(&'a self, id: &'a str) -> AuthFuture<'a, Option<Pending>>;
    fn delete_pending<'a>(&'a self, id: &'a str) -> AuthFuture<'a, ()>;

    fn add_code<'a>(&'a self, code: &'a Code) -> AuthFuture<'a, ()>;
    /// Marks a code used, recording what its redemption will issue; what it was (with what a
    /// first redemption issued), and whether it had been used already.
    fn take_code<'a>(
        &'a self,
        code_hash: &'a str,
        issue: &'a Issued,
    ) -> AuthFuture<'a, Taken<Code>>;
    /// Whether a code was presented again after it was taken. A first redemption asks once
    /// its refresh token is stored: a replay that revoked the family before that token
    /// existed did not revoke it.
    fn code_replayed<'a>(&'a self, code_hash: &'a str) -> AuthFuture<'a, bool>;

    fn add_refresh<'a>(&'a self, r: &'a Refresh) -> AuthFuture<'a, ()>;
    /// Marks a refresh token used (rotation); a revoked family's tokens are `Unknown`.
    fn take_refresh<'a>(&'a self, token_hash: &'a str) -> AuthFuture<'a, Taken<Refresh>>;
    fn refresh<'a>(&'a self, token_hash: &'a str) -> AuthFuture<'a, Option<Refresh>>;
    /// Revokes a refresh token family; the access tokens issued with its refresh tokens that
    /// may still be valid at `now` (`jti`, expiry), to be revoked too.
    fn revoke_family<'a>(&'a self, family: &'a str, now: i64)
    -> AuthFuture<'a, Vec<(String, i64)>>;

    /// Records an access token (by `jti`) as revoked until `expires_at`.
    fn add_revocation<'a>(&'a self, jti: &'a str, expires_at: i64) -> AuthFuture<'a, ()>;
    /// The revoked access tokens that expire at or after `after`: `(jti, expires_at)`.
    fn revocations(&self, after: i64) -> AuthFuture<'_, Vec<(String, i64)>>;

    fn has_consent<'a>(
        &'a self,
        subject: &'a str,
        client_id: &'a str,
        scope: &'a str,
    ) -> AuthFuture<'a, bool>;
    fn add_consent<'a>(
        &'a self,
        subject: &'a str,
        client_id: &'a str,
        scope: &'a str,
    ) -> AuthFuture<'a, ()>;

    /// Forgets expired requests, codes and refresh tokens, and revocations of access tokens
    /// that expired before `now` minus the leeway (until then they would still validate).
    fn purge(&self, now: i64) -> AuthFuture<'_, ()>;
}

/// The SQL store, on the gateway's database pool.
pub struct SqlAuthStore {
    pool: AnyPool,
}

impl SqlAuthStore {
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
            .bind(super::now_secs())
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
                "INSERT INTO oauth_pending (id, csrf_hash, request, subject, expires_at) \
                 VALUES ($1, $2, $3, $4, $5) \
                 ON CONFLICT (id) DO UPDATE SET subject = excluded.subject",
            )
            .bind(p.id.clone())
            .bind(p.csrf_hash.clone())
            .bind(p.request.clone())
            .bind(p.subject.clone())
            .bind(p.expires_at)
            .execute(&self.pool)
            .await?;
            Ok(())
        })
    }

    fn pending<'a>(&'a self, id: &'a str) -> AuthFuture<'a, Option<Pending>> {
        Box::pin(async move {
            let row = sqlx::query(
                "SELECT id, csrf_hash, request, subject, expires_at FROM oauth_pending WHERE id = $1",
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
                })
            })
            .transpose()
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
                 scope, challenge, expires_at, used) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, 0)",
            )
            .bind(c.code_hash.clone())
            .bind(c.client_id.clone())
            .bind(c.subject.clone())
            .bind(c.redirect_uri.clone())
            .bind(c.resource.clone())
            .bind(c.scope.clone())
            .bind(c.challenge.clone())
            .bind(c.expires_at)
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
                 expires_at, family, access_jti, access_expires_at, kept_until \
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
                 scope, expires_at, used, revoked, access_jti, access_expires_at) \
                 VALUES ($1, $2, $3, $4, $5, $6, $7, 0, 0, $8, $9)",
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
                 access_jti, access_expires_at FROM oauth_refresh_tokens WHERE token_hash = $1",
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
                 access_jti, access_expires_at FROM oauth_refresh_tokens WHERE token_hash = $1",
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
            .bind(now - super::LEEWAY.as_secs() as i64)
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
            .bind(super::now_secs())
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
                .bind(now - super::LEEWAY.as_secs() as i64)
                .execute(&self.pool)
                .await?;
            Ok(())
        })
    }
}
