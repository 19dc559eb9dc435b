//! The gateway as each person's OAuth client at the authorization servers behind the plugins
//! (`oauth2` and `token_exchange` credentials), through the `oauth2` crate: the authorization
//! code flow with PKCE S256 and a `state`, the refresh grant, RFC 7009 revocation, and RFC 8693
//! token exchange (a grant the crate does not carry, sent through the same bounded client).
//!
//! A server's endpoints are the configured ones, else its metadata (RFC 8414, then OpenID
//! discovery), which must name the configured issuer exactly and https endpoints (plain http
//! only on loopback); it is cached for an hour. Every request is bounded in time and bytes and
//! follows no redirect (`auth::external::fetch`). What a server says when it refuses goes to
//! the log as its error code and description, never its body (which could hold a token).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use oauth2::basic::{BasicClient, BasicErrorResponse, BasicErrorResponseType};
use oauth2::{
    AuthType, AuthUrl, AuthorizationCode, ClientId, ClientSecret, CsrfToken, EndpointMaybeSet,
    EndpointNotSet, PkceCodeChallenge, PkceCodeVerifier, RedirectUrl, RefreshToken, Scope,
    TokenResponse, TokenUrl,
};

use crate::auth::external::fetch::{FetchError, Http, Limited};
use crate::config::OAuthServer;

/// The largest answer read from an authorization server.
pub(super) const MAX_ANSWER_BYTES: usize = 256 * 1024;

/// How long a server's metadata is trusted before it is fetched again.
const METADATA_MAX_AGE: Duration = Duration::from_secs(3600);

/// RFC 8693's grant and token types.
const TOKEN_EXCHANGE_GRANT: &str = "urn:ietf:params:oauth:grant-type:token-exchange";
const ACCESS_TOKEN_TYPE: &str = "urn:ietf:params:oauth:token-type:access_token";

/// Why a request to an authorization server gave no token.
#[derive(Debug, thiserror::Error)]
pub enum OAuthError {
    /// The server could not be reached, found or read: the gateway's side, worth another try.
    #[error("the authorization server cannot be reached or read: {0}")]
    Provider(String),
    /// The server refused the grant (`invalid_grant`: the code, the refresh token or the
    /// subject token is no good): the person must connect again.
    #[error("the authorization server refused: {0}")]
    Refused(String),
}

/// What a token endpoint gave.
#[derive(Clone)]
pub struct Tokens {
    pub access_token: String,
    pub refresh_token: Option<String>,
    pub expires_in: Option<Duration>,
    pub scope: Option<String>,
}

impl std::fmt::Debug for Tokens {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "Tokens {{ refresh: {}, expires_in: {:?}, scope: {:?} }}",
            self.refresh_token.is_some(),
            self.expires_in,
            self.scope
        )
    }
}

/// A server's endpoints, configured or discovered, and the client the gateway is there.
#[derive(Debug)]
pub(super) struct Endpoints {
    /// The gateway's client id there (configured, or its registration's).
    pub(super) client_id: String,
    /// The issuer found (through an MCP server's metadata), for RFC 9207's check.
    pub(super) issuer: Option<String>,
    /// The MCP server the tokens are for (`resource`, RFC 8707).
    pub(super) resource: Option<String>,
    /// The scopes asked for when none are configured (the MCP server's).
    pub(super) scopes: Vec<String>,
    pub(super) authorization: Option<url::Url>,
    pub(super) token: url::Url,
    pub(super) revocation: Option<url::Url>,
    /// The gateway's client secret there (configured, or its registration's).
    pub(super) client_secret: Option<String>,
    /// How the secret goes to the token endpoint.
    pub(super) auth: ClientAuth,
    /// Not read from the server's metadata (2025-03-26's default endpoints, or configured
    /// ones): found again at each use rather than kept for an hour.
    pub(super) guessed: bool,
    /// Where the client is a dynamic registration: the issuer it is kept under.
    pub(super) registered_at: Option<String>,
    /// The server names itself in its authorization responses (RFC 9207), so an answer
    /// without `iss` is not its own.
    pub(super) iss_in_responses: bool,
}

/// How the gateway authenticates at a token endpoint (RFC 6749 §2.3, RFC 7591's
/// `token_endpoint_auth_method`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum ClientAuth {
    /// `client_secret_basic`: HTTP Basic.
    Basic,
    /// `client_secret_post`: in the form.
    Post,
    /// `none`: a public client, its id alone in the form.
    None,
}

impl ClientAuth {
    /// For a client with a secret: what its registration says, else what the server takes
    /// (Basic first, the default of RFC 8414 when it says nothing).
    pub(super) fn choose(registered: Option<&str>, supported: &[String]) -> ClientAuth {
        let takes = |m: &str| supported.iter().any(|x| x == m);
        match registered {
            Some("client_secret_basic") => ClientAuth::Basic,
            Some("client_secret_post") => ClientAuth::Post,
            Some("none") => ClientAuth::None,
            _ if supported.is_empty() || takes("client_secret_basic") => ClientAuth::Basic,
            _ if takes("client_secret_post") => ClientAuth::Post,
            _ => ClientAuth::None,
        }
    }

    /// What to ask for when registering: a public client where the server takes one.
    pub(super) fn asked(supported: &[String]) -> &'static str {
        let takes = |m: &str| supported.iter().any(|x| x == m);
        if supported.is_empty() || takes("none") {
            "none"
        } else if takes("client_secret_basic") {
            "client_secret_basic"
        } else if takes("client_secret_post") {
            "client_secret_post"
        } else {
            "none"
        }
    }
}

/// What an authorization code flow keeps while the person is at the server.
pub struct Started {
    pub url: String,
    pub state: String,
    pub pkce_verifier: Option<String>,
    /// The scopes asked for, space-separated.
    pub scopes: String,
    /// Which server and client the flow began with ([`OAuth::binding`]).
    pub binding: String,
}

type Client =
    BasicClient<EndpointMaybeSet, EndpointNotSet, EndpointNotSet, EndpointNotSet, EndpointMaybeSet>;

/// The OAuth client of every credential, with their servers' metadata.
pub struct OAuth {
    http: Http,
    /// For credentials defined through the admin API: global addresses only, and
    /// `[sandbox] remote_networks` (their servers' URLs came through it, and the URLs those
    /// servers name are theirs).
    guarded: Http,
    /// The credentials the config file defines, whose servers the operator chose.
    from_file: std::collections::BTreeSet<String>,
    found: Mutex<HashMap<String, (Arc<Endpoints>, Instant)>>,
    /// The gateway's public origin (its callback, its client ID metadata documents).
    pub(super) base: String,
    /// Where dynamic registrations are kept.
    pub(super) store: Arc<dyn super::store::CredentialStore>,
    /// Seals their secrets.
    pub(super) sealer: super::Sealer,
}

impl OAuth {
    pub fn new(
        base: &str,
        store: Arc<dyn super::store::CredentialStore>,
        sealer: super::Sealer,
        from_file: std::collections::BTreeSet<String>,
        networks: Vec<ipnet::IpNet>,
    ) -> OAuth {
        OAuth {
            http: Http::new(),
            guarded: Http::guarded(networks),
            from_file,
            found: Mutex::new(HashMap::new()),
            base: base.to_owned(),
            store,
            sealer,
        }
    }

    /// The client that fetches for credential `name` (see [`OAuth::guarded`]).
    pub(super) fn http_for(&self, name: &str) -> &Http {
        if self.from_file.contains(name) {
            &self.http
        } else {
            &self.guarded
        }
    }

    /// Drops what was discovered of credential `name`'s server (it was redefined).
    pub fn forget(&self, name: &str) {
        self.found.lock().expect("oauth lock").remove(name);
    }

    /// Starts an authorization code flow for `server` (of credential `name`): the URL to send
    /// the person to, with a new `state`, and PKCE S256 unless turned off; asking for `more`
    /// scopes than the credential's own, if given.
    pub async fn begin(
        &self,
        name: &str,
        server: &OAuthServer,
        pkce: bool,
        redirect_uri: &str,
        more: Option<&str>,
    ) -> Result<Started, OAuthError> {
        let client = self.client(name, server, Some(redirect_uri)).await?;
        let e = self.endpoints(name, server).await?;
        let state = crate::auth::random_token();
        let given = state.clone();
        let mut scopes = if server.scopes.is_empty() {
            e.scopes.clone()
        } else {
            server.scopes.clone()
        };
        // A step-up: those granted before and those the server asked for.
        for s in more.unwrap_or("").split_whitespace() {
            if !scopes.iter().any(|x| x == s) {
                scopes.push(s.to_owned());
            }
        }
        let mut request = client
            .authorize_url(move || CsrfToken::new(given))
            .map_err(|e| OAuthError::Provider(e.to_string()))?
            .add_scopes(scopes.iter().cloned().map(Scope::new));
        if let Some(r) = &e.resource {
            request = request.add_extra_param("resource", r.clone());
        }
        let mut pkce_verifier = None;
        if pkce {
            let (challenge, verifier) = PkceCodeChallenge::new_random_sha256();
            request = request.set_pkce_challenge(challenge);
            pkce_verifier = Some(verifier.secret().clone());
        }
        let (url, _) = request.url();
        Ok(Started {
            url: url.to_string(),
            state,
            pkce_verifier,
            scopes: scopes.join(" "),
            binding: binding(&e),
        })
    }

    /// Which token endpoint and client a flow goes to now: a flow begun with others (the
    /// server was found again meanwhile) is not finished, so that no code or verifier goes
    /// where it was not meant for.
    pub async fn binding(&self, name: &str, server: &OAuthServer) -> Result<String, OAuthError> {
        Ok(binding(&*self.endpoints(name, server).await?))
    }

    /// Whether an authorization response's `iss` (RFC 9207) is this server's: the configured
    /// issuer when it names one; required when the server says it sends it. Refuses a
    /// response another server sent the person back with (a mix-up).
    pub async fn check_iss(
        &self,
        name: &str,
        server: &OAuthServer,
        iss: Option<&str>,
    ) -> Result<(), OAuthError> {
        let endpoints = self.endpoints(name, server).await?;
        // A configured issuer as written (with or without the slash `Url` adds); a
        // discovered one exactly as its metadata says (RFC 9207 §2.4: simple string
        // comparison).
        let theirs = |given: &str| match &server.issuer {
            Some(i) => given.trim_end_matches('/') != i.as_str().trim_end_matches('/'),
            None => endpoints
                .issuer
                .as_deref()
                .is_some_and(|ours| given != ours),
        };
        match iss {
            Some(given) if theirs(given) => Err(OAuthError::Refused(format!(
                "the answer names the issuer `{given}`, not this credential's"
            ))),
            None if endpoints.iss_in_responses => Err(OAuthError::Refused(
                "the answer does not name its issuer, which this server always does".into(),
            )),
            _ => Ok(()),
        }
    }

    /// Redeems the `code` the server sent back, with the flow's PKCE verifier.
    pub async fn redeem(
        &self,
        name: &str,
        server: &OAuthServer,
        redirect_uri: &str,
        code: &str,
        pkce_verifier: Option<&str>,
    ) -> Result<Tokens, OAuthError> {
        let client = self.client(name, server, Some(redirect_uri)).await?;
        let e = self.endpoints(name, server).await?;
        let mut request = client
            .exchange_code(AuthorizationCode::new(code.to_owned()))
            .map_err(|e| OAuthError::Provider(e.to_string()))?;
        if let Some(r) = &e.resource {
            request = request.add_extra_param("resource", r.clone());
        }
        if let Some(v) = pkce_verifier {
            request = request.set_pkce_verifier(PkceCodeVerifier::new(v.to_owned()));
        }
        let answer = request.request_async(&self.limited(name)).await;
        self.client_refused(name, &e, &answer).await;
        tokens(answer.map_err(token_error)?)
    }

    /// A new access token for `refresh_token`; the server may rotate the refresh token too.
    pub async fn refresh(
        &self,
        name: &str,
        server: &OAuthServer,
        refresh_token: &str,
    ) -> Result<Tokens, OAuthError> {
        let client = self.client(name, server, None).await?;
        let e = self.endpoints(name, server).await?;
        let refresh = RefreshToken::new(refresh_token.to_owned());
        let mut request = client
            .exchange_refresh_token(&refresh)
            .map_err(|e| OAuthError::Provider(e.to_string()))?;
        if let Some(r) = &e.resource {
            request = request.add_extra_param("resource", r.clone());
        }
        let answer = request.request_async(&self.limited(name)).await;
        tokens(answer.map_err(token_error)?)
    }

    /// A token endpoint that no longer knows the gateway's registration (`invalid_client`, to
    /// a person's code: not to a background refresh, which another replica's registration
    /// could explain): it is forgotten, with what was found of the server, so that the next
    /// flow registers anew.
    async fn client_refused<T>(
        &self,
        name: &str,
        e: &Endpoints,
        answer: &Result<T, oauth2::RequestTokenError<FetchError, BasicErrorResponse>>,
    ) {
        let Err(oauth2::RequestTokenError::ServerResponse(r)) = answer else {
            return;
        };
        let (BasicErrorResponseType::InvalidClient, Some(issuer)) = (r.error(), &e.registered_at)
        else {
            return;
        };
        tracing::warn!(
            credential = name,
            issuer,
            "the authorization server no longer knows the gateway's registration; it registers anew"
        );
        if let Err(err) = self
            .store
            .forget_registration(name, issuer, &e.client_id)
            .await
        {
            tracing::warn!(credential = name, "credentials: {err}");
        }
        self.forget(name);
    }

    /// Revokes the person's tokens at the server (RFC 7009), the refresh token when there
    /// is one (which ends the grant's access tokens too at most servers), else the access
    /// token, when the server has a revocation endpoint; whether it had one. Sent by hand
    /// rather than through the `oauth2` crate, which refuses a plain-http endpoint even on
    /// loopback.
    pub async fn revoke(
        &self,
        name: &str,
        server: &OAuthServer,
        access_token: &str,
        refresh_token: Option<&str>,
    ) -> Result<bool, OAuthError> {
        let endpoints = self.endpoints(name, server).await?;
        let Some(url) = &endpoints.revocation else {
            return Ok(false);
        };
        let form = match refresh_token {
            Some(r) => vec![
                ("token", r.to_owned()),
                ("token_type_hint", "refresh_token".to_owned()),
            ],
            None => vec![
                ("token", access_token.to_owned()),
                ("token_type_hint", "access_token".to_owned()),
            ],
        };
        let answer = self.post_form(name, url, &endpoints, form).await?;
        // RFC 7009 §2.2: 200 also for a token the server no longer knows.
        if !answer.status().is_success() {
            return Err(refusal(answer.status(), answer.body(), false));
        }
        Ok(true)
    }

    /// RFC 8693: `subject_token` (an access token) exchanged for one with `audience` and
    /// `resource`, and the configured scopes.
    pub async fn exchange(
        &self,
        name: &str,
        server: &OAuthServer,
        subject_token: &str,
        audience: Option<&str>,
        resource: Option<&str>,
    ) -> Result<Tokens, OAuthError> {
        let endpoints = self.endpoints(name, server).await?;
        let mut form = vec![
            ("grant_type", TOKEN_EXCHANGE_GRANT.to_owned()),
            ("subject_token", subject_token.to_owned()),
            ("subject_token_type", ACCESS_TOKEN_TYPE.to_owned()),
            ("requested_token_type", ACCESS_TOKEN_TYPE.to_owned()),
        ];
        if let Some(a) = audience {
            form.push(("audience", a.to_owned()));
        }
        if let Some(r) = resource {
            form.push(("resource", r.to_owned()));
        }
        if !server.scopes.is_empty() {
            form.push(("scope", server.scopes.join(" ")));
        }
        let answer = self
            .post_form(name, &endpoints.token, &endpoints, form)
            .await?;
        if !answer.status().is_success() {
            return Err(refusal(answer.status(), answer.body(), true));
        }
        let answer: oauth2::basic::BasicTokenResponse = serde_json::from_slice(answer.body())
            .map_err(|e| OAuthError::Provider(format!("unreadable token answer: {e}")))?;
        tokens(answer)
    }

    /// POSTs `form` to `url` with the client's authentication (HTTP Basic, in the body, or
    /// its id alone, as [`ClientAuth`] says).
    async fn post_form(
        &self,
        name: &str,
        url: &url::Url,
        endpoints: &Endpoints,
        mut pairs: Vec<(&str, String)>,
    ) -> Result<oauth2::HttpResponse, OAuthError> {
        let mut request = oauth2::http::Request::builder()
            .method(oauth2::http::Method::POST)
            .uri(url.as_str())
            .header("content-type", "application/x-www-form-urlencoded")
            .header("accept", "application/json");
        match (&endpoints.client_secret, endpoints.auth) {
            (Some(secret), ClientAuth::Basic) => {
                use base64::Engine as _;
                // RFC 6749 §2.3.1: both parts form-encoded before the Basic encoding.
                let enc = |s: &str| {
                    url::form_urlencoded::byte_serialize(s.as_bytes()).collect::<String>()
                };
                let basic = base64::engine::general_purpose::STANDARD.encode(format!(
                    "{}:{}",
                    enc(&endpoints.client_id),
                    enc(secret)
                ));
                request = request.header("authorization", format!("Basic {basic}"));
            }
            (Some(secret), ClientAuth::Post) => {
                pairs.push(("client_id", endpoints.client_id.clone()));
                pairs.push(("client_secret", secret.clone()));
            }
            _ => pairs.push(("client_id", endpoints.client_id.clone())),
        }
        let body = url::form_urlencoded::Serializer::new(String::new())
            .extend_pairs(pairs)
            .finish();
        let request = request
            .body(body.into_bytes())
            .map_err(|e| OAuthError::Provider(e.to_string()))?;
        self.http_for(name)
            .send(request, MAX_ANSWER_BYTES)
            .await
            .map_err(|e| OAuthError::Provider(e.to_string()))
    }

    fn limited(&self, name: &str) -> Limited {
        Limited {
            http: self.http_for(name).clone(),
            limit: MAX_ANSWER_BYTES,
        }
    }

    async fn client(
        &self,
        name: &str,
        server: &OAuthServer,
        redirect_uri: Option<&str>,
    ) -> Result<Client, OAuthError> {
        let e = self.endpoints(name, server).await?;
        let bad = |what: &str, err: url::ParseError| {
            OAuthError::Provider(format!("the {what} is not a URL: {err}"))
        };
        let mut client = BasicClient::new(ClientId::new(e.client_id.clone()))
            .set_auth_uri_option(
                e.authorization
                    .as_ref()
                    .map(|u| AuthUrl::from_url(u.clone())),
            )
            .set_token_uri_option(Some(TokenUrl::from_url(e.token.clone())));
        if let Some(r) = redirect_uri {
            client = client.set_redirect_uri(
                RedirectUrl::new(r.to_owned()).map_err(|err| bad("redirect URI", err))?,
            );
        }
        if let Some(secret) = &e.client_secret
            && e.auth != ClientAuth::None
        {
            client = client.set_client_secret(ClientSecret::new(secret.clone()));
            if e.auth == ClientAuth::Post {
                client = client.set_auth_type(AuthType::RequestBody);
            }
        }
        Ok(client)
    }

    /// The endpoints of credential `name`'s server: configured, else discovered (cached).
    async fn endpoints(
        &self,
        name: &str,
        server: &OAuthServer,
    ) -> Result<Arc<Endpoints>, OAuthError> {
        if let Some(token) = &server.token_endpoint
            && server.mcp_server.is_none()
            && (server.issuer.is_none() || server.authorization_endpoint.is_some())
        {
            return Ok(Arc::new(Endpoints {
                client_id: server.client_id.clone(),
                issuer: None,
                resource: None,
                scopes: Vec::new(),
                authorization: server.authorization_endpoint.clone(),
                token: token.clone(),
                revocation: server.revocation_endpoint.clone(),
                client_secret: server.client_secret.as_ref().map(|s| s.expose().to_owned()),
                auth: ClientAuth::Basic,
                guessed: false,
                registered_at: None,
                iss_in_responses: false,
            }));
        }
        if let Some((e, at)) = self.found.lock().expect("oauth lock").get(name)
            && at.elapsed() < METADATA_MAX_AGE
        {
            return Ok(e.clone());
        }
        let found = Arc::new(super::discovery::discover(self, name, server).await?);
        if found.guessed {
            return Ok(found);
        }
        self.found
            .lock()
            .expect("oauth lock")
            .insert(name.to_owned(), (found.clone(), Instant::now()));
        Ok(found)
    }
}

fn binding(e: &Endpoints) -> String {
    format!("{} {}", e.token, e.client_id)
}

fn tokens(answer: oauth2::basic::BasicTokenResponse) -> Result<Tokens, OAuthError> {
    let access_token = answer.access_token().secret().clone();
    if access_token.is_empty() || access_token.len() > super::MAX_VALUE_BYTES {
        return Err(OAuthError::Provider(
            "the access token is empty or too long".into(),
        ));
    }
    Ok(Tokens {
        access_token,
        refresh_token: answer.refresh_token().map(|r| r.secret().clone()),
        expires_in: answer.expires_in(),
        scope: answer
            .scopes()
            .map(|s| s.iter().map(|x| x.as_str()).collect::<Vec<_>>().join(" ")),
    })
}

/// A server's refusal: its error code and description (never the rest of its body). With
/// `grant`, a refused grant (the subject token, the scope) is the person's to fix, not the
/// gateway's.
fn refusal(status: oauth2::http::StatusCode, body: &[u8], grant: bool) -> OAuthError {
    match serde_json::from_slice::<BasicErrorResponse>(body) {
        Ok(r) => {
            let text = server_error(&r);
            let theirs = matches!(
                r.error(),
                BasicErrorResponseType::InvalidGrant
                    | BasicErrorResponseType::InvalidScope
                    | BasicErrorResponseType::UnauthorizedClient
                    | BasicErrorResponseType::Extension(_)
            );
            if grant && theirs {
                OAuthError::Refused(text)
            } else {
                OAuthError::Provider(text)
            }
        }
        Err(_) => OAuthError::Provider(format!("the server answered {status}")),
    }
}

fn server_error(r: &BasicErrorResponse) -> String {
    let mut s = r.error().to_string();
    if let Some(d) = r.error_description() {
        s.push_str(": ");
        s.push_str(d);
    }
    s
}

/// A failed token request: a refused grant, or a failure on the way.
fn token_error(e: oauth2::RequestTokenError<FetchError, BasicErrorResponse>) -> OAuthError {
    match &e {
        oauth2::RequestTokenError::ServerResponse(r)
            if *r.error() == BasicErrorResponseType::InvalidGrant =>
        {
            OAuthError::Refused(server_error(r))
        }
        _ => OAuthError::Provider(describe(&e)),
    }
}

/// What a failed request says, without the server's body.
fn describe<RE: std::error::Error + 'static, T: oauth2::ErrorResponse + 'static>(
    e: &oauth2::RequestTokenError<RE, T>,
) -> String {
    match e {
        oauth2::RequestTokenError::ServerResponse(r) => serde_json::to_value(r).ok().map_or_else(
            || "refused".to_owned(),
            |v| {
                let code = v["error"].as_str().unwrap_or("refused").to_owned();
                match v["error_description"].as_str() {
                    Some(d) => format!("{code}: {d}"),
                    None => code,
                }
            },
        ),
        oauth2::RequestTokenError::Request(e) => format!("the request failed: {e}"),
        oauth2::RequestTokenError::Parse(e, _) => format!("unreadable answer: {e}"),
        oauth2::RequestTokenError::Other(s) => s.clone(),
    }
}
