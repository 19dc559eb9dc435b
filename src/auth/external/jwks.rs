//! The external issuer's signing keys: found through its metadata (RFC 8414, or OpenID
//! discovery; the metadata's `issuer` must be the one configured), fetched from its
//! `jwks_uri`, and kept in memory.
//!
//! Validation reads the keys in memory and waits for the network only when it must: the set
//! is older than its lifetime (the answer's `Cache-Control: max-age`, bounded to
//! [`MIN_LIFETIME`]..[`MAX_LIFETIME`], [`DEFAULT_LIFETIME`] when it says nothing), or a token
//! names a `kid` the set does not have (the issuer rotated its keys). Either fetches again at
//! most once per `jwks_refresh_min`, whatever the number of tokens asking, and one fetch at a
//! time; a failed fetch keeps the keys held (logged, retried after the same interval).
//!
//! Each key is pinned to the algorithms it may verify: the JWK's `alg` when it names one,
//! else those of its type and curve (RSA: RS* and PS*; EC P-256: ES256, P-384: ES384;
//! Ed25519: EdDSA). Symmetric keys (`oct`), encryption keys and keys of other types are never
//! taken, so no token can have a public key used as an HMAC secret.

use std::sync::RwLock;
use std::time::{Duration, Instant};

use jsonwebtoken::jwk::{AlgorithmParameters, EllipticCurve, Jwk, KeyOperations, PublicKeyUse};
use jsonwebtoken::{Algorithm, DecodingKey};
use serde::Deserialize;

use super::fetch::{FetchError, Http};
use crate::auth::TokenError;

/// Metadata and key sets larger than this are refused.
const MAX_DOCUMENT_BYTES: usize = 512 * 1024;
/// Key sets whose answer says nothing about caching are fetched again after this long.
pub const DEFAULT_LIFETIME: Duration = Duration::from_secs(3600);
/// Bounds on what `Cache-Control` may ask for.
pub const MIN_LIFETIME: Duration = Duration::from_secs(60);
pub const MAX_LIFETIME: Duration = Duration::from_secs(86_400);

/// A verification key of the issuer.
#[derive(Clone)]
struct Key {
    kid: Option<String>,
    algorithms: Vec<Algorithm>,
    decoding: DecodingKey,
}

#[derive(Default)]
struct State {
    /// From the metadata; `None` until discovery has succeeded.
    jwks_uri: Option<url::Url>,
    keys: Vec<Key>,
    /// When the keys held were fetched, and until when they are fresh; `None`: never.
    fetched: Option<(Instant, Instant)>,
    /// The last fetch (or attempt), to rate-limit them.
    attempted: Option<Instant>,
    /// Why the last attempt failed, while it did.
    failure: Option<String>,
}

/// The issuer's keys, fetched when needed.
pub struct KeySet {
    issuer: String,
    http: Http,
    refresh_min: Duration,
    state: RwLock<State>,
    /// One fetch at a time; the others wait for its result.
    fetching: tokio::sync::Mutex<()>,
}

/// What validation found for a token's `kid`.
enum Found {
    Key(DecodingKey),
    WrongAlgorithm(Vec<Algorithm>),
    Unknown,
}

impl KeySet {
    pub fn new(issuer: String, http: Http, refresh_min: Duration) -> KeySet {
        KeySet {
            issuer,
            http,
            refresh_min,
            state: RwLock::new(State::default()),
            fetching: tokio::sync::Mutex::new(()),
        }
    }

    /// Discovers the issuer and fetches its keys once (at start); a failure is logged, and
    /// the first token to need the keys tries again.
    pub async fn load(&self) {
        self.fetch(None).await;
    }

    /// The key that verifies a token with this `kid` and `alg`.
    pub async fn key(&self, kid: Option<&str>, alg: Algorithm) -> Result<DecodingKey, TokenError> {
        let now = Instant::now();
        let (found, stale, attempted) = {
            let s = self.state.read().expect("key set lock");
            let stale = s.fetched.is_none_or(|(_, until)| now >= until);
            (find(&s.keys, kid, alg), stale, s.attempted)
        };
        let may_fetch = attempted.is_none_or(|t| now.duration_since(t) >= self.refresh_min);
        let found = match found {
            Found::Key(k) if !stale => return Ok(k),
            // A key the set does not have: the issuer may have rotated.
            Found::Unknown | Found::Key(_) if may_fetch => {
                self.fetch(attempted).await;
                let s = self.state.read().expect("key set lock");
                find(&s.keys, kid, alg)
            }
            found => found,
        };
        match found {
            Found::Key(k) => Ok(k),
            Found::WrongAlgorithm(allowed) => Err(TokenError::BadAlgorithm(format!(
                "{alg:?} (its key verifies {})",
                allowed
                    .iter()
                    .map(|a| format!("{a:?}"))
                    .collect::<Vec<_>>()
                    .join(", ")
            ))),
            Found::Unknown => {
                let s = self.state.read().expect("key set lock");
                match (&s.fetched, &s.failure) {
                    (None, Some(why)) => Err(TokenError::Unavailable(format!(
                        "the authorization server's keys cannot be fetched: {why}"
                    ))),
                    _ => Err(TokenError::UnknownKey),
                }
            }
        }
    }

    /// Fetches the keys (discovering the issuer first if needed), unless another fetch
    /// happened since `seen` (the attempt the caller saw) or one happened less than
    /// `refresh_min` ago.
    async fn fetch(&self, seen: Option<Instant>) {
        let _one = self.fetching.lock().await;
        let jwks_uri = {
            let s = self.state.read().expect("key set lock");
            if s.attempted != seen || s.attempted.is_some_and(|t| t.elapsed() < self.refresh_min) {
                return;
            }
            s.jwks_uri.clone()
        };
        self.state.write().expect("key set lock").attempted = Some(Instant::now());
        let result = match jwks_uri {
            Some(u) => Ok(u),
            None => self.discover().await,
        };
        let result = match result {
            Ok(uri) => self.fetch_keys(&uri).await.map(|k| (uri, k)),
            Err(e) => Err(e),
        };
        let mut s = self.state.write().expect("key set lock");
        match result {
            Ok((uri, (keys, lifetime))) => {
                tracing::info!(
                    issuer = %self.issuer,
                    keys = keys.len(),
                    "fetched the authorization server's signing keys from {uri}"
                );
                let now = Instant::now();
                s.keys = keys;
                s.fetched = Some((now, now + lifetime));
                s.jwks_uri = Some(uri);
                s.failure = None;
            }
            Err(why) => {
                tracing::warn!(
                    issuer = %self.issuer,
                    "cannot fetch the authorization server's signing keys (keeping {} held; next try in {}s at the earliest): {why}",
                    s.keys.len(),
                    self.refresh_min.as_secs()
                );
                // A key set URL that failed is looked up again next time.
                s.jwks_uri = None;
                s.failure = Some(why);
            }
        }
    }

    /// The issuer's `jwks_uri`, from the first metadata document found.
    async fn discover(&self) -> Result<url::Url, String> {
        #[derive(Deserialize)]
        struct Metadata {
            issuer: String,
            jwks_uri: Option<String>,
        }
        let (url, meta): (_, Metadata) =
            first_metadata(&self.http, &self.issuer, MAX_DOCUMENT_BYTES).await?;
        // RFC 8414 §3.3: metadata naming another issuer must not be used.
        if meta.issuer != self.issuer {
            return Err(format!(
                "{url} names the issuer `{}`, not `{}` (auth.issuer must be exactly the issuer the server names)",
                meta.issuer, self.issuer
            ));
        }
        let Some(uri) = meta.jwks_uri else {
            return Err(format!("{url} names no jwks_uri"));
        };
        let uri = url::Url::parse(&uri).map_err(|e| format!("{url}: jwks_uri: {e}"))?;
        let loopback = uri
            .host_str()
            .is_some_and(|h| h == "localhost" || h == "127.0.0.1" || h == "[::1]");
        if uri.scheme() != "https" && !(uri.scheme() == "http" && loopback) {
            return Err(format!("{url}: jwks_uri {uri} is not https"));
        }
        Ok(uri)
    }

    async fn fetch_keys(&self, uri: &url::Url) -> Result<(Vec<Key>, Duration), String> {
        #[derive(Deserialize)]
        struct Set {
            keys: Vec<serde_json::Value>,
        }
        let (set, lifetime): (Set, _) = self
            .http
            .get_json(uri, MAX_DOCUMENT_BYTES)
            .await
            .map_err(|e| e.to_string())?;
        let keys: Vec<Key> = set.keys.into_iter().filter_map(usable).collect();
        if keys.is_empty() {
            return Err(format!("{uri} holds no signing key this gateway can use"));
        }
        let lifetime = lifetime.bounded(
            DEFAULT_LIFETIME,
            MIN_LIFETIME.max(self.refresh_min),
            MAX_LIFETIME,
        );
        Ok((keys, lifetime))
    }
}

/// The first of the issuer's metadata documents ([`metadata_urls`]) that can be fetched and
/// read as `T` (at most `limit` bytes), and where it was; a host that does not answer is not
/// asked for the next one. Whether it names the issuer is the caller's to check.
pub async fn first_metadata<T: serde::de::DeserializeOwned>(
    http: &Http,
    issuer: &str,
    limit: usize,
) -> Result<(url::Url, T), String> {
    let mut failures = Vec::new();
    for url in metadata_urls(issuer)? {
        match http.get_json(&url, limit).await {
            Ok((doc, _)) => return Ok((url, doc)),
            Err(e) => {
                // The next URL is on the same host: no use trying it when the host did not
                // answer.
                let stop = matches!(e, FetchError::Transport { .. });
                failures.push(e.to_string());
                if stop {
                    break;
                }
            }
        }
    }
    Err(format!("no metadata found: {}", failures.join("; ")))
}

/// Where the issuer's metadata may be, in order: RFC 8414's well-known URI (inserted before
/// the issuer's path), then OpenID discovery's (inserted, then appended, as the MCP
/// authorization spec lists them).
pub fn metadata_urls(issuer: &str) -> Result<Vec<url::Url>, String> {
    let base = url::Url::parse(issuer).map_err(|e| format!("auth.issuer: {e}"))?;
    let path = base.path().trim_end_matches('/').to_owned();
    let at = |p: String| {
        let mut u = base.clone();
        u.set_path(&p);
        u
    };
    Ok(if path.is_empty() {
        vec![
            at("/.well-known/oauth-authorization-server".into()),
            at("/.well-known/openid-configuration".into()),
        ]
    } else {
        vec![
            at(format!("/.well-known/oauth-authorization-server{path}")),
            at(format!("/.well-known/openid-configuration{path}")),
            at(format!("{path}/.well-known/openid-configuration")),
        ]
    })
}

/// The key for `kid` and `alg`: a token without a `kid` may use the only key that allows
/// its algorithm.
fn find(keys: &[Key], kid: Option<&str>, alg: Algorithm) -> Found {
    let key = match kid {
        Some(kid) => keys.iter().find(|k| k.kid.as_deref() == Some(kid)),
        None => {
            let mut fitting = keys.iter().filter(|k| k.algorithms.contains(&alg));
            match (fitting.next(), fitting.next()) {
                (Some(k), None) => Some(k),
                _ => None,
            }
        }
    };
    match key {
        None => Found::Unknown,
        Some(k) if k.algorithms.contains(&alg) => Found::Key(k.decoding.clone()),
        Some(k) => Found::WrongAlgorithm(k.algorithms.clone()),
    }
}

/// A JWK as a verification key, if it is one: for signatures, of a type this gateway
/// verifies, its algorithms pinned.
fn usable(value: serde_json::Value) -> Option<Key> {
    let jwk: Jwk = serde_json::from_value(value).ok()?;
    let c = &jwk.common;
    if c.public_key_use
        .as_ref()
        .is_some_and(|u| *u != PublicKeyUse::Signature)
    {
        return None;
    }
    if c.key_operations
        .as_ref()
        .is_some_and(|ops| !ops.contains(&KeyOperations::Verify))
    {
        return None;
    }
    let family: &[Algorithm] = match &jwk.algorithm {
        AlgorithmParameters::RSA(_) => &[
            Algorithm::RS256,
            Algorithm::RS384,
            Algorithm::RS512,
            Algorithm::PS256,
            Algorithm::PS384,
            Algorithm::PS512,
        ],
        AlgorithmParameters::EllipticCurve(p) => match p.curve {
            EllipticCurve::P256 => &[Algorithm::ES256],
            EllipticCurve::P384 => &[Algorithm::ES384],
            _ => return None,
        },
        AlgorithmParameters::OctetKeyPair(p) if p.curve == EllipticCurve::Ed25519 => {
            &[Algorithm::EdDSA]
        }
        // Symmetric keys and anything else: never.
        _ => return None,
    };
    let algorithms = match &c.key_algorithm {
        None => family.to_vec(),
        Some(named) => {
            let alg: Algorithm = named.to_string().parse().ok()?;
            if !family.contains(&alg) {
                return None;
            }
            vec![alg]
        }
    };
    let decoding = DecodingKey::from_jwk(&jwk).ok()?;
    Some(Key {
        kid: c.key_id.clone(),
        algorithms,
        decoding,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn metadata_is_looked_for_where_the_specs_put_it() {
        let urls = |i: &str| {
            metadata_urls(i)
                .unwrap()
                .iter()
                .map(url::Url::to_string)
                .collect::<Vec<_>>()
        };
        assert_eq!(
            urls("https://idp.example.com"),
            [
                "https://idp.example.com/.well-known/oauth-authorization-server",
                "https://idp.example.com/.well-known/openid-configuration"
            ]
        );
        assert_eq!(
            urls("https://idp.example.com/realms/acme/"),
            [
                "https://idp.example.com/.well-known/oauth-authorization-server/realms/acme",
                "https://idp.example.com/.well-known/openid-configuration/realms/acme",
                "https://idp.example.com/realms/acme/.well-known/openid-configuration"
            ]
        );
    }

    #[test]
    fn keys_are_pinned_to_their_algorithms() {
        let ec = json!({"kty": "EC", "crv": "P-256", "kid": "e",
            "x": "f83OJ3D2xF1Bg8vub9tLe1gHMzV76e8Tus9uPHvRVEU",
            "y": "x_FEzRu9m36HLN_tue659LNpXW6pCyStikYjKIWI5a0"});
        let rsa = json!({"kty": "RSA", "kid": "r", "e": "AQAB",
            "n": "0vx7agoebGcQSuuPiLJXZptN9nndrQmbXEps2aiAFbWhM78LhWx4cbbfAAtVT86zwu1RK7aPFFxuhDR1L6tSoc_BJECPebWKRXjBZCiFV4n3oknjhMstn64tZ_2W-5JsGY4Hc5n9yBXArwl93lqt7_RN5w6Cf0h4QyQ5v-65YGjQR0_FDW2QvzqY368QQMicAtaSqzs8KJZgnYb9c7d0zgdAZHzu6qMQvRL5hajrn1n91CbOpbISD08qNLyrdkt-bFTWhAI4vMQFh6WeZu0fM4lFd2NcRwr3XPksINHaQ-G_xBniIqbw0Ls1jF44-csFCur-kEgU8awapJzKnqDKgw"});
        let keys: Vec<Key> = [
            ec.clone(),
            rsa.clone(),
            json!({"kty": "oct", "kid": "h", "k": "c2VjcmV0"}),
            {
                let mut k = rsa.clone();
                k["kid"] = json!("enc");
                k["use"] = json!("enc");
                k
            },
            {
                let mut k = rsa.clone();
                k["kid"] = json!("rs512");
                k["alg"] = json!("RS512");
                k
            },
            {
                let mut k = rsa.clone();
                k["kid"] = json!("mismatch");
                k["alg"] = json!("ES256");
                k
            },
        ]
        .into_iter()
        .filter_map(usable)
        .collect();
        let kids: Vec<_> = keys.iter().map(|k| k.kid.clone().unwrap()).collect();
        assert_eq!(
            kids,
            ["e", "r", "rs512"],
            "oct, enc and mismatched keys are left out"
        );
        assert!(matches!(
            find(&keys, Some("e"), Algorithm::ES256),
            Found::Key(_)
        ));
        assert!(matches!(
            find(&keys, Some("e"), Algorithm::RS256),
            Found::WrongAlgorithm(_)
        ));
        assert!(matches!(
            find(&keys, Some("r"), Algorithm::PS256),
            Found::Key(_)
        ));
        assert!(matches!(
            find(&keys, Some("rs512"), Algorithm::RS256),
            Found::WrongAlgorithm(_)
        ));
        assert!(matches!(
            find(&keys, Some("h"), Algorithm::HS256),
            Found::Unknown
        ));
        // Without a kid: only when one key fits.
        assert!(matches!(find(&keys, None, Algorithm::ES256), Found::Key(_)));
        assert!(matches!(
            find(&keys, None, Algorithm::RS512),
            Found::Unknown
        ));
    }

    /// A key set is kept as long as its answer's `Cache-Control` says (within the bounds),
    /// and fetched again, for a token whose key it holds, once that has passed; a fetch that
    /// then fails keeps the keys held.
    #[tokio::test]
    async fn keys_past_their_lifetime_are_fetched_again() {
        use std::sync::Arc;
        use std::sync::atomic::{AtomicUsize, Ordering};
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let issuer = format!("http://{}", listener.local_addr().unwrap());
        let fetches = Arc::new(AtomicUsize::new(0));
        // What the key set's answer says about caching, and whether it answers at all.
        let max_age = Arc::new(std::sync::Mutex::new(("max-age=7200", true)));
        let meta = json!({"issuer": issuer, "jwks_uri": format!("{issuer}/jwks")});
        let (f, m) = (fetches.clone(), max_age.clone());
        let app = axum::Router::new()
            .route(
                "/.well-known/oauth-authorization-server",
                axum::routing::get(move || async move { axum::Json(meta) }),
            )
            .route(
                "/jwks",
                axum::routing::get(move || {
                    f.fetch_add(1, Ordering::SeqCst);
                    let (cache, up) = *m.lock().unwrap();
                    async move {
                        let keys = json!({"keys": [{"kty": "EC", "crv": "P-256", "kid": "e",
                            "x": "f83OJ3D2xF1Bg8vub9tLe1gHMzV76e8Tus9uPHvRVEU",
                            "y": "x_FEzRu9m36HLN_tue659LNpXW6pCyStikYjKIWI5a0"}]});
                        let status = if up {
                            axum::http::StatusCode::OK
                        } else {
                            axum::http::StatusCode::SERVICE_UNAVAILABLE
                        };
                        (status, [("cache-control", cache)], axum::Json(keys))
                    }
                }),
            );
        tokio::spawn(async move { axum::serve(listener, app).await });
        let set = KeySet::new(issuer, Http::new(), Duration::from_secs(1));
        set.load().await;
        assert_eq!(fetches.load(Ordering::SeqCst), 1);
        let lifetime = |set: &KeySet| {
            let (at, until) = set.state.read().unwrap().fetched.unwrap();
            until - at
        };
        assert_eq!(lifetime(&set), Duration::from_secs(7200), "max-age is kept");
        // As if the lifetime and the refresh interval had passed.
        let age = |set: &KeySet| {
            let mut s = set.state.write().unwrap();
            let past = Instant::now() - Duration::from_secs(2);
            s.fetched = s.fetched.map(|(at, _)| (at, past));
            s.attempted = Some(past);
        };
        assert!(set.key(Some("e"), Algorithm::ES256).await.is_ok());
        assert_eq!(fetches.load(Ordering::SeqCst), 1, "fresh: not fetched");

        *max_age.lock().unwrap() = ("max-age=5", true);
        age(&set);
        assert!(set.key(Some("e"), Algorithm::ES256).await.is_ok());
        assert_eq!(fetches.load(Ordering::SeqCst), 2, "stale: fetched again");
        assert_eq!(lifetime(&set), MIN_LIFETIME, "a max-age below the floor");

        *max_age.lock().unwrap() = ("no-store", false);
        age(&set);
        assert!(
            set.key(Some("e"), Algorithm::ES256).await.is_ok(),
            "a failed fetch keeps the keys held"
        );
        assert_eq!(fetches.load(Ordering::SeqCst), 3);
        assert!(set.state.read().unwrap().failure.is_some());
        assert!(
            set.key(Some("e"), Algorithm::ES256).await.is_ok(),
            "and is not tried again within the refresh interval"
        );
        assert_eq!(fetches.load(Ordering::SeqCst), 3);
    }
}
