//! The gateway against the in-process ceiling in paired runs: its share of the ceiling's calls/s
//! and its p99 over the ceiling's, in (a) and (b).

use std::time::Duration;

use serde::Serialize;

use crate::harness::Target;
use crate::numbers::{median, percent, round1};
use crate::paired::{alternate, pair_run};

/// (a) or (b): the gateway against the in-process ceiling in alternating pairs of runs, each
/// on a fresh process. The targets' "≥ 60% of the ceiling" and "p99 ≤ 2× the ceiling's" are
/// judged from these, since the main table's runs of the two are minutes apart.
#[derive(Debug, Default, Serialize)]
pub(crate) struct CeilingShare {
    pub(crate) scenario: String,
    pub(crate) seconds_per_run: u64,
    pub(crate) gateway_calls_per_sec: Vec<f64>,
    pub(crate) ceiling_calls_per_sec: Vec<f64>,
    /// The gateway process's own CPU time per call, in µs (its plugin processes not counted).
    pub(crate) gateway_cpu_us_per_call: Vec<f64>,
    pub(crate) ceiling_cpu_us_per_call: Vec<f64>,
    /// Per pair: the gateway's calls/s in percent of the ceiling's.
    pub(crate) pair_share_percent: Vec<f64>,
    /// The median of `pair_share_percent`.
    pub(crate) share_percent: f64,
    /// Per pair: the gateway's p99 latency over the ceiling's.
    pub(crate) pair_p99_ratio: Vec<f64>,
    /// The median of `pair_p99_ratio`.
    pub(crate) p99_ratio: f64,
    pub(crate) wrong: u64,
}

/// The gateway against the in-process ceiling, in alternating pairs.
pub(crate) async fn ceiling_share(
    scenario: &str,
    sessions: usize,
    in_flight: usize,
    duration: Duration,
    config: Option<&str>,
) -> CeilingShare {
    let run = pair_run(duration);
    let pairs = alternate(
        sessions,
        in_flight,
        run,
        || Target::gateway("mcp-gateway", &[], config),
        Target::inproc,
    )
    .await;
    let mut share = CeilingShare {
        scenario: scenario.into(),
        seconds_per_run: run.as_secs(),
        ..Default::default()
    };
    for [gateway, ceiling] in &pairs {
        let (g, c) = (&gateway.throughput, &ceiling.throughput);
        share.gateway_calls_per_sec.push(g.calls_per_sec.round());
        share.ceiling_calls_per_sec.push(c.calls_per_sec.round());
        share.gateway_cpu_us_per_call.push(gateway.cpu_us_per_call);
        share.ceiling_cpu_us_per_call.push(ceiling.cpu_us_per_call);
        share
            .pair_share_percent
            .push(percent(g.calls_per_sec / c.calls_per_sec));
        share
            .pair_p99_ratio
            .push((100.0 * g.p99_ms / c.p99_ms).round() / 100.0);
        share.wrong += g.wrong + c.wrong;
    }
    share.share_percent = round1(median(&share.pair_share_percent));
    share.p99_ratio = (100.0 * median(&share.pair_p99_ratio)).round() / 100.0;
    eprintln!("ceiling share {scenario}: {share:?}");
    share
}
