//! Signing in on the people's credential pages (the connect page and `/connections`) at the
//! OpenID provider of `[auth.upstream]`: the provider people sign in at in mode `builtin`, or
//! in mode `external` the issuer whose tokens name them. The page's button sends the person
//! there (a code request with PKCE S256, a `state` and a `nonce`, through `auth::upstream`
//! and the `oauth2` crate); what the flow remembers (the page it came from, the leg's secrets,
//! until when) is sealed under the storage key in a cookie of this browser (`SameSite=Lax`:
//! the provider sends the person back by a top-level navigation). Back at
//! [`PAGES_CALLBACK_PATH`], the ID token says who they are, in the terms their tokens to the
//! gateway use (the allow-lists apply), and the page goes on as after a local sign-in: the
//! link's form for the subject it was made for (anyone else is refused, nothing stored), or
//! their connections.

use std::sync::Arc;

use axum::Router;
use axum::extract::{Form, Path, Query, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use serde::{Deserialize, Serialize};

use super::Edge;
use super::connect::{cookie_name, message, secure};
use crate::auth::pages::cookie;
use crate::auth::upstream::{Leg, PAGES_CALLBACK_PATH};

/// How long a person has at the provider.
const FLOW_TTL_MS: i64 = 10 * 60 * 1000;

pub fn router(edge: Arc<Edge>) -> Router {
    Router::new()
        .route("/connect/{id}/signin", post(from_connect))
        .route("/connections/signin", post(from_connections))
        .route(PAGES_CALLBACK_PATH, get(callback))
        .with_state(edge)
}

fn flow_cookie(secure: bool) -> &'static str {
    if secure {
        "__Host-mcpgw-signin"
    } else {
        "mcpgw-signin"
    }
}

/// Which page the person goes back to.
#[derive(Serialize, Deserialize)]
enum Back {
    Connect(String),
    Connections,
}

/// What the flow remembers, sealed in the browser's cookie.
#[derive(Serialize, Deserialize)]
struct Flow {
    back: Back,
    leg: Leg,
    until_ms: i64,
}

#[derive(Deserialize)]
struct Button {
    csrf: String,
}

fn refused_csrf() -> Response {
    message(
        StatusCode::FORBIDDEN,
        "csrf",
        "Refused",
        "This form was not opened in this browser. Open the page again.",
    )
}

/// `POST /connect/{id}/signin`: the connect page's button.
async fn from_connect(
    State(edge): State<Arc<Edge>>,
    Path(id): Path<String>,
    headers: HeaderMap,
    Form(f): Form<Button>,
) -> Response {
    let bound = cookie(&headers, cookie_name(secure(&edge)))
        .is_some_and(|c| !f.csrf.is_empty() && crate::auth::constant_time_eq(c, &f.csrf));
    if !bound || id.len() > 64 || !id.bytes().all(|b| b.is_ascii_hexdigit()) {
        return refused_csrf();
    }
    begin(&edge, Back::Connect(id)).await
}

/// `POST /connections/signin`: the connections page's button.
async fn from_connections(
    State(edge): State<Arc<Edge>>,
    headers: HeaderMap,
    Form(f): Form<Button>,
) -> Response {
    let bound = cookie(&headers, super::connections::cookie_name(secure(&edge)))
        .is_some_and(|c| !f.csrf.is_empty() && crate::auth::constant_time_eq(c, &f.csrf));
    if !bound {
        return refused_csrf();
    }
    begin(&edge, Back::Connections).await
}

/// Sends the person to the provider, the flow sealed in this browser's cookie.
async fn begin(edge: &Edge, back: Back) -> Response {
    let (Some(up), Some(broker)) = (edge.signin.as_ref(), edge.sessions.supervisor.credentials())
    else {
        return message(
            StatusCode::NOT_FOUND,
            "no-signin",
            "Not available",
            "This gateway offers no sign-in at an identity provider here.",
        );
    };
    let (url, leg) = match up.begin("").await {
        Ok(started) => started,
        Err(e) => {
            tracing::warn!("pages' sign-in at the provider cannot start: {e}");
            return message(
                StatusCode::BAD_GATEWAY,
                "provider-down",
                "Not available",
                &format!(
                    "{} cannot be reached to sign you in; try again in a moment.",
                    up.display_name()
                ),
            );
        }
    };
    let flow = Flow {
        back,
        leg,
        until_ms: crate::audit::now_ms() + FLOW_TTL_MS,
    };
    let sealed = match broker.seal_signin(&serde_json::to_vec(&flow).expect("serializable")) {
        Ok(s) => s,
        Err(e) => {
            tracing::error!("pages' sign-in: {e}");
            return message(
                StatusCode::SERVICE_UNAVAILABLE,
                "unavailable",
                "Not available",
                "The gateway cannot start the sign-in now.",
            );
        }
    };
    let mut r = StatusCode::SEE_OTHER.into_response();
    if let Ok(v) = HeaderValue::from_str(&url) {
        r.headers_mut().insert(header::LOCATION, v);
    }
    let secure = secure(edge);
    let cookie = format!(
        "{}={sealed}; Path=/; HttpOnly; SameSite=Lax; Max-Age={}{}",
        flow_cookie(secure),
        FLOW_TTL_MS / 1000,
        if secure { "; Secure" } else { "" }
    );
    if let Ok(v) = HeaderValue::from_str(&cookie) {
        r.headers_mut().append(header::SET_COOKIE, v);
    }
    r.headers_mut()
        .insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    r
}

#[derive(Deserialize)]
struct Returned {
    #[serde(default)]
    code: Option<String>,
    #[serde(default)]
    state: Option<String>,
    #[serde(default)]
    error: Option<String>,
}

/// `GET /connect/signin/callback`: the provider sends the person back.
async fn callback(
    State(edge): State<Arc<Edge>>,
    headers: HeaderMap,
    Query(q): Query<Returned>,
) -> Response {
    let secure = secure(&edge);
    let mut r = finish(&edge, &headers, &q, secure).await;
    // The flow is over either way.
    let clear = format!(
        "{}=; Path=/; HttpOnly; SameSite=Lax; Max-Age=0{}",
        flow_cookie(secure),
        if secure { "; Secure" } else { "" }
    );
    if let Ok(v) = HeaderValue::from_str(&clear) {
        r.headers_mut().append(header::SET_COOKIE, v);
    }
    r
}

async fn finish(edge: &Edge, headers: &HeaderMap, q: &Returned, secure: bool) -> Response {
    let mismatch = || {
        message(
            StatusCode::FORBIDDEN,
            "mismatch",
            "Refused",
            "This answer from the identity provider does not belong to a sign-in this browser started. Nothing was stored.",
        )
    };
    let (Some(up), Some(broker)) = (edge.signin.as_ref(), edge.sessions.supervisor.credentials())
    else {
        return mismatch();
    };
    let Some(flow) = cookie(headers, flow_cookie(secure))
        .and_then(|c| broker.open_signin(c))
        .and_then(|plain| serde_json::from_slice::<Flow>(&plain).ok())
    else {
        tracing::warn!("pages' sign-in: an answer without its browser's cookie refused");
        return mismatch();
    };
    if let Some(error) = &q.error {
        let said: String = error.chars().take(100).collect();
        return message(
            StatusCode::FORBIDDEN,
            "denied",
            "Not signed in",
            &format!("The identity provider did not sign you in ({said})."),
        );
    }
    let (Some(code), Some(state)) = (&q.code, &q.state) else {
        return message(
            StatusCode::BAD_REQUEST,
            "malformed",
            "Refused",
            "The identity provider sent the browser back without a code.",
        );
    };
    let state_ok =
        crate::auth::constant_time_eq(&crate::auth::hash_secret(state), &flow.leg.state_hash);
    if !state_ok || flow.until_ms <= crate::audit::now_ms() {
        tracing::warn!("pages' sign-in: a state not its own, or a flow too old, refused");
        return mismatch();
    }
    let who = match up.finish(code, &flow.leg).await {
        Ok(who) => who,
        Err(crate::auth::upstream::UpstreamError::NotAllowed(why)) => {
            return message(StatusCode::FORBIDDEN, "not-allowed", "Not allowed", &why);
        }
        Err(e) => {
            tracing::warn!("pages' sign-in: {e}");
            return message(
                StatusCode::BAD_GATEWAY,
                "provider-refused",
                "Not signed in",
                "The identity provider's answer could not be used. Try again.",
            );
        }
    };
    match flow.back {
        Back::Connect(id) => super::connect::signed_in(edge, &id, &who.subject).await,
        Back::Connections => super::connections::signed_in(edge, &who.subject).await,
    }
}
