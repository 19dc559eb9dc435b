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
use crate::credentials::{Broker, CALLBACK_PATH, ConnectRefused, CredentialError, Request};

/// The routes, for the edge to put behind its Host and Origin checks.
pub fn router(edge: Arc<Edge>) -> Router {
    Router::new()
        .route(CALLBACK_PATH, get(callback))
        .route(
            &format!("{}/{{name}}", crate::credentials::mcp_client::CLIENTS_PATH),
            get(client_document),
        )
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
/// The gateway's client ID metadata document for credential `name` (an `oauth2` credential
/// of a remote MCP server that registers itself): what an authorization server fetches when
/// the gateway names this URL as its `client_id`.
async fn client_document(State(edge): State<Arc<Edge>>, Path(name): Path<String>) -> Response {
    use axum::response::IntoResponse;
    let Some(broker) = edge.sessions.supervisor.credentials() else {
        return StatusCode::NOT_FOUND.into_response();
    };
    let Ok(c) = broker.defined(&name) else {
        return StatusCode::NOT_FOUND.into_response();
    };
    let CredentialKind::OAuth2 { server, .. } = &c.kind else {
        return StatusCode::NOT_FOUND.into_response();
    };
    if server.mcp_server.is_none() || !server.client_id.is_empty() {
        return StatusCode::NOT_FOUND.into_response();
    }
    let doc = crate::credentials::mcp_client::document(broker.base(), &c.name, &c.label);
    (
        [(axum::http::header::CACHE_CONTROL, "max-age=300")],
        axum::Json(doc),
    )
        .into_response()
}

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

/// The cookie holding an OAuth connect's sealed memory while the person is at the service:
/// `SameSite=Lax`, as the service sends them back by a top-level navigation from its site.
fn flow_cookie_name(secure: bool) -> &'static str {
    if secure {
        "__Host-mcpgw-oauth"
    } else {
        "mcpgw-oauth"
    }
}

/// How the person proves who they are on a page.
pub(super) enum Who<'a> {
    /// Not yet: the built-in server's users' fields (`local`), and/or a button for the
    /// OpenID provider named so.
    SignIn {
        local: bool,
        provider: Option<&'a str>,
    },
    /// Signed in at the provider already: the grant that says so.
    Granted(&'a str),
}

/// The form: who to sign in as is for the person to say; the credential is the link's. An
/// OAuth credential has no value to enter: the person goes on to its service.
fn form(
    label: &str,
    id: &str,
    csrf: &str,
    error: Option<(&str, &str)>,
    status: StatusCode,
    oauth: bool,
    who: &Who<'_>,
) -> Response {
    let error = error.map_or(String::new(), |(eid, text)| {
        format!("<p class=\"error\" id=\"{eid}\">{}</p>", escape(text))
    });
    let (intro, value, button) = if oauth {
        (
            "Sign in here, then at the service, which asks you to let this gateway act for \
             you: the token it gives is kept encrypted and used only for your requests.",
            String::new(),
            "Continue to the service",
        )
    } else {
        (
            "Sign in, then enter it: it is kept encrypted, used only for your requests, and \
             never shown again.",
            format!(
                "<label for=\"value\">{label}</label>\
                 <input type=\"password\" id=\"value\" name=\"value\" autocomplete=\"off\" required>",
                label = escape(label)
            ),
            "Connect",
        )
    };
    let (id, csrf) = (escape(id), escape(csrf));
    let hidden = format!("<input type=\"hidden\" name=\"csrf\" value=\"{csrf}\">");
    let main = match who {
        Who::SignIn { local: true, .. } => format!(
            "<form method=\"post\" action=\"/connect/{id}\">{hidden}\
             <label for=\"username\">User name</label>\
             <input type=\"text\" id=\"username\" name=\"username\" autocomplete=\"username\" required>\
             <label for=\"password\">Password</label>\
             <input type=\"password\" id=\"password\" name=\"password\" autocomplete=\"current-password\" required>\
             {value}\
             <div class=\"buttons\"><button type=\"submit\">{button}</button></div></form>"
        ),
        Who::SignIn { local: false, .. } => String::new(),
        Who::Granted(grant) => format!(
            "<form method=\"post\" action=\"/connect/{id}\">{hidden}\
             <input type=\"hidden\" name=\"grant\" value=\"{}\">\
             {value}\
             <div class=\"buttons\"><button type=\"submit\" id=\"go\">{button}</button></div></form>",
            escape(grant)
        ),
    };
    let provider = match who {
        Who::SignIn {
            provider: Some(name),
            ..
        } => format!(
            "<form method=\"post\" action=\"/connect/{id}/signin\">{hidden}\
             <div class=\"buttons\"><button type=\"submit\" id=\"provider\" class=\"secondary\">Sign in with {}</button></div></form>",
            escape(name)
        ),
        _ => String::new(),
    };
    page(
        status,
        "Connect",
        &format!(
            "<h1>Connect your {label}</h1>\
             <p>A tool you use through this gateway acts with your own {label}. {intro}</p>{error}{main}{provider}",
            label = escape(label),
        ),
    )
}

/// Whether the pages' cookies are `Secure` (the public URL is https).
pub(super) fn secure(edge: &Edge) -> bool {
    match edge.auth.server.as_ref() {
        Some(s) => s.secure_cookies(),
        None => edge
            .config
            .auth
            .public_url
            .as_ref()
            .is_some_and(|u| u.scheme() == "https"),
    }
}

/// The sign-ins the pages offer: the built-in server's users, and the OpenID provider.
pub(super) fn sign_ins(edge: &Edge) -> (bool, Option<String>) {
    let local = edge.auth.server.as_ref().is_some_and(|s| s.has_users());
    let provider = edge.signin.as_ref().map(|u| u.display_name().to_owned());
    (local, provider)
}

/// `GET /connect/{id}`: the form, and the cookie that binds it to this browser.
async fn open(State(edge): State<Arc<Edge>>, Path(id): Path<String>) -> Response {
    let (broker, request) = match find(&edge, &id).await {
        Ok(Some(found)) => found,
        Ok(None) => return gone(),
        Err(r) => return r,
    };
    let (local, provider) = sign_ins(&edge);
    if !local && provider.is_none() {
        return message(
            StatusCode::NOT_IMPLEMENTED,
            "no-signin",
            "Not available",
            "Connecting a credential here needs a sign-in this gateway does not offer.",
        );
    }
    let Ok(c) = broker.defined(&request.name) else {
        return gone();
    };
    let oauth = match c.kind {
        CredentialKind::Secret { .. } => false,
        CredentialKind::OAuth2 { .. } => true,
        CredentialKind::TokenExchange { .. } => return gone(),
    };
    let csrf = format!("{:032x}", rand::random::<u128>());
    let who = Who::SignIn {
        local,
        provider: provider.as_deref(),
    };
    let mut r = form(&c.label, &id, &csrf, None, StatusCode::OK, oauth, &who);
    let secure = secure(&edge);
    bind_form(
        &mut r,
        cookie_name(secure),
        &csrf,
        crate::credentials::REQUEST_TTL_MS / 1000,
        secure,
    );
    r
}

/// After a sign-in at the provider: the link's form again, for `subject` proven by a grant,
/// with a new form token (the cookie of the page before did not come along the provider's
/// redirect).
pub(super) async fn signed_in(edge: &Edge, id: &str, subject: &str) -> Response {
    let (broker, request) = match find(edge, id).await {
        Ok(Some(found)) => found,
        Ok(None) => return gone(),
        Err(r) => return r,
    };
    if subject != request.subject {
        tracing::warn!(signed_in = %subject, credential = %request.name, "connect page: a link made for another person refused");
        edge.audit
            .credential(subject, "connect", &request.name, 403);
        return message(
            StatusCode::FORBIDDEN,
            "another",
            "Refused",
            "This link was made for someone else. Nothing was stored.",
        );
    }
    let Ok(c) = broker.defined(&request.name) else {
        return gone();
    };
    let oauth = matches!(c.kind, CredentialKind::OAuth2 { .. });
    let grant = match broker.grant(subject) {
        Ok(g) => g,
        Err(e) => {
            tracing::error!("connect page: {e}");
            return gone();
        }
    };
    let csrf = format!("{:032x}", rand::random::<u128>());
    let mut r = form(
        &c.label,
        id,
        &csrf,
        None,
        StatusCode::OK,
        oauth,
        &Who::Granted(&grant),
    );
    let secure = secure(edge);
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
    #[serde(default)]
    username: String,
    #[serde(default)]
    password: String,
    /// After a sign-in at the provider: the proof of who signed in.
    #[serde(default)]
    grant: Option<String>,
    /// `secret` credentials only.
    #[serde(default)]
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
    let secure = secure(&edge);
    // The form must come from the page this browser opened.
    let bound = cookie(&headers, cookie_name(secure))
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
    let oauth = matches!(c.kind, CredentialKind::OAuth2 { .. });
    let (local, provider) = sign_ins(&edge);
    let who = match &f.grant {
        Some(g) => Who::Granted(g),
        None => Who::SignIn {
            local,
            provider: provider.as_deref(),
        },
    };
    let again = |eid: &str, text: &str, status: StatusCode| {
        form(&label, &id, &f.csrf, Some((eid, text)), status, oauth, &who)
    };
    let subject = match (&f.grant, edge.auth.server.as_ref().filter(|_| local)) {
        // Signed in at the provider a moment ago, on this page.
        (Some(grant), _) => match broker.granted(grant) {
            Some(s) => s,
            None => return gone(),
        },
        (None, Some(server)) => match server.sign_in(&f.username, &f.password, addr).await {
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
        },
        (None, None) => return gone(),
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
    if oauth {
        return begin_oauth(&broker, &request, secure).await;
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

/// Sends the person, signed in as the link's subject, on to the service's authorization
/// page, with the flow's memory in this browser's cookie.
pub(super) async fn begin_oauth(broker: &Broker, request: &Request, secure: bool) -> Response {
    match broker.begin_connect(request).await {
        Ok((url, leg)) => {
            let mut r = Response::new(axum::body::Body::empty());
            *r.status_mut() = StatusCode::SEE_OTHER;
            if let Ok(v) = HeaderValue::from_str(&url) {
                r.headers_mut().insert(header::LOCATION, v);
            }
            let cookie = format!(
                "{}={leg}; Path=/; HttpOnly; SameSite=Lax; Max-Age={}{}",
                flow_cookie_name(secure),
                crate::credentials::REQUEST_TTL_MS / 1000,
                if secure { "; Secure" } else { "" }
            );
            if let Ok(v) = HeaderValue::from_str(&cookie) {
                r.headers_mut().append(header::SET_COOKIE, v);
            }
            r.headers_mut()
                .insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
            r
        }
        Err(e) => {
            tracing::error!(credential = %request.name, "connect page: {e}");
            message(
                StatusCode::BAD_GATEWAY,
                "service-down",
                "Not available",
                "The service this credential comes from cannot be reached now. Try the link again in a moment.",
            )
        }
    }
}

#[derive(Deserialize)]
struct Callback {
    #[serde(default)]
    code: Option<String>,
    #[serde(default)]
    state: Option<String>,
    #[serde(default)]
    error: Option<String>,
    /// The server's name for itself (RFC 9207).
    #[serde(default)]
    iss: Option<String>,
}

/// `GET /connect/callback`: the service sends the person back with a code (or an error).
async fn callback(
    State(edge): State<Arc<Edge>>,
    headers: HeaderMap,
    axum::extract::Query(q): axum::extract::Query<Callback>,
) -> Response {
    let Some(broker) = edge.sessions.supervisor.credentials().cloned() else {
        return gone();
    };
    let secure = secure(&edge);
    let Some(leg) = cookie(&headers, flow_cookie_name(secure)).map(str::to_owned) else {
        tracing::warn!("connect callback without its browser's cookie refused");
        return message(
            StatusCode::FORBIDDEN,
            "csrf",
            "Refused",
            "This sign-in was not started in this browser. Nothing was stored.",
        );
    };
    // An answer whose state is not this browser's flow's changes nothing, not even the
    // flow's cookie (a cross-site page cannot end someone's flow).
    if !q
        .state
        .as_deref()
        .is_some_and(|s| broker.flow_state_matches(&leg, s))
    {
        tracing::warn!("connect callback with a state not its flow's refused");
        return message(
            StatusCode::FORBIDDEN,
            "mismatch",
            "Refused",
            "This answer from the service does not belong to the sign-in this browser started. Nothing was stored.",
        );
    }
    let mut r = match (&q.code, &q.state, &q.error) {
        (_, _, Some(error)) => message(
            StatusCode::FORBIDDEN,
            "denied",
            "Not connected",
            &format!(
                "The service did not connect it ({}). Nothing was stored.",
                truncate(error)
            ),
        ),
        (Some(code), Some(state), None) => match broker
            .finish_connect(&leg, state, code, q.iss.as_deref())
            .await
        {
            Ok((subject, c)) => {
                tracing::info!(subject = %subject, credential = %c.credential, "credential connected");
                edge.audit
                    .credential(&subject, "connect", &c.credential, 200);
                page(
                    StatusCode::OK,
                    "Connected",
                    &format!(
                        "<h1>Connected</h1><p id=\"connected\">Your {} is connected. Go back to \
                         your application and try again.</p>",
                        escape(&c.label)
                    ),
                )
            }
            Err(ConnectRefused::Mismatch) => {
                tracing::warn!("connect callback with a state or cookie not its own refused");
                message(
                    StatusCode::FORBIDDEN,
                    "mismatch",
                    "Refused",
                    "This answer from the service does not belong to the sign-in this browser started. Nothing was stored.",
                )
            }
            Err(ConnectRefused::Used) => gone(),
            Err(e) => {
                tracing::warn!("connect callback: {e}");
                message(
                    StatusCode::BAD_GATEWAY,
                    "service-refused",
                    "Not connected",
                    "The service did not give a token. Go back to your application and try again.",
                )
            }
        },
        _ => message(
            StatusCode::BAD_REQUEST,
            "malformed",
            "Refused",
            "The service sent the browser back without a code. Nothing was stored.",
        ),
    };
    // The flow is over either way.
    let clear = format!(
        "{}=; Path=/; HttpOnly; SameSite=Lax; Max-Age=0{}",
        flow_cookie_name(secure),
        if secure { "; Secure" } else { "" }
    );
    if let Ok(v) = HeaderValue::from_str(&clear) {
        r.headers_mut().append(header::SET_COOKIE, v);
    }
    r
}

/// At most 100 characters of what a service said, for a page.
fn truncate(s: &str) -> String {
    s.chars().take(100).collect()
}
