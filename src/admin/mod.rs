//! The admin listener, on its own address (never the public port).
//!
//! Without a token: `GET /healthz` and `GET /readyz` ([`probes`]) for orchestrators, and
//! `GET /metrics` ([`metrics`]) for Prometheus. Behind a bearer token, the admin API:
//! `GET /admin/plugins` lists every plugin with its state; `POST /admin/plugins` adds one (409
//! if the name exists); `GET|PUT|DELETE /admin/plugins/{name}` reads, replaces or removes one;
//! `POST /admin/plugins/{name}/enable|disable|restart`; `POST /admin/reload` re-reads the
//! config file; `POST /admin/auth/rotate-keys`; `GET /admin/limits` shows the rate limits in
//! force; `GET /admin/audit` reads the audit log back ([`audit`], which also records every
//! admin action); `GET /admin/sessions` and `DELETE /admin/sessions/{key}` ([`sessions`]);
//! `GET /admin/credentials[/{name}]` and `DELETE /admin/credentials/{name}/connections[/{subject}]`
//! ([`credentials`]: who connected a credential, and revoking).
//! The console for people, `/ui` ([`console`]), is on the same listener behind the same
//! token. Without a configured token the admin API answers 404. JSON
//! in and out; every refusal says what was wrong. Secret values never leave: environment
//! values are shown only as the `${VAR}` references they are made of.

mod audit;
mod console;
mod credentials;
mod guard;
mod metrics;
mod probes;
mod sessions;

use std::sync::Arc;
use std::sync::atomic::Ordering;

use axum::Router;
use axum::body::Bytes;
use axum::extract::{Path, Request, State};
use axum::http::{HeaderValue, StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use serde_json::{Value, json};

use crate::config::PluginSpec;
use crate::gateway::{Gateway, ReloadError};
use crate::registry::{PluginEntry, ProbeState, RegistryError};

/// The admin router.
pub fn router(gateway: Arc<Gateway>) -> Router {
    let guard = guard::AdminGuard::new(gateway.config.admin.allowed_hosts.clone());
    let probes = Router::new()
        .route("/healthz", get(probes::healthz))
        .route("/readyz", get(probes::readyz))
        .route("/metrics", get(metrics::metrics));
    let api = if gateway.config.admin.token.is_some() {
        api_router(gateway.clone())
    } else {
        Router::new().route("/admin/{*rest}", axum::routing::any(api_off))
    };
    probes
        .merge(api)
        .merge(console::router(&gateway))
        .layer(middleware::from_fn(guard::check))
        .layer(axum::Extension(guard))
        .layer(crate::http::trace::ObserveLayer)
        .with_state(gateway)
}

async fn api_off() -> Response {
    (
        StatusCode::NOT_FOUND,
        axum::Json(json!({
            "error": "the admin API is off: set admin.token (--admin-token) to turn it on"
        })),
    )
        .into_response()
}

fn api_router(gateway: Arc<Gateway>) -> Router<Arc<Gateway>> {
    Router::new()
        .route("/admin/plugins", get(list).post(add))
        .route(
            "/admin/plugins/{name}",
            get(show).put(update).delete(remove),
        )
        .route("/admin/plugins/{name}/enable", post(enable))
        .route("/admin/plugins/{name}/disable", post(disable))
        .route("/admin/plugins/{name}/restart", post(restart))
        .route("/admin/reload", post(reload))
        .route("/admin/auth/rotate-keys", post(rotate_keys))
        .route("/admin/limits", get(limits))
        .route("/admin/audit", get(audit::list))
        .route("/admin/sessions", get(sessions::list))
        .route(
            "/admin/credentials",
            get(credentials::list).post(credentials::add),
        )
        .route(
            "/admin/credentials/{name}",
            get(credentials::show)
                .put(credentials::put)
                .delete(credentials::remove),
        )
        .route(
            "/admin/credentials/{name}/connections",
            axum::routing::delete(credentials::revoke_all),
        )
        .route(
            "/admin/credentials/{name}/connections/{subject}",
            axum::routing::delete(credentials::revoke_one),
        )
        .route(
            "/admin/sessions/{key}",
            axum::routing::delete(sessions::delete),
        )
        .layer(middleware::from_fn_with_state(
            gateway.clone(),
            audit::record_actions,
        ))
        .layer(middleware::from_fn_with_state(gateway, authorize))
}

/// Every refusal of the admin API.
#[derive(Debug, thiserror::Error)]
enum AdminError {
    #[error("missing or wrong bearer token")]
    Unauthorized,
    #[error("{0}")]
    BadRequest(String),
    #[error(transparent)]
    Registry(#[from] RegistryError),
    #[error(transparent)]
    Reload(#[from] ReloadError),
    #[error("{0}")]
    Conflict(String),
    #[error("{0}")]
    NotFound(String),
    #[error("{0}")]
    Unavailable(String),
}

impl IntoResponse for AdminError {
    fn into_response(self) -> Response {
        let status = match &self {
            AdminError::Unauthorized => StatusCode::UNAUTHORIZED,
            AdminError::BadRequest(_) | AdminError::Registry(RegistryError::Invalid(_)) => {
                StatusCode::BAD_REQUEST
            }
            AdminError::Registry(RegistryError::Exists(_)) => StatusCode::CONFLICT,
            AdminError::Registry(RegistryError::NotFound(_)) | AdminError::NotFound(_) => {
                StatusCode::NOT_FOUND
            }
            AdminError::Registry(RegistryError::Store(_)) => StatusCode::SERVICE_UNAVAILABLE,
            AdminError::Reload(ReloadError::Invalid(_)) => StatusCode::UNPROCESSABLE_ENTITY,
            AdminError::Reload(ReloadError::Unavailable) | AdminError::Conflict(_) => {
                StatusCode::CONFLICT
            }
            AdminError::Unavailable(_) => StatusCode::SERVICE_UNAVAILABLE,
            AdminError::Reload(ReloadError::Registry(RegistryError::Invalid(_))) => {
                StatusCode::UNPROCESSABLE_ENTITY
            }
            AdminError::Reload(ReloadError::Registry(_)) => StatusCode::SERVICE_UNAVAILABLE,
        };
        if status.is_server_error() {
            tracing::error!("admin API: {self}");
        }
        let mut response =
            (status, axum::Json(json!({ "error": self.to_string() }))).into_response();
        if status == StatusCode::UNAUTHORIZED {
            response
                .headers_mut()
                .insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
        }
        response
    }
}

async fn authorize(
    State(gw): State<Arc<Gateway>>,
    axum::Extension(guard): axum::Extension<Arc<guard::AdminGuard>>,
    mut request: Request,
    next: Next,
) -> Response {
    let started = std::time::Instant::now();
    let address = guard::peer(&request);
    if let Err(wait) = guard.throttled(address) {
        return guard::too_many_failures(wait);
    }
    let expected = gw.config.admin.token.as_deref().unwrap_or_default();
    let given = request
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .unwrap_or_default();
    if expected.is_empty() || !crate::auth::constant_time_eq(given, expected) {
        guard.failed(address);
        gw.audit
            .auth_failed("admin.authenticate", address, started.elapsed());
        return AdminError::Unauthorized.into_response();
    }
    guard.succeeded(address);
    request.extensions_mut().insert(audit::Actor("admin"));
    next.run(request).await
}

async fn list(State(gw): State<Arc<Gateway>>) -> Response {
    let plugins: Vec<Value> = gw.registry.entries().iter().map(|e| describe(e)).collect();
    axum::Json(json!({ "plugins": plugins })).into_response()
}

/// The rate limits in force (`[limits]`) and the count of calls each refused so far.
async fn limits(State(gw): State<Arc<Gateway>>) -> Response {
    axum::Json(limits_json(&gw)).into_response()
}

fn limits_json(gw: &Gateway) -> Value {
    use crate::config::Matcher;
    let refused = &crate::metrics::get().rate_limited;
    let rules: Vec<Value> = gw
        .limits
        .rules()
        .map(|r| {
            let (kind, pattern) = match &r.matcher {
                Matcher::All => ("subject", None),
                Matcher::Plugin(p) => ("plugin", Some(p)),
                Matcher::Tool(p) => ("tool", Some(p)),
            };
            json!({
                "name": r.name,
                "applies_to": kind,
                "pattern": pattern,
                "rate": r.describe(),
                "count": r.count,
                "per": r.per.word(),
                "burst": r.burst,
                "refused": refused.with_label_values(&[r.name.as_str()]).get(),
            })
        })
        .collect();
    json!({
        "limits": rules,
        "max_keys": gw.config.limits.max_keys,
        "shared": gw.limits.shared(),
    })
}

async fn show(
    State(gw): State<Arc<Gateway>>,
    Path(name): Path<String>,
) -> Result<Response, AdminError> {
    let entry = gw
        .registry
        .get(&name)
        .ok_or(RegistryError::NotFound(name))?;
    Ok(axum::Json(describe(&entry)).into_response())
}

async fn add(State(gw): State<Arc<Gateway>>, body: Bytes) -> Result<Response, AdminError> {
    let mut value = json_object(&body)?;
    let name = match value.remove("name") {
        Some(Value::String(n)) => n,
        Some(_) => return Err(AdminError::BadRequest("`name` must be a string".into())),
        None => return Err(AdminError::BadRequest("`name` is required".into())),
    };
    let enabled = match value.remove("enabled") {
        None => true,
        Some(Value::Bool(b)) => b,
        Some(_) => {
            return Err(AdminError::BadRequest(
                "`enabled` must be true or false".into(),
            ));
        }
    };
    let spec = spec_from(Value::Object(value))?;
    gw.registry
        .add(spec.into_config(name.clone()), enabled)
        .await?;
    let entry = gw
        .registry
        .get(&name)
        .ok_or(RegistryError::NotFound(name.clone()))?;
    let mut response = (StatusCode::CREATED, axum::Json(describe(&entry))).into_response();
    response.extensions_mut().insert(audit::PluginNamed(name));
    Ok(response)
}

async fn update(
    State(gw): State<Arc<Gateway>>,
    Path(name): Path<String>,
    body: Bytes,
) -> Result<Response, AdminError> {
    let mut value = json_object(&body)?;
    if let Some(n) = value.remove("name")
        && n != Value::String(name.clone())
    {
        return Err(AdminError::BadRequest(
            "`name` cannot change; remove and add instead".into(),
        ));
    }
    let mut spec = spec_from(Value::Object(value))?;
    keep_masked_secrets(&gw, &name, &mut spec)?;
    gw.registry.update(spec.into_config(name.clone())).await?;
    let entry = gw
        .registry
        .get(&name)
        .ok_or(RegistryError::NotFound(name))?;
    Ok(axum::Json(describe(&entry)).into_response())
}

async fn remove(
    State(gw): State<Arc<Gateway>>,
    Path(name): Path<String>,
) -> Result<Response, AdminError> {
    gw.registry.remove(&name).await?;
    Ok(StatusCode::NO_CONTENT.into_response())
}

async fn enable(
    State(gw): State<Arc<Gateway>>,
    Path(name): Path<String>,
) -> Result<Response, AdminError> {
    set_enabled(&gw, name, true).await
}

async fn disable(
    State(gw): State<Arc<Gateway>>,
    Path(name): Path<String>,
) -> Result<Response, AdminError> {
    set_enabled(&gw, name, false).await
}

async fn set_enabled(gw: &Gateway, name: String, enabled: bool) -> Result<Response, AdminError> {
    gw.registry.set_enabled(&name, enabled).await?;
    let entry = gw
        .registry
        .get(&name)
        .ok_or(RegistryError::NotFound(name))?;
    Ok(axum::Json(describe(&entry)).into_response())
}

/// Restarts a plugin's processes on this replica (see [`crate::registry::Registry::restart`]).
async fn restart(
    State(gw): State<Arc<Gateway>>,
    Path(name): Path<String>,
) -> Result<Response, AdminError> {
    gw.registry.restart(&name).await?;
    let entry = gw
        .registry
        .get(&name)
        .ok_or(RegistryError::NotFound(name))?;
    Ok(axum::Json(describe(&entry)).into_response())
}

/// Makes a new signing key current (built-in authorization server); the previous one keeps
/// validating the tokens it signed until they expire.
async fn rotate_keys(State(gw): State<Arc<Gateway>>) -> Result<Response, AdminError> {
    let server = gw.auth.server.as_ref().ok_or_else(|| {
        AdminError::Conflict("the built-in authorization server is off (auth.mode)".into())
    })?;
    let kid = server
        .keys
        .rotate()
        .await
        .map_err(|e| AdminError::Unavailable(e.to_string()))?;
    Ok(axum::Json(json!({ "current_kid": kid })).into_response())
}

async fn reload(State(gw): State<Arc<Gateway>>) -> Result<Response, AdminError> {
    gw.reload().await?;
    Ok(axum::Json(json!({ "reloaded": true })).into_response())
}

fn json_object(body: &[u8]) -> Result<serde_json::Map<String, Value>, AdminError> {
    match serde_json::from_slice::<Value>(body) {
        Ok(Value::Object(m)) => Ok(m),
        Ok(_) => Err(AdminError::BadRequest(
            "the body must be a JSON object".into(),
        )),
        Err(e) => Err(AdminError::BadRequest(format!("the body is not JSON: {e}"))),
    }
}

fn spec_from(value: Value) -> Result<PluginSpec, AdminError> {
    serde_json::from_value(value)
        .map_err(|e| AdminError::BadRequest(format!("invalid plugin definition: {e}")))
}

/// A plugin as the admin API shows it: definition (secrets masked) and state.
fn describe(e: &PluginEntry) -> Value {
    let c = &e.config;
    let env: serde_json::Map<String, Value> = c
        .env
        .iter()
        .map(|(k, v)| (k.clone(), Value::String(mask(v))))
        .collect();
    let (state, tools, probe_error, speaks) = match e.state() {
        _ if !e.enabled => ("disabled", None, None, None),
        ProbeState::Pending | ProbeState::Reprobing => ("starting", None, None, None),
        ProbeState::Ready(info) => (
            "ready",
            Some(info.tools),
            None,
            Some(json!({"era": info.era, "protocol_version": info.protocol_version})),
        ),
        ProbeState::Failed { error, .. } => ("failed", None, Some(error), None),
    };
    let last_error = probe_error.or_else(|| e.stats.last_error.lock().expect("stats lock").clone());
    let breaker = e.stats.breaker_open();
    let state = if breaker.is_some() { "failed" } else { state };
    json!({
        "name": c.name,
        "source": e.source,
        "enabled": e.enabled,
        "command": c.command,
        "args": c.args,
        // A remote plugin's upstream (its headers masked like env).
        "url": c.remote.as_ref().map(|r| r.display_url()),
        "transport": c.remote.as_ref().map(|r| r.transport),
        "headers": c.remote.as_ref().map(|r| r.headers.iter().map(|(k, v)| (k.clone(), Value::String(mask(v)))).collect::<serde_json::Map<String, Value>>()),
        "env": env,
        "cwd": c.cwd,
        "prefix": c.prefix,
        "response_mode": c.response_mode,
        "startup_timeout_secs": c.startup_timeout.as_secs(),
        "shutdown_grace_secs": c.shutdown_grace.as_secs(),
        "state": state,
        "tools": tools,
        "running_children": e.stats.running.load(Ordering::Relaxed),
        "starts": e.stats.starts.load(Ordering::Relaxed),
        "restarts": e.stats.crashes.load(Ordering::Relaxed),
        "last_error": last_error,
        "breaker_open_secs": breaker.map(|d| d.as_secs() + 1),
        "request_timeout_secs": c.request_timeout.as_secs(),
        "tools_allow": c.tools_allow,
        "tools_deny": c.tools_deny,
        "max_children": c.max_children,
        "idle_timeout_secs": c.idle_timeout.map(|d| d.as_secs()),
        "process_model": c.process_model,
        "pool_size": c.pool_size,
        "warm": c.warm,
        "connect": c.connect,
        "era": c.era,
        "scheduling": c.scheduling,
        // Who may see and use it (with auth.mode): scope, subjects, groups, per-tool rules.
        "scope": c.scope,
        "allow_groups": c.access.allow_groups,
        "allow_subjects": c.access.allow_subjects,
        "tool_access": c.tool_access,
        // What the probe found: the era it speaks and its version (null until probed).
        "speaks": speaks,
        // Its sandbox as defined (false when off), and what this machine enforces of it.
        "sandbox": crate::config::SandboxSpec::from_config(&c.sandbox),
        "isolation": crate::backend::sandbox::isolation(c),
    })
}

/// A replacement definition may give back an environment value as it is shown, `***`: the
/// value stays what it was (the console's edit form, and any client that read before it
/// wrote, never saw it). `***` for a variable the plugin did not have is refused.
fn keep_masked_secrets(gw: &Gateway, name: &str, spec: &mut PluginSpec) -> Result<(), AdminError> {
    let old = gw.registry.get(name);
    for (key, value) in spec.env.iter_mut() {
        if value != MASK {
            continue;
        }
        match old.as_ref().and_then(|e| e.config.env.get(key)) {
            Some(kept) => value.clone_from(kept),
            None => {
                return Err(AdminError::BadRequest(format!(
                    "env.{key} is `***`, the mask of a secret, but the plugin has no such value to keep: give the value"
                )));
            }
        }
    }
    Ok(())
}

/// What a secret environment value is shown as.
const MASK: &str = "***";

/// An environment value as shown: `${VAR}` references are names, not secrets, and stay;
/// anything else is masked.
fn mask(value: &str) -> String {
    let only_references = value
        .split("${")
        .skip(1)
        .all(|part| part.find('}').is_some_and(|end| part[end + 1..].is_empty()))
        && value.starts_with("${");
    if only_references {
        value.to_owned()
    } else {
        MASK.into()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn secrets_are_masked_references_are_not() {
        assert_eq!(mask("${GITHUB_TOKEN}"), "${GITHUB_TOKEN}");
        assert_eq!(mask("${A}${B}"), "${A}${B}");
        assert_eq!(mask("ghp_secret"), "***");
        assert_eq!(mask("Bearer ${TOKEN}"), "***");
        assert_eq!(mask("${TOKEN}suffix"), "***");
        assert_eq!(mask(""), "***");
    }
}
