//! How the authorization server says no.
//!
//! [`OAuthError`] is every error kind its endpoints answer with (RFC 6749 §4.1.2.1 and §5.2,
//! RFC 7591 §3.2.2, RFC 8707 §2, RFC 7009 §2.2), each mapped here, and only here, to its HTTP
//! status and its `error` code. `/register`, `/token` and `/revoke` answer with it as a JSON
//! body `{"error", "error_description"}` that is never cached; `/authorize` sends it to the
//! client's redirect URI once that URI is verified. [`PageError`] is what a person's browser
//! is shown instead while there is no verified redirect URI to send an error to.
//!
//! A database failure is logged with its cause; the client only learns that the database
//! failed. Every refusal is counted (`auth_refused`, by code). This module never decides
//! whether a request is refused: the endpoints do.

use std::time::Duration;

use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde_json::json;

use super::{Lookup, json_response};
use crate::auth::pages;
use crate::auth::store::AuthStoreError;

/// An OAuth error: its kind says the `error` code and the HTTP status; the text is the
/// `error_description`.
#[derive(Debug, thiserror::Error)]
pub enum OAuthError {
    /// A parameter is missing or malformed (RFC 6749 §4.1.2.1, §5.2).
    #[error("invalid_request: {0}")]
    InvalidRequest(String),
    /// Client authentication failed (RFC 6749 §5.2). `basic`: the client tried HTTP Basic,
    /// so the answer carries a Basic challenge.
    #[error("invalid_client: {description}")]
    InvalidClient { description: String, basic: bool },
    /// The code or refresh token is unknown, expired, used, revoked, or not this client's,
    /// resource's or redirect URI's; or the PKCE verifier does not match (RFC 6749 §5.2).
    #[error("invalid_grant: {0}")]
    InvalidGrant(String),
    /// The client may not use this grant (RFC 6749 §4.1.2.1, §5.2).
    #[error("unauthorized_client: {0}")]
    UnauthorizedClient(String),
    /// A grant type this server does not know (RFC 6749 §5.2).
    #[error("unsupported_grant_type: {0}")]
    UnsupportedGrantType(String),
    /// A response type other than `code` (RFC 6749 §4.1.2.1): sent to a redirect URI only.
    #[error("unsupported_response_type: {0}")]
    UnsupportedResponseType(String),
    /// A scope not offered here, not the client's, or not granted (RFC 6749 §4.1.2.1, §5.2).
    #[error("invalid_scope: {0}")]
    InvalidScope(String),
    /// The `resource` is not this gateway's `/mcp` (RFC 8707 §2).
    #[error("invalid_target: {0}")]
    InvalidTarget(String),
    /// The person denied the client access (RFC 6749 §4.1.2.1): sent to a redirect URI only.
    #[error("access_denied: {0}")]
    AccessDenied(String),
    /// A registration's redirect URIs are missing or not acceptable (RFC 7591 §3.2.2).
    #[error("invalid_redirect_uri: {0}")]
    InvalidRedirectUri(String),
    /// Another field of a registration is not acceptable (RFC 7591 §3.2.2).
    #[error("invalid_client_metadata: {0}")]
    InvalidClientMetadata(String),
    /// Too many registrations, metadata document fetches, or wrong client secrets from one
    /// address: `temporarily_unavailable` with 429 and `Retry-After`.
    #[error("temporarily_unavailable: {description}")]
    TooManyRequests {
        description: String,
        retry_after: Duration,
    },
    /// The authorization server's database failed: the cause is logged; the client is told
    /// only that (`temporarily_unavailable`, 503).
    #[error("the authorization store failed: {0}")]
    Store(#[from] AuthStoreError),
}

impl OAuthError {
    /// The HTTP status of the JSON answer.
    pub fn status(&self) -> StatusCode {
        match self {
            OAuthError::InvalidRequest(_)
            | OAuthError::InvalidGrant(_)
            | OAuthError::UnauthorizedClient(_)
            | OAuthError::UnsupportedGrantType(_)
            | OAuthError::UnsupportedResponseType(_)
            | OAuthError::InvalidScope(_)
            | OAuthError::InvalidTarget(_)
            | OAuthError::InvalidRedirectUri(_)
            | OAuthError::InvalidClientMetadata(_) => StatusCode::BAD_REQUEST,
            OAuthError::InvalidClient { .. } => StatusCode::UNAUTHORIZED,
            OAuthError::AccessDenied(_) => StatusCode::FORBIDDEN,
            OAuthError::TooManyRequests { .. } => StatusCode::TOO_MANY_REQUESTS,
            OAuthError::Store(_) => StatusCode::SERVICE_UNAVAILABLE,
        }
    }

    /// The `error` code.
    pub fn code(&self) -> &'static str {
        match self {
            OAuthError::InvalidRequest(_) => "invalid_request",
            OAuthError::InvalidClient { .. } => "invalid_client",
            OAuthError::InvalidGrant(_) => "invalid_grant",
            OAuthError::UnauthorizedClient(_) => "unauthorized_client",
            OAuthError::UnsupportedGrantType(_) => "unsupported_grant_type",
            OAuthError::UnsupportedResponseType(_) => "unsupported_response_type",
            OAuthError::InvalidScope(_) => "invalid_scope",
            OAuthError::InvalidTarget(_) => "invalid_target",
            OAuthError::AccessDenied(_) => "access_denied",
            OAuthError::InvalidRedirectUri(_) => "invalid_redirect_uri",
            OAuthError::InvalidClientMetadata(_) => "invalid_client_metadata",
            OAuthError::TooManyRequests { .. } | OAuthError::Store(_) => "temporarily_unavailable",
        }
    }

    /// The `error_description`: what the client may be told.
    pub fn description(&self) -> &str {
        match self {
            OAuthError::InvalidRequest(d)
            | OAuthError::InvalidClient { description: d, .. }
            | OAuthError::InvalidGrant(d)
            | OAuthError::UnauthorizedClient(d)
            | OAuthError::UnsupportedGrantType(d)
            | OAuthError::UnsupportedResponseType(d)
            | OAuthError::InvalidScope(d)
            | OAuthError::InvalidTarget(d)
            | OAuthError::AccessDenied(d)
            | OAuthError::InvalidRedirectUri(d)
            | OAuthError::InvalidClientMetadata(d)
            | OAuthError::TooManyRequests { description: d, .. } => d,
            OAuthError::Store(_) => "the authorization server's database failed",
        }
    }
}

impl IntoResponse for OAuthError {
    /// The JSON answer (RFC 6749 §5.2), counted and logged.
    fn into_response(self) -> Response {
        if let OAuthError::Store(cause) = &self {
            tracing::error!("authorization store: {cause}");
        }
        let (status, error, description) = (self.status(), self.code(), self.description());
        refused(error);
        tracing::debug!(status = status.as_u16(), error, "{description}");
        let mut r = json_response(
            status,
            json!({"error": error, "error_description": description}),
        );
        if let OAuthError::InvalidClient { basic: true, .. } = &self {
            r.headers_mut().insert(
                header::WWW_AUTHENTICATE,
                HeaderValue::from_static("Basic realm=\"mcp-gateway\""),
            );
        }
        if let OAuthError::TooManyRequests { retry_after: w, .. } = &self {
            retry_after(&mut r, *w);
        }
        r
    }
}

/// A refusal shown to the person as a page, because there is no verified redirect URI to
/// send it to (the `/authorize` request and the sign-in and consent forms).
#[derive(Debug, thiserror::Error)]
pub enum PageError {
    /// The request or form cannot go on (no client, an unknown redirect URI, an expired
    /// sign-in): 400, with what was wrong.
    #[error("{0}")]
    Invalid(String),
    /// A form whose CSRF token matches neither its cookie nor the stored hash: 403.
    #[error("the form's security token did not match (cross-site request refused)")]
    CrossSite,
    /// Too many client metadata documents fetched: 429 with `Retry-After`.
    #[error("too many client metadata documents were fetched")]
    Limited(Duration),
    /// The upstream identity provider could not be used (discovery, the code exchange, the
    /// ID token): 502, with what failed (the cause is logged too).
    #[error("{0}")]
    Upstream(String),
    /// The provider signed the person in, but the allow-lists leave them out: 403, a page
    /// that says so, and no code.
    #[error("{0}")]
    NotAllowed(String),
    /// The database failed: answered as [`OAuthError::Store`] (JSON, 503), as the other
    /// endpoints answer it.
    #[error("the authorization store failed: {0}")]
    Store(#[from] AuthStoreError),
}

impl From<Lookup> for PageError {
    fn from(e: Lookup) -> PageError {
        match e {
            Lookup::Limited(wait) => PageError::Limited(wait),
            Lookup::Failed(why) => PageError::Invalid(why),
        }
    }
}

impl IntoResponse for PageError {
    fn into_response(self) -> Response {
        match self {
            PageError::Invalid(why) => pages::error(StatusCode::BAD_REQUEST, &why),
            PageError::CrossSite => pages::error(StatusCode::FORBIDDEN, &self.to_string()),
            PageError::Upstream(why) => pages::error(StatusCode::BAD_GATEWAY, &why),
            PageError::NotAllowed(why) => pages::refused(&why),
            PageError::Limited(wait) => {
                let mut r = pages::error(
                    StatusCode::TOO_MANY_REQUESTS,
                    &format!(
                        "too many client metadata documents were fetched; try again in {}",
                        wait_words(wait)
                    ),
                );
                retry_after(&mut r, wait);
                r
            }
            PageError::Store(e) => OAuthError::Store(e).into_response(),
        }
    }
}

/// Counts a refusal by the authorization server (an OAuth error code, or `bad_credentials`).
pub(super) fn refused(reason: &'static str) {
    crate::metrics::get()
        .auth_refused
        .with_label_values(&[reason])
        .inc();
}

/// A wait as people say it, rounded up: "40 seconds", "3 minutes".
pub(super) fn wait_words(wait: Duration) -> String {
    let secs = wait.as_secs() + u64::from(wait.subsec_nanos() > 0);
    match secs {
        0..=1 => "1 second".into(),
        2..=59 => format!("{secs} seconds"),
        60 => "1 minute".into(),
        _ => format!("{} minutes", secs.div_ceil(60)),
    }
}

/// `Retry-After` in whole seconds, rounded up.
pub(super) fn retry_after(response: &mut Response, wait: Duration) {
    let secs = (wait.as_secs() + u64::from(wait.subsec_nanos() > 0)).max(1);
    response
        .headers_mut()
        .insert(header::RETRY_AFTER, HeaderValue::from(secs));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn waits_are_said_rounded_up() {
        let w = |ms| wait_words(Duration::from_millis(ms));
        assert_eq!(w(300), "1 second");
        assert_eq!(w(1_200), "2 seconds");
        assert_eq!(w(59_000), "59 seconds");
        assert_eq!(w(60_000), "1 minute");
        assert_eq!(w(61_000), "2 minutes");
        assert_eq!(w(899_000), "15 minutes");
    }

    #[test]
    fn each_error_keeps_its_status_code_and_description() {
        let cases = [
            (
                OAuthError::InvalidRequest("x".into()),
                400,
                "invalid_request",
            ),
            (
                OAuthError::InvalidClient {
                    description: "x".into(),
                    basic: false,
                },
                401,
                "invalid_client",
            ),
            (OAuthError::InvalidGrant("x".into()), 400, "invalid_grant"),
            (
                OAuthError::UnauthorizedClient("x".into()),
                400,
                "unauthorized_client",
            ),
            (
                OAuthError::UnsupportedGrantType("x".into()),
                400,
                "unsupported_grant_type",
            ),
            (OAuthError::InvalidScope("x".into()), 400, "invalid_scope"),
            (OAuthError::InvalidTarget("x".into()), 400, "invalid_target"),
            (
                OAuthError::InvalidRedirectUri("x".into()),
                400,
                "invalid_redirect_uri",
            ),
            (
                OAuthError::InvalidClientMetadata("x".into()),
                400,
                "invalid_client_metadata",
            ),
            (
                OAuthError::TooManyRequests {
                    description: "x".into(),
                    retry_after: Duration::from_secs(3),
                },
                429,
                "temporarily_unavailable",
            ),
        ];
        for (e, status, code) in cases {
            assert_eq!((e.status().as_u16(), e.code()), (status, code));
            assert_eq!(e.description(), "x");
        }
        let store = OAuthError::Store(AuthStoreError::Database("secret detail".into()));
        assert_eq!(store.status(), StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(store.code(), "temporarily_unavailable");
        assert_eq!(
            store.description(),
            "the authorization server's database failed"
        );
    }

    #[test]
    fn the_answer_carries_its_headers() {
        let r = OAuthError::InvalidClient {
            description: "x".into(),
            basic: true,
        }
        .into_response();
        assert_eq!(r.status(), StatusCode::UNAUTHORIZED);
        assert!(r.headers().contains_key(header::WWW_AUTHENTICATE));
        assert_eq!(r.headers()[header::CACHE_CONTROL], "no-store");
        let r = OAuthError::TooManyRequests {
            description: "x".into(),
            retry_after: Duration::from_millis(1_500),
        }
        .into_response();
        assert_eq!(r.headers()[header::RETRY_AFTER], "2");
    }
}
