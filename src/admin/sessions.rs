//! Sessions seen from the admin listener: `GET /admin/sessions` lists this replica's legacy
//! sessions and modern callers' sessions (never a full session id: a prefix to recognise it,
//! and a key to end it by), and `DELETE /admin/sessions/{key}` ends one. In a cluster each
//! replica shows the sessions it serves.

use std::sync::Arc;

use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};
use sha2::{Digest, Sha256};

use super::AdminError;
use crate::gateway::Gateway;
use crate::session::Session;

/// The key a session is ended by: a digest of its id, so the listing hands out nothing a
/// client could use as an `Mcp-Session-Id`.
fn key(id: &str) -> String {
    let digest = Sha256::digest(id.as_bytes());
    digest[..12].iter().map(|b| format!("{b:02x}")).collect()
}

/// Every session this replica serves, as JSON, oldest first.
pub fn describe_all(gw: &Gateway) -> Vec<Value> {
    let now = std::time::SystemTime::now();
    let mut all: Vec<(std::time::SystemTime, Value)> = gw
        .sessions
        .all()
        .into_iter()
        .map(|s| (s.started, describe(&s, now, false)))
        .chain(
            gw.sessions
                .caller_sessions()
                .into_iter()
                .map(|s| (s.started, describe(&s, now, true))),
        )
        .collect();
    all.sort_by_key(|(started, _)| *started);
    all.into_iter().map(|(_, v)| v).collect()
}

fn describe(s: &Session, now: std::time::SystemTime, modern: bool) -> Value {
    let mut instances: Vec<Value> = s
        .running()
        .iter()
        .map(|c| json!({ "plugin": c.name(), "pid": c.pid() }))
        .collect();
    instances.sort_by(|a, b| a["plugin"].as_str().cmp(&b["plugin"].as_str()));
    let prefix: String = if modern {
        "caller".into()
    } else {
        s.id.chars().take(crate::audit::SESSION_PREFIX).collect()
    };
    json!({
        "key": key(&s.id),
        "id_prefix": prefix,
        "era": if modern { "2026-07-28" } else { "legacy" },
        "subject": s.owner,
        "client": s.client_label.as_deref(),
        "protocol_version": if modern { "2026-07-28" } else { s.version },
        "age_secs": now.duration_since(s.started).map_or(0, |d| d.as_secs()),
        "open_streams": s.connections.load(std::sync::atomic::Ordering::Relaxed),
        "instances": instances,
    })
}

pub async fn list(State(gw): State<Arc<Gateway>>) -> Response {
    axum::Json(json!({ "sessions": describe_all(&gw) })).into_response()
}

/// Ends the session whose key is `key`.
pub async fn end(gw: &Gateway, wanted: &str) -> Result<(), AdminError> {
    if let Some(s) = gw.sessions.all().into_iter().find(|s| key(&s.id) == wanted) {
        gw.sessions.delete(&s.id).await;
        return Ok(());
    }
    if let Some(s) = gw
        .sessions
        .caller_sessions()
        .into_iter()
        .find(|s| key(&s.id) == wanted)
        && gw.sessions.end_caller(&s.id)
    {
        return Ok(());
    }
    Err(AdminError::NotFound(format!(
        "no session has the key {wanted}"
    )))
}

pub async fn delete(
    State(gw): State<Arc<Gateway>>,
    Path(wanted): Path<String>,
) -> Result<Response, AdminError> {
    end(&gw, &wanted).await?;
    Ok(StatusCode::NO_CONTENT.into_response())
}
