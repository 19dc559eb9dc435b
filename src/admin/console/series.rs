//! What the console plots: every two seconds over the last fifteen minutes, kept in memory,
//! the sessions open and, for all plugins together and for each, calls answered per second,
//! the share that failed, and the median and 99th percentile of their durations. Read from
//! the process's metrics ([`crate::metrics::plugin_totals`]) by one sampling task, so the
//! request path does no extra work for it; quantiles are interpolated within the histogram's
//! buckets, as Prometheus's `histogram_quantile` does.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use serde_json::{Value, json};

use crate::gateway::Gateway;
use crate::metrics::{PluginTotals, duration_bounds};

/// Time between two points.
pub const PERIOD: Duration = Duration::from_secs(2);
/// Points kept: fifteen minutes.
pub const POINTS: usize = 450;

/// One interval of one track.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
struct Point {
    calls_per_s: f64,
    /// Failed calls over calls; none without calls.
    error_rate: Option<f64>,
    p50_ms: Option<f64>,
    p99_ms: Option<f64>,
}

/// The plots' data.
#[derive(Default)]
pub struct Series {
    inner: Mutex<Inner>,
}

#[derive(Default)]
struct Inner {
    /// When each point was taken, in milliseconds since the epoch.
    t: VecDeque<i64>,
    sessions: VecDeque<u64>,
    total: VecDeque<Point>,
    plugins: HashMap<String, VecDeque<Point>>,
    /// The previous reading, diffed with the next.
    last: Option<HashMap<String, PluginTotals>>,
}

impl Series {
    /// Starts sampling `gw` until it stops.
    pub fn start(gw: &Arc<Gateway>) -> Arc<Series> {
        let series = Arc::new(Series::default());
        tokio::spawn(sample(
            Arc::downgrade(gw),
            Arc::downgrade(&series),
            gw.shutdown.clone(),
        ));
        series
    }

    /// Takes a point: `totals` now, `sessions` open now.
    fn push(&self, now_ms: i64, sessions: u64, totals: HashMap<String, PluginTotals>) {
        let mut inner = self.inner.lock().expect("series lock");
        let Some(last) = inner.last.replace(totals.clone()) else {
            return;
        };
        let secs = PERIOD.as_secs_f64();
        let mut all = PluginTotals::default();
        let mut points = HashMap::new();
        for (name, now) in &totals {
            let before = last.get(name).cloned().unwrap_or_default();
            let delta = diff(now, &before);
            add(&mut all, &delta);
            points.insert(name.clone(), point(&delta, secs));
        }
        let len = inner.t.len();
        inner.t.push_back(now_ms);
        inner.sessions.push_back(sessions);
        inner.total.push_back(point(&all, secs));
        // A plugin first seen now is padded to the others' length; one gone is dropped.
        inner.plugins.retain(|name, _| totals.contains_key(name));
        for (name, p) in points {
            let track = inner
                .plugins
                .entry(name)
                .or_insert_with(|| std::iter::repeat_n(Point::default(), len).collect());
            track.push_back(p);
        }
        if inner.t.len() > POINTS {
            inner.t.pop_front();
            inner.sessions.pop_front();
            inner.total.pop_front();
            for track in inner.plugins.values_mut() {
                track.pop_front();
            }
        }
    }

    /// The overview's plots: sessions and the plugins together.
    pub fn overview(&self) -> Value {
        let inner = self.inner.lock().expect("series lock");
        let mut v = track(&inner.total);
        v["t"] = json!(inner.t);
        v["sessions"] = json!(inner.sessions);
        v
    }

    /// One plugin's plots (empty before its first call).
    pub fn plugin(&self, name: &str) -> Value {
        let inner = self.inner.lock().expect("series lock");
        let mut v = inner
            .plugins
            .get(name)
            .map_or_else(|| track(&VecDeque::new()), track);
        v["t"] = json!(inner.t);
        v
    }
}

fn track(points: &VecDeque<Point>) -> Value {
    json!({
        "calls_per_s": points.iter().map(|p| p.calls_per_s).collect::<Vec<_>>(),
        "error_rate": points.iter().map(|p| p.error_rate).collect::<Vec<_>>(),
        "p50_ms": points.iter().map(|p| p.p50_ms).collect::<Vec<_>>(),
        "p99_ms": points.iter().map(|p| p.p99_ms).collect::<Vec<_>>(),
    })
}

fn diff(now: &PluginTotals, before: &PluginTotals) -> PluginTotals {
    // A counter that went down (a plugin removed and added again) starts over.
    let sub = |a: u64, b: u64| if a >= b { a - b } else { a };
    PluginTotals {
        answered: sub(now.answered, before.answered),
        errors: sub(now.errors, before.errors),
        buckets: now
            .buckets
            .iter()
            .enumerate()
            .map(|(i, n)| sub(*n, before.buckets.get(i).copied().unwrap_or(0)))
            .collect(),
    }
}

fn add(sum: &mut PluginTotals, more: &PluginTotals) {
    sum.answered += more.answered;
    sum.errors += more.errors;
    sum.buckets
        .resize(more.buckets.len().max(sum.buckets.len()), 0);
    for (s, m) in sum.buckets.iter_mut().zip(&more.buckets) {
        *s += m;
    }
}

fn point(delta: &PluginTotals, secs: f64) -> Point {
    let n = delta.answered;
    Point {
        calls_per_s: n as f64 / secs,
        error_rate: (n > 0).then(|| (delta.errors.min(n)) as f64 / n as f64),
        p50_ms: quantile(delta, 0.5).map(|s| s * 1000.0),
        p99_ms: quantile(delta, 0.99).map(|s| s * 1000.0),
    }
}

/// The `q` quantile of the durations, in seconds, interpolated within its bucket; the last
/// bound when it falls beyond it.
fn quantile(delta: &PluginTotals, q: f64) -> Option<f64> {
    let n = delta.answered;
    if n == 0 {
        return None;
    }
    let bounds = duration_bounds();
    let rank = q * n as f64;
    let mut below = 0u64;
    let mut lower = 0.0;
    for (i, &count) in delta.buckets.iter().enumerate() {
        let upper = bounds[i];
        if count as f64 >= rank {
            let inside = count.saturating_sub(below);
            if inside == 0 {
                return Some(upper);
            }
            return Some(lower + (upper - lower) * (rank - below as f64) / inside as f64);
        }
        below = count;
        lower = upper;
    }
    bounds.last().copied()
}

async fn sample(
    gw: Weak<Gateway>,
    series: Weak<Series>,
    shutdown: tokio_util::sync::CancellationToken,
) {
    let mut tick = tokio::time::interval(PERIOD);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            () = shutdown.cancelled() => return,
        }
        let (Some(gw), Some(series)) = (gw.upgrade(), series.upgrade()) else {
            return;
        };
        let sessions = gw.sessions.len() + gw.sessions.caller_sessions().len();
        series.push(
            crate::audit::now_ms(),
            sessions as u64,
            crate::metrics::plugin_totals(),
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn totals(answered: u64, errors: u64, buckets: &[u64]) -> PluginTotals {
        let mut b = buckets.to_vec();
        b.resize(duration_bounds().len(), answered);
        PluginTotals {
            answered,
            errors,
            buckets: b,
        }
    }

    #[test]
    fn quantiles_are_interpolated_within_their_bucket() {
        // 10 answers: 4 within 0.5 ms, 6 more within 1 ms.
        let t = totals(10, 0, &[4, 10]);
        let p50 = quantile(&t, 0.5).unwrap();
        assert!(
            (p50 - (0.0005 + 0.0005 * (1.0 / 6.0))).abs() < 1e-9,
            "{p50}"
        );
        assert_eq!(quantile(&t, 0.99).map(|q| q <= 0.001), Some(true));
        assert_eq!(quantile(&totals(0, 0, &[]), 0.5), None);
        // Beyond the last bound: the last bound.
        let slow = PluginTotals {
            answered: 2,
            errors: 0,
            buckets: vec![0; duration_bounds().len()],
        };
        assert_eq!(quantile(&slow, 0.5), Some(60.0));
    }

    #[test]
    fn points_are_differences_and_plugins_keep_step() {
        let s = Series::default();
        let one = |a: u64, e: u64| HashMap::from([("p".to_owned(), totals(a, e, &[a]))]);
        s.push(0, 0, one(0, 0));
        s.push(2000, 1, one(10, 1));
        let mut both = one(30, 1);
        both.insert("q".into(), totals(4, 4, &[4]));
        s.push(4000, 2, both);
        let o = s.overview();
        assert_eq!(o["t"], json!([2000, 4000]));
        assert_eq!(o["sessions"], json!([1, 2]));
        assert_eq!(o["calls_per_s"], json!([5.0, 12.0]));
        assert_eq!(o["error_rate"], json!([0.1, 4.0 / 24.0]));
        let q = s.plugin("q");
        assert_eq!(q["calls_per_s"], json!([0.0, 2.0]));
        assert_eq!(q["error_rate"], json!([null, 1.0]));
        assert_eq!(s.plugin("none")["calls_per_s"], json!([]));
        for _ in 0..POINTS + 5 {
            s.push(0, 0, one(30, 1));
        }
        assert_eq!(s.overview()["t"].as_array().unwrap().len(), POINTS);
        assert_eq!(s.plugin("p")["p50_ms"].as_array().unwrap().len(), POINTS);
    }
}
