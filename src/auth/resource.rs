//! The resource server: the bearer token of every request to `/mcp`, and the protected
//! resource metadata (RFC 9728) that tells a client where to get one.

use axum::http::{HeaderMap, HeaderValue, StatusCode, Uri, header};

use super::{Auth, Principal, TokenError};

/// Why a request to `/mcp` is not authorized.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AuthError {
    #[error("Unauthorized: this endpoint needs a bearer token (see the resource metadata)")]
    Missing,
    #[error("Bad Request: access tokens go in the Authorization header, never in the URL")]
    TokenInQuery,
    #[error("Bad Request: the Authorization header is not a single bearer token")]
    MalformedHeader,
    #[error("Unauthorized: {0}")]
    Invalid(TokenError),
    #[error("Forbidden: the token lacks the scope this needs: {}", .0.join(" "))]
    InsufficientScope(Vec<String>),
    /// The external authorization server could not be asked about the token (why is
    /// logged; the client is told no more than that).
    #[error(
        "Service Unavailable: the authorization server cannot be asked about this token; retry later"
    )]
    Unavailable,
    /// A plugin or tool whose `allow_groups` / `allow_subjects` leave the token's subject
    /// out: answered like a missing scope (the scopes it would need besides are named).
    #[error("Forbidden: this plugin or tool is not open to the token's subject or groups")]
    NotAllowed(Vec<String>),
}

impl AuthError {
    /// The refusal as a metrics label.
    pub fn reason(&self) -> &'static str {
        match self {
            AuthError::Missing => "missing_token",
            AuthError::TokenInQuery | AuthError::MalformedHeader => "invalid_request",
            AuthError::Invalid(_) => "invalid_token",
            AuthError::InsufficientScope(_) => "insufficient_scope",
            AuthError::Unavailable => "issuer_unavailable",
            AuthError::NotAllowed(_) => "not_allowed",
        }
    }
}

/// A refusal's HTTP form: status and `WWW-Authenticate`.
#[derive(Debug, Clone)]
pub struct Challenge {
    pub status: StatusCode,
    pub www_authenticate: HeaderValue,
}

impl Auth {
    /// The principal of a request to `/mcp`: `None` when authorization is off.
    pub async fn authenticate(
        &self,
        headers: &HeaderMap,
        uri: &Uri,
    ) -> Result<Option<Principal>, AuthError> {
        if !self.enabled() {
            return Ok(None);
        }
        if uri.query().is_some_and(|q| {
            q.split('&')
                .any(|kv| kv.split('=').next() == Some("access_token"))
        }) {
            return Err(AuthError::TokenInQuery);
        }
        let mut values = headers.get_all(header::AUTHORIZATION).iter();
        let Some(value) = values.next() else {
            return Err(AuthError::Missing);
        };
        if values.next().is_some() {
            return Err(AuthError::MalformedHeader);
        }
        let token = value
            .to_str()
            .ok()
            .and_then(|v| {
                let (scheme, token) = v.split_once(' ')?;
                scheme.eq_ignore_ascii_case("bearer").then(|| token.trim())
            })
            .filter(|t| !t.is_empty() && !t.contains(' '))
            .ok_or(AuthError::MalformedHeader)?;
        let mut principal = self.validate(token).await.map_err(|e| match e {
            TokenError::Unavailable(why) => {
                tracing::warn!("a bearer token could not be checked: {why}");
                AuthError::Unavailable
            }
            e => AuthError::Invalid(e),
        })?;
        if !principal.has_all(self.required_scopes()) {
            return Err(AuthError::InsufficientScope(
                self.required_scopes().to_vec(),
            ));
        }
        if self.config.mode == crate::config::AuthMode::External {
            principal.token = Some(super::Bearer::new(token));
        }
        Ok(Some(principal))
    }

    /// The status and `WWW-Authenticate` for a refusal (RFC 6750 §3, RFC 9728 §5.1).
    pub fn challenge(&self, e: &AuthError) -> Challenge {
        crate::metrics::get()
            .auth_refused
            .with_label_values(&[e.reason()])
            .inc();
        let scope = self.required_scopes().join(" ");
        let (status, parts) = match e {
            AuthError::Missing => (StatusCode::UNAUTHORIZED, vec![("scope", scope)]),
            AuthError::TokenInQuery | AuthError::MalformedHeader => (
                StatusCode::BAD_REQUEST,
                vec![("error", "invalid_request".into()), ("scope", scope)],
            ),
            AuthError::Invalid(why) => (
                StatusCode::UNAUTHORIZED,
                vec![
                    ("error", "invalid_token".into()),
                    ("error_description", why.to_string()),
                    ("scope", scope),
                ],
            ),
            AuthError::InsufficientScope(needed) => (
                StatusCode::FORBIDDEN,
                vec![
                    ("error", "insufficient_scope".into()),
                    ("scope", needed.join(" ")),
                    (
                        "error_description",
                        "the token lacks a scope this request needs".into(),
                    ),
                ],
            ),
            // No error code: the token was not refused, only not checked yet.
            AuthError::Unavailable => (StatusCode::SERVICE_UNAVAILABLE, vec![]),
            AuthError::NotAllowed(needed) => (
                StatusCode::FORBIDDEN,
                vec![
                    ("error", "insufficient_scope".into()),
                    ("scope", needed.join(" ")),
                    (
                        "error_description",
                        "this plugin or tool is not open to the token's subject or groups".into(),
                    ),
                ],
            ),
        };
        let mut value = format!("Bearer resource_metadata=\"{}\"", self.metadata_url);
        for (k, v) in parts {
            // Quoted strings: no quotes or backslashes inside (RFC 6750 §3).
            let v: String = v.chars().filter(|c| *c != '"' && *c != '\\').collect();
            value.push_str(&format!(", {k}=\"{v}\""));
        }
        Challenge {
            status,
            www_authenticate: HeaderValue::from_str(&value)
                .unwrap_or_else(|_| HeaderValue::from_static("Bearer")),
        }
    }

    /// Protected resource metadata (RFC 9728 §2).
    pub fn resource_metadata(&self) -> serde_json::Value {
        serde_json::json!({
            "resource": self.resource,
            "authorization_servers": [self.issuer],
            "scopes_supported": self.required_scopes(),
            "bearer_methods_supported": ["header"],
            "resource_name": "mcp-gateway",
        })
    }
}
