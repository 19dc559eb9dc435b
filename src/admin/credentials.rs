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
use crate::config::{CredentialKind, CredentialSpec};
use crate::credentials::{Broker, CredentialError, DefineError};
use crate::gateway::Gateway;

fn broker(gw: &Gateway) -> Result<Arc<Broker>, AdminError> {
    gw.sessions
        .supervisor
        .credentials()
        .cloned()
        .ok_or_else(|| {
            AdminError::NotFound(
                "people's credentials are off: no storage key ([credentials] key_file, or MCP_GATEWAY_CREDENTIALS_KEY)".into(),
            )
        })
}

fn failed(e: CredentialError) -> AdminError {
    match e {
        CredentialError::Undefined(_) => AdminError::NotFound(e.to_string()),
        other => AdminError::Unavailable(other.to_string()),
    }
}

fn source(b: &Broker, name: &str) -> &'static str {
    if b.is_from_file(name) {
        "config"
    } else {
        "api"
    }
}

fn define_failed(e: DefineError) -> AdminError {
    match e {
        DefineError::FromFile(_) => AdminError::Conflict(e.to_string()),
        DefineError::Invalid(why) => AdminError::BadRequest(why),
        DefineError::Credential(c) => failed(c),
    }
}

/// Defines `name` as `spec` and tells the registry (its plugins may use it from now on).
async fn define(gw: &Gateway, name: &str, spec: &CredentialSpec) -> Result<Value, AdminError> {
    let b = broker(gw)?;
    let c = b.define(name, spec).await.map_err(define_failed)?;
    gw.registry.set_credential_names(b.names());
    tracing::info!(
        credential = name,
        "credential defined through the admin API"
    );
    Ok(json!({"name": c.name, "kind": kind(&c.kind), "label": c.label, "source": "api"}))
}

/// `POST /admin/credentials`: a new credential, `{"name": …}` beside its definition.
pub async fn add(
    State(gw): State<Arc<Gateway>>,
    body: axum::body::Bytes,
) -> Result<Response, AdminError> {
    let mut value = super::json_object(&body)?;
    let name = match value.remove("name") {
        Some(Value::String(n)) => n,
        _ => {
            return Err(AdminError::BadRequest(
                "`name` (a string) is required".into(),
            ));
        }
    };
    let spec: CredentialSpec = serde_json::from_value(Value::Object(value))
        .map_err(|e| AdminError::BadRequest(e.to_string()))?;
    if broker(&gw)?.defined(&name).is_ok() {
        return Err(AdminError::Conflict(format!(
            "credential `{name}` is defined already"
        )));
    }
    let out = define(&gw, &name, &spec).await?;
    Ok((axum::http::StatusCode::CREATED, axum::Json(out)).into_response())
}

/// `PUT /admin/credentials/{name}`: defines or redefines it.
pub async fn put(
    State(gw): State<Arc<Gateway>>,
    Path(name): Path<String>,
    body: axum::body::Bytes,
) -> Result<Response, AdminError> {
    let spec: CredentialSpec = serde_json::from_slice(&body).map_err(|e| {
        AdminError::BadRequest(format!("the body is not a credential's definition: {e}"))
    })?;
    let out = define(&gw, &name, &spec).await?;
    Ok(axum::Json(out).into_response())
}

/// `DELETE /admin/credentials/{name}`: forgets it and everyone's value of it; refused while a
/// plugin uses it.
pub async fn remove(
    State(gw): State<Arc<Gateway>>,
    Path(name): Path<String>,
) -> Result<Response, AdminError> {
    let b = broker(&gw)?;
    let users = gw.credential_users(&name);
    if !users.is_empty() {
        return Err(AdminError::Conflict(format!(
            "credential `{name}` is used by {}: change them first",
            users.join(", ")
        )));
    }
    if !b.undefine(&name).await.map_err(define_failed)? {
        return Err(AdminError::NotFound(format!(
            "no credential `{name}` is defined"
        )));
    }
    gw.registry.set_credential_names(b.names());
    tracing::info!(credential = %name, "credential removed through the admin API");
    Ok(axum::http::StatusCode::NO_CONTENT.into_response())
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
        for c in b.definitions().iter() {
            let connected = b.connected(&c.name).await.map_err(failed)?.len();
            out.push(json!({
                "name": c.name,
                "kind": kind(&c.kind),
                "label": c.label,
                "connected": connected,
                "plugins": gw.credential_users(&c.name),
                "source": source(b, &c.name),
            }));
        }
    }
    Ok(axum::Json(json!({ "credentials": out })).into_response())
}

/// `GET /ui/api/credentials`: every credential with who connected it, for the console.
pub async fn console(State(gw): State<Arc<Gateway>>) -> Result<Response, AdminError> {
    let mut out = Vec::new();
    if let Some(b) = gw.sessions.supervisor.credentials() {
        for c in b.definitions().iter() {
            out.push(json!({
                "name": c.name,
                "kind": kind(&c.kind),
                "label": c.label,
                "source": source(b, &c.name),
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
