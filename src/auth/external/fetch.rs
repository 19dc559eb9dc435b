//! HTTP toward the external authorization server, bounded: every request ends within
//! [`TIMEOUT`] (connecting, sending and reading the whole answer), follows no redirect, and
//! reads at most a given number of bytes of the answer. Also reads how long an answer may be
//! cached (`Cache-Control`). The one HTTP client is shared by discovery, the key set and the
//! introspection client.

use std::time::Duration;

use axum::http::HeaderMap;

/// The whole exchange, from connecting to the last byte of the answer.
pub const TIMEOUT: Duration = Duration::from_secs(10);
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// Why a request to the authorization server failed (for the log, and the refusal's text).
#[derive(Debug, thiserror::Error)]
pub enum FetchError {
    #[error("{url}: {cause}")]
    Transport { url: String, cause: String },
    #[error("{url}: HTTP {status}")]
    Status { url: String, status: u16 },
    #[error("{url}: the answer is larger than {limit} bytes")]
    TooLarge { url: String, limit: usize },
    #[error("{url}: the answer is not the JSON expected: {cause}")]
    Json { url: String, cause: String },
}

#[derive(Clone)]
pub struct Http {
    client: reqwest::Client,
    /// Set for a guarded client ([`Http::guarded`]): the networks it may reach besides
    /// global unicast addresses.
    guard: Option<std::sync::Arc<Vec<ipnet::IpNet>>>,
}

/// Resolves a host only to addresses a guarded client may reach: every address of it must be
/// global unicast or in the networks allowed (an address it may not reach refuses the host,
/// so that no second resolution can swap one in).
struct Guard(std::sync::Arc<Vec<ipnet::IpNet>>);

impl reqwest::dns::Resolve for Guard {
    fn resolve(&self, name: reqwest::dns::Name) -> reqwest::dns::Resolving {
        let networks = self.0.clone();
        let host = name.as_str().to_owned();
        Box::pin(async move {
            let addrs: Vec<std::net::SocketAddr> =
                tokio::net::lookup_host((host.as_str(), 0)).await?.collect();
            if let Some(bad) = addrs
                .iter()
                .find(|a| !crate::config::reachable(a.ip(), &networks))
            {
                return Err(format!(
                    "{host} resolves to {}, which is neither a global address nor in [sandbox] remote_networks",
                    bad.ip()
                )
                .into());
            }
            Ok(Box::new(addrs.into_iter()) as reqwest::dns::Addrs)
        })
    }
}

impl Default for Http {
    fn default() -> Self {
        Http::new()
    }
}

impl Http {
    pub fn new() -> Http {
        Http::build(None)
    }

    /// A client that reaches only global unicast addresses and `networks` (for URLs that
    /// came through the admin API, and those their servers name).
    pub fn guarded(networks: Vec<ipnet::IpNet>) -> Http {
        Http::build(Some(std::sync::Arc::new(networks)))
    }

    fn build(guard: Option<std::sync::Arc<Vec<ipnet::IpNet>>>) -> Http {
        let mut builder = reqwest::Client::builder()
            .redirect(reqwest::redirect::Policy::none())
            .timeout(TIMEOUT)
            .connect_timeout(CONNECT_TIMEOUT)
            .user_agent(concat!("mcp-gateway/", env!("CARGO_PKG_VERSION")));
        if let Some(networks) = &guard {
            builder = builder.dns_resolver(std::sync::Arc::new(Guard(networks.clone())));
        }
        let client = builder.build().expect("an HTTP client with rustls");
        Http { client, guard }
    }

    /// A URL a guarded client may not reach: one whose host is an address (never resolved)
    /// outside what it allows.
    fn refused(&self, url: &str) -> Option<FetchError> {
        let networks = self.guard.as_ref()?;
        let host = url::Url::parse(url).ok()?.host()?.to_owned();
        let ip = match host {
            url::Host::Ipv4(ip) => std::net::IpAddr::V4(ip),
            url::Host::Ipv6(ip) => std::net::IpAddr::V6(ip),
            url::Host::Domain(_) => return None,
        };
        (!crate::config::reachable(ip, networks)).then(|| FetchError::Transport {
            url: url.to_owned(),
            cause: format!("{ip} is neither a global address nor in [sandbox] remote_networks"),
        })
    }

    /// GETs a JSON document of at most `limit` bytes; the document and its cache lifetime.
    pub async fn get_json<T: serde::de::DeserializeOwned>(
        &self,
        url: &url::Url,
        limit: usize,
    ) -> Result<(T, CacheLifetime), FetchError> {
        let transport = |e: reqwest::Error| FetchError::Transport {
            url: url.to_string(),
            cause: e.without_url().to_string(),
        };
        if let Some(e) = self.refused(url.as_str()) {
            return Err(e);
        }
        let response = self
            .client
            .get(url.clone())
            .header("accept", "application/json")
            .send()
            .await
            .map_err(transport)?;
        if !response.status().is_success() {
            return Err(FetchError::Status {
                url: url.to_string(),
                status: response.status().as_u16(),
            });
        }
        let lifetime = CacheLifetime::of(response.headers());
        let body = read_limited(response, limit, url.as_str()).await?;
        let doc = serde_json::from_slice(&body).map_err(|e| FetchError::Json {
            url: url.to_string(),
            cause: e.to_string(),
        })?;
        Ok((doc, lifetime))
    }

    /// Sends a request the `oauth2` crate prepared (introspection), reading at most `limit`
    /// bytes of the answer.
    pub async fn send(
        &self,
        request: oauth2::HttpRequest,
        limit: usize,
    ) -> Result<oauth2::HttpResponse, FetchError> {
        let url = request.uri().to_string();
        let transport = |e: reqwest::Error| FetchError::Transport {
            url: url.clone(),
            cause: e.without_url().to_string(),
        };
        if let Some(e) = self.refused(&url) {
            return Err(e);
        }
        let request = reqwest::Request::try_from(request).map_err(transport)?;
        let response = self.client.execute(request).await.map_err(transport)?;
        let mut answer = oauth2::http::Response::builder().status(response.status());
        if let Some(headers) = answer.headers_mut() {
            headers.extend(
                response
                    .headers()
                    .iter()
                    .map(|(k, v)| (k.clone(), v.clone())),
            );
        }
        let body = read_limited(response, limit, &url).await?;
        answer.body(body).map_err(|e| FetchError::Transport {
            url: url.clone(),
            cause: e.to_string(),
        })
    }
}

/// [`Http`] as the `oauth2` crate's client, reading at most `limit` bytes of each answer.
pub struct Limited {
    pub http: Http,
    pub limit: usize,
}

impl<'c> oauth2::AsyncHttpClient<'c> for Limited {
    type Error = FetchError;
    type Future = futures_util::future::BoxFuture<'c, Result<oauth2::HttpResponse, FetchError>>;

    fn call(&'c self, request: oauth2::HttpRequest) -> Self::Future {
        Box::pin(self.http.send(request, self.limit))
    }
}

/// The body, refused once it passes `limit` bytes (announced or read).
async fn read_limited(
    mut response: reqwest::Response,
    limit: usize,
    url: &str,
) -> Result<Vec<u8>, FetchError> {
    let too_large = || FetchError::TooLarge {
        url: url.to_owned(),
        limit,
    };
    if response.content_length().is_some_and(|n| n > limit as u64) {
        return Err(too_large());
    }
    let mut body = Vec::new();
    while let Some(chunk) = response.chunk().await.map_err(|e| FetchError::Transport {
        url: url.to_owned(),
        cause: e.without_url().to_string(),
    })? {
        if body.len() + chunk.len() > limit {
            return Err(too_large());
        }
        body.extend_from_slice(&chunk);
    }
    Ok(body)
}

/// What an answer's `Cache-Control` says about keeping it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CacheLifetime {
    /// Nothing said.
    Unspecified,
    /// `no-store` or `no-cache`: fetch again each time (within the caller's bounds).
    None,
    /// `max-age`.
    MaxAge(Duration),
}

impl CacheLifetime {
    fn of(headers: &HeaderMap) -> CacheLifetime {
        let Some(v) = headers
            .get(axum::http::header::CACHE_CONTROL)
            .and_then(|h| h.to_str().ok())
        else {
            return CacheLifetime::Unspecified;
        };
        let mut lifetime = CacheLifetime::Unspecified;
        for d in v.split(',').map(str::trim) {
            if d.eq_ignore_ascii_case("no-store") || d.eq_ignore_ascii_case("no-cache") {
                return CacheLifetime::None;
            }
            if let Some((k, n)) = d.split_once('=')
                && k.trim().eq_ignore_ascii_case("max-age")
                && let Ok(n) = n.trim().trim_matches('"').parse::<u64>()
            {
                lifetime = CacheLifetime::MaxAge(Duration::from_secs(n));
            }
        }
        lifetime
    }

    /// The lifetime within `[floor, ceiling]`, `default` when nothing was said.
    pub fn bounded(self, default: Duration, floor: Duration, ceiling: Duration) -> Duration {
        match self {
            CacheLifetime::Unspecified => default,
            CacheLifetime::None => Duration::ZERO,
            CacheLifetime::MaxAge(d) => d,
        }
        .clamp(floor, ceiling)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cache_lifetimes_are_read_and_bounded() {
        let of = |v: &str| {
            let mut h = HeaderMap::new();
            h.insert(axum::http::header::CACHE_CONTROL, v.parse().unwrap());
            CacheLifetime::of(&h)
        };
        assert_eq!(
            CacheLifetime::of(&HeaderMap::new()),
            CacheLifetime::Unspecified
        );
        assert_eq!(
            of("public, max-age=600"),
            CacheLifetime::MaxAge(Duration::from_secs(600))
        );
        assert_eq!(
            of("Max-Age = 7"),
            CacheLifetime::MaxAge(Duration::from_secs(7))
        );
        assert_eq!(of("max-age=600, no-cache"), CacheLifetime::None);
        assert_eq!(of("private"), CacheLifetime::Unspecified);
        let s = Duration::from_secs;
        let b = |l: CacheLifetime| l.bounded(s(3600), s(60), s(86_400));
        assert_eq!(b(CacheLifetime::Unspecified), s(3600));
        assert_eq!(b(CacheLifetime::None), s(60));
        assert_eq!(b(CacheLifetime::MaxAge(s(5))), s(60));
        assert_eq!(b(CacheLifetime::MaxAge(s(600))), s(600));
        assert_eq!(b(CacheLifetime::MaxAge(s(10_000_000))), s(86_400));
    }
}
