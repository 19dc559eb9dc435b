//! Prometheus metrics, served as text on the admin listener's `/metrics` (never on the public
//! port).
//!
//! A leaf: it imports no other module of the gateway, so every layer may count. Counters and
//! histograms are bumped where things happen: the HTTP edge ([`record_http`], called by the
//! HTTP layer's observer), plugin connections, the plugin registry, resumption and
//! authorization. Gauges that describe the state of the gateway (sessions, replay buffers,
//! plugin processes) are set from that state by the admin listener when scraped, so they can
//! never drift from it; [`encode_text`] then writes them all out. Every label takes values
//! from a bounded set: routes are matched paths, never raw URIs; JSON-RPC methods outside the
//! spec's own are counted as `other`; plugin names come from the operator's configuration.

use std::sync::{Arc, LazyLock, OnceLock};
use std::time::Instant;

use prometheus::{
    Encoder, Histogram, HistogramOpts, HistogramVec, IntCounter, IntCounterVec, IntGauge,
    IntGaugeVec, Opts, Registry, TextEncoder,
};

/// Latency buckets, in seconds: from a fast in-memory answer (half a millisecond) to a slow
/// tool call (a minute).
const BUCKETS: &[f64] = &[
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
    60.0,
];

/// Redis round-trip buckets, in seconds: from a loopback answer (a tenth of a millisecond) to
/// the longest a Redis call may take before it times out.
const REDIS_BUCKETS: &[f64] = &[
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0,
];

/// Every metric the gateway exports.
pub struct Metrics {
    registry: Registry,
    pub http_requests: IntCounterVec,
    pub http_duration: HistogramVec,
    pub sessions_active: IntGauge,
    pub sessions_opened: IntCounter,
    pub sessions_adopted: IntCounter,
    pub sse_streams: IntGauge,
    pub replay_events: IntGauge,
    pub replay_bytes: IntGauge,
    pub replays_served: IntCounter,
    pub cursors_not_found: IntCounter,
    pub plugin_processes: IntGaugeVec,
    pub plugin_up: IntGaugeVec,
    pub plugin_breaker_open: IntGaugeVec,
    pub plugin_starts: IntCounterVec,
    pub plugin_crashes: IntCounterVec,
    pub plugin_isolation: IntGaugeVec,
    pub plugin_bounds_hit: IntCounterVec,
    pub plugin_in_flight: IntGaugeVec,
    pub plugin_duration: HistogramVec,
    pub plugin_timeouts: IntCounterVec,
    pub plugin_notifications_dropped: IntCounterVec,
    pub auth_issued: IntCounterVec,
    pub auth_refused: IntCounterVec,
    pub redis_events_written: IntCounter,
    pub redis_events_dropped: IntCounter,
    pub redis_seconds: HistogramVec,
    pub redis_errors: IntCounterVec,
    pub cluster_forwards: IntCounterVec,
    pub cluster_unverified: IntCounterVec,
    pub rate_limited: IntCounterVec,
    pub plugin_errors: IntCounterVec,
    pub remote_events: IntCounterVec,
    pub audit_records: IntCounter,
    pub audit_dropped: IntCounter,
}

/// The process's metrics.
pub fn get() -> &'static Metrics {
    static METRICS: LazyLock<Metrics> = LazyLock::new(Metrics::new);
    &METRICS
}

fn counter(name: &str, help: &str) -> IntCounter {
    IntCounter::new(name, help).expect("valid metric")
}

fn gauge(name: &str, help: &str) -> IntGauge {
    IntGauge::new(name, help).expect("valid metric")
}

fn counter_vec(name: &str, help: &str, labels: &[&str]) -> IntCounterVec {
    IntCounterVec::new(Opts::new(name, help), labels).expect("valid metric")
}

fn gauge_vec(name: &str, help: &str, labels: &[&str]) -> IntGaugeVec {
    IntGaugeVec::new(Opts::new(name, help), labels).expect("valid metric")
}

fn histogram_vec(name: &str, help: &str, labels: &[&str]) -> HistogramVec {
    HistogramVec::new(
        HistogramOpts::new(name, help).buckets(BUCKETS.to_vec()),
        labels,
    )
    .expect("valid metric")
}

impl Metrics {
    fn new() -> Metrics {
        let m = Metrics {
            registry: Registry::new(),
            http_requests: counter_vec(
                "mcp_gateway_http_requests_total",
                "HTTP requests answered, by method, matched route and status code.",
                &["method", "route", "status"],
            ),
            http_duration: histogram_vec(
                "mcp_gateway_http_request_duration_seconds",
                "Time from a request's arrival to its response head (an SSE response goes on \
                 after that), by method and matched route.",
                &["method", "route"],
            ),
            sessions_active: gauge("mcp_gateway_sessions_active", "Sessions open now."),
            sessions_opened: counter(
                "mcp_gateway_sessions_opened_total",
                "Sessions opened by initialize.",
            ),
            sessions_adopted: counter(
                "mcp_gateway_sessions_adopted_total",
                "Sessions taken over from a replica that stopped or died (cluster mode).",
            ),
            sse_streams: gauge(
                "mcp_gateway_sse_streams_open",
                "SSE responses streaming to clients now (GET streams and POST answers).",
            ),
            replay_events: gauge(
                "mcp_gateway_replay_buffer_events",
                "Events kept for resumption, across all sessions.",
            ),
            replay_bytes: gauge(
                "mcp_gateway_replay_buffer_bytes",
                "Bytes of events kept for resumption, across all sessions.",
            ),
            replays_served: counter(
                "mcp_gateway_replays_served_total",
                "Streams resumed from a Last-Event-ID.",
            ),
            cursors_not_found: counter(
                "mcp_gateway_replay_cursors_not_found_total",
                "Last-Event-IDs that could not be resumed (unknown, released or evicted).",
            ),
            plugin_processes: gauge_vec(
                "mcp_gateway_plugin_processes",
                "Plugin child processes running now.",
                &["plugin"],
            ),
            plugin_up: gauge_vec(
                "mcp_gateway_plugin_up",
                "1 when the plugin's last start-up probe succeeded, 0 when it failed or is \
                 still running.",
                &["plugin"],
            ),
            plugin_breaker_open: gauge_vec(
                "mcp_gateway_plugin_breaker_open",
                "1 while the plugin's circuit breaker refuses new starts after repeated crashes.",
                &["plugin"],
            ),
            plugin_starts: counter_vec(
                "mcp_gateway_plugin_starts_total",
                "Plugin processes started for sessions or pools (probes excluded).",
                &["plugin"],
            ),
            plugin_isolation: gauge_vec(
                "mcp_gateway_plugin_isolation",
                "Each rule of a plugin's sandbox: 1 when this machine enforces it, 0 when it \
                 could not be applied (the admin API says why).",
                &["plugin", "rule"],
            ),
            plugin_bounds_hit: counter_vec(
                "mcp_gateway_plugin_sandbox_bounds_hit_total",
                "Plugin instances that ended after hitting a bound of their sandbox: `memory` \
                 (killed by the kernel) or `processes` (a fork was refused).",
                &["plugin", "bound"],
            ),
            plugin_crashes: counter_vec(
                "mcp_gateway_plugin_crashes_total",
                "Plugin processes that exited on their own or failed to start; each is \
                 restarted on the next request that needs it.",
                &["plugin"],
            ),
            plugin_in_flight: gauge_vec(
                "mcp_gateway_plugin_requests_in_flight",
                "Client requests a plugin is working on now.",
                &["plugin"],
            ),
            plugin_duration: histogram_vec(
                "mcp_gateway_plugin_request_duration_seconds",
                "Time a plugin took to answer a client request, by JSON-RPC method.",
                &["plugin", "method"],
            ),
            plugin_timeouts: counter_vec(
                "mcp_gateway_plugin_request_timeouts_total",
                "Client requests a plugin did not answer within its request timeout.",
                &["plugin"],
            ),
            plugin_notifications_dropped: counter_vec(
                "mcp_gateway_plugin_notifications_dropped_total",
                "Notifications from a shared plugin that name no request in flight (logs, \
                 stray progress): no session can safely be given them, so they are dropped.",
                &["plugin"],
            ),
            auth_issued: counter_vec(
                "mcp_gateway_auth_tokens_issued_total",
                "Access tokens issued by the built-in authorization server, by grant type.",
                &["grant_type"],
            ),
            auth_refused: counter_vec(
                "mcp_gateway_auth_refusals_total",
                "Refused authorizations: at /mcp (missing_token, invalid_token, \
                 insufficient_scope, invalid_request) and at the authorization server (its \
                 OAuth error code, or bad_credentials at sign-in).",
                &["reason"],
            ),
            redis_events_written: counter(
                "mcp_gateway_redis_events_written_total",
                "Replay events written through to Redis (cluster mode).",
            ),
            redis_events_dropped: counter(
                "mcp_gateway_redis_events_dropped_total",
                "Replay events kept in memory but not in Redis: the queue to Redis was full, \
                 or Redis failed or refused the write. Only the shared copy lacks them.",
            ),
            redis_seconds: HistogramVec::new(
                HistogramOpts::new(
                    "mcp_gateway_redis_seconds",
                    "Time of Redis round trips, by operation.",
                )
                .buckets(REDIS_BUCKETS.to_vec()),
                &["operation"],
            )
            .expect("valid metric"),
            redis_errors: counter_vec(
                "mcp_gateway_redis_errors_total",
                "Redis round trips that failed or timed out, and commands Redis refused, by \
                 operation.",
                &["operation"],
            ),
            cluster_forwards: counter_vec(
                "mcp_gateway_cluster_forwards_total",
                "Requests forwarded to the replica that owns their session, by outcome \
                 (ok: the owner answered; unreachable: it could not be reached; not_here: it no \
                 longer held the session, and the owner was asked for again).",
                &["outcome"],
            ),
            cluster_unverified: counter_vec(
                "mcp_gateway_cluster_unverified_total",
                "Values read from Redis that name where to forward a request (what: heartbeat, \
                 a replica's state and URL; owner, a session record's replica) whose signature \
                 under the cluster secret did not verify: ignored, never forwarded to.",
                &["what"],
            ),
            rate_limited: counter_vec(
                "mcp_gateway_rate_limited_total",
                "Calls refused with 429 by a rate limit, by the limit's name (`subject`, \
                 `plugin:<pattern>`, `tool:<pattern>`).",
                &["limit"],
            ),
            plugin_errors: counter_vec(
                "mcp_gateway_plugin_request_errors_total",
                "Client requests a plugin answered with a JSON-RPC error or a tool error \
                 (`isError`), or did not answer within its request timeout.",
                &["plugin"],
            ),
            remote_events: counter_vec(
                "mcp_gateway_remote_events_total",
                "A remote plugin's `reconnect` (its GET stream again, or a new session after a \
                 404), `resume` (a stream resumed with Last-Event-ID) and `error` (a request \
                 failed on the way), by plugin.",
                &["plugin", "event"],
            ),
            audit_records: counter(
                "mcp_gateway_audit_records_total",
                "Audit records queued for the log and the database.",
            ),
            audit_dropped: counter(
                "mcp_gateway_audit_dropped_total",
                "Audit records lost: the queue to the writer was full, or the database \
                 failed or did not answer.",
            ),
        };
        let r = &m.registry;
        let register = |c: Box<dyn prometheus::core::Collector>| {
            r.register(c).expect("metric names are unique");
        };
        register(Box::new(m.http_requests.clone()));
        register(Box::new(m.http_duration.clone()));
        register(Box::new(m.sessions_active.clone()));
        register(Box::new(m.sessions_opened.clone()));
        register(Box::new(m.sessions_adopted.clone()));
        register(Box::new(m.sse_streams.clone()));
        register(Box::new(m.replay_events.clone()));
        register(Box::new(m.replay_bytes.clone()));
        register(Box::new(m.replays_served.clone()));
        register(Box::new(m.cursors_not_found.clone()));
        register(Box::new(m.plugin_processes.clone()));
        register(Box::new(m.plugin_up.clone()));
        register(Box::new(m.plugin_breaker_open.clone()));
        register(Box::new(m.plugin_starts.clone()));
        register(Box::new(m.plugin_crashes.clone()));
        register(Box::new(m.plugin_isolation.clone()));
        register(Box::new(m.plugin_bounds_hit.clone()));
        register(Box::new(m.plugin_in_flight.clone()));
        register(Box::new(m.plugin_duration.clone()));
        register(Box::new(m.plugin_timeouts.clone()));
        register(Box::new(m.plugin_notifications_dropped.clone()));
        register(Box::new(m.auth_issued.clone()));
        register(Box::new(m.auth_refused.clone()));
        register(Box::new(m.redis_events_written.clone()));
        register(Box::new(m.redis_events_dropped.clone()));
        register(Box::new(m.redis_seconds.clone()));
        register(Box::new(m.redis_errors.clone()));
        register(Box::new(m.cluster_forwards.clone()));
        register(Box::new(m.cluster_unverified.clone()));
        register(Box::new(m.rate_limited.clone()));
        register(Box::new(m.plugin_errors.clone()));
        register(Box::new(m.remote_events.clone()));
        register(Box::new(m.audit_records.clone()));
        register(Box::new(m.audit_dropped.clone()));
        let info = gauge_vec(
            "mcp_gateway_build_info",
            "Always 1; the gateway's version as a label.",
            &["version"],
        );
        info.with_label_values(&[env!("CARGO_PKG_VERSION")]).set(1);
        register(Box::new(info));
        register(Box::new(
            prometheus::process_collector::ProcessCollector::for_self(),
        ));
        m
    }
}

/// The metrics in Prometheus's text format. The state gauges are set by the caller first
/// (the admin listener reads them from the gateway's state when scraped).
pub fn encode_text() -> String {
    let mut out = Vec::new();
    TextEncoder::new()
        .encode(&get().registry.gather(), &mut out)
        .expect("text encoding into memory");
    String::from_utf8(out).expect("the text format is UTF-8")
}

/// Counts and times one HTTP request by method, matched route and status.
pub fn record_http(
    method: &'static str,
    route: &str,
    status: axum::http::StatusCode,
    elapsed: std::time::Duration,
) {
    let m = get();
    m.http_duration
        .with_label_values(&[method, route])
        .observe(elapsed.as_secs_f64());
    m.http_requests
        .with_label_values(&[method, route, status.as_str()])
        .inc();
}

/// An HTTP method as a label: the standard ones by name, anything else `other`.
pub fn method_label(method: &axum::http::Method) -> &'static str {
    use axum::http::Method;
    match *method {
        Method::GET => "GET",
        Method::POST => "POST",
        Method::DELETE => "DELETE",
        Method::PUT => "PUT",
        Method::HEAD => "HEAD",
        Method::OPTIONS => "OPTIONS",
        Method::PATCH => "PATCH",
        _ => "other",
    }
}

/// The spec's client-to-server requests, the values of the `method` label (and `other`).
const RPC_METHODS: [&str; 17] = [
    "tools/call",
    "tools/list",
    "resources/read",
    "resources/list",
    "resources/templates/list",
    "resources/subscribe",
    "resources/unsubscribe",
    "prompts/get",
    "prompts/list",
    "completion/complete",
    "logging/setLevel",
    "ping",
    "initialize",
    "tasks/get",
    "tasks/result",
    "tasks/list",
    "tasks/cancel",
];

/// Where a JSON-RPC method's label sits: its index in [`RPC_METHODS`], or one past the end
/// for `other` (a client can send any method name; a label must not grow with them).
fn rpc_method_index(method: &str) -> usize {
    RPC_METHODS
        .iter()
        .position(|k| *k == method)
        .unwrap_or(RPC_METHODS.len())
}

/// A JSON-RPC method as a label.
pub fn rpc_method_label(method: &str) -> &'static str {
    RPC_METHODS
        .get(rpc_method_index(method))
        .copied()
        .unwrap_or("other")
}

/// What a Redis round trip was for: the values of the `operation` label of
/// `mcp_gateway_redis_seconds` and `mcp_gateway_redis_errors_total`, a fixed set.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RedisOp {
    /// A pipelined batch of replay events (and stream trims and deletions) written through.
    EventsWrite,
    /// Replay events read back for a stream this replica does not hold.
    EventsRead,
    /// The streams of a session being adopted, listed and measured.
    EventsAdopt,
    /// A replica's heartbeat (or its last word at a stop).
    Heartbeat,
    /// Readiness's check of Redis.
    Ping,
    /// Whose a session is: its record and its owner's heartbeat read.
    Owner,
    /// A session record written, refreshed or removed.
    SessionWrite,
    /// A session record read.
    SessionRead,
    /// A message to the other replicas (a revocation, a registry change) published.
    Publish,
    /// The subscription to the other replicas' messages: connecting, subscribing, and the
    /// pings that check it is alive.
    Subscribe,
    /// An attempt counted against a limit the replicas share (registrations).
    Throttle,
}

impl RedisOp {
    pub const ALL: [RedisOp; 11] = [
        RedisOp::EventsWrite,
        RedisOp::EventsRead,
        RedisOp::EventsAdopt,
        RedisOp::Heartbeat,
        RedisOp::Ping,
        RedisOp::Owner,
        RedisOp::SessionWrite,
        RedisOp::SessionRead,
        RedisOp::Publish,
        RedisOp::Subscribe,
        RedisOp::Throttle,
    ];

    pub fn label(self) -> &'static str {
        match self {
            RedisOp::EventsWrite => "events_write",
            RedisOp::EventsRead => "events_read",
            RedisOp::EventsAdopt => "events_adopt",
            RedisOp::Heartbeat => "heartbeat",
            RedisOp::Ping => "ping",
            RedisOp::Owner => "owner",
            RedisOp::SessionWrite => "session_write",
            RedisOp::SessionRead => "session_read",
            RedisOp::Publish => "publish",
            RedisOp::Subscribe => "subscribe",
            RedisOp::Throttle => "throttle",
        }
    }
}

/// Times one Redis round trip; `ok` false counts it as an error too (failed or timed out).
pub fn record_redis(op: RedisOp, elapsed: std::time::Duration, ok: bool) {
    let m = get();
    m.redis_seconds
        .with_label_values(&[op.label()])
        .observe(elapsed.as_secs_f64());
    if !ok {
        redis_error(op);
    }
}

/// Counts a Redis error of an operation (a failed round trip, or a command Redis refused).
pub fn redis_error(op: RedisOp) {
    get().redis_errors.with_label_values(&[op.label()]).inc();
}

/// What plugins have answered so far, by plugin: for the console's plots, which diff two
/// readings.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct PluginTotals {
    /// Client requests answered (every method), and those that timed out.
    pub answered: u64,
    /// Of them, errors and tool errors, and timeouts.
    pub errors: u64,
    /// Answers by duration: cumulative counts at each of [`duration_bounds`]' upper bounds.
    pub buckets: Vec<u64>,
}

/// The upper bounds, in seconds, of the duration histograms' buckets (the last one, +Inf,
/// left out: its count is [`PluginTotals::answered`]).
pub fn duration_bounds() -> &'static [f64] {
    BUCKETS
}

/// Every plugin's totals now.
pub fn plugin_totals() -> std::collections::HashMap<String, PluginTotals> {
    let mut out: std::collections::HashMap<String, PluginTotals> = Default::default();
    let label = |m: &prometheus::proto::Metric, name: &str| {
        m.get_label()
            .iter()
            .find(|l| l.name() == name)
            .map(|l| l.value().to_owned())
    };
    for family in get().registry.gather() {
        match family.name() {
            "mcp_gateway_plugin_request_duration_seconds" => {
                for m in family.get_metric() {
                    let Some(plugin) = label(m, "plugin") else {
                        continue;
                    };
                    let h = m.get_histogram();
                    let t = out.entry(plugin).or_default();
                    t.answered += h.get_sample_count();
                    if t.buckets.is_empty() {
                        t.buckets = vec![0; BUCKETS.len()];
                    }
                    for (i, b) in h.get_bucket().iter().take(BUCKETS.len()).enumerate() {
                        t.buckets[i] += b.cumulative_count();
                    }
                }
            }
            // A request that timed out counts as one answered late: failed, and slower
            // than any bucket.
            "mcp_gateway_plugin_request_timeouts_total" => {
                for m in family.get_metric() {
                    if let Some(plugin) = label(m, "plugin") {
                        out.entry(plugin).or_default().answered +=
                            m.get_counter().get_value() as u64;
                    }
                }
            }
            "mcp_gateway_plugin_request_errors_total" => {
                for m in family.get_metric() {
                    if let Some(plugin) = label(m, "plugin") {
                        out.entry(plugin).or_default().errors += m.get_counter().get_value() as u64;
                    }
                }
            }
            _ => {}
        }
    }
    for t in out.values_mut() {
        t.buckets.resize(BUCKETS.len(), 0);
    }
    out
}

/// One plugin's metrics, looked up once per plugin connection instead of per request.
pub struct PluginMetrics {
    plugin: Arc<str>,
    in_flight: IntGauge,
    pub timeouts: IntCounter,
    /// Requests answered with an error or a tool error, or timed out.
    pub errors: IntCounter,
    durations: [OnceLock<Histogram>; RPC_METHODS.len() + 1],
}

impl PluginMetrics {
    pub fn new(plugin: Arc<str>) -> PluginMetrics {
        let m = get();
        PluginMetrics {
            in_flight: m.plugin_in_flight.with_label_values(&[&*plugin]),
            timeouts: m.plugin_timeouts.with_label_values(&[&*plugin]),
            errors: m.plugin_errors.with_label_values(&[&*plugin]),
            durations: std::array::from_fn(|_| OnceLock::new()),
            plugin,
        }
    }

    fn duration(&self, method: &str) -> Histogram {
        let i = rpc_method_index(method);
        self.durations[i]
            .get_or_init(|| {
                let label = RPC_METHODS.get(i).copied().unwrap_or("other");
                get()
                    .plugin_duration
                    .with_label_values(&[&*self.plugin, label])
            })
            .clone()
    }
}

/// A client request in flight on a plugin: counted in its plugin's in-flight gauge until
/// dropped, however it ends; [`observe`](Self::observe) records how long the answer took.
pub struct InFlight {
    gauge: IntGauge,
    duration: Histogram,
    errors: IntCounter,
    started: Instant,
    /// A `tools/call`, whose result may be a tool error.
    call: bool,
}

impl InFlight {
    pub fn start(metrics: &PluginMetrics, method: &str) -> InFlight {
        metrics.in_flight.inc();
        InFlight {
            gauge: metrics.in_flight.clone(),
            duration: metrics.duration(method),
            errors: metrics.errors.clone(),
            started: Instant::now(),
            call: method == "tools/call",
        }
    }

    /// Whether the request is a `tools/call`.
    pub fn is_call(&self) -> bool {
        self.call
    }

    /// The plugin answered; `failed`: with an error or a tool error.
    pub fn observe(&self, failed: bool) {
        self.duration.observe(self.started.elapsed().as_secs_f64());
        if failed {
            self.errors.inc();
        }
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.gauge.dec();
    }
}

/// An open SSE response, counted in `mcp_gateway_sse_streams_open` while it lives.
pub struct SseOpen(());

impl SseOpen {
    pub fn new() -> SseOpen {
        get().sse_streams.inc();
        SseOpen(())
    }
}

impl Default for SseOpen {
    fn default() -> Self {
        SseOpen::new()
    }
}

impl Drop for SseOpen {
    fn drop(&mut self) {
        get().sse_streams.dec();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn method_labels_are_bounded() {
        assert_eq!(rpc_method_label("tools/call"), "tools/call");
        assert_eq!(rpc_method_label("x/ATTACKER-CHOSEN-1234"), "other");
        assert_eq!(method_label(&axum::http::Method::GET), "GET");
        let odd = axum::http::Method::from_bytes(b"PROPFIND").unwrap();
        assert_eq!(method_label(&odd), "other");
    }

    #[test]
    fn in_flight_counts_until_dropped_and_times_by_bounded_method() {
        let pm = PluginMetrics::new(Arc::from("unit-test-plugin"));
        let a = InFlight::start(&pm, "tools/call");
        let b = InFlight::start(&pm, "nonsense/1");
        let c = InFlight::start(&pm, "nonsense/2");
        assert_eq!(pm.in_flight.get(), 3);
        a.observe(false);
        b.observe(true);
        c.observe(false);
        drop((a, b, c));
        assert_eq!(pm.in_flight.get(), 0);
        let count = |method: &str| {
            get()
                .plugin_duration
                .with_label_values(&["unit-test-plugin", method])
                .get_sample_count()
        };
        assert_eq!(count("tools/call"), 1);
        assert_eq!(count("other"), 2);
    }
}
