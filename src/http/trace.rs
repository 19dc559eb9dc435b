//! Request context for logs and plugins.
//!
//! Every request runs in a `request` span that names its method and matched route, and, once
//! known, its session and the plugin that serves it, so every log line about the request
//! carries them; an access line (target `mcp_gateway::access`, debug level) closes it with
//! the status and the time taken. A valid W3C `traceparent` (and its `tracestate`) is logged in the span and
//! passed to plugins in each forwarded request's `params._meta`, as the MCP spec reserves
//! those keys for; an invalid one is ignored, as W3C Trace Context says. Nothing from the
//! `Authorization` header, cookies or query strings is ever logged.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Instant;

use axum::extract::MatchedPath;
use axum::http::{HeaderMap, HeaderName, Request};
use axum::response::Response;
use serde_json::value::RawValue;
use tower::{Layer, Service};
use tracing::Span;
use tracing::field::Empty;

/// The W3C trace context a request arrived with.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TraceContext {
    pub traceparent: String,
    pub tracestate: Option<String>,
}

const TRACEPARENT: HeaderName = HeaderName::from_static("traceparent");
const TRACESTATE: HeaderName = HeaderName::from_static("tracestate");

/// Longest `tracestate` passed on (W3C: at most 32 members; 512 characters is the size every
/// vendor must accept).
const MAX_TRACESTATE: usize = 512;

impl TraceContext {
    /// The context in `headers`, when `traceparent` is valid.
    pub fn from_headers(headers: &HeaderMap) -> Option<TraceContext> {
        let traceparent = headers.get(&TRACEPARENT)?.to_str().ok()?.trim();
        if !valid_traceparent(traceparent) {
            return None;
        }
        let tracestate = headers
            .get(&TRACESTATE)
            .and_then(|v| v.to_str().ok())
            .map(str::trim)
            .filter(|v| !v.is_empty() && v.len() <= MAX_TRACESTATE)
            .map(str::to_owned);
        Some(TraceContext {
            traceparent: traceparent.to_ascii_lowercase(),
            tracestate,
        })
    }

    /// `params` with this context in `_meta`, unless the client put a `traceparent` there
    /// itself (its own is the more specific). Params that are not an object stay as they are.
    pub fn inject(&self, params: Option<Box<RawValue>>) -> Option<Box<RawValue>> {
        let mut value: serde_json::Value = match &params {
            None => serde_json::json!({}),
            Some(raw) => match serde_json::from_str(raw.get()) {
                Ok(v @ serde_json::Value::Object(_)) => v,
                _ => return params,
            },
        };
        let meta = value
            .as_object_mut()
            .expect("an object")
            .entry("_meta")
            .or_insert_with(|| serde_json::json!({}));
        let Some(meta) = meta.as_object_mut() else {
            return params;
        };
        if meta.contains_key("traceparent") {
            return params;
        }
        meta.insert("traceparent".into(), self.traceparent.clone().into());
        if let Some(state) = &self.tracestate {
            meta.insert("tracestate".into(), state.clone().into());
        }
        RawValue::from_string(value.to_string()).ok().or(params)
    }
}

/// `version-traceid-parentid-flags` in lowercase hex (upper case accepted and lowered), with
/// neither id all zeros and version `ff` refused. A future version may append fields after
/// the four of version 00.
fn valid_traceparent(v: &str) -> bool {
    let parts: Vec<&str> = v.split('-').collect();
    let hex = |s: &str, n: usize| s.len() == n && s.bytes().all(|b| b.is_ascii_hexdigit());
    let nonzero = |s: &str| s.bytes().any(|b| b != b'0');
    match parts.as_slice() {
        [version, trace, parent, flags, rest @ ..] => {
            hex(version, 2)
                && !version.eq_ignore_ascii_case("ff")
                && (rest.is_empty() || *version != "00")
                && hex(trace, 32)
                && nonzero(trace)
                && hex(parent, 16)
                && nonzero(parent)
                && hex(flags, 2)
        }
        _ => false,
    }
}

/// The layer every request passes first: it counts and times the request
/// ([`crate::metrics::record_http`]), runs it in its `request` span, and writes its access
/// line. One hand-written service rather than `from_fn` middleware: no boxed future and no
/// clone of the inner service per request.
#[derive(Debug, Clone, Copy, Default)]
pub struct ObserveLayer;

impl<S> Layer<S> for ObserveLayer {
    type Service = Observe<S>;

    fn layer(&self, inner: S) -> Observe<S> {
        Observe { inner }
    }
}

#[derive(Debug, Clone)]
pub struct Observe<S> {
    inner: S,
}

impl<S, B> Service<Request<B>> for Observe<S>
where
    S: Service<Request<B>, Response = Response>,
{
    type Response = Response;
    type Error = S::Error;
    type Future = Observed<S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Request<B>) -> Self::Future {
        let started = Instant::now();
        let method = crate::metrics::method_label(request.method());
        // An Arc inside: no copy of the path.
        let route = request.extensions().get::<MatchedPath>().cloned();
        let span = tracing::info_span!(
            "request",
            method,
            route = route.as_ref().map_or("unmatched", MatchedPath::as_str),
            session = Empty,
            plugin = Empty,
            traceparent = Empty,
        );
        if !span.is_disabled()
            && let Some(ctx) = TraceContext::from_headers(request.headers())
        {
            span.record("traceparent", ctx.traceparent.as_str());
        }
        let inner = {
            let _entered = span.enter();
            self.inner.call(request)
        };
        Observed {
            inner,
            span,
            started,
            method,
            route,
        }
    }
}

pin_project_lite::pin_project! {
    /// A request in flight through [`Observe`].
    pub struct Observed<F> {
        #[pin]
        inner: F,
        span: Span,
        started: Instant,
        method: &'static str,
        route: Option<MatchedPath>,
    }
}

impl<F, E> Future for Observed<F>
where
    F: Future<Output = Result<Response, E>>,
{
    type Output = F::Output;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        let _entered = this.span.enter();
        let result = std::task::ready!(this.inner.poll(cx));
        if let Ok(response) = &result {
            let elapsed = this.started.elapsed();
            let route = this.route.as_ref().map_or("unmatched", MatchedPath::as_str);
            crate::metrics::record_http(this.method, route, response.status(), elapsed);
            // Debug level: a line per request is for when it is wanted
            // (`RUST_LOG=info,mcp_gateway::access=debug`); at tens of thousands of calls a
            // second it costs a fifth of the throughput.
            tracing::debug!(
                target: "mcp_gateway::access",
                status = response.status().as_u16(),
                ms = elapsed.as_secs_f64() * 1000.0,
                "request"
            );
        }
        Poll::Ready(result)
    }
}

/// Names the request's session in its span.
pub fn record_session(id: &str) {
    tracing::Span::current().record("session", id);
}

/// Names the plugin(s) serving the request in its span: nothing is collected when the span
/// is off, nothing joined for the usual one.
pub fn record_plugins<'a>(names: impl Iterator<Item = &'a str>) {
    let span = Span::current();
    if span.is_disabled() {
        return;
    }
    let mut names: Vec<&str> = names.collect();
    match names.as_slice() {
        [] => {}
        [one] => {
            span.record("plugin", *one);
        }
        _ => {
            names.sort_unstable();
            names.dedup();
            span.record("plugin", names.join(",").as_str());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const GOOD: &str = "00-0af7651916cd43dd8448eb211c80319c-00f067aa0ba902b7-01";

    fn headers(tp: &str, ts: Option<&str>) -> HeaderMap {
        let mut h = HeaderMap::new();
        h.insert("traceparent", tp.parse().unwrap());
        if let Some(ts) = ts {
            h.insert("tracestate", ts.parse().unwrap());
        }
        h
    }

    #[test]
    fn traceparent_validation() {
        assert!(valid_traceparent(GOOD));
        assert!(!valid_traceparent(
            "00-00000000000000000000000000000000-00f067aa0ba902b7-01"
        ));
        assert!(!valid_traceparent(
            "00-0af7651916cd43dd8448eb211c80319c-0000000000000000-01"
        ));
        assert!(!valid_traceparent(
            "ff-0af7651916cd43dd8448eb211c80319c-00f067aa0ba902b7-01"
        ));
        assert!(!valid_traceparent(
            "00-0af7651916cd43dd-00f067aa0ba902b7-01"
        ));
        assert!(!valid_traceparent(&format!("{GOOD}-extra")));
        assert!(valid_traceparent(
            "01-0af7651916cd43dd8448eb211c80319c-00f067aa0ba902b7-01-extra"
        ));
        assert!(!valid_traceparent("not a trace"));
    }

    #[test]
    fn injects_into_meta_and_keeps_the_clients_own() {
        let ctx = TraceContext::from_headers(&headers(GOOD, Some("a=1"))).unwrap();
        let raw = |s: &str| Some(RawValue::from_string(s.into()).unwrap());
        let out: serde_json::Value = serde_json::from_str(
            ctx.inject(raw(r#"{"name":"t","arguments":{}}"#))
                .unwrap()
                .get(),
        )
        .unwrap();
        assert_eq!(out["_meta"]["traceparent"], GOOD);
        assert_eq!(out["_meta"]["tracestate"], "a=1");
        assert_eq!(out["name"], "t");

        let out: serde_json::Value = serde_json::from_str(ctx.inject(None).unwrap().get()).unwrap();
        assert_eq!(out["_meta"]["traceparent"], GOOD);

        let own = r#"{"_meta":{"traceparent":"00-11111111111111111111111111111111-2222222222222222-00","progressToken":1}}"#;
        assert_eq!(ctx.inject(raw(own)).unwrap().get(), own);
        assert_eq!(ctx.inject(raw("[1,2]")).unwrap().get(), "[1,2]");
    }

    #[test]
    fn invalid_context_is_ignored() {
        assert!(TraceContext::from_headers(&headers("garbage", None)).is_none());
        assert!(TraceContext::from_headers(&HeaderMap::new()).is_none());
        let long = "a=".to_owned() + &"x".repeat(600);
        let ctx = TraceContext::from_headers(&headers(GOOD, Some(&long))).unwrap();
        assert_eq!(ctx.tracestate, None);
    }
}
