//! The token endpoint (`POST /token`) and its three grants: `authorization_code` (the code
//! taken once, checked against its client, resource, redirect URI and PKCE verifier; a
//! replayed code revokes what its first use gave), `refresh_token` (rotation: each use gives
//! a new token in the same family, and a reused one revokes the family) and
//! `client_credentials` (provisioned clients only). Every token is for this gateway's
//! resource only. Refusals are [`OAuthError`]s; the client is authenticated first
//! ([`authenticate_client`]).

use std::collections::BTreeSet;

use axum::extract::{Form, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::Response;
use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use serde::Deserialize;
use serde_json::json;

use super::client_auth::authenticate_client;
use super::revoke::revoke_grant;
use super::{AuthServer, ClientAddr, OAuthError, St, json_response, server};
use crate::auth::keys::Planned;
use crate::auth::store::{AuthStoreError, Client, Issued, Refresh, Taken};
use crate::auth::{
    Auth, LEEWAY, constant_time_eq, hash_secret, now_secs, random_token, same_resource,
};

/// The form of the token and revocation endpoints.
#[derive(Deserialize, Default)]
pub(super) struct TokenForm {
    grant_type: Option<String>,
    code: Option<String>,
    redirect_uri: Option<String>,
    code_verifier: Option<String>,
    refresh_token: Option<String>,
    scope: Option<String>,
    resource: Option<String>,
    pub(super) client_id: Option<String>,
    pub(super) client_secret: Option<String>,
    /// The token to revoke (`/revoke`).
    pub(super) token: Option<String>,
}

pub(super) async fn token(
    State(auth): St,
    ClientAddr(addr): ClientAddr,
    headers: HeaderMap,
    Form(f): Form<TokenForm>,
) -> Result<Response, OAuthError> {
    let s = server(&auth);
    let client = authenticate_client(s, &headers, addr, &f).await?;
    let grant = f.grant_type.as_deref().unwrap_or_default();
    if !client.grant_types.iter().any(|g| g == grant) {
        let description = format!("grant type `{grant}` is not available to this client");
        return Err(
            if ["authorization_code", "refresh_token", "client_credentials"].contains(&grant) {
                OAuthError::UnauthorizedClient(description)
            } else {
                OAuthError::UnsupportedGrantType(description)
            },
        );
    }
    if let Some(r) = &f.resource
        && !same_resource(&auth.resource, r)
    {
        return Err(OAuthError::InvalidTarget(
            "the resource is not this gateway's /mcp".into(),
        ));
    }
    match grant {
        "authorization_code" => authorization_code(&auth, s, &client, &f).await,
        "refresh_token" => refresh_token(&auth, s, &client, &f).await,
        "client_credentials" => client_credentials(s, &client, &f),
        _ => Err(OAuthError::UnsupportedGrantType(format!(
            "grant type `{grant}` is not supported"
        ))),
    }
}

fn bad_grant(why: &str) -> OAuthError {
    OAuthError::InvalidGrant(why.to_owned())
}

/// The `authorization_code` grant: a code (once) and its PKCE verifier.
async fn authorization_code(
    auth: &Auth,
    s: &AuthServer,
    client: &Client,
    f: &TokenForm,
) -> Result<Response, OAuthError> {
    let (Some(code), Some(verifier)) = (&f.code, &f.code_verifier) else {
        return Err(OAuthError::InvalidRequest(
            "code and code_verifier are required".into(),
        ));
    };
    // What this redemption will issue is recorded as the code is taken.
    let planned = s.keys.plan();
    let issue = Issued {
        family: random_token(),
        access_jti: planned.jti.clone(),
        access_expires_at: planned.exp,
        kept_until: planned
            .exp
            .max(now_secs() + s.config.refresh_ttl.as_secs() as i64)
            + LEEWAY.as_secs() as i64,
    };
    let code_hash = hash_secret(code);
    let c = match s.store.take_code(&code_hash, &issue).await? {
        Taken::Fresh(c) => c,
        Taken::Reused(c) => {
            // Someone else holds a copy of the code: what its first use gave is revoked
            // (OAuth 2.1 §4.1.3).
            tracing::warn!(client_id = %c.client_id, user = %c.subject, "an authorization code was used twice; the tokens it gave are revoked");
            if let Some(first) = &c.issued {
                revoke_grant(
                    s,
                    &first.family,
                    Some((&first.access_jti, first.access_expires_at)),
                )
                .await?;
            }
            return Err(bad_grant(
                "the code was already used; the tokens it gave are revoked",
            ));
        }
        Taken::Unknown => return Err(bad_grant("unknown code")),
    };
    if c.expires_at < now_secs() {
        return Err(bad_grant("the code has expired"));
    }
    if c.client_id != client.client_id {
        return Err(bad_grant("the code was issued to another client"));
    }
    // Gateways may share a database: a code is good only at the gateway (resource and
    // issuer) that issued it.
    if c.resource != auth.resource {
        return Err(bad_grant("the code was issued for another resource"));
    }
    if f.redirect_uri.as_deref() != Some(c.redirect_uri.as_str()) {
        return Err(bad_grant(
            "redirect_uri does not match the authorization request",
        ));
    }
    if f.resource
        .as_deref()
        .is_some_and(|r| !same_resource(&c.resource, r))
    {
        return Err(bad_grant(
            "the resource does not match the authorization request",
        ));
    }
    let valid_verifier = (43..=128).contains(&verifier.len())
        && verifier
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"-._~".contains(&b));
    let computed = {
        use sha2::Digest;
        URL_SAFE_NO_PAD.encode(sha2::Sha256::digest(verifier.as_bytes()))
    };
    if !valid_verifier || !constant_time_eq(&computed, &c.challenge) {
        return Err(bad_grant(
            "the PKCE code_verifier does not match the code_challenge",
        ));
    }
    let allowed = s.allowed_scopes(client);
    if let Some(x) = c.scope.split_whitespace().find(|x| !allowed.contains(*x)) {
        return Err(OAuthError::InvalidScope(format!(
            "scope `{x}` is no longer available to this client"
        )));
    }
    let groups = s.groups_for(&c.subject, &c.groups);
    let refresh = new_refresh(
        s,
        &issue.family,
        &planned,
        client,
        Grantee {
            subject: &c.subject,
            groups: &groups,
        },
        &c.resource,
        &c.scope,
    )
    .await?;
    // A replay while this was issuing revoked the family before its token existed.
    if s.store.code_replayed(&code_hash).await? {
        revoke_grant(s, &issue.family, None).await?;
        return Err(bad_grant(
            "the code was used twice; the tokens it gave are revoked",
        ));
    }
    tracing::info!(user = %c.subject, client_id = %client.client_id, "tokens issued (authorization code)");
    Ok(token_response(
        s,
        &planned,
        Grantee {
            subject: &c.subject,
            groups: &groups,
        },
        client,
        &c.scope,
        refresh,
        "authorization_code",
    ))
}

/// The `refresh_token` grant: rotation within the token's family.
async fn refresh_token(
    auth: &Auth,
    s: &AuthServer,
    client: &Client,
    f: &TokenForm,
) -> Result<Response, OAuthError> {
    let Some(token) = &f.refresh_token else {
        return Err(OAuthError::InvalidRequest(
            "refresh_token is required".into(),
        ));
    };
    let hash = hash_secret(token);
    // Gateways may share a database: a refresh token is good only at the gateway
    // (resource and issuer) that issued it, and only for its client. Checked before the
    // token is spent, so a token shown to the wrong place stays its holder's.
    match s.store.refresh(&hash).await? {
        Some(r) if r.resource != auth.resource => {
            tracing::warn!(client_id = %r.client_id, "a refresh token for another resource was presented");
            return Err(bad_grant(
                "the refresh token was issued for another resource",
            ));
        }
        Some(r) if r.client_id != client.client_id => {
            return Err(bad_grant("the refresh token was issued to another client"));
        }
        _ => {}
    }
    let r = match s.store.take_refresh(&hash).await? {
        Taken::Fresh(r) => r,
        Taken::Reused(r) => {
            // A rotated-out token came back: someone holds a copy. The whole family goes.
            tracing::warn!(client_id = %r.client_id, user = %r.subject, "a refresh token was reused; its family is revoked");
            revoke_grant(s, &r.family, None).await?;
            return Err(bad_grant(
                "the refresh token was already used; its grant is revoked",
            ));
        }
        Taken::Unknown => return Err(bad_grant("unknown or revoked refresh token")),
    };
    if r.client_id != client.client_id || r.resource != auth.resource {
        return Err(bad_grant(
            "the refresh token was issued to another client or resource",
        ));
    }
    if r.expires_at < now_secs() {
        return Err(bad_grant("the refresh token has expired"));
    }
    // What the grant allowed, narrowed to what the client may still be given.
    let allowed = s.allowed_scopes(client);
    let scope = match &f.scope {
        None => r
            .scope
            .split_whitespace()
            .filter(|x| allowed.contains(*x))
            .collect::<Vec<_>>()
            .join(" "),
        Some(asked) => {
            let granted: BTreeSet<&str> = r.scope.split_whitespace().collect();
            if let Some(extra) = asked
                .split_whitespace()
                .find(|x| !granted.contains(x) || !allowed.contains(*x))
            {
                return Err(OAuthError::InvalidScope(format!(
                    "scope `{extra}` was not granted"
                )));
            }
            asked.split_whitespace().collect::<Vec<_>>().join(" ")
        }
    };
    let planned = s.keys.plan();
    let groups = s.groups_for(&r.subject, &r.groups);
    let grantee = Grantee {
        subject: &r.subject,
        groups: &groups,
    };
    let refresh = new_refresh(
        s,
        &r.family,
        &planned,
        client,
        grantee,
        &r.resource,
        &r.scope,
    )
    .await?;
    Ok(token_response(
        s,
        &planned,
        grantee,
        client,
        &scope,
        refresh,
        "refresh_token",
    ))
}

/// The `client_credentials` grant: a token for the client itself.
fn client_credentials(
    s: &AuthServer,
    client: &Client,
    f: &TokenForm,
) -> Result<Response, OAuthError> {
    // Only for clients the operator provisioned, whatever a stored registration says
    // (registrations from before this rule may name the grant).
    if !client.provisioned || client.auth_method == "none" {
        return Err(OAuthError::UnauthorizedClient(
            "client_credentials is only for clients provisioned by the operator".into(),
        ));
    }
    let allowed = s.allowed_scopes(client);
    let scope = match &f.scope {
        None => allowed.iter().cloned().collect::<Vec<_>>().join(" "),
        Some(asked) => {
            if let Some(x) = asked.split_whitespace().find(|x| !allowed.contains(*x)) {
                return Err(OAuthError::InvalidScope(format!(
                    "scope `{x}` is not one this client may be given"
                )));
            }
            asked.split_whitespace().collect::<Vec<_>>().join(" ")
        }
    };
    tracing::info!(client_id = %client.client_id, "token issued (client credentials)");
    Ok(token_response(
        s,
        &s.keys.plan(),
        Grantee {
            subject: &client.client_id,
            groups: &[],
        },
        client,
        &scope,
        None,
        "client_credentials",
    ))
}

/// Whom a grant's tokens speak for: the subject, and the groups they carry.
#[derive(Clone, Copy)]
struct Grantee<'a> {
    subject: &'a str,
    groups: &'a [String],
}

fn token_response(
    s: &AuthServer,
    planned: &Planned,
    grantee: Grantee,
    client: &Client,
    scope: &str,
    refresh: Option<String>,
    grant_type: &'static str,
) -> Response {
    crate::metrics::get()
        .auth_issued
        .with_label_values(&[grant_type])
        .inc();
    let scopes: BTreeSet<String> = scope.split_whitespace().map(str::to_owned).collect();
    let (access, expires_in) = s.keys.issue_as(
        planned,
        grantee.subject,
        &client.client_id,
        &scopes,
        grantee.groups,
    );
    let mut out = json!({
        "access_token": access,
        "token_type": "Bearer",
        "expires_in": expires_in,
        "scope": scope,
    });
    if let Some(r) = refresh {
        out["refresh_token"] = json!(r);
    }
    json_response(StatusCode::OK, out)
}

/// A new refresh token in `family`, recording the access token issued with it.
async fn new_refresh(
    s: &AuthServer,
    family: &str,
    planned: &Planned,
    client: &Client,
    grantee: Grantee<'_>,
    resource: &str,
    scope: &str,
) -> Result<Option<String>, AuthStoreError> {
    if !client.grant_types.iter().any(|g| g == "refresh_token") {
        return Ok(None);
    }
    let token = random_token();
    let row = Refresh {
        token_hash: hash_secret(&token),
        family: family.to_owned(),
        client_id: client.client_id.clone(),
        subject: grantee.subject.to_owned(),
        resource: resource.to_owned(),
        scope: scope.to_owned(),
        expires_at: now_secs() + s.config.refresh_ttl.as_secs() as i64,
        groups: grantee.groups.to_vec(),
        access: Some((planned.jti.clone(), planned.exp)),
    };
    s.store.add_refresh(&row).await?;
    Ok(Some(token))
}
