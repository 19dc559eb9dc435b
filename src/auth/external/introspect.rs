//! Opaque tokens, through the authorization server's introspection endpoint (RFC 7662): the
//! `oauth2` crate's introspection request, the gateway authenticating as its client there
//! (`client_secret_basic`), over the bounded HTTP of [`super::fetch`].
//!
//! An answer is accepted when the token is `active`, names this issuer (when it names one),
//! an accepted audience (it must name one: a token the server issued for another resource
//! is not for this gateway), is within `exp`/`nbf` (with the leeway), and is a bearer token
//! (when its type is given). Answers are cached by the SHA-256 of the token, for at most
//! `introspection_cache` and never past the token's `exp`, so a token revoked at the server
//! is refused once its entry ends; refusals are cached too (a token that is not active never
//! becomes so), failures to ask are not. The cache holds at most [`MAX_CACHED`] entries.

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use dashmap::DashMap;
use oauth2::basic::{
    BasicErrorResponse, BasicRevocationErrorResponse, BasicTokenResponse, BasicTokenType,
};
use oauth2::{
    AccessToken, ClientId, ClientSecret, EndpointNotSet, EndpointSet, ExtraTokenFields,
    IntrospectionUrl, StandardRevocableToken, StandardTokenIntrospectionResponse,
    TokenIntrospectionResponse,
};
use serde::{Deserialize, Serialize};

use super::Checks;
use super::fetch::{Http, Limited};
use crate::auth::{LEEWAY, Principal, TokenError, now_secs};
use crate::config::IntrospectionConfig;

/// Introspection answers larger than this are refused.
const MAX_ANSWER_BYTES: usize = 64 * 1024;
/// Cached answers at most.
pub const MAX_CACHED: usize = 10_000;

/// The answer's members beyond RFC 7662's: `scp`, the groups claim, and any others.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct OtherClaims {
    #[serde(flatten)]
    pub claims: serde_json::Map<String, serde_json::Value>,
}

impl ExtraTokenFields for OtherClaims {}

type Answer = StandardTokenIntrospectionResponse<OtherClaims, BasicTokenType>;

type Client = oauth2::Client<
    BasicErrorResponse,
    BasicTokenResponse,
    Answer,
    StandardRevocableToken,
    BasicRevocationErrorResponse,
    EndpointNotSet,
    EndpointNotSet,
    EndpointSet,
    EndpointNotSet,
    EndpointNotSet,
>;

struct Cached {
    answer: Result<Principal, TokenError>,
    until: Instant,
}

pub struct Introspector {
    client: Client,
    http: Limited,
    max_age: Duration,
    cache: DashMap<[u8; 32], Cached>,
}

impl Introspector {
    pub fn new(config: &IntrospectionConfig, http: Http, max_age: Duration) -> Introspector {
        let client = oauth2::Client::new(ClientId::new(config.client_id.clone()))
            .set_client_secret(ClientSecret::new(config.client_secret().to_owned()))
            .set_introspection_url(IntrospectionUrl::from_url(config.endpoint.clone()));
        Introspector {
            client,
            http: Limited {
                http,
                limit: MAX_ANSWER_BYTES,
            },
            max_age,
            cache: DashMap::new(),
        }
    }

    /// Whom the opaque `token` speaks for, by the server's word (cached).
    pub async fn principal(&self, token: &str, checks: &Checks) -> Result<Principal, TokenError> {
        use sha2::Digest;
        let key: [u8; 32] = sha2::Sha256::digest(token).into();
        let now = Instant::now();
        if let Some(c) = self.cache.get(&key)
            && c.until > now
        {
            return c.answer.clone();
        }
        let token = AccessToken::new(token.to_owned());
        let answer = self
            .client
            .introspect(&token)
            .set_token_type_hint("access_token")
            .request_async(&self.http)
            .await
            .map_err(|e| {
                let why = match &e {
                    oauth2::RequestTokenError::Request(e) => e.to_string(),
                    e => format!("{}: {e}", self.client.introspection_url().as_str()),
                };
                TokenError::Unavailable(format!("the token cannot be introspected: {why}"))
            })?;
        let checked = check(&answer, checks);
        // Until the entry's end: at most max_age, never past the token's expiry.
        let mut until = now + self.max_age;
        if let Ok(_) | Err(TokenError::Expired) = &checked
            && let Some(exp) = answer.exp()
        {
            let left = exp.timestamp() - now_secs();
            until = until.min(now + Duration::from_secs(left.max(0) as u64));
        }
        self.remember(key, checked.clone(), until, now);
        checked
    }

    /// Caches an answer, within [`MAX_CACHED`]: expired entries go first; refusals take at
    /// most half of the room, so a flood of made-up tokens cannot push valid ones out.
    fn remember(
        &self,
        key: [u8; 32],
        answer: Result<Principal, TokenError>,
        until: Instant,
        now: Instant,
    ) {
        if until <= now {
            return;
        }
        let room = if answer.is_ok() {
            MAX_CACHED
        } else {
            MAX_CACHED / 2
        };
        if self.cache.len() >= room {
            self.cache.retain(|_, c| c.until > now);
            if self.cache.len() >= room {
                return;
            }
        }
        self.cache.insert(key, Cached { answer, until });
    }
}

/// The answer's word on the token, checked.
fn check(a: &Answer, checks: &Checks) -> Result<Principal, TokenError> {
    if !a.active() {
        return Err(TokenError::Inactive);
    }
    if a.iss().is_some_and(|iss| iss != checks.issuer) {
        return Err(TokenError::WrongIssuer);
    }
    if !a
        .aud()
        .is_some_and(|aud| aud.iter().any(|x| checks.audiences.contains(x)))
    {
        return Err(TokenError::WrongAudience);
    }
    let now = now_secs();
    let leeway = LEEWAY.as_secs() as i64;
    if a.exp().is_some_and(|exp| exp.timestamp() + leeway < now) {
        return Err(TokenError::Expired);
    }
    if a.nbf().is_some_and(|nbf| nbf.timestamp() - leeway > now) {
        return Err(TokenError::NotYetValid);
    }
    if a.token_type()
        .is_some_and(|t| !matches!(t, BasicTokenType::Bearer))
    {
        return Err(TokenError::Malformed(
            "the introspected token is not a bearer token".into(),
        ));
    }
    let other = &a.extra_fields().claims;
    let client_id = a.client_id().map(|c| c.as_str().to_owned());
    // A token of the client credentials grant may name no subject: its client is.
    let subject = a
        .sub()
        .map(str::to_owned)
        .or_else(|| client_id.clone())
        .ok_or_else(|| TokenError::Malformed("the introspected token names no subject".into()))?;
    let mut scopes: BTreeSet<String> = a
        .scopes()
        .map(|s| s.iter().map(|s| s.as_str().to_owned()).collect())
        .unwrap_or_default();
    if scopes.is_empty() {
        scopes = super::scopes_of(None, other.get("scp"));
    }
    Ok(Principal {
        subject,
        client_id: client_id.unwrap_or_default(),
        scopes,
        groups: super::groups_of(other.get(&checks.groups_claim)),
        token: None,
    })
}
