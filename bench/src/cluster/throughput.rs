//! Throughput in cluster mode: two setups behind the same HAProxy in alternating pairs of runs,
//! each run on fresh processes (as `mcp-bench ceiling` alternates the gateway with the
//! ceiling), and the forwarding hop measured on its own: calls sent straight to the replica
//! that owns the session against calls sent to another replica, which forwards them.
//!
//! Beside calls/s and latency, each run records the CPU time per call of every part (the
//! replicas, their plugin processes, HAProxy, Redis, the load generator; from
//! `/proc/PID/stat`) and, from the replicas' metrics, the forwards and Redis calls per call.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde::Serialize;

use super::harness::{Setup, Spec};
use super::load::{self, Load, Retry, Run, Tally};
use crate::numbers::{median, percent, round1};
use crate::paired::PAIRS;

/// CPU time per call answered, in µs, by part.
#[derive(Debug, Default, Clone, Serialize)]
pub struct Cpu {
    pub gateways: f64,
    pub plugins: f64,
    pub haproxy: f64,
    pub redis: f64,
    pub load_generator: f64,
}

/// Per call answered, from the replicas' metrics: forwards to the owner, replay events
/// written to Redis, and Redis round trips by operation (`mcp_gateway_redis_seconds_count`).
#[derive(Debug, Default, Clone, Serialize)]
pub struct PerCall {
    pub forwards: f64,
    /// Replay events written through to Redis (in batches: see `events_write`).
    pub events_written: f64,
    pub redis_calls: f64,
    pub redis_by_op: BTreeMap<String, f64>,
}

/// One measured run.
#[derive(Debug, Default, Clone, Serialize)]
pub struct Measured {
    pub run: Run,
    pub cpu: Cpu,
    pub per_call: PerCall,
}

/// CPU seconds of every part, and the replicas' counters, at one instant.
struct Snapshot {
    gateways: f64,
    plugins: f64,
    haproxy: f64,
    redis: f64,
    me: f64,
    counters: BTreeMap<String, f64>,
    at: Instant,
}

async fn snapshot(setup: &Setup, redis_pid: Option<u32>) -> Snapshot {
    let replicas = setup.replica_pids();
    let cpu = |pids: &[u32]| {
        pids.iter()
            .map(|p| crate::procfs::cpu_seconds(*p))
            .sum::<f64>()
    };
    let plugins: Vec<u32> = replicas
        .iter()
        .flat_map(|p| crate::procfs::descendants(*p))
        .collect();
    let mut counters = BTreeMap::new();
    for i in 0..setup.len() {
        if let Some(admin) = setup.admin_url(i) {
            scrape(&format!("{admin}/metrics"), &mut counters).await;
        }
    }
    Snapshot {
        gateways: cpu(&replicas),
        plugins: cpu(&plugins),
        haproxy: setup.lb_pid().map_or(0.0, crate::procfs::cpu_seconds),
        redis: redis_pid.map_or(0.0, crate::procfs::cpu_seconds),
        me: crate::procfs::cpu_seconds(std::process::id()),
        counters,
        at: Instant::now(),
    }
}

/// Adds a replica's forwards (by outcome) and Redis calls (by operation) to `into`.
async fn scrape(url: &str, into: &mut BTreeMap<String, f64>) {
    let http = reqwest::Client::builder()
        .timeout(Duration::from_secs(5))
        .no_proxy()
        .build()
        .expect("HTTP client");
    let Ok(text) = async { http.get(url).send().await?.text().await }.await else {
        return;
    };
    for line in text.lines() {
        if let Some(n) = line.strip_prefix("mcp_gateway_redis_events_written_total ") {
            *into.entry("events:written".into()).or_default() += n.trim().parse().unwrap_or(0.0);
            continue;
        }
        let (what, label) = if line.starts_with("mcp_gateway_redis_seconds_count{") {
            ("redis", "operation=\"")
        } else if line.starts_with("mcp_gateway_cluster_forwards_total{") {
            ("forwards", "outcome=\"")
        } else {
            continue;
        };
        let Some(value) = line
            .split(label)
            .nth(1)
            .and_then(|rest| rest.split('"').next())
        else {
            continue;
        };
        let Some(n) = line.rsplit(' ').next().and_then(|n| n.parse::<f64>().ok()) else {
            continue;
        };
        *into.entry(format!("{what}:{value}")).or_default() += n;
    }
}

/// Runs `load` for `d` after its warm-up, with the parts' CPU time and the replicas'
/// counters taken around the timed window.
pub async fn measured(load: &Load, setup: &Setup, d: Duration, redis_pid: Option<u32>) -> Measured {
    let (warmed, is_warm) = tokio::sync::oneshot::channel();
    let (stop, stopped) = tokio::sync::watch::channel(None);
    let window = async {
        if is_warm.await.is_err() {
            stop.send_replace(Some(Instant::now()));
            return None;
        }
        let before = snapshot(setup, redis_pid).await;
        tokio::time::sleep(d).await;
        stop.send_replace(Some(Instant::now()));
        Some((before, snapshot(setup, redis_pid).await))
    };
    let (run, window) = tokio::join!(load.run(warmed, stopped), window);
    let mut m = Measured {
        run,
        ..Default::default()
    };
    let Some((a, b)) = window else {
        return m;
    };
    let calls = m.run.throughput.calls_per_sec * (b.at - a.at).as_secs_f64();
    if calls < 1.0 {
        return m;
    }
    let us = |x: f64, y: f64| round1(1e6 * (y - x) / calls);
    m.cpu = Cpu {
        gateways: us(a.gateways, b.gateways),
        plugins: us(a.plugins, b.plugins),
        haproxy: us(a.haproxy, b.haproxy),
        redis: us(a.redis, b.redis),
        load_generator: us(a.me, b.me),
    };
    let delta = |k: &str| b.counters.get(k).unwrap_or(&0.0) - a.counters.get(k).unwrap_or(&0.0);
    let per = |n: f64| (1000.0 * n / calls).round() / 1000.0;
    m.per_call.forwards = per(delta("forwards:ok"));
    m.per_call.events_written = per(delta("events:written"));
    for k in b.counters.keys().filter(|k| k.starts_with("redis:")) {
        let n = per(delta(k));
        if n > 0.0 {
            m.per_call
                .redis_by_op
                .insert(k["redis:".len()..].to_owned(), n);
            m.per_call.redis_calls += n;
        }
    }
    m.per_call.redis_calls = (1000.0 * m.per_call.redis_calls).round() / 1000.0;
    m
}

/// One side of a comparison.
#[derive(Debug, Clone)]
pub struct Side {
    pub name: String,
    pub spec: Spec,
}

/// Two setups in alternating pairs of runs.
#[derive(Debug, Default, Clone, Serialize)]
pub struct Comparison {
    pub scenario: String,
    pub a: String,
    pub b: String,
    pub seconds_per_run: u64,
    pub a_calls_per_sec: Vec<f64>,
    pub b_calls_per_sec: Vec<f64>,
    /// Per pair: A's calls/s in percent of B's.
    pub pair_share_percent: Vec<f64>,
    /// The median of `pair_share_percent`.
    pub share_percent: f64,
    /// Medians over runs.
    pub a_p50_ms: f64,
    pub a_p99_ms: f64,
    pub b_p50_ms: f64,
    pub b_p99_ms: f64,
    pub a_tally: Tally,
    pub b_tally: Tally,
    /// Medians over runs, part by part.
    pub a_cpu: Cpu,
    pub b_cpu: Cpu,
    pub a_per_call: PerCall,
    pub b_per_call: PerCall,
    pub runs: Vec<[Measured; 2]>,
}

/// A fresh setup, `sessions` sessions opened through HAProxy, `in_flight` workers for `d`.
async fn fresh_run(
    spec: &Spec,
    sessions: usize,
    in_flight: usize,
    d: Duration,
    redis_pid: Option<u32>,
) -> Result<Measured, String> {
    let setup = Setup::start(spec).await?;
    let http = load::client();
    let opened = load::open(&http, &setup.url(), sessions).await;
    let m = match opened {
        Ok(opened) => {
            let load = Load {
                http,
                url: setup.url(),
                sessions: Arc::new(opened),
                in_flight,
                retry: Retry::Never,
            };
            Ok(measured(&load, &setup, d, redis_pid).await)
        }
        Err(e) => Err(format!("opening sessions: {e}")),
    };
    setup.stop().await;
    m
}

/// `a` against `b`, [`PAIRS`] pairs of runs, the order alternating (A-B, B-A, ...).
pub async fn compare(
    scenario: &str,
    a: &Side,
    b: &Side,
    (sessions, in_flight): (usize, usize),
    d: Duration,
    redis_pid: Option<u32>,
) -> Result<Comparison, String> {
    let mut c = Comparison {
        scenario: scenario.into(),
        a: a.name.clone(),
        b: b.name.clone(),
        seconds_per_run: d.as_secs(),
        ..Default::default()
    };
    for pair in 0..PAIRS {
        let mut runs: [Option<Measured>; 2] = [None, None];
        let order = if pair % 2 == 0 { [0, 1] } else { [1, 0] };
        for side in order {
            let spec = if side == 0 { &a.spec } else { &b.spec };
            runs[side] = Some(fresh_run(spec, sessions, in_flight, d, redis_pid).await?);
        }
        let [Some(ra), Some(rb)] = runs else {
            unreachable!("both sides ran")
        };
        let (ta, tb) = (&ra.run.throughput, &rb.run.throughput);
        eprintln!(
            "  {scenario}, pair {}: {} {:.0}/s, {} {:.0}/s",
            pair + 1,
            a.name,
            ta.calls_per_sec,
            b.name,
            tb.calls_per_sec
        );
        c.a_calls_per_sec.push(ta.calls_per_sec.round());
        c.b_calls_per_sec.push(tb.calls_per_sec.round());
        c.pair_share_percent
            .push(percent(ta.calls_per_sec / tb.calls_per_sec.max(1.0)));
        c.a_tally.add(&ra.run.tally);
        c.b_tally.add(&rb.run.tally);
        c.runs.push([ra, rb]);
    }
    c.share_percent = round1(median(&c.pair_share_percent));
    let side = |i: usize| c.runs.iter().map(move |r| &r[i]);
    let med = |i: usize, f: &dyn Fn(&Measured) -> f64| {
        (1000.0 * median(&side(i).map(f).collect::<Vec<_>>())).round() / 1000.0
    };
    c.a_p50_ms = med(0, &|m| m.run.throughput.p50_ms);
    c.a_p99_ms = med(0, &|m| m.run.throughput.p99_ms);
    c.b_p50_ms = med(1, &|m| m.run.throughput.p50_ms);
    c.b_p99_ms = med(1, &|m| m.run.throughput.p99_ms);
    c.a_cpu = median_cpu(side(0));
    c.b_cpu = median_cpu(side(1));
    c.a_per_call = median_per_call(side(0));
    c.b_per_call = median_per_call(side(1));
    Ok(c)
}

fn median_cpu<'a>(runs: impl Iterator<Item = &'a Measured> + Clone) -> Cpu {
    let m =
        |f: fn(&Cpu) -> f64| round1(median(&runs.clone().map(|r| f(&r.cpu)).collect::<Vec<_>>()));
    Cpu {
        gateways: m(|c| c.gateways),
        plugins: m(|c| c.plugins),
        haproxy: m(|c| c.haproxy),
        redis: m(|c| c.redis),
        load_generator: m(|c| c.load_generator),
    }
}

fn median_per_call<'a>(runs: impl Iterator<Item = &'a Measured> + Clone) -> PerCall {
    let m = |f: &dyn Fn(&PerCall) -> f64| {
        (1000.0 * median(&runs.clone().map(|r| f(&r.per_call)).collect::<Vec<_>>())).round()
            / 1000.0
    };
    let ops: std::collections::BTreeSet<String> = runs
        .clone()
        .flat_map(|r| r.per_call.redis_by_op.keys().cloned())
        .collect();
    PerCall {
        forwards: m(&|p| p.forwards),
        events_written: m(&|p| p.events_written),
        redis_calls: m(&|p| p.redis_calls),
        redis_by_op: ops
            .into_iter()
            .map(|op| {
                let v = m(&|p| p.redis_by_op.get(&op).copied().unwrap_or(0.0));
                (op, v)
            })
            .collect(),
    }
}

/// The hop: one session owned by replica 0 of a cluster, its calls sent straight to replica
/// 0 or to replica 1 (which forwards every one), in turn on the same processes.
#[derive(Debug, Default, Clone, Serialize)]
pub struct Hop {
    pub seconds_per_run: u64,
    pub in_flight: usize,
    pub direct_calls_per_sec: Vec<f64>,
    pub forwarded_calls_per_sec: Vec<f64>,
    /// Per pair: forwarded calls/s in percent of direct.
    pub pair_share_percent: Vec<f64>,
    pub share_percent: f64,
    pub direct_cpu: Cpu,
    pub forwarded_cpu: Cpu,
    pub direct_per_call: PerCall,
    pub forwarded_per_call: PerCall,
    /// One call at a time: p50 latency of each run, in ms.
    pub sequential_direct_p50_ms: Vec<f64>,
    pub sequential_forwarded_p50_ms: Vec<f64>,
    /// The median over pairs of what the hop added to one call's p50, in µs.
    pub added_p50_us: f64,
    pub tally: Tally,
}

/// Measures the hop on a fresh cluster of `spec`.
pub async fn hop(spec: &Spec, d: Duration, redis_pid: Option<u32>) -> Result<Hop, String> {
    let setup = Setup::start(spec).await?;
    let r = hop_on(&setup, d, redis_pid).await;
    setup.stop().await;
    r
}

async fn hop_on(setup: &Setup, d: Duration, redis_pid: Option<u32>) -> Result<Hop, String> {
    let http = load::client();
    let session = Arc::new(load::open(&http, &setup.replica_url(0), 1).await?);
    let load = |replica: usize, in_flight: usize| Load {
        http: http.clone(),
        url: setup.replica_url(replica),
        sessions: session.clone(),
        in_flight,
        retry: Retry::Never,
    };
    let in_flight = 16;
    let mut h = Hop {
        seconds_per_run: d.as_secs(),
        in_flight,
        ..Default::default()
    };
    let (mut direct, mut forwarded) = (Vec::new(), Vec::new());
    let mut added = Vec::new();
    for pair in 0..PAIRS {
        let mut m: [Option<Measured>; 2] = [None, None];
        let mut seq: [f64; 2] = [0.0; 2];
        let order = if pair % 2 == 0 { [0, 1] } else { [1, 0] };
        for replica in order {
            let got = measured(&load(replica, in_flight), setup, d, redis_pid).await;
            let one = load(replica, 1).run_for(Duration::from_secs(2)).await;
            seq[replica] = one.throughput.p50_ms;
            h.tally.add(&got.run.tally);
            h.tally.add(&one.tally);
            m[replica] = Some(got);
        }
        let [Some(a), Some(b)] = m else {
            unreachable!("both ran")
        };
        let (ta, tb) = (&a.run.throughput, &b.run.throughput);
        eprintln!(
            "  hop, pair {}: direct {:.0}/s (p50 alone {:.3} ms), forwarded {:.0}/s (p50 alone {:.3} ms)",
            pair + 1,
            ta.calls_per_sec,
            seq[0],
            tb.calls_per_sec,
            seq[1]
        );
        h.direct_calls_per_sec.push(ta.calls_per_sec.round());
        h.forwarded_calls_per_sec.push(tb.calls_per_sec.round());
        h.pair_share_percent
            .push(percent(tb.calls_per_sec / ta.calls_per_sec.max(1.0)));
        h.sequential_direct_p50_ms.push(seq[0]);
        h.sequential_forwarded_p50_ms.push(seq[1]);
        added.push(1000.0 * (seq[1] - seq[0]));
        direct.push(a);
        forwarded.push(b);
    }
    h.share_percent = round1(median(&h.pair_share_percent));
    h.added_p50_us = median(&added).round();
    h.direct_cpu = median_cpu(direct.iter());
    h.forwarded_cpu = median_cpu(forwarded.iter());
    h.direct_per_call = median_per_call(direct.iter());
    h.forwarded_per_call = median_per_call(forwarded.iter());
    Ok(h)
}
