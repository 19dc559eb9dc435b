//! The provider's ID token (OpenID Connect Core §3.1.3.7): its signature by a key of the
//! provider's JWKS (asymmetric algorithms only, the key's type and `alg` fitting the token's),
//! `iss` the discovered issuer, `aud` the gateway's client id (and `azp` it when there are
//! several audiences), `exp`, `iat` and `nbf` within the leeway, and the `nonce` sent; then
//! its claims mapped to the gateway's [`Identity`] and the allow-lists applied.
//!
//! The keys are cached: fetched on first use, again when an hour old, and at once when a
//! token names a key not among them (a rotation), at most every [`REFETCH_AFTER`].

use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};

use jsonwebtoken::jwk::Jwk;
use jsonwebtoken::{Algorithm, DecodingKey, Validation};
use serde_json::{Map, Value};

use super::{Discovered, UpstreamError, get_json};
use crate::auth::{LEEWAY, constant_time_eq};
use crate::config::{SubjectClaim, UpstreamConfig};

/// The largest JWKS read.
const JWKS_LIMIT: usize = 512 * 1024;
/// Keys older than this are fetched again.
const KEYS_MAX_AGE: Duration = Duration::from_secs(3600);
/// The least time between two fetches for an unknown key.
pub const REFETCH_AFTER: Duration = Duration::from_secs(10);
/// The most groups kept of a token (the rest are dropped, with a warning).
const MAX_GROUPS: usize = 256;

/// One key of the provider's JWKS.
struct Key {
    kid: Option<String>,
    kty: String,
    alg: Option<String>,
    decoding: DecodingKey,
}

struct Keys {
    uri: String,
    keys: Vec<Arc<Key>>,
    fetched: Instant,
}

/// The provider's signing keys, as last fetched.
#[derive(Default)]
pub(super) struct KeyCache {
    keys: RwLock<Option<Arc<Keys>>>,
    /// One fetch at a time.
    fetching: tokio::sync::Mutex<()>,
}

/// Who signed in at the provider, as the gateway sees them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Identity {
    /// The gateway's subject for them (`upstream:<sub>`, or their verified email).
    pub subject: String,
    /// Their email address, when the provider says it is verified.
    pub email: Option<String>,
    pub name: Option<String>,
    pub groups: Vec<String>,
}

impl Identity {
    /// How the pages name them.
    pub fn shown(&self) -> String {
        match (&self.name, &self.email) {
            (Some(n), Some(e)) => format!("{n} ({e})"),
            (Some(n), None) => n.clone(),
            (None, Some(e)) => e.clone(),
            (None, None) => self.subject.clone(),
        }
    }
}

/// The algorithms an ID token may be signed with: asymmetric ones only (no `none`, no HMAC,
/// whose key would be the client secret or, worse, a public key).
fn accepted(alg: Algorithm) -> bool {
    use Algorithm::*;
    matches!(
        alg,
        RS256 | RS384 | RS512 | PS256 | PS384 | PS512 | ES256 | ES384 | EdDSA
    )
}

/// Whether a key of type `kty` (and `alg`, when the JWK names one) may check `alg`.
fn fits(key: &Key, alg: Algorithm) -> bool {
    use Algorithm::*;
    let family = match alg {
        RS256 | RS384 | RS512 | PS256 | PS384 | PS512 => "RSA",
        ES256 | ES384 => "EC",
        EdDSA => "OKP",
        _ => return false,
    };
    key.kty == family && key.alg.as_deref().is_none_or(|a| a == format!("{alg:?}"))
}

fn parse_keys(doc: &Value) -> Vec<Arc<Key>> {
    let Some(keys) = doc.get("keys").and_then(Value::as_array) else {
        return Vec::new();
    };
    keys.iter()
        .filter(|k| {
            k.get("use")
                .and_then(Value::as_str)
                .is_none_or(|u| u == "sig")
        })
        .filter_map(|k| {
            // Each key on its own: one of a kind not known here leaves the others usable.
            let jwk: Jwk = serde_json::from_value(k.clone()).ok()?;
            let decoding = DecodingKey::from_jwk(&jwk).ok()?;
            let text = |key: &str| k.get(key).and_then(Value::as_str).map(str::to_owned);
            Some(Arc::new(Key {
                kid: text("kid"),
                kty: text("kty")?,
                alg: text("alg"),
                decoding,
            }))
        })
        .collect()
}

impl KeyCache {
    fn current(&self, uri: &str) -> Option<Arc<Keys>> {
        self.keys
            .read()
            .expect("keys lock")
            .clone()
            .filter(|k| k.uri == uri && k.fetched.elapsed() < KEYS_MAX_AGE)
    }

    /// Fetches the keys again unless someone did since `seen` (or too recently to ask the
    /// provider again).
    async fn refetch(
        &self,
        http: &reqwest::Client,
        uri: &str,
        seen: Option<&Arc<Keys>>,
    ) -> Result<Arc<Keys>, UpstreamError> {
        let _one = self.fetching.lock().await;
        let now_held = self.keys.read().expect("keys lock").clone();
        if let Some(k) = now_held.filter(|k| k.uri == uri) {
            let newer = seen.is_none_or(|s| !Arc::ptr_eq(s, &k));
            if (newer && k.fetched.elapsed() < KEYS_MAX_AGE) || k.fetched.elapsed() < REFETCH_AFTER
            {
                return Ok(k);
            }
        }
        let doc = get_json(http, uri, JWKS_LIMIT).await?;
        let keys = Arc::new(Keys {
            uri: uri.to_owned(),
            keys: parse_keys(&doc),
            fetched: Instant::now(),
        });
        if keys.keys.is_empty() {
            return Err(UpstreamError::Provider(format!(
                "{uri}: no signing key the gateway can use"
            )));
        }
        *self.keys.write().expect("keys lock") = Some(keys.clone());
        Ok(keys)
    }

    /// Validates an ID token of the provider `d` for the client of `config`, sent with
    /// `nonce`: its claims.
    pub(super) async fn validate(
        &self,
        http: &reqwest::Client,
        d: &Discovered,
        config: &UpstreamConfig,
        token: &str,
        nonce: &str,
    ) -> Result<Map<String, Value>, UpstreamError> {
        let bad = |why: String| UpstreamError::IdToken(why);
        let header = jsonwebtoken::decode_header(token)
            .map_err(|e| bad(format!("it is not a signed JWT: {e}")))?;
        let alg = header.alg;
        if !accepted(alg) {
            return Err(bad(format!("algorithm {alg:?} is not accepted")));
        }
        if let Some(algs) = &d.id_token_algs
            && !algs.iter().any(|a| *a == format!("{alg:?}"))
        {
            return Err(bad(format!(
                "algorithm {alg:?} is not one the provider says it signs ID tokens with"
            )));
        }
        let pick = |keys: &Keys| -> Vec<Arc<Key>> {
            keys.keys
                .iter()
                .filter(|k| header.kid.is_none() || k.kid == header.kid)
                .filter(|k| fits(k, alg))
                .cloned()
                .collect()
        };
        let held = self.current(&d.jwks_uri);
        let mut candidates = held.as_deref().map(pick).unwrap_or_default();
        if candidates.is_empty() {
            let keys = self.refetch(http, &d.jwks_uri, held.as_ref()).await?;
            candidates = pick(&keys);
        }
        if candidates.is_empty() {
            return Err(bad(format!(
                "no key of the provider's JWKS fits it (kid {:?}, {alg:?})",
                header.kid
            )));
        }
        let mut v = Validation::new(alg);
        v.leeway = LEEWAY.as_secs();
        v.validate_nbf = true;
        v.set_issuer(&[&d.issuer]);
        v.set_audience(&[&config.client_id]);
        v.set_required_spec_claims(&["exp", "iat", "iss", "aud", "sub"]);
        let mut last = None;
        let mut claims = None;
        for key in &candidates {
            match jsonwebtoken::decode::<Map<String, Value>>(token, &key.decoding, &v) {
                Ok(data) => {
                    claims = Some(data.claims);
                    break;
                }
                Err(e) => last = Some(e),
            }
        }
        let Some(claims) = claims else {
            use jsonwebtoken::errors::ErrorKind;
            let why = match last.as_ref().map(|e| e.kind()) {
                Some(ErrorKind::ExpiredSignature) => "it has expired".into(),
                Some(ErrorKind::ImmatureSignature) => "it is not valid yet".into(),
                Some(ErrorKind::InvalidIssuer) => "it was issued by another issuer".into(),
                Some(ErrorKind::InvalidAudience) => "it is not for this client (aud)".into(),
                Some(ErrorKind::InvalidSignature) => "its signature is invalid".into(),
                Some(ErrorKind::MissingRequiredClaim(c)) => format!("it has no `{c}`"),
                _ => format!(
                    "it does not validate: {}",
                    last.map(|e| e.to_string()).unwrap_or_default()
                ),
            };
            return Err(bad(why));
        };
        match claims.get("nonce").and_then(Value::as_str) {
            Some(n) if constant_time_eq(n, nonce) => {}
            Some(_) => return Err(bad("its nonce is not the one sent".into())),
            None => return Err(bad("it has no nonce".into())),
        }
        let several = claims
            .get("aud")
            .and_then(Value::as_array)
            .is_some_and(|a| a.len() > 1);
        match claims.get("azp").and_then(Value::as_str) {
            Some(azp) if azp != config.client_id => {
                return Err(bad("it was issued to another client (azp)".into()));
            }
            None if several => {
                return Err(bad("it has several audiences and no azp".into()));
            }
            _ => {}
        }
        Ok(claims)
    }
}

/// The claim `name` of `claims`: the claim of that exact name, or else, for a dotted name, the
/// claim at that path (`realm_access.roles`).
fn claim<'c>(claims: &'c Map<String, Value>, name: &str) -> Option<&'c Value> {
    if let Some(v) = claims.get(name) {
        return Some(v);
    }
    let mut parts = name.split('.');
    let mut at = claims.get(parts.next()?)?;
    for part in parts {
        at = at.get(part)?;
    }
    Some(at)
}

/// Who the claims say signed in.
pub fn identity(
    config: &UpstreamConfig,
    claims: &Map<String, Value>,
) -> Result<Identity, UpstreamError> {
    let text = |name: &str| {
        claims
            .get(name)
            .and_then(Value::as_str)
            .filter(|s| !s.is_empty())
    };
    let Some(sub) = text("sub") else {
        return Err(UpstreamError::IdToken("it has no `sub`".into()));
    };
    let verified = match claims.get("email_verified") {
        Some(Value::Bool(b)) => *b,
        Some(Value::String(s)) => s == "true",
        _ => false,
    };
    let email = text("email")
        .filter(|_| verified)
        .map(str::to_ascii_lowercase);
    let name = text("name").or_else(|| text("preferred_username"));
    let mut groups: Vec<String> = match claim(claims, &config.groups_claim) {
        Some(Value::Array(a)) => a
            .iter()
            .filter_map(Value::as_str)
            .filter(|g| !g.is_empty() && g.len() <= 256)
            .map(str::to_owned)
            .collect(),
        Some(Value::String(g)) if !g.is_empty() => vec![g.clone()],
        _ => Vec::new(),
    };
    if groups.len() > MAX_GROUPS {
        tracing::warn!(
            sub,
            count = groups.len(),
            "the ID token lists more than {MAX_GROUPS} groups; the rest are left out"
        );
        groups.truncate(MAX_GROUPS);
    }
    let subject = match config.subject {
        _ if config.token_subject => sub.to_owned(),
        SubjectClaim::Sub => format!("upstream:{sub}"),
        SubjectClaim::Email => email.clone().ok_or_else(|| {
            UpstreamError::NotAllowed(
                "the identity provider gave no verified email address, which this gateway names people by".into(),
            )
        })?,
    };
    Ok(Identity {
        subject,
        email,
        name: name.map(str::to_owned),
        groups,
    })
}

/// Whether the allow-lists let `who` in: an allowed (verified) address, an address at an
/// allowed domain, or an allowed group; anyone when no list is set.
pub fn allowed(config: &UpstreamConfig, who: &Identity) -> Result<(), UpstreamError> {
    if !config.restricts() {
        return Ok(());
    }
    let by_email = who
        .email
        .as_ref()
        .is_some_and(|e| config.allowed_emails.iter().any(|a| a == e));
    let by_domain = who.email.as_ref().is_some_and(|e| {
        e.rsplit_once('@')
            .is_some_and(|(_, d)| config.allowed_domains.iter().any(|a| a == d))
    });
    let by_group = who
        .groups
        .iter()
        .any(|g| config.allowed_groups.iter().any(|a| a == g));
    if by_email || by_domain || by_group {
        return Ok(());
    }
    Err(UpstreamError::NotAllowed(format!(
        "{} is not among the people allowed to use this gateway",
        who.shown()
    )))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn config(extra: impl FnOnce(&mut UpstreamConfig)) -> UpstreamConfig {
        let mut c = UpstreamConfig {
            issuer: "https://id.example.com".into(),
            client_id: "gw".into(),
            client_secret: None,
            scopes: vec!["openid".into()],
            subject: SubjectClaim::Sub,
            groups_claim: "groups".into(),
            allowed_emails: vec![],
            allowed_domains: vec![],
            allowed_groups: vec![],
            display_name: "Id".into(),
            token_subject: false,
        };
        extra(&mut c);
        c
    }

    fn claims(v: Value) -> Map<String, Value> {
        v.as_object().unwrap().clone()
    }

    #[test]
    fn claims_map_to_the_subject_and_groups() {
        let c = config(|_| {});
        let who = identity(
            &c,
            &claims(json!({"sub": "42", "email": "Ann@Example.com", "email_verified": true, "name": "Ann", "groups": ["eng", 7, ""]})),
        )
        .unwrap();
        assert_eq!(who.subject, "upstream:42");
        assert_eq!(who.email.as_deref(), Some("ann@example.com"));
        assert_eq!(who.groups, ["eng"]);
        assert_eq!(who.shown(), "Ann (ann@example.com)");
        // An unverified address is not used, for the subject or the allow-lists.
        let by_email = config(|c| c.subject = SubjectClaim::Email);
        let unverified = claims(json!({"sub": "42", "email": "ann@example.com"}));
        assert!(matches!(
            identity(&by_email, &unverified),
            Err(UpstreamError::NotAllowed(_))
        ));
        let verified =
            claims(json!({"sub": "42", "email": "ann@example.com", "email_verified": "true"}));
        assert_eq!(
            identity(&by_email, &verified).unwrap().subject,
            "ann@example.com"
        );
        // A configured claim, by name or by path; a single string is one group.
        let roles = config(|c| c.groups_claim = "realm_access.roles".into());
        let who = identity(
            &roles,
            &claims(json!({"sub": "1", "realm_access": {"roles": ["admin"]}})),
        )
        .unwrap();
        assert_eq!(who.groups, ["admin"]);
        let url_claim = config(|c| c.groups_claim = "https://example.com/groups".into());
        let who = identity(
            &url_claim,
            &claims(json!({"sub": "1", "https://example.com/groups": "ops"})),
        )
        .unwrap();
        assert_eq!(who.groups, ["ops"]);
    }

    #[test]
    fn allow_lists_by_email_domain_or_group() {
        let who = |email: Option<&str>, groups: &[&str]| Identity {
            subject: "upstream:1".into(),
            email: email.map(str::to_owned),
            name: None,
            groups: groups.iter().map(|g| (*g).to_owned()).collect(),
        };
        let open = config(|_| {});
        assert!(allowed(&open, &who(None, &[])).is_ok());
        let c = config(|c| {
            c.allowed_emails = vec!["ann@x.org".into()];
            c.allowed_domains = vec!["example.com".into()];
            c.allowed_groups = vec!["eng".into()];
        });
        assert!(allowed(&c, &who(Some("ann@x.org"), &[])).is_ok());
        assert!(allowed(&c, &who(Some("bob@example.com"), &[])).is_ok());
        assert!(allowed(&c, &who(Some("bob@sub.example.com"), &[])).is_err());
        assert!(allowed(&c, &who(None, &["eng"])).is_ok());
        let e = allowed(&c, &who(Some("eve@evil.org"), &["ops"])).unwrap_err();
        assert!(e.to_string().contains("eve@evil.org"), "{e}");
    }

    /// A P-256 key: its encoding key and its public JWK with `kid`.
    fn es256_key(kid: &str) -> (jsonwebtoken::EncodingKey, Value) {
        use p256::elliptic_curve::sec1::ToEncodedPoint;
        use p256::pkcs8::EncodePrivateKey;
        let secret = loop {
            if let Ok(k) = p256::SecretKey::from_slice(&rand::random::<[u8; 32]>()) {
                break k;
            }
        };
        let der = secret.to_pkcs8_der().unwrap();
        let point = secret.public_key().to_encoded_point(false);
        let b64 =
            |b: &[u8]| base64::Engine::encode(&base64::engine::general_purpose::URL_SAFE_NO_PAD, b);
        let jwk = json!({"kty": "EC", "crv": "P-256", "kid": kid, "use": "sig", "alg": "ES256",
                         "x": b64(point.x().unwrap()), "y": b64(point.y().unwrap())});
        (jsonwebtoken::EncodingKey::from_ec_der(der.as_bytes()), jwk)
    }

    #[tokio::test]
    async fn id_tokens_are_checked_against_the_providers_keys_and_the_request() {
        use std::sync::atomic::{AtomicUsize, Ordering};
        let (key, jwk) = es256_key("k1");
        let (other_key, _) = es256_key("k1");
        let fetches = Arc::new(AtomicUsize::new(0));
        let served = (json!({"keys": [jwk, {"kty": "weird"}]}), fetches.clone());
        let app = axum::Router::new().route(
            "/jwks",
            axum::routing::get(move || {
                let (doc, fetches) = served.clone();
                fetches.fetch_add(1, Ordering::SeqCst);
                async move { axum::Json(doc) }
            }),
        );
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let jwks_uri = format!("http://{}/jwks", listener.local_addr().unwrap());
        tokio::spawn(async move { axum::serve(listener, app).await });
        let d = Discovered {
            issuer: "https://id.example.com".into(),
            authorization_endpoint: "https://id.example.com/auth".into(),
            token_endpoint: "https://id.example.com/token".into(),
            jwks_uri,
            token_auth_methods: None,
            id_token_algs: Some(vec!["ES256".into(), "RS256".into()]),
        };
        let c = config(|_| {});
        let now = crate::auth::now_secs();
        let base = json!({"iss": "https://id.example.com", "aud": "gw", "sub": "1",
                          "exp": now + 300, "iat": now, "nonce": "n-1"});
        let sign = |claims: &Value, kid: &str, key: &jsonwebtoken::EncodingKey| {
            let mut h = jsonwebtoken::Header::new(Algorithm::ES256);
            h.kid = Some(kid.into());
            jsonwebtoken::encode(&h, claims, key).unwrap()
        };
        let with = |k: &str, v: Value| {
            let mut c = base.clone();
            if v.is_null() {
                c.as_object_mut().unwrap().remove(k);
            } else {
                c[k] = v;
            }
            c
        };
        let cache = KeyCache::default();
        let http = reqwest::Client::new();
        let check = async |token: &str| cache.validate(&http, &d, &c, token, "n-1").await;
        let ok = check(&sign(&base, "k1", &key)).await.unwrap();
        assert_eq!(ok["sub"], "1");
        assert_eq!(
            fetches.load(Ordering::SeqCst),
            1,
            "fetched once, then cached"
        );
        assert!(check(&sign(&base, "k1", &key)).await.is_ok());
        assert_eq!(fetches.load(Ordering::SeqCst), 1);
        for (claims, says) in [
            (with("nonce", json!("n-2")), "nonce is not the one sent"),
            (with("nonce", Value::Null), "no nonce"),
            (with("aud", json!("someone-else")), "not for this client"),
            (
                with("iss", json!("https://evil.example.com")),
                "another issuer",
            ),
            (with("exp", json!(now - 3600)), "expired"),
            (
                with("aud", json!(["gw", "x"])),
                "several audiences and no azp",
            ),
            (with("azp", json!("x")), "another client"),
            (with("sub", Value::Null), "no `sub`"),
        ] {
            let e = check(&sign(&claims, "k1", &key)).await.unwrap_err();
            assert!(e.to_string().contains(says), "{claims}: {e}");
        }
        let e = check(&sign(&base, "k1", &other_key)).await.unwrap_err();
        assert!(e.to_string().contains("signature is invalid"), "{e}");
        // HMAC (keyed with anything at all) and `none` are never accepted.
        let hs = jsonwebtoken::encode(
            &jsonwebtoken::Header::new(Algorithm::HS256),
            &base,
            &jsonwebtoken::EncodingKey::from_secret(b"client-secret"),
        )
        .unwrap();
        let e = check(&hs).await.unwrap_err();
        assert!(e.to_string().contains("not accepted"), "{e}");
        let b64 = |v: &Value| {
            base64::Engine::encode(
                &base64::engine::general_purpose::URL_SAFE_NO_PAD,
                v.to_string(),
            )
        };
        let none = format!("{}.{}.", b64(&json!({"alg": "none"})), b64(&base));
        assert!(check(&none).await.is_err());
        // A key not seen yet: the keys are fetched again, once within REFETCH_AFTER.
        let fetched = fetches.load(Ordering::SeqCst);
        let e = check(&sign(&base, "k2", &key)).await.unwrap_err();
        assert!(e.to_string().contains("no key"), "{e}");
        assert_eq!(
            fetches.load(Ordering::SeqCst),
            fetched,
            "fetched < 10 s ago: not again"
        );
    }

    #[test]
    fn only_asymmetric_algorithms_with_fitting_keys() {
        assert!(accepted(Algorithm::RS256) && accepted(Algorithm::ES256));
        assert!(!accepted(Algorithm::HS256));
        let key = |kty: &str, alg: Option<&str>| Key {
            kid: None,
            kty: kty.into(),
            alg: alg.map(str::to_owned),
            decoding: DecodingKey::from_secret(b"x"),
        };
        assert!(fits(&key("RSA", None), Algorithm::RS256));
        assert!(fits(&key("RSA", Some("PS256")), Algorithm::PS256));
        assert!(!fits(&key("RSA", Some("RS256")), Algorithm::PS256));
        assert!(!fits(&key("EC", None), Algorithm::RS256));
        assert!(!fits(&key("oct", None), Algorithm::HS256));
    }
}
