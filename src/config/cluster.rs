//! Cluster mode's settings: the Redis every replica shares, the prefix of its keys, the secret
//! replicas prove to each other when one forwards a request to another, and the address the
//! others reach this replica at. Without `redis_url` there is no cluster: one replica, its
//! state in memory.
//!
//! The secret and a password in the Redis URL never reach a log line or an error text.

use std::net::SocketAddr;

use super::cli::Cli;
use super::{ConfigError, invalid};

/// Keys of a cluster start with this unless told otherwise.
pub const DEFAULT_KEY_PREFIX: &str = "mcp-gateway:";
/// The shortest cluster secret accepted: a guessable one would let anyone who reaches a
/// replica's port speak as another replica.
pub const MIN_SECRET_LEN: usize = 16;
/// The longest key prefix: every key carries it.
const MAX_PREFIX_LEN: usize = 64;

/// Cluster mode's settings (present only with `redis_url`).
#[derive(Clone)]
pub struct ClusterConfig {
    /// `redis://[user:password@]host:port[/db]` or `rediss://…`.
    pub redis_url: String,
    /// What every key of this cluster starts with, so several clusters (or tests) share one
    /// Redis.
    pub key_prefix: String,
    /// What a replica sends with a forwarded request and checks on one it receives.
    pub secret: String,
    /// Where the other replicas reach this one: `http://host:port`, without a path. `None`:
    /// derived from the address the public listener is bound to ([`ClusterConfig::advertise`]).
    pub advertise_url: Option<String>,
}

impl ClusterConfig {
    /// Where the other replicas reach this one, given the public listener's bound address:
    /// the configured URL, or `http://<bound address>` (for a wildcard address, this
    /// machine's host name with the bound port).
    pub fn advertise(&self, bound: SocketAddr) -> Result<String, ConfigError> {
        match &self.advertise_url {
            Some(u) => Ok(u.clone()),
            None => default_advertise(bound),
        }
    }
}

impl std::fmt::Debug for ClusterConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClusterConfig")
            .field("redis_url", &redact_url(&self.redis_url))
            .field("key_prefix", &self.key_prefix)
            .field("secret", &"***")
            .field("advertise_url", &self.advertise_url)
            .finish()
    }
}

/// A Redis URL without its password, for logs and errors.
pub fn redact_url(url: &str) -> String {
    match url::Url::parse(url) {
        Ok(mut u) if u.password().is_some() => {
            let _ = u.set_password(Some("***"));
            u.to_string()
        }
        Ok(u) => u.to_string(),
        Err(_) => "(not a URL)".into(),
    }
}

/// The cluster section from flags over the file's top-level keys; `None` without a Redis URL.
pub(super) fn cluster(
    cli: &Cli,
    redis_url: Option<String>,
    key_prefix: Option<String>,
    secret: Option<String>,
    advertise_url: Option<String>,
    listen: SocketAddr,
) -> Result<Option<ClusterConfig>, ConfigError> {
    let Some(redis_url) = cli
        .redis_url
        .clone()
        .or(redis_url)
        .filter(|u| !u.is_empty())
    else {
        return Ok(None);
    };
    match url::Url::parse(&redis_url) {
        Ok(u) if matches!(u.scheme(), "redis" | "rediss") && u.host_str().is_some() => {}
        _ => {
            return Err(invalid(
                "redis_url",
                format!(
                    "`{}` is not a Redis URL: use redis://host:port or rediss://host:port",
                    redact_url(&redis_url)
                ),
            ));
        }
    }
    let key_prefix = cli
        .redis_key_prefix
        .clone()
        .or(key_prefix)
        .unwrap_or_else(|| DEFAULT_KEY_PREFIX.into());
    if key_prefix.is_empty()
        || key_prefix.len() > MAX_PREFIX_LEN
        || !key_prefix.bytes().all(|b| b.is_ascii_graphic())
    {
        return Err(invalid(
            "redis_key_prefix",
            format!("must be 1 to {MAX_PREFIX_LEN} visible ASCII characters, without spaces"),
        ));
    }
    let secret = cli.cluster_secret.clone().or(secret).unwrap_or_default();
    if secret.len() < MIN_SECRET_LEN || !secret.bytes().all(|b| b.is_ascii_graphic()) {
        return Err(invalid(
            "cluster_secret",
            format!(
                "cluster mode (redis_url) needs a secret of at least {MIN_SECRET_LEN} visible ASCII characters, the same on every replica (--cluster-secret or MCP_GATEWAY_CLUSTER_SECRET)"
            ),
        ));
    }
    let Some(advertise_url) = cli.advertise_url.clone().or(advertise_url) else {
        // Checked now for a wildcard address; the port is the bound one (`--listen :0`).
        default_advertise(listen)?;
        return Ok(Some(ClusterConfig {
            redis_url,
            key_prefix,
            secret,
            advertise_url: None,
        }));
    };
    let parsed = url::Url::parse(&advertise_url).map_err(|e| {
        invalid(
            "advertise_url",
            format!("`{advertise_url}` is not a URL: {e}"),
        )
    })?;
    if !matches!(parsed.scheme(), "http" | "https")
        || parsed.host_str().is_none()
        || parsed.path() != "/"
        || parsed.query().is_some()
        || !parsed.username().is_empty()
    {
        return Err(invalid(
            "advertise_url",
            format!("`{advertise_url}` must be http(s)://host:port, with no path"),
        ));
    }
    Ok(Some(ClusterConfig {
        redis_url,
        key_prefix,
        secret,
        advertise_url: Some(advertise_url.trim_end_matches('/').to_owned()),
    }))
}

/// `http://<listen address>`; for a wildcard address, this machine's host name (a container's
/// name in its network) with the port.
fn default_advertise(listen: SocketAddr) -> Result<String, ConfigError> {
    if !listen.ip().is_unspecified() {
        return Ok(format!("http://{listen}"));
    }
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .map(|h| h.trim().to_owned())
        .filter(|h| !h.is_empty() && h.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'.'))
        .ok_or_else(|| {
            invalid(
                "advertise_url",
                "listening on a wildcard address and this machine's host name is unknown: set advertise_url",
            )
        })?;
    Ok(format!("http://{host}:{}", listen.port()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_lose_their_password() {
        assert_eq!(
            redact_url("redis://user:hunter2@127.0.0.1:6379/0"),
            "redis://user:***@127.0.0.1:6379/0"
        );
        assert_eq!(
            redact_url("redis://127.0.0.1:6379"),
            "redis://127.0.0.1:6379"
        );
    }
}
