//! Remote plugins: an MCP server reached over HTTP (`url = "https://host/mcp"`) instead of a
//! process the gateway starts. [`RemoteSpec`] is what a `[plugins.NAME]` table, an admin API
//! body or a stored row says of it; [`RemoteConfig`] the checked form the backend's HTTP
//! transport is given. Headers may name the gateway's environment (`${API_KEY}`) and the
//! caller's own credential (`Bearer ${credential:linear}`), never a file of one.

use std::collections::BTreeMap;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::credentials::{Reference, references};
use super::{ConfigError, invalid};

/// How a remote plugin's messages travel.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RemoteTransportKind {
    /// Streamable HTTP, falling back to the 2024-11-05 HTTP+SSE transport when the upstream
    /// refuses a POST as that transport's servers do (the spec's backwards-compatibility rule).
    #[default]
    Auto,
    /// Streamable HTTP only.
    StreamableHttp,
    /// The deprecated 2024-11-05 HTTP+SSE transport only: a GET stream whose `endpoint` event
    /// names where messages are POSTed.
    Sse,
}

/// The remote part of a plugin's definition, as written.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct RemoteSpec {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub url: Option<String>,
    #[serde(default, skip_serializing_if = "is_auto")]
    pub transport: RemoteTransportKind,
    /// Sent with every request; values may refer to `${ENV}` and `${credential:NAME}`.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub headers: BTreeMap<String, String>,
    /// http to a host that is not loopback.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub allow_insecure: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub connect_timeout_secs: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub read_timeout_secs: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_message_bytes: Option<usize>,
}

fn is_auto(t: &RemoteTransportKind) -> bool {
    *t == RemoteTransportKind::Auto
}

/// The largest message or event taken from an upstream unless configured.
pub const DEFAULT_MAX_MESSAGE_BYTES: usize = 16 * 1024 * 1024;

/// The largest `max_message_bytes` allowed.
pub const MAX_MESSAGE_BYTES: usize = 256 * 1024 * 1024;

/// A remote plugin's upstream, checked.
#[derive(Debug, Clone, PartialEq)]
pub struct RemoteConfig {
    /// Checked by [`RemoteConfig::validate`] to be an http(s) URL.
    pub url: String,
    pub transport: RemoteTransportKind,
    pub headers: BTreeMap<String, String>,
    pub allow_insecure: bool,
    /// How long a connection may take to open.
    pub connect_timeout: Duration,
    /// How long the upstream may stay silent while the gateway waits for an answer's head or
    /// its next bytes.
    pub read_timeout: Duration,
    pub max_message_bytes: usize,
    /// Whether the upstream's addresses are checked at every connection: only global
    /// unicast, or a network `[sandbox] remote_networks` allows. Plugins defined through the
    /// admin API are checked; a config file's are the operator's own.
    pub check_addresses: bool,
}

impl RemoteSpec {
    pub fn is_remote(&self) -> bool {
        self.url.is_some()
    }

    /// The config form (checked by [`RemoteConfig::validate`]); `None` when no `url` is
    /// given.
    pub fn into_config(self) -> Option<RemoteConfig> {
        let url = self.url?;
        Some(RemoteConfig {
            url,
            transport: self.transport,
            headers: self.headers,
            allow_insecure: self.allow_insecure,
            connect_timeout: Duration::from_secs(self.connect_timeout_secs.unwrap_or(10)),
            read_timeout: Duration::from_secs(self.read_timeout_secs.unwrap_or(300)),
            max_message_bytes: self.max_message_bytes.unwrap_or(DEFAULT_MAX_MESSAGE_BYTES),
            check_addresses: true,
        })
    }

    pub fn from_config(c: Option<&RemoteConfig>) -> RemoteSpec {
        let Some(c) = c else {
            return RemoteSpec::default();
        };
        RemoteSpec {
            url: Some(c.url.clone()),
            transport: c.transport,
            headers: c.headers.clone(),
            allow_insecure: c.allow_insecure,
            connect_timeout_secs: Some(c.connect_timeout.as_secs()),
            read_timeout_secs: Some(c.read_timeout.as_secs()),
            max_message_bytes: Some(c.max_message_bytes),
        }
    }
}

/// Whether `host` is a loopback name or address.
pub fn is_loopback(host: &url::Host<&str>) -> bool {
    match host {
        url::Host::Domain(d) => d.eq_ignore_ascii_case("localhost"),
        url::Host::Ipv4(a) => a.is_loopback(),
        url::Host::Ipv6(a) => a.is_loopback(),
    }
}

impl RemoteConfig {
    /// The checks every remote definition passes: an http(s) URL without credentials or a
    /// fragment, https unless loopback or `allow_insecure`; header names that are tokens and
    /// values that refer to nothing but the environment and people's credentials.
    pub fn validate(&self, name: &str) -> Result<(), ConfigError> {
        let key = |k: &str| format!("plugins.{name}.{k}");
        let url = url::Url::parse(&self.url).map_err(|e| invalid(key("url"), e.to_string()))?;
        let Some(host) = url.host() else {
            return Err(invalid(key("url"), "needs a host"));
        };
        match url.scheme() {
            "https" => {}
            "http" if is_loopback(&host) || self.allow_insecure => {}
            "http" => {
                return Err(invalid(
                    key("url"),
                    "must be https (http only to a loopback address, or with allow_insecure = true)",
                ));
            }
            s => return Err(invalid(key("url"), format!("`{s}` is not http or https"))),
        }
        if !url.username().is_empty() || url.password().is_some() {
            return Err(invalid(
                key("url"),
                "must not carry credentials: give them in `headers`",
            ));
        }
        if url.fragment().is_some() {
            return Err(invalid(key("url"), "must not have a fragment"));
        }
        if !(1024..=MAX_MESSAGE_BYTES).contains(&self.max_message_bytes) {
            return Err(invalid(
                key("max_message_bytes"),
                format!("must be from 1024 to {MAX_MESSAGE_BYTES}"),
            ));
        }
        if self.connect_timeout.is_zero() || self.read_timeout.is_zero() {
            return Err(invalid(
                key("read_timeout_secs"),
                "timeouts must be at least 1 s",
            ));
        }
        for (header, value) in &self.headers {
            let k = key(&format!("headers.{header}"));
            if reqwest::header::HeaderName::from_bytes(header.as_bytes()).is_err() {
                return Err(invalid(k, "is not a valid header name"));
            }
            let lower = header.to_ascii_lowercase();
            if RESERVED_HEADERS.contains(&lower.as_str()) || lower.starts_with("mcp-") {
                return Err(invalid(
                    k,
                    "is set by the gateway itself (the transport's own headers)",
                ));
            }
            for r in references(value).map_err(|m| invalid(k.clone(), m))? {
                match r {
                    Reference::Env(n) if super::secrets::is_secret_env(n) => {
                        return Err(invalid(
                            k,
                            format!("refers to `${{{n}}}`, a secret of the gateway's own"),
                        ));
                    }
                    Reference::CredentialFile(n) => {
                        return Err(invalid(
                            k,
                            format!(
                                "`${{credential_file:{n}}}` is for processes; a header takes `${{credential:{n}}}`"
                            ),
                        ));
                    }
                    Reference::Env(_) | Reference::Credential(_) => {}
                }
            }
            if value.contains(['\r', '\n', '\0']) {
                return Err(invalid(k, "must be one line"));
            }
        }
        Ok(())
    }

    /// `scheme://host:port/path`, for logs and the admin API (the query may hold a key).
    pub fn display_url(&self) -> String {
        match url::Url::parse(&self.url) {
            Ok(mut u) => {
                u.set_query(None);
                u.to_string()
            }
            Err(_) => "(an invalid URL)".into(),
        }
    }
}

/// Headers a definition may not set: the transport's own, and those of the connection.
const RESERVED_HEADERS: &[&str] = &[
    "accept",
    "content-type",
    "content-length",
    "host",
    "connection",
    "transfer-encoding",
    "last-event-id",
    "upgrade",
    "te",
];

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(url: &str) -> RemoteSpec {
        RemoteSpec {
            url: Some(url.into()),
            ..RemoteSpec::default()
        }
    }

    trait Check {
        fn checked(self, name: &str) -> Result<Option<RemoteConfig>, ConfigError>;
    }

    impl Check for RemoteSpec {
        fn checked(self, name: &str) -> Result<Option<RemoteConfig>, ConfigError> {
            match RemoteSpec::into_config(self) {
                None => Ok(None),
                Some(c) => c.validate(name).map(|()| Some(c)),
            }
        }
    }

    #[test]
    fn https_or_loopback_http_only() {
        assert!(spec("https://mcp.example.com/mcp").checked("p").is_ok());
        assert!(spec("http://127.0.0.1:9/mcp").checked("p").is_ok());
        assert!(spec("http://localhost:9/mcp").checked("p").is_ok());
        assert!(spec("http://[::1]:9/mcp").checked("p").is_ok());
        let e = spec("http://mcp.example.com/mcp").checked("p").unwrap_err();
        assert!(e.to_string().contains("must be https"), "{e}");
        let mut insecure = spec("http://mcp.example.com/mcp");
        insecure.allow_insecure = true;
        assert!(insecure.checked("p").is_ok());
        for bad in [
            "ftp://h/x",
            "https://u:p@h/mcp",
            "https://h/mcp#f",
            "unix:/run/x",
        ] {
            assert!(spec(bad).checked("p").is_err(), "{bad}");
        }
        assert!(spec("x").is_remote());
        assert!(
            Check::checked(RemoteSpec::default(), "p")
                .unwrap()
                .is_none()
        );
    }

    #[test]
    fn headers_are_checked() {
        let with = |k: &str, v: &str| {
            let mut s = spec("https://h/mcp");
            s.headers.insert(k.into(), v.into());
            s.checked("p")
        };
        assert!(with("X-Api-Key", "${API_KEY}").is_ok());
        assert!(with("Authorization", "Bearer ${credential:linear}").is_ok());
        for (k, v) in [
            ("Mcp-Session-Id", "x"),
            ("Accept", "x"),
            ("X-Key", "${credential_file:linear}"),
            ("X-Key", "${MCP_GATEWAY_ADMIN_TOKEN}"),
            ("X-Key", "a\r\nb"),
            ("bad header", "x"),
            ("X-Key", "${unclosed"),
        ] {
            assert!(with(k, v).is_err(), "{k}: {v}");
        }
    }

    #[test]
    fn display_url_drops_the_query() {
        let c = spec("https://h/mcp?key=secret")
            .checked("p")
            .unwrap()
            .unwrap();
        assert_eq!(c.display_url(), "https://h/mcp");
    }
}
