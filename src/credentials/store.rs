//! The [`CredentialStore`] seam: a row per person and credential, its value sealed
//! (`seal.rs`) before it gets here, beside what may be shown (when it was connected, when it
//! expires, its scopes). The database implements it (`database/credentials.rs`); every
//! replica reads the same rows, so a connection made on one serves calls on all.

use std::future::Future;
use std::pin::Pin;

/// A store's failure.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("database error: {0}")]
    Database(String),
}

pub type StoreFuture<'a, T> = Pin<Box<dyn Future<Output = Result<T, StoreError>> + Send + 'a>>;

/// The gateway's registration (RFC 7591) at an authorization server, as stored.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Registered {
    pub client_id: String,
    /// Its client secret, sealed, when the server gave one.
    pub sealed_secret: Option<String>,
    /// How it authenticates at the token endpoint, when the server said
    /// (`token_endpoint_auth_method`).
    pub auth_method: Option<String>,
}

/// One person's credential as stored.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Stored {
    pub subject: String,
    pub name: String,
    /// The value, sealed: no one without the storage key can read it.
    pub sealed: String,
    pub connected_at_ms: i64,
    pub expires_at_ms: Option<i64>,
    /// The scopes granted, space-separated, when the provider said.
    pub scopes: Option<String>,
}

/// A person asked to connect a credential: what the link they were given stands for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Request {
    /// Random, in the link (the URL elicitation's id): names nothing by itself.
    pub id: String,
    pub subject: String,
    pub name: String,
    pub created_at_ms: i64,
    pub expires_at_ms: i64,
    /// The scopes to ask for beyond the credential's own, space-separated (a server's
    /// step-up: what it asked for when it refused the person's token).
    pub scopes: Option<String>,
}

/// Where people's credentials are kept.
pub trait CredentialStore: Send + Sync {
    fn get<'a>(&'a self, subject: &'a str, name: &'a str) -> StoreFuture<'a, Option<Stored>>;
    /// Stores `row`, replacing the person's earlier value of that credential.
    fn put<'a>(&'a self, row: &'a Stored) -> StoreFuture<'a, ()>;
    /// Replaces the row's value, when it expires and its scopes only if its sealed value is
    /// still `was` (a value sealed again under a new key, or refreshed, must not undo a
    /// connection, a disconnection or another refresh made meanwhile), and ends any claim to
    /// refresh it; whether it did. Never inserts.
    fn swap<'a>(&'a self, row: &'a Stored, was: &'a str) -> StoreFuture<'a, bool>;
    /// Deletes `subject`'s credential `name` only if its sealed value is still `was`.
    fn delete_if<'a>(
        &'a self,
        subject: &'a str,
        name: &'a str,
        was: &'a str,
    ) -> StoreFuture<'a, bool>;
    /// Claims the refresh of `subject`'s credential `name`, as it is now (`sealed`), until
    /// `until_ms`, unless another claim holds at `now_ms` or the value changed since it was
    /// read; whether this one got it. Storing a value ends the claim.
    fn claim_refresh<'a>(
        &'a self,
        subject: &'a str,
        name: &'a str,
        sealed: &'a str,
        now_ms: i64,
        until_ms: i64,
    ) -> StoreFuture<'a, bool>;
    /// Ends a claim that stored nothing.
    fn release_refresh<'a>(&'a self, subject: &'a str, name: &'a str) -> StoreFuture<'a, ()>;
    /// Deletes `subject`'s credential `name`, or everyone's (`None`); how many rows.
    fn delete<'a>(&'a self, subject: Option<&'a str>, name: &'a str) -> StoreFuture<'a, u64>;
    /// A person's credentials, by name.
    fn of_subject<'a>(&'a self, subject: &'a str) -> StoreFuture<'a, Vec<Stored>>;
    /// Who has connected credential `name`, by subject.
    fn of_credential<'a>(&'a self, name: &'a str) -> StoreFuture<'a, Vec<Stored>>;
    /// The credentials defined through the admin API: name and definition (JSON), by name.
    fn definitions(&self) -> StoreFuture<'_, Vec<(String, String)>>;
    /// Keeps (or replaces) the definition of credential `name`.
    fn put_definition<'a>(
        &'a self,
        name: &'a str,
        spec: &'a str,
        now_ms: i64,
    ) -> StoreFuture<'a, ()>;
    /// Forgets the definition of credential `name`; whether there was one.
    fn delete_definition<'a>(&'a self, name: &'a str) -> StoreFuture<'a, bool>;
    /// Keeps `registered` as the gateway's client for credential `name` at `issuer`, unless
    /// one is kept already; the one kept (the first replica's to register).
    fn registration<'a>(
        &'a self,
        name: &'a str,
        issuer: &'a str,
        registered: Option<&'a Registered>,
        now_ms: i64,
    ) -> StoreFuture<'a, Option<Registered>>;
    /// Forgets the gateway's registration `client_id` for credential `name` at `issuer` (the
    /// server no longer knows it); another made meanwhile is kept.
    fn forget_registration<'a>(
        &'a self,
        name: &'a str,
        issuer: &'a str,
        client_id: &'a str,
    ) -> StoreFuture<'a, ()>;
    /// Keeps a request to connect (and forgets those expired long ago).
    fn open_request<'a>(&'a self, request: &'a Request) -> StoreFuture<'a, ()>;
    /// The request `id`, unused and unexpired at `now_ms`, which is used from now on: a
    /// second take of the same id finds nothing, on any replica.
    fn take_request<'a>(&'a self, id: &'a str, now_ms: i64) -> StoreFuture<'a, Option<Request>>;
    /// The request `id` if it is unused and unexpired at `now_ms`, leaving it so.
    fn peek_request<'a>(&'a self, id: &'a str, now_ms: i64) -> StoreFuture<'a, Option<Request>>;
}
