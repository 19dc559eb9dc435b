//! `auth.mode = "external"`: tokens of an authorization server the gateway does not run.
//!
//! A JWT is checked here against the issuer's keys ([`jwks`]): its header first (no `none`,
//! no HMAC, no critical extensions, an access token's `typ` if any), then its signature with
//! the key its `kid` names, by an algorithm that key allows, then `iss` (the configured
//! issuer exactly), `aud` (this resource, or one of `auth.audiences`), `exp` and `nbf` (with
//! [`LEEWAY`]), a subject, and that it is no ID token (unless typed `at+jwt`). Any other token is opaque: it goes to the introspection
//! endpoint ([`introspect`]) when one is configured, and is refused otherwise. Either way the
//! [`Principal`] gets the subject, the client (`client_id`, `azp` or `appid`), the scopes
//! (`scope`, a space-separated string, or `scp`, a list or a string) and the groups (the
//! claim `auth.groups_claim`: a list of strings, or one string). Required scopes are checked
//! by the resource side, as in every mode.
//!
//! All network access is bounded ([`fetch`]).

pub mod fetch;
mod introspect;
mod jwks;

pub use jwks::{first_metadata, metadata_urls};

use std::collections::BTreeSet;

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use futures_util::future::BoxFuture;
use jsonwebtoken::{Algorithm, Validation};
use serde_json::{Map, Value};

use super::{LEEWAY, Principal, RemoteTokenValidator, TokenError};
use crate::config::ExternalConfig;

pub use introspect::MAX_CACHED as MAX_CACHED_INTROSPECTIONS;
pub use jwks::{DEFAULT_LIFETIME, MAX_LIFETIME, MIN_LIFETIME};

/// What every token must name, whichever way it is read.
pub struct Checks {
    pub issuer: String,
    /// The resource first, then `auth.audiences`.
    pub audiences: Vec<String>,
    pub groups_claim: String,
}

/// The validator of mode `external`.
pub struct External {
    checks: Checks,
    keys: jwks::KeySet,
    introspection: Option<introspect::Introspector>,
}

impl External {
    /// The validator for `config`, protecting `resource`; tries to fetch the issuer's keys
    /// at once (a failure is logged and tried again when a token needs them).
    pub async fn start(config: &ExternalConfig, resource: &str) -> External {
        let http = fetch::Http::new();
        let mut audiences = vec![resource.to_owned()];
        audiences.extend(config.audiences.iter().cloned());
        let external = External {
            checks: Checks {
                issuer: config.issuer.clone(),
                audiences,
                groups_claim: config.groups_claim.clone(),
            },
            keys: jwks::KeySet::new(config.issuer.clone(), http.clone(), config.jwks_refresh_min),
            introspection: config
                .introspection
                .as_ref()
                .map(|i| introspect::Introspector::new(i, http, config.introspection_cache)),
        };
        external.keys.load().await;
        external
    }

    async fn check(&self, token: &str) -> Result<Principal, TokenError> {
        let mut parts = token.split('.');
        let jwt = match (parts.next(), parts.next(), parts.next(), parts.next()) {
            (Some(h), Some(_), Some(_), None) => header(h),
            (Some(h), Some(_), Some(_), Some(_)) if header(h).is_some() => {
                return Err(TokenError::Malformed(
                    "encrypted tokens (JWE) are not accepted".into(),
                ));
            }
            _ => None,
        };
        match (jwt, &self.introspection) {
            (Some(h), _) => self.check_jwt(token, &h).await,
            (None, Some(i)) => i.principal(token, &self.checks).await,
            (None, None) => Err(TokenError::Malformed(
                "not a JWT (opaque tokens need an introspection endpoint, which is not configured)"
                    .into(),
            )),
        }
    }

    async fn check_jwt(
        &self,
        token: &str,
        header: &Map<String, Value>,
    ) -> Result<Principal, TokenError> {
        let alg = match header.get("alg").and_then(Value::as_str) {
            None => return Err(TokenError::Malformed("the header names no alg".into())),
            Some(a) => a,
        };
        let alg: Algorithm = match alg.parse() {
            Ok(Algorithm::HS256 | Algorithm::HS384 | Algorithm::HS512) | Err(_) => {
                return Err(TokenError::BadAlgorithm(alg.escape_debug().to_string()));
            }
            Ok(a) => a,
        };
        if header.contains_key("crit") {
            return Err(TokenError::Malformed(
                "the header has critical extensions".into(),
            ));
        }
        // RFC 9068 access tokens say `at+jwt`; many servers say `JWT` or nothing. Any other
        // type (an ID token's, a logout token's, ...) is not an access token.
        let typ = header.get("typ").map(|t| t.as_str().unwrap_or_default());
        if let Some(t) = typ {
            let ok = ["jwt", "at+jwt", "application/at+jwt"]
                .iter()
                .any(|w| t.eq_ignore_ascii_case(w));
            if !ok {
                return Err(TokenError::Malformed(
                    "the token's typ is not an access token's".into(),
                ));
            }
        }
        let explicitly_access = typ.is_some_and(|t| t.to_ascii_lowercase().ends_with("at+jwt"));
        let kid = match header.get("kid") {
            None => None,
            Some(Value::String(k)) => Some(k.as_str()),
            Some(_) => return Err(TokenError::Malformed("kid is not a string".into())),
        };
        let key = self.keys.key(kid, alg).await?;
        let mut v = Validation::new(alg);
        v.leeway = LEEWAY.as_secs();
        v.validate_nbf = true;
        v.set_issuer(&[&self.checks.issuer]);
        v.set_audience(&self.checks.audiences);
        v.set_required_spec_claims(&["exp", "iss", "aud", "sub"]);
        use jsonwebtoken::errors::ErrorKind;
        let claims = jsonwebtoken::decode::<Map<String, Value>>(token, &key, &v)
            .map_err(|e| match e.kind() {
                ErrorKind::ExpiredSignature => TokenError::Expired,
                ErrorKind::ImmatureSignature => TokenError::NotYetValid,
                ErrorKind::InvalidIssuer => TokenError::WrongIssuer,
                ErrorKind::InvalidAudience => TokenError::WrongAudience,
                ErrorKind::InvalidSignature => TokenError::BadSignature,
                ErrorKind::InvalidAlgorithm => TokenError::BadAlgorithm(format!("{alg:?}")),
                _ => TokenError::Malformed(e.to_string()),
            })?
            .claims;
        if !explicitly_access && id_token_claims(&claims) {
            return Err(TokenError::Malformed(
                "it is an ID token, not an access token".into(),
            ));
        }
        let subject = match claims.get("sub") {
            Some(Value::String(s)) if !s.is_empty() => s.clone(),
            _ => return Err(TokenError::Malformed("sub is not a string".into())),
        };
        let client_id = ["client_id", "azp", "appid"]
            .iter()
            .find_map(|k| claims.get(*k).and_then(Value::as_str))
            .unwrap_or_default()
            .to_owned();
        Ok(Principal {
            subject,
            client_id,
            scopes: scopes_of(claims.get("scope"), claims.get("scp")),
            groups: groups_of(claims.get(&self.checks.groups_claim)),
            token: None,
        })
    }
}

impl RemoteTokenValidator for External {
    fn validate<'a>(&'a self, token: &'a str) -> BoxFuture<'a, Result<Principal, TokenError>> {
        Box::pin(self.check(token))
    }
}

/// Whether a token typed only as `JWT` (or not at all) is an OpenID Connect ID token rather
/// than an access token (RFC 8725, 3.11): its payload says `typ: "ID"` (Keycloak's ID tokens;
/// its access tokens say `Bearer`), or it has a claim only ID tokens carry (`nonce`,
/// `at_hash`, `c_hash`; OpenID Connect Core, 2 and 3.3.2.11). Without this, an ID token of
/// the issuer whose audience (a client id) is in `auth.audiences` would pass as an access
/// token wherever no scope is required.
fn id_token_claims(claims: &Map<String, Value>) -> bool {
    match claims.get("typ").and_then(Value::as_str) {
        Some(t) if t.eq_ignore_ascii_case("bearer") => false,
        Some(t) if t.eq_ignore_ascii_case("id") => true,
        _ => ["nonce", "at_hash", "c_hash"]
            .iter()
            .any(|c| claims.contains_key(*c)),
    }
}

/// A JWS's header, if `part` is one: base64url of a JSON object.
fn header(part: &str) -> Option<Map<String, Value>> {
    let bytes = URL_SAFE_NO_PAD.decode(part).ok()?;
    serde_json::from_slice(&bytes).ok()
}

/// Scopes from `scope` (space-separated), or else `scp` (a list, or space-separated).
fn scopes_of(scope: Option<&Value>, scp: Option<&Value>) -> BTreeSet<String> {
    let words = |v: &Value| -> BTreeSet<String> {
        match v {
            Value::String(s) => s.split_whitespace().map(str::to_owned).collect(),
            Value::Array(a) => a
                .iter()
                .filter_map(Value::as_str)
                .map(str::to_owned)
                .collect(),
            _ => BTreeSet::new(),
        }
    };
    match scope.map(words) {
        Some(s) if !s.is_empty() => s,
        _ => scp.map(words).unwrap_or_default(),
    }
}

/// Groups from the groups claim: a list of strings (others left out), or one string.
fn groups_of(v: Option<&Value>) -> BTreeSet<String> {
    match v {
        Some(Value::String(s)) if !s.is_empty() => BTreeSet::from([s.clone()]),
        Some(Value::Array(a)) => a
            .iter()
            .filter_map(Value::as_str)
            .filter(|s| !s.is_empty())
            .map(str::to_owned)
            .collect(),
        _ => BTreeSet::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn scopes_and_groups_are_read_in_their_shapes() {
        let set = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<BTreeSet<_>>();
        assert_eq!(
            scopes_of(Some(&json!("mcp tools")), None),
            set(&["mcp", "tools"])
        );
        assert_eq!(scopes_of(None, Some(&json!(["mcp", 3]))), set(&["mcp"]));
        assert_eq!(scopes_of(None, Some(&json!("a b"))), set(&["a", "b"]));
        assert_eq!(scopes_of(Some(&json!("")), Some(&json!("a"))), set(&["a"]));
        assert_eq!(scopes_of(None, None), set(&[]));
        assert_eq!(
            groups_of(Some(&json!(["eng", "", 1, "ops"]))),
            set(&["eng", "ops"])
        );
        assert_eq!(groups_of(Some(&json!("eng"))), set(&["eng"]));
        assert_eq!(groups_of(Some(&json!({"eng": true}))), set(&[]));
    }

    #[test]
    fn headers_are_read_from_jws_only() {
        let h = URL_SAFE_NO_PAD.encode(br#"{"alg":"RS256","kid":"k"}"#);
        assert_eq!(header(&h).unwrap()["kid"], "k");
        assert!(header("opaque-token").is_none());
        assert!(header(&URL_SAFE_NO_PAD.encode(b"[1]")).is_none());
    }
}
