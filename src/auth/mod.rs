//! OAuth 2.1 for `/mcp`: the gateway as resource server (every request carries a bearer
//! token issued for this resource) and, in `builtin` mode, as the authorization server that
//! issues those tokens; in `external` mode another server issues them.
//!
//! The resource side ([`resource`]) reads the `Authorization` header, hands the token to a
//! validator (the seam: a [`TokenValidator`] answers from memory, as the built-in issuer's
//! keys do; a [`RemoteTokenValidator`] may wait for the network, as mode `external`'s
//! ([`external`]) does for an authorization server the gateway does not run), checks the
//! scopes, and answers refusals with the `WWW-Authenticate` challenges of RFC 6750 and
//! RFC 9728 that send a client to the metadata and, on missing scope, to step-up
//! authorization. The authorization server ([`server`], mode `builtin`) serves RFC 8414
//! metadata, client registration (RFC 7591, and client ID metadata documents, [`cimd`]),
//! the login and consent pages ([`pages`]), `/token`, `/revoke` and `/jwks.json`; its
//! state is behind the [`store::AuthStore`] trait (the SQL
//! implementation is lent by the `database` module), its signing keys in [`keys`], and the
//! rules for redirect URIs in [`redirect`]. In a cluster, what the replicas share beyond the
//! database (revocations and new keys heard at once, the registration limit) comes through
//! the seams of [`shared`]. Which plugins and tools a principal may use (scopes, groups,
//! subjects) is decided in [`access`]; sign-in delegated to an upstream OpenID provider
//! (`[auth.upstream]`) is [`upstream`]'s.
//!
//! Auth sits low: it imports only `config` and `metrics`, never the gateway, the registry or
//! the database.

pub mod access;
pub mod cimd;
pub mod external;
pub mod keys;
pub mod pages;
pub mod redirect;
pub mod resource;
pub mod server;
pub mod shared;
pub mod store;
pub mod throttle;
pub mod upstream;

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use crate::config::{AuthConfig, AuthMode};

pub use resource::{AuthError, Challenge};

/// Who a valid token speaks for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Principal {
    /// The user (or, for `client_credentials`, the client).
    pub subject: String,
    pub client_id: String,
    pub scopes: BTreeSet<String>,
    /// The groups the token's issuer says the subject is in (empty when it says none): what
    /// plugins' `allow_groups` look at.
    pub groups: BTreeSet<String>,
    /// In mode `external`, the token itself: what a `token_exchange` credential exchanges
    /// for the caller at the authorization server. Held in memory only.
    pub token: Option<Bearer>,
}

/// A caller's bearer token, kept out of `Debug` and logs.
#[derive(Clone, PartialEq, Eq)]
pub struct Bearer(Arc<str>);

impl Bearer {
    pub fn new(token: &str) -> Bearer {
        Bearer(Arc::from(token))
    }

    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Debug for Bearer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Bearer(***)")
    }
}

impl Principal {
    pub fn has_all<'a>(&self, needed: impl IntoIterator<Item = &'a String>) -> bool {
        needed.into_iter().all(|s| self.scopes.contains(s))
    }
}

/// Why a token was not accepted.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TokenError {
    #[error("the token is malformed: {0}")]
    Malformed(String),
    #[error("the token's signing key is unknown")]
    UnknownKey,
    #[error("the token's signature is invalid")]
    BadSignature,
    #[error("the token has expired")]
    Expired,
    #[error("the token is not valid yet")]
    NotYetValid,
    #[error("the token was issued by another issuer")]
    WrongIssuer,
    #[error("the token was issued for another resource")]
    WrongAudience,
    #[error("the token was revoked")]
    Revoked,
    #[error("the token's algorithm {0} is not accepted")]
    BadAlgorithm(String),
    #[error("the authorization server says the token is not active")]
    Inactive,
    /// The authorization server could not be asked (its keys, or introspection): the token
    /// may be good, so this is no refusal of it.
    #[error("{0}")]
    Unavailable(String),
}

/// Checks an access token from what it holds in memory and says whom it speaks for. The
/// built-in issuer's implementation is [`keys::KeyRing`].
pub trait TokenValidator: Send + Sync + 'static {
    fn validate(&self, token: &str) -> Result<Principal, TokenError>;
}

/// Checks an access token, asking the network when it must (an issuer's keys, introspection).
/// Mode `external`'s implementation is [`external::External`].
pub trait RemoteTokenValidator: Send + Sync + 'static {
    fn validate<'a>(
        &'a self,
        token: &'a str,
    ) -> futures_util::future::BoxFuture<'a, Result<Principal, TokenError>>;
}

/// The validator of the mode: the built-in one answers without a future to poll.
enum Validator {
    Local(Arc<dyn TokenValidator>),
    Remote(Arc<dyn RemoteTokenValidator>),
}

/// Leeway for `exp` and `nbf`, for clocks a little apart.
pub const LEEWAY: Duration = Duration::from_secs(30);

/// The gateway's authorization: settings, the derived URLs, and the validator.
pub struct Auth {
    pub config: AuthConfig,
    /// The canonical URL of `/mcp`: the resource, and the audience of its tokens.
    pub resource: String,
    /// The authorization server's issuer: the public URL's origin, or in mode `external`,
    /// `auth.issuer`.
    pub issuer: String,
    /// Protected resource metadata, path-inserted (RFC 9728 §3.1).
    pub metadata_url: String,
    validator: Option<Validator>,
    /// The built-in authorization server (mode `builtin`).
    pub server: Option<Arc<server::AuthServer>>,
}

impl Auth {
    /// No authorization (mode `none`).
    pub fn off(config: AuthConfig) -> Auth {
        Auth {
            config,
            resource: String::new(),
            issuer: String::new(),
            metadata_url: String::new(),
            validator: None,
            server: None,
        }
    }

    /// Builds the authorization for `config`: for `builtin`, the server with its keys, its
    /// state in `store` (unused when authorization is off or external); for `external`, the
    /// validator of the external issuer's tokens. A replica of its own.
    pub async fn new(
        config: AuthConfig,
        store: Arc<dyn store::AuthStore>,
    ) -> Result<Auth, store::AuthStoreError> {
        Auth::with_shared(config, store, shared::Shared::default()).await
    }

    /// [`Auth::new`] for a replica of a cluster, sharing with the others what `shared` holds.
    pub async fn with_shared(
        config: AuthConfig,
        store: Arc<dyn store::AuthStore>,
        shared: shared::Shared,
    ) -> Result<Auth, store::AuthStoreError> {
        if config.mode == AuthMode::None {
            return Ok(Auth::off(config));
        }
        let public = config
            .public_url
            .clone()
            .expect("validated: builtin and external modes have a public URL");
        let resource = canonical_resource(&public);
        let issuer = public.origin().ascii_serialization();
        let metadata_url = format!(
            "{issuer}/.well-known/oauth-protected-resource{}",
            public.path().trim_end_matches('/')
        );
        if let Some(ext) = config.external.clone() {
            // No authorization server here: its routes are not served.
            let validator = external::External::start(&ext, &resource).await;
            return Ok(Auth {
                config,
                resource,
                issuer: ext.issuer,
                metadata_url,
                validator: Some(Validator::Remote(Arc::new(validator))),
                server: None,
            });
        }
        let keys = Arc::new(
            keys::KeyRing::load(
                store.clone(),
                issuer.clone(),
                resource.clone(),
                config.access_ttl,
                shared.feed,
            )
            .await?,
        );
        let server = Arc::new(server::AuthServer::new(
            config.clone(),
            issuer.clone(),
            store,
            keys.clone(),
            shared.throttle,
        ));
        Ok(Auth {
            config,
            resource,
            issuer,
            metadata_url,
            validator: Some(Validator::Local(keys)),
            server: Some(server),
        })
    }

    pub fn enabled(&self) -> bool {
        self.validator.is_some()
    }

    /// Validates a token: signature, issuer, times, audience, revocation.
    pub async fn validate(&self, token: &str) -> Result<Principal, TokenError> {
        match &self.validator {
            Some(Validator::Local(v)) => v.validate(token),
            Some(Validator::Remote(v)) => v.validate(token).await,
            None => Err(TokenError::UnknownKey),
        }
    }

    /// The scopes every request to `/mcp` needs.
    pub fn required_scopes(&self) -> &[String] {
        &self.config.scopes
    }
}

/// The resource's canonical form (RFC 8707, MCP authorization): lowercase scheme and host, no
/// fragment, no trailing slash.
pub fn canonical_resource(url: &url::Url) -> String {
    let mut u = url.clone();
    u.set_fragment(None);
    u.as_str().trim_end_matches('/').to_owned()
}

/// Whether a `resource` parameter names this resource (scheme and host compared without
/// case, a trailing slash tolerated).
pub fn same_resource(ours: &str, given: &str) -> bool {
    match url::Url::parse(given) {
        Ok(u) if u.fragment().is_none() => canonical_resource(&u) == ours,
        _ => false,
    }
}

/// Seconds since the Unix epoch.
pub fn now_secs() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs() as i64)
}

/// A fresh random token: 256 bits, base64url.
pub fn random_token() -> String {
    use base64::Engine;
    let bytes: [u8; 32] = rand::random();
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(bytes)
}

/// SHA-256, base64url: how codes, refresh tokens and client secrets are stored (they are
/// random and long, so a fast hash is enough; user passwords use argon2).
pub fn hash_secret(secret: &str) -> String {
    use base64::Engine;
    use sha2::Digest;
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(sha2::Sha256::digest(secret))
}

/// Compares two strings without an early exit on the first differing byte (tokens, secrets).
pub fn constant_time_eq(a: &str, b: &str) -> bool {
    let (a, b) = (a.as_bytes(), b.as_bytes());
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn resources_compare_in_canonical_form() {
        let ours = canonical_resource(&url::Url::parse("https://GW.example.com/mcp").unwrap());
        assert_eq!(ours, "https://gw.example.com/mcp");
        assert!(same_resource(&ours, "HTTPS://gw.EXAMPLE.com/mcp"));
        assert!(same_resource(&ours, "https://gw.example.com/mcp/"));
        assert!(!same_resource(&ours, "https://gw.example.com/mcp2"));
        assert!(!same_resource(&ours, "https://gw.example.com/mcp#x"));
        assert!(!same_resource(&ours, "not a url"));
    }

    #[test]
    fn secrets_hash_and_compare() {
        let t = random_token();
        assert_eq!(t.len(), 43);
        assert_eq!(hash_secret(&t), hash_secret(&t));
        assert_ne!(hash_secret(&t), hash_secret(&random_token()));
        assert!(constant_time_eq("abc", "abc"));
        assert!(!constant_time_eq("abc", "abd"));
        assert!(!constant_time_eq("abc", "ab"));
    }
}
