//! The connect page (`/connect/{id}`), on the public listener: where a person asked for one
//! of their own credentials (a call answered with a URL elicitation) gives it. The link's id
//! is random and names no one; the page makes the person sign in, and keeps the value only
//! when the one signed in is the subject the link was made for, for the credential it was
//! made for, within its lifetime, once. The form is bound to the browser that opened it (a
//! `SameSite=Strict` cookie holding the token the form carries), and the edge's Origin and
//! Host checks refuse a cross-site post. A refusal stores nothing.
//!
//! Signing in here is the built-in authorization server's own users (password, with its
//! lockout); credentials of kind `secret` are entered here.

use std::sync::Arc;

use axum::Router;
use axum::extract::{Form, Path, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::Response;
use axum::routing::get;
use serde::Deserialize;

use super::Edge;
use crate::auth::pages::{cookie, escape, page};
use crate::auth::server::{ClientAddr, SignInRefused};
use crate::config::CredentialKind;
use crate::credentials::{Broker, CredentialError, Request};

/// The routes, for the edge to put behind its Host and Origin checks.
pub fn router(edge: Arc<Edge>) -> Router {
    Router::new()
        .route("/connect/{id}", get(open).post(submit))
        .with_state(edge)
}

/// The cookie binding a form to its browser.
pub(super) fn cookie_name(secure: bool) -> &'static str {
    if secure {
        "__Host-mcpgw-connect"
    } else {
        "mcpgw-connect"
    }
}

fn gone() -> Response {
    page(
        StatusCode::NOT_FOUND,
        "Link not valid",
        "<h1>This link is not valid</h1><p class=\"error\" id=\"gone\">It was used already, it \
         expired, or it never existed.</p><p class=\"muted\">Go back to your application and \
         make the request again: it will give you a new link.</p>",
    )
}

pub(super) fn message(status: StatusCode, id: &str, title: &str, text: &str) -> Response {
    page(
        status,
        title,
        &format!(
            "<h1>{}</h1><p class=\"error\" id=\"{id}\">{}</p>",
            escape(title),
            escape(text)
        ),
    )
}

/// The broker, the open request `id` and its credential's definition; `None` when there is
/// no such open request.
async fn find(edge: &Edge, id: &str) -> Result<Option<(Arc<Broker>, Request)>, Response> {
    let Some(broker) = edge.sessions.supervisor.credentials().cloned() else {
        return Ok(None);
    };
    if id.len() > 64 || !id.bytes().all(|b| b.is_ascii_hexdigit()) {
        return Ok(None);
    }
    match broker.peek(id).await {
        Ok(Some(r)) => Ok(Some((broker, r))),
        Ok(None) => Ok(None),
        Err(e) => {
            tracing::error!("connect page: {e}");
            Err(message(
                StatusCode::SERVICE_UNAVAILABLE,
                "unavailable",
                "Not available",
                "The gateway cannot reach its database. Try again in a moment.",
            ))
        }
    }
}

/// The form: who to sign in as is for the person to say; the credential is the link's.
fn form(
    label: &str,
    id: &str,
    csrf: &str,
    error: Option<(&str, &str)>,
    status: StatusCode,
) -> Response {
    let error = error.map_or(String::new(), |(eid, text)| {
        format!("<p class=\"error\" id=\"{eid}\">{}</p>", escape(text))
    });
    page(
        status,
        "Connect",
        &format!(
            "<h1>Connect your {label}</h1>\
             <p>A tool you use through this gateway acts with your own {label}. Sign in, then \
             enter it: it is kept encrypted, used only for your requests, and never shown \
             again.</p>{error}\
             <form method=\"post\" action=\"/connect/{id}\">\
             <input type=\"hidden\" name=\"csrf\" value=\"{csrf}\">\
             <label for=\"username\">User name</label>\
             <input type=\"text\" id=\"username\" name=\"username\" autocomplete=\"username\" required>\
             <label for=\"password\">Password</label>\
             <input type=\"password\" id=\"password\" name=\"password\" autocomplete=\"current-password\" required>\
             <label for=\"value\">{label}</label>\
             <input type=\"password\" id=\"value\" name=\"value\" autocomplete=\"off\" required>\
             <div class=\"buttons\"><button type=\"submit\">Connect</button></div></form>",
            label = escape(label),
            id = escape(id),
            csrf = escape(csrf),
        ),
    )
}

/// `GET /connect/{id}`: the form, and the cookie that binds it to this browser.
async fn open(State(edge): State<Arc<Edge>>, Path(id): Path<String>) -> Response {
    let (broker, request) = match find(&edge, &id).await {
        Ok(Some(found)) => found,
        Ok(None) => return gone(),
        Err(r) => return r,
    };
    let Some(server) = edge.auth.server.as_ref().filter(|s| s.has_users()) else {
        return message(
            StatusCode::NOT_IMPLEMENTED,
            "no-signin",
            "Not available",
            "Connecting a credential here needs a sign-in this gateway does not offer yet.",
        );
    };
    let Ok(c) = broker.defined(&request.name) else {
        return gone();
    };
    if !matches!(c.kind, CredentialKind::Secret { .. }) {
        return message(
            StatusCode::NOT_IMPLEMENTED,
            "not-yet",
            "Not available",
            "This kind of credential cannot be connected here yet.",
        );
    }
    let csrf = format!("{:032x}", rand::random::<u128>());
    let mut r = form(&c.label, &id, &csrf, None, StatusCode::OK);
    let secure = server.secure_cookies();
    bind_form(
        &mut r,
        cookie_name(secure),
        &csrf,
        crate::credentials::REQUEST_TTL_MS / 1000,
        secure,
    );
    r
}

/// Sets the cookie `name` holding `csrf`, the token `r`'s form carries, for `max_age_secs`:
/// `SameSite=Strict` and `HttpOnly`, so the form can be posted only from this browser, and
/// not from another site.
pub(super) fn bind_form(r: &mut Response, name: &str, csrf: &str, max_age_secs: i64, secure: bool) {
    let cookie = format!(
        "{name}={csrf}; Path=/; HttpOnly; SameSite=Strict; Max-Age={max_age_secs}{}",
        if secure { "; Secure" } else { "" }
    );
    if let Ok(v) = HeaderValue::from_str(&cookie) {
        r.headers_mut().append(header::SET_COOKIE, v);
    }
}

#[derive(Deserialize)]
struct Submitted {
    csrf: String,
    username: String,
    password: String,
    value: String,
}

/// `POST /connect/{id}`: the person signs in and gives the value.
async fn submit(
    State(edge): State<Arc<Edge>>,
    Path(id): Path<String>,
    ClientAddr(addr): ClientAddr,
    headers: HeaderMap,
    Form(f): Form<Submitted>,
) -> Response {
    let Some(server) = edge.auth.server.as_ref().filter(|s| s.has_users()) else {
        return gone();
    };
    // The form must come from the page this browser opened.
    let bound = cookie(&headers, cookie_name(server.secure_cookies()))
        .is_some_and(|c| !f.csrf.is_empty() && crate::auth::constant_time_eq(c, &f.csrf));
    if !bound {
        tracing::warn!(address = ?addr, "connect page: a form without its browser's cookie refused");
        return message(
            StatusCode::FORBIDDEN,
            "csrf",
            "Refused",
            "This form was not opened in this browser. Open the link again.",
        );
    }
    let (broker, request) = match find(&edge, &id).await {
        Ok(Some(found)) => found,
        Ok(None) => return gone(),
        Err(r) => return r,
    };
    let Ok(c) = broker.defined(&request.name) else {
        return gone();
    };
    let label = c.label.clone();
    let again = |eid: &str, text: &str, status: StatusCode| {
        form(&label, &id, &f.csrf, Some((eid, text)), status)
    };
    let subject = match server.sign_in(&f.username, &f.password, addr).await {
        Ok(s) => s,
        Err(SignInRefused::Wrong) => {
            return again(
                "wrong",
                "Wrong user name or password.",
                StatusCode::UNAUTHORIZED,
            );
        }
        Err(SignInRefused::Locked(wait)) => {
            return again(
                "locked",
                &format!(
                    "Too many failed sign-ins for this user or from this address. Try again in {} s.",
                    wait.as_secs().max(1)
                ),
                StatusCode::TOO_MANY_REQUESTS,
            );
        }
    };
    if subject != request.subject {
        tracing::warn!(signed_in = %subject, credential = %request.name, "connect page: a link made for another person refused");
        edge.audit
            .credential(&subject, "connect", &request.name, 403);
        return message(
            StatusCode::FORBIDDEN,
            "another",
            "Refused",
            "This link was made for someone else. Nothing was stored.",
        );
    }
    // Checked before the link is used up, so a mistyped value can be entered again.
    if let Err(e) = broker.check_secret(&request.name, &f.value) {
        let text = match e {
            CredentialError::Pattern(_) => "That does not look like the value asked for.",
            _ => "The value is empty, too long, or holds characters it may not.",
        };
        return again("invalid", text, StatusCode::BAD_REQUEST);
    }
    match broker.take(&id).await {
        Ok(Some(r)) if r.subject == subject && r.name == request.name => {}
        Ok(_) => return gone(),
        Err(e) => {
            tracing::error!("connect page: {e}");
            return message(
                StatusCode::SERVICE_UNAVAILABLE,
                "unavailable",
                "Not available",
                "The gateway cannot reach its database. Try again in a moment.",
            );
        }
    }
    if let Err(e) = broker
        .connect_secret(&subject, &request.name, &f.value)
        .await
    {
        tracing::error!(credential = %request.name, "connect page: {e}");
        return message(
            StatusCode::SERVICE_UNAVAILABLE,
            "unavailable",
            "Not stored",
            "The gateway could not store it. Go back to your application and try again.",
        );
    }
    tracing::info!(subject = %subject, credential = %request.name, "credential connected");
    edge.audit
        .credential(&subject, "connect", &request.name, 200);
    page(
        StatusCode::OK,
        "Connected",
        &format!(
            "<h1>Connected</h1><p id=\"connected\">Your {} is connected. Go back to your \
             application and try again.</p>",
            escape(&label)
        ),
    )
}
