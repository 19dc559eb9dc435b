//! The full run's report: `bench/results/latest.json`, and the main part of BENCHMARKS.md (the
//! table of targets, the ceiling shares, (e)), followed by the hand-kept notes in
//! `bench/NOTES.md`.

use serde::Serialize;

use crate::cluster;
use crate::load::Throughput;
use crate::numbers::list;
use crate::scenarios::{CeilingShare, IdleReport, Latency, ResumableCost};

#[derive(Debug, Default, Serialize)]
pub(crate) struct Report {
    pub(crate) date: String,
    pub(crate) cores: usize,
    pub(crate) duration_secs: u64,
    pub(crate) targets: Vec<TargetReport>,
    pub(crate) ceiling_share: Vec<CeilingShare>,
    pub(crate) e_resumable_cost: Vec<ResumableCost>,
    pub(crate) cluster: Option<cluster::Report>,
}

#[derive(Debug, Default, Serialize)]
pub(crate) struct TargetReport {
    pub(crate) name: String,
    pub(crate) a_one_session_16: Option<Throughput>,
    pub(crate) b_64_sessions_64: Option<Throughput>,
    pub(crate) c_idle_sessions: Vec<IdleReport>,
    pub(crate) d: Option<Latency>,
    pub(crate) notes: Vec<String>,
}

pub(crate) fn markdown(r: &Report) -> String {
    let f = |t: &Option<Throughput>| {
        t.as_ref().map_or("–".into(), |t| {
            let wrong = if t.wrong > 0 {
                format!(", {} wrong", t.wrong)
            } else {
                String::new()
            };
            format!(
                "{:.0} (p50 {:.2} ms, p99 {:.2} ms{wrong})",
                t.calls_per_sec, t.p50_ms, t.p99_ms
            )
        })
    };
    let mut out = format!(
        "# Benchmarks\n\nMeasured by `mcp-bench` (bench/) on {} with {} cores, {} s per throughput scenario, echo plugin, 64-byte payloads. \
         Raw numbers: `bench/results/latest.json`. Reproduce: `scripts/bench`.\n\n\
         | target | (a) calls/s, 1 session ×16 | (b) calls/s, 64 sessions ×64 | (c) idle sessions with GET streams | (d) initialize p50 | (d) initialize + initialized p50 | (d) initialize + first call p50 |\n|---|---|---|---|---|---|---|\n",
        r.date, r.cores, r.duration_secs
    );
    for t in &r.targets {
        let idle = t
            .c_idle_sessions
            .iter()
            .map(|i| {
                format!(
                    "{}: {:.0} MB, {} processes, {:.0}/s setup",
                    i.sessions, i.memory_mb, i.processes, i.setup_per_sec
                )
            })
            .collect::<Vec<_>>()
            .join("; ");
        let ms = |v: Option<f64>| v.map_or("–".into(), |v| format!("{v:.2} ms"));
        let d = t.d.as_ref();
        out.push_str(&format!(
            "| {} | {} | {} | {} | {} | {} | {} |\n",
            t.name,
            f(&t.a_one_session_16),
            f(&t.b_64_sessions_64),
            if idle.is_empty() { "–".into() } else { idle },
            ms(d.map(|d| d.initialize_p50_ms)),
            ms(d.map(|d| d.handshake_p50_ms)),
            ms(d.map(|d| d.first_call_p50_ms)),
        ));
    }
    for t in r.targets.iter().filter(|t| !t.notes.is_empty()) {
        out.push_str(&format!("\n{}: {}\n", t.name, t.notes.join("; ")));
    }
    if !r.ceiling_share.is_empty() {
        out.push_str(
            "\nThe gateway against the in-process ceiling in alternating pairs of runs (ceiling \
             and gateway in turn, each on a fresh process), so that both meet the same machine: \
             the medians of each pair's own ratios. The targets' shares of the ceiling are read \
             from here; the table above runs the two minutes apart.\n\n\
             | scenario | runs | gateway, calls/s | ceiling, calls/s | share per pair | share | \
             p99 ratio per pair | p99 ratio | wrong |\n\
             |---|---|---|---|---|---|---|---|---|\n",
        );
        for c in &r.ceiling_share {
            out.push_str(&format!(
                "| {} | {} × {} s | {} | {} | {} | **{:.1}%** | {} | **{:.2}×** | {} |\n",
                c.scenario,
                c.gateway_calls_per_sec.len() + c.ceiling_calls_per_sec.len(),
                c.seconds_per_run,
                list(&c.gateway_calls_per_sec, 0),
                list(&c.ceiling_calls_per_sec, 0),
                list(&c.pair_share_percent, 1),
                c.share_percent,
                list(&c.pair_p99_ratio, 2),
                c.p99_ratio,
                c.wrong,
            ));
        }
    }
    if !r.e_resumable_cost.is_empty() {
        out.push_str(
            "\n(e) The cost of resumable streams: the gateway with `--sse-resumable` on and off, \
             each run on a fresh gateway, in alternating pairs (on-off, off-on, ...). The cost \
             is the median over pairs of each pair's own cost, so that drift slower than a pair \
             cancels out. The gateway's CPU time per call (user and system, from \
             `/proc/PID/stat`) is a second view; it swings with the machine too.\n\n\
             | scenario | runs | resumable on, calls/s | off, calls/s | cost per pair | cost | \
             CPU µs per call, on | off | CPU cost | wrong |\n\
             |---|---|---|---|---|---|---|---|---|---|\n",
        );
        for e in &r.e_resumable_cost {
            out.push_str(&format!(
                "| {} | {} × {} s | {:.0} ({}) | {:.0} ({}) | {} | **{:.1}%** | {} | {} | **{:.1}%** | {} |\n",
                e.scenario,
                e.on_calls_per_sec.len() + e.off_calls_per_sec.len(),
                e.seconds_per_run,
                e.median_on,
                list(&e.on_calls_per_sec, 0),
                e.median_off,
                list(&e.off_calls_per_sec, 0),
                list(&e.pair_cost_percent, 1),
                e.cost_percent,
                list(&e.on_cpu_us_per_call, 1),
                list(&e.off_cpu_us_per_call, 1),
                e.cpu_cost_percent,
                e.wrong,
            ));
        }
    }
    // The hand-kept record of what was changed and what it gained.
    if let Ok(notes) = std::fs::read_to_string("bench/NOTES.md") {
        out.push_str(&notes);
    }
    out
}
