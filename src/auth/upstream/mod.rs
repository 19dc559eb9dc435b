//! Sign-in delegated to an upstream OpenID provider (`[auth.upstream]`): the built-in
//! authorization server stays the one MCP clients deal with, but the person proves who they
//! are at the provider. [`Upstream::begin`] makes the leg toward the provider (an
//! authorization code request with PKCE S256, a `state` and a `nonce`, through the `oauth2`
//! crate) whose secrets the caller binds to the pending authorization; [`Upstream::finish`]
//! redeems the code the provider sends back, validates the ID token ([`id_token`]) and maps
//! its claims to the gateway's subject and groups, and applies the allow-lists.
//!
//! The provider is found by OpenID discovery from its issuer ([`discovery`]), cached and
//! fetched again when stale; its signing keys likewise, and at once (rate-limited) when a
//! token names a key not seen yet. What the provider hands over besides the ID token (its
//! access and refresh tokens) is dropped here: it never reaches a plugin, a client, the
//! database or a log, and neither does the client secret.

mod discovery;
mod id_token;

use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};

use oauth2::basic::{
    BasicErrorResponse, BasicRevocationErrorResponse, BasicTokenIntrospectionResponse,
    BasicTokenType,
};
use oauth2::{
    AuthType, AuthUrl, AuthorizationCode, ClientId, ClientSecret, CsrfToken, EndpointNotSet,
    EndpointSet, ExtraTokenFields, PkceCodeChallenge, PkceCodeVerifier, RedirectUrl, Scope,
    StandardRevocableToken, StandardTokenResponse, TokenUrl,
};
use serde::{Deserialize, Serialize};

use crate::config::UpstreamConfig;

pub use discovery::Discovered;
pub use id_token::Identity;

/// Where the provider sends the person back: on the gateway's issuer (its public origin).
pub const CALLBACK_PATH: &str = "/authorize/upstream/callback";

/// Where the provider sends a person back who signed in on the people's credential pages
/// (the connect and connections pages): a second redirect URI to register there.
pub const PAGES_CALLBACK_PATH: &str = "/connect/signin/callback";

/// How long a discovery document is trusted before it is fetched again.
const DISCOVERY_MAX_AGE: Duration = Duration::from_secs(3600);

/// How long the provider has to answer one request.
const PROVIDER_TIMEOUT: Duration = Duration::from_secs(15);

/// Why a sign-in at the provider did not give a person the gateway may let in.
#[derive(Debug, thiserror::Error)]
pub enum UpstreamError {
    /// The provider could not be found or read (discovery, keys): the gateway's side.
    #[error("the identity provider cannot be reached or read: {0}")]
    Provider(String),
    /// The code exchange failed (the provider refused it, or answered nonsense).
    #[error("the identity provider did not redeem the sign-in: {0}")]
    Exchange(String),
    /// The ID token is missing or does not validate (signature, issuer, audience, nonce,
    /// times).
    #[error("the identity provider's ID token was not accepted: {0}")]
    IdToken(String),
    /// The person signed in but is not let in here (allow-lists, or no usable subject).
    #[error("{0}")]
    NotAllowed(String),
}

/// What the gateway keeps of its leg toward the provider while the person is there: bound to
/// the pending authorization, used once.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Leg {
    /// SHA-256 of the random part of `state`.
    pub state_hash: String,
    pub nonce: String,
    pub pkce_verifier: String,
}

/// The provider's access token for a person who signed in, kept out of `Debug`.
#[derive(Clone)]
pub struct ProviderToken {
    pub access_token: String,
    pub expires_in: Option<Duration>,
}

impl std::fmt::Debug for ProviderToken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "ProviderToken {{ expires_in: {:?} }}", self.expires_in)
    }
}

/// Who keeps a person's provider access token (for `token_exchange` credentials): the
/// credentials' broker, above this layer.
pub trait ProviderTokens: Send + Sync {
    /// `subject` signed in at the provider, which gave `token`.
    fn signed_in(&self, subject: &str, token: ProviderToken);
}

/// The ID token among the fields of the provider's token answer.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct IdTokenField {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    id_token: Option<String>,
}

impl ExtraTokenFields for IdTokenField {}

type TokenAnswer = StandardTokenResponse<IdTokenField, BasicTokenType>;

/// The `oauth2` client toward the provider, with its authorization and token endpoints set.
type ProviderClient = oauth2::Client<
    BasicErrorResponse,
    TokenAnswer,
    BasicTokenIntrospectionResponse,
    StandardRevocableToken,
    BasicRevocationErrorResponse,
    EndpointSet,
    EndpointNotSet,
    EndpointNotSet,
    EndpointNotSet,
    EndpointSet,
>;

/// The provider as last discovered, with its `oauth2` client.
struct Found {
    discovered: Arc<Discovered>,
    client: Arc<ProviderClient>,
    at: Instant,
}

/// The upstream provider and the gateway's client there.
pub struct Upstream {
    config: UpstreamConfig,
    redirect_uri: String,
    /// Redirects are not followed (the provider's endpoints are named, not guessed).
    http: reqwest::Client,
    found: RwLock<Option<Found>>,
    keys: id_token::KeyCache,
}

impl Upstream {
    /// The provider of `config`; the gateway's issuer (its public origin) names the redirect
    /// URI registered there. Nothing is fetched yet.
    pub fn new(config: UpstreamConfig, gateway_issuer: &str) -> Upstream {
        Upstream::with_callback(config, gateway_issuer, CALLBACK_PATH)
    }

    /// The provider for the people's credential pages: the same client, sending people back
    /// to [`PAGES_CALLBACK_PATH`].
    pub fn for_pages(config: UpstreamConfig, origin: &str) -> Upstream {
        Upstream::with_callback(config, origin, PAGES_CALLBACK_PATH)
    }

    fn with_callback(config: UpstreamConfig, gateway_issuer: &str, path: &str) -> Upstream {
        let http = reqwest::Client::builder()
            .redirect(reqwest::redirect::Policy::none())
            .timeout(PROVIDER_TIMEOUT)
            .connect_timeout(Duration::from_secs(5))
            .user_agent(concat!("mcp-gateway/", env!("CARGO_PKG_VERSION")))
            .build()
            .expect("an HTTP client builds");
        Upstream {
            redirect_uri: format!("{gateway_issuer}{path}"),
            config,
            http,
            found: RwLock::new(None),
            keys: id_token::KeyCache::default(),
        }
    }

    pub fn config(&self) -> &UpstreamConfig {
        &self.config
    }

    /// How the pages name the provider.
    pub fn display_name(&self) -> &str {
        &self.config.display_name
    }

    /// The provider, discovered now or not long ago.
    pub async fn provider(&self) -> Result<(Arc<Discovered>, Arc<ProviderClient>), UpstreamError> {
        if let Some(f) = &*self.found.read().expect("upstream lock")
            && f.at.elapsed() < DISCOVERY_MAX_AGE
        {
            return Ok((f.discovered.clone(), f.client.clone()));
        }
        let discovered = Arc::new(discovery::discover(&self.http, &self.config.issuer).await?);
        let client = Arc::new(self.client_for(&discovered)?);
        *self.found.write().expect("upstream lock") = Some(Found {
            discovered: discovered.clone(),
            client: client.clone(),
            at: Instant::now(),
        });
        Ok((discovered, client))
    }

    fn client_for(&self, d: &Discovered) -> Result<ProviderClient, UpstreamError> {
        let bad = |what: &str, e: url::ParseError| {
            UpstreamError::Provider(format!("the provider's {what} is not a URL: {e}"))
        };
        let mut client = oauth2::Client::new(ClientId::new(self.config.client_id.clone()))
            .set_auth_uri(
                AuthUrl::new(d.authorization_endpoint.clone())
                    .map_err(|e| bad("authorization_endpoint", e))?,
            )
            .set_token_uri(
                TokenUrl::new(d.token_endpoint.clone()).map_err(|e| bad("token_endpoint", e))?,
            )
            .set_redirect_uri(
                RedirectUrl::new(self.redirect_uri.clone()).map_err(|e| bad("redirect URI", e))?,
            );
        if let Some(secret) = &self.config.client_secret {
            client = client.set_client_secret(ClientSecret::new(secret.expose().to_owned()));
            // HTTP Basic unless the provider says it takes only the secret in the body.
            if d.secret_in_body_only() {
                client = client.set_auth_type(AuthType::RequestBody);
            }
        }
        Ok(client)
    }

    /// Starts a sign-in: the provider's authorization URL, whose `state` is `state_prefix`
    /// followed by a random part, and the leg to keep with the pending authorization.
    pub async fn begin(&self, state_prefix: &str) -> Result<(String, Leg), UpstreamError> {
        let (_, client) = self.provider().await?;
        let secret = crate::auth::random_token();
        let state = format!("{state_prefix}{secret}");
        let nonce = crate::auth::random_token();
        let (challenge, verifier) = PkceCodeChallenge::new_random_sha256();
        let (url, _) = client
            .authorize_url(move || CsrfToken::new(state))
            .add_scopes(self.config.scopes.iter().cloned().map(Scope::new))
            .set_pkce_challenge(challenge)
            .add_extra_param("nonce", nonce.clone())
            .url();
        let leg = Leg {
            state_hash: crate::auth::hash_secret(&secret),
            nonce,
            pkce_verifier: verifier.secret().clone(),
        };
        Ok((url.to_string(), leg))
    }

    /// Redeems the provider's `code` with `leg`'s PKCE verifier, validates the ID token
    /// against `leg`'s nonce, and says who signed in, if the allow-lists let them in.
    pub async fn finish(&self, code: &str, leg: &Leg) -> Result<Identity, UpstreamError> {
        self.finish_with_token(code, leg).await.map(|(who, _)| who)
    }

    /// [`Upstream::finish`], with the provider's access token and its lifetime: what a
    /// `token_exchange` credential exchanges for the person (built-in mode). It goes nowhere
    /// else.
    pub async fn finish_with_token(
        &self,
        code: &str,
        leg: &Leg,
    ) -> Result<(Identity, ProviderToken), UpstreamError> {
        let (discovered, client) = self.provider().await?;
        let answer = client
            .exchange_code(AuthorizationCode::new(code.to_owned()))
            .set_pkce_verifier(PkceCodeVerifier::new(leg.pkce_verifier.clone()))
            .request_async(&self.http)
            .await
            .map_err(|e| UpstreamError::Exchange(exchange_error(&e)))?;
        let provider_token = ProviderToken {
            access_token: oauth2::TokenResponse::access_token(&answer)
                .secret()
                .clone(),
            expires_in: oauth2::TokenResponse::expires_in(&answer),
        };
        let Some(token) = answer.extra_fields().id_token.as_deref() else {
            return Err(UpstreamError::IdToken(
                "the token answer has no id_token (is `openid` among the scopes?)".into(),
            ));
        };
        let claims = self
            .keys
            .validate(&self.http, &discovered, &self.config, token, &leg.nonce)
            .await?;
        let identity = id_token::identity(&self.config, &claims)?;
        id_token::allowed(&self.config, &identity)?;
        Ok((identity, provider_token))
    }
}

/// What a failed exchange says, without the provider's body (which could hold tokens).
fn exchange_error<RE: std::error::Error + 'static>(
    e: &oauth2::RequestTokenError<RE, BasicErrorResponse>,
) -> String {
    match e {
        oauth2::RequestTokenError::ServerResponse(r) => {
            let mut s = r.error().to_string();
            if let Some(d) = r.error_description() {
                s.push_str(": ");
                s.push_str(d);
            }
            s
        }
        oauth2::RequestTokenError::Request(e) => format!("the request failed: {e}"),
        oauth2::RequestTokenError::Parse(e, _) => format!("unreadable answer: {e}"),
        oauth2::RequestTokenError::Other(s) => s.clone(),
    }
}

/// Reads a JSON document of at most `limit` bytes from `url` (discovery, keys).
async fn get_json(
    http: &reqwest::Client,
    url: &str,
    limit: usize,
) -> Result<serde_json::Value, UpstreamError> {
    let fail = |why: String| UpstreamError::Provider(format!("{url}: {why}"));
    let mut r = http
        .get(url)
        .header(reqwest::header::ACCEPT, "application/json")
        .send()
        .await
        .map_err(|e| fail(e.to_string()))?;
    if !r.status().is_success() {
        return Err(fail(format!("answered {}", r.status())));
    }
    let mut body = Vec::new();
    while let Some(chunk) = r.chunk().await.map_err(|e| fail(e.to_string()))? {
        if body.len() + chunk.len() > limit {
            return Err(fail(format!("the document is larger than {limit} bytes")));
        }
        body.extend_from_slice(&chunk);
    }
    serde_json::from_slice(&body).map_err(|e| fail(format!("not JSON: {e}")))
}
