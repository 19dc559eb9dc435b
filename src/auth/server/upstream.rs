//! Sign-in at the upstream OpenID provider (`[auth.upstream]`): the person leaves for the
//! provider from `/authorize` (straight away when there are no local users, or by the sign-in
//! page's button, `POST /authorize/upstream`) and comes back to
//! `GET /authorize/upstream/callback` with the provider's code. The pending authorization is
//! taken (once) by the answer's `state` and the browser's CSRF cookie; the code is redeemed
//! and the ID token validated by [`Upstream::finish`]; a person the allow-lists leave out
//! gets a page saying so, and the client nothing. Whoever is let in goes on as after a local
//! sign-in: the consent page, unless given before, then a code for the client that carries
//! the mapped subject and groups. The provider's own tokens stop here, but for its access
//! token when a `token_exchange` credential needs it (handed to its keeper, sealed there).

use axum::extract::{Form, Query, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde::Deserialize;

use super::authorize::{client_view, refuse_to_client};
use super::consent::issue_code;
use super::error::refused;
use super::pending::{Request, Returned, pending_for, state_prefix, take_for_callback};
use super::{AuthServer, ClientAddr, OAuthError, PageError, St, no_store, server};
use crate::auth::pages;
use crate::auth::store::Pending;
use crate::auth::upstream::UpstreamError;

/// Sends the person to the provider for pending request `p` (stored with the leg toward the
/// provider). The caller sets the CSRF cookie when it is new.
pub(super) async fn start(
    s: &AuthServer,
    mut p: Pending,
    mut request: Request,
) -> Result<Response, PageError> {
    let up = s
        .upstream
        .as_ref()
        .ok_or_else(|| PageError::Invalid("sign-in at an identity provider is off".into()))?;
    let (url, leg) = up.begin(&state_prefix(&p.id)).await.map_err(|e| {
        tracing::warn!("upstream sign-in cannot start: {e}");
        refused("upstream_unavailable");
        PageError::Upstream(format!(
            "{} cannot be reached to sign you in; try again later",
            up.display_name()
        ))
    })?;
    request.upstream = Some(leg);
    p.request = serde_json::to_string(&request).expect("serializable");
    s.store.put_pending(&p).await?;
    let mut r = StatusCode::SEE_OTHER.into_response();
    let location = HeaderValue::from_str(&url)
        .map_err(|_| PageError::Upstream("the provider's authorization URL is invalid".into()))?;
    r.headers_mut().insert(header::LOCATION, location);
    Ok(no_store(r))
}

#[derive(Deserialize)]
pub(super) struct ButtonForm {
    request: String,
    csrf: String,
}

/// The sign-in page's "Sign in with …" button.
pub(super) async fn button(
    State(auth): St,
    ClientAddr(addr): ClientAddr,
    headers: HeaderMap,
    Form(f): Form<ButtonForm>,
) -> Result<Response, PageError> {
    let s = server(&auth);
    let (p, request, _) = pending_for(s, &headers, addr, &f.request, &f.csrf).await?;
    start(s, p, request).await
}

#[derive(Deserialize)]
pub(super) struct CallbackQuery {
    state: Option<String>,
    code: Option<String>,
    error: Option<String>,
}

/// The provider's answer.
pub(super) async fn callback(
    State(auth): St,
    ClientAddr(addr): ClientAddr,
    headers: HeaderMap,
    Query(q): Query<CallbackQuery>,
) -> Result<Response, PageError> {
    let s = server(&auth);
    let Some(up) = s.upstream.as_ref() else {
        return Err(PageError::Invalid(
            "sign-in at an identity provider is off".into(),
        ));
    };
    let Some(state) = q.state.as_deref() else {
        return Err(PageError::Invalid(
            "the identity provider's answer names no sign-in here".into(),
        ));
    };
    let Returned {
        mut pending,
        csrf,
        request,
        leg,
        client,
    } = take_for_callback(s, &headers, addr, state).await?;
    if let Some(error) = q.error.as_deref() {
        // The person cancelled, or the provider refused them: the client hears it.
        let error: String = error.chars().take(64).collect();
        tracing::info!(client_id = %client.client_id, %error, "the upstream provider did not sign the person in");
        return Ok(refuse_to_client(
            &request.redirect_uri,
            request.state.as_deref(),
            &s.issuer,
            &OAuthError::AccessDenied(format!(
                "the identity provider did not sign the person in ({error})"
            )),
        ));
    }
    let Some(code) = q.code.as_deref() else {
        return Err(PageError::Invalid(
            "the identity provider's answer has no code".into(),
        ));
    };
    let who = match up.finish_with_token(code, &leg).await {
        Ok((who, token)) => {
            if let Some(keeper) = s.provider_tokens.get() {
                keeper.signed_in(&who.subject, token);
            }
            who
        }
        Err(UpstreamError::NotAllowed(why)) => {
            refused("upstream_not_allowed");
            tracing::warn!(client_id = %client.client_id, "sign-in refused: {why}");
            return Err(PageError::NotAllowed(why));
        }
        Err(e) => {
            refused("upstream_failed");
            tracing::warn!(client_id = %client.client_id, "upstream sign-in failed: {e}");
            return Err(PageError::Upstream(format!(
                "signing in with {} failed: {e}",
                up.display_name()
            )));
        }
    };
    tracing::info!(user = %who.subject, client_id = %client.client_id, groups = who.groups.len(), "signed in at the upstream provider");
    let scope = request.scopes.join(" ");
    if s.store
        .has_consent(&who.subject, &client.client_id, &scope)
        .await?
    {
        return Ok(issue_code(s, &request, &who.subject, &who.groups).await?);
    }
    // Back in the store, without the leg (used), for the consent form.
    pending.request = serde_json::to_string(&request).expect("serializable");
    pending.subject = Some(who.subject.clone());
    pending.groups = who.groups.clone();
    s.store.put_pending(&pending).await?;
    let view = client_view(&client, &request.redirect_uri);
    Ok(pages::consent(
        &pending.id,
        &csrf,
        &view,
        &who.shown(),
        &request.scopes,
    ))
}
