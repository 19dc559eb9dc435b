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
//! process and (a) and (b) (bench/src/isolation.rs); the audit log on against off, (a) and (b)
//! (bench/src/audit.rs). Every reply is checked: a wrong or missing one is counted. Results go
//! to `bench/results/latest.json` and `BENCHMARKS.md`.
//!
//! # Layout
//!
//! The modules are layers: each imports only those listed below it, so there is no loop. From
//! the top:
//!
//! - this file: the command line and which module each command goes to.
//! - [`full`]: the full run (no subcommand): every target of the main table, then the
//!   commands below, into `latest.json` and BENCHMARKS.md.
//! - The commands with results of their own: [`soak`], [`cluster`], [`modern`], [`isolation`],
//!   [`audit`];
//!   beside them [`scenarios`]: (c), (d), the share of the in-process ceiling and (e).
//! - [`paired`]: two targets in alternating pairs of runs, every run on a fresh process.
//! - [`load`]: the load generator, checking every answer, into a [`load::Throughput`].
//! - [`harness`]: the processes measured: a gateway, the in-process ceiling, a peer.
//! - Leaves, which import no other module: [`mcp`] (an MCP client over Streamable HTTP),
//!   [`procfs`] (readings from `/proc`), [`numbers`] (medians, percents, lists), [`report`]
//!   (the date and commit of a run, its JSON, a section of BENCHMARKS.md) and [`inproc`] (the
//!   in-process ceiling's server).

use std::path::PathBuf;
use std::time::Duration;

use clap::{Parser, Subcommand};

use harness::SHARED_PLUGIN;
use load::http_load;
use procfs::raise_fd_limit;
use scenarios::{ceiling_share, first_call_latency, idle_sessions, resumable_cost};

mod audit;
mod cluster;
mod full;
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
        /// Where the calls go, if not to `--url` where the sessions open: another replica of a
        /// cluster, so that each call is forwarded to its session's owner.
        #[arg(long)]
        call_url: Option<String>,
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
        /// The target's admin listener (`http://127.0.0.1:PORT`): once the streams are open,
        /// read a sample of them until each says something (a keep-alive), and ask its
        /// `/healthz` meanwhile.
        #[arg(long)]
        admin: Option<String>,
        /// Over HTTP/2 without TLS (prior knowledge), 190 streams per connection: many
        /// streams on few sockets.
        #[arg(long)]
        http2: bool,
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
    /// The audit log on (as by default) against `[audit] enabled = false`, on the same gateway
    /// build, in alternating pairs of runs lasting half of `--duration`: (a) and (b), calls/s
    /// and the gateway's CPU per call (bench/src/audit.rs); results in `audit.json`.
    Audit(audit::Options),
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
            call_url,
            sessions,
            in_flight,
            seconds,
            modern,
        }) => {
            let seconds = Duration::from_secs(seconds);
            let t = if modern {
                rt.block_on(modern::echo_load(&url, in_flight, seconds))
            } else {
                rt.block_on(http_load(
                    &url,
                    call_url.as_deref(),
                    sessions,
                    in_flight,
                    seconds,
                ))
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
            admin,
            http2,
        }) => {
            raise_fd_limit();
            let hold = Duration::from_secs(hold_secs);
            let idle = idle_sessions(&url, pid, sessions, hold, admin.as_deref(), http2);
            match rt.block_on(idle) {
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
        Some(Cmd::Audit(options)) => rt.block_on(audit::main(
            options,
            Duration::from_secs(cli.duration),
            &cli.out,
        )),
        None => rt.block_on(full::run(
            cli.duration,
            &cli.idle_sessions,
            &cli.out,
            cli.no_cluster,
        )),
    }
}
