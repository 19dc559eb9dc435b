//! (c): N sessions, each holding a GET stream; how fast they were set up and the memory of the
//! target's process tree while they are open.

use std::time::{Duration, Instant};

use serde::Serialize;

use crate::mcp::{client, initialize};
use crate::procfs::tree_memory;

#[derive(Debug, Default, Serialize)]
pub(crate) struct IdleReport {
    pub(crate) sessions: usize,
    pub(crate) setup_per_sec: f64,
    pub(crate) memory_mb: f64,
    pub(crate) processes: usize,
}

/// Opens `n` sessions, each holding a GET stream; setup rate and the memory of the target's
/// process tree while they are open.
pub(crate) async fn idle_sessions(
    url: &str,
    pid: u32,
    n: usize,
    hold: Duration,
) -> Result<IdleReport, String> {
    let http = client();
    let started = Instant::now();
    let mut streams = Vec::with_capacity(n);
    for _ in 0..n {
        let (sid, version) = initialize(&http, url).await?;
        let sid = sid.ok_or("the target keeps no sessions")?;
        let r = http
            .get(url)
            .header("accept", "text/event-stream")
            .header("mcp-session-id", &sid)
            .header("mcp-protocol-version", &version)
            .send()
            .await
            .map_err(|e| e.to_string())?;
        if !r.status().is_success() {
            return Err(format!("GET stream: HTTP {}", r.status()));
        }
        streams.push(r);
    }
    let setup = started.elapsed();
    let (memory_mb, processes) = tree_memory(pid);
    if !hold.is_zero() {
        eprintln!(
            "{n} streams open: {memory_mb:.1} MB; holding them {} s",
            hold.as_secs()
        );
        tokio::time::sleep(hold).await;
    }
    drop(streams);
    Ok(IdleReport {
        sessions: n,
        setup_per_sec: n as f64 / setup.as_secs_f64(),
        memory_mb,
        processes,
    })
}
