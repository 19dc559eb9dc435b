//! Checks every request to `/mcp` passes before its body is looked at: Host (against DNS
//! rebinding), Origin, Accept and Content-Type; and who the client is, for per-client limits.

use std::net::{IpAddr, Ipv6Addr, SocketAddr};
use std::sync::Arc;

use axum::http::{HeaderMap, HeaderName, Uri, header};

use super::error::HttpError;
use crate::config::{AllowList, Config};

const LOOPBACK_NAMES: &[&str] = &["localhost", "127.0.0.1", "[::1]"];

/// The Host and Origin policy, fixed at start-up.
#[derive(Debug)]
pub struct Guard {
    hosts: Rule,
    origins: Rule,
    /// With no origin list on a non-loopback address: only same-origin requests.
    same_origin_default: bool,
}

#[derive(Debug)]
enum Rule {
    Any,
    /// Host names (for Host), or origins (for Origin), lower-case.
    Only(Vec<String>),
    /// Origins whose host is a loopback name, any scheme and port.
    LoopbackOrigins,
}

impl Guard {
    pub fn new(config: &Config) -> Guard {
        let loopback = config.listen.ip().is_loopback();
        let hosts = match &config.allowed_hosts {
            AllowList::Any => Rule::Any,
            AllowList::Only(v) => Rule::Only(v.clone()),
            AllowList::Default if loopback => {
                Rule::Only(LOOPBACK_NAMES.iter().map(|s| s.to_string()).collect())
            }
            AllowList::Default => Rule::Any,
        };
        let (origins, same_origin_default) = match &config.allowed_origins {
            AllowList::Any => (Rule::Any, false),
            AllowList::Only(v) => (Rule::Only(v.clone()), false),
            AllowList::Default if loopback => (Rule::LoopbackOrigins, false),
            AllowList::Default => (Rule::Only(Vec::new()), true),
        };
        if !loopback && matches!(hosts, Rule::Any) {
            tracing::warn!(
                "listening on {} with no allowed_hosts: set allowed_hosts to the names clients use, against DNS rebinding",
                config.listen
            );
        }
        Guard {
            hosts,
            origins,
            same_origin_default,
        }
    }

    /// Host must be allowed; a present Origin must be allowed (403 otherwise).
    pub fn check(&self, headers: &HeaderMap, uri: &Uri) -> Result<(), HttpError> {
        let authority = headers
            .get(header::HOST)
            .and_then(|h| h.to_str().ok())
            .map(str::to_owned)
            .or_else(|| uri.authority().map(|a| a.as_str().to_owned()))
            .unwrap_or_default()
            .to_ascii_lowercase();
        if let Rule::Only(names) = &self.hosts {
            let host = host_of(&authority);
            if !names.iter().any(|n| n == host) {
                return Err(HttpError::ForbiddenHost(authority));
            }
        }
        let Some(origin) = headers.get(header::ORIGIN) else {
            return Ok(());
        };
        let origin = origin
            .to_str()
            .map_err(|_| HttpError::ForbiddenOrigin("(not text)".into()))?
            .trim()
            .to_ascii_lowercase();
        let origin_authority = origin.split_once("://").map(|(_, a)| a);
        let allowed = match &self.origins {
            Rule::Any => true,
            Rule::Only(list) => {
                list.contains(&origin)
                    || (self.same_origin_default && origin_authority == Some(authority.as_str()))
            }
            Rule::LoopbackOrigins => {
                origin_authority.is_some_and(|a| LOOPBACK_NAMES.contains(&host_of(a)))
            }
        };
        if allowed {
            Ok(())
        } else {
            Err(HttpError::ForbiddenOrigin(origin))
        }
    }
}

/// The host part of `host[:port]` (an IPv6 literal keeps its brackets). Anything else, such
/// as text after an IPv6 literal that is not a port, is left whole, so it matches no name.
pub fn host_of(authority: &str) -> &str {
    match authority.rsplit_once(':') {
        Some((host, port))
            if port.bytes().all(|b| b.is_ascii_digit())
                && (!authority.starts_with('[') || host.ends_with(']')) =>
        {
            host
        }
        _ => authority,
    }
}

/// Whether the Accept headers admit `wanted` (`type/subtype`), counting wildcards. Bytes, not
/// text: this runs twice on every POST.
fn accepts(headers: &HeaderMap, wanted: &str) -> bool {
    let (kind, _) = wanted.split_once('/').expect("a media type");
    let (wanted, kind) = (wanted.as_bytes(), kind.as_bytes());
    headers
        .get_all(header::ACCEPT)
        .iter()
        .flat_map(|v| v.as_bytes().split(|b| *b == b','))
        .map(|item| {
            item.split(|b| *b == b';')
                .next()
                .unwrap_or_default()
                .trim_ascii()
        })
        .any(|range| {
            range.eq_ignore_ascii_case(wanted)
                || range == b"*/*"
                || range
                    .strip_suffix(b"/*")
                    .is_some_and(|k| k.eq_ignore_ascii_case(kind))
        })
}

/// A POST must accept both JSON and SSE answers.
pub fn accepts_post(headers: &HeaderMap) -> Result<(), HttpError> {
    if accepts(headers, "application/json") && accepts(headers, "text/event-stream") {
        Ok(())
    } else {
        Err(HttpError::NotAcceptable(
            "the client must accept both application/json and text/event-stream",
        ))
    }
}

/// A GET opens an SSE stream, so it must accept one.
pub fn accepts_sse(headers: &HeaderMap) -> Result<(), HttpError> {
    if accepts(headers, "text/event-stream") {
        Ok(())
    } else {
        Err(HttpError::NotAcceptable(
            "the client must accept text/event-stream",
        ))
    }
}

/// The body must be declared JSON.
pub fn json_content(headers: &HeaderMap) -> Result<(), HttpError> {
    let is_json = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.split(';').next())
        .is_some_and(|m| m.trim().eq_ignore_ascii_case("application/json"));
    if is_json {
        Ok(())
    } else {
        Err(HttpError::UnsupportedMediaType)
    }
}

const FORWARDED_FOR: HeaderName = HeaderName::from_static("x-forwarded-for");

/// The client's address: the peer, unless the peer is a trusted proxy, in which case the last
/// address in `X-Forwarded-For` that is not a trusted proxy (what a proxy appends can be
/// believed; what the client wrote before it cannot). A header that cannot be read leaves the
/// peer.
pub fn client_ip(peer: IpAddr, headers: &HeaderMap, trusted: &[ipnet::IpNet]) -> IpAddr {
    let is_trusted = |ip: &IpAddr| trusted.iter().any(|n| n.contains(ip));
    if !is_trusted(&peer) {
        return peer;
    }
    let mut client = peer;
    for value in headers.get_all(&FORWARDED_FOR).iter().rev() {
        let Ok(text) = value.to_str() else {
            return client;
        };
        for hop in text.rsplit(',') {
            let Ok(ip) = hop.trim().parse::<IpAddr>() else {
                return client;
            };
            client = ip;
            if !is_trusted(&ip) {
                return client;
            }
        }
    }
    client
}

/// Whether a proxy carried the request: its peer is a trusted proxy, or it names a hop
/// (`Forwarded`, `X-Forwarded-For`, `Via`; a client that writes one of them only loses its own
/// proof of reading). A proxy reads a response before its client does, and its kept-alive
/// connection to the gateway carries many clients' requests, so a next request on it proves
/// nothing about what any client read.
pub fn via_proxy(peer: IpAddr, headers: &HeaderMap, trusted: &[ipnet::IpNet]) -> bool {
    // An IPv4 peer of a dual-stack listener comes as `::ffff:a.b.c.d`.
    let peer = peer.to_canonical();
    headers.contains_key(&FORWARDED_FOR)
        || headers.contains_key(header::FORWARDED)
        || headers.contains_key(header::VIA)
        || trusted.iter().any(|n| n.contains(&peer))
}

/// Whose a new session is, for the per-client cap: the token's subject, else the client's
/// address; an IPv6 address by its /64, which one host may hold whole.
pub fn client_key(
    subject: Option<&str>,
    peer: Option<SocketAddr>,
    headers: &HeaderMap,
    trusted: &[ipnet::IpNet],
) -> Arc<str> {
    if let Some(subject) = subject {
        return Arc::from(format!("subject {subject}"));
    }
    let Some(peer) = peer else {
        return Arc::from("address unknown");
    };
    match address_key(client_ip(peer.ip().to_canonical(), headers, trusted)) {
        IpAddr::V4(ip) => Arc::from(format!("address {ip}")),
        IpAddr::V6(net) => Arc::from(format!("address {net}/64")),
    }
}

/// What counts as one client's address: an IPv4 address, or an IPv6 one's /64 (one host
/// commonly holds a whole /64, so counting its addresses one by one would count nothing).
pub fn address_key(ip: IpAddr) -> IpAddr {
    match ip.to_canonical() {
        IpAddr::V4(ip) => IpAddr::V4(ip),
        IpAddr::V6(ip) => {
            let s = ip.segments();
            IpAddr::V6(Ipv6Addr::new(s[0], s[1], s[2], s[3], 0, 0, 0, 0))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::PluginConfig;

    fn headers(pairs: &[(&str, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.append(
                axum::http::HeaderName::from_bytes(k.as_bytes()).unwrap(),
                v.parse().unwrap(),
            );
        }
        h
    }

    fn guard(listen: &str) -> Guard {
        let mut c = Config::with_plugins(vec![PluginConfig::new("a", "x", vec![])]);
        c.listen = listen.parse().unwrap();
        if !c.listen.ip().is_loopback() {
            c.allowed_hosts = AllowList::Only(vec!["mcp.example.com".into()]);
        }
        Guard::new(&c)
    }

    #[test]
    fn loopback_defaults() {
        let g = guard("127.0.0.1:8080");
        let uri = Uri::from_static("/mcp");
        assert!(
            g.check(&headers(&[("host", "127.0.0.1:8080")]), &uri)
                .is_ok()
        );
        assert!(g.check(&headers(&[("host", "localhost:1")]), &uri).is_ok());
        assert!(g.check(&headers(&[("host", "[::1]:8080")]), &uri).is_ok());
        assert!(
            g.check(&headers(&[("host", "evil.example.com")]), &uri)
                .is_err()
        );
        assert!(
            g.check(
                &headers(&[
                    ("host", "localhost:8080"),
                    ("origin", "http://localhost:6274")
                ]),
                &uri
            )
            .is_ok()
        );
        let e = g
            .check(
                &headers(&[
                    ("host", "localhost:8080"),
                    ("origin", "http://evil.example.com"),
                ]),
                &uri,
            )
            .unwrap_err();
        assert!(matches!(e, HttpError::ForbiddenOrigin(_)));
    }

    /// Found by the http_headers fuzz target: an authority that starts like `[::1]` passed
    /// as the loopback host whatever followed it.
    #[test]
    fn an_ipv6_host_is_followed_by_a_port_or_nothing() {
        let g = guard("127.0.0.1:8080");
        let uri = Uri::from_static("/mcp");
        for host in ["[::1]:h8080", "[::1]evil.example.com", "[::1]:80:80"] {
            assert!(
                g.check(&headers(&[("host", host)]), &uri).is_err(),
                "{host}"
            );
        }
        assert!(g.check(&headers(&[("host", "[::1]:")]), &uri).is_ok());
        let origin = |o: &str| g.check(&headers(&[("host", "[::1]:8080"), ("origin", o)]), &uri);
        assert!(origin("http://[::1]:6274").is_ok());
        assert!(origin("http://[::1]evil.example.com").is_err());
    }

    #[test]
    fn public_defaults_are_same_origin() {
        let g = guard("0.0.0.0:8080");
        let uri = Uri::from_static("/mcp");
        assert!(
            g.check(&headers(&[("host", "mcp.example.com")]), &uri)
                .is_ok()
        );
        assert!(
            g.check(
                &headers(&[
                    ("host", "mcp.example.com"),
                    ("origin", "https://mcp.example.com")
                ]),
                &uri
            )
            .is_ok()
        );
        assert!(
            g.check(
                &headers(&[("host", "mcp.example.com"), ("origin", "https://evil.com")]),
                &uri
            )
            .is_err()
        );
    }

    #[test]
    fn accept_and_content_type() {
        assert!(
            accepts_post(&headers(&[(
                "accept",
                "application/json, text/event-stream"
            )]))
            .is_ok()
        );
        assert!(accepts_post(&headers(&[("accept", "*/*")])).is_ok());
        assert!(accepts_post(&headers(&[("accept", "application/json")])).is_err());
        assert!(accepts_post(&headers(&[])).is_err());
        assert!(accepts_sse(&headers(&[("accept", "text/event-stream;q=1")])).is_ok());
        assert!(accepts_sse(&headers(&[("accept", "application/json")])).is_err());
        // Type wildcards, any case, spread over several Accept headers.
        assert!(
            accepts_post(&headers(&[
                ("accept", "Application/*; q=0.9"),
                ("accept", "TEXT/Event-Stream")
            ]))
            .is_ok()
        );
        assert!(accepts_sse(&headers(&[("accept", "text/*")])).is_ok());
        assert!(accepts_sse(&headers(&[("accept", "text/plain, */event-stream")])).is_err());
        assert!(accepts_sse(&headers(&[("accept", "textual/*")])).is_err());
        assert!(
            json_content(&headers(&[(
                "content-type",
                "application/json; charset=utf-8"
            )]))
            .is_ok()
        );
        assert!(json_content(&headers(&[("content-type", "text/plain")])).is_err());
        assert!(json_content(&headers(&[])).is_err());
    }

    #[test]
    fn a_proxy_is_known_by_its_address_or_the_hop_it_names() {
        let trusted: Vec<ipnet::IpNet> = vec!["10.0.0.0/8".parse().unwrap()];
        let none = HeaderMap::new();
        let mapped: IpAddr = "::ffff:10.1.1.1".parse().unwrap();
        assert!(
            via_proxy(mapped, &none, &trusted),
            "an IPv4 proxy on a dual-stack listener"
        );
        assert!(via_proxy("10.1.1.1".parse().unwrap(), &none, &trusted));
        let client: IpAddr = "203.0.113.7".parse().unwrap();
        assert!(!via_proxy(client, &none, &trusted));
        for name in ["x-forwarded-for", "forwarded", "via"] {
            let mut h = HeaderMap::new();
            h.insert(name, "x".parse().unwrap());
            assert!(via_proxy(client, &h, &[]), "{name}");
        }
    }

    #[test]
    fn the_client_behind_trusted_proxies() {
        let trusted: Vec<ipnet::IpNet> = vec!["10.0.0.0/8".parse().unwrap()];
        let peer: IpAddr = "10.1.1.1".parse().unwrap();
        let mut h = HeaderMap::new();
        assert_eq!(client_ip(peer, &h, &trusted), peer, "no header: the proxy");
        h.append(FORWARDED_FOR, "6.6.6.6, 1.2.3.4, 10.2.2.2".parse().unwrap());
        assert_eq!(
            client_ip(peer, &h, &trusted),
            "1.2.3.4".parse::<IpAddr>().unwrap(),
            "the last untrusted hop; what the client wrote before it is not believed"
        );
        let outsider: IpAddr = "8.8.8.8".parse().unwrap();
        assert_eq!(
            client_ip(outsider, &h, &trusted),
            outsider,
            "an untrusted peer's header is ignored"
        );
        let mut bad = HeaderMap::new();
        bad.append(FORWARDED_FOR, "1.2.3.4, nonsense".parse().unwrap());
        assert_eq!(client_ip(peer, &bad, &trusted), peer);
        let a = client_key(
            None,
            Some("[2001:db8::1]:5".parse().unwrap()),
            &HeaderMap::new(),
            &[],
        );
        let b = client_key(
            None,
            Some("[2001:db8::ffff:2]:6".parse().unwrap()),
            &HeaderMap::new(),
            &[],
        );
        assert_eq!(a, b, "one IPv6 /64 is one client");
        let mapped = client_key(
            None,
            Some("[::ffff:1.2.3.4]:5".parse().unwrap()),
            &HeaderMap::new(),
            &[],
        );
        assert_eq!(&*mapped, "address 1.2.3.4");
        assert_eq!(
            &*client_key(Some("alice"), None, &HeaderMap::new(), &[]),
            "subject alice"
        );
    }
}
