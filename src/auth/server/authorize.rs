//! The authorization endpoint (`GET /authorize`): checks the request (client, exact redirect
//! URI, response type, PKCE S256, resource, scopes), keeps it as a pending request and shows
//! the sign-in page. Until the client and its redirect URI are verified a refusal is shown as
//! a page ([`PageError`]); after that it goes back to the client's redirect URI with `error`,
//! `state` and `iss` ([`back_to_client`]). No code is issued here: that waits for sign-in and
//! consent.

use std::collections::BTreeSet;

use axum::extract::{Query, State};
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde::Deserialize;

use super::error::refused;
use super::pending::{PENDING_TTL, Request};
use super::{ClientAddr, OAuthError, PageError, St, no_store, server, upstream};
use crate::auth::pages::{self, ClientView};
use crate::auth::redirect::is_loopback_host;
use crate::auth::store::{Client, Pending};
use crate::auth::{hash_secret, now_secs, random_token, same_resource};

#[derive(Deserialize)]
pub(super) struct AuthorizeQuery {
    response_type: Option<String>,
    client_id: Option<String>,
    redirect_uri: Option<String>,
    state: Option<String>,
    scope: Option<String>,
    code_challenge: Option<String>,
    code_challenge_method: Option<String>,
    resource: Option<String>,
}

/// Sends the browser back to the client with `params` (and `state` and `iss`).
pub(super) fn back_to_client(
    redirect_uri: &str,
    state: Option<&str>,
    iss: &str,
    params: &[(&str, &str)],
) -> Response {
    let mut url = match url::Url::parse(redirect_uri) {
        Ok(u) => u,
        Err(_) => return pages::error(StatusCode::BAD_REQUEST, "the redirect URI is invalid"),
    };
    {
        let mut q = url.query_pairs_mut();
        for (k, v) in params {
            q.append_pair(k, v);
        }
        if let Some(s) = state {
            q.append_pair("state", s);
        }
        q.append_pair("iss", iss);
    }
    let mut r = StatusCode::SEE_OTHER.into_response();
    if let Ok(v) = HeaderValue::from_str(url.as_str()) {
        r.headers_mut().insert(header::LOCATION, v);
    }
    no_store(r)
}

/// Sends a refusal back to the client's (verified) redirect URI, counted.
pub(super) fn refuse_to_client(
    redirect_uri: &str,
    state: Option<&str>,
    iss: &str,
    error: &OAuthError,
) -> Response {
    refused(error.code());
    back_to_client(
        redirect_uri,
        state,
        iss,
        &[
            ("error", error.code()),
            ("error_description", error.description()),
        ],
    )
}

/// How the sign-in and consent pages name the client.
pub(super) fn client_view<'a>(client: &'a Client, redirect_uri: &str) -> ClientView<'a> {
    let url = url::Url::parse(redirect_uri).ok();
    ClientView {
        name: client.name.as_deref().unwrap_or(&client.client_id),
        client_id: &client.client_id,
        redirect_host: url
            .as_ref()
            .and_then(|u| u.host_str().map(str::to_owned))
            .unwrap_or_default(),
        loopback_redirect: url.as_ref().is_some_and(is_loopback_host),
    }
}

pub(super) async fn authorize(
    State(auth): St,
    ClientAddr(addr): ClientAddr,
    Query(q): Query<AuthorizeQuery>,
) -> Result<Response, PageError> {
    let s = server(&auth);
    // Until the client and its redirect URI are verified, errors are shown here.
    let invalid = |why: &str| PageError::Invalid(why.into());
    let Some(client_id) = q.client_id.as_deref().filter(|c| !c.is_empty()) else {
        return Err(invalid("the request names no client (client_id)"));
    };
    let Some(client) = s.client(client_id, addr).await? else {
        return Err(invalid("this client is not registered here"));
    };
    let redirect_uri = match q.redirect_uri.as_deref() {
        Some(r) if client.redirect_uris.iter().any(|x| x == r) => r.to_owned(),
        Some(_) => {
            return Err(invalid(
                "the redirect URI is not one registered for this client",
            ));
        }
        None if client.redirect_uris.len() == 1 => client.redirect_uris[0].clone(),
        None => {
            return Err(invalid(
                "the request needs a redirect_uri (this client registered several)",
            ));
        }
    };
    let state = q.state.as_deref();
    let fail = |error: OAuthError| Ok(refuse_to_client(&redirect_uri, state, &s.issuer, &error));
    if q.response_type.as_deref() != Some("code") {
        return fail(OAuthError::UnsupportedResponseType(
            "only response_type=code is supported".into(),
        ));
    }
    if !client.grant_types.iter().any(|g| g == "authorization_code") {
        return fail(OAuthError::UnauthorizedClient(
            "this client may not use the authorization code grant".into(),
        ));
    }
    let challenge = match (
        q.code_challenge.as_deref(),
        q.code_challenge_method.as_deref(),
    ) {
        (Some(c), Some("S256")) if (43..=128).contains(&c.len()) => c.to_owned(),
        (Some(_), Some("S256")) => {
            return fail(OAuthError::InvalidRequest(
                "code_challenge has the wrong length".into(),
            ));
        }
        (Some(_), _) => {
            return fail(OAuthError::InvalidRequest(
                "PKCE needs code_challenge_method=S256".into(),
            ));
        }
        (None, _) => {
            return fail(OAuthError::InvalidRequest(
                "PKCE is required: send code_challenge with S256".into(),
            ));
        }
    };
    let resource = match q.resource.as_deref() {
        None => auth.resource.clone(),
        Some(r) if same_resource(&auth.resource, r) => auth.resource.clone(),
        Some(_) => {
            return fail(OAuthError::InvalidTarget(
                "the resource is not this gateway's /mcp".into(),
            ));
        }
    };
    let supported = s.scopes_supported();
    let allowed = s.allowed_scopes(&client);
    let scopes: Vec<String> = match q.scope.as_deref().map(str::split_whitespace) {
        None => s.config.scopes.clone(),
        Some(words) => {
            let mut v: BTreeSet<String> = BTreeSet::new();
            for w in words {
                if !supported.iter().any(|x| x == w) {
                    return fail(OAuthError::InvalidScope(format!(
                        "scope `{w}` is not offered here"
                    )));
                }
                v.insert(w.to_owned());
            }
            if v.is_empty() {
                s.config.scopes.clone()
            } else {
                v.into_iter().collect()
            }
        }
    };
    if let Some(w) = scopes.iter().find(|w| !allowed.contains(*w)) {
        return fail(OAuthError::InvalidScope(format!(
            "scope `{w}` is not one this client registered"
        )));
    }
    let request = Request {
        client_id: client.client_id.clone(),
        redirect_uri: redirect_uri.clone(),
        state: q.state.clone(),
        scopes,
        challenge,
        resource,
        upstream: None,
    };
    let csrf = random_token();
    let pending = Pending {
        id: random_token(),
        csrf_hash: hash_secret(&csrf),
        request: serde_json::to_string(&request).expect("serializable"),
        subject: None,
        expires_at: now_secs() + PENDING_TTL.as_secs() as i64,
        groups: Vec::new(),
    };
    // With an upstream provider and no local users, straight to the provider.
    if s.upstream.is_some() && s.config.users.is_empty() {
        let mut r = upstream::start(s, pending, request).await?;
        s.set_csrf(&mut r, &csrf);
        return Ok(r);
    }
    s.store.put_pending(&pending).await?;
    let view = client_view(&client, &redirect_uri);
    let mut r = pages::login(&pending.id, &csrf, &view, None, s.upstream_name());
    s.set_csrf(&mut r, &csrf);
    Ok(r)
}
