//! What stands before every route of the admin listener, the probes included.
//!
//! - **Host and Origin** (against DNS rebinding): a page the operator opens can point a name
//!   of its own at the admin address, and the browser then sends that name as `Host`. So the
//!   listener answers only to IP addresses (a rebinding page needs a name), `localhost`, and
//!   the names in `admin.allowed_hosts`; any other `Host` gets 421. An `Origin` that is not
//!   the `Host` itself (another site's page) gets 403.
//! - **Failed authentications** (the API's bearer token and the console's sign-in together)
//!   are counted per client address ([`checks::address_key`]): past [`MAX_FAILURES`] in
//!   [`FAILURE_WINDOW`] that address gets 429 with `Retry-After`, even with the right token (a
//!   lucky guess must not be told apart), while every other address is served as before, so
//!   nobody locks the operators out. Each counted failure is in the audit log; the throttle
//!   bounds how many one address adds.

use std::net::IpAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::extract::Request;
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use serde_json::json;

use crate::auth::throttle::Throttle;
use crate::http::checks;
use crate::http::serve::ConnectionContext;

/// Failed authentications one address may make per window.
pub const MAX_FAILURES: u32 = 10;
pub const FAILURE_WINDOW: Duration = Duration::from_secs(60);
/// Addresses the throttle remembers at once (a flood of addresses makes it forget, not grow).
const MAX_ADDRESSES: usize = 4096;

/// The admin listener's Host names and its throttle of failed authentications.
pub struct AdminGuard {
    /// Lower-case names let in besides IP addresses and `localhost`.
    hosts: Vec<String>,
    failures: Throttle<IpAddr>,
}

impl AdminGuard {
    pub fn new(hosts: Vec<String>) -> Arc<AdminGuard> {
        Arc::new(AdminGuard {
            hosts,
            failures: Throttle::new(MAX_FAILURES, FAILURE_WINDOW, MAX_ADDRESSES),
        })
    }

    /// `Err(wait)` while `address` has failed too often lately.
    pub fn throttled(&self, address: IpAddr) -> Result<(), Duration> {
        match self.failures.blocked(&checks::address_key(address)) {
            Some(wait) => Err(wait),
            None => Ok(()),
        }
    }

    /// Counts a failed authentication from `address`.
    pub fn failed(&self, address: IpAddr) {
        self.failures.hit(checks::address_key(address));
    }

    /// `address` gave the right token: its failures are forgotten.
    pub fn succeeded(&self, address: IpAddr) {
        self.failures.clear(&checks::address_key(address));
    }

    /// Whether `Host` (or HTTP/2's authority) names this listener as the guard allows.
    fn host_allowed(&self, authority: &str) -> bool {
        let host = checks::host_of(authority);
        let literal = host.trim_start_matches('[').trim_end_matches(']');
        literal.parse::<IpAddr>().is_ok()
            || host == "localhost"
            || self.hosts.iter().any(|h| h == host)
    }
}

/// The 429 of a throttled address, with its `Retry-After`.
pub fn too_many_failures(wait: Duration) -> Response {
    let mut r = (
        StatusCode::TOO_MANY_REQUESTS,
        axum::Json(json!({
            "error": "too many failed authentications from this address: wait and try again"
        })),
    )
        .into_response();
    r.headers_mut()
        .insert(header::RETRY_AFTER, HeaderValue::from(wait.as_secs() + 1));
    r
}

/// The address a request came from (the peer: the admin listener trusts no proxy).
pub fn peer(request: &Request) -> IpAddr {
    request
        .extensions()
        .get::<Arc<ConnectionContext>>()
        .map_or(IpAddr::from([0, 0, 0, 0]), |c| c.peer.ip())
}

/// The middleware in front of every admin route: Host, then Origin.
pub async fn check(
    axum::Extension(guard): axum::Extension<Arc<AdminGuard>>,
    request: Request,
    next: Next,
) -> Response {
    let authority = authority(&request);
    if !guard.host_allowed(&authority) {
        return refuse(
            StatusCode::MISDIRECTED_REQUEST,
            format!(
                "Host `{authority}` is not a name this admin listener answers to: use its address, or add the name to admin.allowed_hosts"
            ),
        );
    }
    if let Some(origin) = foreign_origin(request.headers(), &authority) {
        return refuse(
            StatusCode::FORBIDDEN,
            format!("Origin `{origin}` is another site"),
        );
    }
    next.run(request).await
}

fn authority(request: &Request) -> String {
    request
        .headers()
        .get(header::HOST)
        .and_then(|h| h.to_str().ok())
        .or_else(|| request.uri().authority().map(|a| a.as_str()))
        .unwrap_or_default()
        .to_ascii_lowercase()
}

/// The `Origin`, if there is one and it is not the listener itself as `authority` names it.
/// An opaque `null` origin names no site. A browser's own `Sec-Fetch-Site: same-origin` (or
/// `none`: typed in) is believed, so that a console behind a proxy that rewrites `Host` still
/// works: a rebinding page is same-origin too, but its `Host` was refused already.
fn foreign_origin(headers: &HeaderMap, authority: &str) -> Option<String> {
    let origin = headers.get(header::ORIGIN)?;
    if matches!(
        headers.get("sec-fetch-site").map(|v| v.as_bytes()),
        Some(b"same-origin" | b"none")
    ) {
        return None;
    }
    let Ok(origin) = origin.to_str() else {
        return Some("(not text)".into());
    };
    let origin = origin.trim().to_ascii_lowercase();
    if origin == "null" {
        return None;
    }
    let same = origin
        .split_once("://")
        .is_some_and(|(scheme, rest)| matches!(scheme, "http" | "https") && rest == authority);
    (!same).then_some(origin)
}

fn refuse(status: StatusCode, why: String) -> Response {
    (status, axum::Json(json!({ "error": why }))).into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_refused_unless_listed_addresses_never() {
        let g = AdminGuard::new(vec!["admin.example.com".into()]);
        for ok in [
            "127.0.0.1:9090",
            "10.1.2.3",
            "[::1]:9090",
            "localhost:9090",
            "admin.example.com:9090",
        ] {
            assert!(g.host_allowed(ok), "{ok}");
        }
        for bad in [
            "rebind.attacker.example",
            "rebind.attacker.example:9090",
            "127.0.0.1.nip.io:9090",
            "",
            "[::1]x",
        ] {
            assert!(!g.host_allowed(bad), "{bad}");
        }
    }

    #[test]
    fn only_the_listener_itself_is_a_same_origin() {
        let h = |o: &str| {
            let mut h = HeaderMap::new();
            h.insert(header::ORIGIN, o.parse().unwrap());
            h
        };
        let at = "127.0.0.1:9090";
        assert_eq!(foreign_origin(&HeaderMap::new(), at), None);
        assert_eq!(foreign_origin(&h("http://127.0.0.1:9090"), at), None);
        assert_eq!(foreign_origin(&h("null"), at), None);
        assert!(foreign_origin(&h("http://rebind.attacker.example:9090"), at).is_some());
        assert!(foreign_origin(&h("http://127.0.0.1:9091"), at).is_some());
        assert!(foreign_origin(&h("file://127.0.0.1:9090"), at).is_some());
        // Behind a proxy that rewrites Host, the browser's word decides.
        let mut proxied = h("https://admin.example.com");
        proxied.insert("sec-fetch-site", "same-origin".parse().unwrap());
        assert_eq!(foreign_origin(&proxied, at), None);
        proxied.insert("sec-fetch-site", "cross-site".parse().unwrap());
        assert!(foreign_origin(&proxied, at).is_some());
    }

    #[test]
    fn failures_are_counted_per_address() {
        let g = AdminGuard::new(Vec::new());
        let a: IpAddr = "192.0.2.1".parse().unwrap();
        let b: IpAddr = "192.0.2.2".parse().unwrap();
        for _ in 0..MAX_FAILURES {
            assert!(g.throttled(a).is_ok());
            g.failed(a);
        }
        assert!(g.throttled(a).unwrap_err() <= FAILURE_WINDOW);
        assert!(g.throttled(b).is_ok(), "another address is not held back");
        // One IPv6 host holds its whole /64.
        let v6: IpAddr = "2001:db8::1".parse().unwrap();
        for _ in 0..MAX_FAILURES {
            g.failed(v6);
        }
        assert!(g.throttled("2001:db8::ffff".parse().unwrap()).is_err());
    }
}
