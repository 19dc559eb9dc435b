//! `mcp-bench soak`: the gateway (release build) in front of `mcp-fixture-server` for minutes
//! at a steady load of many sessions, checking every message and sampling the gateway's
//! resources.
//!
//! Each of `--sessions` slots runs one session after another. A session holds a GET stream,
//! calls `echo` (its text unique and checked), `burst` (tagged, numbered log notifications)
//! and `background_log` (a log that comes once the call is over, so it goes to the GET
//! stream), makes calls in pairs (so the gateway cannot tell which stream a log belongs to),
//! resumes every few seconds with `Last-Event-ID` on a fresh connection (its GET stream, or a
//! POST stream cut in the middle of a burst), and ends with DELETE after a random lifetime; a
//! new session takes the slot. At a fixed rate one session crashes its plugin instance while
//! a `slow` call of its own is in flight there: those two errors are the injected ones, and
//! every other error is counted apart. Every SSE event id is checked for gaps and repeats per
//! stream across resumes, and every tagged notification must arrive exactly once by the time
//! its session ends. Every 10 s the gateway's RSS, open descriptors, threads and child
//! processes are read from /proc. The result goes to the "Soak" section of BENCHMARKS.md
//! (nothing else in it changes) and to `bench/results/soak.json`.
//!
//! The parts, from the top: [`run`] (the whole run), [`session`] (a slot's sessions, one after
//! another), [`crash`] (the injected crash) and [`streams`] (the GET stream, the resumes),
//! [`requests`] (POST, GET, the checked calls), [`track`] (a session's books, where every event
//! is checked), [`sse`] and [`stats`] (the run's counters); beside them [`gateway`] (the
//! process under soak), [`sample`] (its readings) and [`report`] (soak.json and the section).
//! What they all share is here: the options, the run's context and the constants.

mod crash;
mod gateway;
mod report;
mod requests;
mod run;
mod sample;
mod session;
mod sse;
mod stats;
mod streams;
mod track;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use report::{Report, markdown, write_section};
use run::run;
use stats::Stats;

pub use report::SECTION;

/// The plugin's name in the gateway's configuration (it prefixes nothing: one plugin).
const PLUGIN: &str = "fx";
/// Protocol version the sessions ask for: the newest, with priming events.
const VERSION: &str = "2025-11-25";
/// Seconds between samples.
const SAMPLE_EVERY: Duration = Duration::from_secs(10);
/// How long a session waits, before it ends, for notifications still on their way.
const SETTLE: Duration = Duration::from_secs(10);
/// Notifications in a burst, and in a burst whose stream is cut and resumed.
const BURST: u64 = 10;
const RESUMED_BURST: u64 = 20;

#[derive(clap::Args, Debug, Clone)]
pub struct Options {
    /// How long the load runs, in minutes.
    #[arg(long, default_value_t = 10.0)]
    minutes: f64,
    /// Sessions open at once (each with its own plugin process, unless --shared).
    #[arg(long, default_value_t = 1000)]
    sessions: usize,
    /// Each session's pause between `echo` calls, in ms (jittered ±50%).
    #[arg(long, default_value_t = 2000)]
    call_interval_ms: u64,
    /// Each session resumes a stream this often, in s (jittered): its GET stream and a POST
    /// stream cut mid-burst, in turn.
    #[arg(long, default_value_t = 5)]
    resume_every_secs: u64,
    /// One session crashes its plugin instance this often, in s; 0 for never. The gateway's
    /// circuit breaker counts the crashes of a client's own instances once per client, and
    /// every session here is one client's, so they do not open it.
    #[arg(long, default_value_t = 20)]
    crash_every_secs: u64,
    /// Session lifetimes in s, uniform between the two.
    #[arg(long, default_value = "20-100")]
    session_secs: String,
    /// One plugin process for every session (`process_model = "shared"`). Its logs, which
    /// name no request, are dropped by design, so notifications are not checked; no crashes
    /// are injected (one would fail every session's calls in flight).
    #[arg(long)]
    shared: bool,
    /// An extra argument for the gateway (repeat for more).
    #[arg(long = "gateway-arg", allow_hyphen_values = true)]
    gateway_args: Vec<String>,
    /// For checking the checks: the client throws away every Nth SSE event it receives, as
    /// if the gateway had lost it; the run must then count those as lost (0: none).
    #[arg(long, default_value_t = 0)]
    drop_events: u64,
    /// Instead of running: render the section again from a run's saved results (e.g.
    /// bench/results/soak.json), and write it unless --no-write.
    #[arg(long)]
    render: Option<PathBuf>,
    /// Print the results only: leave BENCHMARKS.md and bench/results/ alone.
    #[arg(long)]
    no_write: bool,
}

/// What the whole run shares.
struct Ctx {
    /// For requests that end: a total timeout.
    http: reqwest::Client,
    /// For GET streams: no total timeout, a read timeout (keep-alives come every 15 s).
    streams: reqwest::Client,
    url: String,
    stats: Arc<Stats>,
    deadline: Instant,
    opts: Options,
    lifetimes: (Duration, Duration),
}

/// `mcp-bench soak`: the run, or with `--render` its section from saved results; the process
/// exits 0 when every target was met.
pub fn main(rt: &tokio::runtime::Runtime, opts: Options) {
    if let Some(path) = &opts.render {
        let text =
            std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        let report: Report = serde_json::from_str(&text)
            .unwrap_or_else(|e| panic!("{}: not a soak's results: {e}", path.display()));
        let (table, ok) = markdown(&report);
        println!("{table}");
        if !opts.no_write {
            write_section(&table);
        }
        std::process::exit(i32::from(!ok));
    }
    crate::procfs::raise_fd_limit();
    let code = rt.block_on(async {
        use tokio::signal::unix::{SignalKind, signal};
        let mut term = signal(SignalKind::terminate()).expect("SIGTERM handler");
        let mut hup = signal(SignalKind::hangup()).expect("SIGHUP handler");
        tokio::select! {
            r = run(opts) => i32::from(!r),
            _ = tokio::signal::ctrl_c() => { eprintln!("soak: interrupted"); 130 }
            _ = term.recv() => { eprintln!("soak: terminated"); 143 }
            _ = hup.recv() => { eprintln!("soak: hung up"); 129 }
        }
    });
    // Dropping the run above killed the gateway if it was still up; the sessions' tasks end
    // with the process.
    std::process::exit(code);
}
