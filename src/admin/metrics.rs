//! `GET /metrics` on the admin listener, without a token: Prometheus's text format.
//!
//! Counters and histograms are kept by [`crate::metrics`], a leaf every layer bumps. The gauges
//! that describe the gateway's state (sessions, replay buffers, plugin processes, probes,
//! breakers) are set here from that state on each scrape, so they can never drift from it.
//! Reading them never touches a plugin.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use axum::extract::State;
use axum::http::{HeaderValue, header};
use axum::response::{IntoResponse, Response};

use crate::gateway::Gateway;
use crate::registry::ProbeState;

pub async fn metrics(State(gw): State<Arc<Gateway>>) -> Response {
    let mut response = render(&gw).into_response();
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/plain; version=0.0.4; charset=utf-8"),
    );
    response
}

/// The metrics in Prometheus's text format, the state gauges read from `gw` first.
fn render(gw: &Gateway) -> String {
    let m = crate::metrics::get();
    m.sessions_active.set(gw.sessions.len() as i64);
    let (events, bytes) = gw.sessions.store.usage();
    m.replay_events.set(events as i64);
    m.replay_bytes.set(bytes as i64);
    // Plugins removed from the registry drop out of the state gauges.
    m.plugin_processes.reset();
    m.plugin_up.reset();
    m.plugin_breaker_open.reset();
    m.plugin_isolation.reset();
    for entry in gw.registry.entries() {
        for r in crate::backend::sandbox::isolation(&entry.config).rules {
            m.plugin_isolation
                .with_label_values(&[entry.name(), r.rule])
                .set(i64::from(r.enforced));
        }
        let name = [entry.name()];
        m.plugin_processes
            .with_label_values(&name)
            .set(entry.stats.running.load(Ordering::Relaxed) as i64);
        let up = matches!(entry.state(), ProbeState::Ready(_));
        m.plugin_up.with_label_values(&name).set(i64::from(up));
        m.plugin_breaker_open
            .with_label_values(&name)
            .set(i64::from(entry.stats.breaker_open().is_some()));
    }
    crate::metrics::encode_text()
}
