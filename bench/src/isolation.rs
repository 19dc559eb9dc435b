//! `mcp-bench isolation`: what the plugin sandbox (issue 39) costs. The same gateway binary
//! with its plugin's sandbox on (the default) and with `sandbox = false`, in alternating
//! pairs of runs (on-off, off-on, ...), every run on a fresh gateway with the echo plugin
//! behind it and a plugin process per session (the default process model).
//!
//! - Start-up: new sessions one after another, each with a cold plugin process (a
//!   per-session plugin is started by the session's first call). Each session is timed from
//!   its `initialize` until the answer to its first `tools/call` (the handshake's
//!   `notifications/initialized` in between, as in (d)), and then makes a second call: the
//!   first call less the second, warm one is what starting the process took (the spawn, the
//!   sandbox, the plugin's own start and its `initialize`). After its DELETE the next session
//!   waits, untimed, until the plugin process is gone, so no start is timed against a stop.
//!   p50 and p99 per run; the gateway's CPU time per session (start and stop) and its reaped
//!   children's (the plugin, and with the sandbox the child's set-up before `exec`), from
//!   `/proc/PID/stat`. With the sandbox on the gateway forks for each start (a `pre_exec`
//!   hook), where without it spawning takes `posix_spawn`: the cost includes that.
//! - Throughput: (a) and (b), as the paired runs of the full run measure them.
//!
//! The target: the sandbox costs at most 5 ms per process start at p50, and (a) and (b) stay
//! the same within the noise. Raw numbers go to `bench/results/isolation.json`, the table to
//! the "Isolation" section of BENCHMARKS.md, followed by the hand-kept reading in
//! `bench/NOTES-isolation.md`.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;
use serde::{Deserialize, Serialize};

use crate::harness::Target;
use crate::numbers::{list, median, percent, round1};
use crate::paired::{PAIRS, Run};

/// The heading of the section this writes in BENCHMARKS.md.
pub const SECTION: &str = "## Isolation";

/// The gateway's configuration, the plugin's sandbox on (by default) and off; both sides
/// read a config file, so that the sandbox is all that differs.
const SANDBOX_ON: &str = "[plugins.echo]\ncommand = \"ECHO\"\n";
const SANDBOX_OFF: &str = "[plugins.echo]\ncommand = \"ECHO\"\nsandbox = false\n";

/// The target: the sandbox's cost per process start at p50, in ms.
const TARGET_MS: f64 = 5.0;

/// Untimed sessions at the start of each start-up run: the registry's probe of the plugin,
/// the first connection, the sandbox's one-time set-up (its directories, its cgroups).
const WARM_UP: usize = 5;

/// What `mcp-bench isolation` runs.
#[derive(clap::Args, Debug, Clone)]
pub struct Options {
    /// Cold plugin processes started (sessions) per start-up run.
    #[arg(long, default_value_t = 300)]
    pub starts: usize,
    /// The start-up measurement alone: no throughput runs, and only its JSON is written out
    /// (to stdout; BENCHMARKS.md and `isolation.json` are left as they are).
    #[arg(long)]
    pub startup_only: bool,
    /// The gateway binary to measure (default: `mcp-gateway` beside this one).
    #[arg(long)]
    pub gateway: Option<PathBuf>,
    /// Measure nothing: write the section of BENCHMARKS.md again from `isolation.json` in
    /// `--out` (after an edit of bench/NOTES-isolation.md).
    #[arg(long)]
    pub rewrite: bool,
}

impl Options {
    /// Everything, as the full run does it.
    pub fn full() -> Options {
        Options {
            starts: 300,
            startup_only: false,
            gateway: None,
            rewrite: false,
        }
    }
}

#[derive(Debug, Default, Serialize, Deserialize)]
pub struct Report {
    pub date: String,
    pub commit: String,
    /// The gateway binary, when it was not the one beside `mcp-bench`.
    pub gateway: Option<String>,
    pub cores: usize,
    /// `/proc/loadavg` before and after.
    pub load_before: String,
    pub load_after: String,
    /// What the gateway's probe says this machine lets a sandbox enforce (its log line).
    pub machine: String,
    pub starts_per_run: usize,
    /// Per pair, the start-up runs as `[on, off]`.
    pub startup: Vec<[StartRun; 2]>,
    pub seconds_per_run: u64,
    /// The throughput scenarios, each in pairs of runs.
    pub throughput: Vec<ThroughputPairs>,
    /// The comparison, one row per measure.
    pub rows: Vec<Row>,
}

/// One start-up run: `starts_per_run` sessions, each starting a plugin process.
#[derive(Debug, Default, Serialize, Deserialize, Clone)]
pub struct StartRun {
    /// From the `initialize` request until the first call's answer.
    pub first_call_p50_ms: f64,
    pub first_call_p99_ms: f64,
    /// The first call alone (it starts the process).
    pub call_p50_ms: f64,
    pub call_p99_ms: f64,
    /// The session's second call (its process running).
    pub second_call_p50_ms: f64,
    /// Per session, the first call less the second: starting the process.
    pub start_p50_ms: f64,
    pub start_p99_ms: f64,
    /// The gateway process's CPU time per session (the process's start and stop included).
    pub gateway_cpu_us_per_start: f64,
    /// CPU time of the gateway's reaped children per session: the plugin process, and what
    /// its child did before `exec`.
    pub plugin_cpu_us_per_start: f64,
    /// Sessions that failed (not timed).
    pub failed: u64,
}

/// (a) or (b), on and off, in pairs of runs.
#[derive(Debug, Default, Serialize, Deserialize)]
pub struct ThroughputPairs {
    pub scenario: String,
    pub on_calls_per_sec: Vec<f64>,
    pub off_calls_per_sec: Vec<f64>,
    pub on_p99_ms: Vec<f64>,
    pub off_p99_ms: Vec<f64>,
    pub on_cpu_us_per_call: Vec<f64>,
    pub off_cpu_us_per_call: Vec<f64>,
    pub wrong: u64,
}

/// One measure, on and off: its figure in each run, each pair's cost (for a time, on less
/// off; for calls/s, how much lower on was, in percent of off) and the median of those.
#[derive(Debug, Default, Serialize, Deserialize)]
pub struct Row {
    pub measure: String,
    /// How many runs, and of what.
    pub runs: String,
    /// The unit of `on`, `off` and `pair_cost`/`cost`.
    pub unit: String,
    pub cost_unit: String,
    pub on: Vec<f64>,
    pub off: Vec<f64>,
    pub pair_cost: Vec<f64>,
    pub cost: f64,
}

/// `mcp-bench isolation`: measures, prints the JSON, writes `isolation.json` in `out` and
/// the section of BENCHMARKS.md.
pub async fn main(opts: Options, duration: Duration, out: &Path) {
    if opts.rewrite {
        let r: Report = crate::report::read_report(&out.join("isolation.json"));
        return write(&r, out);
    }
    crate::procfs::raise_fd_limit();
    let r = measure(&opts, duration).await;
    println!(
        "{}",
        serde_json::to_string_pretty(&r).expect("serializable")
    );
    if !opts.startup_only {
        write(&r, out);
    }
}

/// Writes `isolation.json` in `out` and the section of BENCHMARKS.md.
pub fn write(r: &Report, out: &Path) {
    crate::report::write_report(r, &out.join("isolation.json"), SECTION, &markdown(r));
}

/// The start-up pairs, then (unless `startup_only`) (a) and (b) in pairs of runs lasting
/// half of `duration` each.
pub async fn measure(opts: &Options, duration: Duration) -> Report {
    let gateway = opts
        .gateway
        .clone()
        .unwrap_or_else(|| crate::harness::sibling("mcp-gateway"));
    let run = crate::paired::pair_run(duration);
    let mut r = Report {
        date: crate::report::date(),
        commit: crate::report::commit_excluding(&["BENCHMARKS.md", "bench/results/"]),
        gateway: opts.gateway.as_ref().map(|p| p.display().to_string()),
        cores: std::thread::available_parallelism().map_or(1, |n| n.get()),
        load_before: crate::procfs::loadavg(),
        starts_per_run: opts.starts,
        seconds_per_run: run.as_secs(),
        ..Default::default()
    };
    r.machine = machine(&start(&gateway, SANDBOX_ON).await.head);
    eprintln!("isolation: this machine offers {}", r.machine);
    r.startup = startup_pairs(&gateway, opts.starts).await;
    if !opts.startup_only {
        for (scenario, sessions, in_flight) in [
            ("(a) 1 session ×16", 1, 16),
            ("(b) 64 sessions ×64", 64, 64),
        ] {
            eprintln!("isolation: {scenario}");
            r.throughput
                .push(throughput_pairs(&gateway, scenario, sessions, in_flight, run).await);
        }
    }
    r.load_after = crate::procfs::loadavg();
    r.rows = rows(&r);
    for row in &r.rows {
        eprintln!(
            "  {}: on {:?} off {:?} cost per pair {:?}: {} {}",
            row.measure, row.on, row.off, row.pair_cost, row.cost, row.cost_unit
        );
    }
    r
}

/// A fresh gateway in front of the echo plugin with `config`.
async fn start(gateway: &Path, config: &'static str) -> Target {
    Target::gateway_at(gateway, "mcp-gateway", &[], Some(config)).await
}

/// The gateway's account of what this machine lets a sandbox enforce: the fields of its
/// probe's line in `head`, its start-up log.
fn machine(head: &[String]) -> String {
    const SAID: &str = "what this machine offers";
    head.iter()
        .find_map(|l| {
            l.split_once(SAID)
                .map(|(_, fields)| fields.trim().to_owned())
        })
        .unwrap_or_else(|| "unknown (the gateway did not log its sandbox probe)".into())
}

/// [`PAIRS`] pairs of start-up runs, sandbox on and off in turn (on-off, off-on, ...), each
/// on a fresh gateway. Returns each pair's runs as `[on, off]`.
async fn startup_pairs(gateway: &Path, starts: usize) -> Vec<[StartRun; 2]> {
    let mut out = Vec::with_capacity(PAIRS);
    for pair in 0..PAIRS {
        let mut runs: [StartRun; 2] = Default::default();
        let order = if pair % 2 == 0 { [0, 1] } else { [1, 0] };
        for side in order {
            let config = [SANDBOX_ON, SANDBOX_OFF][side];
            let target = start(gateway, config).await;
            runs[side] = startup_run(&target, starts).await;
            eprintln!(
                "isolation: start-up, sandbox {}: {:?}",
                ["on", "off"][side],
                runs[side]
            );
        }
        out.push(runs);
    }
    out
}

/// `starts` sessions one after another on `target`, each starting a plugin process with its
/// first call; a few untimed ones first.
async fn startup_run(target: &Target, starts: usize) -> StartRun {
    let http = crate::mcp::client();
    let pid = target.pid();
    for i in 0..WARM_UP {
        let _ = alone(&http, &target.url, pid, i).await;
    }
    let new = || Histogram::<u64>::new(3).expect("histogram");
    let (mut first, mut call, mut second, mut started) = (new(), new(), new(), new());
    let mut failed = 0;
    let (cpu, children) = (
        crate::procfs::cpu_seconds(pid),
        crate::procfs::children_cpu_seconds(pid),
    );
    for i in 0..starts {
        match alone(&http, &target.url, pid, WARM_UP + i).await {
            Ok(t) => {
                first.record(t.initialize_to_first).expect("in range");
                call.record(t.first).expect("in range");
                second.record(t.second).expect("in range");
                started
                    .record(t.first.saturating_sub(t.second))
                    .expect("in range");
            }
            Err(e) => {
                failed += 1;
                eprintln!("isolation: a session failed: {e}");
            }
        }
    }
    let per_start = |seconds: f64| round1(1e6 * seconds / starts.max(1) as f64);
    let ms = |h: &Histogram<u64>, q: f64| h.value_at_quantile(q) as f64 / 1000.0;
    StartRun {
        first_call_p50_ms: ms(&first, 0.5),
        first_call_p99_ms: ms(&first, 0.99),
        call_p50_ms: ms(&call, 0.5),
        call_p99_ms: ms(&call, 0.99),
        second_call_p50_ms: ms(&second, 0.5),
        start_p50_ms: ms(&started, 0.5),
        start_p99_ms: ms(&started, 0.99),
        gateway_cpu_us_per_start: per_start(crate::procfs::cpu_seconds(pid) - cpu),
        plugin_cpu_us_per_start: per_start(crate::procfs::children_cpu_seconds(pid) - children),
        failed,
    }
}

/// One session's times, in µs.
struct SessionTimes {
    /// From the `initialize` request until the first call's answer.
    initialize_to_first: u64,
    /// The first call alone.
    first: u64,
    /// The second call.
    second: u64,
}

/// Session `i` on the gateway `pid` at `url`, timed, with no other plugin process starting
/// or stopping meanwhile: after its DELETE, waits until its plugin process is gone.
async fn alone(
    http: &reqwest::Client,
    url: &str,
    pid: u32,
    i: usize,
) -> Result<SessionTimes, String> {
    let before = crate::procfs::descendants(pid).len();
    let times = cold_session(http, url, i).await;
    let deadline = Instant::now() + Duration::from_secs(10);
    while crate::procfs::descendants(pid).len() > before && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    times
}

/// Opens session `i`, makes its first call (which starts its plugin process) and a second
/// one, then closes it.
async fn cold_session(http: &reqwest::Client, url: &str, i: usize) -> Result<SessionTimes, String> {
    let micros = |t: Instant| t.elapsed().as_micros() as u64;
    let t = Instant::now();
    let (sid, version) = crate::mcp::initialize(http, url).await?;
    let called = Instant::now();
    let result = async {
        echo(http, url, sid.as_deref(), &version, 1, i).await?;
        let (initialize_to_first, first) = (micros(t), micros(called));
        let again = Instant::now();
        echo(http, url, sid.as_deref(), &version, 2, i).await?;
        Ok(SessionTimes {
            initialize_to_first,
            first,
            second: micros(again),
        })
    }
    .await;
    if let Some(sid) = &sid {
        let _ = http.delete(url).header("mcp-session-id", sid).send().await;
    }
    result
}

/// Call `id` of `echo` in session `sid`, its answer checked.
async fn echo(
    http: &reqwest::Client,
    url: &str,
    sid: Option<&str>,
    version: &str,
    id: u64,
    i: usize,
) -> Result<(), String> {
    let text = crate::load::echo_text(i, id);
    let body = crate::load::echo_call_body(id, &text, None);
    let (_, messages) = crate::mcp::post_body(http, url, sid, Some(version), body).await?;
    if messages
        .iter()
        .any(|m| m["id"] == id && m["result"]["content"][0]["text"] == text.as_str())
    {
        Ok(())
    } else {
        Err(format!("call {id}: not the call's text: {messages:?}"))
    }
}

/// (a) or (b) with the sandbox on and off, in [`PAIRS`] alternating pairs of runs.
async fn throughput_pairs(
    gateway: &Path,
    scenario: &str,
    sessions: usize,
    in_flight: usize,
    run: Duration,
) -> ThroughputPairs {
    let pairs: Vec<[Run; 2]> = crate::paired::alternate(
        sessions,
        in_flight,
        run,
        || start(gateway, SANDBOX_ON),
        || start(gateway, SANDBOX_OFF),
    )
    .await;
    let mut t = ThroughputPairs {
        scenario: scenario.into(),
        ..Default::default()
    };
    for [on, off] in &pairs {
        t.on_calls_per_sec.push(on.throughput.calls_per_sec.round());
        t.off_calls_per_sec
            .push(off.throughput.calls_per_sec.round());
        t.on_p99_ms.push(on.throughput.p99_ms);
        t.off_p99_ms.push(off.throughput.p99_ms);
        t.on_cpu_us_per_call.push(on.cpu_us_per_call);
        t.off_cpu_us_per_call.push(off.cpu_us_per_call);
        t.wrong += on.throughput.wrong + off.throughput.wrong;
    }
    t
}

/// The comparison's rows: the start-up measures, then calls/s of each throughput scenario.
fn rows(r: &Report) -> Vec<Row> {
    let runs = format!("{} × {} starts", 2 * r.startup.len(), r.starts_per_run);
    let time = |measure: &str, f: fn(&StartRun) -> f64| {
        let on: Vec<f64> = r.startup.iter().map(|[on, _]| f(on)).collect();
        let off: Vec<f64> = r.startup.iter().map(|[_, off]| f(off)).collect();
        let pair_cost: Vec<f64> = on
            .iter()
            .zip(&off)
            .map(|(a, b)| (1000.0 * (a - b)).round() / 1000.0)
            .collect();
        Row {
            measure: measure.into(),
            runs: runs.clone(),
            unit: "ms".into(),
            cost_unit: "ms".into(),
            cost: (1000.0 * median(&pair_cost)).round() / 1000.0,
            on,
            off,
            pair_cost,
        }
    };
    let mut rows = vec![
        time("start-up: `initialize` + first call, p50", |s| {
            s.first_call_p50_ms
        }),
        time("start-up: `initialize` + first call, p99", |s| {
            s.first_call_p99_ms
        }),
        time("the process's start (first call less second), p50", |s| {
            s.start_p50_ms
        }),
        time("the process's start (first call less second), p99", |s| {
            s.start_p99_ms
        }),
    ];
    for (measure, f) in [
        (
            "gateway CPU per session (start and stop), µs",
            (|s: &StartRun| s.gateway_cpu_us_per_start) as fn(&StartRun) -> f64,
        ),
        (
            "plugin CPU per session (with its child's set-up), µs",
            |s: &StartRun| s.plugin_cpu_us_per_start,
        ),
    ] {
        let mut row = time(measure, f);
        row.unit = "µs".into();
        row.cost_unit = "µs".into();
        row.pair_cost.iter_mut().for_each(|c| *c = round1(*c));
        row.cost = round1(row.cost);
        rows.push(row);
    }
    for t in &r.throughput {
        let pair_cost: Vec<f64> = t
            .on_calls_per_sec
            .iter()
            .zip(&t.off_calls_per_sec)
            .map(|(on, off)| percent(1.0 - on / off))
            .collect();
        rows.push(Row {
            measure: format!("{}, calls/s", t.scenario),
            runs: format!(
                "{} × {} s",
                t.on_calls_per_sec.len() + t.off_calls_per_sec.len(),
                r.seconds_per_run
            ),
            unit: "calls/s".into(),
            cost_unit: "%".into(),
            cost: round1(median(&pair_cost)),
            on: t.on_calls_per_sec.clone(),
            off: t.off_calls_per_sec.clone(),
            pair_cost,
        });
    }
    rows
}

pub fn markdown(r: &Report) -> String {
    let binary = r
        .gateway
        .as_ref()
        .map_or(String::new(), |g| format!(" (gateway binary `{g}`)"));
    let mut out = format!(
        "{SECTION}\n\nMeasured by `mcp-bench isolation` (bench/src/isolation.rs) on {}, commit `{}`{binary}, \
         {} cores; the load average was {} before and {} after. The plugin sandbox (issue 39) on, \
         as by default, against `sandbox = false` in the plugin's table, on the same gateway \
         binary, in alternating pairs of runs (on-off, off-on, ...), every run on a fresh gateway \
         with the echo plugin behind it and a plugin process per session. What this machine lets \
         the sandbox enforce, as the gateway's probe logged it: {}. Raw numbers: \
         `bench/results/isolation.json`. Reproduce: `target/release/mcp-bench isolation` (or \
         `scripts/bench`, which runs it too); `mcp-bench isolation --startup-only` measures the \
         start-up alone and prints its JSON.\n\n\
         - Start-up: {} new sessions one after another per run ({WARM_UP} untimed ones first), \
         each with a cold plugin process, which the session's first call starts. Timed from the \
         `initialize` request until the first `tools/call`'s answer (`notifications/initialized` \
         in between, as in (d)); then a second call: the first call less the second is the \
         process's start (the spawn, the sandbox, the plugin's own start and its \
         `initialize`), per session. After its DELETE the next session waits, untimed, until \
         the plugin process is gone. With the sandbox on the gateway forks for each start \
         (the sandbox is applied between `fork` and `exec`); without it spawning takes \
         `posix_spawn`: the cost is both. CPU per session: the gateway's own (start and stop), \
         and that of its reaped children (the plugin, and the child's set-up before `exec`), \
         from `/proc/PID/stat`. The target: a cost of at most {TARGET_MS} ms at p50.\n\
         - Throughput: (a) and (b) as in the paired tables above, each run {} s.\n\n\
         Cost per pair: each pair's on less off (for calls/s: how much lower on was, in \
         percent of off); the cost is their median, so that drift slower than a pair cancels \
         out.\n\n\
         | measure | runs | sandbox on, per run | off, per run | cost per pair | cost |\n\
         |---|---|---|---|---|---|\n",
        r.date,
        r.commit,
        r.cores,
        r.load_before,
        r.load_after,
        r.machine,
        r.starts_per_run,
        r.seconds_per_run,
    );
    for (i, row) in r.rows.iter().enumerate() {
        let digits = if row.unit == "ms" { 2 } else { 0 };
        let cost_digits = match row.cost_unit.as_str() {
            "ms" => 2,
            "%" => 1,
            _ => 0,
        };
        let unit = if row.cost_unit == "%" {
            "%".to_owned()
        } else {
            format!(" {}", row.cost_unit)
        };
        // The first row is the target's.
        let verdict = match i {
            0 if row.cost <= TARGET_MS => " ✓",
            0 => " ✗",
            _ => "",
        };
        out.push_str(&format!(
            "| {} | {} | {} | {} | {} | **{:.cost_digits$}{unit}**{verdict} |\n",
            row.measure,
            row.runs,
            list(&row.on, digits),
            list(&row.off, digits),
            list(&row.pair_cost, cost_digits),
            row.cost,
        ));
    }
    let failed: u64 = r.startup.iter().flatten().map(|s| s.failed).sum::<u64>();
    let wrong: u64 = r.throughput.iter().map(|t| t.wrong).sum();
    out.push_str(&format!(
        "\nFailed sessions in the start-up runs: {failed}. Wrong answers in the throughput runs: \
         {wrong}.\n"
    ));
    // The hand-kept reading of the numbers.
    if let Ok(notes) = std::fs::read_to_string("bench/NOTES-isolation.md") {
        out.push('\n');
        out.push_str(&notes);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn start_run(first_call_p50_ms: f64) -> StartRun {
        StartRun {
            first_call_p50_ms,
            ..Default::default()
        }
    }

    #[test]
    fn a_pair_costs_on_less_off_and_the_cost_is_the_median_of_the_pairs() {
        let r = Report {
            starts_per_run: 300,
            seconds_per_run: 5,
            startup: vec![
                [start_run(2.0), start_run(1.5)],
                [start_run(1.2), start_run(1.0)],
                [start_run(3.0), start_run(1.0)],
            ],
            throughput: vec![ThroughputPairs {
                scenario: "(a) 1 session ×16".into(),
                on_calls_per_sec: vec![900.0, 1000.0],
                off_calls_per_sec: vec![1000.0, 1000.0],
                ..Default::default()
            }],
            ..Default::default()
        };
        let rows = rows(&r);
        assert_eq!(rows[0].pair_cost, [0.5, 0.2, 2.0]);
        assert_eq!(rows[0].cost, 0.5);
        assert_eq!(rows[0].runs, "6 × 300 starts");
        let a = rows.last().expect("the throughput row");
        assert_eq!(a.measure, "(a) 1 session ×16, calls/s");
        assert_eq!(a.pair_cost, [10.0, 0.0]);
        assert_eq!(a.cost, 5.0);
        assert_eq!(a.runs, "4 × 5 s");
        let text = markdown(&Report { rows, ..r });
        assert!(text.starts_with(SECTION), "{text}");
        assert!(text.contains("| **0.50 ms** ✓ |"), "{text}");
        assert!(text.contains("| 10.0, 0.0 | **5.0%** |"), "{text}");
    }

    #[test]
    fn what_the_machine_offers_is_read_from_the_probe_s_log_line() {
        let line = "2026-12-06T03:00:00Z  INFO mcp_gateway::backend::sandbox::probe: plugin sandbox: what this machine offers landlock_abi=6 may_change_user=true";
        assert_eq!(
            machine(&["other".into(), line.into()]),
            "landlock_abi=6 may_change_user=true"
        );
        assert!(machine(&[]).starts_with("unknown"));
    }
}
