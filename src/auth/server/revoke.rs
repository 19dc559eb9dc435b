//! Token revocation (RFC 7009, `POST /revoke`), and revoking a whole grant, which the token
//! endpoint also does when a code or refresh token is replayed: the refresh token family,
//! and the access tokens issued with it that may still be valid. A client may revoke only
//! its own tokens; unknown tokens get 200 too, so the answer tells nothing.

use axum::extract::{Form, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};

use super::client_auth::authenticate_client;
use super::token::TokenForm;
use super::{AuthServer, ClientAddr, OAuthError, St, no_store, server};
use crate::auth::store::AuthStoreError;
use crate::auth::{hash_secret, now_secs};

/// Revokes a grant: its refresh token family, the access tokens issued with them, and
/// `access` (a code's first access token, issued with no refresh token when the client has
/// none).
pub(super) async fn revoke_grant(
    s: &AuthServer,
    family: &str,
    access: Option<(&str, i64)>,
) -> Result<(), AuthStoreError> {
    let mut live = s.store.revoke_family(family, now_secs()).await?;
    live.extend(access.map(|(jti, exp)| (jti.to_owned(), exp)));
    s.keys.revoke_jtis(&live).await
}

/// Token revocation (RFC 7009): a refresh token revokes its whole grant, the access tokens
/// issued with it included (§2.1); an access token is refused from now on. Unknown tokens get
/// 200 too.
pub(super) async fn revoke(
    State(auth): St,
    ClientAddr(addr): ClientAddr,
    headers: HeaderMap,
    Form(f): Form<TokenForm>,
) -> Result<Response, OAuthError> {
    let s = server(&auth);
    let client = authenticate_client(s, &headers, addr, &f).await?;
    let Some(token) = f.token.as_deref().filter(|t| !t.is_empty()) else {
        return Err(OAuthError::InvalidRequest("token is required".into()));
    };
    match s.store.refresh(&hash_secret(token)).await? {
        Some(r) if r.client_id == client.client_id => {
            revoke_grant(s, &r.family, None).await?;
            tracing::info!(client_id = %client.client_id, "refresh token revoked");
        }
        _ => {
            if let Ok(p) = auth.validate(token).await
                && p.client_id == client.client_id
                && s.keys.revoke_access(token).await?
            {
                tracing::info!(client_id = %client.client_id, "access token revoked");
            }
        }
    }
    Ok(no_store(StatusCode::OK.into_response()))
}
