//! The samples of a run: the gateway's RSS, descriptors, threads and children from /proc, the
//! machine's free memory and load, and the gateway's own metrics.

use std::path::Path;

use serde::{Deserialize, Serialize};

/// One reading of the gateway process.
#[derive(Debug, Default, Clone, Serialize, Deserialize)]
pub(super) struct Sample {
    pub(super) t_secs: u64,
    pub(super) rss_mb: f64,
    pub(super) fds: u64,
    pub(super) threads: u64,
    pub(super) children: u64,
    /// The resident memory of the gateway's descendants together.
    pub(super) children_rss_mb: f64,
    pub(super) sessions_open: u64,
    /// Checked answers and notifications per second since the previous sample.
    pub(super) calls_per_sec: f64,
    /// The gateway's CPU use since the previous sample, in percent of one core.
    pub(super) cpu_percent: f64,
    pub(super) mem_available_gb: f64,
    pub(super) load1: f64,
    /// From the gateway's /metrics.
    pub(super) replay_events: u64,
    pub(super) replay_mb: f64,
    pub(super) sse_streams: u64,
}

pub(super) fn status_field(status: &str, key: &str) -> Option<u64> {
    status
        .lines()
        .find(|l| l.starts_with(key))
        .and_then(|l| l.split_whitespace().nth(1)?.parse().ok())
}

pub(super) fn read_proc(pid: u32) -> (f64, u64, u64) {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    let rss = status_field(&status, "VmRSS:").unwrap_or(0) as f64 / 1024.0;
    let threads = status_field(&status, "Threads:").unwrap_or(0);
    let fds = std::fs::read_dir(format!("/proc/{pid}/fd")).map_or(0, |d| d.count() as u64);
    (rss, fds, threads)
}

pub(super) fn system() -> (f64, f64) {
    let mem = std::fs::read_to_string("/proc/meminfo").unwrap_or_default();
    let avail = status_field(&mem, "MemAvailable:").unwrap_or(0) as f64 / (1024.0 * 1024.0);
    let load = std::fs::read_to_string("/proc/loadavg")
        .ok()
        .and_then(|l| l.split_whitespace().next()?.parse().ok())
        .unwrap_or(0.0);
    (avail, load)
}

/// A metric's value (summed over its labels) from Prometheus text.
pub(super) fn metric(text: &str, name: &str) -> f64 {
    text.lines()
        .filter(|l| {
            l.strip_prefix(name)
                .is_some_and(|r| r.starts_with(' ') || r.starts_with('{'))
        })
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .fold(0.0, |a, b| a + b)
}

pub(super) async fn scrape(http: &reqwest::Client, admin: &str) -> String {
    match http.get(format!("{admin}/metrics")).send().await {
        Ok(r) => r.text().await.unwrap_or_default(),
        Err(_) => String::new(),
    }
}

/// Processes running the fixture binary (the soak's own build), wherever they are.
pub(super) fn fixture_processes(fixture: &Path) -> usize {
    std::fs::read_dir("/proc")
        .into_iter()
        .flatten()
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().parse::<u32>().is_ok())
        .filter(|e| std::fs::read_link(e.path().join("exe")).is_ok_and(|p| p == fixture))
        .count()
}
