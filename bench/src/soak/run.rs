//! The whole soak: the gateway started, the slots and the crash tokens set going, a sample every
//! 10 s until the load ends, then the sessions waited for, the gateway stopped, and the report.

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use tokio::task::JoinHandle;

use super::gateway::start_gateway;
use super::report::{Report, commit, markdown, write_section};
use super::sample::{Sample, fixture_processes, metric, read_proc, scrape, status_field, system};
use super::session::slot;
use super::stats::{Stats, total};
use super::{Ctx, Options, SAMPLE_EVERY};

fn parse_lifetimes(s: &str) -> (Duration, Duration) {
    let (lo, hi) = s.split_once('-').unwrap_or((s, s));
    let secs = |v: &str| {
        Duration::from_secs_f64(
            v.trim()
                .parse::<f64>()
                .unwrap_or_else(|_| panic!("--session-secs: `{s}` is not LO-HI")),
        )
    };
    let (lo, hi) = (secs(lo), secs(hi));
    assert!(
        lo <= hi && !lo.is_zero(),
        "--session-secs: `{s}` is not LO-HI with 0 < LO <= HI"
    );
    (lo, hi)
}

/// The whole soak. True when every target was met.
pub(super) async fn run(opts: Options) -> bool {
    let fixture = crate::harness::sibling("mcp-fixture-server");
    let duration = Duration::from_secs_f64(opts.minutes * 60.0);
    let lifetimes = parse_lifetimes(&opts.session_secs);
    let results = PathBuf::from("bench/results");
    std::fs::create_dir_all(&results).expect("results directory");
    let log = std::env::temp_dir().join(format!("mcp-soak-gateway-{}.log", std::process::id()));
    let mut gw = start_gateway(&opts, &fixture, &log).await;
    eprintln!(
        "soak: gateway pid {} at {} ({} plugin processes); {} sessions for {:.1} min; gateway log {}",
        gw.pid,
        gw.url,
        if opts.shared { "shared" } else { "per-session" },
        opts.sessions,
        opts.minutes,
        log.display()
    );
    let driver_cpu_before = crate::procfs::cpu_seconds(std::process::id());
    let stats = Arc::new(Stats {
        drop_events: opts.drop_events,
        ..Stats::default()
    });
    let start = Instant::now();
    let ctx = Arc::new(Ctx {
        http: reqwest::Client::builder()
            .pool_max_idle_per_host(4096)
            .timeout(Duration::from_secs(60))
            .connect_timeout(Duration::from_secs(10))
            .build()
            .expect("HTTP client"),
        streams: reqwest::Client::builder()
            .pool_max_idle_per_host(0)
            .read_timeout(Duration::from_secs(60))
            .connect_timeout(Duration::from_secs(10))
            .build()
            .expect("HTTP client"),
        url: gw.url.clone(),
        stats: stats.clone(),
        deadline: start + duration,
        opts: opts.clone(),
        lifetimes,
    });

    // Sessions start spread over the ramp, so the plugin processes do not all start at once.
    let ramp = (duration / 6).min(Duration::from_secs(30));
    let slots: Vec<JoinHandle<()>> = (0..opts.sessions)
        .map(|i| {
            let delay = ramp.mul_f64(i as f64 / opts.sessions.max(1) as f64);
            tokio::spawn(slot(ctx.clone(), i, delay))
        })
        .collect();

    // Crash tokens at a fixed rate; a session takes one at its next step.
    let crashes_asked = Arc::new(AtomicU64::new(0));
    let crasher = (!opts.shared && opts.crash_every_secs > 0).then(|| {
        let (stats, asked) = (stats.clone(), crashes_asked.clone());
        let every = Duration::from_secs(opts.crash_every_secs);
        let deadline = ctx.deadline;
        tokio::spawn(async move {
            // The first after the ramp.
            let mut at = tokio::time::Instant::now() + ramp + every / 2;
            while at.into_std() + Duration::from_secs(5) < deadline {
                tokio::time::sleep_until(at).await;
                stats.crashes_due.fetch_add(1, Ordering::AcqRel);
                asked.fetch_add(1, Ordering::Relaxed);
                at += every;
            }
        })
    });

    // Samples every 10 s until the load ends.
    let scrape_http = reqwest::Client::builder()
        .timeout(Duration::from_secs(5))
        .build()
        .expect("HTTP client");
    let mut samples = Vec::new();
    let mut prev = (start, 0u64, crate::procfs::cpu_seconds(gw.pid));
    let answered = |s: &Stats| {
        Stats::get(&s.echo_ok) + Stats::get(&s.bursts_ok) + Stats::get(&s.background_ok)
    };
    let sample = |t: Instant, prev: &mut (Instant, u64, f64), metrics: &str| {
        let (rss_mb, fds, threads) = read_proc(gw.pid);
        let kids = crate::procfs::descendants(gw.pid);
        let children_rss_mb: f64 = kids.iter().map(|p| read_proc(*p).0).sum();
        let (mem_available_gb, load1) = system();
        let done = answered(&stats);
        let cpu = crate::procfs::cpu_seconds(gw.pid);
        let dt = t.duration_since(prev.0).as_secs_f64().max(0.001);
        let s = Sample {
            t_secs: t.duration_since(start).as_secs_f64().round() as u64,
            rss_mb: crate::numbers::round1(rss_mb),
            fds,
            threads,
            children: kids.len() as u64,
            children_rss_mb: children_rss_mb.round(),
            sessions_open: Stats::get(&stats.sessions_open),
            calls_per_sec: ((done - prev.1) as f64 / dt).round(),
            cpu_percent: crate::numbers::round1(100.0 * (cpu - prev.2) / dt),
            mem_available_gb: crate::numbers::round1(mem_available_gb),
            load1,
            replay_events: metric(metrics, "mcp_gateway_replay_buffer_events") as u64,
            replay_mb: crate::numbers::round1(
                metric(metrics, "mcp_gateway_replay_buffer_bytes") / 1048576.0,
            ),
            sse_streams: metric(metrics, "mcp_gateway_sse_streams_open") as u64,
        };
        *prev = (t, done, cpu);
        s
    };
    let mut next = start;
    while next <= ctx.deadline + Duration::from_millis(500) {
        tokio::time::sleep_until(next.into()).await;
        let metrics = scrape(&scrape_http, &gw.admin).await;
        let s = sample(Instant::now(), &mut prev, &metrics);
        eprintln!(
            "soak: t={:>4}s rss={:.1}MB fds={} threads={} children={} sessions={} calls/s={} cpu={}% errors={} lost={} crashes={}+{}",
            s.t_secs,
            s.rss_mb,
            s.fds,
            s.threads,
            s.children,
            s.sessions_open,
            s.calls_per_sec,
            s.cpu_percent,
            total(&stats.errors),
            total(&stats.lost),
            Stats::get(&stats.injected_crashes),
            Stats::get(&stats.victims),
        );
        samples.push(s);
        next += SAMPLE_EVERY;
    }

    // Sessions finish what they are doing, settle, and end; a stuck one is counted.
    let mut stuck = 0;
    let wait_until = tokio::time::Instant::now() + Duration::from_secs(120);
    for h in slots {
        let abort = h.abort_handle();
        if tokio::time::timeout_at(wait_until, h).await.is_err() {
            abort.abort();
            stuck += 1;
        }
    }
    if let Some(c) = crasher {
        c.abort();
    }
    if stuck > 0 {
        stats.error(
            "a session did not finish within 120 s of the end",
            format!("{stuck} slots"),
        );
    }
    let elapsed = start.elapsed();
    let driver_cpu = crate::procfs::cpu_seconds(std::process::id()) - driver_cpu_before;

    // With every session ended, its plugin processes stop.
    let settle_until = Instant::now() + Duration::from_secs(20);
    while !crate::procfs::descendants(gw.pid).is_empty() && Instant::now() < settle_until {
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let metrics = scrape(&scrape_http, &gw.admin).await;
    let (rss_after, fds_after, _) = read_proc(gw.pid);
    let children_after = crate::procfs::descendants(gw.pid).len() as u64;
    let stopped_cleanly = gw.stop().await;
    let left_until = Instant::now() + Duration::from_secs(10);
    let mut fixture_left = fixture_processes(&fixture);
    while fixture_left > 0 && Instant::now() < left_until {
        tokio::time::sleep(Duration::from_millis(200)).await;
        fixture_left = fixture_processes(&fixture);
    }

    let (p50, p99, max) =
        stats
            .latency
            .lock()
            .expect("stats lock")
            .as_ref()
            .map_or((0.0, 0.0, 0.0), |h| {
                let ms = |v: u64| (v as f64 / 10.0).round() / 100.0;
                (
                    ms(h.value_at_quantile(0.5)),
                    ms(h.value_at_quantile(0.99)),
                    ms(h.max()),
                )
            });
    let mem_total = std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|m| status_field(&m, "MemTotal:"))
        .unwrap_or(0) as f64
        / (1024.0 * 1024.0);
    let report = Report {
        date: crate::report::date(),
        commit: commit(),
        // scripts/soak names itself here; run directly, the command line as it was.
        command: std::env::var("SOAK_COMMAND")
            .unwrap_or_else(|_| std::env::args().collect::<Vec<_>>().join(" ")),
        cores: std::thread::available_parallelism().map_or(1, |n| n.get()),
        memory_gb: mem_total.round(),
        minutes: opts.minutes,
        sessions: opts.sessions,
        process_model: if opts.shared { "shared" } else { "per_session" }.into(),
        call_interval_ms: opts.call_interval_ms,
        resume_every_secs: opts.resume_every_secs,
        crash_every_secs: if opts.shared {
            0
        } else {
            opts.crash_every_secs
        },
        session_secs: opts.session_secs.clone(),
        sessions_opened: Stats::get(&stats.sessions_opened),
        sessions_ended: Stats::get(&stats.sessions_ended),
        echo_ok: Stats::get(&stats.echo_ok),
        bursts_ok: Stats::get(&stats.bursts_ok),
        background_ok: Stats::get(&stats.background_ok),
        pairs: Stats::get(&stats.pairs),
        calls_per_sec: (answered(&stats) as f64 / elapsed.as_secs_f64()).round(),
        echo_p50_ms: p50,
        echo_p99_ms: p99,
        echo_max_ms: max,
        get_resumes: Stats::get(&stats.get_resumes),
        post_resumes: Stats::get(&stats.post_resumes),
        resumes_skipped: Stats::get(&stats.resumes_skipped),
        events: Stats::get(&stats.events),
        notifications: Stats::get(&stats.notifications),
        replayed: Stats::get(&stats.replayed),
        crashes_asked: crashes_asked.load(Ordering::Relaxed),
        injected_crashes: Stats::get(&stats.injected_crashes),
        victims: Stats::get(&stats.victims),
        gateway_crashes_counted: metric(&metrics, "mcp_gateway_plugin_crashes_total"),
        errors: stats.errors.lock().expect("stats lock").clone(),
        lost: stats.lost.lock().expect("stats lock").clone(),
        duplicates: stats.duplicates.lock().expect("stats lock").clone(),
        gateway_warnings: gw.warnings.lock().expect("warnings lock").clone(),
        notifications_dropped_metric: metric(
            &metrics,
            "mcp_gateway_plugin_notifications_dropped_total",
        ),
        cursors_not_found_metric: metric(&metrics, "mcp_gateway_replay_cursors_not_found_total"),
        replays_served_metric: metric(&metrics, "mcp_gateway_replays_served_total"),
        children_after_sessions: children_after,
        fds_after_sessions: fds_after,
        rss_after_sessions_mb: crate::numbers::round1(rss_after),
        stopped_cleanly,
        fixture_left,
        stuck_slots: stuck,
        driver_cpu_percent: crate::numbers::round1(100.0 * driver_cpu / elapsed.as_secs_f64()),
        samples,
    };
    let (table, ok) = markdown(&report);
    println!("{table}");
    if !opts.no_write {
        let json = serde_json::to_string_pretty(&report).expect("serializable");
        std::fs::write(results.join("soak.json"), json).expect("write results");
        write_section(&table);
        eprintln!("soak: wrote bench/results/soak.json");
    }
    eprintln!("soak: gateway log in {}", log.display());
    ok
}
