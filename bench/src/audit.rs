//! The audit log's cost (issue 40): one gateway build with the audit log on (as by default)
//! against `[audit] enabled = false`, in alternating pairs of runs on fresh gateways, (a) and
//! (b); each pair's cost in calls/s and in the gateway's CPU per call, and the medians. The
//! gateways run with the bench's log settings, so the audit lines go to stderr and are read
//! (by this process) as a log collector would. Written to `audit.json` in `--out`; the row in
//! BENCHMARKS.md is written by hand from it.

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Serialize;

use crate::harness::Target;
use crate::numbers::median;
use crate::paired::{PAIRS, Run};

const ON: &str = "[audit]\nenabled = true\n\n[plugins.echo]\ncommand = \"ECHO\"\n";
const OFF: &str = "[audit]\nenabled = false\n\n[plugins.echo]\ncommand = \"ECHO\"\n";

#[derive(clap::Args, Debug)]
pub struct Options {
    /// Pairs of runs per scenario (rounded up to a multiple of 6).
    #[arg(long, default_value_t = 12)]
    pub pairs: usize,
    /// The gateway binary to measure (default: `mcp-gateway` beside this one).
    #[arg(long)]
    pub gateway: Option<PathBuf>,
}

#[derive(Debug, Default, Serialize)]
struct Scenario {
    scenario: String,
    on_calls_per_sec: Vec<f64>,
    off_calls_per_sec: Vec<f64>,
    on_cpu_us_per_call: Vec<f64>,
    off_cpu_us_per_call: Vec<f64>,
    /// Per pair: how much lower on's calls/s was, in percent of off's.
    calls_cost_percent: Vec<f64>,
    /// Per pair: how much more gateway CPU per call on took, in percent of off's.
    cpu_cost_percent: Vec<f64>,
    median_calls_cost_percent: f64,
    median_cpu_cost_percent: f64,
    wrong: u64,
}

#[derive(Debug, Default, Serialize)]
struct Report {
    date: String,
    commit: String,
    seconds_per_run: u64,
    load_before: String,
    load_after: String,
    scenarios: Vec<Scenario>,
}

/// `mcp-bench audit`: measures, prints the JSON and writes `audit.json` in `out`.
pub async fn main(opts: Options, duration: Duration, out: &Path) {
    crate::procfs::raise_fd_limit();
    let gateway = opts
        .gateway
        .clone()
        .unwrap_or_else(|| crate::harness::sibling("mcp-gateway"));
    let run = crate::paired::pair_run(duration);
    let mut r = Report {
        date: crate::report::date(),
        commit: crate::report::commit_excluding(&["BENCHMARKS.md", "bench/results/"]),
        seconds_per_run: run.as_secs(),
        load_before: crate::procfs::loadavg(),
        ..Default::default()
    };
    for (scenario, sessions, in_flight) in [
        ("(a) 1 session ×16", 1, 16),
        ("(b) 64 sessions ×64", 64, 64),
    ] {
        let mut s = Scenario {
            scenario: scenario.into(),
            ..Default::default()
        };
        for _ in 0..opts.pairs.div_ceil(PAIRS) {
            let pairs: Vec<[Run; 2]> = crate::paired::alternate(
                sessions,
                in_flight,
                run,
                || start(&gateway, ON),
                || start(&gateway, OFF),
            )
            .await;
            for [on, off] in &pairs {
                let (on_calls, off_calls) =
                    (on.throughput.calls_per_sec, off.throughput.calls_per_sec);
                s.on_calls_per_sec.push(on_calls.round());
                s.off_calls_per_sec.push(off_calls.round());
                s.on_cpu_us_per_call.push(on.cpu_us_per_call);
                s.off_cpu_us_per_call.push(off.cpu_us_per_call);
                s.calls_cost_percent
                    .push(round1(100.0 * (off_calls - on_calls) / off_calls));
                s.cpu_cost_percent.push(round1(
                    100.0 * (on.cpu_us_per_call - off.cpu_us_per_call) / off.cpu_us_per_call,
                ));
                s.wrong += on.throughput.wrong + off.throughput.wrong;
                eprintln!(
                    "audit {scenario}: on {on_calls:.0} calls/s {} µs, off {off_calls:.0} calls/s {} µs",
                    on.cpu_us_per_call, off.cpu_us_per_call
                );
            }
        }
        s.median_calls_cost_percent = round1(median(&s.calls_cost_percent));
        s.median_cpu_cost_percent = round1(median(&s.cpu_cost_percent));
        r.scenarios.push(s);
    }
    r.load_after = crate::procfs::loadavg();
    let json = serde_json::to_string_pretty(&r).expect("serializable");
    println!("{json}");
    std::fs::create_dir_all(out).expect("results directory");
    std::fs::write(out.join("audit.json"), json + "\n").expect("audit.json");
}

/// A fresh gateway in front of the echo plugin with `config`.
async fn start(gateway: &Path, config: &'static str) -> Target {
    Target::gateway_at(gateway, "mcp-gateway", &[], Some(config)).await
}

fn round1(x: f64) -> f64 {
    (x * 10.0).round() / 10.0
}
