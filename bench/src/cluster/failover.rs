//! Crashes and deploys in cluster mode, through HAProxy.
//!
//! - Failover: the replica that owns a session is SIGKILLed; the time from the kill until
//!   the same session's next call is answered (retried as a client would on 502, 503 and
//!   broken connections), repeated with the killed replica started again between kills.
//! - Rolling restart: while workers over many sessions call `echo` (every reply checked),
//!   each replica in turn is stopped (SIGTERM, waited for) and started again on its port.
//!   A call refused with 503 and `Retry-After` is sent again after it, as a client would, and
//!   counted as retried; a call whose answer never came is lost.

use std::sync::Arc;
use std::time::{Duration, Instant};

use serde::Serialize;

use super::harness::{Setup, Spec};
use super::load::{self, Load, Retry, Tally, Verdict};
use crate::load::Throughput;
use crate::numbers::median;

/// The failover scenario's result.
#[derive(Debug, Default, Clone, Serialize)]
pub struct Failover {
    pub kills: usize,
    /// Per kill: seconds from the SIGKILL to the answer of the session's next call.
    pub seconds: Vec<f64>,
    pub p50_s: f64,
    pub p90_s: f64,
    pub max_s: f64,
    /// Per kill: attempts that were retried before the answer.
    pub retries: Vec<u32>,
    /// Per kill: `killed → served by` (replica indexes).
    pub owners: Vec<String>,
    pub tally: Tally,
    pub notes: Vec<String>,
}

/// The nearest-rank quantile `q` of `v`.
pub fn quantile(v: &[f64], q: f64) -> f64 {
    let mut v = v.to_vec();
    v.sort_by(f64::total_cmp);
    if v.is_empty() {
        return 0.0;
    }
    let rank = ((q * v.len() as f64).ceil() as usize).clamp(1, v.len());
    v[rank - 1]
}

/// The replica that holds the run's one session: the one running replica whose metrics count
/// a session open. (Redis names the owner only under a keyed hash of the session's id, in a
/// signed record: not for a load generator to read.)
async fn owner(setup: &Setup) -> Option<usize> {
    let http = load::client();
    let mut found = None;
    for i in 0..setup.len() {
        let Some(admin) = setup.admin_url(i) else {
            continue;
        };
        let Ok(text) = async {
            http.get(format!("{admin}/metrics"))
                .send()
                .await?
                .text()
                .await
        }
        .await
        else {
            continue;
        };
        let open = text
            .lines()
            .find_map(|l| l.strip_prefix("mcp_gateway_sessions_active "))
            .and_then(|n| n.trim().parse::<f64>().ok())
            .unwrap_or(0.0);
        if open >= 1.0 {
            if found.is_some() {
                return None;
            }
            found = Some(i);
        }
    }
    found
}

/// `kills` SIGKILLs of the owner of one session, on a fresh cluster of `spec`.
pub async fn failover(spec: &Spec, kills: usize) -> Result<Failover, String> {
    let mut setup = Setup::start(spec).await?;
    let r = failover_on(&mut setup, kills).await;
    setup.stop().await;
    r
}

async fn failover_on(setup: &mut Setup, kills: usize) -> Result<Failover, String> {
    let http = load::client();
    let url = setup.url();
    let session = load::open(&http, &url, 1)
        .await?
        .pop()
        .expect("one session");
    let mut f = Failover {
        kills,
        ..Default::default()
    };
    let mut id = 0u64;
    let mut next_call = async |f: &mut Failover| {
        id += 1;
        let text = format!("failover-{id:08}-{}", "x".repeat(40));
        let o = load::call(&http, &url, &session, id, &text, Retry::Failover).await;
        f.tally.add_outcome(&o);
        o
    };
    // The session's plugin runs on its owner before the first kill.
    let first = next_call(&mut f).await;
    if first.verdict != Verdict::Ok {
        return Err(format!("the first call failed: {:?}", first.verdict));
    }
    for k in 0..kills {
        let Some(victim) = owner(setup).await else {
            f.notes
                .push(format!("kill {}: the session's owner is not known", k + 1));
            break;
        };
        setup.kill(victim).await;
        let killed = Instant::now();
        let o = next_call(&mut f).await;
        let took = killed.elapsed();
        let served = owner(setup).await;
        eprintln!(
            "  kill {}: replica {victim} killed; the next call {:?} after {:.3} s ({} retries), served by {served:?}",
            k + 1,
            o.verdict,
            took.as_secs_f64(),
            o.retries
        );
        if o.verdict != Verdict::Ok {
            f.notes.push(format!(
                "kill {}: the next call ended {:?}",
                k + 1,
                o.verdict
            ));
        }
        f.seconds
            .push((took.as_secs_f64() * 1000.0).round() / 1000.0);
        f.retries.push(o.retries);
        f.owners.push(format!(
            "{victim} → {}",
            served.map_or("?".into(), |s| s.to_string())
        ));
        setup.restart(victim).await?;
    }
    f.p50_s = (median(&f.seconds) * 1000.0).round() / 1000.0;
    f.p90_s = quantile(&f.seconds, 0.9);
    f.max_s = quantile(&f.seconds, 1.0);
    Ok(f)
}

/// The rolling restart's result.
#[derive(Debug, Default, Clone, Serialize)]
pub struct Rolling {
    pub sessions: usize,
    pub in_flight: usize,
    /// Restarts of every replica, one after another.
    pub rounds: usize,
    pub load_seconds: f64,
    pub throughput: Throughput,
    pub tally: Tally,
    /// Per restart, in order: SIGTERM until the replica exited.
    pub drain_seconds: Vec<f64>,
    /// Per restart: its start until HAProxy saw it up.
    pub start_seconds: Vec<f64>,
    /// When the calls that did not end right ended, by the replica whose SIGTERM came last
    /// before: how many, and how long after it (ms, first and last).
    pub failures_after_sigterm: Vec<(String, usize, u64, u64)>,
    /// After the restarts: sessions whose next call was answered right.
    pub sessions_alive_after: usize,
    pub after: Tally,
    /// The replicas' warnings and errors, by what they say, with counts.
    pub warnings: Vec<(String, u64)>,
}

/// `rounds` rolling restarts of every replica of a fresh cluster of `spec`, under load.
pub async fn rolling(
    spec: &Spec,
    (sessions, in_flight): (usize, usize),
    rounds: usize,
    settle: Duration,
) -> Result<Rolling, String> {
    let mut setup = Setup::start(spec).await?;
    let r = rolling_on(&mut setup, (sessions, in_flight), rounds, settle).await;
    setup.stop().await;
    r
}

async fn rolling_on(
    setup: &mut Setup,
    (sessions, in_flight): (usize, usize),
    rounds: usize,
    settle: Duration,
) -> Result<Rolling, String> {
    let http = load::client();
    let opened = Arc::new(load::open(&http, &setup.url(), sessions).await?);
    let load = Load {
        http: http.clone(),
        url: setup.url(),
        sessions: opened.clone(),
        in_flight,
        retry: Retry::Unavailable,
    };
    let (warmed, is_warm) = tokio::sync::oneshot::channel();
    let (stop, stopped) = tokio::sync::watch::channel(None);
    let mut r = Rolling {
        sessions,
        in_flight,
        rounds,
        ..Default::default()
    };
    let restarts = async {
        let fail = |e: String, stop: &load::Stop| {
            stop.send_replace(Some(Instant::now()));
            Err(e)
        };
        if is_warm.await.is_err() {
            return fail("the load did not start".into(), &stop);
        }
        let began = Instant::now();
        tokio::time::sleep(settle).await;
        let (mut drains, mut starts, mut sigterms) = (Vec::new(), Vec::new(), Vec::new());
        let replicas = setup.len();
        for i in (0..rounds).flat_map(|_| 0..replicas) {
            sigterms.push((i, Instant::now()));
            let drain = setup.terminate(i).await;
            let started = Instant::now();
            if let Err(e) = setup.restart(i).await {
                return fail(e, &stop);
            }
            eprintln!(
                "  rolling restart: replica {i} drained in {:.2} s, up again in {:.2} s",
                drain.as_secs_f64(),
                started.elapsed().as_secs_f64()
            );
            drains.push((drain.as_secs_f64() * 100.0).round() / 100.0);
            starts.push((started.elapsed().as_secs_f64() * 100.0).round() / 100.0);
            tokio::time::sleep(settle).await;
        }
        stop.send_replace(Some(Instant::now()));
        Ok((drains, starts, sigterms, began.elapsed()))
    };
    let (run, restarts) = tokio::join!(load.run(warmed, stopped), restarts);
    let (drains, starts, sigterms, took) = restarts?;
    let mut by_sigterm = std::collections::BTreeMap::<String, Vec<u64>>::new();
    for at in &run.tally.failed_at {
        let last = sigterms.iter().rev().find(|(_, t)| t <= at);
        let (key, ms) = match last {
            Some((i, t)) => (format!("replica {i}"), (*at - *t).as_millis() as u64),
            None => ("before the first SIGTERM".to_owned(), 0),
        };
        by_sigterm.entry(key).or_default().push(ms);
    }
    r.failures_after_sigterm = by_sigterm
        .into_iter()
        .map(|(k, v)| {
            let (lo, hi) = (v.iter().min().copied(), v.iter().max().copied());
            (k, v.len(), lo.unwrap_or(0), hi.unwrap_or(0))
        })
        .collect();
    r.drain_seconds = drains;
    r.start_seconds = starts;
    r.load_seconds = (took.as_secs_f64() * 10.0).round() / 10.0;
    r.throughput = run.throughput;
    r.tally = run.tally;
    // Every session goes on after the restarts.
    for (n, s) in opened.iter().enumerate() {
        let id = 1 << 60 | n as u64;
        let text = format!("after-{n:04}");
        let o = load::call(&http, &setup.url(), s, id, &text, Retry::Unavailable).await;
        if o.verdict == Verdict::Ok {
            r.sessions_alive_after += 1;
        }
        r.after.add_outcome(&o);
    }
    let mut grouped = std::collections::BTreeMap::<String, u64>::new();
    for line in setup.warnings() {
        let line = line.split_once(": ").map_or(line.as_str(), |(_, l)| l);
        if let Some(g) = crate::harness::gist(line) {
            *grouped.entry(g).or_default() += 1;
        }
    }
    let mut warnings: Vec<(String, u64)> = grouped.into_iter().collect();
    warnings.sort_by_key(|w| std::cmp::Reverse(w.1));
    r.warnings = warnings;
    Ok(r)
}
