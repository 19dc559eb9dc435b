//! People's credentials seen from the admin listener: `GET /admin/credentials` lists the
//! credentials defined and how many people connected each; `GET /admin/credentials/{name}`
//! who connected it, when, until when and with which scopes (never a value);
//! `DELETE /admin/credentials/{name}/connections/{subject}` revokes one person's, and
//! `DELETE /admin/credentials/{name}/connections` everyone's. A revoked person's running
//! instances of the plugins that use the credential stop on this replica at once (they start
//! again, asking for it, on the next call).

use std::sync::Arc;

use axum::extract::{Path, State};
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};

use super::AdminError;
use crate::config::CredentialKind;
use crate::credentials::{Broker, CredentialError};
use crate::gateway::Gateway;

fn broker(gw: &Gateway) -> Result<Arc<Broker>, AdminError> {
    gw.sessions
        .supervisor
        .credentials()
        .cloned()
        .ok_or_else(|| AdminError::NotFound("no credentials are defined ([credentials])".into()))
}

fn failed(e: CredentialError) -> AdminError {
    match e {
        CredentialError::Undefined(_) => AdminError::NotFound(e.to_string()),
        other => AdminError::Unavailable(other.to_string()),
    }
}

fn kind(k: &CredentialKind) -> &'static str {
    match k {
        CredentialKind::OAuth2 { .. } => "oauth2",
        CredentialKind::Secret { .. } => "secret",
        CredentialKind::TokenExchange { .. } => "token_exchange",
    }
}

pub async fn list(State(gw): State<Arc<Gateway>>) -> Result<Response, AdminError> {
    let mut out = Vec::new();
    if let Some(b) = gw.sessions.supervisor.credentials() {
        for c in &gw.config.credentials.credentials {
            let connected = b.connected(&c.name).await.map_err(failed)?.len();
            out.push(json!({
                "name": c.name,
                "kind": kind(&c.kind),
                "label": c.label,
                "connected": connected,
                "plugins": gw.credential_users(&c.name),
            }));
        }
    }
    Ok(axum::Json(json!({ "credentials": out })).into_response())
}

/// `GET /ui/api/credentials`: every credential with who connected it, for the console.
pub async fn console(State(gw): State<Arc<Gateway>>) -> Result<Response, AdminError> {
    let mut out = Vec::new();
    if let Some(b) = gw.sessions.supervisor.credentials() {
        for c in b.definitions() {
            out.push(json!({
                "name": c.name,
                "kind": kind(&c.kind),
                "label": c.label,
                "plugins": gw.credential_users(&c.name),
                "connections": connections(b, &c.name).await?,
            }));
        }
    }
    Ok(axum::Json(json!({ "credentials": out })).into_response())
}

/// Who connected credential `name`, when, until when, with which scopes (never a value).
async fn connections(b: &Broker, name: &str) -> Result<Vec<Value>, AdminError> {
    Ok(b.connected(name)
        .await
        .map_err(failed)?
        .into_iter()
        .map(|c| {
            json!({
                "subject": c.subject,
                "connected_at_ms": c.connected_at_ms,
                "expires_at_ms": c.expires_at_ms,
                "scopes": c.scopes,
            })
        })
        .collect())
}

pub async fn show(
    State(gw): State<Arc<Gateway>>,
    Path(name): Path<String>,
) -> Result<Response, AdminError> {
    let b = broker(&gw)?;
    let c = b.defined(&name).map_err(failed)?;
    let connections = connections(&b, &name).await?;
    Ok(axum::Json(json!({
        "name": name,
        "kind": kind(&c.kind),
        "label": c.label,
        "plugins": gw.credential_users(&name),
        "connections": connections,
    }))
    .into_response())
}

pub async fn revoke_one(
    State(gw): State<Arc<Gateway>>,
    Path((name, subject)): Path<(String, String)>,
) -> Result<Response, AdminError> {
    revoke(&gw, &name, Some(&subject)).await
}

pub async fn revoke_all(
    State(gw): State<Arc<Gateway>>,
    Path(name): Path<String>,
) -> Result<Response, AdminError> {
    revoke(&gw, &name, None).await
}

async fn revoke(gw: &Gateway, name: &str, subject: Option<&str>) -> Result<Response, AdminError> {
    let b = broker(gw)?;
    let removed = b.disconnect(subject, name).await.map_err(failed)?;
    let stopped = gw.stop_credential_users(name, subject);
    tracing::info!(credential = name, subject = ?subject, removed, stopped, "credentials revoked");
    Ok(axum::Json(json!({ "revoked": removed, "instances_stopped": stopped })).into_response())
}
