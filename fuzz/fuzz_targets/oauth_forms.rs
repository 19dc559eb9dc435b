//! The built-in authorization server's bodies: `/token`, `/revoke`, `/register`, and the
//! sign-in and consent forms, through its real routes (axum's form and JSON extractors, the
//! handlers, the SQLite store).
//!
//! The input is `ENDPOINT\nAUTHORIZATION\nBODY`: ENDPOINT one of `token`, `revoke`,
//! `register`, `login`, `consent`; AUTHORIZATION the header's value (empty: none, e.g.
//! `Basic ...` for a confidential client); BODY the rest. The store holds three clients (see
//! the fuzz crate's lib.rs) and nothing else: no codes, refresh tokens or sign-ins, and
//! registrations are refused for the rate limit after their checks.
//!
//! Invariants: no input makes the server fail (5xx) or panic; an OAuth error body is JSON
//! with an `error`; `/token` issues a token only to a client that proved it knows its secret;
//! the forms never succeed without a sign-in in progress.

#![no_main]

use std::net::SocketAddr;
use std::sync::OnceLock;

use axum::Router;
use axum::body::Body;
use axum::extract::ConnectInfo;
use axum::http::{Method, Request, header};
use base64::Engine;
use http_body_util::BodyExt;
use libfuzzer_sys::fuzz_target;
use mcp_gateway::auth::server;
use mcp_gateway_fuzz::{SECRET, setup};
use tower::ServiceExt;

fuzz_target!(|data: &[u8]| {
    let mut parts = data.splitn(3, |b| *b == b'\n');
    let (Some(endpoint), Some(authorization)) = (parts.next(), parts.next()) else {
        return;
    };
    let body = parts.next().unwrap_or_default();
    let (path, content_type) = match endpoint {
        b"token" => ("/token", "application/x-www-form-urlencoded"),
        b"revoke" => ("/revoke", "application/x-www-form-urlencoded"),
        b"register" => ("/register", "application/json"),
        b"login" => ("/authorize/login", "application/x-www-form-urlencoded"),
        b"consent" => ("/authorize/consent", "application/x-www-form-urlencoded"),
        _ => return,
    };
    let mut request = Request::builder()
        .method(Method::POST)
        .uri(path)
        .header(header::HOST, "gw.example.com")
        .header(header::CONTENT_TYPE, content_type);
    if !authorization.is_empty() {
        request = request.header(header::AUTHORIZATION, authorization);
    }
    let Ok(mut request) = request.body(Body::from(body.to_vec())) else {
        // A header value hyper would not have let through.
        return;
    };
    request
        .extensions_mut()
        .insert(ConnectInfo(SocketAddr::from(([127, 0, 0, 1], 40000))));

    let s = setup();
    let (status, answer) = s.runtime.block_on(async {
        let response = router().clone().oneshot(request).await.expect("infallible");
        let status = response.status();
        let bytes = response.into_body().collect().await.unwrap().to_bytes();
        (status, bytes)
    });

    assert!(
        !status.is_server_error(),
        "{status} for {:?}: {}",
        String::from_utf8_lossy(data),
        String::from_utf8_lossy(&answer)
    );
    // An answer of the handler's is JSON naming the OAuth error; axum's extractors answer a
    // body they cannot read in plain text.
    if matches!(endpoint, b"token" | b"revoke" | b"register")
        && status.is_client_error()
        && let Ok(v) = serde_json::from_slice::<serde_json::Value>(&answer)
    {
        assert!(v["error"].is_string(), "an OAuth error names its code: {v}");
    }
    if endpoint == b"token" && status.is_success() {
        assert!(
            proves_secret(authorization, body),
            "a token was issued without the client's secret: {:?}",
            String::from_utf8_lossy(data)
        );
    }
    if matches!(endpoint, b"login" | b"consent") {
        assert!(
            status.is_client_error(),
            "{status}: a form succeeded with no sign-in in progress"
        );
    }
});

/// The authorization server's routes, built once.
fn router() -> &'static Router {
    static ROUTER: OnceLock<Router> = OnceLock::new();
    ROUTER.get_or_init(|| server::router(setup().auth.clone()))
}

/// Whether the request carries the confidential clients' secret, in HTTP Basic or the form.
fn proves_secret(authorization: &[u8], body: &[u8]) -> bool {
    let decoded = |x: &str| {
        url::form_urlencoded::parse(format!("x={x}").as_bytes())
            .next()
            .map(|(_, v)| v.into_owned())
    };
    let basic = std::str::from_utf8(authorization)
        .ok()
        .and_then(|v| v.get(6..))
        .and_then(|b| {
            base64::engine::general_purpose::STANDARD
                .decode(b.trim())
                .ok()
        })
        .and_then(|b| String::from_utf8(b).ok())
        .and_then(|s| s.split_once(':').and_then(|(_, secret)| decoded(secret)))
        .is_some_and(|secret| secret == SECRET);
    let form = url::form_urlencoded::parse(body).any(|(k, v)| k == "client_secret" && v == SECRET);
    basic || form
}
