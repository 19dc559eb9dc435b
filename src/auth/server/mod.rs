//! The built-in authorization server (RFC 8414 metadata, OAuth 2.1 authorization code with
//! PKCE, refresh token rotation, client credentials, RFC 7591 registration, client ID metadata
//! documents, RFC 7009 revocation) and the resource metadata of RFC 9728, as axum routes on the
//! public listener.
//!
//! A browser comes to `/authorize`: the request is checked (client, exact redirect URI, PKCE
//! S256, resource, scope), kept in the database with a CSRF token, and the sign-in page shown;
//! after sign-in the consent page (unless this user already allowed this client these scopes);
//! then a redirect to the client with a single-use code bound to the PKCE challenge, the
//! redirect URI and the resource. Errors go to the client's redirect URI only once that URI is
//! verified; before that they are shown as a page.
//!
//! This file holds the server's state ([`AuthServer`]), how a client is looked up, and the
//! routes; each endpoint lives in a file named for its job:
//!
//! - [`metadata`]: RFC 8414 and RFC 9728 metadata, the JWKS, the pages' stylesheet.
//! - [`register`]: dynamic client registration (RFC 7591) and its rate limit.
//! - [`authorize`]: the authorization endpoint, up to the sign-in page.
//! - [`pending`]: the authorization request kept while the person decides, and its CSRF check.
//! - [`signin`]: the sign-in form, passwords, and the failed sign-in lockout.
//! - [`upstream`]: sign-in at an upstream OpenID provider instead (`[auth.upstream]`).
//! - [`consent`]: the consent form and the code it issues.
//! - [`client_auth`]: how a client authenticates at `/token` and `/revoke`.
//! - [`token`]: the token endpoint and its three grants.
//! - [`revoke`]: token revocation (RFC 7009), and revoking a whole grant.
//! - [`error`]: [`OAuthError`] and [`PageError`], the refusals and how each is answered.
//!
//! Nothing here touches the database directly: the state is behind [`AuthStore`], the
//! signing keys behind [`KeyRing`].

mod authorize;
mod client_auth;
mod consent;
mod error;
mod metadata;
mod pending;
mod register;
mod revoke;
mod signin;
mod token;
mod upstream;

use std::collections::{BTreeSet, HashMap};
use std::net::IpAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use axum::extract::State;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use serde_json::Value;

use super::cimd::{self, Fetcher};
use super::keys::{KeyRing, REVOCATION_REFRESH_UNHEARD};
use super::shared::SharedThrottle;
use super::store::{AuthStore, Client};
use super::throttle::{Throttle, address_key};
use super::upstream::Upstream;
use super::{Auth, now_secs};
use crate::config::AuthConfig;

pub use error::{OAuthError, PageError};
pub use signin::{Refused as SignInRefused, hash_password};

use signin::SignInThrottle;

/// The scopes a token may carry: the `/mcp` scopes and every plugin's, asked for when needed.
pub type ScopeSource = Box<dyn Fn() -> Vec<String> + Send + Sync>;

pub struct AuthServer {
    config: AuthConfig,
    issuer: String,
    store: Arc<dyn AuthStore>,
    pub keys: Arc<KeyRing>,
    plugin_scopes: Mutex<Option<ScopeSource>>,
    fetcher: Fetcher,
    /// The clients of `[[auth.clients]]`, by id.
    provisioned: HashMap<String, Client>,
    /// Registrations per client address, and for all together, counted here.
    registrations: Throttle<IpAddr>,
    registrations_total: Throttle<()>,
    /// Cluster mode: the registrations counted across replicas (the tables above count only
    /// while it fails).
    shared_registrations: Option<Arc<dyn SharedThrottle>>,
    signins: SignInThrottle,
    secure_cookies: bool,
    /// Sign-in at an upstream OpenID provider, when configured.
    upstream: Option<Arc<Upstream>>,
    /// Who keeps the provider's access tokens of people who signed in there (only when a
    /// `token_exchange` credential needs them).
    provider_tokens: std::sync::OnceLock<Arc<dyn crate::auth::upstream::ProviderTokens>>,
}

/// How many client addresses (and unknown user names) each limit keeps at most.
const ADDRESS_TABLE: usize = 65_536;

/// The client's address, as the HTTP edge found it (the peer, or behind a trusted proxy the
/// address it names), put in a request's extensions for the per-address limits here.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ClientIp(pub IpAddr);

/// The client's address for the per-address limits, counted by [`address_key`]: the
/// [`ClientIp`] the edge found; none when the request did not come through the edge.
pub struct ClientAddr(pub Option<IpAddr>);

impl<S: Send + Sync> axum::extract::FromRequestParts<S> for ClientAddr {
    type Rejection = std::convert::Infallible;

    async fn from_request_parts(
        parts: &mut axum::http::request::Parts,
        _: &S,
    ) -> Result<Self, Self::Rejection> {
        let found = parts.extensions.get::<ClientIp>().map(|c| c.0);
        Ok(ClientAddr(found.map(address_key)))
    }
}

/// Why a client could not be looked up.
enum Lookup {
    /// Too many metadata documents fetched: try again after the wait.
    Limited(Duration),
    /// What to tell the caller.
    Failed(String),
}

impl AuthServer {
    pub fn new(
        config: AuthConfig,
        issuer: String,
        store: Arc<dyn AuthStore>,
        keys: Arc<KeyRing>,
        shared_registrations: Option<Arc<dyn SharedThrottle>>,
    ) -> AuthServer {
        let provisioned = config
            .clients
            .iter()
            .map(|c| {
                let client = Client {
                    client_id: c.client_id.clone(),
                    secret_hash: Some(c.secret_hash.clone()),
                    name: c.name.clone(),
                    redirect_uris: Vec::new(),
                    auth_method: "client_secret_basic".into(),
                    grant_types: vec!["client_credentials".into()],
                    application_type: "web".into(),
                    scope: Some(c.scopes.as_ref().unwrap_or(&config.scopes).join(" ")),
                    provisioned: true,
                };
                (c.client_id.clone(), client)
            })
            .collect();
        let signins = SignInThrottle::new(&config);
        let registrations = Throttle::new(
            config.registrations_per_minute,
            register::WINDOW,
            ADDRESS_TABLE,
        );
        let registrations_total = Throttle::new(
            register::total_limit(config.registrations_per_minute),
            register::WINDOW,
            1,
        );
        AuthServer {
            upstream: config
                .upstream
                .clone()
                .map(|u| Arc::new(Upstream::new(u, &issuer))),
            provisioned,
            fetcher: Fetcher::new(
                config.cimd_allow_private,
                config.cimd_fetches_per_minute,
                config.cimd_fetches_per_minute_total,
            ),
            secure_cookies: issuer.starts_with("https://"),
            provider_tokens: std::sync::OnceLock::new(),
            config,
            issuer,
            store,
            keys,
            plugin_scopes: Mutex::new(None),
            registrations,
            registrations_total,
            shared_registrations,
            signins,
        }
    }

    /// Where plugin scopes come from from now on (the registry, which changes at run time).
    pub fn set_scope_source(&self, source: ScopeSource) {
        *self.plugin_scopes.lock().expect("scopes lock") = Some(source);
    }

    /// Until `stop`: re-reads the revoked access tokens and the signing keys (other replicas'
    /// revocations and rotations) as often as [`KeyRing::revocation_refresh`] says, and forgets expired sign-ins, codes,
    /// refresh tokens and revocations every few minutes.
    pub async fn maintain(self: Arc<Self>, stop: tokio_util::sync::CancellationToken) {
        if let Some(up) = &self.upstream {
            // Found once at start, so a wrong issuer shows in the log before anyone signs in.
            match up.provider().await {
                Ok((d, _)) => {
                    tracing::info!(issuer = %d.issuer, "upstream identity provider discovered")
                }
                Err(e) => {
                    tracing::warn!("upstream identity provider: {e}; sign-ins will try again")
                }
            }
        }
        let mut purge = tokio::time::interval(Duration::from_secs(300));
        // Wakes often enough for the shorter period; re-reads only when one is due.
        let mut tick = tokio::time::interval(REVOCATION_REFRESH_UNHEARD);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut read_at: Option<tokio::time::Instant> = None;
        loop {
            tokio::select! {
                _ = purge.tick() => {
                    if let Err(e) = self.store.purge(now_secs()).await {
                        tracing::warn!("purging expired authorization data: {e}");
                    }
                }
                now = tick.tick() => {
                    if read_at.is_some_and(|t| now - t < self.keys.revocation_refresh()) {
                        continue;
                    }
                    read_at = Some(now);
                    if let Err(e) = self.keys.refresh_revocations().await {
                        tracing::warn!("re-reading revoked access tokens: {e}");
                    }
                    if let Err(e) = self.keys.reload_keys().await {
                        tracing::warn!("re-reading the signing keys: {e}");
                    }
                }
                () = stop.cancelled() => return,
            }
        }
    }

    /// The groups `subject`'s tokens carry: a configured user's from the config as it is now
    /// (so a change there holds from the next token on), anyone else's as they were at
    /// sign-in (`signed_in`).
    fn groups_for(&self, subject: &str, signed_in: &[String]) -> Vec<String> {
        match self.config.users.iter().find(|u| u.name == subject) {
            Some(u) => u.groups.clone(),
            None => signed_in.to_vec(),
        }
    }

    /// Hands the provider's access token of each person who signs in there from now on to
    /// `keeper` (for `token_exchange` credentials); otherwise it goes no further than the
    /// sign-in.
    pub fn keep_provider_tokens(&self, keeper: Arc<dyn crate::auth::upstream::ProviderTokens>) {
        let _ = self.provider_tokens.set(keeper);
    }

    /// The upstream provider's name, for the sign-in page's button.
    fn upstream_name(&self) -> Option<&str> {
        self.upstream.as_deref().map(Upstream::display_name)
    }

    pub fn scopes_supported(&self) -> Vec<String> {
        let mut all: BTreeSet<String> = self.config.scopes.iter().cloned().collect();
        if let Some(f) = &*self.plugin_scopes.lock().expect("scopes lock") {
            all.extend(f());
        }
        all.into_iter().collect()
    }

    /// The scopes `client` may be given: those offered here, narrowed to the client's own
    /// `scope` when it has one.
    fn allowed_scopes(&self, client: &Client) -> BTreeSet<String> {
        let supported = self.scopes_supported().into_iter();
        match &client.scope {
            None => supported.collect(),
            Some(own) => {
                let own: BTreeSet<&str> = own.split_whitespace().collect();
                supported.filter(|s| own.contains(s.as_str())).collect()
            }
        }
    }

    /// A client: provisioned in the config, a metadata document (fetched on behalf of the
    /// client at `addr`), or registered (in that order; a registered client's id is random, a
    /// provisioned one's has no `:`).
    async fn client(
        &self,
        client_id: &str,
        addr: Option<IpAddr>,
    ) -> Result<Option<Client>, Lookup> {
        if let Some(c) = self.provisioned.get(client_id) {
            return Ok(Some(c.clone()));
        }
        if cimd::is_document_url(client_id) {
            return match self.fetcher.client(client_id, addr).await {
                Ok(c) => Ok(Some(c)),
                Err(cimd::CimdError::Limited(wait)) => Err(Lookup::Limited(wait)),
                Err(e) => Err(Lookup::Failed(e.to_string())),
            };
        }
        self.store.client(client_id).await.map_err(|e| {
            tracing::error!("authorization store: {e}");
            Lookup::Failed("the authorization server's database failed".into())
        })
    }
}

/// The routes: resource metadata, authorization server metadata and endpoints.
pub fn router<S>(auth: Arc<Auth>) -> Router<S> {
    let mut r = Router::new()
        .route(
            "/.well-known/oauth-protected-resource",
            get(metadata::resource_metadata),
        )
        .route(
            "/.well-known/oauth-protected-resource/{*path}",
            get(metadata::resource_metadata_at),
        );
    if auth.server.is_some() {
        r = r
            .route(
                "/.well-known/oauth-authorization-server",
                get(metadata::as_metadata),
            )
            .route(
                "/.well-known/openid-configuration",
                get(metadata::as_metadata),
            )
            .route("/jwks.json", get(metadata::jwks))
            .route("/register", post(register::register))
            .route("/authorize", get(authorize::authorize))
            .route("/authorize/login", post(signin::login))
            .route("/authorize/consent", post(consent::consent))
            .route("/authorize/upstream", post(upstream::button))
            .route(
                crate::auth::upstream::CALLBACK_PATH,
                get(upstream::callback),
            )
            .route("/token", post(token::token))
            .route("/revoke", post(revoke::revoke))
            .route("/oauth/style.css", get(metadata::style));
    }
    r.with_state(auth)
}

type St = State<Arc<Auth>>;

fn server(auth: &Auth) -> &AuthServer {
    auth.server
        .as_deref()
        .expect("routes exist only with a server")
}

/// Marks an answer as never to be cached (tokens, codes, and the errors about them).
fn no_store(mut r: Response) -> Response {
    let h = r.headers_mut();
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    h.insert(header::PRAGMA, HeaderValue::from_static("no-cache"));
    r
}

fn json_response(status: StatusCode, v: Value) -> Response {
    no_store((status, axum::Json(v)).into_response())
}
