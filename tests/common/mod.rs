//! Test harness shared by every test file: a gateway to test against (the real binary as a
//! child process, or the library served in this process), a client that speaks the transport
//! by hand, and helpers for the admin listener, OAuth flows, /proc and PostgreSQL. It owns no
//! test; waits are on conditions with a deadline, never bare sleeps.
//!
//! Layout:
//! - `process`: the `mcp-gateway` binary on 127.0.0.1:0 (start, wrappers, logs, signals,
//!   metrics, the command line).
//! - `cluster`: several `process` gateways behind HAProxy (round-robin, no stickiness), in
//!   cluster mode on the test Redis under a key prefix of the test's own, or plain; replicas
//!   killed, stopped and restarted on their port.
//! - `inprocess`: `mcp_gateway::server::Server` on 127.0.0.1:0 inside the test, for checks that
//!   need no child process of their own. Never mixed with `process` (nor with `psql` or other
//!   commands) in one test binary: the gateway makes its process the subreaper of plugin
//!   processes, reaps any child of the process that exits, and when it stops kills every
//!   child it did not start itself, child-process gateways included. [`claim_harness`] fails
//!   a test binary that tries.
//! - `client`: the hand-rolled transport client and raw requests.
//! - `modern`: a 2026-07-28 client by hand (no session), and multi round-trip retries.
//! - `sse`: the SSE parser and live streams.
//! - `admin`: the admin listener (probes, metrics text, the admin API).
//! - `oauth`: a gateway in `builtin` auth mode and the OAuth flows against it.
//! - `browser`: a real browser through chromedriver.
//! - `oidc`: an OpenID provider of the test's own (`oidc-provider` from npm): tokens for a
//!   resource, introspection, revocation, key rotation.
//! - `procfs`: process checks through /proc.
//! - `postgres`: a database of its own on the test PostgreSQL server.
//! - `upstream`: remote MCP servers (the Python SDK fixtures over HTTP, server-everything, a
//!   hostile one of the test's own) and a TCP relay whose connections a test cuts.
//! - `redis_server`: a Redis of the test's own (`redis-server` on a port of its own, nothing
//!   on disk), killed, frozen and started again mid-test.
//!
//! Each test binary uses a subset, hence `dead_code` is allowed here.

#![allow(dead_code)]

pub mod admin;
pub mod browser;
pub mod client;
pub mod cluster;
pub mod credentials;
pub mod inprocess;
pub mod modern;
pub mod oauth;
pub mod oidc;
pub mod postgres;
pub mod process;
pub mod procfs;
pub mod redis_server;
pub mod sse;
pub mod upstream;

// Each test binary uses a subset of these.
#[allow(unused_imports)]
pub use admin::{Admin, metric_in};
#[allow(unused_imports)]
pub use client::*;
#[allow(unused_imports)]
pub use cluster::Cluster;
#[allow(unused_imports)]
pub use inprocess::InProcess;
#[allow(unused_imports)]
pub use postgres::Postgres;
#[allow(unused_imports)]
pub use process::*;
#[allow(unused_imports)]
pub use procfs::*;
#[allow(unused_imports)]
pub use sse::*;

use std::path::PathBuf;
use std::time::{Duration, Instant};

pub const FIXTURE: &str = env!("CARGO_BIN_EXE_mcp-fixture-server");
/// The fixture plugin of the modern era (2026-07-28) only.
pub const FIXTURE_MODERN: &str = env!("CARGO_BIN_EXE_mcp-fixture-modern");
pub const GATEWAY: &str = env!("CARGO_BIN_EXE_mcp-gateway");

/// Where a gateway under test answers, whichever harness runs it: what the client helpers
/// need, so they work with either.
pub trait Endpoints {
    /// The public listener's address, `127.0.0.1:PORT`.
    fn public_addr(&self) -> &str;

    /// The admin listener's address, when it is known.
    fn admin_addr(&self) -> Option<&str>;

    /// The MCP endpoint, `http://ADDR/mcp`.
    fn mcp_url(&self) -> String {
        format!("http://{}/mcp", self.public_addr())
    }
}

/// Records which harness this test binary uses, and fails the test that would use the other
/// one too: an in-process gateway kills the child processes it did not start when it stops
/// (see `inprocess`), so the two never share a process.
pub fn claim_harness(name: &'static str) {
    static HARNESS: std::sync::OnceLock<&'static str> = std::sync::OnceLock::new();
    let first = HARNESS.get_or_init(|| name);
    assert_eq!(
        *first, name,
        "this test binary already uses the {first} harness: put tests that need the {name} one in a file of their own"
    );
}

/// Where `scripts/install-test-deps` puts Node 22, npm packages and the Python venv.
pub fn tools_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(".tools")
}

/// A path under .tools that must exist; a clear failure when the installer has not run.
pub fn tool(rel: &str) -> PathBuf {
    let p = tools_dir().join(rel);
    assert!(
        p.exists(),
        "{} is missing: run scripts/install-test-deps (scripts/test does)",
        p.display()
    );
    p
}

/// Writes `text` to the file `name` in `dir`; its path.
pub fn write_file(dir: &tempfile::TempDir, name: &str, text: &str) -> String {
    let p = dir.path().join(name);
    std::fs::write(&p, text).unwrap();
    p.to_str().unwrap().to_owned()
}

/// Writes a gateway config file into `dir`; its path.
pub fn write_config(dir: &tempfile::TempDir, text: &str) -> String {
    write_file(dir, "gw.toml", text)
}

/// Polls `cond` until it holds or `timeout` passes.
pub async fn wait_until(what: &str, timeout: Duration, mut cond: impl FnMut() -> bool) {
    let deadline = Instant::now() + timeout;
    while !cond() {
        assert!(Instant::now() < deadline, "timed out waiting for: {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// A port free on 127.0.0.1 a moment ago, for a server whose address must be known before it
/// starts.
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// Runs the official Python SDK's client (tests/clients/python_sdk_client.py) in `mode`
/// against `url`; what it printed, as JSON. Fails the test if it fails.
#[allow(dead_code)]
pub fn python_sdk_client(mode: &str, url: &str) -> serde_json::Value {
    python_sdk_client_with(mode, url, &[])
}

/// [`python_sdk_client`] with the mode's further arguments.
#[allow(dead_code)]
pub fn python_sdk_client_with(mode: &str, url: &str, args: &[&str]) -> serde_json::Value {
    let mut all = vec![mode, url];
    all.extend_from_slice(args);
    python_client("python_sdk_client.py", &all)
}

/// Runs `tests/clients/<script>` with `args` on the venv's Python (the official SDK's); what
/// it printed, as JSON. Fails the test if it fails.
#[allow(dead_code)]
pub fn python_client(script: &str, args: &[&str]) -> serde_json::Value {
    let script = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/clients")
        .join(script);
    let out = std::process::Command::new(tool("venv/bin/python"))
        .arg(&script)
        .args(args)
        .output()
        .expect("run the Python client");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "python client {} failed ({}):\nstdout: {stdout}\nstderr: {}",
        script.display(),
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_str(stdout.trim())
        .unwrap_or_else(|e| panic!("bad client output {stdout}: {e}"))
}
