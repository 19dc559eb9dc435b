//! Client ID metadata documents: a `client_id` that is an https URL names a JSON document
//! describing the client, which the authorization server fetches instead of a registration.
//!
//! Fetching a URL a stranger chose is a server-side request forgery risk, so the fetch is
//! guarded: https only, the host's addresses resolved first and refused when any is private,
//! loopback, link-local or otherwise not public (unless configured for development), the
//! connection pinned to the address that was checked, no redirects, a size and a time limit.
//! Fetches are limited per client address and for all clients together (each would otherwise
//! make the gateway open a connection of a stranger's choosing). Documents are cached as their
//! `Cache-Control` allows (at most a day), in a cache of bounded size.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::time::{Duration, Instant};

use dashmap::DashMap;
use serde::Deserialize;

use super::server::valid_redirect_uri;
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
    #[error(
        "the client_id URL's host resolves to a non-public address ({0}), which is not fetched"
    )]
    PrivateAddress(IpAddr),
    #[error("the client metadata document could not be fetched: {0}")]
    Fetch(String),
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

/// Addresses no fetch on a stranger's behalf may reach.
pub fn is_private(ip: IpAddr) -> bool {
    match ip {
        IpAddr::V4(v4) => {
            let o = v4.octets();
            v4.is_private()
                || v4.is_loopback()
                || v4.is_link_local()
                || v4.is_unspecified()
                || v4.is_broadcast()
                || v4.is_multicast()
                || v4.is_documentation()
                || o[0] == 0
                || (o[0] == 100 && (o[1] & 0xc0) == 64) // shared address space 100.64/10
                || (o[0] == 198 && (o[1] & 0xfe) == 18) // benchmarking 198.18/15
                || o[0] >= 240
        }
        IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            Some(v4) => is_private(IpAddr::V4(v4)),
            None => {
                v6.is_loopback()
                    || v6.is_unspecified()
                    || v6.is_multicast()
                    || v6.is_unique_local()
                    || v6.is_unicast_link_local()
                    || (v6.segments()[0] == 0x2001 && v6.segments()[1] == 0x0db8)
            }
        },
    }
}

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
        self.per_address
            .acquire(addr.unwrap_or(IpAddr::V4(Ipv4Addr::UNSPECIFIED)))
            .map_err(CimdError::Limited)?;
        self.total.acquire(()).map_err(CimdError::Limited)?;
        let url = url::Url::parse(client_id).map_err(|e| CimdError::BadUrl(e.to_string()))?;
        let host = url
            .host_str()
            .ok_or_else(|| CimdError::BadUrl("no host".into()))?
            .to_owned();
        let loopback_http = url.scheme() == "http" && self.allow_private;
        if url.scheme() != "https" && !loopback_http {
            return Err(CimdError::BadUrl("it must be https".into()));
        }
        if url.path() == "/" || url.fragment().is_some() || !url.username().is_empty() {
            return Err(CimdError::BadUrl(
                "it needs a path, and no fragment or credentials".into(),
            ));
        }
        let port = url.port_or_known_default().unwrap_or(443);
        let bare = host
            .trim_start_matches('[')
            .trim_end_matches(']')
            .to_owned();
        let addrs: Vec<SocketAddr> =
            tokio::time::timeout(TIMEOUT, tokio::net::lookup_host((bare.as_str(), port)))
                .await
                .map_err(|_| CimdError::Fetch("resolving the host timed out".into()))?
                .map_err(|e| CimdError::Fetch(format!("cannot resolve {host}: {e}")))?
                .collect();
        let Some(first) = addrs.first().copied() else {
            return Err(CimdError::Fetch(format!("{host} has no address")));
        };
        if !self.allow_private
            && let Some(bad) = addrs.iter().map(SocketAddr::ip).find(|ip| is_private(*ip))
        {
            return Err(CimdError::PrivateAddress(bad));
        }
        // Pinned to the address just checked: a second lookup could answer differently.
        let http = reqwest::Client::builder()
            .redirect(reqwest::redirect::Policy::none())
            .timeout(TIMEOUT)
            .resolve(&bare, first)
            .build()
            .map_err(|e| CimdError::Fetch(e.to_string()))?;
        let mut response = http
            .get(url.clone())
            .header("accept", "application/json")
            .send()
            .await
            .map_err(|e| CimdError::Fetch(e.to_string()))?;
        if !response.status().is_success() {
            return Err(CimdError::Fetch(format!("HTTP {}", response.status())));
        }
        let ttl = cache_ttl(response.headers().get("cache-control"));
        let mut body = Vec::new();
        while let Some(chunk) = response
            .chunk()
            .await
            .map_err(|e| CimdError::Fetch(e.to_string()))?
        {
            body.extend_from_slice(&chunk);
            if body.len() > MAX_BYTES {
                return Err(CimdError::Invalid(format!("larger than {MAX_BYTES} bytes")));
            }
        }
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
    fn private_ranges_are_refused() {
        for ip in [
            "10.1.2.3",
            "172.16.0.1",
            "192.168.1.1",
            "127.0.0.1",
            "169.254.169.254",
            "0.0.0.0",
            "100.64.0.1",
            "::1",
            "fc00::1",
            "fe80::1",
            "::ffff:10.0.0.1",
            "224.0.0.1",
        ] {
            assert!(is_private(ip.parse().unwrap()), "{ip}");
        }
        for ip in ["93.184.216.34", "1.1.1.1", "2606:4700:4700::1111"] {
            assert!(!is_private(ip.parse().unwrap()), "{ip}");
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
