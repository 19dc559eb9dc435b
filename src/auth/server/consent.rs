//! The person's decision (`POST /authorize/consent`) and what follows it: approval is
//! remembered for this user, client and scopes, and a single-use authorization code bound to
//! the PKCE challenge, the redirect URI and the resource goes back to the client
//! ([`issue_code`], also used by sign-in when consent was given before); a denial goes back
//! as `access_denied`. A pending request is used once: a second submission finds nothing.

use axum::extract::{Form, State};
use axum::http::HeaderMap;
use axum::response::Response;
use serde::Deserialize;

use super::authorize::{back_to_client, refuse_to_client};
use super::pending::{Request, pending_for};
use super::{AuthServer, ClientAddr, OAuthError, PageError, St, server};
use crate::auth::store::{AuthStoreError, Code};
use crate::auth::{hash_secret, now_secs, random_token};

#[derive(Deserialize)]
pub(super) struct ConsentForm {
    request: String,
    csrf: String,
    decision: String,
}

pub(super) async fn consent(
    State(auth): St,
    ClientAddr(addr): ClientAddr,
    headers: HeaderMap,
    Form(f): Form<ConsentForm>,
) -> Result<Response, PageError> {
    let s = server(&auth);
    let (p, request, client) = pending_for(s, &headers, addr, &f.request, &f.csrf).await?;
    let Some(subject) = p.subject.clone() else {
        return Err(PageError::Invalid("sign in first".into()));
    };
    // Single use: a second submission finds nothing.
    s.store.delete_pending(&p.id).await?;
    if f.decision != "approve" {
        tracing::info!(user = %subject, client_id = %client.client_id, "access denied by the user");
        return Ok(refuse_to_client(
            &request.redirect_uri,
            request.state.as_deref(),
            &s.issuer,
            &OAuthError::AccessDenied("the user denied access".into()),
        ));
    }
    let scope = request.scopes.join(" ");
    s.store
        .add_consent(&subject, &client.client_id, &scope)
        .await?;
    Ok(issue_code(s, &request, &subject, &p.groups).await?)
}

/// Issues an authorization code for `request`, for `subject` in `groups`, and sends the
/// browser back to the client.
pub(super) async fn issue_code(
    s: &AuthServer,
    request: &Request,
    subject: &str,
    groups: &[String],
) -> Result<Response, AuthStoreError> {
    let code = random_token();
    let row = Code {
        code_hash: hash_secret(&code),
        client_id: request.client_id.clone(),
        subject: subject.to_owned(),
        redirect_uri: request.redirect_uri.clone(),
        resource: request.resource.clone(),
        scope: request.scopes.join(" "),
        challenge: request.challenge.clone(),
        expires_at: now_secs() + s.config.code_ttl.as_secs() as i64,
        groups: groups.to_vec(),
        issued: None,
    };
    s.store.add_code(&row).await?;
    tracing::info!(user = %subject, client_id = %request.client_id, "authorization code issued");
    Ok(back_to_client(
        &request.redirect_uri,
        request.state.as_deref(),
        &s.issuer,
        &[("code", &code)],
    ))
}
