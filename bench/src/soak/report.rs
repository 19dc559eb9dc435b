//! The soak's report: what `bench/results/soak.json` holds, and the "Soak" section of
//! BENCHMARKS.md written from it, with whether every target was met.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::sample::Sample;
use super::stats::Tally;
use super::{BURST, RESUMED_BURST};
use crate::report::{commit_excluding, replace_section};

/// What a run found, as `bench/results/soak.json` keeps it.
#[derive(Debug, Default, Serialize, Deserialize)]
pub(super) struct Report {
    pub(super) date: String,
    pub(super) commit: String,
    pub(super) command: String,
    pub(super) cores: usize,
    pub(super) memory_gb: f64,
    pub(super) minutes: f64,
    pub(super) sessions: usize,
    pub(super) process_model: String,
    pub(super) call_interval_ms: u64,
    pub(super) resume_every_secs: u64,
    pub(super) crash_every_secs: u64,
    pub(super) session_secs: String,
    pub(super) sessions_opened: u64,
    pub(super) sessions_ended: u64,
    pub(super) echo_ok: u64,
    pub(super) bursts_ok: u64,
    pub(super) background_ok: u64,
    pub(super) pairs: u64,
    pub(super) calls_per_sec: f64,
    pub(super) echo_p50_ms: f64,
    pub(super) echo_p99_ms: f64,
    pub(super) echo_max_ms: f64,
    pub(super) get_resumes: u64,
    pub(super) post_resumes: u64,
    pub(super) resumes_skipped: u64,
    pub(super) events: u64,
    pub(super) notifications: u64,
    pub(super) replayed: u64,
    pub(super) crashes_asked: u64,
    pub(super) injected_crashes: u64,
    pub(super) victims: u64,
    pub(super) gateway_crashes_counted: f64,
    pub(super) errors: BTreeMap<String, Tally>,
    pub(super) lost: BTreeMap<String, Tally>,
    pub(super) duplicates: BTreeMap<String, Tally>,
    pub(super) gateway_warnings: BTreeMap<String, Tally>,
    pub(super) notifications_dropped_metric: f64,
    pub(super) cursors_not_found_metric: f64,
    pub(super) replays_served_metric: f64,
    pub(super) children_after_sessions: u64,
    pub(super) fds_after_sessions: u64,
    pub(super) rss_after_sessions_mb: f64,
    pub(super) stopped_cleanly: bool,
    pub(super) fixture_left: usize,
    pub(super) stuck_slots: usize,
    /// The load generator's own CPU use over the run, in percent of one core.
    pub(super) driver_cpu_percent: f64,
    pub(super) samples: Vec<Sample>,
}

/// Writes the Soak section of BENCHMARKS.md, keeping the rest of the file.
pub(super) fn write_section(table: &str) {
    let old = std::fs::read_to_string("BENCHMARKS.md").unwrap_or_default();
    std::fs::write("BENCHMARKS.md", replace_section(&old, SECTION, table))
        .expect("write BENCHMARKS.md");
    eprintln!("soak: wrote the Soak section of BENCHMARKS.md");
}

pub(super) fn commit() -> String {
    commit_excluding(&["BENCHMARKS.md", "bench/results/soak.json"])
}

/// The heading of the section this writes in BENCHMARKS.md.
pub const SECTION: &str = "## Soak";

fn mean(v: &[f64]) -> Option<f64> {
    (!v.is_empty()).then(|| v.iter().sum::<f64>() / v.len() as f64)
}

/// The means of a quantity over the second minute and the last minute, if the run had both:
/// the samples at 60–110 s and at the last six before the end (the one at the end is taken
/// as every session ends at once).
fn windows(r: &Report, f: impl Fn(&Sample) -> f64) -> Option<(f64, f64)> {
    let end = (r.minutes * 60.0).round() as u64;
    if end < 180 {
        return None;
    }
    let pick = |lo: u64, hi: u64| {
        r.samples
            .iter()
            .filter(|s| s.t_secs >= lo && s.t_secs < hi)
            .map(&f)
            .collect::<Vec<_>>()
    };
    Some((mean(&pick(60, 120))?, mean(&pick(end - 60, end))?))
}

fn thousands(n: u64) -> String {
    let s = n.to_string();
    let mut out = String::new();
    for (i, c) in s.chars().enumerate() {
        if i > 0 && (s.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

fn tallies(map: &BTreeMap<String, Tally>) -> String {
    if map.is_empty() {
        return "none".into();
    }
    map.iter()
        .map(|(k, t)| {
            format!(
                "{k}: {} (e.g. `{}`)",
                t.count,
                t.example.replace('|', "\\|").replace('`', "'")
            )
        })
        .collect::<Vec<_>>()
        .join("; ")
}

/// The section for BENCHMARKS.md, and whether every target was met.
pub(super) fn markdown(r: &Report) -> (String, bool) {
    let errors: u64 = r.errors.values().map(|t| t.count).sum();
    let lost: u64 = r.lost.values().map(|t| t.count).sum();
    let dups: u64 = r.duplicates.values().map(|t| t.count).sum();
    let rss = windows(r, |s| s.rss_mb);
    let fds = windows(r, |s| s.fds as f64);
    let within = |w: Option<(f64, f64)>| w.map(|(a, b)| (b - a).abs() <= 0.1 * a);
    let crashes_ok = r.injected_crashes == r.crashes_asked && r.victims == r.injected_crashes;
    let ok = errors == 0
        && lost == 0
        && dups == 0
        && crashes_ok
        && within(rss) != Some(false)
        && within(fds) != Some(false)
        && r.fixture_left == 0
        && r.stuck_slots == 0;
    let mark = |good: bool| if good { "✓" } else { "✗" };
    // Means to one decimal (MB) or whole (counts); a mark where 10% is a target.
    let window = |w: Option<(f64, f64)>, unit: &str, target: bool| match w {
        Some((a, b)) => {
            let v = |x: f64| {
                if unit.is_empty() {
                    thousands(x.round() as u64)
                } else {
                    format!("{x:.1}{unit}")
                }
            };
            let change = 100.0 * (b - a) / a;
            let m = if target {
                format!(" {}", mark((b - a).abs() <= 0.1 * a))
            } else {
                String::new()
            };
            format!("{} → {} ({change:+.1}%){m}", v(a), v(b))
        }
        None => "– (the run is shorter than 3 minutes)".into(),
    };
    let threads = windows(r, |s| s.threads as f64);
    let children = windows(r, |s| s.children as f64);
    let model = if r.process_model == "shared" {
        "one shared plugin process (`process_model = \"shared\"`)"
    } else {
        "a plugin process per session (the default `process_model = \"per_session\"`)"
    };
    let crashes = if r.crash_every_secs == 0 {
        "No crashes are injected.".to_owned()
    } else {
        format!(
            "Every {} s one session crashes its plugin instance (`crash`) while a `slow` call of \
             its own is in flight there: those two errors are the injected ones. The gateway's \
             circuit breaker (5 crashes within 60 s) counts the crashes of a client's own \
             instances once per client, and every session here comes from one load generator, \
             so they never open it for the others (before it did, one crash every 6 s shut \
             the plugin off for every session for 30 s).",
            r.crash_every_secs
        )
    };
    let shared = if r.process_model == "shared" {
        " With a shared process the plugin's logs, which name no request, are dropped by \
         design, so notifications are not checked and only the GET stream is resumed."
    } else {
        ""
    };
    let mut out = format!(
        "{SECTION}\n\n\
         `{}` on {}, commit `{}`, {} cores, {:.0} GiB: the gateway (release build) in front of \
         `mcp-fixture-server`, {model}, {} sessions open at once for {} minutes (run by \
         `mcp-bench soak`, bench/src/soak.rs; raw numbers in `bench/results/soak.json`).\n\n\
         Each session holds a GET stream; calls `echo` every ~{:.1} s (a unique text, checked), \
         a tagged `burst` of {BURST} numbered log notifications and a `background_log` (a log \
         after its call is over) every ~10 s, and an `echo` and a `burst` at once every ~15 s; \
         every ~{} s it resumes with `Last-Event-ID` on a fresh connection, in turn its GET \
         stream (cut first; a log sent meanwhile must come in the replay) and a POST stream cut \
         after 3 of a burst's {RESUMED_BURST} notifications (the rest and the answer must come on \
         the resumed one).{shared} Sessions live {} s, then DELETE; a new one takes the slot. \
         {crashes} Every SSE event id is checked for gaps and repeats per stream across resumes, \
         and every tagged notification must arrive exactly once before its session ends. The \
         gateway's RSS, descriptors, threads and children come from /proc every 10 s.\n\n\
         | | result | target |\n|---|---|---|\n",
        r.command,
        r.date,
        r.commit,
        r.cores,
        r.memory_gb,
        thousands(r.sessions as u64),
        r.minutes,
        r.call_interval_ms as f64 / 1000.0,
        r.resume_every_secs,
        r.session_secs.replace('-', "–"),
    );
    let mut row = |what: &str, result: String, target: &str| {
        out.push_str(&format!("| {what} | {result} | {target} |\n"));
    };
    row(
        "sessions opened / ended",
        format!(
            "{} / {}",
            thousands(r.sessions_opened),
            thousands(r.sessions_ended)
        ),
        "",
    );
    row(
        "calls answered and checked: `echo`, `burst`, `background_log`",
        format!(
            "{} ({}/s): {}, {}, {}",
            thousands(r.echo_ok + r.bursts_ok + r.background_ok),
            thousands(r.calls_per_sec as u64),
            thousands(r.echo_ok),
            thousands(r.bursts_ok),
            thousands(r.background_ok)
        ),
        "",
    );
    row(
        "load generator's CPU (it shares the cores)",
        format!("{:.0}% of one core", r.driver_cpu_percent),
        "",
    );
    row(
        "`echo` latency p50 / p99 / max",
        format!(
            "{:.2} / {:.2} / {:.0} ms",
            r.echo_p50_ms, r.echo_p99_ms, r.echo_max_ms
        ),
        "",
    );
    row(
        "resumes: GET stream / POST stream cut mid-burst (not cut: the burst was over first)",
        format!(
            "{} / {} ({})",
            thousands(r.get_resumes),
            thousands(r.post_resumes),
            thousands(r.resumes_skipped)
        ),
        "",
    );
    row(
        "SSE events checked; tagged notifications checked, of them on a resumed connection",
        format!(
            "{}; {}, {}",
            thousands(r.events),
            thousands(r.notifications),
            thousands(r.replayed)
        ),
        "",
    );
    row(
        "injected crashes / their in-flight victims (the gateway counted crashes)",
        format!(
            "{} of {} / {} ({}) {}",
            r.injected_crashes,
            r.crashes_asked,
            r.victims,
            r.gateway_crashes_counted,
            mark(crashes_ok)
        ),
        "as injected",
    );
    row(
        "other errors",
        format!("**{errors}** {}", mark(errors == 0)),
        "0",
    );
    row(
        "lost messages",
        format!("**{lost}** {}", mark(lost == 0)),
        "0",
    );
    row(
        "repeated messages",
        format!("{dups} {}", mark(dups == 0)),
        "0",
    );
    let end = (r.minutes * 60.0).round() as u64;
    let span = format!(
        "60–110 s → {}–{} s",
        end.saturating_sub(60),
        end.saturating_sub(10)
    );
    row(
        &format!("gateway RSS, mean of the 2nd minute's samples → the last minute's ({span})"),
        window(rss, " MB", true),
        "within 10%",
    );
    row(
        "open descriptors, 2nd minute → last",
        window(fds, "", true),
        "within 10%",
    );
    row("threads, 2nd minute → last", window(threads, "", false), "");
    row(
        "child processes, 2nd minute → last",
        window(children, "", false),
        "",
    );
    row(
        "after the last session ended: child processes, descriptors, RSS",
        format!(
            "{}, {}, {:.1} MB",
            r.children_after_sessions, r.fds_after_sessions, r.rss_after_sessions_mb
        ),
        "",
    );
    row(
        "the gateway stopped on SIGTERM; fixture processes left after it",
        format!(
            "{}; {} {}",
            if r.stopped_cleanly {
                "yes"
            } else {
                "no (killed)"
            },
            r.fixture_left,
            mark(r.fixture_left == 0)
        ),
        "0",
    );
    row(
        "gateway metrics: replays served, cursors not found, notifications dropped",
        format!(
            "{}, {}, {}",
            thousands(r.replays_served_metric as u64),
            r.cursors_not_found_metric,
            r.notifications_dropped_metric
        ),
        "",
    );
    out.push_str(&format!(
        "\n**{}**\n\nErrors: {}.\n\nLost: {}.\n\nRepeated: {}.\n\nThe gateway's warnings and errors \
         (its log at `warn`), by what they say: {}.\n",
        if ok { "Every target met." } else { "Targets missed (✗ above)." },
        tallies(&r.errors),
        tallies(&r.lost),
        tallies(&r.duplicates),
        tallies(&r.gateway_warnings),
    ));
    out.push_str(
        "\nSamples (every 10 s; calls/s counts checked answers; CPU in % of one core; the \
         replay buffer from the gateway's metrics; the last sample is taken as every session \
         ends):\n\n\
         | t (s) | RSS (MB) | descriptors | threads | child processes | their RSS (MB) | \
         sessions | calls/s | gateway CPU | replay buffer | SSE streams | MemAvailable (GiB) | load |\n\
         |---|---|---|---|---|---|---|---|---|---|---|---|---|\n",
    );
    for s in &r.samples {
        out.push_str(&format!(
            "| {} | {:.1} | {} | {} | {} | {:.0} | {} | {:.0} | {:.0}% | {} events, {:.1} MB | {} | {:.1} | {:.2} |\n",
            s.t_secs,
            s.rss_mb,
            s.fds,
            s.threads,
            s.children,
            s.children_rss_mb,
            s.sessions_open,
            s.calls_per_sec,
            s.cpu_percent,
            thousands(s.replay_events),
            s.replay_mb,
            s.sse_streams,
            s.mem_available_gb,
            s.load1,
        ));
    }
    (out, ok)
}
