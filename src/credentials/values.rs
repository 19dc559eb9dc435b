//! What a person's credential is worth when it is asked for: opened (and sealed again under
//! the current key when an older one sealed it), refreshed near its end (an OAuth token, one
//! replica at a time), exchanged afresh (a `token_exchange` credential), or found gone; and
//! what this replica handed out of each, so that the gateway can see a value change or go on
//! another replica and replace the instances started with it.

use std::sync::Arc;

use super::{
    Broker, Check, CredentialError, Event, Known, MAX_KNOWN, OAuthError, PROVIDER_TOKEN,
    REFRESH_CLAIM_MS, SealError, Stored, Value, now_ms,
};
use crate::config::CredentialKind;

/// How long after a failed refresh it is tried again.
const RETRY_MS: i64 = 30_000;

impl Broker {
    pub(super) fn remember(&self, row: &Stored, value: &Value) {
        let known = Known {
            connected_at_ms: row.connected_at_ms,
            expires_at_ms: row.expires_at_ms,
            // A token that can be refreshed, or obtained again (exchanged), is due near its
            // end; one that cannot (no refresh token) just ends.
            refresh_at_ms: match (&value.refresh_token, row.expires_at_ms) {
                (Some(_), Some(t)) => Some(t - refresh_margin(value.lifetime_ms)),
                (None, Some(t)) if self.renews_by_exchange(&row.name) => {
                    Some(t - refresh_margin(value.lifetime_ms))
                }
                _ => None,
            },
        };
        let mut map = self.known.lock().expect("known lock");
        if map.len() >= MAX_KNOWN {
            map.clear();
        }
        map.insert((row.subject.clone(), row.name.clone()), known);
    }

    /// A refresh that failed on the way is tried again in [`RETRY_MS`], not at every tick.
    fn back_off(&self, subject: &str, name: &str) {
        let mut map = self.known.lock().expect("known lock");
        if let Some(k) = map.get_mut(&(subject.to_owned(), name.to_owned())) {
            k.refresh_at_ms = Some(now_ms() + RETRY_MS);
        }
    }

    /// Whether `subject`'s credential `name`, as this replica handed it out, is near its
    /// end: an OAuth token is then refreshed by [`Broker::value`]; anything else that ends
    /// (an exchanged token) is replaced when its instances are idle.
    pub fn due(&self, subject: &str, name: &str) -> bool {
        let map = self.known.lock().expect("known lock");
        map.get(&(subject.to_owned(), name.to_owned()))
            .and_then(|k| k.refresh_at_ms)
            .is_some_and(|t| t <= now_ms())
    }

    /// Whether credential `name` is obtained again by token exchange.
    fn renews_by_exchange(&self, name: &str) -> bool {
        self.defined(name)
            .is_ok_and(|c| matches!(c.kind, CredentialKind::TokenExchange { .. }))
    }

    /// Whether credential `name` is renewed by the gateway alone ([`Broker::value`] refreshes
    /// it); otherwise a value near its end is replaced by starting its instances again.
    pub fn renews_itself(&self, name: &str) -> bool {
        self.defined(name)
            .is_ok_and(|c| matches!(c.kind, CredentialKind::OAuth2 { .. }))
    }

    /// `subject`'s credential `name` of kind `token_exchange`: `subject_token` (the caller's
    /// own access token) exchanged at the authorization server (RFC 8693) and kept until it
    /// ends. A refusal names the credential.
    pub async fn exchange(
        &self,
        subject: &str,
        name: &str,
        subject_token: &str,
    ) -> Result<Value, CredentialError> {
        let c = self.defined(name)?;
        let CredentialKind::TokenExchange {
            server,
            audience,
            resource,
        } = &c.kind
        else {
            return Err(CredentialError::NotOAuth(name.to_owned()));
        };
        let t = self
            .oauth
            .exchange(
                name,
                server,
                subject_token,
                audience.as_deref(),
                resource.as_deref(),
            )
            .await
            .map_err(|why| CredentialError::Upstream {
                name: name.to_owned(),
                why,
            })?;
        let value = Value {
            value: t.access_token,
            refresh_token: None,
            lifetime_ms: t.expires_in.map(super::millis),
        };
        let expires = t.expires_in.map(|d| super::expiry(now_ms(), d));
        let c = self.keep(subject, name, &value, expires, t.scope).await?;
        let stored = Stored {
            subject: subject.to_owned(),
            name: name.to_owned(),
            sealed: String::new(),
            connected_at_ms: c.connected_at_ms,
            expires_at_ms: c.expires_at_ms,
            scopes: None,
        };
        self.remember(&stored, &value);
        Ok(value)
    }

    /// The access token `subject` got from the `[auth.upstream]` provider at their latest
    /// sign-in there (built-in mode), while it is good: what a `token_exchange` credential
    /// exchanges for them.
    pub async fn provider_token(&self, subject: &str) -> Result<Option<String>, CredentialError> {
        let Some(row) = self.store.get(subject, PROVIDER_TOKEN).await? else {
            return Ok(None);
        };
        if row.expires_at_ms.is_some_and(|t| t <= now_ms()) {
            return Ok(None);
        }
        let opened = self
            .sealer
            .open(subject, PROVIDER_TOKEN, &row.sealed)
            .map_err(|why| CredentialError::Sealed {
                name: PROVIDER_TOKEN.into(),
                why,
            })?;
        Ok(String::from_utf8(opened.plain).ok())
    }

    pub(super) async fn keep_provider_token(
        &self,
        subject: &str,
        token: &crate::auth::upstream::ProviderToken,
    ) -> Result<(), CredentialError> {
        let sealed = self
            .sealer
            .seal(subject, PROVIDER_TOKEN, token.access_token.as_bytes())
            .map_err(|why| CredentialError::Sealed {
                name: PROVIDER_TOKEN.into(),
                why,
            })?;
        let now = now_ms();
        self.store
            .put(&Stored {
                subject: subject.to_owned(),
                name: PROVIDER_TOKEN.to_owned(),
                sealed,
                connected_at_ms: now,
                expires_at_ms: token.expires_in.map(|d| super::expiry(now, d)),
                scopes: None,
            })
            .await?;
        Ok(())
    }

    /// Whether `subject`'s credential `name` is still what this replica handed out.
    pub async fn check(&self, subject: &str, name: &str) -> Result<Check, CredentialError> {
        let key = (subject.to_owned(), name.to_owned());
        let row = self.store.get(subject, name).await?;
        let mut map = self.known.lock().expect("known lock");
        Ok(match row {
            None => {
                map.remove(&key);
                Check::Gone
            }
            Some(r) => match map.get_mut(&key) {
                Some(k)
                    if k.connected_at_ms != r.connected_at_ms
                        || k.expires_at_ms != r.expires_at_ms =>
                {
                    // Seen now: the next check compares with this.
                    k.connected_at_ms = r.connected_at_ms;
                    k.expires_at_ms = r.expires_at_ms;
                    k.refresh_at_ms = None;
                    Check::Changed
                }
                _ => Check::Same,
            },
        })
    }

    /// `subject`'s value of credential `name`, if they connected it (and it has not expired).
    /// A value sealed under a previous key is sealed again under the current one; an OAuth
    /// token near its end is refreshed first (one replica at a time), and one whose refresh
    /// the server refuses is forgotten (the caller asks the person again).
    pub async fn value(&self, subject: &str, name: &str) -> Result<Option<Value>, CredentialError> {
        let c = self.defined(name)?;
        let Some(row) = self.store.get(subject, name).await? else {
            return Ok(None);
        };
        let value = self.open_row(&row).await?;
        let now = now_ms();
        let mut expired = row.expires_at_ms.is_some_and(|t| t <= now);
        let ending = row
            .expires_at_ms
            .is_some_and(|until| until - now < refresh_margin(value.lifetime_ms));
        match &c.kind {
            CredentialKind::OAuth2 { server, .. } if ending => {
                if let Some(refresh) = &value.refresh_token {
                    return self.refresh(server, &row, &value, refresh).await;
                }
            }
            // An exchanged token near its end is exchanged again, from a newer caller's token.
            CredentialKind::TokenExchange { .. } if ending => expired = true,
            _ => {}
        }
        if expired {
            return Ok(None);
        }
        self.remember(&row, &value);
        Ok(Some(value))
    }

    /// Opens a stored row, sealing it again under the current key if it was sealed under an
    /// older one.
    pub(super) async fn open_row(&self, row: &Stored) -> Result<Value, CredentialError> {
        let (subject, name) = (row.subject.as_str(), row.name.as_str());
        let sealed = |why| CredentialError::Sealed {
            name: name.to_owned(),
            why,
        };
        let opened = self
            .sealer
            .open(subject, name, &row.sealed)
            .map_err(sealed)?;
        let value: Value =
            serde_json::from_slice(&opened.plain).map_err(|_| sealed(SealError::Invalid))?;
        if opened.stale {
            let again = Stored {
                sealed: self
                    .sealer
                    .seal(subject, name, &opened.plain)
                    .map_err(sealed)?,
                ..row.clone()
            };
            // Lost to a connection made meanwhile: that one is sealed under the current key.
            self.store.swap(&again, &row.sealed).await?;
        }
        Ok(value)
    }

    /// Refreshes `row`'s token at its server, or waits for the replica that is doing so.
    pub(super) async fn refresh(
        &self,
        server: &crate::config::OAuthServer,
        row: &Stored,
        value: &Value,
        refresh_token: &str,
    ) -> Result<Option<Value>, CredentialError> {
        let (subject, name) = (row.subject.as_str(), row.name.as_str());
        let now = now_ms();
        let expired = row.expires_at_ms.is_some_and(|t| t <= now);
        if !self
            .store
            .claim_refresh(subject, name, &row.sealed, now, now + REFRESH_CLAIM_MS)
            .await?
        {
            // Another call or replica refreshes it: its value is the one to use.
            for _ in 0..40 {
                tokio::time::sleep(std::time::Duration::from_millis(250)).await;
                match self.store.get(subject, name).await? {
                    None => return Ok(None),
                    Some(r) if r.sealed != row.sealed => {
                        let v = self.open_row(&r).await?;
                        self.remember(&r, &v);
                        return Ok(Some(v));
                    }
                    Some(_) => {}
                }
            }
            return Ok((!expired).then(|| value.clone()));
        }
        match self.oauth.refresh(name, server, refresh_token).await {
            Ok(t) => {
                let fresh = Value {
                    value: t.access_token,
                    // A server that does not rotate keeps the old one good.
                    refresh_token: t.refresh_token.or_else(|| Some(refresh_token.to_owned())),
                    lifetime_ms: t.expires_in.map(super::millis),
                };
                let expires = t.expires_in.map(|d| super::expiry(now_ms(), d));
                let scopes = t.scope.or_else(|| row.scopes.clone());
                let plain = serde_json::to_vec(&fresh).expect("serializable");
                let sealed = self.sealer.seal(subject, name, &plain).map_err(|why| {
                    CredentialError::Sealed {
                        name: name.to_owned(),
                        why,
                    }
                })?;
                let next = Stored {
                    sealed,
                    expires_at_ms: expires,
                    scopes,
                    ..row.clone()
                };
                // Only over the value refreshed: a disconnection, a new connection or another
                // refresh made meanwhile stands.
                if !self.store.swap(&next, &row.sealed).await? {
                    tracing::info!(
                        subject,
                        credential = name,
                        "the credential changed while it was refreshed; the change stands"
                    );
                    return match self.store.get(subject, name).await? {
                        Some(r) => self.open_row(&r).await.map(Some),
                        None => Ok(None),
                    };
                }
                self.remember(&next, &fresh);
                tracing::info!(subject, credential = name, "credential refreshed");
                let _ = self.events.send(Event::Refreshed {
                    subject: subject.to_owned(),
                    name: name.to_owned(),
                });
                Ok(Some(fresh))
            }
            Err(OAuthError::Refused(why)) => {
                tracing::warn!(
                    subject,
                    credential = name,
                    "the refresh was refused ({why}); the person will be asked to connect again"
                );
                // Only the value whose refresh was refused.
                if !self.store.delete_if(subject, name, &row.sealed).await? {
                    return match self.store.get(subject, name).await? {
                        Some(r) => self.open_row(&r).await.map(Some),
                        None => Ok(None),
                    };
                }
                let _ = self.events.send(Event::Lost {
                    subject: subject.to_owned(),
                    name: name.to_owned(),
                    why,
                });
                Ok(None)
            }
            Err(why) => {
                tracing::warn!(subject, credential = name, "the refresh failed: {why}");
                self.store.release_refresh(subject, name).await?;
                self.back_off(subject, name);
                if expired {
                    return Err(CredentialError::Upstream {
                        name: name.to_owned(),
                        why,
                    });
                }
                Ok(Some(value.clone()))
            }
        }
    }
}

/// How long before its end a token of `lifetime_ms` is refreshed: a minute, or a third of
/// its life if that is shorter.
fn refresh_margin(lifetime_ms: Option<i64>) -> i64 {
    lifetime_ms.map_or(60_000, |l| (l / 3).clamp(0, 60_000))
}

/// The broker keeps the `[auth.upstream]` provider's access tokens of people who sign in
/// there, sealed, for `token_exchange` credentials (built-in mode).
pub struct ProviderTokenKeeper(pub Arc<Broker>);

impl crate::auth::upstream::ProviderTokens for ProviderTokenKeeper {
    fn signed_in(&self, subject: &str, token: crate::auth::upstream::ProviderToken) {
        let exchanges = self
            .0
            .definitions()
            .iter()
            .any(|c| matches!(c.kind, CredentialKind::TokenExchange { .. }));
        if !exchanges {
            return;
        }
        let (broker, subject) = (self.0.clone(), subject.to_owned());
        tokio::spawn(async move {
            if let Err(e) = broker.keep_provider_token(&subject, &token).await {
                tracing::warn!(subject, "the provider's token was not kept: {e}");
            }
        });
    }
}
