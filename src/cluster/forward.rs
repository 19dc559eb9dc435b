//! Forwarding a request to the replica that owns its session, and telling a forwarded request
//! from a client's.
//!
//! The forwarder sends the client's request as it came (method, body, end-to-end headers,
//! `Host` and `Origin` included, so the owner's checks see what the client sent) to the
//! owner's [`FORWARDED_PATH`], with the cluster's secret in [`SECRET_HEADER`]. The owner
//! serves it as its own `/mcp` would, but never forwards it again; its answer, a JSON body or
//! an SSE stream, is streamed back as it comes. Hop-by-hop headers go neither way, and the
//! secret never reaches a client.

use axum::body::Body;
use axum::http::{HeaderMap, HeaderName, Method, StatusCode};
use axum::response::Response;
use bytes::Bytes;
use futures_util::TryStreamExt;

use super::Cluster;

/// Where a replica serves requests forwarded by another.
pub const FORWARDED_PATH: &str = "/_cluster/mcp";
/// Carries the cluster's secret on a forwarded request.
pub const SECRET_HEADER: HeaderName = HeaderName::from_static("x-mcp-gateway-cluster");

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
}

/// Why a forward failed.
#[derive(Debug, thiserror::Error)]
#[error("the replica at {url} that owns this session could not be reached: {cause}")]
pub struct ForwardError {
    pub url: String,
    pub cause: String,
    /// The owner never got the request (it could not be connected to): sending it again is
    /// safe. Otherwise it may have run it.
    pub retry: bool,
}

impl Cluster {
    /// Whether `headers` carry this cluster's secret.
    pub fn is_forwarded(&self, headers: &HeaderMap) -> bool {
        headers
            .get(&SECRET_HEADER)
            .and_then(|v| v.to_str().ok())
            .is_some_and(|v| crate::auth::constant_time_eq(v, &self.secret))
    }

    /// Sends a client's request to the owner at `url` and streams its answer back.
    pub async fn forward(
        &self,
        url: &str,
        method: Method,
        headers: &HeaderMap,
        body: Bytes,
    ) -> Result<Response, ForwardError> {
        let target = format!("{url}{FORWARDED_PATH}");
        let mut out = reqwest::header::HeaderMap::with_capacity(headers.len() + 1);
        for (name, value) in headers {
            if !hop_by_hop(name) {
                out.append(name.clone(), value.clone());
            }
        }
        out.insert(
            SECRET_HEADER,
            self.secret.parse().expect("the secret is a header value"),
        );
        let failed = |cause: String| {
            crate::metrics::get()
                .cluster_forwards
                .with_label_values(&["unreachable"])
                .inc();
            ForwardError {
                url: url.to_owned(),
                cause,
                retry: false,
            }
        };
        let answer = self
            .http
            .request(method, &target)
            .headers(out)
            .body(body)
            .send()
            .await
            .map_err(|e| ForwardError {
                // Only a request that never reached the owner is safe to send again.
                retry: e.is_connect(),
                ..failed(e.to_string())
            })?;
        crate::metrics::get()
            .cluster_forwards
            .with_label_values(&["ok"])
            .inc();
        let status =
            StatusCode::from_u16(answer.status().as_u16()).unwrap_or(StatusCode::BAD_GATEWAY);
        let mut response = Response::builder().status(status);
        if let Some(h) = response.headers_mut() {
            for (name, value) in answer.headers() {
                if !hop_by_hop(name) {
                    h.append(name.clone(), value.clone());
                }
            }
        }
        let stream = answer.bytes_stream().map_err(std::io::Error::other);
        Ok(response
            .body(Body::from_stream(stream))
            .expect("a response from parts that were valid"))
    }
}
