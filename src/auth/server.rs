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

use std::collections::{BTreeSet, HashMap};
use std::hash::BuildHasher;
use std::net::IpAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use axum::extract::{Form, Query, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use base64::Engine;
use base64::engine::general_purpose::{STANDARD, URL_SAFE_NO_PAD};
use serde::Deserialize;
use serde_json::{Value, json};

use super::cimd::{self, Fetcher};
use super::keys::{KeyRing, Planned, REVOCATION_REFRESH};
use super::pages::{self, ClientView};
use super::redirect::{is_loopback_host, valid_redirect_uri};
use super::store::{AuthStore, AuthStoreError, Client, Code, Issued, Pending, Refresh, Taken};
use super::throttle::{Throttle, address_key};
use super::{Auth, constant_time_eq, hash_secret, now_secs, random_token, same_resource};
use crate::config::AuthConfig;

/// How long a person has to sign in and decide.
const PENDING_TTL: Duration = Duration::from_secs(600);

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
    /// Registrations per client address, and for all together.
    registrations: Throttle<IpAddr>,
    registrations_total: Throttle<()>,
    signins: SignInThrottle,
    secure_cookies: bool,
}

/// Failed sign-ins, counted per user name and per client address.
struct SignInThrottle {
    /// The configured users (a bounded set).
    users: Throttle<String>,
    /// Every other name tried, by a keyed hash (names are the attacker's to choose, so they
    /// are neither kept nor allowed to grow the table): counted the same, so a lockout does
    /// not tell which users exist.
    others: Throttle<u64>,
    hasher: std::collections::hash_map::RandomState,
    addresses: Throttle<IpAddr>,
}

/// How many client addresses (and unknown user names) each limit keeps at most.
const ADDRESS_TABLE: usize = 65_536;

impl SignInThrottle {
    fn new(config: &AuthConfig) -> SignInThrottle {
        let (limit, window) = (config.failed_signins_per_user, config.signin_lockout);
        SignInThrottle {
            users: Throttle::new(limit, window, config.users.len()),
            others: Throttle::new(limit, window, ADDRESS_TABLE),
            hasher: std::collections::hash_map::RandomState::new(),
            addresses: Throttle::new(
                config.failed_signins_per_address,
                config.signin_lockout,
                ADDRESS_TABLE,
            ),
        }
    }

    fn known(config: &AuthConfig, name: &str) -> bool {
        config.users.iter().any(|u| u.name == name)
    }

    /// How long sign-ins for `name` or from `addr` must wait, if either is locked out.
    fn blocked(&self, config: &AuthConfig, name: &str, addr: Option<IpAddr>) -> Option<Duration> {
        let user = if Self::known(config, name) {
            self.users.blocked(&name.to_owned())
        } else {
            self.others.blocked(&self.hasher.hash_one(name))
        };
        let address = addr.and_then(|a| self.addresses.blocked(&a));
        user.max(address)
    }

    fn failed(&self, config: &AuthConfig, name: &str, addr: Option<IpAddr>) {
        if Self::known(config, name) {
            self.users.hit(name.to_owned());
        } else {
            self.others.hit(self.hasher.hash_one(name));
        }
        if let Some(a) = addr {
            self.addresses.hit(a);
        }
    }

    fn succeeded(&self, name: &str) {
        self.users.clear(&name.to_owned());
    }
}

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

impl Lookup {
    /// The refusal as a page (before the client's redirect URI is verified).
    fn page(&self) -> Response {
        match self {
            Lookup::Limited(wait) => {
                let mut r = pages::error(
                    StatusCode::TOO_MANY_REQUESTS,
                    &format!(
                        "too many client metadata documents were fetched; try again in {}",
                        wait_words(*wait)
                    ),
                );
                retry_after(&mut r, *wait);
                r
            }
            Lookup::Failed(why) => pages::error(StatusCode::BAD_REQUEST, why),
        }
    }
}

/// A name a stranger typed, cut for the log (a form field can be megabytes).
fn shown(name: &str) -> &str {
    match name.char_indices().nth(64) {
        Some((at, _)) => &name[..at],
        None => name,
    }
}

/// A wait as people say it, rounded up: "40 seconds", "3 minutes".
fn wait_words(wait: Duration) -> String {
    let secs = wait.as_secs() + u64::from(wait.subsec_nanos() > 0);
    match secs {
        0..=1 => "1 second".into(),
        2..=59 => format!("{secs} seconds"),
        60 => "1 minute".into(),
        _ => format!("{} minutes", secs.div_ceil(60)),
    }
}

/// `Retry-After` in whole seconds, rounded up.
fn retry_after(response: &mut Response, wait: Duration) {
    let secs = (wait.as_secs() + u64::from(wait.subsec_nanos() > 0)).max(1);
    response
        .headers_mut()
        .insert(header::RETRY_AFTER, HeaderValue::from(secs));
}

/// A validated authorization request, kept while the person decides.
#[derive(Debug, Clone, serde::Serialize, Deserialize)]
struct Request {
    client_id: String,
    redirect_uri: String,
    state: Option<String>,
    scopes: Vec<String>,
    challenge: String,
    resource: String,
}

impl AuthServer {
    pub fn new(
        config: AuthConfig,
        issuer: String,
        store: Arc<dyn AuthStore>,
        keys: Arc<KeyRing>,
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
        let minute = Duration::from_secs(60);
        let registrations = Throttle::new(config.registrations_per_minute, minute, ADDRESS_TABLE);
        let registrations_total = Throttle::new(
            config.registrations_per_minute.saturating_mul(20),
            minute,
            1,
        );
        AuthServer {
            provisioned,
            fetcher: Fetcher::new(
                config.cimd_allow_private,
                config.cimd_fetches_per_minute,
                config.cimd_fetches_per_minute_total,
            ),
            secure_cookies: issuer.starts_with("https://"),
            config,
            issuer,
            store,
            keys,
            plugin_scopes: Mutex::new(None),
            registrations,
            registrations_total,
            signins,
        }
    }

    /// Where plugin scopes come from from now on (the registry, which changes at run time).
    pub fn set_scope_source(&self, source: ScopeSource) {
        *self.plugin_scopes.lock().expect("scopes lock") = Some(source);
    }

    /// Until `stop`: re-reads the revoked access tokens every [`REVOCATION_REFRESH`] (other
    /// replicas' revocations), and forgets expired sign-ins, codes, refresh tokens and
    /// revocations every few minutes.
    pub async fn maintain(self: Arc<Self>, stop: tokio_util::sync::CancellationToken) {
        let mut purge = tokio::time::interval(Duration::from_secs(300));
        let mut revocations = tokio::time::interval(REVOCATION_REFRESH);
        revocations.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = purge.tick() => {
                    if let Err(e) = self.store.purge(now_secs()).await {
                        tracing::warn!("purging expired authorization data: {e}");
                    }
                }
                _ = revocations.tick() => {
                    if let Err(e) = self.keys.refresh_revocations().await {
                        tracing::warn!("re-reading revoked access tokens: {e}");
                    }
                }
                () = stop.cancelled() => return,
            }
        }
    }

    pub fn scopes_supported(&self) -> Vec<String> {
        let mut all: BTreeSet<String> = self.config.scopes.iter().cloned().collect();
        if let Some(f) = &*self.plugin_scopes.lock().expect("scopes lock") {
            all.extend(f());
        }
        all.into_iter().collect()
    }

    fn metadata(&self) -> Value {
        let i = &self.issuer;
        json!({
            "issuer": i,
            "authorization_endpoint": format!("{i}/authorize"),
            "token_endpoint": format!("{i}/token"),
            "registration_endpoint": format!("{i}/register"),
            "revocation_endpoint": format!("{i}/revoke"),
            "jwks_uri": format!("{i}/jwks.json"),
            "scopes_supported": self.scopes_supported(),
            "response_types_supported": ["code"],
            "response_modes_supported": ["query"],
            "grant_types_supported": ["authorization_code", "refresh_token", "client_credentials"],
            "token_endpoint_auth_methods_supported": ["none", "client_secret_basic", "client_secret_post"],
            "revocation_endpoint_auth_methods_supported": ["none", "client_secret_basic", "client_secret_post"],
            "code_challenge_methods_supported": ["S256"],
            "client_id_metadata_document_supported": true,
            "authorization_response_iss_parameter_supported": true,
            "subject_types_supported": ["public"],
            "id_token_signing_alg_values_supported": ["ES256"],
        })
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

    fn csrf_cookie(&self) -> &'static str {
        if self.secure_cookies {
            "__Host-mcpgw-csrf"
        } else {
            "mcpgw-csrf"
        }
    }

    fn set_csrf(&self, response: &mut Response, csrf: &str) {
        let secure = if self.secure_cookies { "; Secure" } else { "" };
        let cookie = format!(
            "{}={csrf}; Path=/; HttpOnly; SameSite=Lax; Max-Age={}{secure}",
            self.csrf_cookie(),
            PENDING_TTL.as_secs()
        );
        if let Ok(v) = HeaderValue::from_str(&cookie) {
            response.headers_mut().append(header::SET_COOKIE, v);
        }
    }

    fn cookie<'h>(&self, headers: &'h HeaderMap) -> Option<&'h str> {
        let name = self.csrf_cookie();
        headers
            .get_all(header::COOKIE)
            .iter()
            .filter_map(|v| v.to_str().ok())
            .flat_map(|v| v.split(';'))
            .filter_map(|kv| kv.trim().split_once('='))
            .find(|(k, _)| *k == name)
            .map(|(_, v)| v)
    }

    /// A registration slot in the current minute for the client at `addr` (and for all
    /// together); the wait if there is none.
    fn may_register(&self, addr: Option<IpAddr>) -> Result<(), Duration> {
        let key = addr.unwrap_or(IpAddr::V4(std::net::Ipv4Addr::UNSPECIFIED));
        if let Some(wait) = self.registrations.blocked(&key) {
            return Err(wait);
        }
        self.registrations_total.acquire(())?;
        self.registrations.hit(key);
        Ok(())
    }
}

/// The routes: resource metadata, authorization server metadata and endpoints.
pub fn router<S>(auth: Arc<Auth>) -> Router<S> {
    let mut r = Router::new()
        .route(
            "/.well-known/oauth-protected-resource",
            get(resource_metadata),
        )
        .route(
            "/.well-known/oauth-protected-resource/{*path}",
            get(resource_metadata_at),
        );
    if auth.server.is_some() {
        r = r
            .route("/.well-known/oauth-authorization-server", get(as_metadata))
            .route("/.well-known/openid-configuration", get(as_metadata))
            .route("/jwks.json", get(jwks))
            .route("/register", post(register))
            .route("/authorize", get(authorize))
            .route("/authorize/login", post(login))
            .route("/authorize/consent", post(consent))
            .route("/token", post(token))
            .route("/revoke", post(revoke))
            .route("/oauth/style.css", get(style));
    }
    r.with_state(auth)
}

type St = State<Arc<Auth>>;

fn server(auth: &Auth) -> &AuthServer {
    auth.server
        .as_deref()
        .expect("routes exist only with a server")
}

fn no_store(mut r: Response) -> Response {
    let h = r.headers_mut();
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    h.insert(header::PRAGMA, HeaderValue::from_static("no-cache"));
    r
}

fn json_response(status: StatusCode, v: Value) -> Response {
    no_store((status, axum::Json(v)).into_response())
}

/// Counts a refusal by the authorization server (an OAuth error code, or `bad_credentials`).
fn refused(reason: &'static str) {
    crate::metrics::get()
        .auth_refused
        .with_label_values(&[reason])
        .inc();
}

/// An OAuth error body (RFC 6749 §5.2).
fn oauth_error(
    status: StatusCode,
    error: &'static str,
    description: impl Into<String>,
) -> Response {
    let description = description.into();
    refused(error);
    tracing::debug!(status = status.as_u16(), error, "{description}");
    json_response(
        status,
        json!({"error": error, "error_description": description}),
    )
}

fn store_failed(e: AuthStoreError) -> Response {
    tracing::error!("authorization store: {e}");
    oauth_error(
        StatusCode::SERVICE_UNAVAILABLE,
        "temporarily_unavailable",
        "the authorization server's database failed",
    )
}

async fn resource_metadata(State(auth): St) -> Response {
    json_response(StatusCode::OK, auth.resource_metadata())
}

async fn resource_metadata_at(
    State(auth): St,
    axum::extract::Path(path): axum::extract::Path<String>,
) -> Response {
    let ours = url::Url::parse(&auth.resource)
        .map(|u| u.path().trim_matches('/').to_owned())
        .unwrap_or_default();
    if path.trim_matches('/') == ours {
        json_response(StatusCode::OK, auth.resource_metadata())
    } else {
        StatusCode::NOT_FOUND.into_response()
    }
}

async fn as_metadata(State(auth): St) -> Response {
    json_response(StatusCode::OK, server(&auth).metadata())
}

async fn jwks(State(auth): St) -> Response {
    json_response(StatusCode::OK, server(&auth).keys.jwks())
}

async fn style() -> Response {
    let mut r = pages::STYLE.into_response();
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/css; charset=utf-8"),
    );
    r
}

/// Dynamic client registration (RFC 7591).
async fn register(
    State(auth): St,
    ClientAddr(addr): ClientAddr,
    body: axum::body::Bytes,
) -> Response {
    let s = server(&auth);
    let bad = |msg: String| oauth_error(StatusCode::BAD_REQUEST, "invalid_client_metadata", msg);
    let Ok(meta) = serde_json::from_slice::<Value>(&body) else {
        return bad("the body must be a JSON object of client metadata".into());
    };
    let Some(meta) = meta.as_object() else {
        return bad("the body must be a JSON object of client metadata".into());
    };
    let strings = |key: &str| -> Result<Option<Vec<String>>, String> {
        match meta.get(key) {
            None | Some(Value::Null) => Ok(None),
            Some(Value::Array(a)) => a
                .iter()
                .map(|v| {
                    v.as_str()
                        .map(str::to_owned)
                        .ok_or(format!("{key} must be strings"))
                })
                .collect::<Result<Vec<_>, _>>()
                .map(Some),
            Some(_) => Err(format!("{key} must be an array of strings")),
        }
    };
    let text = |key: &str| meta.get(key).and_then(Value::as_str).map(str::to_owned);
    let redirect_uris = match strings("redirect_uris") {
        Ok(r) => r.unwrap_or_default(),
        Err(e) => return bad(e),
    };
    let auth_method =
        text("token_endpoint_auth_method").unwrap_or_else(|| "client_secret_basic".into());
    if !["none", "client_secret_basic", "client_secret_post"].contains(&auth_method.as_str()) {
        return bad(format!(
            "token_endpoint_auth_method `{auth_method}` is not supported (none, client_secret_basic, client_secret_post)"
        ));
    }
    let grant_types = match strings("grant_types") {
        Ok(g) => g.unwrap_or_else(|| vec!["authorization_code".into(), "refresh_token".into()]),
        Err(e) => return bad(e),
    };
    for g in &grant_types {
        if !["authorization_code", "refresh_token", "client_credentials"].contains(&g.as_str()) {
            return bad(format!("grant type `{g}` is not supported"));
        }
    }
    // A client that registers itself speaks for nobody: client_credentials would let anyone
    // mint a token without a person signing in. Only the operator provisions such clients.
    if grant_types.iter().any(|g| g == "client_credentials") {
        return bad(
            "the client_credentials grant is not available to registered clients; an operator provisions such clients in the gateway's config ([[auth.clients]])"
                .into(),
        );
    }
    if grant_types.iter().any(|g| g == "authorization_code") && redirect_uris.is_empty() {
        return oauth_error(
            StatusCode::BAD_REQUEST,
            "invalid_redirect_uri",
            "redirect_uris is required for the authorization_code grant",
        );
    }
    for r in &redirect_uris {
        if let Err(e) = valid_redirect_uri(r) {
            return oauth_error(StatusCode::BAD_REQUEST, "invalid_redirect_uri", e);
        }
    }
    if let Ok(Some(types)) = strings("response_types")
        && types.iter().any(|t| t != "code")
    {
        return bad("only the `code` response type is supported".into());
    }
    let application_type = text("application_type").unwrap_or_else(|| "web".into());
    if !["web", "native"].contains(&application_type.as_str()) {
        return bad(format!(
            "application_type `{application_type}` is not web or native"
        ));
    }
    let scope = text("scope");
    if let Some(sc) = &scope {
        let supported = s.scopes_supported();
        if let Some(bad_scope) = sc
            .split_whitespace()
            .find(|x| !supported.iter().any(|y| y == x))
        {
            return oauth_error(
                StatusCode::BAD_REQUEST,
                "invalid_client_metadata",
                format!("scope `{bad_scope}` is not offered here"),
            );
        }
    }
    if let Err(wait) = s.may_register(addr) {
        tracing::info!(address = ?addr, "registration refused: too many");
        let mut r = oauth_error(
            StatusCode::TOO_MANY_REQUESTS,
            "temporarily_unavailable",
            format!("too many registrations; try again in {}", wait_words(wait)),
        );
        retry_after(&mut r, wait);
        return r;
    }
    let secret = (auth_method != "none").then(random_token);
    let client = Client {
        client_id: random_token(),
        secret_hash: secret.as_deref().map(hash_secret),
        name: text("client_name"),
        redirect_uris,
        auth_method,
        grant_types,
        application_type,
        scope,
        provisioned: false,
    };
    if let Err(e) = s.store.add_client(&client).await {
        return store_failed(e);
    }
    tracing::info!(client_id = %client.client_id, name = ?client.name, "client registered");
    let mut out = json!({
        "client_id": client.client_id,
        "client_id_issued_at": now_secs(),
        "redirect_uris": client.redirect_uris,
        "token_endpoint_auth_method": client.auth_method,
        "grant_types": client.grant_types,
        "response_types": ["code"],
        "application_type": client.application_type,
    });
    if let Some(name) = &client.name {
        out["client_name"] = json!(name);
    }
    if let Some(sc) = &client.scope {
        out["scope"] = json!(sc);
    }
    if let Some(secret) = secret {
        out["client_secret"] = json!(secret);
        out["client_secret_expires_at"] = json!(0);
    }
    json_response(StatusCode::CREATED, out)
}

#[derive(Deserialize)]
struct AuthorizeQuery {
    response_type: Option<String>,
    client_id: Option<String>,
    redirect_uri: Option<String>,
    state: Option<String>,
    scope: Option<String>,
    code_challenge: Option<String>,
    code_challenge_method: Option<String>,
    resource: Option<String>,
}

/// Sends the browser back to the client with `params` (and `state` and `iss`).
fn back_to_client(
    redirect_uri: &str,
    state: Option<&str>,
    iss: &str,
    params: &[(&str, &str)],
) -> Response {
    let mut url = match url::Url::parse(redirect_uri) {
        Ok(u) => u,
        Err(_) => return pages::error(StatusCode::BAD_REQUEST, "the redirect URI is invalid"),
    };
    {
        let mut q = url.query_pairs_mut();
        for (k, v) in params {
            q.append_pair(k, v);
        }
        if let Some(s) = state {
            q.append_pair("state", s);
        }
        q.append_pair("iss", iss);
    }
    let mut r = StatusCode::SEE_OTHER.into_response();
    if let Ok(v) = HeaderValue::from_str(url.as_str()) {
        r.headers_mut().insert(header::LOCATION, v);
    }
    no_store(r)
}

fn client_view<'a>(client: &'a Client, redirect_uri: &str) -> ClientView<'a> {
    let url = url::Url::parse(redirect_uri).ok();
    ClientView {
        name: client.name.as_deref().unwrap_or(&client.client_id),
        client_id: &client.client_id,
        redirect_host: url
            .as_ref()
            .and_then(|u| u.host_str().map(str::to_owned))
            .unwrap_or_default(),
        loopback_redirect: url.as_ref().is_some_and(is_loopback_host),
    }
}

async fn authorize(
    State(auth): St,
    ClientAddr(addr): ClientAddr,
    Query(q): Query<AuthorizeQuery>,
) -> Response {
    let s = server(&auth);
    // Until the client and its redirect URI are verified, errors are shown here.
    let Some(client_id) = q.client_id.as_deref().filter(|c| !c.is_empty()) else {
        return pages::error(
            StatusCode::BAD_REQUEST,
            "the request names no client (client_id)",
        );
    };
    let client = match s.client(client_id, addr).await {
        Ok(Some(c)) => c,
        Ok(None) => {
            return pages::error(
                StatusCode::BAD_REQUEST,
                "this client is not registered here",
            );
        }
        Err(e) => return e.page(),
    };
    let redirect_uri = match q.redirect_uri.as_deref() {
        Some(r) if client.redirect_uris.iter().any(|x| x == r) => r.to_owned(),
        Some(_) => {
            return pages::error(
                StatusCode::BAD_REQUEST,
                "the redirect URI is not one registered for this client",
            );
        }
        None if client.redirect_uris.len() == 1 => client.redirect_uris[0].clone(),
        None => {
            return pages::error(
                StatusCode::BAD_REQUEST,
                "the request needs a redirect_uri (this client registered several)",
            );
        }
    };
    let state = q.state.as_deref();
    let fail = |error: &'static str, description: &str| {
        refused(error);
        back_to_client(
            &redirect_uri,
            state,
            &s.issuer,
            &[("error", error), ("error_description", description)],
        )
    };
    if q.response_type.as_deref() != Some("code") {
        return fail(
            "unsupported_response_type",
            "only response_type=code is supported",
        );
    }
    if !client.grant_types.iter().any(|g| g == "authorization_code") {
        return fail(
            "unauthorized_client",
            "this client may not use the authorization code grant",
        );
    }
    let challenge = match (
        q.code_challenge.as_deref(),
        q.code_challenge_method.as_deref(),
    ) {
        (Some(c), Some("S256")) if (43..=128).contains(&c.len()) => c.to_owned(),
        (Some(_), Some("S256")) => {
            return fail("invalid_request", "code_challenge has the wrong length");
        }
        (Some(_), _) => return fail("invalid_request", "PKCE needs code_challenge_method=S256"),
        (None, _) => {
            return fail(
                "invalid_request",
                "PKCE is required: send code_challenge with S256",
            );
        }
    };
    let resource = match q.resource.as_deref() {
        None => auth.resource.clone(),
        Some(r) if same_resource(&auth.resource, r) => auth.resource.clone(),
        Some(_) => return fail("invalid_target", "the resource is not this gateway's /mcp"),
    };
    let supported = s.scopes_supported();
    let allowed = s.allowed_scopes(&client);
    let scopes: Vec<String> = match q.scope.as_deref().map(str::split_whitespace) {
        None => s.config.scopes.clone(),
        Some(words) => {
            let mut v: BTreeSet<String> = BTreeSet::new();
            for w in words {
                if !supported.iter().any(|x| x == w) {
                    return fail("invalid_scope", &format!("scope `{w}` is not offered here"));
                }
                v.insert(w.to_owned());
            }
            if v.is_empty() {
                s.config.scopes.clone()
            } else {
                v.into_iter().collect()
            }
        }
    };
    if let Some(w) = scopes.iter().find(|w| !allowed.contains(*w)) {
        return fail(
            "invalid_scope",
            &format!("scope `{w}` is not one this client registered"),
        );
    }
    let request = Request {
        client_id: client.client_id.clone(),
        redirect_uri: redirect_uri.clone(),
        state: q.state.clone(),
        scopes,
        challenge,
        resource,
    };
    let csrf = random_token();
    let pending = Pending {
        id: random_token(),
        csrf_hash: hash_secret(&csrf),
        request: serde_json::to_string(&request).expect("serializable"),
        subject: None,
        expires_at: now_secs() + PENDING_TTL.as_secs() as i64,
    };
    if let Err(e) = s.store.put_pending(&pending).await {
        return store_failed(e);
    }
    let view = client_view(&client, &redirect_uri);
    let mut r = pages::login(&pending.id, &csrf, &view, None);
    s.set_csrf(&mut r, &csrf);
    r
}

#[derive(Deserialize)]
struct LoginForm {
    request: String,
    csrf: String,
    username: String,
    password: String,
}

#[derive(Deserialize)]
struct ConsentForm {
    request: String,
    csrf: String,
    decision: String,
}

/// The pending request a form names, its CSRF token checked against the cookie and the
/// stored hash.
async fn pending_for(
    s: &AuthServer,
    headers: &HeaderMap,
    addr: Option<IpAddr>,
    id: &str,
    csrf: &str,
) -> Result<(Pending, Request, Client), Response> {
    let expired = || {
        pages::error(
            StatusCode::BAD_REQUEST,
            "this sign-in expired or was already used",
        )
    };
    let p = match s.store.pending(id).await {
        Ok(Some(p)) if p.expires_at >= now_secs() => p,
        Ok(_) => return Err(expired()),
        Err(e) => return Err(store_failed(e)),
    };
    let cookie_ok = s.cookie(headers).is_some_and(|c| constant_time_eq(c, csrf));
    if !cookie_ok || !constant_time_eq(&hash_secret(csrf), &p.csrf_hash) {
        return Err(pages::error(
            StatusCode::FORBIDDEN,
            "the form's security token did not match (cross-site request refused)",
        ));
    }
    let request: Request = serde_json::from_str(&p.request).map_err(|_| expired())?;
    let client = match s.client(&request.client_id, addr).await {
        Ok(Some(c)) => c,
        Err(e @ Lookup::Limited(_)) => return Err(e.page()),
        _ => {
            return Err(pages::error(
                StatusCode::BAD_REQUEST,
                "the client is no longer known",
            ));
        }
    };
    Ok((p, request, client))
}

/// An argon2id PHC string for a password (`mcp-gateway hash-password`).
pub fn hash_password(password: &str) -> String {
    use argon2::PasswordHasher;
    use argon2::password_hash::SaltString;
    let bytes: [u8; 16] = rand::random();
    let salt = SaltString::encode_b64(&bytes).expect("16 bytes make a salt");
    argon2::Argon2::default()
        .hash_password(password.as_bytes(), &salt)
        .expect("argon2 hashes any password")
        .to_string()
}

/// Checks a password against the configured users (argon2, off the async threads). An unknown
/// user costs the same as a known one.
async fn check_password(config: &AuthConfig, username: &str, password: &str) -> bool {
    let user = config.users.iter().find(|u| u.name == username);
    let hash = user.map(|u| u.password_hash.clone());
    verify_argon2(hash, password).await && user.is_some()
}

/// Checks a secret against an argon2 PHC string, off the async threads; with no hash, does
/// the same work and fails.
async fn verify_argon2(hash: Option<String>, password: &str) -> bool {
    let password = password.to_owned();
    tokio::task::spawn_blocking(move || match hash {
        Some(hash) => {
            use argon2::PasswordVerifier;
            argon2::PasswordHash::new(&hash).is_ok_and(|h| {
                argon2::Argon2::default()
                    .verify_password(password.as_bytes(), &h)
                    .is_ok()
            })
        }
        None => {
            // The same work as a verification, so timing does not tell who exists.
            let _ = hash_password(&password);
            false
        }
    })
    .await
    .unwrap_or(false)
}

async fn login(
    State(auth): St,
    ClientAddr(addr): ClientAddr,
    headers: HeaderMap,
    Form(f): Form<LoginForm>,
) -> Response {
    let s = server(&auth);
    let (mut p, request, client) = match pending_for(s, &headers, addr, &f.request, &f.csrf).await {
        Ok(x) => x,
        Err(r) => return r,
    };
    let view = client_view(&client, &request.redirect_uri);
    // Checked before the password, which is not looked at during a lockout (right or wrong).
    if let Some(wait) = s.signins.blocked(&s.config, &f.username, addr) {
        refused("signin_locked");
        tracing::warn!(user = %shown(&f.username), address = ?addr, client_id = %client.client_id, "sign-in refused: too many failed sign-ins");
        let mut r = pages::login(
            &p.id,
            &f.csrf,
            &view,
            Some(&format!(
                "Too many failed sign-ins for this user or from this address. Try again in {}.",
                wait_words(wait)
            )),
        );
        *r.status_mut() = StatusCode::TOO_MANY_REQUESTS;
        retry_after(&mut r, wait);
        return r;
    }
    if !check_password(&s.config, &f.username, &f.password).await {
        s.signins.failed(&s.config, &f.username, addr);
        refused("bad_credentials");
        tracing::info!(user = %shown(&f.username), address = ?addr, client_id = %client.client_id, "sign-in refused");
        return pages::login(&p.id, &f.csrf, &view, Some("Wrong user name or password."));
    }
    s.signins.succeeded(&f.username);
    let scope = request.scopes.join(" ");
    match s
        .store
        .has_consent(&f.username, &client.client_id, &scope)
        .await
    {
        Ok(true) => {
            let _ = s.store.delete_pending(&p.id).await;
            return issue_code(s, &request, &f.username).await;
        }
        Ok(false) => {}
        Err(e) => return store_failed(e),
    }
    p.subject = Some(f.username.clone());
    if let Err(e) = s.store.put_pending(&p).await {
        return store_failed(e);
    }
    pages::consent(&p.id, &f.csrf, &view, &f.username, &request.scopes)
}

async fn consent(
    State(auth): St,
    ClientAddr(addr): ClientAddr,
    headers: HeaderMap,
    Form(f): Form<ConsentForm>,
) -> Response {
    let s = server(&auth);
    let (p, request, client) = match pending_for(s, &headers, addr, &f.request, &f.csrf).await {
        Ok(x) => x,
        Err(r) => return r,
    };
    let Some(subject) = p.subject.clone() else {
        return pages::error(StatusCode::BAD_REQUEST, "sign in first");
    };
    // Single use: a second submission finds nothing.
    if let Err(e) = s.store.delete_pending(&p.id).await {
        return store_failed(e);
    }
    if f.decision != "approve" {
        refused("access_denied");
        tracing::info!(user = %subject, client_id = %client.client_id, "access denied by the user");
        return back_to_client(
            &request.redirect_uri,
            request.state.as_deref(),
            &s.issuer,
            &[
                ("error", "access_denied"),
                ("error_description", "the user denied access"),
            ],
        );
    }
    let scope = request.scopes.join(" ");
    if let Err(e) = s
        .store
        .add_consent(&subject, &client.client_id, &scope)
        .await
    {
        return store_failed(e);
    }
    issue_code(s, &request, &subject).await
}

async fn issue_code(s: &AuthServer, request: &Request, subject: &str) -> Response {
    let code = random_token();
    let row = Code {
        code_hash: hash_secret(&code),
        client_id: request.client_id.clone(),
        subject: subject.to_owned(),
        redirect_uri: request.redirect_uri.clone(),
        resource: request.resource.clone(),
        scope: request.scopes.join(" "),
        challenge: request.challenge.clone(),
        expires_at: now_secs() + s.config.code_ttl.as_secs() as i64,
        issued: None,
    };
    if let Err(e) = s.store.add_code(&row).await {
        return store_failed(e);
    }
    tracing::info!(user = %subject, client_id = %request.client_id, "authorization code issued");
    back_to_client(
        &request.redirect_uri,
        request.state.as_deref(),
        &s.issuer,
        &[("code", &code)],
    )
}

#[derive(Deserialize, Default)]
struct TokenForm {
    grant_type: Option<String>,
    code: Option<String>,
    redirect_uri: Option<String>,
    code_verifier: Option<String>,
    refresh_token: Option<String>,
    scope: Option<String>,
    resource: Option<String>,
    client_id: Option<String>,
    client_secret: Option<String>,
    token: Option<String>,
}

/// Authenticates the client of a token or revocation request: HTTP Basic, form credentials,
/// or (a public client) its id alone.
async fn authenticate_client(
    s: &AuthServer,
    headers: &HeaderMap,
    addr: Option<IpAddr>,
    f: &TokenForm,
) -> Result<Client, Response> {
    let basic = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| {
            v.strip_prefix("Basic ")
                .or_else(|| v.strip_prefix("basic "))
        })
        .and_then(|b| STANDARD.decode(b.trim()).ok())
        .and_then(|b| String::from_utf8(b).ok())
        .and_then(|s| {
            let (id, secret) = s.split_once(':')?;
            let dec = |x: &str| {
                url::form_urlencoded::parse(format!("x={x}").as_bytes())
                    .next()
                    .map(|(_, v)| v.into_owned())
            };
            Some((dec(id)?, dec(secret)?))
        });
    let invalid = |why: &str| {
        let mut r = oauth_error(StatusCode::UNAUTHORIZED, "invalid_client", why);
        if basic.is_some() {
            r.headers_mut().insert(
                header::WWW_AUTHENTICATE,
                HeaderValue::from_static("Basic realm=\"mcp-gateway\""),
            );
        }
        r
    };
    let (client_id, secret, method) = match (&basic, &f.client_id, &f.client_secret) {
        (Some((id, secret)), _, None) => (id.clone(), Some(secret.clone()), "client_secret_basic"),
        (Some(_), _, Some(_)) => return Err(invalid("use one way of client authentication")),
        (None, Some(id), Some(secret)) => (id.clone(), Some(secret.clone()), "client_secret_post"),
        (None, Some(id), None) => (id.clone(), None, "none"),
        (None, None, _) => return Err(invalid("the request names no client")),
    };
    let client = match s.client(&client_id, addr).await {
        Ok(Some(c)) => c,
        Ok(None) => return Err(invalid("unknown client")),
        Err(Lookup::Limited(wait)) => {
            let mut r = oauth_error(
                StatusCode::TOO_MANY_REQUESTS,
                "temporarily_unavailable",
                format!(
                    "too many client metadata documents were fetched; try again in {}",
                    wait_words(wait)
                ),
            );
            retry_after(&mut r, wait);
            return Err(r);
        }
        Err(Lookup::Failed(e)) => return Err(invalid(&e)),
    };
    if client.provisioned {
        // Either way of sending the secret; the secret is an operator's, hashed with argon2.
        let Some(secret) = secret else {
            return Err(invalid("this client authenticates with a client secret"));
        };
        // Guessing it is guessing a password: wrong secrets count against the address as
        // failed sign-ins do (not against the client, which a stranger could lock out).
        if let Some(wait) = addr.and_then(|a| s.signins.addresses.blocked(&a)) {
            let mut r = oauth_error(
                StatusCode::TOO_MANY_REQUESTS,
                "temporarily_unavailable",
                format!(
                    "too many failed sign-ins from this address; try again in {}",
                    wait_words(wait)
                ),
            );
            retry_after(&mut r, wait);
            return Err(r);
        }
        if !verify_argon2(client.secret_hash.clone(), &secret).await {
            if let Some(a) = addr {
                s.signins.addresses.hit(a);
            }
            return Err(invalid("wrong client secret"));
        }
        return Ok(client);
    }
    if client.auth_method != method {
        return Err(invalid(&format!(
            "this client authenticates with {}, not {method}",
            client.auth_method
        )));
    }
    if let Some(secret) = secret {
        let ok = client
            .secret_hash
            .as_deref()
            .is_some_and(|h| constant_time_eq(h, &hash_secret(&secret)));
        if !ok {
            return Err(invalid("wrong client secret"));
        }
    }
    Ok(client)
}

fn token_response(
    s: &AuthServer,
    planned: &Planned,
    subject: &str,
    client: &Client,
    scope: &str,
    refresh: Option<String>,
    grant_type: &'static str,
) -> Response {
    crate::metrics::get()
        .auth_issued
        .with_label_values(&[grant_type])
        .inc();
    let scopes: BTreeSet<String> = scope.split_whitespace().map(str::to_owned).collect();
    let (access, expires_in) = s
        .keys
        .issue_as(planned, subject, &client.client_id, &scopes);
    let mut out = json!({
        "access_token": access,
        "token_type": "Bearer",
        "expires_in": expires_in,
        "scope": scope,
    });
    if let Some(r) = refresh {
        out["refresh_token"] = json!(r);
    }
    json_response(StatusCode::OK, out)
}

/// A new refresh token in `family`, recording the access token issued with it.
async fn new_refresh(
    s: &AuthServer,
    family: &str,
    planned: &Planned,
    client: &Client,
    subject: &str,
    resource: &str,
    scope: &str,
) -> Result<Option<String>, Response> {
    if !client.grant_types.iter().any(|g| g == "refresh_token") {
        return Ok(None);
    }
    let token = random_token();
    let row = Refresh {
        token_hash: hash_secret(&token),
        family: family.to_owned(),
        client_id: client.client_id.clone(),
        subject: subject.to_owned(),
        resource: resource.to_owned(),
        scope: scope.to_owned(),
        expires_at: now_secs() + s.config.refresh_ttl.as_secs() as i64,
        access: Some((planned.jti.clone(), planned.exp)),
    };
    s.store.add_refresh(&row).await.map_err(store_failed)?;
    Ok(Some(token))
}

async fn token(
    State(auth): St,
    ClientAddr(addr): ClientAddr,
    headers: HeaderMap,
    Form(f): Form<TokenForm>,
) -> Response {
    let s = server(&auth);
    let client = match authenticate_client(s, &headers, addr, &f).await {
        Ok(c) => c,
        Err(r) => return r,
    };
    let grant = f.grant_type.as_deref().unwrap_or_default();
    if !client.grant_types.iter().any(|g| g == grant) {
        return oauth_error(
            StatusCode::BAD_REQUEST,
            if ["authorization_code", "refresh_token", "client_credentials"].contains(&grant) {
                "unauthorized_client"
            } else {
                "unsupported_grant_type"
            },
            format!("grant type `{grant}` is not available to this client"),
        );
    }
    let bad_grant = |why: &str| oauth_error(StatusCode::BAD_REQUEST, "invalid_grant", why);
    if let Some(r) = &f.resource
        && !same_resource(&auth.resource, r)
    {
        return oauth_error(
            StatusCode::BAD_REQUEST,
            "invalid_target",
            "the resource is not this gateway's /mcp",
        );
    }
    match grant {
        "authorization_code" => {
            let (Some(code), Some(verifier)) = (&f.code, &f.code_verifier) else {
                return oauth_error(
                    StatusCode::BAD_REQUEST,
                    "invalid_request",
                    "code and code_verifier are required",
                );
            };
            // What this redemption will issue is recorded as the code is taken.
            let planned = s.keys.plan();
            let issue = Issued {
                family: random_token(),
                access_jti: planned.jti.clone(),
                access_expires_at: planned.exp,
                kept_until: planned
                    .exp
                    .max(now_secs() + s.config.refresh_ttl.as_secs() as i64)
                    + super::LEEWAY.as_secs() as i64,
            };
            let code_hash = hash_secret(code);
            let c = match s.store.take_code(&code_hash, &issue).await {
                Ok(Taken::Fresh(c)) => c,
                Ok(Taken::Reused(c)) => {
                    // Someone else holds a copy of the code: what its first use gave is revoked
                    // (OAuth 2.1 §4.1.3).
                    tracing::warn!(client_id = %c.client_id, user = %c.subject, "an authorization code was used twice; the tokens it gave are revoked");
                    if let Some(first) = &c.issued
                        && let Err(e) = revoke_grant(
                            s,
                            &first.family,
                            Some((&first.access_jti, first.access_expires_at)),
                        )
                        .await
                    {
                        return store_failed(e);
                    }
                    return bad_grant("the code was already used; the tokens it gave are revoked");
                }
                Ok(Taken::Unknown) => return bad_grant("unknown code"),
                Err(e) => return store_failed(e),
            };
            if c.expires_at < now_secs() {
                return bad_grant("the code has expired");
            }
            if c.client_id != client.client_id {
                return bad_grant("the code was issued to another client");
            }
            // Gateways may share a database: a code is good only at the gateway (resource and
            // issuer) that issued it.
            if c.resource != auth.resource {
                return bad_grant("the code was issued for another resource");
            }
            if f.redirect_uri.as_deref() != Some(c.redirect_uri.as_str()) {
                return bad_grant("redirect_uri does not match the authorization request");
            }
            if f.resource
                .as_deref()
                .is_some_and(|r| !same_resource(&c.resource, r))
            {
                return bad_grant("the resource does not match the authorization request");
            }
            let valid_verifier = (43..=128).contains(&verifier.len())
                && verifier
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b"-._~".contains(&b));
            let computed = {
                use sha2::Digest;
                URL_SAFE_NO_PAD.encode(sha2::Sha256::digest(verifier.as_bytes()))
            };
            if !valid_verifier || !constant_time_eq(&computed, &c.challenge) {
                return bad_grant("the PKCE code_verifier does not match the code_challenge");
            }
            let allowed = s.allowed_scopes(&client);
            if let Some(x) = c.scope.split_whitespace().find(|x| !allowed.contains(*x)) {
                return oauth_error(
                    StatusCode::BAD_REQUEST,
                    "invalid_scope",
                    format!("scope `{x}` is no longer available to this client"),
                );
            }
            let refresh = match new_refresh(
                s,
                &issue.family,
                &planned,
                &client,
                &c.subject,
                &c.resource,
                &c.scope,
            )
            .await
            {
                Ok(r) => r,
                Err(r) => return r,
            };
            // A replay while this was issuing revoked the family before its token existed.
            match s.store.code_replayed(&code_hash).await {
                Ok(false) => {}
                Ok(true) => {
                    if let Err(e) = revoke_grant(s, &issue.family, None).await {
                        return store_failed(e);
                    }
                    return bad_grant("the code was used twice; the tokens it gave are revoked");
                }
                Err(e) => return store_failed(e),
            }
            tracing::info!(user = %c.subject, client_id = %client.client_id, "tokens issued (authorization code)");
            token_response(
                s,
                &planned,
                &c.subject,
                &client,
                &c.scope,
                refresh,
                "authorization_code",
            )
        }
        "refresh_token" => {
            let Some(token) = &f.refresh_token else {
                return oauth_error(
                    StatusCode::BAD_REQUEST,
                    "invalid_request",
                    "refresh_token is required",
                );
            };
            let hash = hash_secret(token);
            // Gateways may share a database: a refresh token is good only at the gateway
            // (resource and issuer) that issued it, and only for its client. Checked before the
            // token is spent, so a token shown to the wrong place stays its holder's.
            match s.store.refresh(&hash).await {
                Ok(Some(r)) if r.resource != auth.resource => {
                    tracing::warn!(client_id = %r.client_id, "a refresh token for another resource was presented");
                    return bad_grant("the refresh token was issued for another resource");
                }
                Ok(Some(r)) if r.client_id != client.client_id => {
                    return bad_grant("the refresh token was issued to another client");
                }
                Ok(_) => {}
                Err(e) => return store_failed(e),
            }
            let r = match s.store.take_refresh(&hash).await {
                Ok(Taken::Fresh(r)) => r,
                Ok(Taken::Reused(r)) => {
                    // A rotated-out token came back: someone holds a copy. The whole family goes.
                    tracing::warn!(client_id = %r.client_id, user = %r.subject, "a refresh token was reused; its family is revoked");
                    if let Err(e) = revoke_grant(s, &r.family, None).await {
                        return store_failed(e);
                    }
                    return bad_grant("the refresh token was already used; its grant is revoked");
                }
                Ok(Taken::Unknown) => return bad_grant("unknown or revoked refresh token"),
                Err(e) => return store_failed(e),
            };
            if r.client_id != client.client_id || r.resource != auth.resource {
                return bad_grant("the refresh token was issued to another client or resource");
            }
            if r.expires_at < now_secs() {
                return bad_grant("the refresh token has expired");
            }
            // What the grant allowed, narrowed to what the client may still be given.
            let allowed = s.allowed_scopes(&client);
            let scope = match &f.scope {
                None => r
                    .scope
                    .split_whitespace()
                    .filter(|x| allowed.contains(*x))
                    .collect::<Vec<_>>()
                    .join(" "),
                Some(asked) => {
                    let granted: BTreeSet<&str> = r.scope.split_whitespace().collect();
                    if let Some(extra) = asked
                        .split_whitespace()
                        .find(|x| !granted.contains(x) || !allowed.contains(*x))
                    {
                        return oauth_error(
                            StatusCode::BAD_REQUEST,
                            "invalid_scope",
                            format!("scope `{extra}` was not granted"),
                        );
                    }
                    asked.split_whitespace().collect::<Vec<_>>().join(" ")
                }
            };
            let planned = s.keys.plan();
            let refresh = match new_refresh(
                s,
                &r.family,
                &planned,
                &client,
                &r.subject,
                &r.resource,
                &r.scope,
            )
            .await
            {
                Ok(t) => t,
                Err(resp) => return resp,
            };
            token_response(
                s,
                &planned,
                &r.subject,
                &client,
                &scope,
                refresh,
                "refresh_token",
            )
        }
        "client_credentials" => {
            // Only for clients the operator provisioned, whatever a stored registration says
            // (registrations from before this rule may name the grant).
            if !client.provisioned || client.auth_method == "none" {
                return oauth_error(
                    StatusCode::BAD_REQUEST,
                    "unauthorized_client",
                    "client_credentials is only for clients provisioned by the operator",
                );
            }
            let allowed = s.allowed_scopes(&client);
            let scope = match &f.scope {
                None => allowed.iter().cloned().collect::<Vec<_>>().join(" "),
                Some(asked) => {
                    if let Some(x) = asked.split_whitespace().find(|x| !allowed.contains(*x)) {
                        return oauth_error(
                            StatusCode::BAD_REQUEST,
                            "invalid_scope",
                            format!("scope `{x}` is not one this client may be given"),
                        );
                    }
                    asked.split_whitespace().collect::<Vec<_>>().join(" ")
                }
            };
            tracing::info!(client_id = %client.client_id, "token issued (client credentials)");
            token_response(
                s,
                &s.keys.plan(),
                &client.client_id.clone(),
                &client,
                &scope,
                None,
                "client_credentials",
            )
        }
        _ => oauth_error(
            StatusCode::BAD_REQUEST,
            "unsupported_grant_type",
            format!("grant type `{grant}` is not supported"),
        ),
    }
}

/// Revokes a grant: its refresh token family, the access tokens issued with them, and
/// `access` (a code's first access token, issued with no refresh token when the client has
/// none).
async fn revoke_grant(
    s: &AuthServer,
    family: &str,
    access: Option<(&str, i64)>,
) -> Result<(), AuthStoreError> {
    let live = s.store.revoke_family(family, now_secs()).await?;
    for (jti, exp) in live.iter().map(|(j, e)| (j.as_str(), *e)).chain(access) {
        s.keys.revoke_jti(jti, exp).await?;
    }
    Ok(())
}

/// Token revocation (RFC 7009): a refresh token revokes its whole grant, the access tokens
/// issued with it included (§2.1); an access token is refused from now on. Unknown tokens get
/// 200 too.
async fn revoke(
    State(auth): St,
    ClientAddr(addr): ClientAddr,
    headers: HeaderMap,
    Form(f): Form<TokenForm>,
) -> Response {
    let s = server(&auth);
    let client = match authenticate_client(s, &headers, addr, &f).await {
        Ok(c) => c,
        Err(r) => return r,
    };
    let Some(token) = f.token.as_deref().filter(|t| !t.is_empty()) else {
        return oauth_error(
            StatusCode::BAD_REQUEST,
            "invalid_request",
            "token is required",
        );
    };
    match s.store.refresh(&hash_secret(token)).await {
        Ok(Some(r)) if r.client_id == client.client_id => {
            if let Err(e) = revoke_grant(s, &r.family, None).await {
                return store_failed(e);
            }
            tracing::info!(client_id = %client.client_id, "refresh token revoked");
        }
        Ok(_) => {
            if let Ok(p) = auth.validate(token)
                && p.client_id == client.client_id
            {
                match s.keys.revoke_access(token).await {
                    Ok(true) => {
                        tracing::info!(client_id = %client.client_id, "access token revoked");
                    }
                    Ok(false) => {}
                    Err(e) => return store_failed(e),
                }
            }
        }
        Err(e) => return store_failed(e),
    }
    no_store(StatusCode::OK.into_response())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn waits_are_said_rounded_up() {
        let w = |ms| wait_words(Duration::from_millis(ms));
        assert_eq!(w(300), "1 second");
        assert_eq!(w(1_200), "2 seconds");
        assert_eq!(w(59_000), "59 seconds");
        assert_eq!(w(60_000), "1 minute");
        assert_eq!(w(61_000), "2 minutes");
        assert_eq!(w(899_000), "15 minutes");
    }

    #[test]
    fn names_are_cut_for_the_log() {
        assert_eq!(shown("alice"), "alice");
        let long = "é".repeat(1000);
        assert_eq!(shown(&long).chars().count(), 64);
    }
}
