//! `mcp-bench cluster`: cluster mode (issue 21) measured through a real load balancer.
//!
//! Three replicas in cluster mode (Redis, a key prefix of the run's own) against one replica
//! in memory mode, each behind the same HAProxy (round-robin, no stickiness): throughput in
//! (a) and (b) in alternating pairs of runs on fresh processes, with a plugin process per
//! session and with one shared plugin process ([`throughput`]); what the hop to the owning
//! replica costs; failover after a SIGKILL of a session's owner and a rolling restart under
//! load ([`failover`]). The processes are set up by [`harness`]; the load and its checks are
//! in [`load`]. Results go to `bench/results/cluster.json` and the "Cluster mode" section of
//! BENCHMARKS.md ([`report`]); the full run (`scripts/bench`) runs this too.

mod failover;
mod harness;
mod load;
mod redis;
mod report;
mod throughput;

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Serialize;

use failover::{Failover, Rolling};
use harness::Spec;
use throughput::{Comparison, Hop, Side};

pub use report::{SECTION, markdown};

/// What `mcp-bench cluster` runs.
#[derive(clap::Args, Debug, Clone)]
pub struct Options {
    /// The parts to run, comma-separated.
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "throughput,affinity,hop,failover,rolling"
    )]
    pub parts: Vec<Part>,
    /// The Redis the replicas share (keys under a prefix of the run's own, deleted after).
    #[arg(long, default_value = "redis://127.0.0.1:6379")]
    pub redis_url: String,
    /// SIGKILLs of a session's owner in the failover part.
    #[arg(long, default_value_t = 20)]
    pub kills: usize,
    /// Compare cluster mode on this gateway binary (B) with cluster mode on the usual one (A)
    /// instead of with memory mode: an A/B of two builds. Writes nothing but its JSON.
    #[arg(long)]
    pub against: Option<PathBuf>,
    /// Rolling restarts of every replica in the rolling part, one after another.
    #[arg(long, default_value_t = 3)]
    pub rounds: usize,
    /// The gateway binary to measure (default: `mcp-gateway` beside this one).
    #[arg(long)]
    pub gateway: Option<PathBuf>,
}

impl Options {
    /// Everything, as the full run does it.
    pub fn full() -> Options {
        Options {
            parts: vec![
                Part::Throughput,
                Part::Affinity,
                Part::Hop,
                Part::Failover,
                Part::Rolling,
            ],
            redis_url: "redis://127.0.0.1:6379".into(),
            kills: 20,
            rounds: 3,
            against: None,
            gateway: None,
        }
    }
}

#[derive(clap::ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
pub enum Part {
    Throughput,
    /// Throughput again, HAProxy keeping each session on its owner (the shipped affinity).
    Affinity,
    Hop,
    Failover,
    Rolling,
}

/// Replicas in cluster mode.
const REPLICAS: usize = 3;
/// (b)'s sessions and calls in flight, also the rolling restart's load.
const B: (usize, usize) = (64, 64);
/// How long the rolling restart's load runs before the first restart and after each.
const SETTLE: Duration = Duration::from_secs(3);

#[derive(Debug, Default, Serialize)]
pub struct Report {
    pub date: String,
    pub commit: String,
    pub cores: usize,
    pub seconds_per_run: u64,
    pub replicas: usize,
    /// `/proc/loadavg` before and after.
    pub load_before: String,
    pub load_after: String,
    pub throughput: Vec<Comparison>,
    pub hop: Option<Hop>,
    /// The hop on the `--against` binary.
    pub against_hop: Option<Hop>,
    pub failover: Option<Failover>,
    pub rolling: Option<Rolling>,
    pub notes: Vec<String>,
}

/// Runs the parts `opts` names, each run lasting half of `duration` (as the paired runs of
/// the full run do).
pub async fn measure(opts: &Options, duration: Duration) -> Report {
    let run = crate::paired::pair_run(duration);
    // From here on, SIGINT and SIGTERM end what this started, and then the process.
    tokio::spawn(harness::clean_up_and_exit());
    let mut r = Report {
        date: crate::report::date(),
        commit: crate::report::commit_excluding(&["BENCHMARKS.md", "bench/results/"]),
        cores: std::thread::available_parallelism().map_or(1, |n| n.get()),
        seconds_per_run: run.as_secs(),
        replicas: REPLICAS,
        load_before: crate::procfs::loadavg(),
        ..Default::default()
    };
    if !redis::up(&opts.redis_url).await {
        r.notes
            .push(format!("did not run: no Redis at {}", opts.redis_url));
        return r;
    }
    if !Path::new(harness::haproxy_binary()).exists() && which("haproxy").is_none() {
        r.notes
            .push("did not run: no haproxy (scripts/install-test-deps)".into());
        return r;
    }
    let redis_pid = redis::pid(&opts.redis_url).await;
    let gateway = opts
        .gateway
        .clone()
        .unwrap_or_else(|| crate::harness::sibling("mcp-gateway"));
    let spec = |replicas: usize, cluster: bool, binary: &Path, config, affinity| Spec {
        replicas,
        redis_url: cluster.then(|| opts.redis_url.clone()),
        binary: binary.to_owned(),
        config,
        affinity,
    };
    let has = |p: Part| opts.parts.contains(&p);
    let balancing = [
        (false, Part::Throughput, ""),
        (true, Part::Affinity, ", affinity"),
    ];
    for (affinity, part, label) in balancing.into_iter().filter(|(_, p, _)| has(*p)) {
        eprintln!("cluster: {part:?}");
        for (model, config) in [
            ("a plugin process per session", None),
            (
                "one shared plugin process",
                Some(crate::harness::SHARED_PLUGIN),
            ),
        ] {
            for (scenario, shape) in [("(a) 1 session ×16", (1, 16)), ("(b) 64 sessions ×64", B)]
            {
                let a = Side {
                    name: "cluster".into(),
                    spec: spec(REPLICAS, true, &gateway, config, affinity),
                };
                let b = match &opts.against {
                    Some(other) => Side {
                        name: format!("cluster on {}", other.display()),
                        spec: spec(REPLICAS, true, other, config, affinity),
                    },
                    None => Side {
                        name: "memory".into(),
                        spec: spec(1, false, &gateway, config, affinity),
                    },
                };
                let name = format!("{scenario}, {model}{label}");
                eprintln!("cluster: {name}");
                match throughput::compare(&name, &a, &b, shape, run, redis_pid).await {
                    Ok(c) => {
                        eprintln!("  share {:.1}%", c.share_percent);
                        r.throughput.push(c);
                    }
                    Err(e) => r.notes.push(format!("{name}: {e}")),
                }
            }
        }
    }
    let per_session = spec(REPLICAS, true, &gateway, None, false);
    if has(Part::Hop) {
        eprintln!("cluster: the hop");
        match throughput::hop(&per_session, run, redis_pid).await {
            Ok(h) => r.hop = Some(h),
            Err(e) => r.notes.push(format!("the hop: {e}")),
        }
        if let Some(other) = &opts.against {
            eprintln!("cluster: the hop on {}", other.display());
            match throughput::hop(&spec(REPLICAS, true, other, None, false), run, redis_pid).await {
                Ok(h) => r.against_hop = Some(h),
                Err(e) => r.notes.push(format!("the hop on {}: {e}", other.display())),
            }
        }
    }
    if has(Part::Failover) {
        eprintln!("cluster: failover, {} kills", opts.kills);
        match failover::failover(&per_session, opts.kills).await {
            Ok(f) => r.failover = Some(f),
            Err(e) => r.notes.push(format!("failover: {e}")),
        }
    }
    if has(Part::Rolling) {
        eprintln!("cluster: rolling restart under load");
        match failover::rolling(&per_session, B, opts.rounds, SETTLE).await {
            Ok(x) => r.rolling = Some(x),
            Err(e) => r.notes.push(format!("rolling restart: {e}")),
        }
    }
    r.load_after = crate::procfs::loadavg();
    r
}

fn which(program: &str) -> Option<PathBuf> {
    std::env::var_os("PATH")?
        .to_str()?
        .split(':')
        .map(|d| Path::new(d).join(program))
        .find(|p| p.exists())
}

/// `mcp-bench cluster`: measures, prints the JSON, and (when every part ran on this build
/// alone) writes `cluster.json` in `out` and the section of BENCHMARKS.md.
pub async fn main(opts: Options, duration: Duration, out: &Path) {
    crate::procfs::raise_fd_limit();
    let r = measure(&opts, duration).await;
    let json = serde_json::to_string_pretty(&r).expect("serializable");
    println!("{json}");
    if opts.against.is_some()
        || Options::full()
            .parts
            .iter()
            .any(|p| !opts.parts.contains(p))
    {
        eprintln!("cluster: a partial or A/B run; nothing written");
        return;
    }
    std::fs::create_dir_all(out).expect("results directory");
    std::fs::write(out.join("cluster.json"), &json).expect("write results");
    write_section(&r);
}

/// Replaces (or adds) the section in BENCHMARKS.md.
pub fn write_section(r: &Report) {
    let old = std::fs::read_to_string("BENCHMARKS.md").unwrap_or_default();
    let text = crate::report::replace_section(&old, SECTION, &markdown(r));
    std::fs::write("BENCHMARKS.md", text).expect("write BENCHMARKS.md");
    eprintln!("cluster: wrote the {SECTION} section of BENCHMARKS.md");
}
