//! mcp-gateway: one Streamable HTTP endpoint, `/mcp`, in front of stdio MCP servers.
//!
//! # Layout
//!
//! The modules are layers: each imports only those listed below it (`tests/layers.rs` fails
//! on an import that points up, so there is no loop). From the top, a request's way through
//! the gateway:
//!
//! - [`server`]: start-up and the listeners' lifetime: [`run`], or [`server::Server`] for a
//!   gateway inside a test; the drain and the stop.
//! - [`admin`]: the admin listener: health and readiness probes, `/metrics`, the admin API.
//! - [`http`]: the public endpoint `/mcp` (POST, GET, DELETE); Host/Origin/Accept/Content-Type
//!   checks; status codes; SSE or JSON; connection timeouts and limits.
//! - [`gateway`]: the shared state both listeners serve (config, registry, sessions, auth).
//! - [`router`]: which plugin serves a request; merged lists; name prefixes. Beside it,
//!   [`cluster`]: cluster mode's Redis, the replica's heartbeat, session records, the
//!   forwarding of a request to the replica that owns its session, and what the replicas
//!   share besides (revocations, the registration limit, the admin API's changes).
//! - [`session`]: legacy-era sessions, each with its plugin instances and streams; the
//!   session record kept behind [`session::SessionStore`].
//! - [`supervisor`]: plugin supervision in one place: instances started under limits,
//!   restarted with backoff, the crash breaker, shared and warm pools.
//! - [`database`]: the one SQL database (SQLite or PostgreSQL): opened and migrated once,
//!   lending the registry's and the authorization server's stores behind their traits.
//! - [`registry`]: which plugins exist (config file and admin API, persisted) and what each
//!   said of itself when probed.
//! - [`limits`]: rate limits on calls, a token bucket per caller and limit, kept here or
//!   (cluster mode) behind [`limits::SharedBuckets`].
//! - [`credentials`]: each person's own credentials for the services behind the plugins,
//!   sealed under a key outside the database, kept behind [`credentials::CredentialStore`].
//! - [`auth`]: OAuth 2.1: the bearer token of every request (resource server) and, built in,
//!   the authorization server that issues them.
//! - [`backend`]: a plugin instance: the stdio child process and JSON-RPC multiplexing,
//!   behind [`backend::PluginTransport`]; it knows nothing of sessions.
//! - [`stream`]: the streams towards a client, their event ids, replay behind
//!   [`stream::EventStore`], and how they become SSE or JSON responses.
//! - [`protocol`]: versions, negotiation, and the one place a request's era is decided;
//!   [`logs`] sets up the log lines.
//! - [`audit`]: the audit log's records, written as log lines and through
//!   [`audit::AuditStore`].
//! - [`jsonrpc`] (envelope parsing that leaves params and results as raw JSON), [`metrics`]
//!   (what the gateway counts, in Prometheus's format) and [`config`] (flags, environment and
//!   files into a validated [`config::Config`]) are leaves: they import no other module.

pub mod admin;
pub mod audit;
pub mod auth;
pub mod backend;
pub mod cluster;
pub mod config;
pub mod credentials;
pub mod database;
pub mod gateway;
pub mod http;
pub mod jsonrpc;
pub mod limits;
pub mod logs;
pub mod metrics;
pub mod protocol;
pub mod registry;
pub mod router;
pub mod server;
pub mod session;
pub mod stream;
pub mod supervisor;

pub use server::run;
