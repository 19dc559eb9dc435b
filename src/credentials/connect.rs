//! Connecting an `oauth2` credential: the authorization code flow toward its server, begun on
//! the connect page once the person signed in as the subject the link was made for, and
//! finished at [`CALLBACK_PATH`] when the server sends them back.
//!
//! What the flow must remember while the person is away (the link's id, the credential, a
//! hash of the `state` sent, the PKCE verifier, until when) travels in a cookie, sealed under
//! the storage key and bound to the subject: it binds the flow to the browser that began it,
//! any replica can finish it, and nothing is stored until the server's code is redeemed. The
//! callback is refused, storing nothing, when the cookie is missing, tampered with or
//! expired, when the `state` is not the one sent, or when the link was used meanwhile (it is
//! used up here, once, on any replica, before the code is redeemed).

use serde::{Deserialize, Serialize};

use super::{Broker, Connection, CredentialError, OAuthError, Request, Value, now_ms};
use crate::config::CredentialKind;

/// Where the authorization server sends the person back, on the gateway's public origin
/// (the redirect URI to register there).
pub const CALLBACK_PATH: &str = "/connect/callback";

/// What a flow's cookie is sealed as, in place of a credential's name.
const LEG: &str = "\0oauth-connect";

/// The flow's memory, sealed in the browser's cookie.
#[derive(Serialize, Deserialize)]
struct Leg {
    /// The link's id: used up when the server sends the person back.
    id: String,
    name: String,
    state_hash: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pkce_verifier: Option<String>,
    until_ms: i64,
}

/// Why a callback stored nothing.
#[derive(Debug, thiserror::Error)]
pub enum ConnectRefused {
    /// The cookie is missing, tampered with or expired, or the `state` is not the flow's.
    #[error("the sign-in at the service does not belong to this browser's request")]
    Mismatch,
    /// The link was used or expired meanwhile.
    #[error("the link was used already or expired")]
    Used,
    /// The server would not give a token for the code.
    #[error(transparent)]
    Upstream(OAuthError),
    #[error(transparent)]
    Credential(#[from] CredentialError),
}

/// The most people's step-ups remembered at once (a replica's memory stays bounded).
const MAX_STEP_UPS: usize = 10_000;

impl Broker {
    /// A server refused `subject`'s token of the `oauth2` credential `name` (HTTP `status`;
    /// its Bearer challenge's `error` and `scope`): whether they are to connect again, their
    /// value forgotten. For want of scopes (403, `insufficient_scope`) they are asked for
    /// those granted before and those the server names, unless it names none they lack (a
    /// server that refuses whatever is granted is not asked again and again: the call fails).
    /// A token refused outright (401) is forgotten with what was found of the server, which
    /// may have moved to another authorization server.
    pub async fn refused(
        &self,
        subject: &str,
        name: &str,
        status: u16,
        error: Option<&str>,
        scope: Option<&str>,
    ) -> bool {
        let Ok(c) = self.defined(name) else {
            return false;
        };
        if !matches!(c.kind, CredentialKind::OAuth2 { .. }) {
            return false;
        }
        let row = match self.store.get(subject, name).await {
            Ok(Some(row)) => row,
            // Forgotten already (another instance was refused first): this one's is stale.
            Ok(None) => return true,
            Err(_) => return false,
        };
        let insufficient = status == 403 || error == Some("insufficient_scope");
        if insufficient {
            let granted: Vec<&str> = row
                .scopes
                .as_deref()
                .unwrap_or("")
                .split_whitespace()
                .collect();
            let wanted: Vec<&str> = scope.unwrap_or("").split_whitespace().collect();
            let lacking: Vec<&str> = wanted
                .iter()
                .copied()
                .filter(|w| !granted.contains(w))
                .collect();
            if lacking.is_empty() {
                tracing::warn!(
                    subject,
                    credential = name,
                    "the server refused the token for want of scope `{}`, which it was granted: not asking again",
                    scope.unwrap_or("")
                );
                return false;
            }
            let union: Vec<&str> = granted.iter().copied().chain(lacking).collect();
            let mut more = self.more_scopes.lock().expect("scopes lock");
            if more.len() >= MAX_STEP_UPS {
                more.clear();
            }
            more.insert((subject.to_owned(), name.to_owned()), union.join(" "));
        } else if status == 401 {
            self.oauth.forget(name);
        } else {
            return false;
        }
        // Connected anew meanwhile, that value is theirs to try: the refused instance ends
        // all the same, and the next one starts with it. No event stops the person's other
        // instances (it could end this one before its caller is answered): each ends when its
        // own request is refused.
        if matches!(
            self.store.delete_if(subject, name, &row.sealed).await,
            Ok(true)
        ) {
            let why = if insufficient {
                "the server wants more scopes"
            } else {
                "the server refused the token"
            };
            tracing::info!(
                subject,
                credential = name,
                "{why}; the person will be asked to connect again"
            );
        }
        true
    }

    /// Whether `state` is the one the flow of the cookie `leg` sent (an answer that is not
    /// this browser's flow's changes nothing, not even its cookie).
    pub fn flow_state_matches(&self, leg: &str, state: &str) -> bool {
        self.open_for(leg, LEG)
            .and_then(|(_, plain)| serde_json::from_slice::<Leg>(&plain).ok())
            .is_some_and(|l| {
                crate::auth::constant_time_eq(&crate::auth::hash_secret(state), &l.state_hash)
            })
    }

    /// Begins the flow of `request` (made for an `oauth2` credential) for the person who
    /// signed in as its subject: the server's authorization URL, and the cookie's value.
    pub async fn begin_connect(
        &self,
        request: &Request,
    ) -> Result<(String, String), CredentialError> {
        let c = self.defined(&request.name)?;
        let CredentialKind::OAuth2 { server, pkce } = &c.kind else {
            return Err(CredentialError::NotOAuth(request.name.clone()));
        };
        let started = self
            .oauth
            .begin(
                &request.name,
                server,
                *pkce,
                &self.callback_url(),
                request.scopes.as_deref(),
            )
            .await
            .map_err(|why| CredentialError::Upstream {
                name: request.name.clone(),
                why,
            })?;
        let leg = Leg {
            id: request.id.clone(),
            name: request.name.clone(),
            state_hash: crate::auth::hash_secret(&started.state),
            pkce_verifier: started.pkce_verifier,
            until_ms: request.expires_at_ms.min(now_ms() + super::REQUEST_TTL_MS),
        };
        let plain = serde_json::to_vec(&leg).expect("serializable");
        let cookie = self.seal_for(&request.subject, LEG, &plain)?;
        Ok((started.url, cookie))
    }

    /// Finishes the flow of the cookie `leg`: checks `state`, uses the link up, redeems
    /// `code` and keeps the tokens. Who connected what.
    pub async fn finish_connect(
        &self,
        leg: &str,
        state: &str,
        code: &str,
        iss: Option<&str>,
    ) -> Result<(String, Connection), ConnectRefused> {
        let (subject, plain) = self.open_for(leg, LEG).ok_or(ConnectRefused::Mismatch)?;
        let leg: Leg = serde_json::from_slice(&plain).map_err(|_| ConnectRefused::Mismatch)?;
        let state_ok =
            crate::auth::constant_time_eq(&crate::auth::hash_secret(state), &leg.state_hash);
        if !state_ok || leg.until_ms <= now_ms() {
            return Err(ConnectRefused::Mismatch);
        }
        let c = self.defined(&leg.name)?;
        let CredentialKind::OAuth2 { server, .. } = &c.kind else {
            return Err(CredentialError::NotOAuth(leg.name.clone()).into());
        };
        // A code from another server than this credential's (a mix-up) is not redeemed.
        self.oauth
            .check_iss(&leg.name, server, iss)
            .await
            .map_err(|_| ConnectRefused::Mismatch)?;
        match self.take(&leg.id).await? {
            Some(r) if r.subject == subject && r.name == leg.name => {}
            _ => return Err(ConnectRefused::Used),
        }
        let t = self
            .oauth
            .redeem(
                &leg.name,
                server,
                &self.callback_url(),
                code,
                leg.pkce_verifier.as_deref(),
            )
            .await
            .map_err(ConnectRefused::Upstream)?;
        let value = Value {
            value: t.access_token,
            refresh_token: t.refresh_token,
            lifetime_ms: t.expires_in.map(super::millis),
        };
        let expires = t.expires_in.map(|d| super::expiry(now_ms(), d));
        let connection = self
            .keep(&subject, &leg.name, &value, expires, t.scope)
            .await?;
        Ok((subject, connection))
    }
}
