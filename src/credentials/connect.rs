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
    /// The scopes asked for, kept as granted when the server's answer names none (RFC 6749
    /// §5.1: it then granted what was asked).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    scopes: Option<String>,
    /// The token endpoint and client the flow began with.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    binding: Option<String>,
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

/// The scopes to ask for after a server refused a token granted `granted` for want of
/// `wanted` (its challenge's): those granted and those lacking, space-separated; `None` when
/// it names none they lack, names something that is no scope token (RFC 6749 §3.3), too many
/// or too long, or, for a credential with `configured` scopes, one outside them.
fn step_up(
    name: &str,
    granted: Option<&str>,
    wanted: Option<&str>,
    configured: &[String],
) -> Option<String> {
    let granted: Vec<&str> = granted.unwrap_or("").split_whitespace().collect();
    let wanted: Vec<&str> = wanted.unwrap_or("").split_whitespace().collect();
    let token = |s: &&str| {
        s.len() <= 128
            && s.bytes()
                .all(|b| b == 0x21 || (0x23..=0x5b).contains(&b) || (0x5d..=0x7e).contains(&b))
    };
    if wanted.len() > 32 || !wanted.iter().all(token) {
        tracing::warn!(
            credential = name,
            "a server asked for scopes that are no scope tokens, or too many: not asking"
        );
        return None;
    }
    let lacking: Vec<&str> = wanted
        .iter()
        .copied()
        .filter(|w| !granted.contains(w))
        .collect();
    if lacking.is_empty() {
        tracing::warn!(
            credential = name,
            "a server refused a token for want of scopes it was granted: not asking again"
        );
        return None;
    }
    if !configured.is_empty() && !lacking.iter().all(|l| configured.iter().any(|c| c == l)) {
        tracing::warn!(
            credential = name,
            "a server asked for scopes beyond the credential's configured ones: not asking"
        );
        return None;
    }
    Some(
        granted
            .into_iter()
            .chain(lacking)
            .collect::<Vec<_>>()
            .join(" "),
    )
}

impl Broker {
    /// A server refused `subject`'s token `sent` of the `oauth2` credential `name` (HTTP
    /// `status`; its Bearer challenge's `error` and `scope`): whether the instance that sent
    /// it is to end (its value is no good, or not the person's latest).
    ///
    /// - A value that is not the one kept now (refreshed or connected anew since) is left
    ///   alone: the instance ends and the next starts with the kept one.
    /// - For want of scopes (403, `insufficient_scope`) the person is asked again, for those
    ///   granted before and those the server names (well-formed scope tokens, within the
    ///   credential's configured `scopes` when it has any), unless it names none they lack
    ///   (a server that refuses whatever is granted is not asked again and again).
    /// - A token refused outright (401) is refreshed when it can be; else it is forgotten
    ///   with what was found of the server (which may have moved to another authorization
    ///   server), and the person asked again.
    pub async fn refused(
        &self,
        subject: &str,
        name: &str,
        sent: &str,
        refusal: (u16, Option<&str>, Option<&str>),
    ) -> bool {
        let (status, error, scope) = refusal;
        let Ok(c) = self.defined(name) else {
            return false;
        };
        let CredentialKind::OAuth2 { server, .. } = &c.kind else {
            return false;
        };
        let row = match self.store.get(subject, name).await {
            Ok(Some(row)) => row,
            // Forgotten already (another instance was refused first): this one's is stale.
            Ok(None) => return true,
            Err(_) => return false,
        };
        let Ok(kept) = self.open_row(&row).await else {
            return false;
        };
        if kept.value != sent {
            return true;
        }
        let insufficient = status == 403 || error == Some("insufficient_scope");
        if insufficient {
            let Some(union) = step_up(name, row.scopes.as_deref(), scope, &server.scopes) else {
                return false;
            };
            let mut more = self.more_scopes.lock().expect("scopes lock");
            if more.len() >= MAX_STEP_UPS {
                tracing::warn!(
                    subject,
                    credential = name,
                    "too many step-ups pending; asking without the server's scopes"
                );
            } else {
                more.insert((subject.to_owned(), name.to_owned()), union);
            }
        } else if status == 401 {
            // Found again before anything else: the server may have moved to another
            // authorization server, where the refresh below is refused.
            self.oauth.forget(name);
            if let Some(refresh) = &kept.refresh_token {
                // Ended early at the server (revoked, or past a clock the gateway did not
                // know): a new one, or the value forgotten when the server refuses.
                return self.refresh(server, &row, &kept, refresh).await.is_ok();
            }
        } else {
            return false;
        }
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
            scopes: (!started.scopes.is_empty()).then_some(started.scopes),
            binding: Some(started.binding),
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
        // Found again since it began (a server that moved): its code is not redeemed
        // elsewhere.
        if let Some(began) = &leg.binding {
            let now = self.oauth.binding(&leg.name, server).await;
            if now.as_ref().ok() != Some(began) {
                return Err(ConnectRefused::Mismatch);
            }
        }
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
            .keep(&subject, &leg.name, &value, expires, t.scope.or(leg.scopes))
            .await?;
        Ok((subject, connection))
    }
}
