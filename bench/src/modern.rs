//! `mcp-bench modern`: the modern era (2026-07-28, issue 22) beside the legacy one, on the same
//! gateway build, in alternating pairs of runs on fresh gateway processes.
//!
//! A modern client has no session: every request carries the protocol version, its client info
//! and the capabilities it declares in `_meta`, and the headers that mirror the body
//! (`MCP-Protocol-Version`, `Mcp-Method`, `Mcp-Name`). Two comparisons:
//!
//! - Scenario (a): 16 calls of `echo` in flight with no session, against the legacy (a), one
//!   session with 16 in flight. Every answer checked as the legacy (a) checks it (one answer
//!   to the call's id with the call's text), and for the modern client also that it is a
//!   `complete` result and that no session was minted.
//! - The round trip of a plugin asking its client for input mid-call (the echo plugin's `ask`
//!   tool sends `elicitation/create` the legacy way). Modern: the call gets an
//!   `InputRequiredResult`, the client retries at once with `inputResponses` and the
//!   `requestState`, and gets the result (multi round-trip requests, the gateway's bridge).
//!   Legacy: the call's POST answers with an SSE stream, the elicitation arrives on it, the
//!   client POSTs its answer, and the result arrives on the stream. The whole exchange is
//!   timed, one at a time and 16 in flight; the client answers each question with a text made
//!   from the question's own, and a call's result must be the answer to the question its own
//!   text made. Stdio carries no link from a plugin's request to the call that caused it, so
//!   with several calls in flight on one plugin instance the gateway puts a question on the
//!   newest call's stream (legacy) or into its `InputRequiredResult` (modern); the clients
//!   answer whatever they are asked, as real ones would, and such questions are counted.
//!   The same round trip, one at a time, with the plugin's `sample` tool, which asks with
//!   `sampling/createMessage` instead.
//!
//! Raw numbers go to `bench/results/modern.json`, the tables to the "Modern era (2026-07-28)"
//! section of BENCHMARKS.md, followed by the hand-kept reading in `bench/NOTES-modern.md`.
//!
//! Here: the options, the report and the comparisons; the modern client and (a) driven by it
//! are in [`client`], the round trips in [`ask`], the section in [`report`].

mod ask;
mod client;
mod report;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use hdrhistogram::Histogram;
use serde::{Deserialize, Serialize};

use crate::harness::Target;
use crate::numbers::{median, percent, round1};
use crate::paired::{PAIRS, Run};
use ask::{Client, Question, ask_load};
use client::{Tally, modern_echo_load};
use report::markdown;

pub use client::echo_load;

/// The heading of the section this writes in BENCHMARKS.md.
pub const SECTION: &str = "## Modern era (2026-07-28)";

/// The protocol version a modern client declares.
const MODERN: &str = "2026-07-28";
/// The legacy version of the sessions in the round trip (the latest legacy one, whose
/// elicitation is the modern one's).
const LEGACY: &str = "2025-11-25";
/// Calls in flight in (a) and in the loaded round trip.
const IN_FLIGHT: usize = 16;

/// What `mcp-bench modern` runs.
#[derive(clap::Args, Debug, Clone, Default)]
pub struct Options {
    /// The gateway binary to measure (default: `mcp-gateway` beside this one).
    #[arg(long)]
    pub gateway: Option<PathBuf>,
    /// Measure nothing: write the section of BENCHMARKS.md again from `modern.json` in
    /// `--out` (after an edit of bench/NOTES-modern.md).
    #[arg(long)]
    pub rewrite: bool,
}

#[derive(Debug, Default, Serialize, Deserialize)]
pub struct Report {
    pub date: String,
    pub commit: String,
    /// The gateway binary, when it was not the one beside `mcp-bench`.
    pub gateway: Option<String>,
    pub cores: usize,
    pub seconds_per_run: u64,
    /// `/proc/loadavg` before and after.
    pub load_before: String,
    pub load_after: String,
    pub comparisons: Vec<Comparison>,
}

/// One workload, driven by a modern client and by a legacy session in alternating pairs of
/// runs, each on a fresh gateway.
#[derive(Debug, Default, Serialize, Deserialize)]
pub struct Comparison {
    pub scenario: String,
    pub in_flight: usize,
    pub seconds_per_run: u64,
    /// Calls (or whole exchanges) answered right per second, one figure per run.
    pub modern_calls_per_sec: Vec<f64>,
    pub legacy_calls_per_sec: Vec<f64>,
    pub modern_p50_ms: Vec<f64>,
    pub modern_p99_ms: Vec<f64>,
    pub legacy_p50_ms: Vec<f64>,
    pub legacy_p99_ms: Vec<f64>,
    /// The gateway process's own CPU time per call (or exchange), in µs.
    pub modern_cpu_us_per_call: Vec<f64>,
    pub legacy_cpu_us_per_call: Vec<f64>,
    /// The load generator's CPU time per call (or exchange), in µs: it shares the cores.
    pub modern_client_cpu_us_per_call: Vec<f64>,
    pub legacy_client_cpu_us_per_call: Vec<f64>,
    /// Per pair: the modern runs' calls/s in percent of the legacy run's.
    pub pair_ratio_percent: Vec<f64>,
    /// The median of `pair_ratio_percent`.
    pub ratio_percent: f64,
    /// Medians over runs.
    pub median_modern_calls_per_sec: f64,
    pub median_legacy_calls_per_sec: f64,
    pub median_modern_p50_ms: f64,
    pub median_modern_p99_ms: f64,
    pub median_legacy_p50_ms: f64,
    pub median_legacy_p99_ms: f64,
    pub modern_wrong: u64,
    pub legacy_wrong: u64,
    /// What the wrong answers were, by side and cause.
    pub wrong_causes: BTreeMap<String, u64>,
    /// Round trip only, over every run (warm-up calls and calls still running at a run's end
    /// included): the calls made, the HTTP requests they took (modern: the call and its
    /// retries; legacy: the call and the answers' POSTs), the plugin's questions the clients
    /// answered, and of those, how many came to a call other than the one that caused them.
    pub modern_calls: u64,
    pub modern_requests: u64,
    pub modern_questions: u64,
    pub modern_foreign_questions: u64,
    pub legacy_calls: u64,
    pub legacy_requests: u64,
    pub legacy_questions: u64,
    pub legacy_foreign_questions: u64,
    /// Round trip only: the two legs of a call that was asked its own question once, p50 over
    /// all runs, in ms. Modern: the call until its `InputRequiredResult`, then the retry until
    /// the result. Legacy: the call until the question arrives on its stream, then until the
    /// result does (the answer's POST included).
    pub modern_legs_p50_ms: [f64; 2],
    pub legacy_legs_p50_ms: [f64; 2],
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Workload {
    /// `echo` with a 64-byte text.
    Echo,
    /// A question from the plugin mid-call, answered, then the result.
    Ask(Question),
}

/// `mcp-bench modern`: measures, prints the JSON, writes `modern.json` in `out` and the
/// section of BENCHMARKS.md.
pub async fn main(opts: Options, duration: Duration, out: &Path) {
    if opts.rewrite {
        let r: Report = crate::report::read_report(&out.join("modern.json"));
        return write(&r, out);
    }
    crate::procfs::raise_fd_limit();
    let r = measure(&opts, duration).await;
    let json = serde_json::to_string_pretty(&r).expect("serializable");
    println!("{json}");
    if std::env::var_os("MCP_BENCH_ONLY").is_some() {
        eprintln!("modern: some scenarios only (MCP_BENCH_ONLY); nothing written");
        return;
    }
    write(&r, out);
}

/// Writes `modern.json` in `out` and the section of BENCHMARKS.md.
pub fn write(r: &Report, out: &Path) {
    crate::report::write_report(r, &out.join("modern.json"), SECTION, &markdown(r));
}

/// Runs the four comparisons, each run lasting half of `duration` (as the paired runs of the
/// full run do).
pub async fn measure(opts: &Options, duration: Duration) -> Report {
    let run = crate::paired::pair_run(duration);
    let gateway = opts
        .gateway
        .clone()
        .unwrap_or_else(|| crate::harness::sibling("mcp-gateway"));
    let mut r = Report {
        date: crate::report::date(),
        commit: crate::report::commit_excluding(&["BENCHMARKS.md", "bench/results/"]),
        gateway: opts.gateway.as_ref().map(|p| p.display().to_string()),
        cores: std::thread::available_parallelism().map_or(1, |n| n.get()),
        seconds_per_run: run.as_secs(),
        load_before: crate::procfs::loadavg(),
        ..Default::default()
    };
    for (scenario, workload, in_flight) in [
        ("(a) echo, 16 in flight", Workload::Echo, IN_FLIGHT),
        (
            "input round trip, one at a time",
            Workload::Ask(Question::Elicit),
            1,
        ),
        (
            "input round trip, 16 in flight",
            Workload::Ask(Question::Elicit),
            IN_FLIGHT,
        ),
        (
            "sampling round trip, one at a time",
            Workload::Ask(Question::Sample),
            1,
        ),
    ] {
        // For a diagnosis: MCP_BENCH_ONLY=TEXT runs the scenarios whose name holds TEXT.
        if let Ok(only) = std::env::var("MCP_BENCH_ONLY")
            && !scenario.contains(&only)
        {
            continue;
        }
        eprintln!("modern: {scenario}");
        let c = compare(scenario, workload, in_flight, run, &gateway).await;
        eprintln!(
            "  modern {:.0}/s p50 {:.2} ms p99 {:.2} ms; legacy {:.0}/s p50 {:.2} ms p99 {:.2} ms; \
             modern/legacy {:.1}%; wrong {} / {}",
            c.median_modern_calls_per_sec,
            c.median_modern_p50_ms,
            c.median_modern_p99_ms,
            c.median_legacy_calls_per_sec,
            c.median_legacy_p50_ms,
            c.median_legacy_p99_ms,
            c.ratio_percent,
            c.modern_wrong,
            c.legacy_wrong,
        );
        r.comparisons.push(c);
    }
    r.load_after = crate::procfs::loadavg();
    r
}

/// The modern client (A) against the legacy session (B) on `workload`, in alternating pairs.
async fn compare(
    scenario: &str,
    workload: Workload,
    in_flight: usize,
    run: Duration,
    gateway: &Path,
) -> Comparison {
    let tally = Arc::new(Tally::default());
    let start = || Target::gateway_at(gateway, "mcp-gateway", &[], None);
    let pairs: Vec<[Run; 2]> = crate::paired::alternate_with(start, start, async |side, url| {
        let tally = tally.clone();
        match (workload, side) {
            (Workload::Echo, 0) => modern_echo_load(&url, in_flight, run, tally).await,
            (Workload::Echo, _) => crate::load::http_load(&url, None, 1, in_flight, run).await,
            (Workload::Ask(q), 0) => ask_load(Client::Modern, q, &url, in_flight, run, tally).await,
            (Workload::Ask(q), _) => ask_load(Client::Legacy, q, &url, in_flight, run, tally).await,
        }
    })
    .await;
    let mut c = Comparison {
        scenario: scenario.into(),
        in_flight,
        seconds_per_run: run.as_secs(),
        ..Default::default()
    };
    for [modern, legacy] in &pairs {
        let (m, l) = (&modern.throughput, &legacy.throughput);
        c.modern_calls_per_sec.push(m.calls_per_sec.round());
        c.legacy_calls_per_sec.push(l.calls_per_sec.round());
        c.modern_p50_ms.push(m.p50_ms);
        c.modern_p99_ms.push(m.p99_ms);
        c.legacy_p50_ms.push(l.p50_ms);
        c.legacy_p99_ms.push(l.p99_ms);
        c.modern_cpu_us_per_call.push(modern.cpu_us_per_call);
        c.legacy_cpu_us_per_call.push(legacy.cpu_us_per_call);
        c.modern_client_cpu_us_per_call
            .push(modern.client_cpu_us_per_call);
        c.legacy_client_cpu_us_per_call
            .push(legacy.client_cpu_us_per_call);
        c.pair_ratio_percent.push(percent(
            m.calls_per_sec / l.calls_per_sec.max(f64::MIN_POSITIVE),
        ));
        c.modern_wrong += m.wrong;
        c.legacy_wrong += l.wrong;
    }
    debug_assert_eq!(pairs.len(), PAIRS);
    c.ratio_percent = round1(median(&c.pair_ratio_percent));
    c.median_modern_calls_per_sec = median(&c.modern_calls_per_sec);
    c.median_legacy_calls_per_sec = median(&c.legacy_calls_per_sec);
    c.median_modern_p50_ms = median(&c.modern_p50_ms);
    c.median_modern_p99_ms = median(&c.modern_p99_ms);
    c.median_legacy_p50_ms = median(&c.legacy_p50_ms);
    c.median_legacy_p99_ms = median(&c.legacy_p99_ms);
    c.wrong_causes = std::mem::take(&mut *tally.causes.lock().expect("lock"));
    let n = |a: &AtomicU64| a.load(Ordering::Relaxed);
    if matches!(workload, Workload::Ask(_)) {
        c.modern_calls = n(&tally.calls[0]);
        c.modern_requests = n(&tally.requests[0]);
        c.modern_questions = n(&tally.questions[0]);
        c.modern_foreign_questions = n(&tally.foreign[0]);
        c.legacy_calls = n(&tally.calls[1]);
        c.legacy_requests = n(&tally.requests[1]);
        c.legacy_questions = n(&tally.questions[1]);
        c.legacy_foreign_questions = n(&tally.foreign[1]);
        let legs = tally.legs.lock().expect("lock");
        let p50 = |h: &Histogram<u64>| h.value_at_quantile(0.5) as f64 / 1000.0;
        c.modern_legs_p50_ms = [p50(&legs[0][0]), p50(&legs[0][1])];
        c.legacy_legs_p50_ms = [p50(&legs[1][0]), p50(&legs[1][1])];
    }
    c
}
