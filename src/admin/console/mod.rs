//! The console: `/ui` on the admin listener, for operators who would rather look than read.
//! Four views (overview, plugins, sessions, audit) on one page, server-rendered as a shell
//! and filled from JSON under `/ui/api/` that the page polls every two seconds; plots are
//! drawn on canvases by the page's own script.
//!
//! Why this shape: the assets are three small files of our own, built into the binary with
//! `include_str!`, so the console works offline, needs no front-end build step (the build
//! stays `cargo build`) and no third-party code, and can be served under a strict Content
//! Security Policy (no inline script or style, nothing from elsewhere). Polling rather than
//! SSE: a view's data is a few kilobytes every two seconds, and a poll survives any proxy
//! and a restarted gateway without reconnection logic.
//!
//! Sign-in is with the admin token ([`signin`]), exchanged for an `HttpOnly`,
//! `SameSite=Strict` cookie; every change also needs the session's CSRF token in a header,
//! and a sign-in or change that says it comes from another site is refused. The actions go
//! to the admin API's own handlers, so they validate and refuse exactly as the API does, and
//! each is in the audit log as the console's. Without an admin token the console is off; it
//! is never on the public listener.

mod series;
mod signin;

use std::sync::Arc;
use std::time::Instant;

use axum::Router;
use axum::extract::{Request, State};
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::{Html, IntoResponse, Response};
use axum::routing::{get, post};
use serde_json::{Value, json};

use super::guard::AdminGuard;
use super::{audit, sessions};
use crate::gateway::Gateway;
pub use series::Series;
use signin::{COOKIE, SignIns};

const LOGIN_HTML: &str = include_str!("assets/login.html");
const APP_HTML: &str = include_str!("assets/app.html");
const CSS: &str = include_str!("assets/console.css");
const JS: &str = include_str!("assets/console.js");

/// What the console keeps: who is signed in, and the plots' data.
pub struct Console {
    signins: SignIns,
    series: Arc<Series>,
}

/// The console's routes (off, with a 404 that says why, without an admin token).
pub fn router(gw: &Arc<Gateway>) -> Router<Arc<Gateway>> {
    if gw.config.admin.token.is_none() {
        return Router::new()
            .route("/ui", get(off))
            .route("/ui/{*rest}", axum::routing::any(off));
    }
    let console = Arc::new(Console {
        signins: SignIns::default(),
        series: Series::start(gw),
    });
    let api = Router::new()
        .route("/ui/api/overview", get(overview))
        .route("/ui/api/plugins", get(plugins).post(super::add))
        .route("/ui/api/plugins/{name}", axum::routing::put(super::update))
        .route("/ui/api/plugins/{name}/enable", post(super::enable))
        .route("/ui/api/plugins/{name}/disable", post(super::disable))
        .route("/ui/api/plugins/{name}/restart", post(super::restart))
        .route("/ui/api/sessions", get(sessions::list))
        .route(
            "/ui/api/sessions/{key}",
            axum::routing::delete(sessions::delete),
        )
        .route("/ui/api/audit", get(audit::list))
        .route(
            "/ui/api/credentials",
            get(super::credentials::console).post(super::credentials::add),
        )
        .route(
            "/ui/api/credentials/{name}",
            axum::routing::put(super::credentials::put).delete(super::credentials::remove),
        )
        .route(
            "/ui/api/credentials/{name}/connections",
            axum::routing::delete(super::credentials::revoke_all),
        )
        .route(
            "/ui/api/credentials/{name}/connections/{subject}",
            axum::routing::delete(super::credentials::revoke_one),
        )
        .route("/ui/logout", post(sign_out))
        .layer(middleware::from_fn_with_state(
            gw.clone(),
            audit::record_actions,
        ))
        .layer(middleware::from_fn(signed_in));
    Router::new()
        .route("/ui", get(page))
        .route("/ui/", get(page))
        .route("/ui/login", post(sign_in))
        .route("/ui/assets/{file}", get(asset))
        .merge(api)
        .layer(middleware::from_fn(headers))
        .layer(axum::Extension(console))
}

async fn off() -> Response {
    (
        StatusCode::NOT_FOUND,
        axum::Json(json!({
            "error": "the console is off: set admin.token (--admin-token) to turn it on"
        })),
    )
        .into_response()
}

/// Headers on every console response: nothing from elsewhere, no framing, no caching, no
/// sniffing, no referrer beyond the console itself.
async fn headers(request: Request, next: Next) -> Response {
    let mut response = next.run(request).await;
    let h = response.headers_mut();
    h.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(
            "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; \
             connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'",
        ),
    );
    h.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    h.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    h.insert(
        header::REFERRER_POLICY,
        HeaderValue::from_static("same-origin"),
    );
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    response
}

/// Whether a request says it comes from another site. A browser's `Sec-Fetch-Site` decides
/// when there is one (same-origin, or none: typed in); without it, an `Origin` whose host is
/// not the request's `Host`. An opaque `null` origin is not a site.
fn cross_site(headers: &HeaderMap) -> bool {
    if let Some(site) = headers.get("sec-fetch-site") {
        return !matches!(site.to_str(), Ok("same-origin" | "none"));
    }
    let Some(origin) = headers.get(header::ORIGIN).and_then(|o| o.to_str().ok()) else {
        return false;
    };
    if origin == "null" {
        return false;
    }
    let host = headers.get(header::HOST).and_then(|v| v.to_str().ok());
    let origin_host = url::Url::parse(origin).ok().map(|u| match u.port() {
        Some(p) => format!("{}:{p}", u.host_str().unwrap_or_default()),
        None => u.host_str().unwrap_or_default().to_owned(),
    });
    origin_host.is_none() || origin_host.as_deref() != host
}

/// `GET /ui`: the console when signed in, else the sign-in page.
async fn page(
    axum::Extension(console): axum::Extension<Arc<Console>>,
    headers: HeaderMap,
) -> Response {
    match signin::cookie(&headers).and_then(|id| console.signins.get(id)) {
        Some(signed) => Html(
            APP_HTML
                .replace("{{csrf}}", &signed.csrf)
                .replace("{{version}}", env!("CARGO_PKG_VERSION")),
        )
        .into_response(),
        None => Html(LOGIN_HTML.replace("{{error}}", "")).into_response(),
    }
}

fn login_refused(status: StatusCode, why: &str) -> Response {
    let message = format!(r#"<p class="error" role="alert">{why}</p>"#);
    (status, Html(LOGIN_HTML.replace("{{error}}", &message))).into_response()
}

/// `POST /ui/login` (a form with `token`): a session cookie for the right token.
async fn sign_in(
    State(gw): State<Arc<Gateway>>,
    axum::Extension(console): axum::Extension<Arc<Console>>,
    axum::Extension(guard): axum::Extension<Arc<AdminGuard>>,
    request: Request,
) -> Response {
    let started = Instant::now();
    let address = super::guard::peer(&request);
    let (parts, body) = request.into_parts();
    let headers = parts.headers;
    let Ok(body) = axum::body::to_bytes(body, 4096).await else {
        return login_refused(StatusCode::PAYLOAD_TOO_LARGE, "The form is too large.");
    };
    if cross_site(&headers) {
        return login_refused(
            StatusCode::FORBIDDEN,
            "Sign-in refused: the form was sent from another site.",
        );
    }
    if let Err(wait) = guard.throttled(address) {
        let mut r = login_refused(
            StatusCode::TOO_MANY_REQUESTS,
            "Too many failed sign-ins from this address: wait a minute and try again.",
        );
        r.headers_mut()
            .insert(header::RETRY_AFTER, HeaderValue::from(wait.as_secs() + 1));
        return r;
    }
    let given = url::form_urlencoded::parse(&body)
        .find(|(k, _)| k == "token")
        .map(|(_, v)| v.into_owned())
        .unwrap_or_default();
    let expected = gw.config.admin.token.as_deref().unwrap_or_default();
    if expected.is_empty() || !crate::auth::constant_time_eq(&given, expected) {
        guard.failed(address);
        gw.audit
            .auth_failed("console.sign_in", address, started.elapsed());
        return login_refused(StatusCode::UNAUTHORIZED, "Wrong token.");
    }
    guard.succeeded(address);
    let (id, _) = console.signins.open();
    gw.audit
        .admin("console", "console.sign_in", None, 200, started.elapsed());
    let cookie = format!(
        "{COOKIE}={id}; Path=/ui; HttpOnly; SameSite=Strict; Max-Age={}",
        signin::LIFETIME.as_secs()
    );
    (
        StatusCode::SEE_OTHER,
        [
            (header::SET_COOKIE, cookie),
            (header::LOCATION, "/ui".to_owned()),
        ],
    )
        .into_response()
}

/// `POST /ui/logout`: the session ends, the cookie goes.
async fn sign_out(
    axum::Extension(console): axum::Extension<Arc<Console>>,
    headers: HeaderMap,
) -> Response {
    if let Some(id) = signin::cookie(&headers) {
        console.signins.close(id);
    }
    (
        StatusCode::NO_CONTENT,
        [(
            header::SET_COOKIE,
            format!("{COOKIE}=; Path=/ui; HttpOnly; SameSite=Strict; Max-Age=0"),
        )],
    )
        .into_response()
}

/// Lets in only signed-in browsers; a change also needs the session's CSRF token and must
/// not come from another site.
async fn signed_in(
    axum::Extension(console): axum::Extension<Arc<Console>>,
    mut request: Request,
    next: Next,
) -> Response {
    let Some(signed) = signin::cookie(request.headers()).and_then(|id| console.signins.get(id))
    else {
        return refuse(StatusCode::UNAUTHORIZED, "sign in first (POST /ui/login)");
    };
    if !matches!(*request.method(), Method::GET | Method::HEAD) {
        let given = request
            .headers()
            .get("x-csrf-token")
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default();
        if !crate::auth::constant_time_eq(given, &signed.csrf) {
            return refuse(StatusCode::FORBIDDEN, "missing or wrong X-CSRF-Token");
        }
        if cross_site(request.headers()) {
            return refuse(StatusCode::FORBIDDEN, "the request came from another site");
        }
    }
    request.extensions_mut().insert(audit::Actor("console"));
    next.run(request).await
}

fn refuse(status: StatusCode, why: &str) -> Response {
    (status, axum::Json(json!({ "error": why }))).into_response()
}

async fn asset(axum::extract::Path(file): axum::extract::Path<String>) -> Response {
    let (body, kind) = match file.as_str() {
        "console.css" => (CSS, "text/css; charset=utf-8"),
        "console.js" => (JS, "text/javascript; charset=utf-8"),
        _ => return refuse(StatusCode::NOT_FOUND, "no such asset"),
    };
    ([(header::CONTENT_TYPE, kind)], body).into_response()
}

/// `GET /ui/api/overview`: the plots of all plugins together, the counts now, the rate limits.
async fn overview(
    State(gw): State<Arc<Gateway>>,
    axum::Extension(console): axum::Extension<Arc<Console>>,
) -> Response {
    let entries = gw.registry.entries();
    let ready = entries
        .iter()
        .filter(|e| e.enabled && matches!(e.state(), crate::registry::ProbeState::Ready(_)))
        .count();
    let limits = super::limits_json(&gw);
    axum::Json(json!({
        "version": env!("CARGO_PKG_VERSION"),
        "now": {
            "sessions": gw.sessions.len(),
            "callers": gw.sessions.caller_sessions().len(),
            "plugins": entries.len(),
            "plugins_ready": ready,
            "audit": gw.audit.enabled(),
        },
        "series": console.series.overview(),
        "limits": limits,
    }))
    .into_response()
}

/// `GET /ui/api/plugins`: every plugin as the admin API shows it, with its plots.
async fn plugins(
    State(gw): State<Arc<Gateway>>,
    axum::Extension(console): axum::Extension<Arc<Console>>,
) -> Response {
    let plugins: Vec<Value> = gw
        .registry
        .entries()
        .iter()
        .map(|e| {
            let mut v = super::describe(e);
            v["series"] = console.series.plugin(e.name());
            v
        })
        .collect();
    axum::Json(json!({ "plugins": plugins })).into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(pairs: &[(&'static str, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.insert(*k, v.parse().unwrap());
        }
        h
    }

    #[test]
    fn requests_from_other_sites_are_told_apart() {
        let host = ("host", "127.0.0.1:9090");
        assert!(!cross_site(&headers(&[host])));
        assert!(!cross_site(&headers(&[
            host,
            ("origin", "http://127.0.0.1:9090")
        ])));
        assert!(cross_site(&headers(&[
            host,
            ("origin", "http://evil.example")
        ])));
        assert!(cross_site(&headers(&[
            host,
            ("origin", "http://127.0.0.1:9091")
        ])));
        assert!(cross_site(&headers(&[host, ("origin", "not a url")])));
        assert!(!cross_site(&headers(&[host, ("origin", "null")])));
        // A browser's Sec-Fetch-Site decides.
        let same = ("sec-fetch-site", "same-origin");
        assert!(!cross_site(&headers(&[host, same, ("origin", "null")])));
        let cross = ("sec-fetch-site", "cross-site");
        assert!(cross_site(&headers(&[host, cross, ("origin", "null")])));
        assert!(cross_site(&headers(&[
            host,
            ("sec-fetch-site", "same-site")
        ])));
    }
}
