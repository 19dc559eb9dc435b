//! mcp-gateway: one Streamable HTTP endpoint, `/mcp`, in front of stdio MCP servers.
//!
//! # Layout
//!
//! A request's way through the gateway, in module order:
//!
//! - [`http`]: the endpoint; Host/Origin/Accept/Content-Type checks; status codes; SSE or JSON.
//! - [`auth`]: OAuth 2.1: the bearer token of every request (resource server) and, built in,
//!   the authorization server that issues them.
//! - [`protocol`]: versions, negotiation, and the one place a request's era is decided.
//! - [`jsonrpc`]: envelope parsing that leaves params and results as raw JSON.
//! - [`session`]: legacy-era sessions, each with its own plugin instances and GET stream.
//! - [`stream`]: the streams towards a client and how they become responses.
//! - [`router`]: which plugin serves a request; merged lists; name prefixes.
//! - [`supervisor`]: plugin processes: started under limits, restarted with backoff, the
//!   crash breaker, shared and warm pools.
//! - [`backend`]: plugins: the stdio child process and JSON-RPC multiplexing.
//! - [`registry`]: which plugins exist (config file and admin API, persisted) and what each
//!   said of itself when probed.
//! - [`admin`]: the admin listener: health and readiness probes, Prometheus metrics, and the
//!   admin API.
//! - [`metrics`]: what the gateway counts and measures, in Prometheus's format.
//! - [`database`]: the one SQL database (SQLite or PostgreSQL): opened and migrated once,
//!   lending the registry's and the authorization server's stores behind their traits.
//!
//! [`config`] turns flags, environment and files into a validated [`config::Config`];
//! [`logs`] sets up the log lines; [`gateway::run`] serves the config until told to stop.

pub mod admin;
pub mod auth;
pub mod backend;
pub mod config;
pub mod database;
pub mod gateway;
pub mod http;
pub mod jsonrpc;
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
