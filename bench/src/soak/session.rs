//! A slot's sessions, one after another: each opened, then its life (its GET stream, calls at
//! jittered intervals, resumes, perhaps the injected crash), then DELETE and the check that
//! every notification it asked for came.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use super::crash::crash;
use super::requests::{background, burst, echo, post};
use super::sse::describe;
use super::stats::Stats;
use super::streams::{GetEnd, reopen_get, resume_get, resume_post};
use super::track::{SessionState, Track};
use super::{Ctx, SETTLE, VERSION};

/// A small generator for jitter and lifetimes (no cryptographic use).
struct Rng(u64);

impl Rng {
    fn new(seed: u64) -> Rng {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64);
        Rng(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ nanos)
    }
    fn next(&mut self) -> u64 {
        // SplitMix64.
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
    /// Uniform in [0, 1).
    fn unit(&mut self) -> f64 {
        (self.next() >> 11) as f64 / (1u64 << 53) as f64
    }
    /// `d` jittered by ±50%.
    fn jitter(&mut self, d: Duration) -> Duration {
        d.mul_f64(0.5 + self.unit())
    }
    fn between(&mut self, lo: Duration, hi: Duration) -> Duration {
        lo + (hi.saturating_sub(lo)).mul_f64(self.unit())
    }
}

async fn open(ctx: &Ctx, no: u64) -> Result<SessionState, String> {
    let body = json!({"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {
        "protocolVersion": VERSION, "capabilities": {}, "clientInfo": {"name": "mcp-bench-soak", "version": "1"}}});
    let r = ctx
        .http
        .post(&ctx.url)
        .header("content-type", "application/json")
        .header("accept", "application/json, text/event-stream")
        .body(body.to_string())
        .send()
        .await
        .map_err(|e| describe(&e))?;
    if !r.status().is_success() {
        return Err(format!("HTTP {}", r.status()));
    }
    let sid = r
        .headers()
        .get("mcp-session-id")
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned)
        .ok_or("no session id")?;
    let text = r.text().await.map_err(|e| describe(&e))?;
    let version = text
        .lines()
        .map(|l| l.strip_prefix("data:").unwrap_or(l).trim())
        .filter_map(|d| serde_json::from_str::<Value>(d).ok())
        .find_map(|m| m["result"]["protocolVersion"].as_str().map(str::to_owned))
        .ok_or("no initialize result")?;
    let st = SessionState {
        sid,
        version,
        no,
        track: Mutex::new(Track::default()),
        next_id: AtomicU64::new(1),
        seq: AtomicU64::new(0),
        started: AtomicBool::new(false),
    };
    match post(
        ctx,
        Some(&st),
        &json!({"jsonrpc": "2.0", "method": "notifications/initialized"}),
    )
    .await
    {
        Ok(_) => Ok(st),
        Err(e) => Err(format!("notifications/initialized: {e}")),
    }
}

#[derive(Clone, Copy, Debug)]
enum Action {
    Echo,
    Burst,
    Background,
    Pair,
    Resume,
}

/// One slot: sessions one after another until the deadline.
pub(super) async fn slot(ctx: Arc<Ctx>, slot: usize, delay: Duration) {
    let mut rng = Rng::new(slot as u64 + 1);
    tokio::time::sleep(delay).await;
    let mut n = 0u64;
    // No new session in the last moments: it would end before doing anything.
    while Instant::now() + ctx.lifetimes.0.min(Duration::from_secs(5)) < ctx.deadline {
        let life = rng.between(ctx.lifetimes.0, ctx.lifetimes.1);
        let end = (Instant::now() + life).min(ctx.deadline);
        let no = (slot as u64) << 32 | n;
        n += 1;
        match open(&ctx, no).await {
            Ok(st) => session(&ctx, Arc::new(st), end, &mut rng).await,
            Err(e) => {
                ctx.stats.error("initialize failed", e);
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
        }
    }
}

/// One session's life: a GET stream, calls, resumes, perhaps a crash, then DELETE.
async fn session(ctx: &Arc<Ctx>, st: Arc<SessionState>, end: Instant, rng: &mut Rng) {
    let stats = &ctx.stats;
    Stats::add(&stats.sessions_opened, 1);
    Stats::add(&stats.sessions_open, 1);
    let mut reader = reopen_get(ctx, &st).await;
    let checks_notes = !ctx.opts.shared;
    let call_every = Duration::from_millis(ctx.opts.call_interval_ms);
    let resume_every = Duration::from_secs(ctx.opts.resume_every_secs);
    let every = |a: Action| match a {
        Action::Echo => call_every,
        Action::Burst | Action::Background => Duration::from_secs(10),
        Action::Pair => Duration::from_secs(15),
        Action::Resume => resume_every,
    };
    let now = Instant::now();
    let mut due: Vec<(Instant, Action)> = [
        Action::Echo,
        Action::Burst,
        Action::Background,
        Action::Pair,
        Action::Resume,
    ]
    .into_iter()
    .map(|a| (now + every(a).mul_f64(rng.unit()), a))
    .collect();
    let mut resumes = 0u64;
    loop {
        let (i, &(at, action)) = due
            .iter()
            .enumerate()
            .min_by_key(|(_, (at, _))| *at)
            .expect("actions");
        if at >= end {
            break;
        }
        tokio::time::sleep_until(at.into()).await;
        if checks_notes
            && st.started.load(Ordering::Relaxed)
            && stats
                .crashes_due
                .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| n.checked_sub(1))
                .is_ok()
        {
            // Nothing else of this session is in flight: wait for its logs, then crash.
            settle(&st).await;
            crash(ctx, &st).await;
        }
        match action {
            Action::Echo => echo(ctx, &st).await,
            Action::Burst if checks_notes => burst(ctx, &st).await,
            Action::Background if checks_notes => {
                background(ctx, &st, 50 + rng.next() % 450).await;
            }
            Action::Burst | Action::Background => echo(ctx, &st).await,
            Action::Pair => {
                Stats::add(&stats.pairs, 1);
                if checks_notes {
                    tokio::join!(echo(ctx, &st), burst(ctx, &st));
                } else {
                    tokio::join!(echo(ctx, &st), echo(ctx, &st));
                }
            }
            Action::Resume => {
                resumes += 1;
                if resumes % 2 == 1 || !checks_notes {
                    if let Some(r) = reader.take() {
                        reader = resume_get(ctx, &st, r).await;
                    } else {
                        reader = reopen_get(ctx, &st).await;
                    }
                } else {
                    resume_post(ctx, &st).await;
                }
            }
        }
        due[i].0 = Instant::now() + rng.jitter(every(action));
    }
    if checks_notes {
        settle(&st).await;
    }
    // DELETE ends the session: its streams end, its plugin instance stops.
    let deleted = ctx
        .http
        .delete(&ctx.url)
        .header("mcp-session-id", &st.sid)
        .header("mcp-protocol-version", &st.version)
        .send()
        .await;
    match deleted {
        Ok(r) if r.status().is_success() => {}
        Ok(r) => stats.error("DELETE refused", format!("HTTP {}", r.status())),
        Err(e) => stats.error("DELETE failed", describe(&e)),
    }
    if let Some(r) = reader {
        match tokio::time::timeout(Duration::from_secs(10), r.task).await {
            Ok(Ok(GetEnd::Ended)) => {}
            Ok(Ok(GetEnd::Failed(e))) => stats.error("the GET stream failed", e),
            Ok(Ok(GetEnd::Stopped)) => unreachable!("nobody asked it to stop"),
            Ok(Err(e)) => stats.error("the GET reader failed", e.to_string()),
            Err(_) => stats.error("the GET stream went on after DELETE", st.sid.clone()),
        }
    }
    if checks_notes {
        let m = st.missing();
        if m.bursts > 0 {
            stats.lost(
                "burst notifications never arrived",
                m.bursts,
                m.burst_example,
            );
        }
        if m.logs > 0 {
            stats.lost("background logs never arrived", m.logs, m.log_example);
        }
    }
    Stats::add(&stats.sessions_ended, 1);
    stats.sessions_open.fetch_sub(1, Ordering::Relaxed);
}

/// Waits (bounded) until every notification asked for has arrived.
async fn settle(st: &SessionState) {
    let until = Instant::now() + SETTLE;
    while Instant::now() < until {
        let m = st.missing();
        if m.bursts + m.logs == 0 {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}
