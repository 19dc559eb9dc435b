//! (e): what resumable streams cost: the gateway with `--sse-resumable` on and off in paired
//! runs, in calls/s and in the gateway's CPU time per call.

use std::time::Duration;

use serde::Serialize;

use crate::harness::Target;
use crate::numbers::{median, percent, round1};
use crate::paired::{alternate, pair_run};

/// (e) for one scenario: calls/s of each run with resumable streams on and off, and the
/// gateway's own CPU time per call in each.
#[derive(Debug, Default, Serialize)]
pub(crate) struct ResumableCost {
    pub(crate) scenario: String,
    pub(crate) seconds_per_run: u64,
    pub(crate) on_calls_per_sec: Vec<f64>,
    pub(crate) off_calls_per_sec: Vec<f64>,
    pub(crate) median_on: f64,
    pub(crate) median_off: f64,
    /// Per pair of adjacent runs: how much lower calls/s was with resumable streams on, in
    /// percent of the run off.
    pub(crate) pair_cost_percent: Vec<f64>,
    /// The median of `pair_cost_percent`. Drift slower than a pair cancels out of each pair's
    /// figure, which it does not out of the ratio of the two sides' medians.
    pub(crate) cost_percent: f64,
    /// The gateway process's CPU time (user and system, from `/proc/PID/stat`) per call
    /// answered, in µs. It swings with the machine as well, though not always with calls/s.
    pub(crate) on_cpu_us_per_call: Vec<f64>,
    pub(crate) off_cpu_us_per_call: Vec<f64>,
    /// The median, over pairs, of how much more CPU time per call the run on took, in
    /// percent of the run off.
    pub(crate) cpu_cost_percent: f64,
    pub(crate) wrong: u64,
}

/// (e): the gateway with resumable streams on and off, in alternating pairs. The cost is the
/// median of the pairs' costs.
pub(crate) async fn resumable_cost(
    scenario: &str,
    sessions: usize,
    in_flight: usize,
    duration: Duration,
) -> ResumableCost {
    let run = pair_run(duration);
    let pairs = alternate(
        sessions,
        in_flight,
        run,
        || Target::gateway("mcp-gateway", &["--sse-resumable", "true"], None),
        || Target::gateway("mcp-gateway", &["--sse-resumable", "false"], None),
    )
    .await;
    let mut cost = ResumableCost {
        scenario: scenario.into(),
        seconds_per_run: run.as_secs(),
        ..Default::default()
    };
    let mut pair_cpu = Vec::new();
    for [on, off] in &pairs {
        cost.on_calls_per_sec
            .push(on.throughput.calls_per_sec.round());
        cost.off_calls_per_sec
            .push(off.throughput.calls_per_sec.round());
        cost.on_cpu_us_per_call.push(on.cpu_us_per_call);
        cost.off_cpu_us_per_call.push(off.cpu_us_per_call);
        cost.pair_cost_percent.push(percent(
            1.0 - on.throughput.calls_per_sec / off.throughput.calls_per_sec,
        ));
        pair_cpu.push(percent(on.cpu_us_per_call / off.cpu_us_per_call - 1.0));
        cost.wrong += on.throughput.wrong + off.throughput.wrong;
    }
    cost.median_on = median(&cost.on_calls_per_sec);
    cost.median_off = median(&cost.off_calls_per_sec);
    cost.cost_percent = round1(median(&cost.pair_cost_percent));
    cost.cpu_cost_percent = round1(median(&pair_cpu));
    eprintln!("(e) {scenario}: {cost:?}");
    cost
}
