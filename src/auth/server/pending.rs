//! The authorization request kept while the person signs in and decides: the validated
//! request ([`Request`]) is stored with the hash of a CSRF token, and the token itself goes to
//! the browser both in the form and in a cookie the page cannot read. A form comes back with
//! both; [`pending_for`] finds the request only if they match each other and the stored hash,
//! and the request has not expired. With sign-in at an upstream provider, the leg toward it
//! (the random part of its `state`, its `nonce` and PKCE verifier) is kept in the request too;
//! the provider's answer comes back without the form, so [`take_for_callback`] checks the
//! cookie against the stored hash and the `state` against the leg, and takes the request
//! out of the store as it does (single use). This module never decides what the person is
//! allowed.

use std::net::IpAddr;
use std::time::Duration;

use axum::http::{HeaderMap, HeaderValue, header};
use axum::response::Response;
use serde::{Deserialize, Serialize};

use super::{AuthServer, PageError};
use crate::auth::store::{Client, Pending};
use crate::auth::upstream::Leg;
use crate::auth::{constant_time_eq, hash_secret, now_secs};

/// How long a person has to sign in and decide.
pub(super) const PENDING_TTL: Duration = Duration::from_secs(600);

/// A validated authorization request, kept while the person decides.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(super) struct Request {
    pub client_id: String,
    pub redirect_uri: String,
    pub state: Option<String>,
    pub scopes: Vec<String>,
    pub challenge: String,
    pub resource: String,
    /// The leg toward the upstream provider, while the person is there.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub upstream: Option<Leg>,
}

impl AuthServer {
    fn csrf_cookie(&self) -> &'static str {
        if self.secure_cookies {
            "__Host-mcpgw-csrf"
        } else {
            "mcpgw-csrf"
        }
    }

    /// Sets the cookie that carries a pending request's CSRF token.
    pub(super) fn set_csrf(&self, response: &mut Response, csrf: &str) {
        let secure = if self.secure_cookies { "; Secure" } else { "" };
        let cookie = format!(
            "{}={csrf}; Path=/; HttpOnly; SameSite=Lax; Max-Age={}{secure}",
            self.csrf_cookie(),
            PENDING_TTL.as_secs()
        );
        if let Ok(v) = HeaderValue::from_str(&cookie) {
            response.headers_mut().append(header::SET_COOKIE, v);
        }
    }

    fn cookie<'h>(&self, headers: &'h HeaderMap) -> Option<&'h str> {
        crate::auth::pages::cookie(headers, self.csrf_cookie())
    }
}

/// The pending request a form names, its CSRF token checked against the cookie and the
/// stored hash.
pub(super) async fn pending_for(
    s: &AuthServer,
    headers: &HeaderMap,
    addr: Option<IpAddr>,
    id: &str,
    csrf: &str,
) -> Result<(Pending, Request, Client), PageError> {
    let expired = || PageError::Invalid("this sign-in expired or was already used".into());
    let p = match s.store.pending(id).await? {
        Some(p) if p.expires_at >= now_secs() => p,
        _ => return Err(expired()),
    };
    let cookie_ok = s.cookie(headers).is_some_and(|c| constant_time_eq(c, csrf));
    if !cookie_ok || !constant_time_eq(&hash_secret(csrf), &p.csrf_hash) {
        return Err(PageError::CrossSite);
    }
    let request: Request = serde_json::from_str(&p.request).map_err(|_| expired())?;
    let client = client_of(s, &request, addr).await?;
    Ok((p, request, client))
}

async fn client_of(
    s: &AuthServer,
    request: &Request,
    addr: Option<IpAddr>,
) -> Result<Client, PageError> {
    match s.client(&request.client_id, addr).await {
        Ok(Some(c)) => Ok(c),
        Err(e @ super::Lookup::Limited(_)) => Err(e.into()),
        _ => Err(PageError::Invalid("the client is no longer known".into())),
    }
}

/// The `state` sent to the upstream provider for pending request `id`: the id, a dot, then
/// the random part [`crate::auth::upstream::Upstream::begin`] adds.
pub(super) fn state_prefix(id: &str) -> String {
    format!("{id}.")
}

/// What the provider's answer comes back to: the pending request, the CSRF token (the
/// browser's cookie, for the consent form), the request without its upstream leg, the leg,
/// and the client.
pub(super) struct Returned {
    pub pending: Pending,
    pub csrf: String,
    pub request: Request,
    pub leg: Leg,
    pub client: Client,
}

/// The pending request the provider's `state` names, taken out of the store (a second answer
/// finds nothing): the browser's CSRF cookie must be the one the request was made with, and
/// the state's random part the one sent. Both are checked before the request is taken, so an
/// answer that fails them leaves it to the browser that started it.
pub(super) async fn take_for_callback(
    s: &AuthServer,
    headers: &HeaderMap,
    addr: Option<IpAddr>,
    state: &str,
) -> Result<Returned, PageError> {
    let expired = || PageError::Invalid("this sign-in expired or was already used".into());
    let Some((id, secret)) = state.split_once('.') else {
        return Err(PageError::Invalid(
            "the identity provider's answer names no sign-in here".into(),
        ));
    };
    let p = match s.store.pending(id).await? {
        Some(p) if p.expires_at >= now_secs() => p,
        _ => return Err(expired()),
    };
    let csrf = match s.cookie(headers) {
        Some(c) if constant_time_eq(&hash_secret(c), &p.csrf_hash) => c.to_owned(),
        _ => return Err(PageError::CrossSite),
    };
    let mut request: Request = serde_json::from_str(&p.request).map_err(|_| expired())?;
    let Some(leg) = request.upstream.take() else {
        return Err(expired());
    };
    if !constant_time_eq(&hash_secret(secret), &leg.state_hash) {
        return Err(PageError::Invalid(
            "the identity provider's answer does not belong to this sign-in".into(),
        ));
    }
    // Single use: of two answers at once, one takes it. What was taken is what was checked
    // unless the person restarted the sign-in meanwhile (a new leg): then it is refused.
    let taken = s.store.take_pending(id).await?.ok_or_else(expired)?;
    if taken.request != p.request {
        return Err(expired());
    }
    let client = client_of(s, &request, addr).await?;
    Ok(Returned {
        pending: p,
        csrf,
        request,
        leg,
        client,
    })
}
