//! The authorization server's state, behind [`AuthStore`]: signing keys, registered clients,
//! authorization requests waiting for the user, codes, refresh tokens, revoked access tokens
//! and remembered consent. The trait is what the auth code asks of a store; the SQL
//! implementation (`SqlAuthStore`, in the gateway's database, so replicas share it) lives in
//! the `database` module, which lends it to [`super::Auth::new`]. Codes, refresh tokens and
//! client secrets are handed to the store only as hashes. This module never opens a database
//! or speaks SQL.

use std::future::Future;
use std::pin::Pin;

#[derive(Debug, Clone, thiserror::Error)]
pub enum AuthStoreError {
    #[error("database error: {0}")]
    Database(String),
    #[error("stored authorization data is unreadable: {0}")]
    Corrupt(String),
}

/// What every [`AuthStore`] call returns: a boxed future, so the trait stays object-safe.
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
    /// The signed-in user's groups.
    pub groups: Vec<String>,
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
    /// The groups the user was in at sign-in.
    pub groups: Vec<String>,
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
    /// The groups the user was in at sign-in, carried through the family.
    pub groups: Vec<String>,
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
    /// Removes a pending request and returns it, to the one caller that removed it (of two
    /// at once, the other finds nothing).
    fn take_pending<'a>(&'a self, id: &'a str) -> AuthFuture<'a, Option<Pending>>;

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
