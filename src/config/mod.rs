//! Configuration: command-line flags (each with an `MCP_GATEWAY_*` environment form), an
//! optional file (TOML, or the `mcpServers` JSON that Claude Desktop, Cursor and VS Code users
//! already have), merged into one validated [`Config`]. Flags override the file.
//!
//! Nothing here starts anything: a `Config` is plain data, so `mcp-gateway check` and tests can
//! build and inspect one.
//!
//! Where things are: `cli` parses the flags; `file` reads a config file into its shapes. Each
//! section of the model sits in its own file with the step that merges it over the flags:
//! `listener` (the public listener and its connections), `stream` (SSE streams and replay),
//! `plugin` (plugins, their wire form and the checks each passes), `auth` (`[auth]`), `upstream`
//! (`[auth.upstream]`, sign-in at an OpenID provider), `limits` (`[limits]`), `audit`
//! (`[audit]`), `credentials` (`[credentials]`, each person's own credentials). This file holds the [`Config`] model, the small session and admin sections, and
//! [`Config::merge`], which reads the sections one by one. This module imports no other
//! module of the crate: everything else reads it.
//!
//! `external` checks `[auth]`'s keys of `auth.mode = "external"` (an authorization server the
//! gateway does not run).

mod access;
mod address;
mod audit;
mod auth;
mod cli;
mod cluster;
mod credentials;
mod external;
mod file;
mod limits;
mod listener;
mod plugin;
mod remote;
mod sandbox;
mod secrets;
mod stream;
mod upstream;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

pub use access::{Access, ToolAccess, pattern_matches};
pub use address::{is_global, reachable};
pub use audit::AuditConfig;
pub use auth::{AuthConfig, AuthMode, ClientConfig, UserConfig};
pub use cli::{Cli, Command, LogFormat};
pub use cluster::{ClusterConfig, DEFAULT_KEY_PREFIX, MIN_SECRET_LEN, redact_url};
pub use credentials::{
    API_CLIENT_SECRET_PREFIX, CREDENTIALS_KEY_ENV, CredentialConfig, CredentialKeys,
    CredentialKind, CredentialKindName, CredentialSpec, CredentialsConfig, OAuthServer, Reference,
    Registration, check_api_spec, credential_config, credential_in_files_only, credentials_used,
    expand, references,
};
pub use external::{ExternalConfig, INTROSPECTION_SECRET_ENV, IntrospectionConfig};
pub use file::FileConfig;
pub use limits::{LimitRule, LimitsConfig, Matcher, Per};
pub use listener::{
    AllowList, ConnectionLimits, DEFAULT_LISTEN, DEFAULT_MAX_BODY_BYTES, MIN_HEADER_BYTES,
    PerAddress,
};
pub use plugin::{
    Connect, MAX_PREFIX_LEN, MAX_TOOL_NAME_LEN, PluginConfig, PluginEra, PluginSpec, ProcessModel,
    ResponseMode, SECRET_ENV_VARS, Scheduling, expand_env, tool_name_char, validate_plugin,
};
pub use remote::{DEFAULT_MAX_MESSAGE_BYTES, RemoteConfig, RemoteSpec, RemoteTransportKind};
pub use sandbox::{Network, SandboxConfig, SandboxSettings, SandboxSpec};
pub use secrets::{env_var, seal_environment, secret_env_var};
pub use stream::{ReplayLimits, StreamSettings};
pub use upstream::{SubjectClaim, UPSTREAM_SECRET_ENV, UpstreamConfig, is_loopback_url};

/// The gateway's settings, validated.
#[derive(Debug, Clone)]
pub struct Config {
    pub listen: SocketAddr,
    pub allowed_origins: AllowList,
    pub allowed_hosts: AllowList,
    pub max_body_bytes: usize,
    /// What the public listener allows each connection, and how many.
    pub connections: ConnectionLimits,
    /// Proxies whose `X-Forwarded-For` names the client.
    pub trusted_proxies: Vec<ipnet::IpNet>,
    pub session: SessionConfig,
    pub stream: StreamSettings,
    pub replay: ReplayLimits,
    pub separator: String,
    pub plugins: Vec<PluginConfig>,
    pub database_url: String,
    /// Cluster mode: the Redis the replicas share and how they reach each other; `None` on a
    /// replica of its own.
    pub cluster: Option<ClusterConfig>,
    pub admin: AdminConfig,
    pub auth: AuthConfig,
    /// Most plugin processes at once, all plugins together.
    pub max_children: Option<usize>,
    /// The config file, re-read on reload.
    pub config_path: Option<PathBuf>,
    /// How long a stop waits for requests in flight.
    pub shutdown_grace: Duration,
    /// `[limits]`: rate limits on calls, per caller.
    pub limits: LimitsConfig,
    /// `[audit]`: the audit log.
    pub audit: AuditConfig,
    /// `[credentials]`: each person's own credentials for the services behind the plugins.
    pub credentials: CredentialsConfig,
    /// `[sandbox]`, with the gateway's own files that plugins may never read.
    pub sandbox: std::sync::Arc<SandboxSettings>,
}

/// The admin API's listener.
#[derive(Clone)]
pub struct AdminConfig {
    pub listen: SocketAddr,
    /// `None`: the admin API is off.
    pub token: Option<String>,
    /// Host names let in besides IP addresses and `localhost`, lower-case.
    pub allowed_hosts: Vec<String>,
}

/// The shortest admin token accepted: a shorter one could be guessed.
pub const MIN_ADMIN_TOKEN_LEN: usize = 16;

impl std::fmt::Debug for AdminConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AdminConfig")
            .field("listen", &self.listen)
            .field("token", &self.token.as_ref().map(|_| "***"))
            .field("allowed_hosts", &self.allowed_hosts)
            .finish()
    }
}

#[derive(Debug, Clone)]
pub struct SessionConfig {
    pub idle_timeout: Duration,
    /// How long a session that made no request after `initialize` is kept.
    pub unused_timeout: Duration,
    pub max_sessions: usize,
    /// Most sessions of one client (a token subject, or an address).
    pub max_per_client: usize,
    /// How long a modern client's call waits, parked, for the client to come back with the
    /// input a plugin asked for (multi round-trip requests) before it is cancelled.
    pub input_timeout: Duration,
}

/// Why a configuration was refused.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("cannot read config file {path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("invalid config file {path}: {message}")]
    Parse { path: PathBuf, message: String },
    #[error("invalid setting `{key}`: {message}")]
    Invalid { key: String, message: String },
    #[error(
        "no plugins configured: give a stdio server command after `--`, or a config file with [plugins.NAME] or mcpServers"
    )]
    NoPlugins,
}

fn invalid(key: impl Into<String>, message: impl Into<String>) -> ConfigError {
    ConfigError::Invalid {
        key: key.into(),
        message: message.into(),
    }
}

pub const DEFAULT_ADMIN_LISTEN: &str = "127.0.0.1:9090";
pub const DEFAULT_DATABASE_URL: &str = "sqlite://mcp-gateway.db?mode=rwc";
/// The database of a gateway that keeps nothing across restarts (no admin API, no built-in
/// authorization server, no `database_url`): SQLite in memory, no file.
pub const MEMORY_DATABASE_URL: &str = "sqlite::memory:";
pub const DEFAULT_SEPARATOR: &str = "__";
pub const DEFAULT_SHUTDOWN_GRACE_SECS: u64 = 20;
/// See [`SessionConfig::input_timeout`].
pub const DEFAULT_INPUT_TIMEOUT_SECS: u64 = 60;

impl Config {
    /// Builds the config from parsed flags, reading the config file they name.
    pub fn load(cli: &Cli) -> Result<Config, ConfigError> {
        let file = match &cli.config {
            Some(path) => FileConfig::read(path)?,
            None => FileConfig::default(),
        };
        Config::merge(cli, file)
    }

    /// Merges flags over a file config and validates the result.
    pub fn merge(cli: &Cli, file: FileConfig) -> Result<Config, ConfigError> {
        // Section by section, in this order: the first bad setting is the one reported.
        let public = listener::public_listener(cli, &file)?;
        let session = session(cli, &file.session)?;
        let trusted_proxies = listener::trusted_proxies(cli, &file)?;
        let (stream, replay) = stream::stream_and_replay(cli, &file.stream)?;
        let separator = separator(cli, file.separator)?;
        let credentials =
            credentials::credentials_config(file.credentials, secrets::secret_env_var)?;
        let plugins = plugin::plugins(cli, file.plugins, &separator, &credentials.names())?;
        let admin = admin(cli, file.admin, public.listen)?;
        // Files secrets are read from: hidden from plugins like the config file.
        let secret_files: Vec<PathBuf> = [
            file.auth.introspection_client_secret_file.clone(),
            file.auth
                .upstream
                .as_ref()
                .and_then(|u| u.client_secret_file.clone()),
        ]
        .into_iter()
        .flatten()
        .chain(credentials.secret_files.iter().cloned())
        .collect();
        let auth = auth::auth_config(cli, file.auth, public.listen)?;
        if auth.mode == AuthMode::None
            && let Some(p) = plugins.iter().find(|p| p.restricts_callers())
        {
            return Err(invalid(
                format!("plugins.{}.allow_groups", p.name),
                "who may use a plugin or its tools is known only from tokens: set auth.mode",
            ));
        }
        if auth.mode == AuthMode::None
            && let Some((p, c)) = plugins
                .iter()
                .find_map(|p| Some((p, *credentials_used(p).first()?)))
        {
            return Err(invalid(
                format!("plugins.{}", p.name),
                format!(
                    "uses `{c}`, a person's own credential: whose is known only from tokens, so set auth.mode"
                ),
            ));
        }
        if auth.mode == AuthMode::None
            && let Some(p) = plugins
                .iter()
                .find(|p| p.process_model == ProcessModel::PerSubject)
        {
            return Err(invalid(
                format!("plugins.{}.process_model", p.name),
                "\"per_subject\" runs a process per person, and who the caller is is known only from tokens: set auth.mode",
            ));
        }
        let exchangeable = auth.mode == AuthMode::External
            || (auth.mode == AuthMode::Builtin && auth.upstream.is_some());
        if !exchangeable
            && let Some(c) = credentials
                .credentials
                .iter()
                .find(|c| matches!(c.kind, CredentialKind::TokenExchange { .. }))
        {
            return Err(invalid(
                format!("credentials.{}.kind", c.name),
                "`token_exchange` exchanges the caller's own access token (auth.mode = \"external\") or the one their sign-in at [auth.upstream] gave (auth.mode = \"builtin\"): neither is here",
            ));
        }
        let limits = limits::limits_config(file.limits)?;
        let audit = audit::audit_config(file.audit)?;
        let database_url = database_url(cli, file.database_url, &admin, &auth);
        let secret_files: Vec<&std::path::Path> =
            secret_files.iter().map(PathBuf::as_path).collect();
        let sandbox: std::sync::Arc<SandboxSettings> = sandbox::settings(
            file.sandbox,
            &database_url,
            cli.config.as_deref(),
            &secret_files,
        )?
        .into();
        let mut credentials = credentials;
        credentials.remote_networks = sandbox.remote_networks.clone();
        let cluster = cluster::cluster(
            cli,
            file.redis_url,
            file.redis_key_prefix,
            file.cluster_secret,
            file.advertise_url,
            public.listen,
        )?;
        Ok(Config {
            sandbox,
            cluster,
            auth,
            limits,
            audit,
            credentials,
            max_children: cli.max_children.or(file.max_children),
            shutdown_grace: Duration::from_secs(
                cli.shutdown_grace_secs
                    .or(file.shutdown_grace_secs)
                    .unwrap_or(DEFAULT_SHUTDOWN_GRACE_SECS),
            ),
            database_url,
            admin,
            config_path: cli.config.clone(),
            listen: public.listen,
            allowed_origins: public.allowed_origins,
            allowed_hosts: public.allowed_hosts,
            max_body_bytes: public.max_body_bytes,
            connections: public.connections,
            session,
            trusted_proxies,
            stream,
            replay,
            separator,
            plugins,
        })
    }

    /// A config for tests and embedding: the given plugins, defaults elsewhere, port 0.
    pub fn with_plugins(plugins: Vec<PluginConfig>) -> Config {
        Config {
            listen: "127.0.0.1:0".parse().expect("valid"),
            allowed_origins: AllowList::Default,
            allowed_hosts: AllowList::Default,
            max_body_bytes: DEFAULT_MAX_BODY_BYTES,
            connections: ConnectionLimits::default(),
            session: SessionConfig {
                idle_timeout: Duration::from_secs(1800),
                unused_timeout: Duration::from_secs(60),
                max_sessions: 10_000,
                max_per_client: 256,
                input_timeout: Duration::from_secs(DEFAULT_INPUT_TIMEOUT_SECS),
            },
            trusted_proxies: Vec::new(),
            stream: StreamSettings {
                keep_alive: Duration::from_secs(15),
                resumable: true,
                retry: Duration::from_secs(1),
                poll_after: None,
                linger: Duration::from_secs(5),
                hold: Duration::from_millis(5),
                max_lingering: ReplayLimits::default().max_events_per_session,
            },
            replay: ReplayLimits::default(),
            separator: DEFAULT_SEPARATOR.into(),
            plugins,
            database_url: "sqlite::memory:".into(),
            cluster: None,
            max_children: None,
            shutdown_grace: Duration::from_secs(DEFAULT_SHUTDOWN_GRACE_SECS),
            admin: AdminConfig {
                listen: "127.0.0.1:0".parse().expect("valid"),
                token: None,
                allowed_hosts: Vec::new(),
            },
            auth: AuthConfig::default(),
            config_path: None,
            limits: LimitsConfig::default(),
            audit: AuditConfig::default(),
            credentials: CredentialsConfig::default(),
            sandbox: Default::default(),
        }
    }

    /// Whether tool and prompt names carry a plugin prefix.
    pub fn prefix_of<'a>(&'a self, plugin: &'a PluginConfig) -> Option<&'a str> {
        match (&plugin.prefix, self.plugins.len()) {
            (Some(p), _) => Some(p),
            (None, 1) => None,
            (None, _) => Some(&plugin.name),
        }
    }
}

/// The `[session]` section over the flags.
fn session(cli: &Cli, file: &file::SessionSection) -> Result<SessionConfig, ConfigError> {
    let idle = cli
        .session_idle_timeout_secs
        .or(file.idle_timeout_secs)
        .unwrap_or(1800);
    if idle == 0 {
        return Err(invalid("session.idle_timeout_secs", "must be at least 1"));
    }
    let max_sessions = cli.max_sessions.or(file.max_sessions).unwrap_or(10_000);
    if max_sessions == 0 {
        return Err(invalid("session.max_sessions", "must be at least 1"));
    }
    let max_per_client = cli
        .max_sessions_per_client
        .or(file.max_per_client)
        .unwrap_or(256);
    if max_per_client == 0 {
        return Err(invalid("session.max_per_client", "must be at least 1"));
    }
    let unused = cli
        .session_unused_timeout_secs
        .or(file.unused_timeout_secs)
        .unwrap_or(60);
    if unused == 0 {
        return Err(invalid("session.unused_timeout_secs", "must be at least 1"));
    }
    let input = cli
        .session_input_timeout_secs
        .or(file.input_timeout_secs)
        .unwrap_or(DEFAULT_INPUT_TIMEOUT_SECS);
    if input == 0 {
        return Err(invalid("session.input_timeout_secs", "must be at least 1"));
    }
    Ok(SessionConfig {
        idle_timeout: Duration::from_secs(idle),
        unused_timeout: Duration::from_secs(unused),
        max_sessions,
        max_per_client,
        input_timeout: Duration::from_secs(input),
    })
}

/// The separator between a plugin's prefix and a tool or prompt name.
fn separator(cli: &Cli, file: Option<String>) -> Result<String, ConfigError> {
    let separator = cli
        .separator
        .clone()
        .or(file)
        .unwrap_or_else(|| DEFAULT_SEPARATOR.into());
    if separator.is_empty() || separator.contains(char::is_whitespace) {
        return Err(invalid("separator", "must be non-empty, without spaces"));
    }
    if !separator.chars().all(plugin::tool_name_char) {
        return Err(invalid(
            "separator",
            "is part of prefixed tool names, which may hold only ASCII letters, digits, '_', '-' and '.'",
        ));
    }
    Ok(separator)
}

/// The `[admin]` section over the flags: its own address, never the public one.
fn admin(
    cli: &Cli,
    file: file::AdminSection,
    listen: SocketAddr,
) -> Result<AdminConfig, ConfigError> {
    let admin = AdminConfig {
        listen: cli
            .admin_listen
            .or(file.listen)
            .unwrap_or_else(|| DEFAULT_ADMIN_LISTEN.parse().expect("valid default")),
        token: cli
            .admin_token
            .clone()
            .or(file.token)
            .filter(|t| !t.is_empty()),
        allowed_hosts: match listener::allow_list(
            "admin.allowed_hosts",
            cli.admin_allowed_hosts.clone().or(file.allowed_hosts),
            |h| {
                if h.contains(['/', ' ', ':']) {
                    Err("a host name, without scheme, port or path".into())
                } else {
                    Ok(())
                }
            },
        )? {
            AllowList::Only(names) => names,
            AllowList::Default => Vec::new(),
            AllowList::Any => {
                return Err(invalid(
                    "admin.allowed_hosts",
                    "`*` would let a rebinding page in: name the hosts",
                ));
            }
        },
    };
    if let Some(token) = &admin.token
        && token.chars().count() < MIN_ADMIN_TOKEN_LEN
    {
        return Err(invalid(
            "admin.token",
            format!(
                "is {} characters; at least {MIN_ADMIN_TOKEN_LEN} are needed, so that it cannot be guessed (e.g. `openssl rand -hex 32`)",
                token.chars().count()
            ),
        ));
    }
    if admin.listen == listen && listen.port() != 0 {
        return Err(invalid(
            "admin.listen",
            "the admin listener needs its own address, not the public one",
        ));
    }
    Ok(admin)
}

/// Where the registry and the authorization server keep their data.
fn database_url(cli: &Cli, file: Option<String>, admin: &AdminConfig, auth: &AuthConfig) -> String {
    cli.database_url.clone().or(file).unwrap_or_else(|| {
        // Only the admin API's changes and the built-in authorization server need to
        // outlive the process; without either, nothing is written to disk.
        if admin.token.is_some() || auth.mode == AuthMode::Builtin {
            DEFAULT_DATABASE_URL.into()
        } else {
            MEMORY_DATABASE_URL.into()
        }
    })
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;

    /// Flags as the binary would parse them.
    pub(super) fn cli(args: &[&str]) -> Cli {
        Cli::try_parse_from(std::iter::once("mcp-gateway").chain(args.iter().copied())).unwrap()
    }

    #[test]
    fn quick_mode() {
        let c = Config::load(&cli(&["--", "npx", "-y", "pkg"])).unwrap();
        assert_eq!(c.plugins.len(), 1);
        assert_eq!(c.plugins[0].command, "npx");
        assert_eq!(c.plugins[0].args, ["-y", "pkg"]);
        assert_eq!(c.listen.to_string(), DEFAULT_LISTEN);
        assert_eq!(c.prefix_of(&c.plugins[0]), None);
    }

    #[test]
    fn no_plugins_is_an_error() {
        assert!(matches!(
            Config::load(&cli(&[])),
            Err(ConfigError::NoPlugins)
        ));
    }

    #[test]
    fn flags_are_validated() {
        let e = Config::load(&cli(&["--allowed-origins", "evil.com", "--", "x"])).unwrap_err();
        assert!(e.to_string().contains("allowed_origins"), "{e}");
        let c = Config::load(&cli(&["--allowed-origins", "*", "--", "x"])).unwrap();
        assert_eq!(c.allowed_origins, AllowList::Any);
        let e = Config::load(&cli(&["--separator", "", "--", "x"])).unwrap_err();
        assert!(e.to_string().contains("separator"), "{e}");
        for (flag, key) in [
            ("--replay-max-events", "stream.replay_max_events"),
            ("--replay-max-bytes", "stream.replay_max_bytes"),
            (
                "--replay-session-max-events",
                "stream.replay_session_max_events",
            ),
            (
                "--replay-session-max-bytes",
                "stream.replay_session_max_bytes",
            ),
        ] {
            let e = Config::load(&cli(&[flag, "0", "--", "x"])).unwrap_err();
            assert!(e.to_string().contains(key), "{flag}: {e}");
            Config::load(&cli(&[flag, "1", "--", "x"])).unwrap();
        }
    }

    #[test]
    fn several_plugins_are_prefixed() {
        let mut c = Config::with_plugins(vec![
            PluginConfig::new("a", "x", vec![]),
            PluginConfig::new("b", "y", vec![]),
        ]);
        assert_eq!(c.prefix_of(&c.plugins[0]), Some("a"));
        c.plugins.truncate(1);
        c.plugins[0].prefix = Some("pre".into());
        assert_eq!(c.prefix_of(&c.plugins[0]), Some("pre"));
    }
}
