//! The full run, `mcp-bench` with no subcommand: every target of the main table through (a) to
//! (d) (the echo plugin over its pipes, the in-process ceiling, the gateway, the peers, the
//! gateway with a warm pool and with a shared plugin process), the ceiling shares and (e) in
//! paired runs, then the modern era, isolation and cluster mode. It writes
//! `bench/results/latest.json` and BENCHMARKS.md, keeping the sections that come from runs of
//! their own (the soak, the fuzzing, and cluster mode's when it was left out).

mod peers;
mod report;

use std::path::Path;
use std::time::Duration;

use crate::harness::{SHARED_PLUGIN, Target};
use crate::load::{http_load, pipes_load};
use crate::procfs::{raise_fd_limit, wait_for_processes};
use crate::scenarios::{ceiling_share, first_call_latency, idle_sessions, resumable_cost};
use crate::{cluster, isolation, modern, soak};
use report::{Report, TargetReport, markdown};

/// Measures everything, writes `latest.json` in `out` (and modern's and isolation's JSON
/// beside it) and BENCHMARKS.md, and prints the JSON; `idle` are the session counts of (c).
pub(crate) async fn run(duration_secs: u64, idle: &[usize], out: &Path, no_cluster: bool) {
    raise_fd_limit();
    let duration = Duration::from_secs(duration_secs);
    let mut report = Report {
        date: crate::report::date(),
        cores: std::thread::available_parallelism().map_or(1, |n| n.get()),
        duration_secs,
        targets: Vec::new(),
        ceiling_share: Vec::new(),
        e_resumable_cost: Vec::new(),
        cluster: None,
    };

    // The plugin over raw pipes: the stdio ceiling.
    let mut pipes = TargetReport {
        name: "echo plugin over raw pipes".into(),
        ..Default::default()
    };
    pipes.a_one_session_16 = Some(pipes_load(16, duration).await);
    pipes.b_64_sessions_64 = Some(pipes_load(64, duration).await);
    eprintln!("{}: {:?}", pipes.name, pipes.a_one_session_16);
    report.targets.push(pipes);

    for inproc in [true, false] {
        let start = || async move {
            if inproc {
                Target::inproc().await
            } else {
                Target::gateway("mcp-gateway", &[], None).await
            }
        };
        let target = start().await;
        let mut r = http_target(&target, duration).await;
        drop(target);
        // Memory is measured on a fresh process: freed memory from the runs above would count.
        for n in idle {
            let fresh = start().await;
            match idle_sessions(&fresh.url, fresh.pid(), *n, Duration::ZERO, None, false).await {
                Ok(report) => r.c_idle_sessions.push(report),
                Err(e) => r.notes.push(format!("{n} idle sessions: {e}")),
            }
        }
        eprintln!(
            "{}: a={:?} b={:?} c={:?}",
            r.name, r.a_one_session_16, r.b_64_sessions_64, r.c_idle_sessions
        );
        report.targets.push(r);
    }

    report.targets.extend(peers::measure(duration).await);

    // (d) with a warm pool.
    let warm = Target::gateway(
        "mcp-gateway, warm pool",
        &[],
        Some("[plugins.echo]\ncommand = \"ECHO\"\nwarm = 4\n"),
    )
    .await;
    wait_for_processes(warm.pid(), 4).await;
    let mut r = TargetReport {
        name: warm.name.clone(),
        ..Default::default()
    };
    r.d = Some(first_call_latency(&warm.url, 100).await);
    report.targets.push(r);
    drop(warm);

    // One plugin process for every session (`process_model = "shared"`), as suits a stateless
    // plugin: (b) without 64 processes to wake.
    let shared = Target::gateway(
        "mcp-gateway, shared plugin process",
        &[],
        Some(SHARED_PLUGIN),
    )
    .await;
    let mut r = TargetReport {
        name: shared.name.clone(),
        ..Default::default()
    };
    r.a_one_session_16 = Some(http_load(&shared.url, None, 1, 16, duration).await);
    r.b_64_sessions_64 = Some(http_load(&shared.url, None, 64, 64, duration).await);
    report.targets.push(r);
    drop(shared);

    for (scenario, sessions, in_flight, config) in [
        ("(a) 1 session ×16", 1, 16, None),
        ("(b) 64 sessions ×64", 64, 64, None),
        (
            "(b) 64 sessions ×64, one shared plugin process",
            64,
            64,
            Some(SHARED_PLUGIN),
        ),
    ] {
        report
            .ceiling_share
            .push(ceiling_share(scenario, sessions, in_flight, duration, config).await);
    }

    // With a stream per POST in 64 sessions, (b) keeps the most finished streams lingering.
    for (scenario, sessions, in_flight) in [
        ("(a) 1 session ×16", 1, 16),
        ("(b) 64 sessions ×64", 64, 64),
    ] {
        report
            .e_resumable_cost
            .push(resumable_cost(scenario, sessions, in_flight, duration).await);
    }

    let modern = modern::measure(&modern::Options::default(), duration).await;
    let isolation = isolation::measure(&isolation::Options::full(), duration).await;

    if !no_cluster {
        report.cluster = Some(cluster::measure(&cluster::Options::full(), duration).await);
    }

    std::fs::create_dir_all(out).expect("results directory");
    let json = serde_json::to_string_pretty(&report).expect("serializable");
    std::fs::write(out.join("latest.json"), &json).expect("write results");
    // The soak's and the fuzzing's sections come from runs of their own: kept as they are;
    // so is cluster mode's when this run left it out.
    let old = std::fs::read_to_string("BENCHMARKS.md").unwrap_or_default();
    let mut text = crate::report::keep_sections(
        &old,
        markdown(&report),
        &[soak::SECTION, "## Fuzzing", cluster::SECTION],
    );
    if let Some(c) = &report.cluster {
        text = crate::report::replace_section(&text, cluster::SECTION, &cluster::markdown(c));
    }
    std::fs::write("BENCHMARKS.md", text).expect("write BENCHMARKS.md");
    modern::write(&modern, out);
    isolation::write(&isolation, out);
    println!("{json}");
}

/// (a), (b) and (d) on `target`: its row of the table but for (c).
async fn http_target(target: &Target, duration: Duration) -> TargetReport {
    let mut r = TargetReport {
        name: target.name.clone(),
        ..Default::default()
    };
    r.a_one_session_16 = Some(http_load(&target.url, None, 1, 16, duration).await);
    r.b_64_sessions_64 = Some(http_load(&target.url, None, 64, 64, duration).await);
    r.d = Some(first_call_latency(&target.url, 100).await);
    r
}
