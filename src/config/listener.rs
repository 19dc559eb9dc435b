//! The public listener: where it binds, which `Host` and `Origin` headers it lets in, how
//! large a request may be, what each connection is allowed ([`ConnectionLimits`]), and
//! which proxies name the client. Plain data: `http` enforces it.

use std::net::SocketAddr;
use std::time::Duration;

use super::{Cli, ConfigError, FileConfig, invalid};

pub const DEFAULT_LISTEN: &str = "127.0.0.1:8080";
pub const DEFAULT_MAX_BODY_BYTES: usize = 4 * 1024 * 1024;
/// The smallest, and default, `max_header_bytes`: hyper's floor for an HTTP/1 buffer.
pub const MIN_HEADER_BYTES: usize = 8192;

/// An allow-list for the Host or Origin header.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AllowList {
    Any,
    /// Lower-cased entries: host names for `Host`, `scheme://host[:port]` for `Origin`.
    Only(Vec<String>),
    /// No list given: the default that depends on the bind address (see the flags' help).
    Default,
}

/// What a listener allows its connections (see `http::serve`).
#[derive(Debug, Clone)]
pub struct ConnectionLimits {
    /// See [`Cli::max_header_bytes`].
    pub max_header_bytes: usize,
    /// See [`Cli::header_read_timeout_secs`].
    pub header_timeout: Duration,
    /// See [`Cli::body_read_timeout_secs`].
    pub body_timeout: Duration,
    /// See [`Cli::connection_idle_timeout_secs`]; closed between this and twice this.
    pub idle_timeout: Duration,
    /// See [`Cli::max_connections`].
    pub max_connections: usize,
    /// A cap per client address, and room kept for addresses that hold no connection: the
    /// admin listener's (its probes must get through a flood). `None` on the public listener,
    /// where a proxy in front makes every client one address.
    pub per_address: Option<PerAddress>,
}

/// See [`ConnectionLimits::per_address`].
#[derive(Debug, Clone, Copy)]
pub struct PerAddress {
    /// Most connections one address (an IPv6 address's /64) holds at once.
    pub max: usize,
    /// The last this many of `max_connections` go only to an address that holds none.
    pub reserved: usize,
}

impl Default for ConnectionLimits {
    fn default() -> ConnectionLimits {
        ConnectionLimits {
            max_header_bytes: MIN_HEADER_BYTES,
            header_timeout: Duration::from_secs(30),
            body_timeout: Duration::from_secs(30),
            idle_timeout: Duration::from_secs(120),
            max_connections: 16_384,
            per_address: None,
        }
    }
}

/// The public listener's section of [`Config`](super::Config), merged and checked.
pub(super) struct PublicListener {
    pub listen: SocketAddr,
    pub allowed_origins: AllowList,
    pub allowed_hosts: AllowList,
    pub max_body_bytes: usize,
    pub connections: ConnectionLimits,
}

/// The listener's address, allow-lists and body limit over the flags, then its
/// [`ConnectionLimits`].
pub(super) fn public_listener(cli: &Cli, file: &FileConfig) -> Result<PublicListener, ConfigError> {
    let listen = cli
        .listen
        .or(file.listen)
        .unwrap_or_else(|| DEFAULT_LISTEN.parse().expect("valid default"));
    let allowed_origins = allow_list(
        "allowed_origins",
        cli.allowed_origins.clone().or(file.allowed_origins.clone()),
        validate_origin,
    )?;
    let allowed_hosts = allow_list(
        "allowed_hosts",
        cli.allowed_hosts.clone().or(file.allowed_hosts.clone()),
        |h| {
            if h.is_empty() || h.contains(['/', ' ']) {
                Err("a host name, without scheme or path".into())
            } else {
                Ok(())
            }
        },
    )?;
    if !listen.ip().is_loopback() && allowed_hosts == AllowList::Default {
        return Err(invalid(
            "allowed_hosts",
            format!(
                "listening on {listen}, beyond loopback, needs the host names clients use to reach the gateway (against DNS rebinding), e.g. --allowed-hosts mcp.example.com; `*` allows any"
            ),
        ));
    }
    let max_body_bytes = cli
        .max_body_bytes
        .or(file.max_body_bytes)
        .unwrap_or(DEFAULT_MAX_BODY_BYTES);
    if max_body_bytes < 1024 {
        return Err(invalid("max_body_bytes", "must be at least 1024"));
    }
    let connections = connection_limits(cli, file)?;
    Ok(PublicListener {
        listen,
        allowed_origins,
        allowed_hosts,
        max_body_bytes,
        connections,
    })
}

/// What each connection is allowed: head size, read timeouts, idle time, and how many.
fn connection_limits(cli: &Cli, file: &FileConfig) -> Result<ConnectionLimits, ConfigError> {
    let max_header_bytes = cli
        .max_header_bytes
        .or(file.max_header_bytes)
        .unwrap_or(MIN_HEADER_BYTES);
    if max_header_bytes < MIN_HEADER_BYTES {
        return Err(invalid(
            "max_header_bytes",
            format!("must be at least {MIN_HEADER_BYTES} (the HTTP library's floor)"),
        ));
    }
    let defaults = ConnectionLimits::default();
    let secs =
        |key: &str, flag: Option<u64>, file: Option<u64>, default: Duration| match flag.or(file) {
            Some(0) => Err(invalid(key, "must be at least 1")),
            Some(n) => Ok(Duration::from_secs(n)),
            None => Ok(default),
        };
    Ok(ConnectionLimits {
        max_header_bytes,
        header_timeout: secs(
            "header_read_timeout_secs",
            cli.header_read_timeout_secs,
            file.header_read_timeout_secs,
            defaults.header_timeout,
        )?,
        body_timeout: secs(
            "body_read_timeout_secs",
            cli.body_read_timeout_secs,
            file.body_read_timeout_secs,
            defaults.body_timeout,
        )?,
        idle_timeout: secs(
            "connection_idle_timeout_secs",
            cli.connection_idle_timeout_secs,
            file.connection_idle_timeout_secs,
            defaults.idle_timeout,
        )?,
        max_connections: match cli.max_connections.or(file.max_connections) {
            Some(0) => return Err(invalid("max_connections", "must be at least 1")),
            Some(n) => n,
            None => defaults.max_connections,
        },
        per_address: None,
    })
}

/// The proxies whose `X-Forwarded-For` is believed.
pub(super) fn trusted_proxies(
    cli: &Cli,
    file: &FileConfig,
) -> Result<Vec<ipnet::IpNet>, ConfigError> {
    cli.trusted_proxies
        .clone()
        .or(file.trusted_proxies.clone())
        .unwrap_or_default()
        .iter()
        .map(|p| {
            p.parse::<ipnet::IpNet>()
                .or_else(|_| p.parse::<std::net::IpAddr>().map(ipnet::IpNet::from))
                .map_err(|_| {
                    invalid(
                        "trusted_proxies",
                        format!("`{p}` is not an address or a network (a.b.c.d/n)"),
                    )
                })
        })
        .collect::<Result<Vec<_>, _>>()
}

pub(super) fn allow_list(
    key: &str,
    values: Option<Vec<String>>,
    check: impl Fn(&str) -> Result<(), String>,
) -> Result<AllowList, ConfigError> {
    let Some(values) = values else {
        return Ok(AllowList::Default);
    };
    let values: Vec<String> = values
        .into_iter()
        .map(|v| v.trim().to_ascii_lowercase())
        .filter(|v| !v.is_empty())
        .collect();
    if values.iter().any(|v| v == "*") {
        return Ok(AllowList::Any);
    }
    for v in &values {
        check(v).map_err(|m| invalid(key, format!("`{v}`: {m}")))?;
    }
    Ok(AllowList::Only(values))
}

fn validate_origin(origin: &str) -> Result<(), String> {
    let ok = origin.split_once("://").is_some_and(|(scheme, rest)| {
        !scheme.is_empty() && !rest.is_empty() && !rest.contains('/')
    });
    if ok {
        Ok(())
    } else {
        Err("an origin looks like scheme://host[:port]".into())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Config;
    use crate::config::tests::cli;

    #[test]
    fn beyond_loopback_needs_allowed_hosts() {
        let e = Config::load(&cli(&["--listen", "0.0.0.0:8080", "--", "x"])).unwrap_err();
        assert!(e.to_string().contains("allowed_hosts"), "{e}");
        let c = Config::load(&cli(&[
            "--listen",
            "0.0.0.0:8080",
            "--allowed-hosts",
            "mcp.example.com",
            "--allow-unauthenticated",
            "--",
            "x",
        ]))
        .unwrap();
        assert_eq!(
            c.allowed_hosts,
            AllowList::Only(vec!["mcp.example.com".into()])
        );
        assert!(
            Config::load(&cli(&[
                "--listen",
                "0.0.0.0:8080",
                "--allowed-hosts",
                "*",
                "--allow-unauthenticated",
                "--",
                "x"
            ]))
            .is_ok()
        );
    }
}
