//! Configuration: command-line flags (each with an `MCP_GATEWAY_*` environment form), an
//! optional file (TOML, or the `mcpServers` JSON that Claude Desktop, Cursor and VS Code users
//! already have), merged into one validated [`Config`]. Flags override the file.
//!
//! Nothing here starts anything: a `Config` is plain data, so `mcp-gateway check` and tests can
//! build and inspect one.

mod file;
mod stream;

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use clap::{Parser, Subcommand, ValueEnum};
use serde::{Deserialize, Serialize};

pub use file::FileConfig;
pub use stream::{ReplayLimits, StreamSettings};

/// Serves stdio MCP servers ("plugins") over Streamable HTTP at one `/mcp` endpoint.
///
/// Quick mode: `mcp-gateway -- npx -y @modelcontextprotocol/server-everything`.
/// Config mode: `mcp-gateway --config gateway.toml`. Both combine.
#[derive(Debug, Parser)]
#[command(name = "mcp-gateway", version, about, long_about = None)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Option<Command>,

    /// Config file: TOML (`[plugins.NAME]` tables and gateway settings), or JSON with
    /// `mcpServers` (Claude Desktop, Cursor) or `servers` (VS Code).
    #[arg(long, env = "MCP_GATEWAY_CONFIG", global = true)]
    pub config: Option<PathBuf>,

    /// Address to listen on. Binding to anything but loopback is an explicit choice.
    /// [default: 127.0.0.1:8080]
    #[arg(long, env = "MCP_GATEWAY_LISTEN")]
    pub listen: Option<SocketAddr>,

    /// Origins allowed in the `Origin` header (comma-separated, `*` for any). A request with
    /// an Origin outside the list gets 403. [default: loopback origins when bound to
    /// loopback, else same-origin only]
    #[arg(long, env = "MCP_GATEWAY_ALLOWED_ORIGINS", value_delimiter = ',')]
    pub allowed_origins: Option<Vec<String>>,

    /// Host names allowed in the `Host` header, against DNS rebinding (comma-separated, `*`
    /// for any). [default: localhost, 127.0.0.1 and [::1]; required when binding beyond
    /// loopback]
    #[arg(long, env = "MCP_GATEWAY_ALLOWED_HOSTS", value_delimiter = ',')]
    pub allowed_hosts: Option<Vec<String>>,

    /// Largest accepted POST body in bytes; larger gets 413. [default: 4194304]
    #[arg(long, env = "MCP_GATEWAY_MAX_BODY_BYTES")]
    pub max_body_bytes: Option<usize>,

    /// Largest HTTP/1 request head (request line and headers) in bytes; larger gets 431. It is
    /// also the most an HTTP/1 connection buffers from its socket: at the 8 KiB floor, an
    /// idle connection holding a GET stream keeps one 8 KiB read buffer. [default: 8192]
    #[arg(long, env = "MCP_GATEWAY_MAX_HEADER_BYTES")]
    pub max_header_bytes: Option<usize>,

    /// Seconds an HTTP/1 request head may take to arrive; a keep-alive connection that sends
    /// no next request in that time is closed too. [default: 30]
    #[arg(long, env = "MCP_GATEWAY_HEADER_READ_TIMEOUT_SECS")]
    pub header_read_timeout_secs: Option<u64>,

    /// Seconds a request body may take to arrive after its head; a slower one gets 408.
    /// [default: 30]
    #[arg(long, env = "MCP_GATEWAY_BODY_READ_TIMEOUT_SECS")]
    pub body_read_timeout_secs: Option<u64>,

    /// Seconds a client connection may stay open with no request in flight (an open SSE
    /// stream is one) before it is closed. [default: 120]
    #[arg(long, env = "MCP_GATEWAY_CONNECTION_IDLE_TIMEOUT_SECS")]
    pub connection_idle_timeout_secs: Option<u64>,

    /// Most client connections open at once on the public listener; past it, new ones wait
    /// to be accepted. [default: 16384]
    #[arg(long, env = "MCP_GATEWAY_MAX_CONNECTIONS")]
    pub max_connections: Option<usize>,

    /// Seconds a session may stay idle (no request, no open stream) before it is ended.
    /// [default: 1800]
    #[arg(long, env = "MCP_GATEWAY_SESSION_IDLE_TIMEOUT_SECS")]
    pub session_idle_timeout_secs: Option<u64>,

    /// Most plugin processes at once, all plugins together; a request that would start one
    /// more gets an error saying so. [default: no limit]
    #[arg(long, env = "MCP_GATEWAY_MAX_CHILDREN")]
    pub max_children: Option<usize>,

    /// Seconds a stop (SIGTERM, Ctrl-C) waits for requests in flight before closing what is
    /// left; plugins are stopped after it. [default: 20]
    #[arg(long, env = "MCP_GATEWAY_SHUTDOWN_GRACE_SECS")]
    pub shutdown_grace_secs: Option<u64>,

    /// Most sessions at once; an `initialize` beyond it gets 503 with Retry-After.
    /// [default: 10000]
    #[arg(long, env = "MCP_GATEWAY_MAX_SESSIONS")]
    pub max_sessions: Option<usize>,

    /// Most sessions one client holds at once: one token subject, or without a token one
    /// address (an IPv6 /64); an `initialize` beyond it gets 429 with Retry-After.
    /// [default: 256]
    #[arg(long, env = "MCP_GATEWAY_MAX_SESSIONS_PER_CLIENT")]
    pub max_sessions_per_client: Option<usize>,

    /// Seconds a session that made no request after `initialize` is kept. [default: 60]
    #[arg(long, env = "MCP_GATEWAY_SESSION_UNUSED_TIMEOUT_SECS")]
    pub session_unused_timeout_secs: Option<u64>,

    /// Proxies in front of the gateway whose `X-Forwarded-For` is believed, as addresses or
    /// networks (comma-separated, e.g. 10.0.0.0/8); the client is the last address in it that
    /// is not one of them. [default: none: the client is the peer]
    #[arg(long, env = "MCP_GATEWAY_TRUSTED_PROXIES", value_delimiter = ',')]
    pub trusted_proxies: Option<Vec<String>>,

    /// Seconds between SSE keep-alive comments on idle streams. [default: 15]
    #[arg(long, env = "MCP_GATEWAY_SSE_KEEP_ALIVE_SECS")]
    pub sse_keep_alive_secs: Option<u64>,

    /// Whether SSE events carry ids and are kept for resumption with Last-Event-ID.
    /// [default: true]
    #[arg(long, env = "MCP_GATEWAY_SSE_RESUMABLE", value_parser = clap::builder::BoolishValueParser::new())]
    pub sse_resumable: Option<bool>,

    /// The `retry:` advice (milliseconds) sent to 2025-11-25 clients with the priming event and
    /// before the gateway closes a connection. [default: 1000]
    #[arg(long, env = "MCP_GATEWAY_SSE_RETRY_MS")]
    pub sse_retry_ms: Option<u64>,

    /// Polling mode: close SSE connections of 2025-11-25 clients after this many milliseconds;
    /// the stream goes on and the client resumes with Last-Event-ID. [default: off]
    #[arg(long, env = "MCP_GATEWAY_SSE_POLL_AFTER_MS")]
    pub sse_poll_after_ms: Option<u64>,

    /// Milliseconds a POST's SSE response waits for its answers before its headers go out: an
    /// answer that comes within it goes out with them in one write, as one body. 0 sends the
    /// headers at once. [default: 5]
    #[arg(long, env = "MCP_GATEWAY_SSE_HOLD_MS")]
    pub sse_hold_ms: Option<u64>,

    /// Milliseconds a finished stream stays resumable (its last events may not have reached
    /// the client yet), at most: the client's next request on the same HTTP/1.1 connection
    /// shows it read the stream, which is then released. [default: 5000]
    #[arg(long, env = "MCP_GATEWAY_SSE_LINGER_MS")]
    pub sse_linger_ms: Option<u64>,

    /// Most events kept for replay per stream. [default: 10000]
    #[arg(long, env = "MCP_GATEWAY_REPLAY_MAX_EVENTS")]
    pub replay_max_events: Option<usize>,

    /// Most bytes kept for replay per stream. [default: 4194304]
    #[arg(long, env = "MCP_GATEWAY_REPLAY_MAX_BYTES")]
    pub replay_max_bytes: Option<usize>,

    /// Most events kept for replay per session, all its streams together. [default: 50000]
    #[arg(long, env = "MCP_GATEWAY_REPLAY_SESSION_MAX_EVENTS")]
    pub replay_session_max_events: Option<usize>,

    /// Most bytes kept for replay per session, all its streams together. [default: 16777216]
    #[arg(long, env = "MCP_GATEWAY_REPLAY_SESSION_MAX_BYTES")]
    pub replay_session_max_bytes: Option<usize>,

    /// Seconds an event is kept for replay. [default: 600]
    #[arg(long, env = "MCP_GATEWAY_REPLAY_MAX_AGE_SECS")]
    pub replay_max_age_secs: Option<u64>,

    /// Separator between a plugin's prefix and a tool or prompt name when several plugins
    /// share the endpoint. [default: __]
    #[arg(long, env = "MCP_GATEWAY_SEPARATOR")]
    pub separator: Option<String>,

    /// Name of the plugin given after `--` (quick mode). [default: stdio]
    #[arg(long, env = "MCP_GATEWAY_PLUGIN_NAME")]
    pub plugin_name: Option<String>,

    /// How the quick-mode plugin's answers are sent: `sse` streams progress, logs and
    /// server-to-client requests before the result; `json` waits and sends one JSON body.
    /// [default: sse]
    #[arg(long, env = "MCP_GATEWAY_RESPONSE_MODE", value_enum)]
    pub response_mode: Option<ResponseMode>,

    /// Database for registry changes made through the admin API: a SQLite file, or
    /// PostgreSQL (`postgres://user:pass@host/db`). [default: sqlite://mcp-gateway.db?mode=rwc
    /// in the working directory when the admin API or the built-in authorization server is on;
    /// otherwise nothing is kept and no file is written]
    #[arg(long, env = "MCP_GATEWAY_DATABASE_URL")]
    pub database_url: Option<String>,

    /// Address of the admin listener: /healthz, /readyz, /metrics and the admin API; never
    /// the public port. [default: 127.0.0.1:9090]
    #[arg(long, env = "MCP_GATEWAY_ADMIN_LISTEN", global = true)]
    pub admin_listen: Option<SocketAddr>,

    /// Bearer token the admin API requires; without one the admin API is off (health,
    /// readiness and metrics are served on the admin address either way).
    #[arg(long, env = "MCP_GATEWAY_ADMIN_TOKEN", hide_env_values = true)]
    pub admin_token: Option<String>,

    /// Authorization of `/mcp`: `none`, or `builtin` (the gateway is the OAuth 2.1
    /// authorization server too). [default: none]
    #[arg(long, env = "MCP_GATEWAY_AUTH_MODE", value_enum)]
    pub auth_mode: Option<AuthMode>,

    /// The public URL of `/mcp` (e.g. https://mcp.example.com/mcp): the OAuth resource, and the
    /// issuer's origin. Required with `--auth-mode builtin`.
    #[arg(long, env = "MCP_GATEWAY_PUBLIC_URL")]
    pub public_url: Option<String>,

    /// Serve `/mcp` without authorization on an address beyond loopback.
    #[arg(long, env = "MCP_GATEWAY_ALLOW_UNAUTHENTICATED")]
    pub allow_unauthenticated: bool,

    /// Log format. [default: text]
    #[arg(long, env = "MCP_GATEWAY_LOG_FORMAT", value_enum, default_value_t = LogFormat::Text)]
    pub log_format: LogFormat,

    /// The stdio MCP server to run (quick mode), after `--`.
    #[arg(last = true, value_name = "COMMAND")]
    pub command_line: Vec<String>,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Validate the config (given with --config and flags) and exit: 0 when valid, 2 with a
    /// message naming the bad key when not.
    Check,
    /// Read a password on standard input and print its argon2 hash, for `[[auth.users]]`
    /// and `[[auth.clients]]`.
    HashPassword,
    /// Ask a running gateway's admin listener for `/healthz` (the address from
    /// --admin-listen, its environment variable, or the config file): exit 0 when healthy, 1
    /// when not. For container health checks, where no HTTP client is installed.
    Healthcheck,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum ResponseMode {
    /// An SSE stream: progress, logs and requests related to the call, then the result.
    Sse,
    /// One JSON body with the result; anything the plugin sends meanwhile goes to the GET
    /// stream.
    Json,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum LogFormat {
    Text,
    Json,
}

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
    pub admin: AdminConfig,
    pub auth: AuthConfig,
    /// Most plugin processes at once, all plugins together.
    pub max_children: Option<usize>,
    /// The config file, re-read on reload.
    pub config_path: Option<PathBuf>,
    /// How long a stop waits for requests in flight.
    pub shutdown_grace: Duration,
}

/// How `/mcp` is authorized.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, ValueEnum, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum AuthMode {
    /// No authorization (loopback quick start).
    #[default]
    None,
    /// The gateway is resource server and authorization server.
    Builtin,
}

/// A user who can sign in at the built-in authorization server.
#[derive(Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct UserConfig {
    pub name: String,
    /// An argon2 PHC string (`mcp-gateway hash-password` makes one).
    pub password_hash: String,
}

impl std::fmt::Debug for UserConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "UserConfig({})", self.name)
    }
}

/// A confidential client the operator provisions (`[[auth.clients]]`): the only kind that may
/// use the `client_credentials` grant. Self-registered clients (RFC 7591, metadata documents)
/// never can.
#[derive(Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ClientConfig {
    pub client_id: String,
    /// An argon2 PHC string of the client secret (`mcp-gateway hash-password` makes one).
    pub secret_hash: String,
    /// The scopes it may be given. [default: `auth.scopes`]
    pub scopes: Option<Vec<String>>,
    /// A name for logs.
    pub name: Option<String>,
}

impl std::fmt::Debug for ClientConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "ClientConfig({})", self.client_id)
    }
}

/// OAuth 2.1 settings (`[auth]`).
#[derive(Debug, Clone)]
pub struct AuthConfig {
    pub mode: AuthMode,
    /// The public URL of `/mcp`.
    pub public_url: Option<url::Url>,
    /// Scopes every request to `/mcp` needs.
    pub scopes: Vec<String>,
    pub users: Vec<UserConfig>,
    /// Clients provisioned by the operator (client credentials).
    pub clients: Vec<ClientConfig>,
    pub access_ttl: Duration,
    pub refresh_ttl: Duration,
    pub code_ttl: Duration,
    /// Let client ID metadata documents be fetched from private and loopback addresses (and
    /// over http on loopback): for development only.
    pub cimd_allow_private: bool,
    /// Dynamic client registrations accepted per minute from one client address (and 20
    /// times that from all together, a ceiling on what strangers can store).
    pub registrations_per_minute: u32,
    /// Client ID metadata documents fetched per minute for one client address, and for all
    /// together (cached documents do not count).
    pub cimd_fetches_per_minute: u32,
    pub cimd_fetches_per_minute_total: u32,
    /// Failed sign-ins a user name, and a client address, may have in `signin_lockout`
    /// before further sign-ins with it (even right ones) are refused until the window ends.
    pub failed_signins_per_user: u32,
    pub failed_signins_per_address: u32,
    pub signin_lockout: Duration,
}

impl Default for AuthConfig {
    fn default() -> Self {
        AuthConfig {
            mode: AuthMode::None,
            public_url: None,
            scopes: vec!["mcp".into()],
            users: Vec::new(),
            clients: Vec::new(),
            access_ttl: Duration::from_secs(600),
            refresh_ttl: Duration::from_secs(30 * 24 * 3600),
            code_ttl: Duration::from_secs(60),
            cimd_allow_private: false,
            registrations_per_minute: 30,
            cimd_fetches_per_minute: 20,
            cimd_fetches_per_minute_total: 200,
            failed_signins_per_user: 10,
            failed_signins_per_address: 30,
            signin_lockout: Duration::from_secs(900),
        }
    }
}

/// The admin API's listener.
#[derive(Clone)]
pub struct AdminConfig {
    pub listen: SocketAddr,
    /// `None`: the admin API is off.
    pub token: Option<String>,
}

impl std::fmt::Debug for AdminConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AdminConfig")
            .field("listen", &self.listen)
            .field("token", &self.token.as_ref().map(|_| "***"))
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
}

/// An allow-list for the Host or Origin header.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AllowList {
    Any,
    /// Lower-cased entries: host names for `Host`, `scheme://host[:port]` for `Origin`.
    Only(Vec<String>),
    /// No list given: the default that depends on the bind address (see the flags' help).
    Default,
}

/// One stdio MCP server behind the gateway.
#[derive(Debug, Clone, PartialEq)]
pub struct PluginConfig {
    pub name: String,
    pub command: String,
    pub args: Vec<String>,
    pub env: BTreeMap<String, String>,
    pub cwd: Option<PathBuf>,
    /// Prefix of its tool and prompt names; `None` means the plugin's name, and no prefix at
    /// all when it is the only plugin.
    pub prefix: Option<String>,
    pub response_mode: ResponseMode,
    /// How long starting and initializing the child may take.
    pub startup_timeout: Duration,
    /// How long the child gets to exit after its stdin closes, and again after SIGTERM.
    pub shutdown_grace: Duration,
    /// How long a client's request may take; then it gets an error and the plugin is sent
    /// `notifications/cancelled`.
    pub request_timeout: Duration,
    /// Tools shown and callable: only these, when given.
    pub tools_allow: Option<Vec<String>>,
    /// Tools hidden and refused.
    pub tools_deny: Vec<String>,
    /// Most processes of this plugin at once (all sessions).
    pub max_children: Option<usize>,
    /// A session's instance unused this long is stopped (started again on next use).
    pub idle_timeout: Option<Duration>,
    /// How the plugin's processes serve sessions.
    pub process_model: ProcessModel,
    /// `shared`: how many processes share the load.
    pub pool_size: usize,
    /// `per_session`: instances kept started and initialized ahead of demand.
    pub warm: usize,
    /// A scope a token needs to see and call this plugin's tools (with `auth.mode`).
    pub scope: Option<String>,
    /// The kernel scheduling policy of the plugin's processes.
    pub scheduling: Scheduling,
}

/// How the kernel schedules a plugin's processes (Linux; elsewhere it has no effect).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Scheduling {
    /// `SCHED_BATCH`: the same share of the CPU, but a plugin woken by a request does not
    /// preempt the thread that woke it. The gateway's threads finish what they are doing
    /// (answering clients, writing to other plugins) before the plugin runs, instead of
    /// switching to it at every message.
    #[default]
    Batch,
    /// The kernel's default policy (`SCHED_OTHER`).
    Normal,
}

/// How a plugin's processes serve sessions.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ProcessModel {
    /// One process per session, started on the session's first use (isolation).
    #[default]
    PerSession,
    /// One process (or a pool) for all sessions: for servers safe to share.
    Shared,
}

impl PluginConfig {
    /// A plugin with the defaults, for quick mode and tests.
    pub fn new(name: impl Into<String>, command: impl Into<String>, args: Vec<String>) -> Self {
        PluginConfig {
            name: name.into(),
            command: command.into(),
            args,
            env: BTreeMap::new(),
            cwd: None,
            prefix: None,
            response_mode: ResponseMode::Sse,
            startup_timeout: Duration::from_secs(60),
            shutdown_grace: Duration::from_secs(2),
            request_timeout: Duration::from_secs(300),
            tools_allow: None,
            tools_deny: Vec::new(),
            max_children: None,
            idle_timeout: None,
            process_model: ProcessModel::PerSession,
            pool_size: 1,
            warm: 0,
            scope: None,
            scheduling: Scheduling::Batch,
        }
    }

    /// Whether the tool filters let `tool` through.
    pub fn allows_tool(&self, tool: &str) -> bool {
        self.tools_allow
            .as_ref()
            .is_none_or(|a| a.iter().any(|t| t == tool))
            && !self.tools_deny.iter().any(|t| t == tool)
    }

    /// Whether any tool filter is set.
    pub fn filters_tools(&self) -> bool {
        self.tools_allow.is_some() || !self.tools_deny.is_empty()
    }

    /// The command line as one string, for logs.
    pub fn command_line(&self) -> String {
        std::iter::once(self.command.as_str())
            .chain(self.args.iter().map(String::as_str))
            .collect::<Vec<_>>()
            .join(" ")
    }
}

/// A plugin's definition as written in TOML (`[plugins.NAME]`), sent to the admin API, and
/// stored: everything but the name.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PluginSpec {
    pub command: String,
    #[serde(default)]
    pub args: Vec<String>,
    /// Values may reference the gateway's environment (`${GITHUB_TOKEN}`).
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cwd: Option<PathBuf>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prefix: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub response_mode: Option<ResponseMode>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub startup_timeout_secs: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shutdown_grace_secs: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub request_timeout_secs: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tools_allow: Option<Vec<String>>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tools_deny: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_children: Option<usize>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub idle_timeout_secs: Option<u64>,
    #[serde(default)]
    pub process_model: ProcessModel,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pool_size: Option<usize>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub warm: Option<usize>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scope: Option<String>,
    #[serde(default)]
    pub scheduling: Scheduling,
    /// Only meaningful in a config file (the API has enable/disable).
    #[serde(default = "yes", skip_serializing)]
    pub enabled: bool,
}

fn yes() -> bool {
    true
}

impl PluginSpec {
    pub fn into_config(self, name: String) -> PluginConfig {
        let mut c = PluginConfig::new(name, self.command, self.args);
        c.env = self.env;
        c.cwd = self.cwd;
        c.prefix = self.prefix;
        if let Some(m) = self.response_mode {
            c.response_mode = m;
        }
        if let Some(s) = self.startup_timeout_secs {
            c.startup_timeout = Duration::from_secs(s);
        }
        if let Some(s) = self.shutdown_grace_secs {
            c.shutdown_grace = Duration::from_secs(s);
        }
        if let Some(s) = self.request_timeout_secs {
            c.request_timeout = Duration::from_secs(s);
        }
        c.tools_allow = self.tools_allow;
        c.tools_deny = self.tools_deny;
        c.max_children = self.max_children;
        c.idle_timeout = self.idle_timeout_secs.map(Duration::from_secs);
        c.process_model = self.process_model;
        c.pool_size = self.pool_size.unwrap_or(1);
        c.warm = self.warm.unwrap_or(0);
        c.scope = self.scope;
        c.scheduling = self.scheduling;
        c
    }

    pub fn from_config(c: &PluginConfig) -> PluginSpec {
        PluginSpec {
            command: c.command.clone(),
            args: c.args.clone(),
            env: c.env.clone(),
            cwd: c.cwd.clone(),
            prefix: c.prefix.clone(),
            response_mode: Some(c.response_mode),
            startup_timeout_secs: Some(c.startup_timeout.as_secs()),
            shutdown_grace_secs: Some(c.shutdown_grace.as_secs()),
            request_timeout_secs: Some(c.request_timeout.as_secs()),
            tools_allow: c.tools_allow.clone(),
            tools_deny: c.tools_deny.clone(),
            max_children: c.max_children,
            idle_timeout_secs: c.idle_timeout.map(|d| d.as_secs()),
            process_model: c.process_model,
            pool_size: Some(c.pool_size),
            warm: Some(c.warm),
            scope: c.scope.clone(),
            scheduling: c.scheduling,
            enabled: true,
        }
    }
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

pub const DEFAULT_LISTEN: &str = "127.0.0.1:8080";
pub const DEFAULT_ADMIN_LISTEN: &str = "127.0.0.1:9090";
pub const DEFAULT_DATABASE_URL: &str = "sqlite://mcp-gateway.db?mode=rwc";
/// The database of a gateway that keeps nothing across restarts (no admin API, no built-in
/// authorization server, no `database_url`): SQLite in memory, no file.
pub const MEMORY_DATABASE_URL: &str = "sqlite::memory:";
pub const DEFAULT_MAX_BODY_BYTES: usize = 4 * 1024 * 1024;
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
}

impl Default for ConnectionLimits {
    fn default() -> ConnectionLimits {
        ConnectionLimits {
            max_header_bytes: MIN_HEADER_BYTES,
            header_timeout: Duration::from_secs(30),
            body_timeout: Duration::from_secs(30),
            idle_timeout: Duration::from_secs(120),
            max_connections: 16_384,
        }
    }
}

/// The smallest, and default, `max_header_bytes`: hyper's floor for an HTTP/1 buffer.
pub const MIN_HEADER_BYTES: usize = 8192;
pub const DEFAULT_SEPARATOR: &str = "__";
pub const DEFAULT_SHUTDOWN_GRACE_SECS: u64 = 20;

/// The `[auth]` settings over the flags, validated against the listen address.
fn auth_config(
    cli: &Cli,
    file: file::AuthSection,
    listen: SocketAddr,
) -> Result<AuthConfig, ConfigError> {
    let d = AuthConfig::default();
    let mode = cli.auth_mode.or(file.mode).unwrap_or_default();
    let allow_unauthenticated =
        cli.allow_unauthenticated || file.allow_unauthenticated == Some(true);
    if mode == AuthMode::None && !listen.ip().is_loopback() && !allow_unauthenticated {
        return Err(invalid(
            "auth.mode",
            format!(
                "listening on {listen}, beyond loopback, without authorization: set auth.mode = \"builtin\" (--auth-mode builtin), or allow it explicitly with auth.allow_unauthenticated = true (--allow-unauthenticated)"
            ),
        ));
    }
    let public_url = match cli.public_url.clone().or(file.public_url) {
        None if mode == AuthMode::Builtin => {
            return Err(invalid(
                "auth.public_url",
                "auth.mode = \"builtin\" needs the public URL of /mcp, e.g. https://mcp.example.com/mcp",
            ));
        }
        None => None,
        Some(u) => {
            let url = url::Url::parse(&u)
                .map_err(|e| invalid("auth.public_url", format!("`{u}` is not a URL: {e}")))?;
            let loopback = match url.host() {
                Some(url::Host::Domain(d)) => d.eq_ignore_ascii_case("localhost"),
                Some(url::Host::Ipv4(ip)) => ip.is_loopback(),
                Some(url::Host::Ipv6(ip)) => ip.is_loopback(),
                None => false,
            };
            if url.scheme() != "https" && !(url.scheme() == "http" && loopback) {
                return Err(invalid(
                    "auth.public_url",
                    "must be https (plain http only on loopback, for development)",
                ));
            }
            if url.query().is_some() || url.fragment().is_some() || !url.username().is_empty() {
                return Err(invalid(
                    "auth.public_url",
                    "must have no query, fragment or credentials",
                ));
            }
            Some(url)
        }
    };
    let scopes = file.scopes.unwrap_or(d.scopes);
    if scopes
        .iter()
        .any(|s| s.is_empty() || s.contains([' ', '"', '\\']))
    {
        return Err(invalid(
            "auth.scopes",
            "scopes are non-empty words without spaces or quotes",
        ));
    }
    for u in &file.users {
        if argon2::PasswordHash::new(&u.password_hash).is_err() {
            return Err(invalid(
                format!("auth.users.{}.password_hash", u.name),
                "not an argon2 hash (make one with `mcp-gateway hash-password`)",
            ));
        }
    }
    let word = |s: &String| !s.is_empty() && !s.contains([' ', '"', '\\']);
    let mut client_ids = std::collections::BTreeSet::new();
    for c in &file.clients {
        let key = format!("auth.clients.{}", c.client_id);
        if c.client_id.is_empty()
            || c.client_id.len() > 128
            || !c.client_id.bytes().all(|b| b.is_ascii_graphic())
            || c.client_id.contains(':')
        {
            return Err(invalid(
                "auth.clients.client_id",
                format!(
                    "`{}` is not a client id: 1 to 128 printable ASCII characters without spaces or `:`",
                    c.client_id.escape_debug()
                ),
            ));
        }
        if !client_ids.insert(c.client_id.as_str()) {
            return Err(invalid(key, "this client_id is given twice"));
        }
        // A client_credentials token's subject is its client id: it must not be a user's.
        if file.users.iter().any(|u| u.name == c.client_id) {
            return Err(invalid(
                key,
                "a client_id may not be a user's name (its tokens would speak for that user)",
            ));
        }
        if argon2::PasswordHash::new(&c.secret_hash).is_err() {
            return Err(invalid(
                format!("{key}.secret_hash"),
                "not an argon2 hash (make one with `mcp-gateway hash-password`)",
            ));
        }
        if c.scopes.as_ref().is_some_and(|s| !s.iter().all(word)) {
            return Err(invalid(
                format!("{key}.scopes"),
                "scopes are non-empty words without spaces or quotes",
            ));
        }
    }
    let at_least_one = |v: Option<u32>, default: u32, key: &str| match v {
        Some(0) => Err(invalid(format!("auth.{key}"), "must be at least 1")),
        Some(n) => Ok(n),
        None => Ok(default),
    };
    let secs = |v: Option<u64>, default: Duration, key: &str| match v {
        Some(0) => Err(invalid(format!("auth.{key}"), "must be at least 1")),
        Some(n) => Ok(Duration::from_secs(n)),
        None => Ok(default),
    };
    Ok(AuthConfig {
        mode,
        public_url,
        scopes,
        users: file.users,
        clients: file.clients,
        access_ttl: secs(
            file.access_token_ttl_secs,
            d.access_ttl,
            "access_token_ttl_secs",
        )?,
        refresh_ttl: secs(
            file.refresh_token_ttl_secs,
            d.refresh_ttl,
            "refresh_token_ttl_secs",
        )?,
        code_ttl: secs(file.code_ttl_secs, d.code_ttl, "code_ttl_secs")?,
        cimd_allow_private: file.cimd_allow_private.unwrap_or(false),
        registrations_per_minute: at_least_one(
            file.registrations_per_minute,
            d.registrations_per_minute,
            "registrations_per_minute",
        )?,
        cimd_fetches_per_minute: at_least_one(
            file.cimd_fetches_per_minute,
            d.cimd_fetches_per_minute,
            "cimd_fetches_per_minute",
        )?,
        cimd_fetches_per_minute_total: at_least_one(
            file.cimd_fetches_per_minute_total,
            d.cimd_fetches_per_minute_total,
            "cimd_fetches_per_minute_total",
        )?,
        failed_signins_per_user: at_least_one(
            file.failed_signins_per_user,
            d.failed_signins_per_user,
            "failed_signins_per_user",
        )?,
        failed_signins_per_address: at_least_one(
            file.failed_signins_per_address,
            d.failed_signins_per_address,
            "failed_signins_per_address",
        )?,
        signin_lockout: secs(
            file.signin_lockout_secs,
            d.signin_lockout,
            "signin_lockout_secs",
        )?,
    })
}

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
        let listen = cli
            .listen
            .or(file.listen)
            .unwrap_or_else(|| DEFAULT_LISTEN.parse().expect("valid default"));
        let allowed_origins = allow_list(
            "allowed_origins",
            cli.allowed_origins.clone().or(file.allowed_origins),
            validate_origin,
        )?;
        let allowed_hosts = allow_list(
            "allowed_hosts",
            cli.allowed_hosts.clone().or(file.allowed_hosts),
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
        let secs = |key: &str, flag: Option<u64>, file: Option<u64>, default: Duration| match flag
            .or(file)
        {
            Some(0) => Err(invalid(key, "must be at least 1")),
            Some(n) => Ok(Duration::from_secs(n)),
            None => Ok(default),
        };
        let connections = ConnectionLimits {
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
        };
        let idle = cli
            .session_idle_timeout_secs
            .or(file.session.idle_timeout_secs)
            .unwrap_or(1800);
        if idle == 0 {
            return Err(invalid("session.idle_timeout_secs", "must be at least 1"));
        }
        let max_sessions = cli
            .max_sessions
            .or(file.session.max_sessions)
            .unwrap_or(10_000);
        if max_sessions == 0 {
            return Err(invalid("session.max_sessions", "must be at least 1"));
        }
        let max_per_client = cli
            .max_sessions_per_client
            .or(file.session.max_per_client)
            .unwrap_or(256);
        if max_per_client == 0 {
            return Err(invalid("session.max_per_client", "must be at least 1"));
        }
        let unused = cli
            .session_unused_timeout_secs
            .or(file.session.unused_timeout_secs)
            .unwrap_or(60);
        if unused == 0 {
            return Err(invalid("session.unused_timeout_secs", "must be at least 1"));
        }
        let trusted_proxies = cli
            .trusted_proxies
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
            .collect::<Result<Vec<_>, _>>()?;
        let fs = &file.stream;
        let keep_alive = cli.sse_keep_alive_secs.or(fs.keep_alive_secs).unwrap_or(15);
        if keep_alive == 0 {
            return Err(invalid("stream.keep_alive_secs", "must be at least 1"));
        }
        let retry_ms = cli.sse_retry_ms.or(fs.retry_ms).unwrap_or(1000);
        let poll_after_ms = cli.sse_poll_after_ms.or(fs.poll_after_ms);
        if poll_after_ms == Some(0) {
            return Err(invalid(
                "stream.poll_after_ms",
                "must be at least 1 (leave it out to turn polling off)",
            ));
        }
        let defaults = ReplayLimits::default();
        let replay = ReplayLimits {
            max_events_per_stream: cli
                .replay_max_events
                .or(fs.replay_max_events)
                .unwrap_or(defaults.max_events_per_stream),
            max_bytes_per_stream: cli
                .replay_max_bytes
                .or(fs.replay_max_bytes)
                .unwrap_or(defaults.max_bytes_per_stream),
            max_events_per_session: cli
                .replay_session_max_events
                .or(fs.replay_session_max_events)
                .unwrap_or(defaults.max_events_per_session),
            max_bytes_per_session: cli
                .replay_session_max_bytes
                .or(fs.replay_session_max_bytes)
                .unwrap_or(defaults.max_bytes_per_session),
            max_age: cli
                .replay_max_age_secs
                .or(fs.replay_max_age_secs)
                .map_or(defaults.max_age, Duration::from_secs),
        };
        let stream = StreamSettings {
            keep_alive: Duration::from_secs(keep_alive),
            resumable: cli.sse_resumable.or(fs.resumable).unwrap_or(true),
            retry: Duration::from_millis(retry_ms),
            poll_after: poll_after_ms.map(Duration::from_millis),
            linger: Duration::from_millis(cli.sse_linger_ms.or(fs.linger_ms).unwrap_or(5000)),
            hold: Duration::from_millis(cli.sse_hold_ms.or(fs.hold_ms).unwrap_or(5)),
            max_lingering: replay.max_events_per_session,
        };
        for (key, limit) in [
            ("stream.replay_max_events", replay.max_events_per_stream),
            ("stream.replay_max_bytes", replay.max_bytes_per_stream),
            (
                "stream.replay_session_max_events",
                replay.max_events_per_session,
            ),
            (
                "stream.replay_session_max_bytes",
                replay.max_bytes_per_session,
            ),
        ] {
            if limit == 0 {
                return Err(invalid(key, "must be at least 1"));
            }
        }
        let separator = cli
            .separator
            .clone()
            .or(file.separator)
            .unwrap_or_else(|| DEFAULT_SEPARATOR.into());
        if separator.is_empty() || separator.contains(char::is_whitespace) {
            return Err(invalid("separator", "must be non-empty, without spaces"));
        }

        let mut plugins = file.plugins;
        if let Some((command, args)) = cli.command_line.split_first() {
            let name = cli.plugin_name.clone().unwrap_or_else(|| "stdio".into());
            if plugins.iter().any(|p| p.name == name) {
                return Err(invalid(
                    "plugin_name",
                    format!(
                        "the quick-mode plugin's name `{name}` is taken by the config file; pick another with --plugin-name"
                    ),
                ));
            }
            let mut p = PluginConfig::new(name, command.clone(), args.to_vec());
            if let Some(mode) = cli.response_mode {
                p.response_mode = mode;
            }
            plugins.push(p);
        }
        if plugins.is_empty() {
            return Err(ConfigError::NoPlugins);
        }
        for p in &plugins {
            validate_plugin(p, &separator)?;
        }
        let mut prefixes = std::collections::HashMap::new();
        for p in &plugins {
            let prefix = p.prefix.as_deref().unwrap_or(&p.name);
            if let Some(other) = prefixes.insert(prefix, &p.name) {
                return Err(invalid(
                    format!("plugins.{}.prefix", p.name),
                    format!(
                        "`{prefix}` is also the prefix of plugin `{other}`; each plugin needs its own"
                    ),
                ));
            }
        }
        let admin = AdminConfig {
            listen: cli
                .admin_listen
                .or(file.admin.listen)
                .unwrap_or_else(|| DEFAULT_ADMIN_LISTEN.parse().expect("valid default")),
            token: cli
                .admin_token
                .clone()
                .or(file.admin.token)
                .filter(|t| !t.is_empty()),
        };
        if admin.listen == listen && listen.port() != 0 {
            return Err(invalid(
                "admin.listen",
                "the admin listener needs its own address, not the public one",
            ));
        }
        let auth = auth_config(cli, file.auth, listen)?;
        let database_url = cli
            .database_url
            .clone()
            .or(file.database_url)
            .unwrap_or_else(|| {
                // Only the admin API's changes and the built-in authorization server need to
                // outlive the process; without either, nothing is written to disk.
                if admin.token.is_some() || auth.mode == AuthMode::Builtin {
                    DEFAULT_DATABASE_URL.into()
                } else {
                    MEMORY_DATABASE_URL.into()
                }
            });
        Ok(Config {
            auth,
            max_children: cli.max_children.or(file.max_children),
            shutdown_grace: Duration::from_secs(
                cli.shutdown_grace_secs
                    .or(file.shutdown_grace_secs)
                    .unwrap_or(DEFAULT_SHUTDOWN_GRACE_SECS),
            ),
            database_url,
            admin,
            config_path: cli.config.clone(),
            listen,
            allowed_origins,
            allowed_hosts,
            max_body_bytes,
            connections,
            session: SessionConfig {
                idle_timeout: Duration::from_secs(idle),
                unused_timeout: Duration::from_secs(unused),
                max_sessions,
                max_per_client,
            },
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
            max_children: None,
            shutdown_grace: Duration::from_secs(DEFAULT_SHUTDOWN_GRACE_SECS),
            admin: AdminConfig {
                listen: "127.0.0.1:0".parse().expect("valid"),
                token: None,
            },
            auth: AuthConfig::default(),
            config_path: None,
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

/// The gateway's own environment variables that hold a secret: a plugin may not name them
/// in its `env`, and does not inherit them.
pub const SECRET_ENV_VARS: &[&str] = &["MCP_GATEWAY_ADMIN_TOKEN", "MCP_GATEWAY_DATABASE_URL"];

/// Replaces each `${NAME}` in `value` with the gateway's environment variable NAME. Secrets
/// stay out of config files and the database this way.
pub fn expand_env(value: &str, lookup: impl Fn(&str) -> Option<String>) -> Result<String, String> {
    let mut out = String::with_capacity(value.len());
    let mut rest = value;
    while let Some(start) = rest.find("${") {
        out.push_str(&rest[..start]);
        let after = &rest[start + 2..];
        let end = after
            .find('}')
            .ok_or_else(|| format!("`{value}` has an unclosed `${{`"))?;
        let name = &after[..end];
        if name.is_empty() || !name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_') {
            return Err(format!("`${{{name}}}` is not a variable name"));
        }
        out.push_str(
            &lookup(name)
                .ok_or_else(|| format!("`${{{name}}}` is not set in the gateway's environment"))?,
        );
        rest = &after[end + 1..];
    }
    out.push_str(rest);
    Ok(out)
}

/// Checks one plugin's definition (name, command, prefix, env).
pub fn validate_plugin(p: &PluginConfig, separator: &str) -> Result<(), ConfigError> {
    let key = |k: &str| format!("plugins.{}.{k}", p.name);
    if p.name.is_empty()
        || !p
            .name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
    {
        return Err(invalid(
            format!("plugins.{}", p.name),
            "a plugin name is letters, digits, '-' and '_'",
        ));
    }
    if p.command.trim().is_empty() {
        return Err(invalid(key("command"), "must not be empty"));
    }
    if p.pool_size == 0 {
        return Err(invalid(key("pool_size"), "must be at least 1"));
    }
    if p.process_model == ProcessModel::Shared && p.warm > 0 {
        return Err(invalid(
            key("warm"),
            "a warm pool is for per_session plugins; a shared one is started once",
        ));
    }
    if p.prefix.as_deref().is_some_and(|x| x.trim().is_empty()) {
        return Err(invalid(
            key("prefix"),
            "must not be empty (names would start with the separator); leave it out to use the plugin's name",
        ));
    }
    for (var, value) in &p.env {
        let named = std::cell::RefCell::new(None);
        let _ = expand_env(value, |n| {
            if SECRET_ENV_VARS.contains(&n) {
                named.borrow_mut().get_or_insert_with(|| n.to_owned());
            }
            Some(String::new())
        });
        if let Some(secret) = named.into_inner() {
            return Err(invalid(
                key(&format!("env.{var}")),
                format!(
                    "refers to `${{{secret}}}`, a secret of the gateway's own; a plugin may not be given it"
                ),
            ));
        }
    }
    let prefix = p.prefix.as_deref().unwrap_or(&p.name);
    if prefix.contains(separator) {
        return Err(invalid(
            key("prefix"),
            format!(
                "`{prefix}` contains the separator `{separator}`, so names could not be split back"
            ),
        ));
    }
    Ok(())
}

fn allow_list(
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

    fn cli(args: &[&str]) -> Cli {
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

    #[test]
    fn authorization_settings_are_checked() {
        let beyond = ["--listen", "0.0.0.0:8080", "--allowed-hosts", "h"];
        let e = Config::load(&cli(&[&beyond[..], &["--", "x"]].concat())).unwrap_err();
        assert!(e.to_string().contains("auth.mode"), "{e}");
        let e = Config::load(&cli(
            &[&beyond[..], &["--auth-mode", "builtin", "--", "x"]].concat()
        ))
        .unwrap_err();
        assert!(e.to_string().contains("auth.public_url"), "{e}");
        let e = Config::load(&cli(&[
            &beyond[..],
            &[
                "--auth-mode",
                "builtin",
                "--public-url",
                "http://h/mcp",
                "--",
                "x",
            ],
        ]
        .concat()))
        .unwrap_err();
        assert!(e.to_string().contains("https"), "{e}");
        let c = Config::load(&cli(&[
            &beyond[..],
            &[
                "--auth-mode",
                "builtin",
                "--public-url",
                "https://h/mcp",
                "--",
                "x",
            ],
        ]
        .concat()))
        .unwrap();
        assert_eq!(c.auth.mode, AuthMode::Builtin);
        assert_eq!(c.auth.scopes, ["mcp"]);
        let file = FileConfig::parse(
            "[auth]\nmode = \"builtin\"\npublic_url = \"http://127.0.0.1:1/mcp\"\n\
             [[auth.users]]\nname = \"a\"\npassword_hash = \"plain\"\n\
             [plugins.p]\ncommand = \"x\"\n",
        )
        .unwrap();
        let e = Config::merge(&cli(&[]), file).unwrap_err();
        assert!(e.to_string().contains("auth.users.a.password_hash"), "{e}");
    }

    #[test]
    fn provisioned_clients_are_checked() {
        let hash = "$argon2id$v=19$m=19456,t=2,p=1$TjWAhc8wjdae+vBP5NQT9g$iTI0JoWUp/tLsdNm2l75KZd1QY/kLNiZ5XM6eYAZjYs";
        let load = |clients: &str| {
            let file = FileConfig::parse(&format!(
                "[auth]\nmode = \"builtin\"\npublic_url = \"http://127.0.0.1:1/mcp\"\n\
                 [[auth.users]]\nname = \"alice\"\npassword_hash = \"{hash}\"\n{clients}\
                 [plugins.p]\ncommand = \"x\"\n"
            ))
            .unwrap();
            Config::merge(&cli(&[]), file)
        };
        let c = load(&format!(
            "[[auth.clients]]\nclient_id = \"robot\"\nsecret_hash = \"{hash}\"\nscopes = [\"mcp\"]\n"
        ))
        .unwrap();
        assert_eq!(c.auth.clients[0].client_id, "robot");
        assert!(
            !format!("{:?}", c.auth).contains("argon2"),
            "no hash in Debug"
        );
        for (clients, says) in [
            (
                "[[auth.clients]]\nclient_id = \"robot\"\nsecret_hash = \"plain\"\n".to_owned(),
                "auth.clients.robot.secret_hash",
            ),
            (
                format!("[[auth.clients]]\nclient_id = \"alice\"\nsecret_hash = \"{hash}\"\n"),
                "user's name",
            ),
            (
                format!(
                    "[[auth.clients]]\nclient_id = \"https://x/c\"\nsecret_hash = \"{hash}\"\n"
                ),
                "not a client id",
            ),
            (
                format!(
                    "[[auth.clients]]\nclient_id = \"r\"\nsecret_hash = \"{hash}\"\n\
                     [[auth.clients]]\nclient_id = \"r\"\nsecret_hash = \"{hash}\"\n"
                ),
                "given twice",
            ),
            (
                format!(
                    "[[auth.clients]]\nclient_id = \"r\"\nsecret_hash = \"{hash}\"\nscopes = [\"a b\"]\n"
                ),
                "auth.clients.r.scopes",
            ),
        ] {
            let e = load(&clients).unwrap_err();
            assert!(e.to_string().contains(says), "{says}: {e}");
        }
    }

    #[test]
    fn prefixes_must_differ() {
        let mut b = PluginConfig::new("b", "y", vec![]);
        b.prefix = Some("a".into());
        let file = FileConfig {
            plugins: vec![PluginConfig::new("a", "x", vec![]), b],
            ..FileConfig::default()
        };
        let e = Config::merge(&cli(&[]), file).unwrap_err();
        assert!(e.to_string().contains("plugins.b.prefix"), "{e}");
    }

    #[test]
    fn tool_filters() {
        let mut p = PluginConfig::new("a", "x", vec![]);
        assert!(p.allows_tool("any") && !p.filters_tools());
        p.tools_deny = vec!["rm".into()];
        assert!(!p.allows_tool("rm") && p.allows_tool("ls"));
        p.tools_allow = Some(vec!["ls".into(), "rm".into()]);
        assert!(p.allows_tool("ls") && !p.allows_tool("rm") && !p.allows_tool("cat"));
    }

    #[test]
    fn env_references_expand() {
        let lookup = |n: &str| (n == "TOKEN").then(|| "s3cret".to_owned());
        assert_eq!(expand_env("${TOKEN}", lookup).unwrap(), "s3cret");
        assert_eq!(
            expand_env("Bearer ${TOKEN}!", lookup).unwrap(),
            "Bearer s3cret!"
        );
        assert_eq!(expand_env("plain", lookup).unwrap(), "plain");
        assert!(
            expand_env("${MISSING}", lookup)
                .unwrap_err()
                .contains("MISSING")
        );
        assert!(expand_env("${TOKEN", lookup).is_err());
        assert!(expand_env("${A-B}", lookup).is_err());
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
