//! (c): N sessions, each holding a GET stream; how fast they were set up and the memory of the
//! target's process tree while they are open; then, while they stay open, whether keep-alives
//! still flow on them (a sample read) and the target's health probe answers.
//!
//! One loopback source address gives some 28,000 ports (`net.ipv4.ip_local_port_range`), so
//! the connections are spread over [`PER_SOURCE`] per address: 127.0.0.1, 127.0.0.2, ... (every
//! 127/8 address is the loopback on Linux, with no set-up).
//!
//! With `http2`, the streams go over HTTP/2 without TLS (prior knowledge), [`PER_H2`] on each
//! connection (below the gateway's 200 concurrent streams per connection): many streams on
//! few sockets, so that a process's open-file limit does not cap how many can be measured.

use std::net::{IpAddr, Ipv4Addr};
use std::time::{Duration, Instant};

use serde::Serialize;

use crate::mcp::initialize;
use crate::procfs::tree_memory;

/// Connections per loopback source address.
const PER_SOURCE: usize = 20_000;
/// Streams on one HTTP/2 connection (one client each): hyper's server allows 200 at once.
const PER_H2: usize = 190;
/// Streams read after set-up to see a keep-alive (or any event) come.
const SAMPLE: usize = 64;
/// How long a sampled stream may stay silent: twice the gateway's keep-alive interval (15 s).
const SILENCE: Duration = Duration::from_secs(30);

#[derive(Debug, Default, Serialize)]
pub(crate) struct IdleReport {
    pub(crate) sessions: usize,
    pub(crate) setup_per_sec: f64,
    pub(crate) memory_mb: f64,
    pub(crate) processes: usize,
    /// Loopback source addresses the connections came from.
    #[serde(skip_serializing_if = "is_zero")]
    pub(crate) source_addresses: usize,
    /// HTTP/2 connections the streams shared (none: one HTTP/1 connection each).
    #[serde(skip_serializing_if = "is_zero")]
    pub(crate) http2_connections: usize,
    /// Of the sampled streams, those on which something came within [`SILENCE`] (measured
    /// only when asked).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) keep_alives: Option<String>,
    /// The health probe's status and time while the streams were open (when asked).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) healthz: Option<String>,
}

fn is_zero(n: &usize) -> bool {
    *n == 0
}

/// An HTTP client whose connections come from `source`.
fn client_from(source: IpAddr) -> reqwest::Client {
    reqwest::Client::builder()
        .pool_max_idle_per_host(1024)
        .local_address(source)
        .connect_timeout(Duration::from_secs(10))
        .build()
        .expect("HTTP client")
}

/// An HTTP/2 client without TLS: one connection, whatever it is asked.
fn h2_client() -> reqwest::Client {
    reqwest::Client::builder()
        .http2_prior_knowledge()
        .connect_timeout(Duration::from_secs(10))
        .build()
        .expect("HTTP client")
}

/// Opens `n` sessions, each holding a GET stream (over HTTP/2 with `http2`); setup rate and
/// the memory of the target's process tree while they are open. With `check`, then reads a
/// sample of the streams until each has said something, and asks `check`'s `/healthz`
/// meanwhile.
pub(crate) async fn idle_sessions(
    url: &str,
    pid: u32,
    n: usize,
    hold: Duration,
    check: Option<&str>,
    http2: bool,
) -> Result<IdleReport, String> {
    let loopback = url.contains("://127.0.0.1:") || url.contains("://localhost:");
    let sources = if loopback && !http2 {
        n.div_ceil(PER_SOURCE).max(1)
    } else {
        1
    };
    let per_client = if http2 { PER_H2 } else { PER_SOURCE };
    let clients: Vec<reqwest::Client> = if http2 {
        (0..n.div_ceil(PER_H2).max(1))
            .map(|_| h2_client())
            .collect()
    } else {
        (0..sources)
            .map(|i| match loopback {
                true => client_from(IpAddr::V4(Ipv4Addr::new(127, 0, 0, 1 + i as u8))),
                false => crate::mcp::client(),
            })
            .collect()
    };
    let started = Instant::now();
    let mut streams = Vec::with_capacity(n);
    for i in 0..n {
        let http = &clients[(i / per_client).min(clients.len() - 1)];
        let (sid, version) = initialize(http, url).await?;
        let sid = sid.ok_or("the target keeps no sessions")?;
        let r = http
            .get(url)
            .header("accept", "text/event-stream")
            .header("mcp-session-id", &sid)
            .header("mcp-protocol-version", &version)
            .send()
            .await
            .map_err(|e| format!("GET stream {i}: {e}"))?;
        if !r.status().is_success() {
            return Err(format!("GET stream {i}: HTTP {}", r.status()));
        }
        streams.push(r);
        if (i + 1) % 10_000 == 0 {
            eprintln!("{} streams open", i + 1);
        }
    }
    let setup = started.elapsed();
    let (memory_mb, processes) = tree_memory(pid);
    let mut report = IdleReport {
        sessions: n,
        setup_per_sec: n as f64 / setup.as_secs_f64(),
        memory_mb,
        processes,
        source_addresses: if sources > 1 { sources } else { 0 },
        http2_connections: if http2 { clients.len() } else { 0 },
        ..Default::default()
    };
    if let Some(admin) = check {
        let step = (n / SAMPLE).max(1);
        let sample: Vec<&mut reqwest::Response> = streams.iter_mut().step_by(step).collect();
        let sampled = sample.len();
        let reads = futures_util::future::join_all(sample.into_iter().map(|s| async move {
            matches!(
                tokio::time::timeout(SILENCE, s.chunk()).await,
                Ok(Ok(Some(_)))
            )
        }));
        let health = async {
            let at = Instant::now();
            let status = crate::mcp::client()
                .get(format!("{admin}/healthz"))
                .send()
                .await
                .map(|r| r.status().as_u16().to_string())
                .unwrap_or_else(|e| e.to_string());
            format!("{status} in {:.1} ms", at.elapsed().as_secs_f64() * 1e3)
        };
        let (said, health) = tokio::join!(reads, health);
        report.keep_alives = Some(format!(
            "{} of {sampled} within {} s",
            said.iter().filter(|s| **s).count(),
            SILENCE.as_secs()
        ));
        report.healthz = Some(health);
    }
    if !hold.is_zero() {
        eprintln!(
            "{n} streams open: {memory_mb:.1} MB; holding them {} s",
            hold.as_secs()
        );
        tokio::time::sleep(hold).await;
    }
    drop(streams);
    Ok(report)
}
