//! What the authorization server and the resource say of themselves: the authorization
//! server metadata (RFC 8414, also served as OpenID configuration), the protected resource
//! metadata (RFC 9728), the signing keys as a JWKS, and the stylesheet of the sign-in pages.
//! Read-only answers: nothing here changes state.

use axum::extract::State;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};

use super::{AuthServer, St, json_response, server};
use crate::auth::pages;

impl AuthServer {
    fn metadata(&self) -> Value {
        let i = &self.issuer;
        json!({
            "issuer": i,
            "authorization_endpoint": format!("{i}/authorize"),
            "token_endpoint": format!("{i}/token"),
            "registration_endpoint": format!("{i}/register"),
            "revocation_endpoint": format!("{i}/revoke"),
            "jwks_uri": format!("{i}/jwks.json"),
            "scopes_supported": self.scopes_supported(),
            "response_types_supported": ["code"],
            "response_modes_supported": ["query"],
            "grant_types_supported": ["authorization_code", "refresh_token", "client_credentials"],
            "token_endpoint_auth_methods_supported": ["none", "client_secret_basic", "client_secret_post"],
            "revocation_endpoint_auth_methods_supported": ["none", "client_secret_basic", "client_secret_post"],
            "code_challenge_methods_supported": ["S256"],
            "client_id_metadata_document_supported": true,
            "authorization_response_iss_parameter_supported": true,
            "subject_types_supported": ["public"],
            "id_token_signing_alg_values_supported": ["ES256"],
        })
    }
}

pub(super) async fn resource_metadata(State(auth): St) -> Response {
    json_response(StatusCode::OK, auth.resource_metadata())
}

pub(super) async fn resource_metadata_at(
    State(auth): St,
    axum::extract::Path(path): axum::extract::Path<String>,
) -> Response {
    let ours = url::Url::parse(&auth.resource)
        .map(|u| u.path().trim_matches('/').to_owned())
        .unwrap_or_default();
    if path.trim_matches('/') == ours {
        json_response(StatusCode::OK, auth.resource_metadata())
    } else {
        StatusCode::NOT_FOUND.into_response()
    }
}

pub(super) async fn as_metadata(State(auth): St) -> Response {
    json_response(StatusCode::OK, server(&auth).metadata())
}

pub(super) async fn jwks(State(auth): St) -> Response {
    json_response(StatusCode::OK, server(&auth).keys.jwks())
}

pub(super) async fn style() -> Response {
    let mut r = pages::STYLE.into_response();
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/css; charset=utf-8"),
    );
    r
}
