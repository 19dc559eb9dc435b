//! The headers `/mcp` checks before it reads a body: `Accept`, `Content-Type`,
//! `MCP-Protocol-Version`, and `Host`/`Origin` (against DNS rebinding).
//!
//! The input is header lines, `name: value`, as a client sends them (lines hyper would refuse
//! are left out). Invariants: a POST that is accepted accepts SSE too; a version header is
//! accepted only when it names a supported version; on a loopback listener with the default
//! lists, only loopback host names and origins pass; on a public one with an allowed host,
//! only that host passes, and only same-origin requests.

#![no_main]

use std::sync::OnceLock;

use axum::http::{HeaderMap, HeaderName, HeaderValue, Uri, header};
use libfuzzer_sys::fuzz_target;
use mcp_gateway::config::{AllowList, Config, PluginConfig};
use mcp_gateway::http::checks::{self, Guard};
use mcp_gateway::protocol;

struct Guards {
    loopback: Guard,
    public: Guard,
}

fn guards() -> &'static Guards {
    static GUARDS: OnceLock<Guards> = OnceLock::new();
    GUARDS.get_or_init(|| {
        let config = |listen: &str, hosts: AllowList| {
            let mut c = Config::with_plugins(vec![PluginConfig::new("a", "x", vec![])]);
            c.listen = listen.parse().unwrap();
            c.allowed_hosts = hosts;
            c
        };
        Guards {
            loopback: Guard::new(&config("127.0.0.1:8080", AllowList::Default)),
            public: Guard::new(&config(
                "0.0.0.0:8080",
                AllowList::Only(vec!["mcp.example.com".into()]),
            )),
        }
    })
}

fuzz_target!(|data: &[u8]| {
    let mut headers = HeaderMap::new();
    for line in data.split(|b| *b == b'\n') {
        let Some(colon) = line.iter().position(|b| *b == b':') else {
            continue;
        };
        let (Ok(name), Ok(value)) = (
            HeaderName::from_bytes(&line[..colon]),
            HeaderValue::from_bytes(line[colon + 1..].trim_ascii()),
        ) else {
            continue;
        };
        headers.append(name, value);
    }

    let post = checks::accepts_post(&headers).is_ok();
    let sse = checks::accepts_sse(&headers).is_ok();
    assert!(!post || sse, "a POST that accepts both accepts SSE");
    let _ = checks::json_content(&headers);

    for v in headers.get_all("mcp-protocol-version") {
        let Ok(v) = v.to_str() else { continue };
        for negotiated in protocol::CLIENT_VERSIONS {
            if protocol::check_version_header(v, negotiated).is_ok() {
                assert!(protocol::CLIENT_VERSIONS.contains(&v), "{v:?}");
                assert!(v == *negotiated || v == protocol::DEFAULT_HTTP_VERSION);
            }
        }
    }

    let uri = Uri::from_static("/mcp");
    let g = guards();
    let host = headers
        .get(header::HOST)
        .and_then(|h| h.to_str().ok())
        .map(str::to_ascii_lowercase);
    let origin = headers.get(header::ORIGIN).map(|o| {
        o.to_str()
            .map(|o| o.trim().to_ascii_lowercase())
            .unwrap_or_default()
    });
    if g.loopback.check(&headers, &uri).is_ok() {
        let host = host.as_deref().unwrap_or_default();
        assert!(
            is_loopback(host),
            "loopback guard let Host {host:?} through"
        );
        if let Some(o) = &origin {
            let authority = o.split_once("://").map(|(_, a)| a).unwrap_or_default();
            assert!(
                is_loopback(authority),
                "loopback guard let Origin {o:?} through"
            );
        }
    }
    if g.public.check(&headers, &uri).is_ok() {
        let host = host.as_deref().unwrap_or_default();
        assert!(is_name_with_port(host, "mcp.example.com"), "{host:?}");
        if let Some(o) = &origin {
            assert_eq!(
                o.split_once("://").map(|(_, a)| a),
                Some(host),
                "same origin"
            );
        }
    }
});

/// `localhost`, `127.0.0.1` or `[::1]`, with or without a port.
fn is_loopback(authority: &str) -> bool {
    ["localhost", "127.0.0.1", "[::1]"]
        .iter()
        .any(|name| is_name_with_port(authority, name))
}

/// `authority` is `name`, or `name:` followed by digits. Written apart from the gateway's
/// own host parsing, so the oracle does not share its mistakes.
fn is_name_with_port(authority: &str, name: &str) -> bool {
    match authority.strip_prefix(name) {
        Some("") => true,
        Some(rest) => rest
            .strip_prefix(':')
            .is_some_and(|port| port.bytes().all(|b| b.is_ascii_digit())),
        None => false,
    }
}
