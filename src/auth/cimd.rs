//! Client ID metadata documents: a `client_id` that is an https URL names a JSON document
//! describing the client, which the authorization server fetches instead of a registration.
//!
//! Fetching a URL a stranger chose is a server-side request forgery risk, so the fetch is
//! guarded: https only; the host's addresses resolved first and refused unless every one is
//! global unicast ([`is_global`], after unwrapping IPv4 carried in IPv6), unless configured
//! for development; the connection pinned to the address that was checked, with no proxy; no
//! redirects; a size and a time limit. Every failure of the fetch answers the caller with one
//! message (the detail goes to the log), so the answers do not tell which internal addresses
//! exist.
//! Fetches are limited per client address and for all clients together (each would otherwise
//! make the gateway open a connection of a stranger's choosing). Documents are cached as their
//! `Cache-Control` allows (at most a day), in a cache of bounded size.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::time::{Duration, Instant};

use dashmap::DashMap;
use serde::Deserialize;

use super::redirect::valid_redirect_uri;
use super::store::Client;
use super::throttle::Throttle;

const MAX_BYTES: usize = 64 * 1024;
const TIMEOUT: Duration = Duration::from_secs(5);
const DEFAULT_TTL: Duration = Duration::from_secs(300);
const MAX_TTL: Duration = Duration::from_secs(86_400);
/// Documents cached at most; past that, expired ones go and new ones are not cached.
const MAX_CACHED: usize = 4096;
/// Client addresses the per-address fetch limit keeps at most.
const MAX_ADDRESSES: usize = 65_536;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CimdError {
    #[error("the client_id URL is not acceptable: {0}")]
    BadUrl(String),
    /// Every way a fetch can fail (a non-global address, no answer, refused, a bad status,
    /// too big, too slow): one message, so that a caller cannot map addresses by the answers.
    #[error("the client metadata document could not be fetched")]
    Unreachable,
    #[error("the client metadata document is invalid: {0}")]
    Invalid(String),
    #[error("too many client metadata documents fetched; try again later")]
    Limited(Duration),
}

#[derive(Deserialize)]
struct Document {
    client_id: String,
    client_name: Option<String>,
    redirect_uris: Vec<String>,
    token_endpoint_auth_method: Option<String>,
}

pub struct Fetcher {
    allow_private: bool,
    cache: DashMap<String, (Instant, Client)>,
    per_address: Throttle<IpAddr>,
    total: Throttle<()>,
}

/// Whether a `client_id` is a metadata document URL rather than a registered id.
pub fn is_document_url(client_id: &str) -> bool {
    client_id.starts_with("https://") || client_id.starts_with("http://")
}

pub use crate::config::is_global;

impl Fetcher {
    /// A fetcher allowing `per_address` fetches a minute for one client address and `total`
    /// for all.
    pub fn new(allow_private: bool, per_address: u32, total: u32) -> Fetcher {
        let minute = Duration::from_secs(60);
        Fetcher {
            allow_private,
            cache: DashMap::new(),
            per_address: Throttle::new(per_address, minute, MAX_ADDRESSES),
            total: Throttle::new(total, minute, 1),
        }
    }

    /// The client a document URL describes, fetched (unless cached) on behalf of the client
    /// at `addr` (as [`super::throttle::address_key`] counts it).
    pub async fn client(&self, client_id: &str, addr: Option<IpAddr>) -> Result<Client, CimdError> {
        if let Some(hit) = self.cache.get(client_id)
            && hit.0 > Instant::now()
        {
            return Ok(hit.1.clone());
        }
        let url = url::Url::parse(client_id).map_err(|e| CimdError::BadUrl(e.to_string()))?;
        if url.host_str().is_none() {
            return Err(CimdError::BadUrl("no host".into()));
        }
        let loopback_http = url.scheme() == "http" && self.allow_private;
        if url.scheme() != "https" && !loopback_http {
            return Err(CimdError::BadUrl("it must be https".into()));
        }
        if url.path() == "/" || url.fragment().is_some() || !url.username().is_empty() {
            return Err(CimdError::BadUrl(
                "it needs a path, and no fragment or credentials".into(),
            ));
        }
        self.per_address
            .acquire(addr.unwrap_or(IpAddr::V4(Ipv4Addr::UNSPECIFIED)))
            .map_err(CimdError::Limited)?;
        self.total.acquire(()).map_err(CimdError::Limited)?;
        // However it failed, the caller hears the same: which addresses exist, answer or
        // refuse is not theirs to learn. The log has the detail.
        let (body, ttl) = self.fetch(&url).await.map_err(|detail| {
            tracing::info!(client_id, address = ?addr, "client metadata document not fetched: {detail}");
            CimdError::Unreachable
        })?;
        let doc: Document =
            serde_json::from_slice(&body).map_err(|e| CimdError::Invalid(e.to_string()))?;
        if doc.client_id != client_id {
            return Err(CimdError::Invalid(format!(
                "its client_id `{}` is not the URL it was fetched from",
                doc.client_id
            )));
        }
        let name = doc
            .client_name
            .filter(|n| !n.trim().is_empty())
            .ok_or_else(|| CimdError::Invalid("client_name is required".into()))?;
        if doc.redirect_uris.is_empty() {
            return Err(CimdError::Invalid("redirect_uris is required".into()));
        }
        for r in &doc.redirect_uris {
            valid_redirect_uri(r).map_err(CimdError::Invalid)?;
        }
        match doc.token_endpoint_auth_method.as_deref() {
            None | Some("none") => {}
            Some(m) => {
                return Err(CimdError::Invalid(format!(
                    "token_endpoint_auth_method `{m}` is not supported for metadata documents (only none)"
                )));
            }
        }
        let client = Client {
            client_id: client_id.to_owned(),
            secret_hash: None,
            name: Some(name),
            redirect_uris: doc.redirect_uris,
            auth_method: "none".into(),
            grant_types: vec!["authorization_code".into(), "refresh_token".into()],
            application_type: "web".into(),
            scope: None,
            provisioned: false,
        };
        if let Some(ttl) = ttl {
            let now = Instant::now();
            if self.cache.len() >= MAX_CACHED {
                self.cache.retain(|_, (until, _)| *until > now);
            }
            if self.cache.len() < MAX_CACHED {
                self.cache
                    .insert(client_id.to_owned(), (now + ttl, client.clone()));
            }
        }
        Ok(client)
    }
}

impl Fetcher {
    /// GETs a document URL: resolved, every address checked (only global unicast, unless
    /// private addresses are allowed for development), connected to the checked address only,
    /// no proxy, no redirects, within the size and time limits. The body and how long it may
    /// be cached; on failure, what went wrong (for the log only).
    async fn fetch(&self, url: &url::Url) -> Result<(Vec<u8>, Option<Duration>), String> {
        let host = url.host_str().unwrap_or_default();
        let bare = host.trim_start_matches('[').trim_end_matches(']');
        let port = url.port_or_known_default().unwrap_or(443);
        let addrs: Vec<SocketAddr> =
            tokio::time::timeout(TIMEOUT, tokio::net::lookup_host((bare, port)))
                .await
                .map_err(|_| format!("resolving {host} timed out"))?
                .map_err(|e| format!("cannot resolve {host}: {e}"))?
                .collect();
        let Some(first) = addrs.first().copied() else {
            return Err(format!("{host} has no address"));
        };
        if !self.allow_private
            && let Some(bad) = addrs.iter().map(SocketAddr::ip).find(|ip| !is_global(*ip))
        {
            return Err(format!(
                "{host} resolves to {bad}, which is not a global address"
            ));
        }
        // Pinned to the address just checked (a second lookup could answer differently), and
        // never through a proxy (which would resolve the name itself).
        let http = reqwest::Client::builder()
            .redirect(reqwest::redirect::Policy::none())
            .no_proxy()
            .timeout(TIMEOUT)
            .resolve(bare, first)
            .build()
            .map_err(|e| e.to_string())?;
        let mut response = http
            .get(url.clone())
            .header("accept", "application/json")
            .send()
            .await
            .map_err(|e| format!("{first}: {e}"))?;
        if !response.status().is_success() {
            return Err(format!("{first}: HTTP {}", response.status()));
        }
        let ttl = cache_ttl(response.headers().get("cache-control"));
        let mut body = Vec::new();
        while let Some(chunk) = response
            .chunk()
            .await
            .map_err(|e| format!("{first}: {e}"))?
        {
            body.extend_from_slice(&chunk);
            if body.len() > MAX_BYTES {
                return Err(format!("{first}: larger than {MAX_BYTES} bytes"));
            }
        }
        Ok((body, ttl))
    }
}

/// How long a document may be cached: `max-age` (at most a day), none with `no-store` or
/// `no-cache`, five minutes when nothing is said.
fn cache_ttl(header: Option<&axum::http::HeaderValue>) -> Option<Duration> {
    let Some(v) = header.and_then(|h| h.to_str().ok()) else {
        return Some(DEFAULT_TTL);
    };
    let mut ttl = Some(DEFAULT_TTL);
    for d in v.split(',').map(str::trim) {
        if d.eq_ignore_ascii_case("no-store") || d.eq_ignore_ascii_case("no-cache") {
            return None;
        }
        if let Some(n) = d
            .strip_prefix("max-age=")
            .and_then(|n| n.parse::<u64>().ok())
        {
            ttl = (n > 0).then(|| Duration::from_secs(n).min(MAX_TTL));
        }
    }
    ttl
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_global_unicast_addresses_are_fetched_from() {
        let refused = [
            // IPv4: private, loopback, link-local, shared, reserved, documentation, ...
            "10.1.2.3",
            "172.16.0.1",
            "172.31.255.255",
            "192.168.1.1",
            "127.0.0.1",
            "127.255.0.1",
            "169.254.169.254",
            "0.0.0.0",
            "0.1.2.3",
            "100.64.0.1",
            "100.127.255.255",
            "192.0.0.8",
            "192.0.2.1",
            "192.88.99.1",
            "198.18.0.1",
            "198.51.100.1",
            "203.0.113.1",
            "224.0.0.1",
            "240.0.0.1",
            "255.255.255.255",
            // IPv6 proper
            "::",
            "::1",
            "fc00::1",
            "fd00::2",
            "fe80::1",
            "fec0::1",
            "feff::1",
            "ff02::1",
            "100::1",
            "5f00::1",
            "2001:db8::1",
            "3fff::1",
            "2001:2::1",
            "2001:10::1",
            // IPv4 carried in IPv6
            "::127.0.0.1",
            "::8.8.8.8",
            "::ffff:127.0.0.1",
            "::ffff:10.0.0.1",
            "::ffff:169.254.169.254",
            "::ffff:0:127.0.0.1",
            "64:ff9b::7f00:1",
            "64:ff9b::10.0.0.1",
            "64:ff9b::169.254.169.254",
            "64:ff9b:1::7f00:1",
            "2002:7f00:1::1",
            "2002:0808:0808::1",
            "2001:0:4136:e378:8000:63bf:3fff:fdd2",
            "2001::1",
        ];
        for ip in refused {
            assert!(!is_global(ip.parse().unwrap()), "{ip} must be refused");
        }
        let allowed = [
            "93.184.216.34",
            "1.1.1.1",
            "8.8.8.8",
            "100.63.255.255",
            "100.128.0.1",
            "172.15.255.255",
            "172.32.0.1",
            "192.0.1.1",
            "198.20.0.1",
            "223.255.255.254",
            "2606:4700:4700::1111",
            "2a00:1450:4001::1",
            "2001:200::1",
            "::ffff:8.8.8.8",
            "64:ff9b::8.8.8.8",
        ];
        for ip in allowed {
            assert!(is_global(ip.parse().unwrap()), "{ip} must be allowed");
        }
    }

    #[test]
    fn cache_lifetimes() {
        let h = |s: &'static str| axum::http::HeaderValue::from_static(s);
        assert_eq!(cache_ttl(None), Some(DEFAULT_TTL));
        assert_eq!(
            cache_ttl(Some(&h("max-age=60"))),
            Some(Duration::from_secs(60))
        );
        assert_eq!(cache_ttl(Some(&h("public, max-age=999999"))), Some(MAX_TTL));
        assert_eq!(cache_ttl(Some(&h("no-store"))), None);
        assert_eq!(cache_ttl(Some(&h("max-age=0"))), None);
    }
}
