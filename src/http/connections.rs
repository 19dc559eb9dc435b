//! The people's own page of their credentials (`/connections`), on the public listener: a
//! person signs in (the built-in server's users, under its lockout) and sees which of the
//! credentials defined they connected, when, and until when, never a value; they can
//! disconnect one (their running instances that use it stop, and the next call asks again)
//! or connect or replace one (through a new connect link of their own).
//!
//! After the sign-in, the page's forms carry a grant (`Broker::grant`: sealed under the
//! storage key, bound to the subject, ten minutes) instead of the password; every form also
//! carries the token of the `SameSite=Strict` cookie the page set, and the edge's Origin and
//! Host checks refuse a cross-site post.

use std::sync::Arc;

use axum::Router;
use axum::extract::{Form, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Redirect, Response};
use axum::routing::get;
use serde::Deserialize;

use super::Edge;
use super::connect::{bind_form, message};
use crate::auth::pages::{cookie, escape, page};
use crate::auth::server::{ClientAddr, SignInRefused};
use crate::config::CredentialKind;
use crate::credentials::Broker;

const COOKIE: &str = "mcpgw-connections";
const SECURE_COOKIE: &str = "__Host-mcpgw-connections";

pub fn router(edge: Arc<Edge>) -> Router {
    Router::new()
        .route("/connections", get(open).post(submit))
        .with_state(edge)
}

/// The broker and whether cookies are `Secure`, when the page can be used here: people's
/// credentials defined, and a sign-in to offer.
fn parts(edge: &Edge) -> Option<(Arc<Broker>, bool)> {
    let broker = edge.sessions.supervisor.credentials()?.clone();
    let (local, provider) = super::connect::sign_ins(edge);
    (local || provider.is_some()).then(|| (broker, super::connect::secure(edge)))
}

/// The cookie binding the page's forms to this browser.
pub(super) fn cookie_name(secure: bool) -> &'static str {
    if secure { SECURE_COOKIE } else { COOKIE }
}

/// After a sign-in at the provider: the person's list, with a new form token (the page's
/// cookie did not come along the provider's redirect).
pub(super) async fn signed_in(edge: &Edge, subject: &str) -> Response {
    let Some((broker, secure)) = parts(edge) else {
        return unavailable();
    };
    let csrf = format!("{:032x}", rand::random::<u128>());
    let mut r = list(&broker, subject, &csrf, None).await;
    bind_form(
        &mut r,
        cookie_name(secure),
        &csrf,
        crate::credentials::GRANT_TTL_MS / 1000,
        secure,
    );
    r
}

/// The database did not answer.
fn database_down(e: &dyn std::fmt::Display) -> Response {
    tracing::error!("connections page: {e}");
    message(
        StatusCode::SERVICE_UNAVAILABLE,
        "unavailable",
        "Not available",
        "The gateway cannot reach its database. Try again in a moment.",
    )
}

fn unavailable() -> Response {
    message(
        StatusCode::NOT_FOUND,
        "unavailable",
        "Not available",
        "This gateway keeps no credentials of people who sign in here.",
    )
}

fn sign_in_page(
    edge: &Edge,
    csrf: &str,
    error: Option<(&str, &str)>,
    status: StatusCode,
) -> Response {
    let error = error.map_or(String::new(), |(id, text)| {
        format!("<p class=\"error\" id=\"{id}\">{}</p>", escape(text))
    });
    let (local, provider) = super::connect::sign_ins(edge);
    let local = if local {
        format!(
            "<form method=\"post\" action=\"/connections\">\
             <input type=\"hidden\" name=\"csrf\" value=\"{csrf}\">\
             <label for=\"username\">User name</label>\
             <input type=\"text\" id=\"username\" name=\"username\" autocomplete=\"username\" required>\
             <label for=\"password\">Password</label>\
             <input type=\"password\" id=\"password\" name=\"password\" autocomplete=\"current-password\" required>\
             <div class=\"buttons\"><button type=\"submit\">Sign in</button></div></form>",
            csrf = escape(csrf)
        )
    } else {
        String::new()
    };
    let provider = provider.map_or(String::new(), |name| {
        format!(
            "<form method=\"post\" action=\"/connections/signin\">\
             <input type=\"hidden\" name=\"csrf\" value=\"{}\">\
             <div class=\"buttons\"><button type=\"submit\" id=\"provider\" class=\"secondary\">Sign in with {}</button></div></form>",
            escape(csrf),
            escape(&name)
        )
    });
    page(
        status,
        "Your connections",
        &format!(
            "<h1>Your connections</h1><p>Sign in to see the credentials you connected for the \
             tools behind this gateway.</p>{error}{local}{provider}",
        ),
    )
}

/// `GET /connections`: the sign-in, and the cookie that binds the page's forms to this
/// browser.
async fn open(State(edge): State<Arc<Edge>>) -> Response {
    let Some((_, secure)) = parts(&edge) else {
        return unavailable();
    };
    let csrf = format!("{:032x}", rand::random::<u128>());
    let mut r = sign_in_page(&edge, &csrf, None, StatusCode::OK);
    bind_form(
        &mut r,
        if secure { SECURE_COOKIE } else { COOKIE },
        &csrf,
        crate::credentials::GRANT_TTL_MS / 1000,
        secure,
    );
    r
}

#[derive(Deserialize)]
struct Submitted {
    csrf: String,
    #[serde(default)]
    username: Option<String>,
    #[serde(default)]
    password: Option<String>,
    #[serde(default)]
    grant: Option<String>,
    #[serde(default)]
    action: Option<String>,
    #[serde(default)]
    credential: Option<String>,
}

/// `POST /connections`: a sign-in, or an action (`disconnect`, `connect`) under a grant.
async fn submit(
    State(edge): State<Arc<Edge>>,
    ClientAddr(addr): ClientAddr,
    headers: HeaderMap,
    Form(f): Form<Submitted>,
) -> Response {
    let Some((broker, secure)) = parts(&edge) else {
        return unavailable();
    };
    let bound = cookie(&headers, if secure { SECURE_COOKIE } else { COOKIE })
        .is_some_and(|c| !f.csrf.is_empty() && crate::auth::constant_time_eq(c, &f.csrf));
    if !bound {
        return message(
            StatusCode::FORBIDDEN,
            "csrf",
            "Refused",
            "This form was not opened in this browser. Open the page again.",
        );
    }
    let subject = match (&f.grant, &f.username, &f.password) {
        (Some(grant), _, _) => match broker.granted(grant) {
            Some(s) => s,
            None => {
                return sign_in_page(
                    &edge,
                    &f.csrf,
                    Some(("expired", "Sign in again.")),
                    StatusCode::UNAUTHORIZED,
                );
            }
        },
        (None, Some(user), Some(password)) => {
            let Some(server) = edge.auth.server.as_ref().filter(|s| s.has_users()) else {
                return sign_in_page(&edge, &f.csrf, None, StatusCode::BAD_REQUEST);
            };
            match server.sign_in(user, password, addr).await {
                Ok(s) => s,
                Err(SignInRefused::Wrong) => {
                    return sign_in_page(
                        &edge,
                        &f.csrf,
                        Some(("wrong", "Wrong user name or password.")),
                        StatusCode::UNAUTHORIZED,
                    );
                }
                Err(SignInRefused::Locked(wait)) => {
                    let text = format!(
                        "Too many failed sign-ins for this user or from this address. Try again in {} s.",
                        wait.as_secs().max(1)
                    );
                    return sign_in_page(
                        &edge,
                        &f.csrf,
                        Some(("locked", &text)),
                        StatusCode::TOO_MANY_REQUESTS,
                    );
                }
            }
        }
        _ => return sign_in_page(&edge, &f.csrf, None, StatusCode::BAD_REQUEST),
    };
    let mut notice = None;
    match (f.action.as_deref(), f.credential.as_deref()) {
        (None, _) => {}
        (Some("disconnect"), Some(name)) if broker.defined(name).is_ok() => {
            match broker.disconnect(Some(&subject), name).await {
                Ok(n) => {
                    let stopped = edge.stop_credential_users(name, Some(&subject));
                    tracing::info!(subject = %subject, credential = name, removed = n, stopped, "credential disconnected by its person");
                    edge.audit.credential(&subject, "disconnect", name, 200);
                    notice = Some(format!("Disconnected {name}."));
                }
                Err(e) => return database_down(&e),
            }
        }
        (Some("connect"), Some(name)) => {
            let defined = broker.defined(name);
            let oauth = match defined.as_deref().map(|c| &c.kind) {
                Ok(CredentialKind::Secret { .. }) => false,
                Ok(CredentialKind::OAuth2 { .. }) => true,
                _ => {
                    return message(
                        StatusCode::BAD_REQUEST,
                        "automatic",
                        "Nothing to connect",
                        "This credential is obtained from your sign-in when a tool needs it.",
                    );
                }
            };
            let asked = match broker.request(&subject, name).await {
                Ok(asked) => asked,
                Err(e) => return database_down(&e),
            };
            if !oauth {
                return Redirect::to(&asked.url).into_response();
            }
            // Signed in already (the grant): straight on to the service.
            return match broker.peek(&asked.id).await {
                Ok(Some(request)) => super::connect::begin_oauth(&broker, &request, secure).await,
                Ok(None) => database_down(&"the new link was not found"),
                Err(e) => database_down(&e),
            };
        }
        _ => return sign_in_page(&edge, &f.csrf, None, StatusCode::BAD_REQUEST),
    }
    list(&broker, &subject, &f.csrf, notice.as_deref()).await
}

/// The person's credentials: each defined one, connected or not, with what they can do.
async fn list(broker: &Broker, subject: &str, csrf: &str, notice: Option<&str>) -> Response {
    let (connections, grant) = match (broker.connections(subject).await, broker.grant(subject)) {
        (Ok(c), Ok(g)) => (c, g),
        (Err(e), _) | (_, Err(e)) => return database_down(&e),
    };
    let button = |action: &str, name: &str, text: &str| {
        format!(
            "<form method=\"post\" action=\"/connections\">\
             <input type=\"hidden\" name=\"csrf\" value=\"{}\">\
             <input type=\"hidden\" name=\"grant\" value=\"{}\">\
             <input type=\"hidden\" name=\"action\" value=\"{action}\">\
             <input type=\"hidden\" name=\"credential\" value=\"{}\">\
             <button type=\"submit\" class=\"secondary\">{text}</button></form>",
            escape(csrf),
            escape(&grant),
            escape(name),
        )
    };
    let mut rows = String::new();
    for c in broker.definitions().iter() {
        let connected = connections.iter().find(|k| k.credential == c.name);
        let state = match connected {
            Some(k) => format!(
                "connected {}{}",
                crate::audit::rfc3339(k.connected_at_ms),
                k.expires_at_ms.map_or(String::new(), |t| format!(
                    ", expires {}",
                    crate::audit::rfc3339(t)
                ))
            ),
            None => "not connected".into(),
        };
        let actions = match connected {
            _ if matches!(c.kind, CredentialKind::TokenExchange { .. }) => {
                "<p class=\"muted\">Obtained from your sign-in when a tool needs it.</p>".into()
            }
            Some(_) => {
                button("disconnect", &c.name, "Disconnect") + &button("connect", &c.name, "Replace")
            }
            None => button("connect", &c.name, "Connect"),
        };
        rows.push_str(&format!(
            "<li id=\"credential-{}\"><p><strong>{}</strong> <span class=\"muted\">{}</span></p>{actions}</li>",
            escape(&c.name),
            escape(&c.label),
            escape(&state),
        ));
    }
    let notice = notice.map_or(String::new(), |n| {
        format!("<p id=\"notice\">{}</p>", escape(n))
    });
    page(
        StatusCode::OK,
        "Your connections",
        &format!(
            "<h1>Your connections</h1><p class=\"muted\">Signed in as {}.</p>{notice}<ul class=\"scopes\">{rows}</ul>",
            escape(subject)
        ),
    )
}
