//! What orchestrators ask of the admin listener, without a token: `/healthz` (the process is
//! alive and answering) and `/readyz` (it should get traffic).
//!
//! Readiness needs the public listener serving and not draining, the database answering, and
//! not every plugin failed; a `503` body lists each check and says what is wrong (a failed
//! plugin by its name and what failed, never its command line or stderr: no token guards it). Probes
//! never touch a plugin: a probe that started processes would turn a load balancer's polling
//! into load.

use std::sync::Arc;
use std::time::Duration;

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};

use crate::gateway::Gateway;
use crate::registry::ProbeState;

/// How long `/readyz` waits for the database.
const DATABASE_TIMEOUT: Duration = Duration::from_secs(2);

pub async fn healthz() -> Response {
    axum::Json(json!({ "status": "ok" })).into_response()
}

pub async fn readyz(State(gw): State<Arc<Gateway>>) -> Response {
    let mut problems: Vec<String> = Vec::new();

    let listening = gw.is_serving();
    if gw.is_draining() {
        problems.push("shutting down: draining connections".into());
    } else if !listening {
        problems.push("the public listener is not serving yet".into());
    }

    let database = match tokio::time::timeout(DATABASE_TIMEOUT, gw.plugin_store.ping()).await {
        Ok(Ok(())) => json!({ "ok": true }),
        Ok(Err(e)) => {
            problems.push(format!("database: {e}"));
            json!({ "ok": false, "error": e.to_string() })
        }
        Err(_) => {
            let e = format!("no answer within {} s", DATABASE_TIMEOUT.as_secs());
            problems.push(format!("database: {e}"));
            json!({ "ok": false, "error": e })
        }
    };

    // Cluster mode: the Redis the replicas share (its call is under its own timeout).
    let redis = match &gw.cluster {
        None => None,
        Some(c) => Some(match c.ping().await {
            Ok(()) => json!({ "ok": true }),
            Err(e) => {
                problems.push(format!("redis: {e}"));
                json!({ "ok": false, "error": e.to_string() })
            }
        }),
    };

    let mut failed = Vec::new();
    let mut enabled = 0;
    for entry in gw.registry.entries().iter().filter(|e| e.enabled) {
        enabled += 1;
        let why = match entry.state() {
            ProbeState::Failed { summary, .. } => Some(summary),
            ProbeState::Reprobing => Some("its start-up probe failed; probing again".into()),
            ProbeState::Ready(_) | ProbeState::Pending => entry.stats.breaker_open().map(|d| {
                format!(
                    "it keeps crashing; the breaker opens again in {} s",
                    d.as_secs() + 1
                )
            }),
        };
        if let Some(why) = why {
            failed.push(json!({ "plugin": entry.name(), "error": why }));
        }
    }
    let plugins_ok = enabled == 0 || failed.len() < enabled;
    if !plugins_ok {
        problems.push(format!("all {enabled} plugin(s) failed"));
    }

    let ready = problems.is_empty();
    let mut body: Value = json!({
        "status": if ready { "ready" } else { "not ready" },
        "problems": problems,
        "checks": {
            "listening": { "ok": listening && !gw.is_draining() },
            "database": database,
            "plugins": { "ok": plugins_ok, "enabled": enabled, "failed": failed },
        },
    });
    if let Some(redis) = redis {
        body["checks"]["redis"] = redis;
    }
    let status = if ready {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    (status, axum::Json(body)).into_response()
}
