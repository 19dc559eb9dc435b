//! `mcp-bench soak`: the gateway (release build) in front of `mcp-fixture-server` for minutes
//! at a steady load of many sessions, checking every message and sampling the gateway's
//! resources.
//!
//! Each of `--sessions` slots runs one session after another. A session holds a GET stream,
//! calls `echo` (its text unique and checked), `burst` (tagged, numbered log notifications)
//! and `background_log` (a log that comes once the call is over, so it goes to the GET
//! stream), makes calls in pairs (so the gateway cannot tell which stream a log belongs to),
//! resumes every few seconds with `Last-Event-ID` on a fresh connection (its GET stream, or a
//! POST stream cut in the middle of a burst), and ends with DELETE after a random lifetime; a
//! new session takes the slot. At a fixed rate one session crashes its plugin instance while
//! a `slow` call of its own is in flight there: those two errors are the injected ones, and
//! every other error is counted apart. Every SSE event id is checked for gaps and repeats per
//! stream across resumes, and every tagged notification must arrive exactly once by the time
//! its session ends. Every 10 s the gateway's RSS, open descriptors, threads and child
//! processes are read from /proc. The result goes to the "Soak" section of BENCHMARKS.md
//! (nothing else in it changes) and to `bench/results/soak.json`.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::process::{Child, Command};
use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::report::{commit_excluding, replace_section};

/// The plugin's name in the gateway's configuration (it prefixes nothing: one plugin).
const PLUGIN: &str = "fx";
/// Protocol version the sessions ask for: the newest, with priming events.
const VERSION: &str = "2025-11-25";
/// Seconds between samples.
const SAMPLE_EVERY: Duration = Duration::from_secs(10);
/// How long a session waits, before it ends, for notifications still on their way.
const SETTLE: Duration = Duration::from_secs(10);
/// Notifications in a burst, and in a burst whose stream is cut and resumed.
const BURST: u64 = 10;
const RESUMED_BURST: u64 = 20;

#[derive(clap::Args, Debug, Clone)]
pub struct Options {
    /// How long the load runs, in minutes.
    #[arg(long, default_value_t = 10.0)]
    minutes: f64,
    /// Sessions open at once (each with its own plugin process, unless --shared).
    #[arg(long, default_value_t = 1000)]
    sessions: usize,
    /// Each session's pause between `echo` calls, in ms (jittered ±50%).
    #[arg(long, default_value_t = 2000)]
    call_interval_ms: u64,
    /// Each session resumes a stream this often, in s (jittered): its GET stream and a POST
    /// stream cut mid-burst, in turn.
    #[arg(long, default_value_t = 5)]
    resume_every_secs: u64,
    /// One session crashes its plugin instance this often, in s; 0 for never. The gateway's
    /// circuit breaker counts the crashes of a client's own instances once per client, and
    /// every session here is one client's, so they do not open it.
    #[arg(long, default_value_t = 20)]
    crash_every_secs: u64,
    /// Session lifetimes in s, uniform between the two.
    #[arg(long, default_value = "20-100")]
    session_secs: String,
    /// One plugin process for every session (`process_model = "shared"`). Its logs, which
    /// name no request, are dropped by design, so notifications are not checked; no crashes
    /// are injected (one would fail every session's calls in flight).
    #[arg(long)]
    shared: bool,
    /// An extra argument for the gateway (repeat for more).
    #[arg(long = "gateway-arg", allow_hyphen_values = true)]
    gateway_args: Vec<String>,
    /// For checking the checks: the client throws away every Nth SSE event it receives, as
    /// if the gateway had lost it; the run must then count those as lost (0: none).
    #[arg(long, default_value_t = 0)]
    drop_events: u64,
    /// Instead of running: render the section again from a run's saved results (e.g.
    /// bench/results/soak.json), and write it unless --no-write.
    #[arg(long)]
    render: Option<PathBuf>,
    /// Print the results only: leave BENCHMARKS.md and bench/results/ alone.
    #[arg(long)]
    no_write: bool,
}

/// Counters shared by every session.
#[derive(Default)]
struct Stats {
    sessions_opened: AtomicU64,
    sessions_ended: AtomicU64,
    sessions_open: AtomicU64,
    echo_ok: AtomicU64,
    bursts_ok: AtomicU64,
    background_ok: AtomicU64,
    pairs: AtomicU64,
    get_resumes: AtomicU64,
    post_resumes: AtomicU64,
    /// POST streams that ended before the cut could be made (the client read too slowly).
    resumes_skipped: AtomicU64,
    events: AtomicU64,
    /// Tagged notifications that arrived (each checked against what was asked for).
    notifications: AtomicU64,
    /// Of those, the ones that came on a resumed connection (replayed, or live after it).
    replayed: AtomicU64,
    injected_crashes: AtomicU64,
    victims: AtomicU64,
    /// Crash tokens handed out and not yet taken by a session.
    crashes_due: AtomicU64,
    errors: Mutex<BTreeMap<String, Tally>>,
    lost: Mutex<BTreeMap<String, Tally>>,
    duplicates: Mutex<BTreeMap<String, Tally>>,
    latency: Mutex<Option<Histogram<u64>>>,
    /// `--drop-events`.
    drop_events: u64,
}

#[derive(Debug, Default, Clone, Serialize, Deserialize)]
struct Tally {
    count: u64,
    example: String,
}

fn tally(map: &Mutex<BTreeMap<String, Tally>>, kind: &str, n: u64, example: String) {
    let mut m = map.lock().expect("stats lock");
    let t = m.entry(kind.to_owned()).or_default();
    if t.count == 0 {
        t.example = example.chars().take(300).collect();
    }
    t.count += n;
}

fn total(map: &Mutex<BTreeMap<String, Tally>>) -> u64 {
    map.lock()
        .expect("stats lock")
        .values()
        .map(|t| t.count)
        .sum()
}

impl Stats {
    fn error(&self, kind: &str, example: impl Into<String>) {
        tally(&self.errors, kind, 1, example.into());
    }
    fn lost(&self, kind: &str, n: u64, example: impl Into<String>) {
        tally(&self.lost, kind, n, example.into());
    }
    fn duplicate(&self, kind: &str, n: u64, example: impl Into<String>) {
        tally(&self.duplicates, kind, n, example.into());
    }
    fn add(counter: &AtomicU64, n: u64) {
        counter.fetch_add(n, Ordering::Relaxed);
    }
    fn get(counter: &AtomicU64) -> u64 {
        counter.load(Ordering::Relaxed)
    }
    fn record_latency(&self, d: Duration) {
        let mut h = self.latency.lock().expect("stats lock");
        let h = h.get_or_insert_with(|| Histogram::new(3).expect("histogram"));
        let _ = h.record(d.as_micros().max(1) as u64);
    }
}

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

/// What the whole run shares.
struct Ctx {
    /// For requests that end: a total timeout.
    http: reqwest::Client,
    /// For GET streams: no total timeout, a read timeout (keep-alives come every 15 s).
    streams: reqwest::Client,
    url: String,
    stats: Arc<Stats>,
    deadline: Instant,
    opts: Options,
    lifetimes: (Duration, Duration),
}

// ---------------------------------------------------------------------------------------
// SSE

#[derive(Debug, Clone)]
struct SseEvent {
    id: Option<String>,
    data: String,
}

/// Splits an SSE body into events as its chunks come.
#[derive(Default)]
struct SseParser {
    buf: Vec<u8>,
}

impl SseParser {
    fn feed(&mut self, chunk: &[u8], out: &mut VecDeque<SseEvent>) {
        self.buf.extend_from_slice(chunk);
        while let Some(end) = self.buf.windows(2).position(|w| w == b"\n\n") {
            let block: Vec<u8> = self.buf.drain(..end + 2).collect();
            let text = String::from_utf8_lossy(&block);
            let (mut id, mut data, mut any) = (None, Vec::new(), false);
            for line in text.lines() {
                let line = line.trim_end_matches('\r');
                if let Some(v) = line.strip_prefix("id:") {
                    id = Some(v.trim_start().to_owned());
                    any = true;
                } else if let Some(v) = line.strip_prefix("data:") {
                    data.push(v.strip_prefix(' ').unwrap_or(v).to_owned());
                    any = true;
                }
                // `retry:` and comments (keep-alives) carry nothing to check.
            }
            if any {
                out.push_back(SseEvent {
                    id,
                    data: data.join("\n"),
                });
            }
        }
    }
}

/// An SSE response body, event by event.
struct EventStream {
    resp: reqwest::Response,
    parser: SseParser,
    pending: VecDeque<SseEvent>,
    /// The id of the last event taken from it.
    last_id: Option<String>,
}

impl EventStream {
    fn new(resp: reqwest::Response) -> EventStream {
        EventStream {
            resp,
            parser: SseParser::default(),
            pending: VecDeque::new(),
            last_id: None,
        }
    }

    async fn next(&mut self) -> Result<Option<SseEvent>, String> {
        loop {
            if let Some(e) = self.pending.pop_front() {
                if e.id.is_some() {
                    self.last_id.clone_from(&e.id);
                }
                return Ok(Some(e));
            }
            match self.resp.chunk().await {
                Ok(Some(b)) => self.parser.feed(&b, &mut self.pending),
                Ok(None) => return Ok(None),
                Err(e) => return Err(describe(&e)),
            }
        }
    }
}

/// A reqwest error with its causes, for the error tally.
fn describe(e: &reqwest::Error) -> String {
    let mut s = e.to_string();
    let mut source = std::error::Error::source(e);
    while let Some(c) = source {
        s.push_str(": ");
        s.push_str(&c.to_string());
        source = c.source();
    }
    s
}

/// `<tag>-<stream>-<seq>` or, for a priming event, `<tag>-<stream>-<seq>-p<n>`.
fn parse_event_id(id: &str) -> Option<(u64, u64, bool)> {
    let mut parts = id.split('-');
    let _tag = parts.next()?;
    let stream = parts.next()?.parse().ok()?;
    let seq = parts.next()?.parse().ok()?;
    let priming = match parts.next() {
        None => false,
        Some(p) if p.starts_with('p') => true,
        Some(_) => return None,
    };
    Some((stream, seq, priming))
}

// ---------------------------------------------------------------------------------------
// A session's own bookkeeping

/// What one session expects and has seen.
#[derive(Default)]
struct Track {
    /// Per stream number: the sequence number of the last event seen.
    last_seq: HashMap<u64, u64>,
    /// The last event id seen on the GET stream.
    get_last_id: Option<String>,
    /// Per burst tag: how often each notification number arrived.
    bursts: HashMap<String, Vec<u32>>,
    /// Bursts and background logs whose call failed (an error counted already): what they
    /// miss is not counted lost as well.
    excused: std::collections::HashSet<String>,
    /// Per background-log text: how often it arrived.
    logs: HashMap<String, u32>,
}

#[derive(Default)]
struct Missing {
    bursts: u64,
    logs: u64,
    burst_example: String,
    log_example: String,
}

struct SessionState {
    sid: String,
    version: String,
    no: u64,
    track: Mutex<Track>,
    next_id: AtomicU64,
    seq: AtomicU64,
    /// Whether the session's plugin instance has started (a crash needs one).
    started: AtomicBool,
}

/// Where an event came from.
#[derive(Clone, Copy, PartialEq)]
enum Via {
    Post,
    /// A GET connection, resumed (with `Last-Event-ID`) or not.
    Get {
        resumed: bool,
    },
}

impl SessionState {
    fn id(&self) -> u64 {
        self.next_id.fetch_add(1, Ordering::Relaxed)
    }

    /// A text unique in the whole run.
    fn unique(&self, what: &str) -> String {
        format!(
            "{what}-{}-{}",
            self.no,
            self.seq.fetch_add(1, Ordering::Relaxed)
        )
    }

    /// Checks an event's id for gaps and repeats, and a notification's tag against what was
    /// asked for. Returns the JSON-RPC message it carries, if any.
    fn absorb(&self, ev: &SseEvent, via: Via, stats: &Stats) -> Option<Value> {
        let n = stats.events.fetch_add(1, Ordering::Relaxed) + 1;
        if stats.drop_events > 0 && n.is_multiple_of(stats.drop_events) {
            return None;
        }
        let mut t = self.track.lock().expect("track lock");
        if let Some(id) = &ev.id {
            match parse_event_id(id) {
                None => stats.error("malformed event id", id.clone()),
                Some((stream, seq, priming)) => {
                    if matches!(via, Via::Get { .. }) && stream == 0 {
                        t.get_last_id = Some(id.clone());
                    }
                    let last = t.last_seq.get(&stream).copied();
                    match (priming, last) {
                        // A priming event carries the position its connection starts after.
                        (true, Some(l)) if seq != l => stats.error(
                            "priming event at another position than the client's",
                            format!("{id} after event {l}"),
                        ),
                        (true, _) => {}
                        (false, Some(l)) if seq > l + 1 => stats.lost(
                            "SSE events skipped on a stream",
                            seq - l - 1,
                            format!("session {}: event {id} after event {l}", self.sid),
                        ),
                        (false, Some(l)) if seq <= l => stats.duplicate(
                            "SSE event repeated",
                            1,
                            format!("session {}: event {id} after event {l}", self.sid),
                        ),
                        (false, None) if seq != 1 => stats.lost(
                            "SSE events skipped on a stream",
                            seq - 1,
                            format!("session {}: first event {id}", self.sid),
                        ),
                        _ => {}
                    }
                    let next = if priming {
                        seq
                    } else {
                        seq.max(last.unwrap_or(0))
                    };
                    t.last_seq.insert(stream, next);
                }
            }
        }
        if ev.data.is_empty() {
            return None;
        }
        let Ok(v) = serde_json::from_str::<Value>(&ev.data) else {
            stats.error("SSE data that is not JSON", ev.data.clone());
            return None;
        };
        if v["method"] == "notifications/message" {
            let data = &v["params"]["data"];
            match v["params"]["logger"].as_str() {
                Some("burst") => {
                    let parsed = data.as_str().and_then(|d| {
                        let (tag, i) = d.rsplit_once(':')?;
                        Some((tag.to_owned(), i.parse::<usize>().ok()?))
                    });
                    match parsed.and_then(|(tag, i)| Some((t.bursts.get_mut(&tag)?, i, tag))) {
                        Some((counts, i, tag)) if i < counts.len() => {
                            counts[i] += 1;
                            Stats::add(&stats.notifications, 1);
                            if matches!(via, Via::Get { resumed: true }) {
                                Stats::add(&stats.replayed, 1);
                            }
                            if counts[i] > 1 {
                                stats.duplicate(
                                    "burst notification repeated",
                                    1,
                                    format!("session {}: {tag}:{i}", self.sid),
                                );
                            }
                        }
                        _ => stats.error("burst notification nobody asked for", ev.data.clone()),
                    }
                }
                Some("fixture") if data.as_str().is_some_and(|d| d.starts_with("bg-")) => {
                    let text = data.as_str().unwrap_or_default();
                    match t.logs.get_mut(text) {
                        Some(n) => {
                            *n += 1;
                            Stats::add(&stats.notifications, 1);
                            if matches!(via, Via::Get { resumed: true }) {
                                Stats::add(&stats.replayed, 1);
                            }
                            if *n > 1 {
                                stats.duplicate(
                                    "background log repeated",
                                    1,
                                    format!("session {}: {text}", self.sid),
                                );
                            }
                        }
                        None => stats.error("background log nobody asked for", ev.data.clone()),
                    }
                }
                _ => stats.error("log notification nobody asked for", ev.data.clone()),
            }
        } else if v.get("method").is_some() && v.get("id").is_some() {
            stats.error("a request from the plugin", ev.data.clone());
        }
        Some(v)
    }

    fn expect_burst(&self, tag: &str, count: u64) {
        self.track
            .lock()
            .expect("track lock")
            .bursts
            .insert(tag.to_owned(), vec![0; count as usize]);
    }

    fn expect_log(&self, text: &str) {
        self.track
            .lock()
            .expect("track lock")
            .logs
            .insert(text.to_owned(), 0);
    }

    /// The call for this tag or text failed: what it would have sent is not expected.
    fn excuse(&self, tag: &str) {
        self.track
            .lock()
            .expect("track lock")
            .excused
            .insert(tag.to_owned());
    }

    /// Tagged notifications asked for and not (yet) arrived: burst notifications and
    /// background logs, each with an example.
    fn missing(&self) -> Missing {
        let t = self.track.lock().expect("track lock");
        let mut m = Missing::default();
        for (tag, counts) in t.bursts.iter().filter(|(k, _)| !t.excused.contains(*k)) {
            let n = counts.iter().filter(|c| **c == 0).count() as u64;
            if n > 0 && m.burst_example.is_empty() {
                m.burst_example =
                    format!("session {}: burst {tag}: {n} of {}", self.sid, counts.len());
            }
            m.bursts += n;
        }
        for (text, _) in t
            .logs
            .iter()
            .filter(|(k, n)| **n == 0 && !t.excused.contains(*k))
        {
            if m.logs == 0 {
                m.log_example = format!("session {}: {text}", self.sid);
            }
            m.logs += 1;
        }
        m
    }

    fn forget_stream(&self, id: Option<&str>) {
        if let Some((stream, _, _)) = id.and_then(parse_event_id)
            && stream != 0
        {
            self.track
                .lock()
                .expect("track lock")
                .last_seq
                .remove(&stream);
        }
    }
}

// ---------------------------------------------------------------------------------------
// Requests

/// A POST's answer: an SSE stream, one JSON body, or nothing (202).
enum Posted {
    Stream(EventStream),
    Json(Value),
    Accepted,
}

async fn post(ctx: &Ctx, st: Option<&SessionState>, body: &Value) -> Result<Posted, String> {
    let mut req = ctx
        .http
        .post(&ctx.url)
        .header("content-type", "application/json")
        .header("accept", "application/json, text/event-stream")
        .body(body.to_string());
    if let Some(st) = st {
        req = req
            .header("mcp-session-id", &st.sid)
            .header("mcp-protocol-version", &st.version);
    }
    let r = req.send().await.map_err(|e| describe(&e))?;
    if !r.status().is_success() {
        let status = r.status();
        let text = r.text().await.unwrap_or_default();
        return Err(format!(
            "HTTP {status}: {}",
            text.chars().take(200).collect::<String>()
        ));
    }
    let kind = r
        .headers()
        .get("content-type")
        .map(|v| v.as_bytes().to_vec())
        .unwrap_or_default();
    if kind.starts_with(b"text/event-stream") {
        Ok(Posted::Stream(EventStream::new(r)))
    } else if kind.starts_with(b"application/json") {
        let text = r.text().await.map_err(|e| describe(&e))?;
        serde_json::from_str(&text)
            .map(Posted::Json)
            .map_err(|e| format!("a JSON body that does not parse: {e}"))
    } else {
        Ok(Posted::Accepted)
    }
}

/// A GET on the session: its GET stream, or with `last` the stream that event id names,
/// after it.
async fn get(
    ctx: &Ctx,
    client: &reqwest::Client,
    st: &SessionState,
    last: Option<&str>,
) -> Result<EventStream, String> {
    let mut req = client
        .get(&ctx.url)
        .header("accept", "text/event-stream")
        .header("mcp-session-id", &st.sid)
        .header("mcp-protocol-version", &st.version);
    if let Some(id) = last {
        req = req.header("last-event-id", id);
    }
    let r = req.send().await.map_err(|e| describe(&e))?;
    if !r.status().is_success() {
        let status = r.status();
        let text = r.text().await.unwrap_or_default();
        return Err(format!(
            "HTTP {status}: {}",
            text.chars().take(200).collect::<String>()
        ));
    }
    Ok(EventStream::new(r))
}

/// Reads a request's stream to its end; its answer, checked in the session's books.
async fn answer(
    ctx: &Ctx,
    st: &SessionState,
    es: &mut EventStream,
    id: u64,
    via: Via,
) -> Result<Value, String> {
    let mut answer = None;
    while let Some(ev) = es.next().await? {
        if let Some(v) = st.absorb(&ev, via, &ctx.stats)
            && (v.get("result").is_some() || v.get("error").is_some())
        {
            if v["id"] == id {
                answer = Some(v);
            } else {
                ctx.stats
                    .error("an answer to another request", ev.data.clone());
            }
        }
    }
    answer.ok_or_else(|| "the stream ended without the answer".to_owned())
}

/// Why a call did not give a result.
enum CallError {
    /// The request failed (HTTP status, transport).
    Request(String),
    /// The stream ended without the answer: a lost message.
    NoAnswer,
    /// A JSON-RPC error.
    Rpc(String),
}

/// `tools/call` and its answer's result.
async fn call(ctx: &Ctx, st: &SessionState, tool: &str, args: Value) -> Result<Value, CallError> {
    let id = st.id();
    let body = json!({"jsonrpc": "2.0", "id": id, "method": "tools/call", "params": {"name": tool, "arguments": args}});
    let answer = match post(ctx, Some(st), &body).await {
        Err(e) => return Err(CallError::Request(e)),
        Ok(Posted::Json(v)) => v,
        Ok(Posted::Accepted) => return Err(CallError::NoAnswer),
        Ok(Posted::Stream(mut es)) => {
            let a = answer(ctx, st, &mut es, id, Via::Post).await;
            st.forget_stream(es.last_id.as_deref());
            match a {
                Ok(v) => v,
                Err(e) if e.starts_with("the stream ended") => return Err(CallError::NoAnswer),
                Err(e) => return Err(CallError::Request(e)),
            }
        }
    };
    st.started.store(true, Ordering::Relaxed);
    if let Some(e) = answer.get("error") {
        return Err(CallError::Rpc(
            e["message"].as_str().unwrap_or_default().to_owned(),
        ));
    }
    Ok(answer["result"].clone())
}

fn result_text(result: &Value) -> &str {
    result["content"][0]["text"].as_str().unwrap_or_default()
}

/// Counts a call's failure under `what`.
fn count_failure(ctx: &Ctx, what: &str, e: CallError) {
    match e {
        CallError::Request(e) => ctx.stats.error(&format!("{what}: request failed"), e),
        CallError::NoAnswer => ctx
            .stats
            .lost(&format!("{what}: no answer"), 1, what.to_owned()),
        CallError::Rpc(m) => ctx.stats.error(&format!("{what}: JSON-RPC error"), m),
    }
}

/// `echo` with a unique text, checked.
async fn echo(ctx: &Ctx, st: &SessionState) {
    let text = st.unique("echo");
    let t = Instant::now();
    match call(ctx, st, "echo", json!({"text": text})).await {
        Ok(r) if result_text(&r) == text => {
            ctx.stats.record_latency(t.elapsed());
            Stats::add(&ctx.stats.echo_ok, 1);
        }
        Ok(r) => ctx
            .stats
            .lost("echo: a wrong answer", 1, format!("{text} answered {r}")),
        Err(e) => count_failure(ctx, "echo", e),
    }
}

/// `burst` with a tag: its notifications are checked wherever they arrive.
async fn burst(ctx: &Ctx, st: &SessionState) {
    let tag = st.unique("b");
    st.expect_burst(&tag, BURST);
    match call(ctx, st, "burst", json!({"count": BURST, "tag": tag})).await {
        Ok(r) if result_text(&r) == format!("burst of {BURST} done") => {
            Stats::add(&ctx.stats.bursts_ok, 1);
        }
        Ok(r) => ctx.stats.lost("burst: a wrong answer", 1, r.to_string()),
        Err(e) => {
            st.excuse(&tag);
            count_failure(ctx, "burst", e);
        }
    }
}

/// `background_log`: answers at once, logs `after_ms` later.
async fn background(ctx: &Ctx, st: &SessionState, after_ms: u64) {
    let text = st.unique("bg");
    st.expect_log(&text);
    match call(
        ctx,
        st,
        "background_log",
        json!({"text": text, "after_ms": after_ms}),
    )
    .await
    {
        Ok(r) if result_text(&r) == "logging later" => {
            Stats::add(&ctx.stats.background_ok, 1);
        }
        Ok(r) => ctx
            .stats
            .lost("background_log: a wrong answer", 1, r.to_string()),
        Err(e) => {
            st.excuse(&text);
            count_failure(ctx, "background_log", e);
        }
    }
}

// ---------------------------------------------------------------------------------------
// The GET stream

/// How a GET reader ended.
enum GetEnd {
    /// Asked to stop (for a resume).
    Stopped,
    /// The stream ended (after DELETE, this is expected).
    Ended,
    Failed(String),
}

struct GetReader {
    stop: watch::Sender<bool>,
    task: JoinHandle<GetEnd>,
}

fn spawn_reader(
    ctx: &Arc<Ctx>,
    st: &Arc<SessionState>,
    mut es: EventStream,
    resumed: bool,
) -> GetReader {
    let (stop, mut stopped) = watch::channel(false);
    let (ctx, st) = (ctx.clone(), st.clone());
    let task = tokio::spawn(async move {
        let via = Via::Get { resumed };
        loop {
            tokio::select! {
                biased;
                _ = stopped.changed() => return GetEnd::Stopped,
                ev = es.next() => match ev {
                    Ok(Some(ev)) => {
                        if let Some(v) = st.absorb(&ev, via, &ctx.stats)
                            && (v.get("result").is_some() || v.get("error").is_some())
                        {
                            ctx.stats.error("an answer on the GET stream", ev.data.clone());
                        }
                    }
                    Ok(None) => return GetEnd::Ended,
                    Err(e) => return GetEnd::Failed(e),
                },
            }
        }
    });
    GetReader { stop, task }
}

impl GetReader {
    async fn stop(self) -> GetEnd {
        let _ = self.stop.send(true);
        self.task
            .await
            .unwrap_or_else(|e| GetEnd::Failed(e.to_string()))
    }
}

// ---------------------------------------------------------------------------------------
// Resumes and crashes

/// Cuts the GET connection; while none listens, a background log comes (so it waits in the
/// GET stream's buffer); then resumes with `Last-Event-ID`: the replay must bring it.
async fn resume_get(
    ctx: &Arc<Ctx>,
    st: &Arc<SessionState>,
    reader: GetReader,
) -> Option<GetReader> {
    match reader.stop().await {
        GetEnd::Stopped => {}
        GetEnd::Ended => ctx
            .stats
            .error("the GET stream ended on its own", st.sid.clone()),
        GetEnd::Failed(e) => ctx.stats.error("the GET stream failed", e),
    }
    background(ctx, st, 20).await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    let last = st.track.lock().expect("track lock").get_last_id.clone();
    match get(ctx, &ctx.streams, st, last.as_deref()).await {
        Ok(es) => {
            Stats::add(&ctx.stats.get_resumes, 1);
            Some(spawn_reader(ctx, st, es, last.is_some()))
        }
        Err(e) => {
            ctx.stats.error("GET resume refused", e);
            reopen_get(ctx, st).await
        }
    }
}

/// A plain GET after a failed resume.
async fn reopen_get(ctx: &Arc<Ctx>, st: &Arc<SessionState>) -> Option<GetReader> {
    match get(ctx, &ctx.streams, st, None).await {
        Ok(es) => Some(spawn_reader(ctx, st, es, false)),
        Err(e) => {
            ctx.stats.error("GET stream refused", e);
            None
        }
    }
}

/// A burst whose POST stream is cut after a few notifications and resumed on a fresh
/// connection with `Last-Event-ID`: the rest of the burst and the answer must come there.
async fn resume_post(ctx: &Ctx, st: &SessionState) {
    let tag = st.unique("rb");
    st.expect_burst(&tag, RESUMED_BURST);
    let id = st.id();
    let body = json!({"jsonrpc": "2.0", "id": id, "method": "tools/call", "params": {"name": "burst",
        "arguments": {"count": RESUMED_BURST, "pause_us": 20_000, "tag": tag}}});
    let mut es = match post(ctx, Some(st), &body).await {
        Ok(Posted::Stream(es)) => es,
        Ok(_) => {
            st.excuse(&tag);
            return ctx.stats.error("resume: a burst not answered as SSE", tag);
        }
        Err(e) => {
            st.excuse(&tag);
            return ctx.stats.error("resume: request failed", e);
        }
    };
    st.started.store(true, Ordering::Relaxed);
    let prefix = format!("{tag}:");
    let mut seen = 0;
    let mut answered = None;
    while seen < 3 {
        match es.next().await {
            Ok(Some(ev)) => {
                let Some(v) = st.absorb(&ev, Via::Post, &ctx.stats) else {
                    continue;
                };
                if v["params"]["data"]
                    .as_str()
                    .is_some_and(|d| d.starts_with(&prefix))
                {
                    seen += 1;
                } else if v["id"] == id {
                    answered = Some(v);
                    break;
                }
            }
            Ok(None) => break,
            Err(e) => {
                st.excuse(&tag);
                return ctx.stats.error("resume: the POST stream failed", e);
            }
        }
    }
    if answered.is_some() || seen < 3 {
        // The burst was over before the cut (the client was slow to read, or the call
        // failed): read it out.
        let rest = answer(ctx, st, &mut es, id, Via::Post).await;
        st.forget_stream(es.last_id.as_deref());
        Stats::add(&ctx.stats.resumes_skipped, 1);
        return finish_burst(ctx, st, &tag, answered.map_or(rest, Ok));
    }
    let last = es.last_id.clone();
    drop(es);
    // The burst goes on into the stream's buffer meanwhile.
    tokio::time::sleep(Duration::from_millis(100)).await;
    let mut resumed = match get(ctx, &ctx.http, st, last.as_deref()).await {
        Ok(es) => es,
        Err(e) => {
            st.excuse(&tag);
            return ctx.stats.error("POST stream resume refused", e);
        }
    };
    Stats::add(&ctx.stats.post_resumes, 1);
    let via = Via::Get { resumed: true };
    let a = answer(ctx, st, &mut resumed, id, via).await;
    st.forget_stream(last.as_deref());
    finish_burst(ctx, st, &tag, a);
}

/// Checks the answer to a resumed burst.
fn finish_burst(ctx: &Ctx, st: &SessionState, tag: &str, answer: Result<Value, String>) {
    match answer {
        Ok(v) if result_text(&v["result"]) == format!("burst of {RESUMED_BURST} done") => {
            Stats::add(&ctx.stats.bursts_ok, 1);
        }
        Ok(v) if v.get("error").is_some() => {
            st.excuse(tag);
            ctx.stats.error(
                "resumed burst: JSON-RPC error",
                v["error"]["message"].as_str().unwrap_or_default(),
            );
        }
        Ok(v) => ctx
            .stats
            .lost("resumed burst: a wrong answer", 1, v.to_string()),
        Err(e) => ctx.stats.lost("resumed burst: no answer", 1, e),
    }
}

/// The injected crash: a `slow` call in flight on the session's instance (its progress
/// notification shows the plugin has it), then `crash`. Both must fail naming the plugin's
/// exit; those two errors are the injected ones.
async fn crash(ctx: &Ctx, st: &SessionState) {
    let victim_id = st.id();
    let token = st.unique("victim");
    let body = json!({"jsonrpc": "2.0", "id": victim_id, "method": "tools/call", "params": {"name": "slow",
        "arguments": {"ms": 60_000}, "_meta": {"progressToken": token}}});
    let mut es = match post(ctx, Some(st), &body).await {
        Ok(Posted::Stream(es)) => es,
        Ok(_) => {
            return ctx
                .stats
                .error("crash: the victim not answered as SSE", token);
        }
        Err(e) => return ctx.stats.error("crash: the victim's request failed", e),
    };
    let in_flight = tokio::time::timeout(Duration::from_secs(30), async {
        while let Ok(Some(ev)) = es.next().await {
            if let Some(v) = st.absorb(&ev, Via::Post, &ctx.stats)
                && v["method"] == "notifications/progress"
                && v["params"]["progressToken"] == token.as_str()
            {
                return true;
            }
        }
        false
    })
    .await;
    if in_flight != Ok(true) {
        return ctx
            .stats
            .error("crash: the victim's progress did not come", token);
    }
    let exited = format!("plugin '{PLUGIN}' exited");
    let (victim, crashed) = tokio::join!(
        answer(ctx, st, &mut es, victim_id, Via::Post),
        call(ctx, st, "crash", json!({}))
    );
    st.forget_stream(es.last_id.as_deref());
    match crashed {
        Err(CallError::Rpc(m)) if m.starts_with(&exited) => {
            Stats::add(&ctx.stats.injected_crashes, 1);
        }
        Err(e) => count_failure(ctx, "crash (not as injected)", e),
        Ok(r) => ctx.stats.error("crash: answered", r.to_string()),
    }
    match victim {
        Ok(v)
            if v["error"]["message"]
                .as_str()
                .is_some_and(|m| m.starts_with(&exited)) =>
        {
            Stats::add(&ctx.stats.victims, 1);
        }
        Ok(v) => ctx.stats.error(
            "crash: the victim's answer (not as injected)",
            v.to_string(),
        ),
        Err(e) => ctx.stats.lost("crash: the victim's answer", 1, e),
    }
}

// ---------------------------------------------------------------------------------------
// Sessions

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
async fn slot(ctx: Arc<Ctx>, slot: usize, delay: Duration) {
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

// ---------------------------------------------------------------------------------------
// The gateway and /proc

struct Gateway {
    child: Child,
    pid: u32,
    url: String,
    admin: String,
    /// WARN and ERROR lines of its log, grouped by what they say.
    warnings: Arc<Mutex<BTreeMap<String, Tally>>>,
    _dir: tempfile::TempDir,
}

async fn start_gateway(opts: &Options, fixture: &Path, log: &Path) -> Gateway {
    let dir = tempfile::tempdir().expect("temp dir");
    let config = dir.path().join("soak.toml");
    let model = if opts.shared { "shared" } else { "per_session" };
    std::fs::write(
        &config,
        format!(
            "[plugins.{PLUGIN}]\ncommand = {:?}\nprocess_model = \"{model}\"\n",
            fixture.display().to_string()
        ),
    )
    .expect("config");
    let mut cmd = Command::new(crate::harness::sibling("mcp-gateway"));
    cmd.args(["--listen", "127.0.0.1:0", "--admin-listen", "127.0.0.1:0"])
        .args(["--shutdown-grace-secs", "5"])
        // Every session comes from this one load generator.
        .args(["--max-sessions-per-client", "100000"])
        .arg("--config")
        .arg(&config)
        .args(&opts.gateway_args)
        .env("RUST_LOG", "warn,mcp_gateway::gateway=info")
        .current_dir(dir.path())
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    // If this process dies, even by SIGKILL, the gateway goes with it (and its plugins,
    // whose input then closes).
    // SAFETY: prctl is async-signal-safe; nothing else runs between fork and exec.
    unsafe {
        cmd.pre_exec(|| {
            nix::sys::prctl::set_pdeathsig(nix::sys::signal::Signal::SIGKILL)
                .map_err(std::io::Error::from)
        });
    }
    let mut child = cmd.spawn().expect("start the gateway");
    let pid = child.id().expect("running");
    let stderr = child.stderr.take().expect("piped");
    let warnings = Arc::new(Mutex::new(BTreeMap::<String, Tally>::new()));
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<(bool, String)>();
    let mut file = tokio::fs::File::create(log).await.expect("gateway log");
    {
        let warnings = warnings.clone();
        tokio::spawn(async move {
            let mut lines = BufReader::new(stderr).lines();
            let mut written = 0usize;
            while let Ok(Some(line)) = lines.next_line().await {
                if written < 64 << 20 {
                    written += line.len() + 1;
                    let _ = file.write_all(line.as_bytes()).await;
                    let _ = file.write_all(b"\n").await;
                }
                for (admin, marker) in [
                    (false, "listening on http://"),
                    (true, "admin listener on http://"),
                ] {
                    if let Some(rest) = line.split(marker).nth(1) {
                        let addr: String = rest
                            .chars()
                            .take_while(|c| *c != '/' && *c != '"' && !c.is_whitespace())
                            .collect();
                        let _ = tx.send((admin, addr));
                    }
                }
                if let Some(g) = crate::harness::gist(&line) {
                    tally(&warnings, &g, 1, line.clone());
                }
            }
            let _ = file.flush().await;
        });
    }
    let (mut url, mut admin) = (None, None);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    while url.is_none() || admin.is_none() {
        match tokio::time::timeout_at(deadline, rx.recv()).await {
            Ok(Some((true, a))) => admin = Some(a),
            Ok(Some((false, a))) => url = Some(a),
            _ => panic!("the gateway did not start: see {}", log.display()),
        }
    }
    Gateway {
        child,
        pid,
        url: format!("http://{}/mcp", url.expect("set")),
        admin: format!("http://{}", admin.expect("set")),
        warnings,
        _dir: dir,
    }
}

impl Gateway {
    /// SIGTERM, then SIGKILL if it has not exited within 30 s. Whether it exited by itself.
    async fn stop(&mut self) -> bool {
        use nix::sys::signal::{Signal, kill};
        use nix::unistd::Pid;
        let _ = kill(Pid::from_raw(self.pid as i32), Signal::SIGTERM);
        match tokio::time::timeout(Duration::from_secs(30), self.child.wait()).await {
            Ok(_) => true,
            Err(_) => {
                let _ = self.child.kill().await;
                false
            }
        }
    }
}

/// One reading of the gateway process.
#[derive(Debug, Default, Clone, Serialize, Deserialize)]
struct Sample {
    t_secs: u64,
    rss_mb: f64,
    fds: u64,
    threads: u64,
    children: u64,
    /// The resident memory of the gateway's descendants together.
    children_rss_mb: f64,
    sessions_open: u64,
    /// Checked answers and notifications per second since the previous sample.
    calls_per_sec: f64,
    /// The gateway's CPU use since the previous sample, in percent of one core.
    cpu_percent: f64,
    mem_available_gb: f64,
    load1: f64,
    /// From the gateway's /metrics.
    replay_events: u64,
    replay_mb: f64,
    sse_streams: u64,
}

fn status_field(status: &str, key: &str) -> Option<u64> {
    status
        .lines()
        .find(|l| l.starts_with(key))
        .and_then(|l| l.split_whitespace().nth(1)?.parse().ok())
}

fn read_proc(pid: u32) -> (f64, u64, u64) {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    let rss = status_field(&status, "VmRSS:").unwrap_or(0) as f64 / 1024.0;
    let threads = status_field(&status, "Threads:").unwrap_or(0);
    let fds = std::fs::read_dir(format!("/proc/{pid}/fd")).map_or(0, |d| d.count() as u64);
    (rss, fds, threads)
}

fn system() -> (f64, f64) {
    let mem = std::fs::read_to_string("/proc/meminfo").unwrap_or_default();
    let avail = status_field(&mem, "MemAvailable:").unwrap_or(0) as f64 / (1024.0 * 1024.0);
    let load = std::fs::read_to_string("/proc/loadavg")
        .ok()
        .and_then(|l| l.split_whitespace().next()?.parse().ok())
        .unwrap_or(0.0);
    (avail, load)
}

/// A metric's value (summed over its labels) from Prometheus text.
fn metric(text: &str, name: &str) -> f64 {
    text.lines()
        .filter(|l| {
            l.strip_prefix(name)
                .is_some_and(|r| r.starts_with(' ') || r.starts_with('{'))
        })
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .fold(0.0, |a, b| a + b)
}

async fn scrape(http: &reqwest::Client, admin: &str) -> String {
    match http.get(format!("{admin}/metrics")).send().await {
        Ok(r) => r.text().await.unwrap_or_default(),
        Err(_) => String::new(),
    }
}

/// Processes running the fixture binary (the soak's own build), wherever they are.
fn fixture_processes(fixture: &Path) -> usize {
    std::fs::read_dir("/proc")
        .into_iter()
        .flatten()
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().parse::<u32>().is_ok())
        .filter(|e| std::fs::read_link(e.path().join("exe")).is_ok_and(|p| p == fixture))
        .count()
}

// ---------------------------------------------------------------------------------------
// The run

#[derive(Debug, Default, Serialize, Deserialize)]
struct Report {
    date: String,
    commit: String,
    command: String,
    cores: usize,
    memory_gb: f64,
    minutes: f64,
    sessions: usize,
    process_model: String,
    call_interval_ms: u64,
    resume_every_secs: u64,
    crash_every_secs: u64,
    session_secs: String,
    sessions_opened: u64,
    sessions_ended: u64,
    echo_ok: u64,
    bursts_ok: u64,
    background_ok: u64,
    pairs: u64,
    calls_per_sec: f64,
    echo_p50_ms: f64,
    echo_p99_ms: f64,
    echo_max_ms: f64,
    get_resumes: u64,
    post_resumes: u64,
    resumes_skipped: u64,
    events: u64,
    notifications: u64,
    replayed: u64,
    crashes_asked: u64,
    injected_crashes: u64,
    victims: u64,
    gateway_crashes_counted: f64,
    errors: BTreeMap<String, Tally>,
    lost: BTreeMap<String, Tally>,
    duplicates: BTreeMap<String, Tally>,
    gateway_warnings: BTreeMap<String, Tally>,
    notifications_dropped_metric: f64,
    cursors_not_found_metric: f64,
    replays_served_metric: f64,
    children_after_sessions: u64,
    fds_after_sessions: u64,
    rss_after_sessions_mb: f64,
    stopped_cleanly: bool,
    fixture_left: usize,
    stuck_slots: usize,
    /// The load generator's own CPU use over the run, in percent of one core.
    driver_cpu_percent: f64,
    samples: Vec<Sample>,
}

pub fn main(rt: &tokio::runtime::Runtime, opts: Options) {
    if let Some(path) = &opts.render {
        let text =
            std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        let report: Report = serde_json::from_str(&text)
            .unwrap_or_else(|e| panic!("{}: not a soak's results: {e}", path.display()));
        let (table, ok) = markdown(&report);
        println!("{table}");
        if !opts.no_write {
            write_section(&table);
        }
        std::process::exit(i32::from(!ok));
    }
    crate::procfs::raise_fd_limit();
    let code = rt.block_on(async {
        use tokio::signal::unix::{SignalKind, signal};
        let mut term = signal(SignalKind::terminate()).expect("SIGTERM handler");
        let mut hup = signal(SignalKind::hangup()).expect("SIGHUP handler");
        tokio::select! {
            r = run(opts) => i32::from(!r),
            _ = tokio::signal::ctrl_c() => { eprintln!("soak: interrupted"); 130 }
            _ = term.recv() => { eprintln!("soak: terminated"); 143 }
            _ = hup.recv() => { eprintln!("soak: hung up"); 129 }
        }
    });
    // Dropping the run above killed the gateway if it was still up; the sessions' tasks end
    // with the process.
    std::process::exit(code);
}

fn parse_lifetimes(s: &str) -> (Duration, Duration) {
    let (lo, hi) = s.split_once('-').unwrap_or((s, s));
    let secs = |v: &str| {
        Duration::from_secs_f64(
            v.trim()
                .parse::<f64>()
                .unwrap_or_else(|_| panic!("--session-secs: `{s}` is not LO-HI")),
        )
    };
    let (lo, hi) = (secs(lo), secs(hi));
    assert!(
        lo <= hi && !lo.is_zero(),
        "--session-secs: `{s}` is not LO-HI with 0 < LO <= HI"
    );
    (lo, hi)
}

/// The whole soak. True when every target was met.
async fn run(opts: Options) -> bool {
    let fixture = crate::harness::sibling("mcp-fixture-server");
    let duration = Duration::from_secs_f64(opts.minutes * 60.0);
    let lifetimes = parse_lifetimes(&opts.session_secs);
    let results = PathBuf::from("bench/results");
    std::fs::create_dir_all(&results).expect("results directory");
    let log = std::env::temp_dir().join(format!("mcp-soak-gateway-{}.log", std::process::id()));
    let mut gw = start_gateway(&opts, &fixture, &log).await;
    eprintln!(
        "soak: gateway pid {} at {} ({} plugin processes); {} sessions for {:.1} min; gateway log {}",
        gw.pid,
        gw.url,
        if opts.shared { "shared" } else { "per-session" },
        opts.sessions,
        opts.minutes,
        log.display()
    );
    let driver_cpu_before = crate::procfs::cpu_seconds(std::process::id());
    let stats = Arc::new(Stats {
        drop_events: opts.drop_events,
        ..Stats::default()
    });
    let start = Instant::now();
    let ctx = Arc::new(Ctx {
        http: reqwest::Client::builder()
            .pool_max_idle_per_host(4096)
            .timeout(Duration::from_secs(60))
            .connect_timeout(Duration::from_secs(10))
            .build()
            .expect("HTTP client"),
        streams: reqwest::Client::builder()
            .pool_max_idle_per_host(0)
            .read_timeout(Duration::from_secs(60))
            .connect_timeout(Duration::from_secs(10))
            .build()
            .expect("HTTP client"),
        url: gw.url.clone(),
        stats: stats.clone(),
        deadline: start + duration,
        opts: opts.clone(),
        lifetimes,
    });

    // Sessions start spread over the ramp, so the plugin processes do not all start at once.
    let ramp = (duration / 6).min(Duration::from_secs(30));
    let slots: Vec<JoinHandle<()>> = (0..opts.sessions)
        .map(|i| {
            let delay = ramp.mul_f64(i as f64 / opts.sessions.max(1) as f64);
            tokio::spawn(slot(ctx.clone(), i, delay))
        })
        .collect();

    // Crash tokens at a fixed rate; a session takes one at its next step.
    let crashes_asked = Arc::new(AtomicU64::new(0));
    let crasher = (!opts.shared && opts.crash_every_secs > 0).then(|| {
        let (stats, asked) = (stats.clone(), crashes_asked.clone());
        let every = Duration::from_secs(opts.crash_every_secs);
        let deadline = ctx.deadline;
        tokio::spawn(async move {
            // The first after the ramp.
            let mut at = tokio::time::Instant::now() + ramp + every / 2;
            while at.into_std() + Duration::from_secs(5) < deadline {
                tokio::time::sleep_until(at).await;
                stats.crashes_due.fetch_add(1, Ordering::AcqRel);
                asked.fetch_add(1, Ordering::Relaxed);
                at += every;
            }
        })
    });

    // Samples every 10 s until the load ends.
    let scrape_http = reqwest::Client::builder()
        .timeout(Duration::from_secs(5))
        .build()
        .expect("HTTP client");
    let mut samples = Vec::new();
    let mut prev = (start, 0u64, crate::procfs::cpu_seconds(gw.pid));
    let answered = |s: &Stats| {
        Stats::get(&s.echo_ok) + Stats::get(&s.bursts_ok) + Stats::get(&s.background_ok)
    };
    let sample = |t: Instant, prev: &mut (Instant, u64, f64), metrics: &str| {
        let (rss_mb, fds, threads) = read_proc(gw.pid);
        let kids = crate::procfs::descendants(gw.pid);
        let children_rss_mb: f64 = kids.iter().map(|p| read_proc(*p).0).sum();
        let (mem_available_gb, load1) = system();
        let done = answered(&stats);
        let cpu = crate::procfs::cpu_seconds(gw.pid);
        let dt = t.duration_since(prev.0).as_secs_f64().max(0.001);
        let s = Sample {
            t_secs: t.duration_since(start).as_secs_f64().round() as u64,
            rss_mb: crate::numbers::round1(rss_mb),
            fds,
            threads,
            children: kids.len() as u64,
            children_rss_mb: children_rss_mb.round(),
            sessions_open: Stats::get(&stats.sessions_open),
            calls_per_sec: ((done - prev.1) as f64 / dt).round(),
            cpu_percent: crate::numbers::round1(100.0 * (cpu - prev.2) / dt),
            mem_available_gb: crate::numbers::round1(mem_available_gb),
            load1,
            replay_events: metric(metrics, "mcp_gateway_replay_buffer_events") as u64,
            replay_mb: crate::numbers::round1(
                metric(metrics, "mcp_gateway_replay_buffer_bytes") / 1048576.0,
            ),
            sse_streams: metric(metrics, "mcp_gateway_sse_streams_open") as u64,
        };
        *prev = (t, done, cpu);
        s
    };
    let mut next = start;
    while next <= ctx.deadline + Duration::from_millis(500) {
        tokio::time::sleep_until(next.into()).await;
        let metrics = scrape(&scrape_http, &gw.admin).await;
        let s = sample(Instant::now(), &mut prev, &metrics);
        eprintln!(
            "soak: t={:>4}s rss={:.1}MB fds={} threads={} children={} sessions={} calls/s={} cpu={}% errors={} lost={} crashes={}+{}",
            s.t_secs,
            s.rss_mb,
            s.fds,
            s.threads,
            s.children,
            s.sessions_open,
            s.calls_per_sec,
            s.cpu_percent,
            total(&stats.errors),
            total(&stats.lost),
            Stats::get(&stats.injected_crashes),
            Stats::get(&stats.victims),
        );
        samples.push(s);
        next += SAMPLE_EVERY;
    }

    // Sessions finish what they are doing, settle, and end; a stuck one is counted.
    let mut stuck = 0;
    let wait_until = tokio::time::Instant::now() + Duration::from_secs(120);
    for h in slots {
        let abort = h.abort_handle();
        if tokio::time::timeout_at(wait_until, h).await.is_err() {
            abort.abort();
            stuck += 1;
        }
    }
    if let Some(c) = crasher {
        c.abort();
    }
    if stuck > 0 {
        stats.error(
            "a session did not finish within 120 s of the end",
            format!("{stuck} slots"),
        );
    }
    let elapsed = start.elapsed();
    let driver_cpu = crate::procfs::cpu_seconds(std::process::id()) - driver_cpu_before;

    // With every session ended, its plugin processes stop.
    let settle_until = Instant::now() + Duration::from_secs(20);
    while !crate::procfs::descendants(gw.pid).is_empty() && Instant::now() < settle_until {
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let metrics = scrape(&scrape_http, &gw.admin).await;
    let (rss_after, fds_after, _) = read_proc(gw.pid);
    let children_after = crate::procfs::descendants(gw.pid).len() as u64;
    let stopped_cleanly = gw.stop().await;
    let left_until = Instant::now() + Duration::from_secs(10);
    let mut fixture_left = fixture_processes(&fixture);
    while fixture_left > 0 && Instant::now() < left_until {
        tokio::time::sleep(Duration::from_millis(200)).await;
        fixture_left = fixture_processes(&fixture);
    }

    let (p50, p99, max) =
        stats
            .latency
            .lock()
            .expect("stats lock")
            .as_ref()
            .map_or((0.0, 0.0, 0.0), |h| {
                let ms = |v: u64| (v as f64 / 10.0).round() / 100.0;
                (
                    ms(h.value_at_quantile(0.5)),
                    ms(h.value_at_quantile(0.99)),
                    ms(h.max()),
                )
            });
    let mem_total = std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|m| status_field(&m, "MemTotal:"))
        .unwrap_or(0) as f64
        / (1024.0 * 1024.0);
    let report = Report {
        date: crate::report::date(),
        commit: commit(),
        // scripts/soak names itself here; run directly, the command line as it was.
        command: std::env::var("SOAK_COMMAND")
            .unwrap_or_else(|_| std::env::args().collect::<Vec<_>>().join(" ")),
        cores: std::thread::available_parallelism().map_or(1, |n| n.get()),
        memory_gb: mem_total.round(),
        minutes: opts.minutes,
        sessions: opts.sessions,
        process_model: if opts.shared { "shared" } else { "per_session" }.into(),
        call_interval_ms: opts.call_interval_ms,
        resume_every_secs: opts.resume_every_secs,
        crash_every_secs: if opts.shared {
            0
        } else {
            opts.crash_every_secs
        },
        session_secs: opts.session_secs.clone(),
        sessions_opened: Stats::get(&stats.sessions_opened),
        sessions_ended: Stats::get(&stats.sessions_ended),
        echo_ok: Stats::get(&stats.echo_ok),
        bursts_ok: Stats::get(&stats.bursts_ok),
        background_ok: Stats::get(&stats.background_ok),
        pairs: Stats::get(&stats.pairs),
        calls_per_sec: (answered(&stats) as f64 / elapsed.as_secs_f64()).round(),
        echo_p50_ms: p50,
        echo_p99_ms: p99,
        echo_max_ms: max,
        get_resumes: Stats::get(&stats.get_resumes),
        post_resumes: Stats::get(&stats.post_resumes),
        resumes_skipped: Stats::get(&stats.resumes_skipped),
        events: Stats::get(&stats.events),
        notifications: Stats::get(&stats.notifications),
        replayed: Stats::get(&stats.replayed),
        crashes_asked: crashes_asked.load(Ordering::Relaxed),
        injected_crashes: Stats::get(&stats.injected_crashes),
        victims: Stats::get(&stats.victims),
        gateway_crashes_counted: metric(&metrics, "mcp_gateway_plugin_crashes_total"),
        errors: stats.errors.lock().expect("stats lock").clone(),
        lost: stats.lost.lock().expect("stats lock").clone(),
        duplicates: stats.duplicates.lock().expect("stats lock").clone(),
        gateway_warnings: gw.warnings.lock().expect("warnings lock").clone(),
        notifications_dropped_metric: metric(
            &metrics,
            "mcp_gateway_plugin_notifications_dropped_total",
        ),
        cursors_not_found_metric: metric(&metrics, "mcp_gateway_replay_cursors_not_found_total"),
        replays_served_metric: metric(&metrics, "mcp_gateway_replays_served_total"),
        children_after_sessions: children_after,
        fds_after_sessions: fds_after,
        rss_after_sessions_mb: crate::numbers::round1(rss_after),
        stopped_cleanly,
        fixture_left,
        stuck_slots: stuck,
        driver_cpu_percent: crate::numbers::round1(100.0 * driver_cpu / elapsed.as_secs_f64()),
        samples,
    };
    let (table, ok) = markdown(&report);
    println!("{table}");
    if !opts.no_write {
        let json = serde_json::to_string_pretty(&report).expect("serializable");
        std::fs::write(results.join("soak.json"), json).expect("write results");
        write_section(&table);
        eprintln!("soak: wrote bench/results/soak.json");
    }
    eprintln!("soak: gateway log in {}", log.display());
    ok
}

/// Writes the Soak section of BENCHMARKS.md, keeping the rest of the file.
fn write_section(table: &str) {
    let old = std::fs::read_to_string("BENCHMARKS.md").unwrap_or_default();
    std::fs::write("BENCHMARKS.md", replace_section(&old, SECTION, table))
        .expect("write BENCHMARKS.md");
    eprintln!("soak: wrote the Soak section of BENCHMARKS.md");
}

fn commit() -> String {
    commit_excluding(&["BENCHMARKS.md", "bench/results/soak.json"])
}

// ---------------------------------------------------------------------------------------
// The report

/// The heading of the section this writes in BENCHMARKS.md.
pub const SECTION: &str = "## Soak";

fn mean(v: &[f64]) -> Option<f64> {
    (!v.is_empty()).then(|| v.iter().sum::<f64>() / v.len() as f64)
}

/// The means of a quantity over the second minute and the last minute, if the run had both:
/// the samples at 60–110 s and at the last six before the end (the one at the end is taken
/// as every session ends at once).
fn windows(r: &Report, f: impl Fn(&Sample) -> f64) -> Option<(f64, f64)> {
    let end = (r.minutes * 60.0).round() as u64;
    if end < 180 {
        return None;
    }
    let pick = |lo: u64, hi: u64| {
        r.samples
            .iter()
            .filter(|s| s.t_secs >= lo && s.t_secs < hi)
            .map(&f)
            .collect::<Vec<_>>()
    };
    Some((mean(&pick(60, 120))?, mean(&pick(end - 60, end))?))
}

fn thousands(n: u64) -> String {
    let s = n.to_string();
    let mut out = String::new();
    for (i, c) in s.chars().enumerate() {
        if i > 0 && (s.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

fn tallies(map: &BTreeMap<String, Tally>) -> String {
    if map.is_empty() {
        return "none".into();
    }
    map.iter()
        .map(|(k, t)| {
            format!(
                "{k}: {} (e.g. `{}`)",
                t.count,
                t.example.replace('|', "\\|").replace('`', "'")
            )
        })
        .collect::<Vec<_>>()
        .join("; ")
}

/// The section for BENCHMARKS.md, and whether every target was met.
fn markdown(r: &Report) -> (String, bool) {
    let errors: u64 = r.errors.values().map(|t| t.count).sum();
    let lost: u64 = r.lost.values().map(|t| t.count).sum();
    let dups: u64 = r.duplicates.values().map(|t| t.count).sum();
    let rss = windows(r, |s| s.rss_mb);
    let fds = windows(r, |s| s.fds as f64);
    let within = |w: Option<(f64, f64)>| w.map(|(a, b)| (b - a).abs() <= 0.1 * a);
    let crashes_ok = r.injected_crashes == r.crashes_asked && r.victims == r.injected_crashes;
    let ok = errors == 0
        && lost == 0
        && dups == 0
        && crashes_ok
        && within(rss) != Some(false)
        && within(fds) != Some(false)
        && r.fixture_left == 0
        && r.stuck_slots == 0;
    let mark = |good: bool| if good { "✓" } else { "✗" };
    // Means to one decimal (MB) or whole (counts); a mark where 10% is a target.
    let window = |w: Option<(f64, f64)>, unit: &str, target: bool| match w {
        Some((a, b)) => {
            let v = |x: f64| {
                if unit.is_empty() {
                    thousands(x.round() as u64)
                } else {
                    format!("{x:.1}{unit}")
                }
            };
            let change = 100.0 * (b - a) / a;
            let m = if target {
                format!(" {}", mark((b - a).abs() <= 0.1 * a))
            } else {
                String::new()
            };
            format!("{} → {} ({change:+.1}%){m}", v(a), v(b))
        }
        None => "– (the run is shorter than 3 minutes)".into(),
    };
    let threads = windows(r, |s| s.threads as f64);
    let children = windows(r, |s| s.children as f64);
    let model = if r.process_model == "shared" {
        "one shared plugin process (`process_model = \"shared\"`)"
    } else {
        "a plugin process per session (the default `process_model = \"per_session\"`)"
    };
    let crashes = if r.crash_every_secs == 0 {
        "No crashes are injected.".to_owned()
    } else {
        format!(
            "Every {} s one session crashes its plugin instance (`crash`) while a `slow` call of \
             its own is in flight there: those two errors are the injected ones. The gateway's \
             circuit breaker (5 crashes within 60 s) counts the crashes of a client's own \
             instances once per client, and every session here comes from one load generator, \
             so they never open it for the others (before it did, one crash every 6 s shut \
             the plugin off for every session for 30 s).",
            r.crash_every_secs
        )
    };
    let shared = if r.process_model == "shared" {
        " With a shared process the plugin's logs, which name no request, are dropped by \
         design, so notifications are not checked and only the GET stream is resumed."
    } else {
        ""
    };
    let mut out = format!(
        "{SECTION}\n\n\
         `{}` on {}, commit `{}`, {} cores, {:.0} GiB: the gateway (release build) in front of \
         `mcp-fixture-server`, {model}, {} sessions open at once for {} minutes (run by \
         `mcp-bench soak`, bench/src/soak.rs; raw numbers in `bench/results/soak.json`).\n\n\
         Each session holds a GET stream; calls `echo` every ~{:.1} s (a unique text, checked), \
         a tagged `burst` of {BURST} numbered log notifications and a `background_log` (a log \
         after its call is over) every ~10 s, and an `echo` and a `burst` at once every ~15 s; \
         every ~{} s it resumes with `Last-Event-ID` on a fresh connection, in turn its GET \
         stream (cut first; a log sent meanwhile must come in the replay) and a POST stream cut \
         after 3 of a burst's {RESUMED_BURST} notifications (the rest and the answer must come on \
         the resumed one).{shared} Sessions live {} s, then DELETE; a new one takes the slot. \
         {crashes} Every SSE event id is checked for gaps and repeats per stream across resumes, \
         and every tagged notification must arrive exactly once before its session ends. The \
         gateway's RSS, descriptors, threads and children come from /proc every 10 s.\n\n\
         | | result | target |\n|---|---|---|\n",
        r.command,
        r.date,
        r.commit,
        r.cores,
        r.memory_gb,
        thousands(r.sessions as u64),
        r.minutes,
        r.call_interval_ms as f64 / 1000.0,
        r.resume_every_secs,
        r.session_secs.replace('-', "–"),
    );
    let mut row = |what: &str, result: String, target: &str| {
        out.push_str(&format!("| {what} | {result} | {target} |\n"));
    };
    row(
        "sessions opened / ended",
        format!(
            "{} / {}",
            thousands(r.sessions_opened),
            thousands(r.sessions_ended)
        ),
        "",
    );
    row(
        "calls answered and checked: `echo`, `burst`, `background_log`",
        format!(
            "{} ({}/s): {}, {}, {}",
            thousands(r.echo_ok + r.bursts_ok + r.background_ok),
            thousands(r.calls_per_sec as u64),
            thousands(r.echo_ok),
            thousands(r.bursts_ok),
            thousands(r.background_ok)
        ),
        "",
    );
    row(
        "load generator's CPU (it shares the cores)",
        format!("{:.0}% of one core", r.driver_cpu_percent),
        "",
    );
    row(
        "`echo` latency p50 / p99 / max",
        format!(
            "{:.2} / {:.2} / {:.0} ms",
            r.echo_p50_ms, r.echo_p99_ms, r.echo_max_ms
        ),
        "",
    );
    row(
        "resumes: GET stream / POST stream cut mid-burst (not cut: the burst was over first)",
        format!(
            "{} / {} ({})",
            thousands(r.get_resumes),
            thousands(r.post_resumes),
            thousands(r.resumes_skipped)
        ),
        "",
    );
    row(
        "SSE events checked; tagged notifications checked, of them on a resumed connection",
        format!(
            "{}; {}, {}",
            thousands(r.events),
            thousands(r.notifications),
            thousands(r.replayed)
        ),
        "",
    );
    row(
        "injected crashes / their in-flight victims (the gateway counted crashes)",
        format!(
            "{} of {} / {} ({}) {}",
            r.injected_crashes,
            r.crashes_asked,
            r.victims,
            r.gateway_crashes_counted,
            mark(crashes_ok)
        ),
        "as injected",
    );
    row(
        "other errors",
        format!("**{errors}** {}", mark(errors == 0)),
        "0",
    );
    row(
        "lost messages",
        format!("**{lost}** {}", mark(lost == 0)),
        "0",
    );
    row(
        "repeated messages",
        format!("{dups} {}", mark(dups == 0)),
        "0",
    );
    let end = (r.minutes * 60.0).round() as u64;
    let span = format!(
        "60–110 s → {}–{} s",
        end.saturating_sub(60),
        end.saturating_sub(10)
    );
    row(
        &format!("gateway RSS, mean of the 2nd minute's samples → the last minute's ({span})"),
        window(rss, " MB", true),
        "within 10%",
    );
    row(
        "open descriptors, 2nd minute → last",
        window(fds, "", true),
        "within 10%",
    );
    row("threads, 2nd minute → last", window(threads, "", false), "");
    row(
        "child processes, 2nd minute → last",
        window(children, "", false),
        "",
    );
    row(
        "after the last session ended: child processes, descriptors, RSS",
        format!(
            "{}, {}, {:.1} MB",
            r.children_after_sessions, r.fds_after_sessions, r.rss_after_sessions_mb
        ),
        "",
    );
    row(
        "the gateway stopped on SIGTERM; fixture processes left after it",
        format!(
            "{}; {} {}",
            if r.stopped_cleanly {
                "yes"
            } else {
                "no (killed)"
            },
            r.fixture_left,
            mark(r.fixture_left == 0)
        ),
        "0",
    );
    row(
        "gateway metrics: replays served, cursors not found, notifications dropped",
        format!(
            "{}, {}, {}",
            thousands(r.replays_served_metric as u64),
            r.cursors_not_found_metric,
            r.notifications_dropped_metric
        ),
        "",
    );
    out.push_str(&format!(
        "\n**{}**\n\nErrors: {}.\n\nLost: {}.\n\nRepeated: {}.\n\nThe gateway's warnings and errors \
         (its log at `warn`), by what they say: {}.\n",
        if ok { "Every target met." } else { "Targets missed (✗ above)." },
        tallies(&r.errors),
        tallies(&r.lost),
        tallies(&r.duplicates),
        tallies(&r.gateway_warnings),
    ));
    out.push_str(
        "\nSamples (every 10 s; calls/s counts checked answers; CPU in % of one core; the \
         replay buffer from the gateway's metrics; the last sample is taken as every session \
         ends):\n\n\
         | t (s) | RSS (MB) | descriptors | threads | child processes | their RSS (MB) | \
         sessions | calls/s | gateway CPU | replay buffer | SSE streams | MemAvailable (GiB) | load |\n\
         |---|---|---|---|---|---|---|---|---|---|---|---|---|\n",
    );
    for s in &r.samples {
        out.push_str(&format!(
            "| {} | {:.1} | {} | {} | {} | {:.0} | {} | {:.0} | {:.0}% | {} events, {:.1} MB | {} | {:.1} | {:.2} |\n",
            s.t_secs,
            s.rss_mb,
            s.fds,
            s.threads,
            s.children,
            s.children_rss_mb,
            s.sessions_open,
            s.calls_per_sec,
            s.cpu_percent,
            thousands(s.replay_events),
            s.replay_mb,
            s.sse_streams,
            s.mem_available_gb,
            s.load1,
        ));
    }
    (out, ok)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sse_events_split_across_chunks() {
        let mut p = SseParser::default();
        let mut out = VecDeque::new();
        p.feed(
            b"id: 0000abcd-0-0-p1\nretry: 1000\ndata: \n\n: keep-alive\n\nid: 0000ab",
            &mut out,
        );
        p.feed(b"cd-0-1\ndata: {\"a\":1}\n\n", &mut out);
        let ids: Vec<_> = out
            .iter()
            .map(|e| e.id.clone().unwrap_or_default())
            .collect();
        assert_eq!(ids, ["0000abcd-0-0-p1", "0000abcd-0-1"]);
        assert_eq!(out[1].data, "{\"a\":1}");
        assert_eq!(parse_event_id("0000abcd-3-17"), Some((3, 17, false)));
        assert_eq!(parse_event_id("0000abcd-3-0-p2"), Some((3, 0, true)));
        assert_eq!(parse_event_id("x-y"), None);
    }
}
