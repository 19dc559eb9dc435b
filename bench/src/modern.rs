//! `mcp-bench modern`: the modern era (2026-07-28, issue 22) beside the legacy one, on the same
//! gateway build, in alternating pairs of runs on fresh gateway processes.
//!
//! A modern client has no session: every request carries the protocol version, its client info
//! and the capabilities it declares in `_meta`, and the headers that mirror the body
//! (`MCP-Protocol-Version`, `Mcp-Method`, `Mcp-Name`). Two comparisons:
//!
//! - Scenario (a): 16 calls of `echo` in flight with no session, against the legacy (a), one
//!   session with 16 in flight. Every answer checked as the legacy (a) checks it (one answer
//!   to the call's id with the call's text), and for the modern client also that it is a
//!   `complete` result and that no session was minted.
//! - The round trip of a plugin asking its client for input mid-call (the echo plugin's `ask`
//!   tool sends `elicitation/create` the legacy way). Modern: the call gets an
//!   `InputRequiredResult`, the client retries at once with `inputResponses` and the
//!   `requestState`, and gets the result (multi round-trip requests, the gateway's bridge).
//!   Legacy: the call's POST answers with an SSE stream, the elicitation arrives on it, the
//!   client POSTs its answer, and the result arrives on the stream. The whole exchange is
//!   timed, one at a time and 16 in flight; the client answers each question with a text made
//!   from the question's own, and a call's result must be the answer to the question its own
//!   text made. Stdio carries no link from a plugin's request to the call that caused it, so
//!   with several calls in flight on one plugin instance the gateway puts a question on the
//!   newest call's stream (legacy) or into its `InputRequiredResult` (modern); the clients
//!   answer whatever they are asked, as real ones would, and such questions are counted.
//!   The same round trip, one at a time, with the plugin's `sample` tool, which asks with
//!   `sampling/createMessage` instead.
//!
//! Raw numbers go to `bench/results/modern.json`, the tables to the "Modern era (2026-07-28)"
//! section of BENCHMARKS.md, followed by the hand-kept reading in `bench/NOTES-modern.md`.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use crate::harness::Target;
use crate::load::Throughput;
use crate::numbers::{list, median, percent, round1};
use crate::paired::{PAIRS, Run};

/// The heading of the section this writes in BENCHMARKS.md.
pub const SECTION: &str = "## Modern era (2026-07-28)";

/// The protocol version a modern client declares.
const MODERN: &str = "2026-07-28";
/// The legacy version of the sessions in the round trip (the latest legacy one, whose
/// elicitation is the modern one's).
const LEGACY: &str = "2025-11-25";
/// Calls in flight in (a) and in the loaded round trip.
const IN_FLIGHT: usize = 16;

/// What `mcp-bench modern` runs.
#[derive(clap::Args, Debug, Clone, Default)]
pub struct Options {
    /// The gateway binary to measure (default: `mcp-gateway` beside this one).
    #[arg(long)]
    pub gateway: Option<PathBuf>,
    /// Measure nothing: write the section of BENCHMARKS.md again from `modern.json` in
    /// `--out` (after an edit of bench/NOTES-modern.md).
    #[arg(long)]
    pub rewrite: bool,
}

#[derive(Debug, Default, Serialize, Deserialize)]
pub struct Report {
    pub date: String,
    pub commit: String,
    /// The gateway binary, when it was not the one beside `mcp-bench`.
    pub gateway: Option<String>,
    pub cores: usize,
    pub seconds_per_run: u64,
    /// `/proc/loadavg` before and after.
    pub load_before: String,
    pub load_after: String,
    pub comparisons: Vec<Comparison>,
}

/// One workload, driven by a modern client and by a legacy session in alternating pairs of
/// runs, each on a fresh gateway.
#[derive(Debug, Default, Serialize, Deserialize)]
pub struct Comparison {
    pub scenario: String,
    pub in_flight: usize,
    pub seconds_per_run: u64,
    /// Calls (or whole exchanges) answered right per second, one figure per run.
    pub modern_calls_per_sec: Vec<f64>,
    pub legacy_calls_per_sec: Vec<f64>,
    pub modern_p50_ms: Vec<f64>,
    pub modern_p99_ms: Vec<f64>,
    pub legacy_p50_ms: Vec<f64>,
    pub legacy_p99_ms: Vec<f64>,
    /// The gateway process's own CPU time per call (or exchange), in µs.
    pub modern_cpu_us_per_call: Vec<f64>,
    pub legacy_cpu_us_per_call: Vec<f64>,
    /// The load generator's CPU time per call (or exchange), in µs: it shares the cores.
    pub modern_client_cpu_us_per_call: Vec<f64>,
    pub legacy_client_cpu_us_per_call: Vec<f64>,
    /// Per pair: the modern runs' calls/s in percent of the legacy run's.
    pub pair_ratio_percent: Vec<f64>,
    /// The median of `pair_ratio_percent`.
    pub ratio_percent: f64,
    /// Medians over runs.
    pub median_modern_calls_per_sec: f64,
    pub median_legacy_calls_per_sec: f64,
    pub median_modern_p50_ms: f64,
    pub median_modern_p99_ms: f64,
    pub median_legacy_p50_ms: f64,
    pub median_legacy_p99_ms: f64,
    pub modern_wrong: u64,
    pub legacy_wrong: u64,
    /// What the wrong answers were, by side and cause.
    pub wrong_causes: BTreeMap<String, u64>,
    /// Round trip only, over every run (warm-up calls and calls still running at a run's end
    /// included): the calls made, the HTTP requests they took (modern: the call and its
    /// retries; legacy: the call and the answers' POSTs), the plugin's questions the clients
    /// answered, and of those, how many came to a call other than the one that caused them.
    pub modern_calls: u64,
    pub modern_requests: u64,
    pub modern_questions: u64,
    pub modern_foreign_questions: u64,
    pub legacy_calls: u64,
    pub legacy_requests: u64,
    pub legacy_questions: u64,
    pub legacy_foreign_questions: u64,
    /// Round trip only: the two legs of a call that was asked its own question once, p50 over
    /// all runs, in ms. Modern: the call until its `InputRequiredResult`, then the retry until
    /// the result. Legacy: the call until the question arrives on its stream, then until the
    /// result does (the answer's POST included).
    pub modern_legs_p50_ms: [f64; 2],
    pub legacy_legs_p50_ms: [f64; 2],
}

/// What one comparison's clients count besides timed calls: wrong answers by cause, and per
/// side (0 modern, 1 legacy) the calls made, the requests sent, the questions answered and
/// those that were another call's.
struct Tally {
    causes: Mutex<BTreeMap<String, u64>>,
    calls: [AtomicU64; 2],
    questions: [AtomicU64; 2],
    foreign: [AtomicU64; 2],
    requests: [AtomicU64; 2],
    /// By side and leg, in µs: see [`Comparison::modern_legs_p50_ms`].
    legs: Mutex<[[Histogram<u64>; 2]; 2]>,
}

impl Default for Tally {
    fn default() -> Tally {
        let h = || Histogram::new(3).expect("histogram");
        Tally {
            causes: Mutex::default(),
            calls: Default::default(),
            questions: Default::default(),
            foreign: Default::default(),
            requests: Default::default(),
            legs: Mutex::new([[h(), h()], [h(), h()]]),
        }
    }
}

impl Tally {
    /// Counts a wrong answer's cause under `side`.
    fn wrong(&self, side: usize, cause: String) {
        let name = if side == 0 { "modern" } else { "legacy" };
        *self
            .causes
            .lock()
            .expect("lock")
            .entry(format!("{name}: {cause}"))
            .or_default() += 1;
    }

    /// Records the legs of a call on `side` that started at `start`, was asked at `asked` and
    /// was answered now.
    fn legs(&self, side: usize, start: Instant, asked: Instant) {
        let mut legs = self.legs.lock().expect("lock");
        let micros = |d: Duration| d.as_micros() as u64;
        let _ = legs[side][0].record(micros(asked - start));
        let _ = legs[side][1].record(micros(asked.elapsed()));
    }

    /// Counts a question answered on `side` by the call with text `own`.
    fn question(&self, side: usize, asked: &str, own: &str) {
        self.questions[side].fetch_add(1, Ordering::Relaxed);
        if asked != own {
            self.foreign[side].fetch_add(1, Ordering::Relaxed);
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Workload {
    /// `echo` with a 64-byte text.
    Echo,
    /// A question from the plugin mid-call, answered, then the result.
    Ask(Question),
}

/// What the plugin asks its client in a round trip, the call's text in it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Question {
    /// The `ask` tool: `elicitation/create`, the text as its message.
    Elicit,
    /// The `sample` tool: `sampling/createMessage`, the text as its prompt.
    Sample,
}

impl Question {
    fn tool(self) -> &'static str {
        match self {
            Question::Elicit => "ask",
            Question::Sample => "sample",
        }
    }

    fn arguments(self, text: &str) -> Value {
        match self {
            Question::Elicit => json!({"text": text}),
            Question::Sample => json!({"prompt": text}),
        }
    }

    /// The client capability the question needs.
    fn capabilities(self) -> Value {
        match self {
            Question::Elicit => json!({"elicitation": {}}),
            Question::Sample => json!({"sampling": {}}),
        }
    }

    /// The text `request` asks, if it is this question's request.
    fn asked(self, request: &Value) -> Result<&str, String> {
        let (method, text) = match self {
            Question::Elicit => ("elicitation/create", &request["params"]["message"]),
            Question::Sample => (
                "sampling/createMessage",
                &request["params"]["messages"][0]["content"]["text"],
            ),
        };
        if request["method"] != method {
            return Err(format!("{} where {method}", request["method"]));
        }
        text.as_str()
            .ok_or_else(|| format!("{method} without its text"))
    }

    /// The client's result for a request that asked `asked`.
    fn answer(self, asked: &str) -> Value {
        let reply = reply_to(asked);
        match self {
            Question::Elicit => json!({"action": "accept", "content": {"answer": reply}}),
            Question::Sample => json!({
                "role": "assistant",
                "content": {"type": "text", "text": reply},
                "model": "mcp-bench",
                "stopReason": "endTurn",
            }),
        }
    }
}

/// `mcp-bench modern`: measures, prints the JSON, writes `modern.json` in `out` and the
/// section of BENCHMARKS.md.
pub async fn main(opts: Options, duration: Duration, out: &Path) {
    if opts.rewrite {
        let r: Report = crate::report::read_report(&out.join("modern.json"));
        return write(&r, out);
    }
    crate::procfs::raise_fd_limit();
    let r = measure(&opts, duration).await;
    let json = serde_json::to_string_pretty(&r).expect("serializable");
    println!("{json}");
    write(&r, out);
}

/// Writes `modern.json` in `out` and the section of BENCHMARKS.md.
pub fn write(r: &Report, out: &Path) {
    crate::report::write_report(r, &out.join("modern.json"), SECTION, &markdown(r));
}

/// Runs the four comparisons, each run lasting half of `duration` (as the paired runs of the
/// full run do).
pub async fn measure(opts: &Options, duration: Duration) -> Report {
    let run = crate::paired::pair_run(duration);
    let gateway = opts
        .gateway
        .clone()
        .unwrap_or_else(|| crate::harness::sibling("mcp-gateway"));
    let mut r = Report {
        date: crate::report::date(),
        commit: crate::report::commit_excluding(&["BENCHMARKS.md", "bench/results/"]),
        gateway: opts.gateway.as_ref().map(|p| p.display().to_string()),
        cores: std::thread::available_parallelism().map_or(1, |n| n.get()),
        seconds_per_run: run.as_secs(),
        load_before: crate::procfs::loadavg(),
        ..Default::default()
    };
    for (scenario, workload, in_flight) in [
        ("(a) echo, 16 in flight", Workload::Echo, IN_FLIGHT),
        (
            "input round trip, one at a time",
            Workload::Ask(Question::Elicit),
            1,
        ),
        (
            "input round trip, 16 in flight",
            Workload::Ask(Question::Elicit),
            IN_FLIGHT,
        ),
        (
            "sampling round trip, one at a time",
            Workload::Ask(Question::Sample),
            1,
        ),
    ] {
        eprintln!("modern: {scenario}");
        let c = compare(scenario, workload, in_flight, run, &gateway).await;
        eprintln!(
            "  modern {:.0}/s p50 {:.2} ms p99 {:.2} ms; legacy {:.0}/s p50 {:.2} ms p99 {:.2} ms; \
             modern/legacy {:.1}%; wrong {} / {}",
            c.median_modern_calls_per_sec,
            c.median_modern_p50_ms,
            c.median_modern_p99_ms,
            c.median_legacy_calls_per_sec,
            c.median_legacy_p50_ms,
            c.median_legacy_p99_ms,
            c.ratio_percent,
            c.modern_wrong,
            c.legacy_wrong,
        );
        r.comparisons.push(c);
    }
    r.load_after = crate::procfs::loadavg();
    r
}

/// The modern client (A) against the legacy session (B) on `workload`, in alternating pairs.
async fn compare(
    scenario: &str,
    workload: Workload,
    in_flight: usize,
    run: Duration,
    gateway: &Path,
) -> Comparison {
    let tally = Arc::new(Tally::default());
    let start = || Target::gateway_at(gateway, "mcp-gateway", &[], None);
    let pairs: Vec<[Run; 2]> = crate::paired::alternate_with(start, start, async |side, url| {
        let tally = tally.clone();
        match (workload, side) {
            (Workload::Echo, 0) => modern_echo_load(&url, in_flight, run, tally).await,
            (Workload::Echo, _) => crate::load::http_load(&url, 1, in_flight, run).await,
            (Workload::Ask(q), 0) => ask_load(Client::Modern, q, &url, in_flight, run, tally).await,
            (Workload::Ask(q), _) => ask_load(Client::Legacy, q, &url, in_flight, run, tally).await,
        }
    })
    .await;
    let mut c = Comparison {
        scenario: scenario.into(),
        in_flight,
        seconds_per_run: run.as_secs(),
        ..Default::default()
    };
    for [modern, legacy] in &pairs {
        let (m, l) = (&modern.throughput, &legacy.throughput);
        c.modern_calls_per_sec.push(m.calls_per_sec.round());
        c.legacy_calls_per_sec.push(l.calls_per_sec.round());
        c.modern_p50_ms.push(m.p50_ms);
        c.modern_p99_ms.push(m.p99_ms);
        c.legacy_p50_ms.push(l.p50_ms);
        c.legacy_p99_ms.push(l.p99_ms);
        c.modern_cpu_us_per_call.push(modern.cpu_us_per_call);
        c.legacy_cpu_us_per_call.push(legacy.cpu_us_per_call);
        c.modern_client_cpu_us_per_call
            .push(modern.client_cpu_us_per_call);
        c.legacy_client_cpu_us_per_call
            .push(legacy.client_cpu_us_per_call);
        c.pair_ratio_percent.push(percent(
            m.calls_per_sec / l.calls_per_sec.max(f64::MIN_POSITIVE),
        ));
        c.modern_wrong += m.wrong;
        c.legacy_wrong += l.wrong;
    }
    debug_assert_eq!(pairs.len(), PAIRS);
    c.ratio_percent = round1(median(&c.pair_ratio_percent));
    c.median_modern_calls_per_sec = median(&c.modern_calls_per_sec);
    c.median_legacy_calls_per_sec = median(&c.legacy_calls_per_sec);
    c.median_modern_p50_ms = median(&c.modern_p50_ms);
    c.median_modern_p99_ms = median(&c.modern_p99_ms);
    c.median_legacy_p50_ms = median(&c.legacy_p50_ms);
    c.median_legacy_p99_ms = median(&c.legacy_p99_ms);
    c.wrong_causes = std::mem::take(&mut *tally.causes.lock().expect("lock"));
    let n = |a: &AtomicU64| a.load(Ordering::Relaxed);
    if matches!(workload, Workload::Ask(_)) {
        c.modern_calls = n(&tally.calls[0]);
        c.modern_requests = n(&tally.requests[0]);
        c.modern_questions = n(&tally.questions[0]);
        c.modern_foreign_questions = n(&tally.foreign[0]);
        c.legacy_calls = n(&tally.calls[1]);
        c.legacy_requests = n(&tally.requests[1]);
        c.legacy_questions = n(&tally.questions[1]);
        c.legacy_foreign_questions = n(&tally.foreign[1]);
        let legs = tally.legs.lock().expect("lock");
        let p50 = |h: &Histogram<u64>| h.value_at_quantile(0.5) as f64 / 1000.0;
        c.modern_legs_p50_ms = [p50(&legs[0][0]), p50(&legs[0][1])];
        c.legacy_legs_p50_ms = [p50(&legs[1][0]), p50(&legs[1][1])];
    }
    c
}

/// A modern `tools/call` of `tool`: `params` with the `_meta` every request carries, and the
/// headers that mirror the body.
fn modern_request(
    http: &reqwest::Client,
    url: &str,
    id: u64,
    tool: &str,
    params: Value,
    capabilities: &Value,
) -> reqwest::RequestBuilder {
    modern_post(
        http,
        url,
        id,
        "tools/call",
        Some(tool),
        params,
        capabilities,
    )
}

/// A modern request of `method`, with `Mcp-Name` when it names a tool.
fn modern_post(
    http: &reqwest::Client,
    url: &str,
    id: u64,
    method: &str,
    name: Option<&str>,
    mut params: Value,
    capabilities: &Value,
) -> reqwest::RequestBuilder {
    params["_meta"] = meta(capabilities);
    let body = json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params});
    modern_post_body(http, url, method, name, body.to_string())
}

/// The `_meta` every modern request of this client carries.
fn meta(capabilities: &Value) -> Value {
    json!({
        "io.modelcontextprotocol/protocolVersion": MODERN,
        "io.modelcontextprotocol/clientInfo": {"name": "mcp-bench", "version": "1"},
        "io.modelcontextprotocol/clientCapabilities": capabilities,
    })
}

/// [`modern_post`] of a body already written.
fn modern_post_body(
    http: &reqwest::Client,
    url: &str,
    method: &str,
    name: Option<&str>,
    body: String,
) -> reqwest::RequestBuilder {
    let mut req = http
        .post(url)
        .header("content-type", "application/json")
        .header("accept", "application/json, text/event-stream")
        .header("mcp-protocol-version", MODERN)
        .header("mcp-method", method);
    if let Some(name) = name {
        req = req.header("mcp-name", name);
    }
    req.body(body)
}

/// Waits until a modern `tools/list` lists `tool`: a modern call in the first milliseconds
/// of a fresh gateway can be refused as an unknown tool (its first probe of the plugin is
/// reported done before the view with the plugin's tools is published). The legacy client
/// starts once its session is open; the modern one once the gateway knows the tool.
async fn wait_for_tool(http: &reqwest::Client, url: &str, tool: &str) {
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while std::time::Instant::now() < deadline {
        let req = modern_post(http, url, 0, "tools/list", None, json!({}), &json!({}));
        if let Ok((_, messages)) = crate::mcp::send(req).await
            && messages.iter().any(|m| {
                m["result"]["tools"]
                    .as_array()
                    .is_some_and(|t| t.iter().any(|t| t["name"] == tool))
            })
        {
            return;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    panic!("the gateway at {url} did not list {tool} within 30 s");
}

/// The one message answering `id` among `messages`.
fn answer(messages: &[Value], id: u64) -> Result<&Value, String> {
    messages
        .iter()
        .find(|m| m["id"] == id)
        .ok_or_else(|| "no answer to the call's id".into())
}

/// The text of a complete tool result, or what is wrong with `m`.
fn complete_text(m: &Value) -> Result<&str, String> {
    if let Some(e) = m.get("error") {
        return Err(format!("error {} {}", e["code"], e["message"]));
    }
    let r = &m["result"];
    if r["resultType"] != "complete" {
        return Err(format!("resultType {} where complete", r["resultType"]));
    }
    r["content"][0]["text"]
        .as_str()
        .ok_or_else(|| "a result without text".into())
}

/// (a) with a modern client against a target started by hand (`mcp-bench load --modern`).
pub async fn echo_load(url: &str, in_flight: usize, duration: Duration) -> Throughput {
    let tally = Arc::new(Tally::default());
    let t = modern_echo_load(url, in_flight, duration, tally.clone()).await;
    for (cause, n) in tally.causes.lock().expect("lock").iter() {
        eprintln!("wrong: {cause} ({n})");
    }
    t
}

/// (a) with a modern client: `in_flight` workers call `echo` with no session.
async fn modern_echo_load(
    url: &str,
    in_flight: usize,
    duration: Duration,
    tally: Arc<Tally>,
) -> Throughput {
    let http = crate::mcp::client();
    wait_for_tool(&http, url, "echo").await;
    // Serialized once: the body of each call is written out as text, as the legacy
    // client's is (`crate::load::echo_call_body`).
    let ctx = Arc::new((http, url.to_owned(), meta(&json!({})).to_string()));
    crate::load::drive(in_flight, duration, move |w, seq| {
        let (ctx, tally) = (ctx.clone(), tally.clone());
        async move {
            let (http, url, meta) = &*ctx;
            let id = (w as u64) << 40 | seq;
            let text = crate::load::echo_text(w, seq);
            let body = crate::load::echo_call_body(id, &text, Some(meta));
            let req = modern_post_body(http, url, "tools/call", Some("echo"), body);
            let checked = match crate::mcp::send(req).await {
                Ok((Some(_), _)) => Err("a session was minted".to_owned()),
                Ok((None, messages)) => answer(&messages, id)
                    .and_then(complete_text)
                    .and_then(|t| (t == text).then_some(()).ok_or("another text".into())),
                Err(e) => Err(e),
            };
            checked.map_err(|e| tally.wrong(0, e)).is_ok()
        }
    })
    .await
}

#[derive(Debug, Clone, Copy)]
enum Client {
    Modern,
    Legacy,
}

/// The round trip of `question`: `in_flight` workers, each exchange timed whole. A legacy
/// client uses one session, which declares the capability it needs; a modern one declares it
/// on every request.
async fn ask_load(
    client: Client,
    question: Question,
    url: &str,
    in_flight: usize,
    duration: Duration,
    tally: Arc<Tally>,
) -> Throughput {
    let http = crate::mcp::client();
    let capabilities = question.capabilities();
    let session = match client {
        Client::Modern => {
            wait_for_tool(&http, url, question.tool()).await;
            None
        }
        Client::Legacy => Some(
            crate::mcp::initialize_as(&http, url, LEGACY, &capabilities)
                .await
                .expect("a session opens"),
        ),
    };
    let ctx = Arc::new((http, url.to_owned(), capabilities, session));
    let calls = ctx.clone();
    let t = crate::load::drive(in_flight, duration, move |w, seq| {
        let (ctx, tally) = (calls.clone(), tally.clone());
        async move {
            let (http, url, capabilities, session) = &*ctx;
            let id = (w as u64) << 40 | seq;
            let text = crate::load::echo_text(w, seq);
            tally.calls[usize::from(session.is_some())].fetch_add(1, Ordering::Relaxed);
            let (side, checked) = match session {
                None => (
                    0,
                    modern_ask(http, url, question, id, &text, capabilities, &tally).await,
                ),
                Some((sid, version)) => (
                    1,
                    legacy_ask(
                        http,
                        url,
                        sid.as_deref(),
                        version,
                        question,
                        id,
                        &text,
                        &tally,
                    )
                    .await,
                ),
            };
            checked.map_err(|e| tally.wrong(side, e)).is_ok()
        }
    })
    .await;
    let (http, url, _, session) = &*ctx;
    if let Some((Some(sid), _)) = session {
        let _ = http.delete(url).header("mcp-session-id", sid).send().await;
    }
    t
}

/// The answer the client gives to the plugin's question `text`, and the text the call that
/// asked it must then answer with.
fn reply_to(text: &str) -> String {
    format!("re:{text}")
}

/// Rounds a call may take before it counts as wrong.
const MAX_ROUNDS: u64 = 64;

/// One modern exchange: the call, an `InputRequiredResult`, the retry with the answers and
/// the state, and so on until the result. Request `r` of the call has id `64 * id + r`.
async fn modern_ask(
    http: &reqwest::Client,
    url: &str,
    question: Question,
    id: u64,
    text: &str,
    capabilities: &Value,
    tally: &Tally,
) -> Result<(), String> {
    let (tool, arguments) = (question.tool(), question.arguments(text));
    let mut params = json!({"name": tool, "arguments": arguments});
    let start = Instant::now();
    // When the call was asked its own question, if that was all it was asked.
    let mut asked_own = None;
    for round in 0..MAX_ROUNDS {
        let request_id = MAX_ROUNDS * id + round;
        let req = modern_request(http, url, request_id, tool, params, capabilities);
        tally.requests[0].fetch_add(1, Ordering::Relaxed);
        let (_, messages) = crate::mcp::send(req).await?;
        let m = answer(&messages, request_id)?;
        let r = &m["result"];
        if r["resultType"] != "input_required" {
            if complete_text(m)? != reply_to(text) {
                return Err("the result is not the answer to the call's question".into());
            }
            if let (1, Some(asked)) = (round, asked_own) {
                tally.legs(0, start, asked);
            }
            return Ok(());
        }
        let mut responses = serde_json::Map::new();
        if let Some(requests) = r.get("inputRequests") {
            let requests = requests.as_object().ok_or("inputRequests not an object")?;
            if round == 0
                && requests.len() == 1
                && requests.values().next().map(|r| question.asked(r)) == Some(Ok(text))
            {
                asked_own = Some(Instant::now());
            }
            for (key, request) in requests {
                let asked = question.asked(request)?;
                tally.question(0, asked, text);
                responses.insert(key.clone(), question.answer(asked));
            }
        }
        if responses.is_empty() && r.get("requestState").is_none() {
            return Err("an InputRequiredResult with neither requests nor state".into());
        }
        params = json!({"name": tool, "arguments": arguments, "inputResponses": responses});
        if let Some(state) = r.get("requestState") {
            params["requestState"] = state.clone();
        }
    }
    Err(format!("more than {MAX_ROUNDS} rounds"))
}

/// One legacy exchange: the call's POST answers with an SSE stream; the plugin's questions
/// come on it, each answer goes in a POST of its own, and the result comes on the stream.
#[allow(clippy::too_many_arguments)]
async fn legacy_ask(
    http: &reqwest::Client,
    url: &str,
    sid: Option<&str>,
    version: &str,
    question: Question,
    id: u64,
    text: &str,
    tally: &Tally,
) -> Result<(), String> {
    let params = json!({"name": question.tool(), "arguments": question.arguments(text)});
    let body = json!({"jsonrpc": "2.0", "id": id, "method": "tools/call", "params": params});
    let mut req = http
        .post(url)
        .header("content-type", "application/json")
        .header("accept", "application/json, text/event-stream")
        .header("mcp-protocol-version", version)
        .body(body.to_string());
    if let Some(sid) = sid {
        req = req.header("mcp-session-id", sid);
    }
    tally.requests[1].fetch_add(1, Ordering::Relaxed);
    let start = Instant::now();
    let r = req.send().await.map_err(|e| crate::mcp::describe(&e))?;
    if !r.status().is_success() {
        return Err(format!("HTTP {}", r.status()));
    }
    if !r
        .headers()
        .get("content-type")
        .is_some_and(|v| v.as_bytes().starts_with(b"text/event-stream"))
    {
        return Err("the call's answer is not an SSE stream".into());
    }
    let mut stream = Sse::new(r);
    // When the call's own question came, if it came first.
    let mut asked_own = None;
    let mut questions = 0;
    while let Some(m) = stream.next().await? {
        if m.get("method").is_some() && m.get("id").is_some() {
            let asked = question.asked(&m)?;
            questions += 1;
            if questions == 1 && asked == text {
                asked_own = Some(Instant::now());
            }
            tally.question(1, asked, text);
            let response =
                json!({"jsonrpc": "2.0", "id": m["id"], "result": question.answer(asked)});
            tally.requests[1].fetch_add(1, Ordering::Relaxed);
            crate::mcp::post(http, url, sid, Some(version), &response).await?;
        } else if m["id"] == id {
            if complete_text_legacy(&m)? != reply_to(text) {
                return Err("the result is not the answer to the call's question".into());
            }
            if let (1, Some(asked)) = (questions, asked_own) {
                tally.legs(1, start, asked);
            }
            return Ok(());
        }
    }
    Err("the stream ended without the result".into())
}

/// The text of a legacy tool result (no `resultType`).
fn complete_text_legacy(m: &Value) -> Result<&str, String> {
    if let Some(e) = m.get("error") {
        return Err(format!("error {} {}", e["code"], e["message"]));
    }
    m["result"]["content"][0]["text"]
        .as_str()
        .ok_or_else(|| "a result without text".into())
}

/// JSON-RPC messages from an SSE response as they come (events without data, such as the
/// priming event, are skipped).
struct Sse {
    response: reqwest::Response,
    buffer: Vec<u8>,
}

impl Sse {
    fn new(response: reqwest::Response) -> Sse {
        Sse {
            response,
            buffer: Vec::new(),
        }
    }

    async fn next(&mut self) -> Result<Option<Value>, String> {
        loop {
            while let Some(end) = self.buffer.windows(2).position(|w| w == b"\n\n") {
                let event: Vec<u8> = self.buffer.drain(..end + 2).collect();
                let data: Vec<&[u8]> = event
                    .split(|b| *b == b'\n')
                    .filter_map(|l| l.strip_prefix(b"data:"))
                    .map(|d| d.strip_prefix(b" ").unwrap_or(d))
                    .collect();
                let data = data.join(&b'\n');
                if data.iter().all(u8::is_ascii_whitespace) {
                    continue;
                }
                return serde_json::from_slice(&data)
                    .map(Some)
                    .map_err(|e| format!("an event that is not JSON: {e}"));
            }
            match self
                .response
                .chunk()
                .await
                .map_err(|e| crate::mcp::describe(&e))?
            {
                Some(chunk) => self.buffer.extend_from_slice(&chunk),
                None => return Ok(None),
            }
        }
    }
}

pub fn markdown(r: &Report) -> String {
    let binary = r
        .gateway
        .as_ref()
        .map_or(String::new(), |g| format!(" (gateway binary `{g}`)"));
    let mut out = format!(
        "{SECTION}\n\nMeasured by `mcp-bench modern` (bench/src/modern.rs) on {}, commit `{}`{binary}, \
         {} cores, {} s per run; the load average was {} before and {} after. A modern client \
         (no session; `_meta` with the protocol version 2026-07-28, client info and capabilities \
         on every request; `MCP-Protocol-Version`, `Mcp-Method` and `Mcp-Name` headers) against \
         a legacy one (one session opened with `initialize`) on the same gateway build, in \
         alternating pairs of runs, every run on a fresh gateway with the echo plugin behind it \
         (a plugin process per session; the modern client's calls go through the hidden \
         session of its caller, one process too). Every answer is checked. Raw numbers: \
         `bench/results/modern.json`. Reproduce: `target/release/mcp-bench --duration 6 modern` \
         (or `scripts/bench`, which runs it too).\n\n\
         - (a) echo: 16 calls of `echo` in flight, 64-byte texts; the answer must be the call's \
         text (and for the modern client a `complete` result, with no session minted). The \
         target: modern ≥ legacy in calls/s.\n\
         - Input round trip: the echo plugin's `ask` tool asks its client with \
         `elicitation/create` (the call's text as the message) and answers with what the client \
         accepted. Modern: the call gets an `InputRequiredResult`, the client retries at once \
         with `inputResponses` and `requestState` and gets the result. Legacy (session at {LEGACY}): \
         the call's POST answers with an SSE stream, the question comes on it, the answer goes \
         in a POST of its own, and the result comes on the stream. A figure is a call from its \
         first request to its result (one at a time: two POSTs either way); calls/s here are \
         such calls per second. The client answers a question with `re:` and the question's \
         text, and a call's result must be `re:` and its own text. Stdio carries no link from \
         a plugin's request to the call that caused it, so with 16 calls in flight on one \
         plugin instance the gateway puts a question on the newest call's stream (legacy) or \
         into its `InputRequiredResult` (modern); the clients answer what they are given, as \
         real ones would, and such questions are counted below.\n\
         - Sampling round trip: the same, one at a time, with the echo plugin's `sample` tool, \
         which asks with `sampling/createMessage` (the call's text as the prompt) and answers \
         with the text of the client's sample; the client samples `re:` and the prompt's \
         text.\n\n\
         Before its first call the modern client waits until `tools/list` lists the tool: \
         16 modern calls at once into a gateway that has just started can be refused (-32602, \
         unknown tool; see the notes below), and the legacy client opens its session first.\n\n\
         Modern/legacy: the median of each pair's own ratio of calls/s. p50 and p99: medians \
         over runs. CPU: time per call or exchange (`/proc/PID/stat`, medians over runs) of the \
         gateway process, and of the load generator, which shares the cores with it.\n\n\
         | scenario | runs | modern, calls/s | legacy, calls/s | modern/legacy per pair | \
         modern/legacy | modern p50 / p99 | legacy p50 / p99 | gateway CPU µs, modern / legacy | \
         load generator CPU µs, modern / legacy | wrong, modern / legacy |\n\
         |---|---|---|---|---|---|---|---|---|---|---|\n",
        r.date, r.commit, r.cores, r.seconds_per_run, r.load_before, r.load_after,
    );
    for c in &r.comparisons {
        let target = if c.scenario.starts_with("(a)") {
            if c.ratio_percent >= 100.0 {
                " ✓"
            } else {
                " ✗"
            }
        } else {
            ""
        };
        out.push_str(&format!(
            "| {} | {} × {} s | {} | {} | {} | **{:.1}%**{target} | {:.2} / {:.2} ms | {:.2} / {:.2} ms | {:.1} / {:.1} | {:.1} / {:.1} | {} / {} |\n",
            c.scenario,
            c.modern_calls_per_sec.len() + c.legacy_calls_per_sec.len(),
            c.seconds_per_run,
            list(&c.modern_calls_per_sec, 0),
            list(&c.legacy_calls_per_sec, 0),
            list(&c.pair_ratio_percent, 1),
            c.ratio_percent,
            c.median_modern_p50_ms,
            c.median_modern_p99_ms,
            c.median_legacy_p50_ms,
            c.median_legacy_p99_ms,
            median(&c.modern_cpu_us_per_call),
            median(&c.legacy_cpu_us_per_call),
            median(&c.modern_client_cpu_us_per_call),
            median(&c.legacy_client_cpu_us_per_call),
            c.modern_wrong,
            c.legacy_wrong,
        ));
    }
    let trips: Vec<&Comparison> = r
        .comparisons
        .iter()
        .filter(|c| c.modern_calls + c.legacy_calls > 0)
        .collect();
    if !trips.is_empty() {
        out.push_str(
            "\nThe round trips in detail, over all runs. Legs (p50): of the calls that were asked \
             their own question and nothing else, the time until the question (modern: the \
             `InputRequiredResult`; legacy: the request on the call's stream) and from there to \
             the result (modern: the retry; legacy: the answer's POST and the result on the \
             stream). Requests: HTTP requests per call (modern: the call and its retries; \
             legacy: the call and the answers' POSTs). Another call's: the questions a call was \
             given that another call had caused.\n\n\
             | scenario | client | legs p50, to the question / after it | requests per call | \
             questions | another call's |\n|---|---|---|---|---|---|\n",
        );
        for c in trips {
            for (client, legs, calls, requests, questions, foreign) in [
                (
                    "modern",
                    c.modern_legs_p50_ms,
                    c.modern_calls,
                    c.modern_requests,
                    c.modern_questions,
                    c.modern_foreign_questions,
                ),
                (
                    "legacy",
                    c.legacy_legs_p50_ms,
                    c.legacy_calls,
                    c.legacy_requests,
                    c.legacy_questions,
                    c.legacy_foreign_questions,
                ),
            ] {
                out.push_str(&format!(
                    "| {} | {client} | {:.2} / {:.2} ms | {:.2} | {questions} | {foreign} ({:.1}%) |\n",
                    c.scenario,
                    legs[0],
                    legs[1],
                    requests as f64 / calls.max(1) as f64,
                    100.0 * foreign as f64 / questions.max(1) as f64,
                ));
            }
        }
    }
    let wrong: Vec<String> = r
        .comparisons
        .iter()
        .filter(|c| !c.wrong_causes.is_empty())
        .map(|c| {
            let causes = c
                .wrong_causes
                .iter()
                .map(|(k, n)| format!("{k} ({n})"))
                .collect::<Vec<_>>()
                .join("; ");
            format!("{}: {causes}", c.scenario)
        })
        .collect();
    if !wrong.is_empty() {
        out.push_str(&format!(
            "\nWrong answers, by cause: {}.\n",
            wrong.join(". ")
        ));
    }
    // The hand-kept reading of the numbers.
    if let Ok(notes) = std::fs::read_to_string("bench/NOTES-modern.md") {
        out.push('\n');
        out.push_str(&notes);
    }
    out
}
