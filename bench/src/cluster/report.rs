//! The "Cluster mode" section of BENCHMARKS.md, from a [`Report`], followed by the hand-kept
//! notes in `bench/NOTES-cluster.md` (what the numbers mean, what was tried).

use super::Report;
use super::load::Tally;
use super::throughput::{Comparison, Cpu, PerCall};
use crate::numbers::list;

/// The heading of the section.
pub const SECTION: &str = "## Cluster mode";

/// The target: cluster mode keeps this share of memory mode's calls/s in (a) and (b).
const SHARE_TARGET: f64 = 70.0;
/// The share cluster mode must reach behind HAProxy keeping sessions on their owners.
const AFFINITY_SHARE_TARGET: f64 = 90.0;
/// Forwards per call, at most, with affinity.
const AFFINITY_FORWARDS: f64 = 0.01;
/// Cluster mode's CPU per call (replicas and Redis) against one replica's, at most, under
/// round-robin.
const CPU_RATIO_TARGET: f64 = 1.5;

/// Whether a comparison ran with HAProxy keeping sessions on their owners.
fn with_affinity(c: &Comparison) -> bool {
    c.scenario.ends_with(", affinity")
}

/// The share target of a comparison.
fn share_target(c: &Comparison) -> f64 {
    if with_affinity(c) {
        AFFINITY_SHARE_TARGET
    } else {
        SHARE_TARGET
    }
}
/// The target: failover p50 at most this many seconds.
const FAILOVER_TARGET: f64 = 1.0;

fn mark(ok: bool) -> &'static str {
    if ok { " ✓" } else { " ✗" }
}

fn causes(t: &Tally) -> String {
    if t.causes.is_empty() {
        return "none".into();
    }
    t.causes
        .iter()
        .map(|(k, n)| format!("{k}: {n}"))
        .collect::<Vec<_>>()
        .join("; ")
}

fn cpu_cells(c: &Cpu) -> String {
    format!(
        "{:.1} | {:.1} | {:.1} | {:.1} | {:.1} | {:.1}",
        c.gateways + c.plugins + c.haproxy + c.redis,
        c.gateways,
        c.plugins,
        c.haproxy,
        c.redis,
        c.load_generator
    )
}

fn per_call_cells(p: &PerCall) -> String {
    let ops = p
        .redis_by_op
        .iter()
        .filter(|(_, n)| **n >= 0.001)
        .map(|(op, n)| format!("{op} {n:.2}"))
        .collect::<Vec<_>>()
        .join(", ");
    format!(
        "{:.2} | {:.2} | {:.2}{}",
        p.forwards,
        p.events_written,
        p.redis_calls,
        if ops.is_empty() {
            String::new()
        } else {
            format!(" ({ops})")
        }
    )
}

pub fn markdown(r: &Report) -> String {
    let mut out = format!(
        "{SECTION}\n\nMeasured by `mcp-bench cluster` (bench/src/cluster/) on {}, commit `{}`, \
         {} cores, {} s per run; the load average was {} before and {} after. \
         {} replicas in cluster mode (Redis at 127.0.0.1:6379 under a key prefix of the run's \
         own) against one replica in memory mode, each behind the same HAProxy (round-robin, no \
         stickiness unless a row says affinity, connections to the replicas kept alive, the \
         tests' config), in alternating \
         pairs of runs, every run on fresh processes (the replicas, HAProxy, sessions opened \
         through it); echo plugin, 64-byte payloads, every reply checked (one answer to the \
         call's id, with the call's text). Raw numbers: `bench/results/cluster.json`. \
         Reproduce: `target/release/mcp-bench cluster` (or `scripts/bench`, which runs it too).\n",
        r.date, r.commit, r.cores, r.seconds_per_run, r.load_before, r.load_after, r.replicas
    );
    for n in &r.notes {
        out.push_str(&format!("\nNote: {n}\n"));
    }
    if !r.throughput.is_empty() {
        out.push_str(&format!(
            "\nThroughput: cluster mode's calls/s in percent of memory mode's, the median of each \
             pair's own share (target ≥ {SHARE_TARGET:.0}% under round-robin, \
             ≥ {AFFINITY_SHARE_TARGET:.0}% with the shipped affinity: rows ending in \
             \"affinity\", where HAProxy keeps each session on the replica that answers for it, \
             `deploy/config/haproxy.cfg`'s `stick` rules, memory mode behind the same). \
             Latency: the medians over runs.\n\n\
             | scenario | runs | cluster, calls/s | memory, calls/s | share per pair | share | \
             cluster p50 / p99 | memory p50 / p99 | wrong, cluster / memory |\n\
             |---|---|---|---|---|---|---|---|---|\n"
        ));
        for c in &r.throughput {
            out.push_str(&format!(
                "| {} | {} × {} s | {} | {} | {} | **{:.1}%**{} | {:.2} / {:.2} ms | {:.2} / {:.2} ms | {} / {} |\n",
                c.scenario,
                2 * c.a_calls_per_sec.len(),
                c.seconds_per_run,
                list(&c.a_calls_per_sec, 0),
                list(&c.b_calls_per_sec, 0),
                list(&c.pair_share_percent, 1),
                c.share_percent,
                mark(c.share_percent >= share_target(c)),
                c.a_p50_ms,
                c.a_p99_ms,
                c.b_p50_ms,
                c.b_p99_ms,
                c.a_tally.failed(),
                c.b_tally.failed(),
            ));
        }
        let wrong: Vec<String> = r
            .throughput
            .iter()
            .filter(|c| c.a_tally.failed() + c.b_tally.failed() > 0)
            .map(|c| {
                format!(
                    "{}: cluster {}; memory {}",
                    c.scenario,
                    causes(&c.a_tally),
                    causes(&c.b_tally)
                )
            })
            .collect();
        if !wrong.is_empty() {
            out.push_str(&format!(
                "\nWrong replies, by cause: {}.\n",
                wrong.join(". ")
            ));
        }
        out.push_str(
            "\nWhere the time goes: CPU time per call answered, in µs (medians over runs; \
             `/proc/PID/stat` of each part over the timed window), and per call, from the \
             replicas' metrics, forwards to the owning replica, replay events written through to \
             Redis, and Redis round trips (by operation; events go in batches).\n\n\
             | scenario | setup | all but the load generator | replicas | plugins | HAProxy | \
             Redis | load generator | forwards | events to Redis | Redis round trips |\n\
             |---|---|---|---|---|---|---|---|---|---|---|\n",
        );
        for c in &r.throughput {
            for (name, cpu, per) in [
                (&c.a, &c.a_cpu, &c.a_per_call),
                (&c.b, &c.b_cpu, &c.b_per_call),
            ] {
                out.push_str(&format!(
                    "| {} | {name} | {} | {} |\n",
                    c.scenario,
                    cpu_cells(cpu),
                    per_call_cells(per)
                ));
            }
        }
    }
    if !r.throughput.is_empty() {
        out.push_str(&format!(
            "\nCluster mode's CPU per call, the replicas' and Redis's together, against memory \
             mode's replica (target ≤ {CPU_RATIO_TARGET}× under round-robin), and its forwards \
             per call (target below {AFFINITY_FORWARDS} with affinity): {}.\n",
            r.throughput
                .iter()
                .map(|c| {
                    let cluster = c.a_cpu.gateways + c.a_cpu.redis;
                    let ratio = cluster / c.b_cpu.gateways.max(f64::EPSILON);
                    let forwards = c.a_per_call.forwards;
                    let met = if with_affinity(c) {
                        forwards < AFFINITY_FORWARDS
                    } else {
                        ratio <= CPU_RATIO_TARGET
                    };
                    format!(
                        "{}: **{ratio:.2}×** ({cluster:.1} against {:.1} µs), {forwards:.3} forwards{}",
                        c.scenario,
                        c.b_cpu.gateways,
                        mark(met)
                    )
                })
                .collect::<Vec<_>>()
                .join("; ")
        ));
    }
    if let Some(h) = &r.hop {
        out.push_str(&format!(
            "\nThe hop: one session owned by replica 0 of a cluster; its calls sent straight to \
             replica 0, or to replica 1, which forwards every one to replica 0 (no HAProxy), in \
             turn on the same processes: {} pairs of {} s with {} calls in flight, and of 2 s \
             with one call at a time.\n\n\
             | | calls/s, {} in flight | p50 one at a time | CPU µs per call: all | replicas | \
             plugins | HAProxy | Redis | load generator | forwards | events to Redis | Redis round trips |\n\
             |---|---|---|---|---|---|---|---|---|---|---|---|\n\
             | straight to the owner | {} | {} ms | {} | {} |\n\
             | through another replica | {} | {} ms | {} | {} |\n\
             | the hop | **{:.1}%** of straight (per pair: {}) | **+{:.0} µs** (median of the pairs) | | | | | | | | | |\n",
            h.direct_calls_per_sec.len(),
            h.seconds_per_run,
            h.in_flight,
            h.in_flight,
            list(&h.direct_calls_per_sec, 0),
            list(&h.sequential_direct_p50_ms, 3),
            cpu_cells(&h.direct_cpu),
            per_call_cells(&h.direct_per_call),
            list(&h.forwarded_calls_per_sec, 0),
            list(&h.sequential_forwarded_p50_ms, 3),
            cpu_cells(&h.forwarded_cpu),
            per_call_cells(&h.forwarded_per_call),
            h.share_percent,
            list(&h.pair_share_percent, 1),
            h.added_p50_us,
        ));
        if h.tally.failed() > 0 {
            out.push_str(&format!(
                "\nWrong replies in the hop's runs: {}.\n",
                causes(&h.tally)
            ));
        }
    }
    if let Some(f) = &r.failover {
        out.push_str(&format!(
            "\nFailover: one session through HAProxy; its owner (as the session's record in \
             Redis names it) SIGKILLed, then the session's next call sent through HAProxy, \
             retried as a client would on 502, 503 (after `Retry-After`, else 50 ms) and broken \
             connections (after 50 ms); timed from the kill to the checked answer. The killed \
             replica is started again (same port) before the next kill.\n\n\
             | kills | p50 | p90 | max | each (s) | retries per kill | killed → served by | calls not answered right |\n\
             |---|---|---|---|---|---|---|---|\n\
             | {} | **{:.3} s**{} | {:.3} s | {:.3} s | {} | {} | {} | {} |\n",
            f.seconds.len(),
            f.p50_s,
            mark(f.p50_s <= FAILOVER_TARGET && !f.seconds.is_empty()),
            f.p90_s,
            f.max_s,
            list(&f.seconds, 3),
            f.retries
                .iter()
                .map(u32::to_string)
                .collect::<Vec<_>>()
                .join(", "),
            f.owners.join(", "),
            f.tally.failed(),
        ));
        if !f.tally.causes.is_empty() {
            out.push_str(&format!(
                "\nWhat the retried attempts got: {}.\n",
                causes(&f.tally)
            ));
        }
        for n in &f.notes {
            out.push_str(&format!("\nNote: {n}\n"));
        }
    }
    if let Some(x) = &r.rolling {
        let t = &x.tally;
        out.push_str(&format!(
            "\nRolling restart under load: {} sessions, {} calls in flight through HAProxy \
             (retried after `Retry-After` on a 503, as a client would); after {} s of load each \
             replica in turn SIGTERMed, waited for, started again on its port, and given {} s \
             of load before the next; {} rounds of the three, {} restarts in all. Then every \
             session's next call.\n\n\
             | calls answered right | of them retried | lost | duplicated | wrong | calls/s | p50 / p99 / max | drain (s) | start until up (s) | sessions answering after |\n\
             |---|---|---|---|---|---|---|---|---|---|\n\
             | {} | {} | **{}**{} | **{}**{} | **{}**{} | {:.0} | {:.2} / {:.2} / {:.0} ms | {} | {} | {} of {}{} |\n",
            x.sessions,
            x.in_flight,
            super::SETTLE.as_secs(),
            super::SETTLE.as_secs(),
            x.rounds,
            x.drain_seconds.len(),
            t.ok,
            t.retried,
            t.lost,
            mark(t.lost == 0),
            t.duplicated,
            mark(t.duplicated == 0),
            t.wrong,
            mark(t.wrong == 0),
            x.throughput.calls_per_sec,
            x.throughput.p50_ms,
            x.throughput.p99_ms,
            x.throughput.max_ms,
            list(&x.drain_seconds, 2),
            list(&x.start_seconds, 2),
            x.sessions_alive_after,
            x.sessions,
            mark(x.sessions_alive_after == x.sessions),
        ));
        out.push_str(&format!(
            "\nCalls retried or failed, by cause: {} ({} retried attempts in all). After the \
             restarts: {}.\n",
            causes(t),
            t.retries,
            causes(&x.after)
        ));
        if !x.failures_after_sigterm.is_empty() {
            out.push_str(&format!(
                "\nWhen the calls that did not end right ended: {}.\n",
                x.failures_after_sigterm
                    .iter()
                    .map(|(who, n, lo, hi)| format!(
                        "{n} within {lo}–{hi} ms after the SIGTERM of {who}"
                    ))
                    .collect::<Vec<_>>()
                    .join("; ")
            ));
        }
        if !x.warnings.is_empty() {
            out.push_str(&format!(
                "\nThe replicas' warnings and errors (their log at `warn`), by what they say: {}.\n",
                x.warnings
                    .iter()
                    .take(12)
                    .map(|(w, n)| format!("`{}`: {n}", w.replace('`', "'").replace('|', "\\|")))
                    .collect::<Vec<_>>()
                    .join("; ")
            ));
        }
    }
    if let Ok(notes) = std::fs::read_to_string("bench/NOTES-cluster.md") {
        out.push('\n');
        out.push_str(&notes);
    }
    out
}
