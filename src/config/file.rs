//! The config file: TOML in the gateway's own shape, or JSON in the shape MCP clients use
//! (`mcpServers` for Claude Desktop and Cursor, `servers` for VS Code). Unknown keys are
//! refused by name, so a typo never silently drops a setting.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use serde::Deserialize;

use super::{ConfigError, PluginConfig, PluginSpec};

/// What a config file may say; every field is optional so flags and defaults fill the rest.
#[derive(Debug, Default)]
pub struct FileConfig {
    pub listen: Option<SocketAddr>,
    pub allowed_origins: Option<Vec<String>>,
    pub allowed_hosts: Option<Vec<String>>,
    pub max_body_bytes: Option<usize>,
    pub max_header_bytes: Option<usize>,
    pub header_read_timeout_secs: Option<u64>,
    pub body_read_timeout_secs: Option<u64>,
    pub connection_idle_timeout_secs: Option<u64>,
    pub max_connections: Option<usize>,
    pub trusted_proxies: Option<Vec<String>>,
    pub separator: Option<String>,
    pub session: SessionSection,
    pub stream: StreamSection,
    pub database_url: Option<String>,
    pub redis_url: Option<String>,
    pub redis_key_prefix: Option<String>,
    pub cluster_secret: Option<String>,
    pub advertise_url: Option<String>,
    pub admin: AdminSection,
    pub auth: AuthSection,
    pub limits: super::limits::LimitsSection,
    pub audit: super::audit::AuditSection,
    pub credentials: super::credentials::CredentialsSection,
    pub max_children: Option<usize>,
    pub shutdown_grace_secs: Option<u64>,
    pub sandbox: super::sandbox::SandboxSection,
    pub plugins: Vec<PluginConfig>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SessionSection {
    pub idle_timeout_secs: Option<u64>,
    pub unused_timeout_secs: Option<u64>,
    pub max_sessions: Option<usize>,
    pub max_per_client: Option<usize>,
    pub input_timeout_secs: Option<u64>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StreamSection {
    pub keep_alive_secs: Option<u64>,
    pub resumable: Option<bool>,
    pub retry_ms: Option<u64>,
    pub poll_after_ms: Option<u64>,
    pub linger_ms: Option<u64>,
    pub hold_ms: Option<u64>,
    pub replay_max_events: Option<usize>,
    pub replay_max_bytes: Option<usize>,
    pub replay_session_max_events: Option<usize>,
    pub replay_session_max_bytes: Option<usize>,
    pub replay_max_age_secs: Option<u64>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct TomlFile {
    listen: Option<String>,
    allowed_origins: Option<Vec<String>>,
    allowed_hosts: Option<Vec<String>>,
    max_body_bytes: Option<usize>,
    max_header_bytes: Option<usize>,
    header_read_timeout_secs: Option<u64>,
    body_read_timeout_secs: Option<u64>,
    connection_idle_timeout_secs: Option<u64>,
    max_connections: Option<usize>,
    trusted_proxies: Option<Vec<String>>,
    separator: Option<String>,
    #[serde(default)]
    session: SessionSection,
    #[serde(default)]
    stream: StreamSection,
    database_url: Option<String>,
    redis_url: Option<String>,
    redis_key_prefix: Option<String>,
    cluster_secret: Option<String>,
    advertise_url: Option<String>,
    max_children: Option<usize>,
    shutdown_grace_secs: Option<u64>,
    #[serde(default)]
    admin: AdminSection,
    #[serde(default)]
    auth: AuthSection,
    #[serde(default)]
    limits: super::limits::LimitsSection,
    #[serde(default)]
    audit: super::audit::AuditSection,
    #[serde(default)]
    credentials: super::credentials::CredentialsSection,
    #[serde(default)]
    sandbox: super::sandbox::SandboxSection,
    #[serde(default)]
    plugins: BTreeMap<String, PluginSpec>,
}

/// `[auth]`: OAuth 2.1 for `/mcp`.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AuthSection {
    pub mode: Option<super::AuthMode>,
    pub public_url: Option<String>,
    pub scopes: Option<Vec<String>>,
    pub allow_unauthenticated: Option<bool>,
    pub access_token_ttl_secs: Option<u64>,
    pub refresh_token_ttl_secs: Option<u64>,
    pub code_ttl_secs: Option<u64>,
    pub cimd_allow_private: Option<bool>,
    pub registrations_per_minute: Option<u32>,
    pub cimd_fetches_per_minute: Option<u32>,
    pub cimd_fetches_per_minute_total: Option<u32>,
    pub failed_signins_per_user: Option<u32>,
    pub failed_signins_per_address: Option<u32>,
    pub signin_lockout_secs: Option<u64>,
    // `auth.mode = "external"` (config::external).
    pub issuer: Option<String>,
    pub audiences: Option<Vec<String>>,
    pub groups_claim: Option<String>,
    pub jwks_refresh_min_secs: Option<u64>,
    pub introspection_endpoint: Option<String>,
    pub introspection_client_id: Option<String>,
    pub introspection_client_secret_file: Option<std::path::PathBuf>,
    pub introspection_client_secret_env: Option<String>,
    pub introspection_cache_secs: Option<u64>,
    #[serde(default)]
    pub users: Vec<super::UserConfig>,
    #[serde(default)]
    pub clients: Vec<super::ClientConfig>,
    /// `[auth.upstream]`: sign-in at an OpenID provider.
    pub upstream: Option<super::upstream::UpstreamSection>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AdminSection {
    pub listen: Option<SocketAddr>,
    pub token: Option<String>,
    pub allowed_hosts: Option<Vec<String>>,
}

/// The JSON shape MCP clients write. Top-level keys other than the server maps belong to the
/// client's own settings and are left alone.
#[derive(Deserialize)]
struct JsonFile {
    #[serde(rename = "mcpServers")]
    mcp_servers: Option<BTreeMap<String, JsonServer>>,
    servers: Option<BTreeMap<String, JsonServer>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct JsonServer {
    command: Option<String>,
    #[serde(default)]
    args: Vec<String>,
    #[serde(default)]
    env: BTreeMap<String, String>,
    cwd: Option<PathBuf>,
    #[serde(rename = "type")]
    kind: Option<String>,
    #[serde(default)]
    disabled: bool,
    /// A remote server (`"type": "http"` or `"sse"`).
    url: Option<String>,
    #[serde(default)]
    headers: BTreeMap<String, String>,
}

impl FileConfig {
    /// Reads a file; JSON when its first non-blank character is `{`, TOML otherwise.
    pub fn read(path: &Path) -> Result<FileConfig, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            path: path.to_owned(),
            source,
        })?;
        FileConfig::parse(&text).map_err(|message| ConfigError::Parse {
            path: path.to_owned(),
            message,
        })
    }

    pub fn parse(text: &str) -> Result<FileConfig, String> {
        if text.trim_start().starts_with('{') {
            parse_json(text)
        } else {
            parse_toml(text)
        }
    }
}

fn parse_toml(text: &str) -> Result<FileConfig, String> {
    let file: TomlFile = toml::from_str(text).map_err(|e| e.to_string())?;
    let listen = file
        .listen
        .map(|l| {
            l.parse()
                .map_err(|_| format!("`listen`: `{l}` is not an address like 127.0.0.1:8080"))
        })
        .transpose()?;
    let plugins = file
        .plugins
        .into_iter()
        .filter(|(_, p)| p.enabled)
        .map(|(name, p)| file_plugin(p.into_config(name)))
        .collect();
    Ok(FileConfig {
        listen,
        allowed_origins: file.allowed_origins,
        allowed_hosts: file.allowed_hosts,
        max_body_bytes: file.max_body_bytes,
        max_header_bytes: file.max_header_bytes,
        header_read_timeout_secs: file.header_read_timeout_secs,
        body_read_timeout_secs: file.body_read_timeout_secs,
        connection_idle_timeout_secs: file.connection_idle_timeout_secs,
        max_connections: file.max_connections,
        trusted_proxies: file.trusted_proxies,
        separator: file.separator,
        session: file.session,
        stream: file.stream,
        database_url: file.database_url,
        redis_url: file.redis_url,
        redis_key_prefix: file.redis_key_prefix,
        cluster_secret: file.cluster_secret,
        advertise_url: file.advertise_url,
        admin: file.admin,
        auth: file.auth,
        limits: file.limits,
        audit: file.audit,
        credentials: file.credentials,
        max_children: file.max_children,
        shutdown_grace_secs: file.shutdown_grace_secs,
        sandbox: file.sandbox,
        plugins,
    })
}

/// A plugin the config file defines: a remote one's addresses are the operator's choice, not
/// checked as an admin API client's are.
fn file_plugin(mut c: PluginConfig) -> PluginConfig {
    if let Some(r) = c.remote.as_mut() {
        std::sync::Arc::make_mut(r).check_addresses = false;
    }
    c
}

fn parse_json(text: &str) -> Result<FileConfig, String> {
    let file: JsonFile = serde_json::from_str(text).map_err(|e| e.to_string())?;
    let (key, servers) = match (file.mcp_servers, file.servers) {
        (Some(s), None) => ("mcpServers", s),
        (None, Some(s)) => ("servers", s),
        (Some(_), Some(_)) => return Err("give either `mcpServers` or `servers`, not both".into()),
        (None, None) => {
            return Err(
                "a JSON config needs `mcpServers` (Claude Desktop, Cursor) or `servers` (VS Code)"
                    .into(),
            );
        }
    };
    let mut plugins = Vec::new();
    for (name, s) in servers {
        if s.disabled {
            continue;
        }
        if let Some(url) = s.url {
            let transport = match s.kind.as_deref() {
                None | Some("http" | "streamable-http" | "streamableHttp") => {
                    super::RemoteTransportKind::Auto
                }
                Some("sse") => super::RemoteTransportKind::Sse,
                Some(kind) => {
                    return Err(format!(
                        "`{key}.{name}.type`: `{kind}` is not a remote server's type (http or sse)"
                    ));
                }
            };
            let remote = super::RemoteSpec {
                url: Some(url),
                transport,
                headers: s.headers,
                ..super::RemoteSpec::default()
            };
            let remote = remote.into_config().expect("a url was given");
            plugins.push(file_plugin(PluginConfig::remote(name, remote)));
            continue;
        }
        if let Some(kind) = s.kind.as_deref().filter(|k| *k != "stdio") {
            return Err(format!(
                "`{key}.{name}.type`: `{kind}` servers need a `url`; a stdio server has a `command`"
            ));
        }
        let command = s
            .command
            .ok_or_else(|| format!("`{key}.{name}.command` is missing"))?;
        let mut c = PluginConfig::new(name, command, s.args);
        c.env = s.env;
        c.cwd = s.cwd;
        plugins.push(c);
    }
    Ok(FileConfig {
        plugins,
        ..FileConfig::default()
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::ResponseMode;

    #[test]
    fn toml_with_plugins_and_settings() {
        let f = FileConfig::parse(
            r#"
            listen = "127.0.0.1:9000"
            allowed_origins = ["https://app.example.com"]
            [session]
            idle_timeout_secs = 60
            [plugins.time]
            command = "uvx"
            args = ["mcp-server-time"]
            env = { TZ = "UTC" }
            response_mode = "json"
            [plugins.off]
            command = "x"
            enabled = false
            "#,
        )
        .unwrap();
        assert_eq!(f.listen.unwrap().port(), 9000);
        assert_eq!(f.session.idle_timeout_secs, Some(60));
        assert_eq!(f.plugins.len(), 1);
        assert_eq!(f.plugins[0].name, "time");
        assert_eq!(f.plugins[0].env["TZ"], "UTC");
        assert_eq!(f.plugins[0].response_mode, ResponseMode::Json);
    }

    #[test]
    fn toml_unknown_key_is_named() {
        let e = FileConfig::parse("[plugins.a]\ncommand = \"x\"\ncomand = \"y\"\n").unwrap_err();
        assert!(e.contains("comand"), "{e}");
        let e = FileConfig::parse("lisen = \"x\"\n").unwrap_err();
        assert!(e.contains("lisen"), "{e}");
    }

    #[test]
    fn claude_desktop_json() {
        let f = FileConfig::parse(
            r#"{"globalShortcut": "x", "mcpServers": {"fs": {"command": "npx", "args": ["-y", "srv"], "env": {"A": "1"}}}}"#,
        )
        .unwrap();
        assert_eq!(f.plugins.len(), 1);
        assert_eq!(f.plugins[0].command, "npx");
    }

    #[test]
    fn vscode_json_and_bad_entries() {
        let f =
            FileConfig::parse(r#"{"servers": {"a": {"type": "stdio", "command": "x"}}}"#).unwrap();
        assert_eq!(f.plugins[0].name, "a");
        // Remote servers, as VS Code and Claude write them.
        let f = FileConfig::parse(
            r#"{"servers": {"a": {"type": "http", "url": "https://h/mcp", "headers": {"X-Key": "${K}"}}, "b": {"type": "sse", "url": "https://h/sse"}}}"#,
        )
        .unwrap();
        let a = f.plugins[0].remote.as_ref().unwrap();
        assert_eq!(
            (a.url.as_str(), a.headers["X-Key"].as_str()),
            ("https://h/mcp", "${K}")
        );
        assert!(
            !a.check_addresses,
            "a config file's upstream is the operator's own"
        );
        let b = f.plugins[1].remote.as_ref().unwrap();
        assert_eq!(b.transport, crate::config::RemoteTransportKind::Sse);
        let e = FileConfig::parse(r#"{"servers": {"a": {"type": "ws", "url": "x"}}}"#).unwrap_err();
        assert!(e.contains("servers.a.type"), "{e}");
        let e = FileConfig::parse(r#"{"servers": {"a": {"type": "http"}}}"#).unwrap_err();
        assert!(e.contains("servers.a.type"), "{e}");
        let e = FileConfig::parse(r#"{"mcpServers": {"a": {"args": []}}}"#).unwrap_err();
        assert!(e.contains("mcpServers.a.command"), "{e}");
        let e = FileConfig::parse(r#"{"other": 1}"#).unwrap_err();
        assert!(e.contains("mcpServers"), "{e}");
    }
}
