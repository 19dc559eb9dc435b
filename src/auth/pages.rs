//! The pages a person sees at the built-in authorization server: sign-in, consent, and
//! errors that cannot go back to a client. Server-rendered, no scripts, styles from one
//! stylesheet (`/oauth/style.css`), every value escaped; the only secret in a page is the
//! request's CSRF token, which is also in a cookie the page cannot read.

use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};

pub const STYLE: &str = r#"
:root { color-scheme: light dark; --accent: #2f6fde; --muted: #6b7280; }
* { box-sizing: border-box; }
body { margin: 0; min-height: 100vh; display: grid; place-items: center;
  font: 16px/1.5 system-ui, -apple-system, "Segoe UI", Roboto, sans-serif;
  background: #f3f4f6; color: #111827; }
@media (prefers-color-scheme: dark) { body { background: #111827; color: #f3f4f6; }
  main { background: #1f2937 !important; border-color: #374151 !important; } input { background: #111827; color: inherit; } }
main { width: min(26rem, 92vw); padding: 2rem; background: #fff; border: 1px solid #e5e7eb;
  border-radius: 12px; box-shadow: 0 10px 30px rgba(0,0,0,.08); }
h1 { font-size: 1.25rem; margin: 0 0 1rem; }
p { margin: .5rem 0; }
.muted { color: var(--muted); font-size: .9rem; }
.error { color: #b91c1c; font-weight: 600; }
label { display: block; margin: .75rem 0 .25rem; font-weight: 600; }
input[type=text], input[type=password] { width: 100%; padding: .6rem .7rem; border: 1px solid #d1d5db;
  border-radius: 8px; font: inherit; }
ul.scopes { padding-left: 1.2rem; }
code { font-family: ui-monospace, monospace; font-size: .9em; }
.buttons { display: flex; gap: .75rem; margin-top: 1.25rem; }
button { flex: 1; padding: .65rem 1rem; border-radius: 8px; border: 1px solid var(--accent);
  font: inherit; font-weight: 600; cursor: pointer; background: var(--accent); color: #fff; }
button.secondary { background: transparent; color: var(--accent); }
"#;

/// The value of the cookie `name` a request carries, if any.
pub fn cookie<'h>(headers: &'h axum::http::HeaderMap, name: &str) -> Option<&'h str> {
    headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|kv| kv.trim().split_once('='))
        .find(|(k, _)| *k == name)
        .map(|(_, v)| v)
}

/// Escapes text for HTML content and attribute values.
pub fn escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

/// A page of the gateway's: `body` (already escaped) under `title`, with the headers every page
/// gets (no scripts, no framing, no caching, no referrer to other sites).
pub fn page(status: StatusCode, title: &str, body: &str) -> Response {
    let html = format!(
        "<!doctype html><html lang=\"en\"><head><meta charset=\"utf-8\">\
         <meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\
         <title>{}</title><link rel=\"stylesheet\" href=\"/oauth/style.css\"></head>\
         <body><main>{body}</main></body></html>",
        escape(title)
    );
    let mut r = (status, html).into_response();
    let h = r.headers_mut();
    h.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/html; charset=utf-8"),
    );
    h.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(
            "default-src 'none'; style-src 'self'; frame-ancestors 'none'; base-uri 'none'",
        ),
    );
    h.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    // Not `no-referrer`: with it the browser sends `Origin: null` with the form, which the
    // Origin check refuses. `same-origin` sends nothing to other sites.
    h.insert(
        header::REFERRER_POLICY,
        HeaderValue::from_static("same-origin"),
    );
    h.insert(
        "x-content-type-options",
        HeaderValue::from_static("nosniff"),
    );
    r
}

/// What a page says about the client asking.
pub struct ClientView<'a> {
    pub name: &'a str,
    pub client_id: &'a str,
    pub redirect_host: String,
    pub loopback_redirect: bool,
}

fn client_lines(c: &ClientView) -> String {
    let mut s = format!(
        "<p><strong>{}</strong> wants to use this gateway on your behalf.</p>\
         <p class=\"muted\">It will be sent back to <code>{}</code>.</p>",
        escape(c.name),
        escape(&c.redirect_host)
    );
    if c.loopback_redirect {
        s.push_str(
            "<p class=\"muted\">That address is on this computer: approve only if you \
             started this sign-in from an application you trust.</p>",
        );
    }
    s
}

/// The sign-in form; with `upstream` (the provider's name), a button to sign in there too.
pub fn login(
    request: &str,
    csrf: &str,
    client: &ClientView,
    error: Option<&str>,
    upstream: Option<&str>,
) -> Response {
    let error = error
        .map(|e| format!("<p class=\"error\">{}</p>", escape(e)))
        .unwrap_or_default();
    let upstream = upstream
        .map(|name| {
            format!(
                "<form method=\"post\" action=\"/authorize/upstream\">\
                 <input type=\"hidden\" name=\"request\" value=\"{request}\">\
                 <input type=\"hidden\" name=\"csrf\" value=\"{csrf}\">\
                 <div class=\"buttons\"><button type=\"submit\" class=\"secondary\" id=\"upstream-sign-in\">Sign in with {name}</button></div></form>\
                 <p class=\"muted\">Or with a user of this gateway:</p>",
                request = escape(request),
                csrf = escape(csrf),
                name = escape(name),
            )
        })
        .unwrap_or_default();
    let body = format!(
        "<h1>Sign in to mcp-gateway</h1>{client}{error}{upstream}\
         <form method=\"post\" action=\"/authorize/login\">\
         <input type=\"hidden\" name=\"request\" value=\"{request}\">\
         <input type=\"hidden\" name=\"csrf\" value=\"{csrf}\">\
         <label for=\"username\">User name</label>\
         <input type=\"text\" id=\"username\" name=\"username\" autocomplete=\"username\" required autofocus>\
         <label for=\"password\">Password</label>\
         <input type=\"password\" id=\"password\" name=\"password\" autocomplete=\"current-password\" required>\
         <div class=\"buttons\"><button type=\"submit\" id=\"sign-in\">Sign in</button></div></form>",
        client = client_lines(client),
        request = escape(request),
        csrf = escape(csrf),
    );
    let status = if error.is_empty() {
        StatusCode::OK
    } else {
        StatusCode::UNAUTHORIZED
    };
    page(status, "Sign in", &body)
}

/// The consent form: which client asks for which scopes.
pub fn consent(
    request: &str,
    csrf: &str,
    client: &ClientView,
    user: &str,
    scopes: &[String],
) -> Response {
    let scopes: String = scopes
        .iter()
        .map(|s| format!("<li><code>{}</code></li>", escape(s)))
        .collect();
    let body = format!(
        "<h1>Allow access?</h1><p class=\"muted\">Signed in as {user}</p>{client}\
         <p>It asks for:</p><ul class=\"scopes\">{scopes}</ul>\
         <form method=\"post\" action=\"/authorize/consent\">\
         <input type=\"hidden\" name=\"request\" value=\"{request}\">\
         <input type=\"hidden\" name=\"csrf\" value=\"{csrf}\">\
         <div class=\"buttons\">\
         <button type=\"submit\" name=\"decision\" value=\"deny\" class=\"secondary\" id=\"deny\">Deny</button>\
         <button type=\"submit\" name=\"decision\" value=\"approve\" id=\"approve\">Allow</button>\
         </div></form>",
        user = escape(user),
        client = client_lines(client),
        request = escape(request),
        csrf = escape(csrf),
    );
    page(StatusCode::OK, "Allow access", &body)
}

/// A person the identity provider signed in but this gateway does not let in: no code is
/// issued, and nothing goes back to the client.
pub fn refused(why: &str) -> Response {
    page(
        StatusCode::FORBIDDEN,
        "Access refused",
        &format!(
            "<h1>Access refused</h1><p class=\"error\" id=\"refused\">{}</p>\
             <p>You signed in, but this gateway is open only to the people, domains or groups \
             its administrator allows. Ask them to add you, or sign in with another account.</p>\
             <p class=\"muted\">No access was given to the application.</p>",
            escape(why)
        ),
    )
}

/// An error that cannot be sent to the client's redirect URI (it is unknown or unverified):
/// shown here, never redirected.
pub fn error(status: StatusCode, what: &str) -> Response {
    page(
        status,
        "Authorization failed",
        &format!(
            "<h1>Authorization failed</h1><p class=\"error\">{}</p>\
             <p class=\"muted\">Go back to the application and start again.</p>",
            escape(what)
        ),
    )
}
