//! Forwarding a request to the replica that owns its session (or, for a modern client's
//! retry, the call it resumes), and telling a forwarded request from a client's.
//!
//! The forwarder sends the client's request as it came (method, body, end-to-end headers,
//! `Host` and `Origin` included, so the owner's checks see what the client sent) to the
//! owner's [`FORWARDED_PATH`], with the cluster's secret in [`SECRET_HEADER`]. The owner
//! serves it as its own `/mcp` would, but never forwards it again; its answer, a JSON body or
//! an SSE stream, is streamed back as it comes. Hop-by-hop headers go neither way, and the
//! secret never reaches a client.

use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::http::{HeaderMap, HeaderName, Method, Request, StatusCode, Uri};
use axum::response::Response;
use bytes::Bytes;
use dashmap::DashMap;
use futures_util::{StreamExt, TryStreamExt};
use http_body_util::BodyExt;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::{TokioExecutor, TokioTimer};

use super::Cluster;

/// Where a replica serves requests forwarded by another.
pub const FORWARDED_PATH: &str = "/_cluster/mcp";
/// Carries the cluster's secret on a forwarded request.
pub const SECRET_HEADER: HeaderName = HeaderName::from_static("x-mcp-gateway-cluster");
/// Names the replica a forwarded request is meant for: another process at that address (a
/// replica restarted on the same port) answers 421 rather than serve it.
pub const REPLICA_HEADER: HeaderName = HeaderName::from_static("x-mcp-gateway-replica");
/// Marks an owner's 404 to a forwarded request for a session it does not hold: the forwarder
/// that took it for the owner from memory asks Redis again (see [`super::owners`]).
pub const NOT_HERE_HEADER: HeaderName = HeaderName::from_static("x-mcp-gateway-not-here");

/// The most owners' URLs kept parsed: a cluster has a few replicas, and a replica restarted
/// on another port is a new URL; past this the parsed ones are dropped and parsed again.
const MAX_TARGETS: usize = 256;

/// How long connecting to an owner may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);

/// The HTTP client requests are forwarded with: hyper's own, over plain TCP or rustls (an
/// owner's advertised URL may be https). Not reqwest: its redirect layer, there even with
/// redirects off, copied every request's headers and parsed the URL again from the answer,
/// a tenth of a forwarding replica's CPU.
pub(super) type Http = Client<hyper_rustls::HttpsConnector<HttpConnector>, Body>;

/// The forwarding client: straight to the owner (no proxy from the environment: the secret
/// and clients' tokens ride along; redirects are answers like any other, never followed),
/// connections kept (idle ones dropped before the owner's header timeout closes them), dead
/// peers found by TCP keep-alive.
pub(super) fn client() -> Http {
    let mut tcp = HttpConnector::new();
    tcp.set_connect_timeout(Some(CONNECT_TIMEOUT));
    tcp.set_keepalive(Some(Duration::from_secs(15)));
    tcp.set_nodelay(true);
    tcp.enforce_http(false);
    let connector = hyper_rustls::HttpsConnectorBuilder::new()
        .with_webpki_roots()
        .https_or_http()
        .enable_http1()
        .wrap_connector(tcp);
    Client::builder(TokioExecutor::new())
        .pool_idle_timeout(Duration::from_secs(20))
        .pool_timer(TokioTimer::new())
        .build(connector)
}

/// Each owner's [`FORWARDED_PATH`] URL, parsed once.
#[derive(Default)]
pub(super) struct Targets(DashMap<Box<str>, Uri>);

impl Targets {
    fn get(&self, url: &str) -> Result<Uri, String> {
        if let Some(t) = self.0.get(url) {
            return Ok(t.clone());
        }
        let target: Uri = format!("{url}{FORWARDED_PATH}")
            .parse()
            .map_err(|e| format!("its URL {url:?} does not parse: {e}"))?;
        if self.0.len() >= MAX_TARGETS {
            self.0.clear();
        }
        self.0.insert(url.into(), target.clone());
        Ok(target)
    }
}

/// Marks a request that another replica forwarded (its secret checked).
#[derive(Debug, Clone, Copy)]
pub struct Forwarded;

/// Headers that belong to one connection, not to the request (RFC 9110, 7.6.1).
fn hop_by_hop(name: &HeaderName) -> bool {
    matches!(
        name.as_str(),
        "connection"
            | "keep-alive"
            | "proxy-connection"
            | "proxy-authenticate"
            | "proxy-authorization"
            | "te"
            | "trailer"
            | "transfer-encoding"
            | "upgrade"
            | "content-length"
    ) || *name == SECRET_HEADER
        || *name == REPLICA_HEADER
        || *name == NOT_HERE_HEADER
}

/// Why a forward failed.
#[derive(Debug, thiserror::Error)]
#[error("the replica at {url} that owns this session could not be reached: {cause}")]
pub struct ForwardError {
    pub url: String,
    pub cause: String,
    /// The owner never got the request (it could not be connected to, or another process
    /// is at its address): it is gone, and the session may be taken over. Otherwise it may
    /// have run the request.
    pub gone: bool,
    /// The replica at that address does not hold the session (it never ran the request).
    pub not_here: bool,
}

impl Cluster {
    /// Whether `headers` carry this cluster's secret.
    pub fn is_forwarded(&self, headers: &HeaderMap) -> bool {
        headers
            .get(&SECRET_HEADER)
            .and_then(|v| v.to_str().ok())
            .is_some_and(|v| crate::auth::constant_time_eq(v, &self.secret))
    }

    /// Whether a forwarded request was meant for another replica (one that had this
    /// replica's address before it).
    pub fn meant_for_another(&self, headers: &HeaderMap) -> bool {
        headers
            .get(&REPLICA_HEADER)
            .is_some_and(|v| v.as_bytes() != self.replica.as_bytes())
    }

    /// Where the live replica `replica` is reached, for a request only it can serve (a
    /// modern client's retry of a call parked there); `None` when it is not alive and
    /// serving (gone, or draining).
    pub async fn replica_url(&self, replica: &str) -> Result<Option<String>, super::ClusterError> {
        Ok(match self.heartbeat_of(replica).await? {
            super::Heartbeat::Alive(url) => Some(url),
            _ => None,
        })
    }

    /// Sends a client's request to `replica`, the owner, at `url` and streams its answer
    /// back.
    pub async fn forward(
        self: &Arc<Self>,
        replica: &str,
        url: &str,
        method: Method,
        headers: &HeaderMap,
        body: Bytes,
    ) -> Result<Response, ForwardError> {
        let mut request = Request::new(Body::from(body));
        *request.method_mut() = method;
        let out = request.headers_mut();
        out.reserve(headers.len() + 2);
        for (name, value) in headers {
            if !hop_by_hop(name) {
                out.append(name.clone(), value.clone());
            }
        }
        out.insert(
            SECRET_HEADER,
            self.secret.parse().expect("the secret is a header value"),
        );
        if let Ok(v) = replica.parse() {
            out.insert(REPLICA_HEADER, v);
        }
        let failed = |cause: String| {
            crate::metrics::get()
                .cluster_forwards
                .with_label_values(&["unreachable"])
                .inc();
            ForwardError {
                url: url.to_owned(),
                cause,
                gone: false,
                not_here: false,
            }
        };
        *request.uri_mut() = self.targets.get(url).map_err(failed)?;
        // While it waits on the owner, and while the owner's answer streams back, the owner's
        // heartbeat is watched: a replica that stops beating (frozen, or its host gone
        // without a reset) would otherwise hold the request until TCP gives up.
        let watch = self.watch(replica);
        let answer = tokio::select! {
            sent = self.http.request(request) => sent.map_err(|e| ForwardError {
                // Only a request that never reached the owner may be served elsewhere.
                gone: e.is_connect(),
                ..failed(cause_of(&e))
            })?,
            () = self.owner_gone(replica) => {
                // It may have run the request: not to be sent elsewhere.
                return Err(failed("it stopped answering (its heartbeat lapsed)".into()));
            }
        };
        if answer.status() == StatusCode::MISDIRECTED_REQUEST {
            return Err(ForwardError {
                gone: true,
                ..failed("another replica is at its address now".into())
            });
        }
        if answer.status() == StatusCode::NOT_FOUND
            && answer.headers().contains_key(NOT_HERE_HEADER)
        {
            crate::metrics::get()
                .cluster_forwards
                .with_label_values(&["not_here"])
                .inc();
            return Err(ForwardError {
                url: url.to_owned(),
                cause: "it does not hold this session".into(),
                gone: false,
                not_here: true,
            });
        }
        crate::metrics::get()
            .cluster_forwards
            .with_label_values(&["ok"])
            .inc();
        let (parts, body) = answer.into_parts();
        let mut response = Response::builder().status(parts.status);
        if let Some(h) = response.headers_mut() {
            for (name, value) in &parts.headers {
                if !hop_by_hop(name) {
                    h.append(name.clone(), value.clone());
                }
            }
        }
        // The answer ends where the owner stopped: a client of an SSE stream resumes, and
        // its session is taken over.
        let stream = body
            .into_data_stream()
            .map_err(std::io::Error::other)
            .take_until(self.owner_gone(replica))
            .inspect(move |_| {
                let _watching = &watch;
            });
        Ok(response
            .body(Body::from_stream(stream))
            .expect("a response from parts that were valid"))
    }
}

/// A client error with its causes: hyper's own says little more than its kind.
fn cause_of(e: &hyper_util::client::legacy::Error) -> String {
    let mut text = e.to_string();
    let mut source = std::error::Error::source(e);
    while let Some(s) = source {
        text.push_str(": ");
        text.push_str(&s.to_string());
        source = s.source();
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn targets_are_parsed_once_and_stay_bounded() {
        let targets = Targets::default();
        let t = targets.get("http://127.0.0.1:8080").expect("parses");
        assert_eq!(t.to_string(), "http://127.0.0.1:8080/_cluster/mcp");
        assert_eq!(targets.0.len(), 1);
        targets.get("http://127.0.0.1:8080").expect("kept");
        assert_eq!(targets.0.len(), 1);
        assert!(targets.get("http://[::1").is_err());
        for port in 0..MAX_TARGETS + 5 {
            targets
                .get(&format!("http://127.0.0.1:{port}"))
                .expect("parses");
        }
        assert!(targets.0.len() <= MAX_TARGETS);
    }
}
