//! Paired comparisons: two targets driven in turn, A-B then B-A and so on, every run on a
//! fresh process, so that the machine's drift falls on both alike; with each run's
//! throughput, the target's CPU time per call and the load generator's. The ceiling share, (e),
//! and the modern and isolation comparisons are read from such pairs; cluster mode pairs its
//! runs of several processes as many times, each as long ([`PAIRS`], [`pair_run`]).

use std::time::Duration;

use crate::harness::Target;
use crate::load::{Throughput, http_load};
use crate::procfs::cpu_seconds;

/// One run of [`alternate`]: its throughput and the target process's own CPU time per call.
pub(crate) struct Run {
    pub(crate) throughput: Throughput,
    pub(crate) cpu_us_per_call: f64,
    /// This process's (the load generator's) CPU time per call, in µs.
    pub(crate) client_cpu_us_per_call: f64,
}

/// Two targets driven in turn for [`PAIRS`] pairs of runs of `run` each, every run on a fresh
/// process, the order alternating (A-B, B-A, ...) so that the machine's drift during the runs
/// falls on both alike. Each run is `sessions` sessions with `in_flight` calls of `echo`.
/// Returns each pair's runs as `[A, B]`.
pub(crate) async fn alternate<A, B>(
    sessions: usize,
    in_flight: usize,
    run: Duration,
    start_a: impl Fn() -> A,
    start_b: impl Fn() -> B,
) -> Vec<[Run; 2]>
where
    A: Future<Output = Target>,
    B: Future<Output = Target>,
{
    alternate_with(start_a, start_b, async |_, url| {
        http_load(&url, None, sessions, in_flight, run).await
    })
    .await
}

/// [`alternate`] with the load of each run given: `load(side, url)`, side 0 for A, 1 for B.
pub(crate) async fn alternate_with<A, B>(
    start_a: impl Fn() -> A,
    start_b: impl Fn() -> B,
    load: impl AsyncFn(usize, String) -> Throughput,
) -> Vec<[Run; 2]>
where
    A: Future<Output = Target>,
    B: Future<Output = Target>,
{
    let mut out = Vec::with_capacity(PAIRS);
    for pair in 0..PAIRS {
        let mut runs: [Option<Run>; 2] = [None, None];
        let order = if pair % 2 == 0 { [0, 1] } else { [1, 0] };
        for side in order {
            let target = if side == 0 {
                start_a().await
            } else {
                start_b().await
            };
            let me = std::process::id();
            let (cpu_before, me_before) = (cpu_seconds(target.pid()), cpu_seconds(me));
            let throughput = load(side, target.url.clone()).await;
            let cpu = cpu_seconds(target.pid()) - cpu_before;
            let me_cpu = cpu_seconds(me) - me_before;
            drop(target);
            let per_call = |cpu: f64| (1e7 * cpu / throughput.ok.max(1) as f64).round() / 10.0;
            runs[side] = Some(Run {
                cpu_us_per_call: per_call(cpu),
                client_cpu_us_per_call: per_call(me_cpu),
                throughput,
            });
        }
        let [Some(a), Some(b)] = runs else {
            unreachable!("both sides ran")
        };
        out.push([a, b]);
    }
    out
}

/// Pairs of runs in a paired comparison: with fewer, one outlier pair moves the median.
pub(crate) const PAIRS: usize = 6;

/// How long each run of a pair lasts: half a scenario's duration, so that a comparison takes
/// about as long per pair as a scenario does, and at least 2 s.
pub(crate) fn pair_run(duration: Duration) -> Duration {
    (duration / 2).max(Duration::from_secs(2))
}
