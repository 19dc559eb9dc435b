//! The built-in issuer's signing keys and access tokens.
//!
//! Access tokens are ES256 JWTs with a `kid`. The first start generates a P-256 key and keeps
//! it in the database, so every replica and every restart signs and validates with the same
//! keys. Rotation makes a new key current; the old one keeps validating (and stays in
//! `/jwks.json`) until the tokens it signed have expired, then it is dropped. The other
//! replicas take a rotation over when they re-read the keys (with the revoked set, below),
//! or at once in a cluster, where the [`AuthFeed`] announces it.
//!
//! Revoked access tokens are refused by `jti`. Validation runs on every `/mcp` request, so it
//! reads an in-memory set, never the database nor Redis: the set is loaded at start, grows
//! with each revocation here (written to the database first), and is re-read from the
//! database every [`REVOCATION_REFRESH`] so that revocations made on another replica take
//! effect here too. In a cluster an [`AuthFeed`] carries each revocation to the other
//! replicas at once (they add it to their sets when they hear it, milliseconds later); while
//! a replica does not hear the feed, it re-reads the database every
//! [`REVOCATION_REFRESH_UNHEARD`] instead. Entries leave the set (and the database) once their
//! token has expired.

use std::collections::BTreeSet;
use std::sync::{Arc, RwLock};
use std::time::Duration;

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use dashmap::DashMap;
use jsonwebtoken::{Algorithm, DecodingKey, EncodingKey, Header, Validation};
use serde::{Deserialize, Serialize};

use super::shared::AuthFeed;
use super::store::{AuthStore, AuthStoreError, StoredKey};
use super::{LEEWAY, Principal, TokenError, TokenValidator, now_secs, random_token};

/// The claims of an access token.
#[derive(Debug, Serialize, Deserialize)]
struct Claims {
    iss: String,
    sub: String,
    aud: String,
    scope: String,
    client_id: String,
    exp: i64,
    iat: i64,
    nbf: i64,
    jti: String,
    /// The subject's groups, when it has any (for plugins' `allow_groups`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    groups: Vec<String>,
}

struct SigningKey {
    kid: String,
    encoding: EncodingKey,
    decoding: DecodingKey,
    jwk: serde_json::Value,
    retired_at: Option<i64>,
}

struct Keys {
    current: Arc<SigningKey>,
    /// Every key still validating, the current one included.
    all: Vec<Arc<SigningKey>>,
}

/// Signs and validates the built-in issuer's access tokens.
pub struct KeyRing {
    store: Arc<dyn AuthStore>,
    issuer: String,
    audience: String,
    access_ttl: Duration,
    keys: RwLock<Keys>,
    /// Serializes rotations and re-reads of the keys, so a re-read never puts back the keys
    /// from before a rotation made here meanwhile.
    changing: tokio::sync::Mutex<()>,
    /// Revoked access tokens by `jti`, with their expiry (kept only until then).
    revoked: DashMap<String, i64>,
    /// Cluster mode: how the other replicas hear of revocations and rotations made here (and
    /// this one of theirs).
    feed: Option<Arc<dyn AuthFeed>>,
}

/// An access token's id and times, fixed before it is issued.
#[derive(Debug, Clone)]
pub struct Planned {
    pub jti: String,
    pub iat: i64,
    pub exp: i64,
}

/// How often the revoked set (and the keys) are re-read from the database: without an
/// [`AuthFeed`], the longest a revocation or a rotation made on one replica takes to hold on
/// another.
pub const REVOCATION_REFRESH: Duration = Duration::from_secs(10);

/// How often the revoked set is re-read while a cluster replica does not hear the
/// [`AuthFeed`] (its subscription is down): the longest a revocation made elsewhere
/// then takes to be enforced here.
pub const REVOCATION_REFRESH_UNHEARD: Duration = Duration::from_secs(1);

/// The most revocations announced in one message of the feed.
const ANNOUNCE_BATCH: usize = 100;

impl KeyRing {
    /// Loads the stored keys (dropping those whose tokens have all expired), generating the
    /// first one if there is none; revocations and rotations are announced on `feed`
    /// (cluster mode).
    pub async fn load(
        store: Arc<dyn AuthStore>,
        issuer: String,
        audience: String,
        access_ttl: Duration,
        feed: Option<Arc<dyn AuthFeed>>,
    ) -> Result<KeyRing, AuthStoreError> {
        let now = now_secs();
        let keep_after = retired_before(now, access_ttl);
        let mut all = Vec::new();
        for k in store.keys().await? {
            if k.retired_at.is_some_and(|r| r < keep_after) {
                store.delete_key(&k.kid).await?;
                continue;
            }
            all.push(Arc::new(signing_key(&k).map_err(|e| {
                AuthStoreError::Corrupt(format!("key {}: {e}", k.kid))
            })?));
        }
        let current = match all.iter().rev().find(|k| k.retired_at.is_none()) {
            Some(k) => k.clone(),
            None => {
                let k = Arc::new(generate(&*store).await?);
                tracing::info!(kid = %k.kid, "generated a signing key for access tokens");
                all.push(k.clone());
                k
            }
        };
        let ring = KeyRing {
            store,
            issuer,
            audience,
            access_ttl,
            keys: RwLock::new(Keys { current, all }),
            changing: tokio::sync::Mutex::new(()),
            revoked: DashMap::new(),
            feed,
        };
        ring.refresh_revocations().await?;
        Ok(ring)
    }

    /// Re-reads the revoked access tokens from the database (others' revocations), and forgets
    /// those whose tokens have expired.
    pub async fn refresh_revocations(&self) -> Result<(), AuthStoreError> {
        let live_after = now_secs() - LEEWAY.as_secs() as i64;
        for (jti, exp) in self.store.revocations(live_after).await? {
            self.revoked.insert(jti, exp);
        }
        self.revoked.retain(|_, exp| *exp >= live_after);
        Ok(())
    }

    /// How long until the revoked set should be re-read from the database: sooner while the
    /// others' announcements do not reach this replica.
    pub fn revocation_refresh(&self) -> Duration {
        match &self.feed {
            Some(feed) if !feed.listening() => REVOCATION_REFRESH_UNHEARD,
            _ => REVOCATION_REFRESH,
        }
    }

    /// Refuses the access tokens `revoked` (`jti`, expiry) from now on: each written to the
    /// database, then refused here at once, then announced to the other replicas (which
    /// refuse them as soon as they hear it, or at their next re-read of the database).
    pub async fn revoke_jtis(&self, revoked: &[(String, i64)]) -> Result<(), AuthStoreError> {
        for (jti, exp) in revoked {
            self.store.add_revocation(jti, *exp).await?;
            self.revoked.insert(jti.clone(), *exp);
        }
        if let Some(feed) = &self.feed {
            for batch in revoked.chunks(ANNOUNCE_BATCH) {
                feed.announce_revoked(batch).await;
            }
        }
        Ok(())
    }

    /// Refuses the access token `jti` (which expires at `exp`) from now on
    /// ([`KeyRing::revoke_jtis`]).
    pub async fn revoke_jti(&self, jti: &str, exp: i64) -> Result<(), AuthStoreError> {
        self.revoke_jtis(&[(jti.to_owned(), exp)]).await
    }

    /// Revocations another replica announced (already in the database): refused here from
    /// now on. An expiry later than any token of this issuer could have is cut to that, so a
    /// bad announcement cannot keep an entry forever; entries already expired are skipped.
    pub fn revoked_elsewhere(&self, revoked: &[(String, i64)]) {
        let now = now_secs();
        let live_after = now - LEEWAY.as_secs() as i64;
        let latest = now + self.access_ttl.as_secs() as i64 + LEEWAY.as_secs() as i64;
        for (jti, exp) in revoked {
            if *exp >= live_after {
                self.revoked.insert(jti.clone(), (*exp).min(latest));
            }
        }
    }

    /// Whether the access token `jti` is refused here.
    pub fn is_revoked(&self, jti: &str) -> bool {
        self.revoked.contains_key(jti)
    }

    /// Makes a new key current. The previous one keeps validating until its tokens expire.
    pub async fn rotate(&self) -> Result<String, AuthStoreError> {
        let changing = self.changing.lock().await;
        let old = self.keys.read().expect("keys lock").current.kid.clone();
        let new = Arc::new(generate(&*self.store).await?);
        let now = now_secs();
        self.store.retire_key(&old, now).await?;
        {
            let mut keys = self.keys.write().expect("keys lock");
            let keep_after = retired_before(now, self.access_ttl);
            keys.all = keys
                .all
                .iter()
                .filter(|k| k.retired_at.is_none_or(|r| r >= keep_after))
                .map(|k| {
                    if k.kid == old {
                        Arc::new(SigningKey {
                            kid: k.kid.clone(),
                            encoding: k.encoding.clone(),
                            decoding: k.decoding.clone(),
                            jwk: k.jwk.clone(),
                            retired_at: Some(now),
                        })
                    } else {
                        k.clone()
                    }
                })
                .collect();
            keys.all.push(new.clone());
            keys.current = new.clone();
        }
        drop(changing);
        tracing::info!(kid = %new.kid, retired = %old, "signing key rotated");
        if let Some(feed) = &self.feed {
            feed.announce_keys().await;
        }
        Ok(new.kid.clone())
    }

    /// Re-reads the signing keys from the database, taking over a rotation made on another
    /// replica: its new key validates here, and signs here, from now on. Keys already held
    /// are kept as they are (a key is parsed once); keys whose tokens have all expired are
    /// left out. With no current key in the database (a rotation half done), nothing changes.
    pub async fn reload_keys(&self) -> Result<(), AuthStoreError> {
        let _changing = self.changing.lock().await;
        let stored = self.store.keys().await?;
        let keep_after = retired_before(now_secs(), self.access_ttl);
        let held = self.keys.read().expect("keys lock").all.clone();
        let mut all = Vec::new();
        for k in stored
            .iter()
            .filter(|k| k.retired_at.is_none_or(|r| r >= keep_after))
        {
            let key = match held.iter().find(|h| h.kid == k.kid) {
                Some(h) if h.retired_at == k.retired_at => h.clone(),
                _ => Arc::new(
                    signing_key(k)
                        .map_err(|e| AuthStoreError::Corrupt(format!("key {}: {e}", k.kid)))?,
                ),
            };
            all.push(key);
        }
        let Some(current) = all.iter().rev().find(|k| k.retired_at.is_none()).cloned() else {
            return Ok(());
        };
        let mut keys = self.keys.write().expect("keys lock");
        if keys.current.kid != current.kid {
            tracing::info!(kid = %current.kid, "signing key rotated on another replica: taken over");
        }
        *keys = Keys { current, all };
        Ok(())
    }

    /// A signed access token for `subject` and the seconds it lives.
    pub fn issue(
        &self,
        subject: &str,
        client_id: &str,
        scopes: &BTreeSet<String>,
    ) -> (String, u64) {
        self.issue_as(&self.plan(), subject, client_id, scopes, &[])
    }

    /// The id and times of an access token about to be issued, to be recorded first (what
    /// a grant produced, to revoke it with the grant).
    pub fn plan(&self) -> Planned {
        let iat = now_secs();
        Planned {
            jti: random_token(),
            iat,
            exp: iat + self.access_ttl.as_secs() as i64,
        }
    }

    /// [`KeyRing::issue`] with the id and times planned, for a subject in `groups`.
    pub fn issue_as(
        &self,
        planned: &Planned,
        subject: &str,
        client_id: &str,
        scopes: &BTreeSet<String>,
        groups: &[String],
    ) -> (String, u64) {
        let claims = Claims {
            iss: self.issuer.clone(),
            sub: subject.to_owned(),
            aud: self.audience.clone(),
            scope: scopes.iter().cloned().collect::<Vec<_>>().join(" "),
            client_id: client_id.to_owned(),
            exp: planned.exp,
            iat: planned.iat,
            nbf: planned.iat,
            jti: planned.jti.clone(),
            groups: groups.to_vec(),
        };
        let key = self.keys.read().expect("keys lock").current.clone();
        let mut header = Header::new(Algorithm::ES256);
        header.kid = Some(key.kid.clone());
        header.typ = Some("at+jwt".into());
        let token = jsonwebtoken::encode(&header, &claims, &key.encoding)
            .expect("an ES256 key signs any claims");
        (token, self.access_ttl.as_secs())
    }

    /// Refuses an access token from now on (RFC 7009), until it would have expired anyway.
    /// False when it is not a valid token of ours (nothing to revoke).
    pub async fn revoke_access(&self, token: &str) -> Result<bool, AuthStoreError> {
        match self.claims(token) {
            Ok(c) => self.revoke_jti(&c.jti, c.exp).await.map(|()| true),
            Err(_) => Ok(false),
        }
    }

    /// `/jwks.json`: every key still validating.
    pub fn jwks(&self) -> serde_json::Value {
        let keys = self.keys.read().expect("keys lock");
        serde_json::json!({"keys": keys.all.iter().map(|k| k.jwk.clone()).collect::<Vec<_>>()})
    }

    fn claims(&self, token: &str) -> Result<Claims, TokenError> {
        let header =
            jsonwebtoken::decode_header(token).map_err(|e| TokenError::Malformed(e.to_string()))?;
        if header.alg != Algorithm::ES256 {
            return Err(TokenError::Malformed(format!(
                "algorithm {:?} is not accepted",
                header.alg
            )));
        }
        let kid = header.kid.ok_or(TokenError::UnknownKey)?;
        let key = {
            let keys = self.keys.read().expect("keys lock");
            keys.all
                .iter()
                .find(|k| k.kid == kid)
                .cloned()
                .ok_or(TokenError::UnknownKey)?
        };
        let mut v = Validation::new(Algorithm::ES256);
        v.leeway = LEEWAY.as_secs();
        v.validate_nbf = true;
        v.set_issuer(&[&self.issuer]);
        v.set_audience(&[&self.audience]);
        v.set_required_spec_claims(&["exp", "iat", "nbf", "iss", "aud", "sub"]);
        use jsonwebtoken::errors::ErrorKind;
        jsonwebtoken::decode::<Claims>(token, &key.decoding, &v)
            .map(|d| d.claims)
            .map_err(|e| match e.kind() {
                ErrorKind::ExpiredSignature => TokenError::Expired,
                ErrorKind::ImmatureSignature => TokenError::NotYetValid,
                ErrorKind::InvalidIssuer => TokenError::WrongIssuer,
                ErrorKind::InvalidAudience => TokenError::WrongAudience,
                ErrorKind::InvalidSignature => TokenError::BadSignature,
                _ => TokenError::Malformed(e.to_string()),
            })
    }
}

impl TokenValidator for KeyRing {
    fn validate(&self, token: &str) -> Result<Principal, TokenError> {
        let c = self.claims(token)?;
        if self.is_revoked(&c.jti) {
            return Err(TokenError::Revoked);
        }
        Ok(Principal {
            subject: c.sub,
            client_id: c.client_id,
            scopes: c.scope.split_whitespace().map(str::to_owned).collect(),
            groups: c.groups.into_iter().collect(),
            token: None,
        })
    }
}

/// A key retired before this time signed no token that is still valid: it can go.
fn retired_before(now: i64, access_ttl: Duration) -> i64 {
    now - access_ttl.as_secs() as i64 - LEEWAY.as_secs() as i64
}

/// A new P-256 key, stored.
async fn generate(store: &dyn AuthStore) -> Result<SigningKey, AuthStoreError> {
    let secret = loop {
        let bytes: [u8; 32] = rand::random();
        if let Ok(k) = p256::SecretKey::from_slice(&bytes) {
            break k;
        }
    };
    use p256::pkcs8::EncodePrivateKey;
    let der = secret
        .to_pkcs8_der()
        .map_err(|e| AuthStoreError::Corrupt(format!("cannot encode a new key: {e}")))?;
    let stored = StoredKey {
        kid: random_token()[..16].to_owned(),
        private_der: URL_SAFE_NO_PAD.encode(der.as_bytes()),
        created_at: now_secs(),
        retired_at: None,
    };
    store.add_key(&stored).await?;
    signing_key(&stored).map_err(AuthStoreError::Corrupt)
}

fn signing_key(k: &StoredKey) -> Result<SigningKey, String> {
    use p256::elliptic_curve::sec1::ToEncodedPoint;
    use p256::pkcs8::DecodePrivateKey;
    let der = URL_SAFE_NO_PAD
        .decode(&k.private_der)
        .map_err(|e| e.to_string())?;
    let secret = p256::SecretKey::from_pkcs8_der(&der).map_err(|e| e.to_string())?;
    let point = secret.public_key().to_encoded_point(false);
    let (x, y) = match (point.x(), point.y()) {
        (Some(x), Some(y)) => (URL_SAFE_NO_PAD.encode(x), URL_SAFE_NO_PAD.encode(y)),
        _ => return Err("the key has no affine coordinates".into()),
    };
    Ok(SigningKey {
        kid: k.kid.clone(),
        encoding: EncodingKey::from_ec_der(&der),
        decoding: DecodingKey::from_ec_components(&x, &y).map_err(|e| e.to_string())?,
        jwk: serde_json::json!({"kty": "EC", "crv": "P-256", "x": x, "y": y, "kid": k.kid, "alg": "ES256", "use": "sig"}),
        retired_at: k.retired_at,
    })
}
