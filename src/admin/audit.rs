//! The audit log seen from the admin listener: `GET /admin/audit` reads records back
//! (filtered by subject, plugin, tool, kind, outcome and time), and [`record_actions`] makes a
//! record of every admin action that changes something, whoever made it (the admin token, or
//! a person signed in to the console).

use std::sync::Arc;
use std::time::Instant;

use axum::extract::{Request, State};
use axum::http::Method;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use serde_json::json;

use super::AdminError;
use crate::audit::Filter;
use crate::gateway::Gateway;

/// Who made an admin request: set by whichever check let it in.
#[derive(Debug, Clone, Copy)]
pub struct Actor(pub &'static str);

/// Set on a response by a handler whose plugin the path does not name (an addition).
#[derive(Debug, Clone)]
pub struct PluginNamed(pub String);

/// `GET /admin/audit?subject=&plugin=&tool=&kind=&outcome=&since=&until=&limit=`: records,
/// newest first. What was submitted before the request is stored first, so an action is seen
/// right after it.
pub async fn list(State(gw): State<Arc<Gateway>>, request: Request) -> Response {
    match query(&gw, request.uri().query().unwrap_or("")).await {
        Ok(records) => axum::Json(json!({ "records": records })).into_response(),
        Err(e) => e.into_response(),
    }
}

/// The records a query string asks for, as JSON.
pub async fn query(gw: &Gateway, query: &str) -> Result<Vec<serde_json::Value>, AdminError> {
    if !gw.audit.enabled() {
        return Err(AdminError::Conflict(
            "the audit log is off (audit.enabled = false)".into(),
        ));
    }
    let filter = Filter::from_query(query).map_err(AdminError::BadRequest)?;
    gw.audit.flush().await;
    let records = gw
        .audit
        .query(&filter)
        .await
        .map_err(|e| AdminError::Unavailable(e.to_string()))?;
    Ok(records.iter().map(|r| r.to_json()).collect())
}

/// Records each admin request that changes something (any method but GET and HEAD), after
/// it is answered: the action, the plugin it names, who made it, the status.
pub async fn record_actions(
    State(gw): State<Arc<Gateway>>,
    request: Request,
    next: Next,
) -> Response {
    if matches!(*request.method(), Method::GET | Method::HEAD) || !gw.audit.enabled() {
        return next.run(request).await;
    }
    let started = Instant::now();
    let actor = request.extensions().get::<Actor>().map_or("admin", |a| a.0);
    let (action, plugin) = action(request.method(), request.uri().path());
    let response = next.run(request).await;
    let plugin = plugin.or_else(|| {
        response
            .extensions()
            .get::<PluginNamed>()
            .map(|p| p.0.clone())
    });
    gw.audit.admin(
        actor,
        &action,
        plugin.as_deref(),
        response.status().as_u16(),
        started.elapsed(),
    );
    response
}

/// The action an admin request makes, and the plugin its path names.
fn action(method: &Method, path: &str) -> (String, Option<String>) {
    let path = path
        .strip_prefix("/ui/api")
        .map_or_else(|| path.to_owned(), |rest| format!("/admin{rest}"));
    let segments: Vec<&str> = path.trim_matches('/').split('/').collect();
    let decode = |s: &str| percent_decode(s);
    match (method, segments.as_slice()) {
        (&Method::POST, ["admin", "plugins"]) => ("plugin.add".into(), None),
        (&Method::PUT, ["admin", "plugins", name]) => ("plugin.update".into(), Some(decode(name))),
        (&Method::DELETE, ["admin", "plugins", name]) => {
            ("plugin.remove".into(), Some(decode(name)))
        }
        (&Method::POST, ["admin", "plugins", name, verb]) => {
            (format!("plugin.{verb}"), Some(decode(name)))
        }
        (&Method::POST, ["admin", "reload"]) => ("config.reload".into(), None),
        (&Method::POST, ["admin", "auth", "rotate-keys"]) => ("auth.rotate_keys".into(), None),
        (&Method::DELETE, ["admin", "sessions", _]) => ("session.end".into(), None),
        // The credential's name as the target; never the person's (the record's subject is
        // the admin who revoked).
        (&Method::DELETE, ["admin", "credentials", name, "connections", ..]) => {
            (format!("credential.revoke:{}", decode(name)), None)
        }
        (&Method::POST, ["admin", "credentials"]) => ("credential.add".into(), None),
        (&Method::PUT, ["admin", "credentials", name]) => {
            (format!("credential.update:{}", decode(name)), None)
        }
        (&Method::DELETE, ["admin", "credentials", name]) => {
            (format!("credential.remove:{}", decode(name)), None)
        }
        (&Method::POST, ["ui", "logout"]) => ("console.sign_out".into(), None),
        _ => (format!("{method} {path}"), None),
    }
}

/// A path segment as the router read it.
fn percent_decode(s: &str) -> String {
    url::form_urlencoded::parse(format!("x={}", s.replace('+', "%2B")).as_bytes())
        .next()
        .map_or_else(|| s.to_owned(), |(_, v)| v.into_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn actions_are_named_from_the_path() {
        let a = |m: Method, p: &str| action(&m, p);
        assert_eq!(
            a(Method::POST, "/admin/plugins"),
            ("plugin.add".into(), None)
        );
        assert_eq!(
            a(Method::POST, "/admin/plugins/my%20tool/disable"),
            ("plugin.disable".into(), Some("my tool".into()))
        );
        assert_eq!(
            a(Method::POST, "/ui/api/plugins/p+q/restart"),
            ("plugin.restart".into(), Some("p+q".into()))
        );
        assert_eq!(a(Method::DELETE, "/admin/sessions/abc").0, "session.end");
        assert_eq!(a(Method::POST, "/ui/logout").0, "console.sign_out");
        assert_eq!(a(Method::POST, "/admin/odd").0, "POST /admin/odd");
    }
}
