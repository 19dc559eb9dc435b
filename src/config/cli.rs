//! The command line: every flag (each with an `MCP_GATEWAY_*` environment form), the
//! subcommands, and the log format. Flags are parsed here and nothing more: merging them over
//! the file and validating the result is [`Config::merge`](super::Config::merge)'s job.

use std::net::SocketAddr;
use std::path::PathBuf;

use clap::{Parser, Subcommand, ValueEnum};

use super::{AuthMode, ResponseMode};

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

    /// Redis shared by the replicas of a cluster (`redis://host:port[/db]`): turns cluster
    /// mode on, where any replica serves any session. [default: none; one replica, state in
    /// memory]
    #[arg(long, env = "MCP_GATEWAY_REDIS_URL")]
    pub redis_url: Option<String>,

    /// What every Redis key of this cluster starts with, so clusters (or tests) can share one
    /// Redis. [default: mcp-gateway:]
    #[arg(long, env = "MCP_GATEWAY_REDIS_KEY_PREFIX")]
    pub redis_key_prefix: Option<String>,

    /// The secret the replicas of a cluster share: a request one forwards to another carries
    /// it. At least 16 characters; required in cluster mode.
    #[arg(long, env = "MCP_GATEWAY_CLUSTER_SECRET", hide_env_values = true)]
    pub cluster_secret: Option<String>,

    /// Where the other replicas reach this one (`http://host:port`). [default:
    /// http://<listen address>, or this machine's host name for a wildcard address]
    #[arg(long, env = "MCP_GATEWAY_ADVERTISE_URL")]
    pub advertise_url: Option<String>,

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

    /// Seconds a 2026-07-28 client's call waits for the client to come back with the input a
    /// plugin asked for (an `InputRequiredResult`'s retry) before it is cancelled.
    /// [default: 60]
    #[arg(long, env = "MCP_GATEWAY_SESSION_INPUT_TIMEOUT_SECS")]
    pub session_input_timeout_secs: Option<u64>,

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

    /// Host names the admin listener answers to in the `Host` header, against DNS rebinding
    /// (comma-separated). An IP address and `localhost` are always let in (a name is what a
    /// rebinding page needs); any other name is refused with 421. [default: none]
    #[arg(long, env = "MCP_GATEWAY_ADMIN_ALLOWED_HOSTS", value_delimiter = ',')]
    pub admin_allowed_hosts: Option<Vec<String>>,

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

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum LogFormat {
    Text,
    Json,
}
