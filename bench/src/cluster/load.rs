//! The load driver of the cluster scenarios: workers over sessions call the echo plugin's
//! `echo` tool, whose answer is its argument, and every reply is checked: exactly one answer
//! to the call's id, with the call's own text, and no answer to another request in its
//! stream. A call ends in one of four ways: answered right, answered wrong, answered twice
//! (duplicated), or lost (its answer never came: the connection broke, a status other than
//! success, or its stream ended without it). Retrying is the caller's choice ([`Retry`]), as
//! a client's would be; a call that needed it is counted as retried, and its latency runs
//! from its first attempt.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;
use serde::Serialize;
use serde_json::{Value, json};

use crate::load::Throughput;

/// An open session.
#[derive(Debug, Clone)]
pub struct Session {
    pub sid: String,
    pub version: String,
}

/// Opens `n` sessions at `url` (`initialize`, `notifications/initialized`).
pub async fn open(http: &reqwest::Client, url: &str, n: usize) -> Result<Vec<Session>, String> {
    let mut out = Vec::with_capacity(n);
    for _ in 0..n {
        let (sid, version) = crate::mcp::initialize(http, url).await?;
        let sid = sid.ok_or("no session id")?;
        out.push(Session { sid, version });
    }
    Ok(out)
}

/// The driver's HTTP client: kept-alive connections, no proxy, a generous timeout (a call may
/// wait out a replica's drain).
pub fn client() -> reqwest::Client {
    reqwest::Client::builder()
        .pool_max_idle_per_host(1024)
        .timeout(Duration::from_secs(30))
        .no_proxy()
        .build()
        .expect("HTTP client")
}

/// When a call is sent again.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Retry {
    /// Never: every refusal counts.
    Never,
    /// After a 503 with `Retry-After`, as long as it says (a replica draining, or a session
    /// being handed over).
    Unavailable,
    /// After any 502 or 503 (as long as `Retry-After` says, or [`PAUSE`]) and after a broken
    /// connection ([`PAUSE`]): a client waiting out a failover.
    Failover,
}

/// How long a client waits before sending again when nothing says how long.
pub const PAUSE: Duration = Duration::from_millis(50);
/// How long a call is retried before it counts as lost.
pub const GIVE_UP: Duration = Duration::from_secs(30);

/// How calls ended.
#[derive(Debug, Default, Clone, Serialize)]
pub struct Tally {
    pub ok: u64,
    pub wrong: u64,
    pub duplicated: u64,
    pub lost: u64,
    /// Calls answered right after one or more retries (counted in `ok` too).
    pub retried: u64,
    /// Attempts that were retried, in all.
    pub retries: u64,
    /// Why calls failed or were retried, by cause.
    pub causes: BTreeMap<String, u64>,
    /// When the first [`MAX_FAILURES_KEPT`] calls that did not end right ended.
    #[serde(skip)]
    pub failed_at: Vec<Instant>,
}

/// The most failure instants a [`Tally`] keeps.
const MAX_FAILURES_KEPT: usize = 1000;

impl Tally {
    /// Calls that did not end right.
    pub fn failed(&self) -> u64 {
        self.wrong + self.duplicated + self.lost
    }

    fn cause(&mut self, cause: &str) {
        *self.causes.entry(cause.to_owned()).or_default() += 1;
    }

    pub fn add(&mut self, o: &Tally) {
        self.ok += o.ok;
        self.wrong += o.wrong;
        self.duplicated += o.duplicated;
        self.lost += o.lost;
        self.retried += o.retried;
        self.retries += o.retries;
        for (k, v) in &o.causes {
            *self.causes.entry(k.clone()).or_default() += v;
        }
        let room = MAX_FAILURES_KEPT.saturating_sub(self.failed_at.len());
        self.failed_at
            .extend(o.failed_at.iter().take(room).copied());
    }

    /// Counts one call.
    pub fn add_outcome(&mut self, o: &Outcome) {
        self.retries += u64::from(o.retries);
        for c in &o.retry_causes {
            self.cause(&format!("retried: {c}"));
        }
        if o.verdict != Verdict::Ok && self.failed_at.len() < MAX_FAILURES_KEPT {
            self.failed_at.push(started_plus(o));
        }
        match &o.verdict {
            Verdict::Ok => {
                self.ok += 1;
                if o.retries > 0 {
                    self.retried += 1;
                }
            }
            Verdict::Wrong(c) => {
                self.wrong += 1;
                self.cause(&format!("wrong: {c}"));
            }
            Verdict::Duplicated => {
                self.duplicated += 1;
                self.cause("duplicated");
            }
            Verdict::Lost(c) => {
                self.lost += 1;
                self.cause(&format!("lost: {c}"));
            }
        }
    }
}

/// When a call ended.
fn started_plus(o: &Outcome) -> Instant {
    o.started + o.elapsed
}

/// How one call ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    Ok,
    Wrong(String),
    Duplicated,
    Lost(String),
}

/// One call, retries included.
#[derive(Debug, Clone)]
pub struct Outcome {
    pub verdict: Verdict,
    pub retries: u32,
    /// What each retried attempt got.
    pub retry_causes: Vec<String>,
    /// When the first attempt was sent.
    pub started: Instant,
    /// From the first attempt to the last answer.
    pub elapsed: Duration,
}

/// What one attempt got.
enum Attempt {
    Answered(Vec<Value>),
    Refused {
        status: u16,
        retry_after: Option<Duration>,
    },
    Broken(String),
}

async fn attempt(http: &reqwest::Client, url: &str, s: &Session, body: &str) -> Attempt {
    let sent = http
        .post(url)
        .header("content-type", "application/json")
        .header("accept", "application/json, text/event-stream")
        .header("mcp-session-id", &s.sid)
        .header("mcp-protocol-version", &s.version)
        .body(body.to_owned())
        .send()
        .await;
    let r = match sent {
        Ok(r) => r,
        Err(e) => return Attempt::Broken(kind(&e)),
    };
    let status = r.status().as_u16();
    if !r.status().is_success() {
        let retry_after = r
            .headers()
            .get("retry-after")
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.trim().parse::<u64>().ok())
            .map(Duration::from_secs);
        return Attempt::Refused {
            status,
            retry_after,
        };
    }
    let sse = r
        .headers()
        .get("content-type")
        .is_some_and(|v| v.as_bytes().starts_with(b"text/event-stream"));
    let text = match r.text().await {
        Ok(t) => t,
        Err(e) => return Attempt::Broken(kind(&e)),
    };
    let messages = if sse {
        text.lines()
            .filter_map(|l| l.strip_prefix("data:"))
            .filter_map(|d| serde_json::from_str(d.trim()).ok())
            .collect()
    } else {
        match serde_json::from_str::<Value>(&text) {
            Ok(Value::Array(v)) => v,
            Ok(v) => vec![v],
            Err(_) => Vec::new(),
        }
    };
    Attempt::Answered(messages)
}

/// What broke, and the innermost error's words (hyper's say how a connection ended).
fn kind(e: &reqwest::Error) -> String {
    let what = if e.is_timeout() {
        "timed out"
    } else if e.is_connect() {
        "could not connect"
    } else if e.is_body() || e.is_decode() {
        "the body broke off"
    } else {
        "the connection broke"
    };
    let mut inner: &dyn std::error::Error = e;
    while let Some(source) = inner.source() {
        inner = source;
    }
    format!("{what} ({inner})")
}

/// Calls `echo` with `text` as request `id` in session `s` at `url`, retrying as `retry`
/// says, and checks the answer.
pub async fn call(
    http: &reqwest::Client,
    url: &str,
    s: &Session,
    id: u64,
    text: &str,
    retry: Retry,
) -> Outcome {
    let body = json!({"jsonrpc": "2.0", "id": id, "method": "tools/call", "params": {"name": "echo", "arguments": {"text": text}}}).to_string();
    let started = Instant::now();
    let mut retries = 0;
    let mut retry_causes = Vec::new();
    loop {
        let got = attempt(http, url, s, &body).await;
        let again = match (&got, retry) {
            (_, Retry::Never) => None,
            (
                Attempt::Refused {
                    status: 503,
                    retry_after: Some(d),
                },
                _,
            ) => Some((*d, "HTTP 503 with Retry-After".to_owned())),
            (
                Attempt::Refused {
                    status: status @ (502 | 503),
                    retry_after,
                },
                Retry::Failover,
            ) => Some((retry_after.unwrap_or(PAUSE), format!("HTTP {status}"))),
            (Attempt::Broken(e), Retry::Failover) => Some((PAUSE, e.clone())),
            _ => None,
        };
        if let Some((wait, cause)) = again
            && started.elapsed() + wait < GIVE_UP
        {
            retries += 1;
            retry_causes.push(cause);
            tokio::time::sleep(wait).await;
            continue;
        }
        let verdict = match got {
            Attempt::Broken(e) => Verdict::Lost(e),
            Attempt::Refused { status, .. } => Verdict::Lost(format!("HTTP {status}")),
            Attempt::Answered(messages) => check(&messages, id, text),
        };
        return Outcome {
            verdict,
            retries,
            retry_causes,
            started,
            elapsed: started.elapsed(),
        };
    }
}

/// Exactly one answer to `id`, whose text is `text`, and no answer to another request.
fn check(messages: &[Value], id: u64, text: &str) -> Verdict {
    let answers = || {
        messages
            .iter()
            .filter(|m| m.get("id").is_some_and(|i| !i.is_null()))
    };
    if answers().any(|m| m["id"] != id) {
        return Verdict::Wrong("an answer to another request".into());
    }
    let mine: Vec<&Value> = answers().collect();
    match mine.as_slice() {
        [] => Verdict::Lost("the stream ended without its answer".into()),
        [m] if m["result"]["content"][0]["text"] == text => Verdict::Ok,
        [m] => Verdict::Wrong(match m["error"]["message"].as_str() {
            Some(e) => format!("error: {}", e.chars().take(80).collect::<String>()),
            None => "another text".into(),
        }),
        _ => Verdict::Duplicated,
    }
}

/// A load's result: calls/s and latency of the calls answered right within the timed window,
/// and how every call ended.
#[derive(Debug, Default, Clone, Serialize)]
pub struct Run {
    pub throughput: Throughput,
    pub tally: Tally,
}

/// Workers over sessions.
pub struct Load {
    pub http: reqwest::Client,
    pub url: String,
    pub sessions: Arc<Vec<Session>>,
    pub in_flight: usize,
    pub retry: Retry,
}

/// Stops a [`Load::run`]: the instant it was told to stop.
pub type Stop = tokio::sync::watch::Sender<Option<Instant>>;

impl Load {
    /// Runs until `stop` says so: each worker makes one untimed call first (starting its
    /// session's plugin, opening its connection); once all have, `warmed` is told, and the
    /// timed window runs from then until the stop. Calls in flight at the stop are finished
    /// and counted.
    pub async fn run(
        &self,
        warmed: tokio::sync::oneshot::Sender<()>,
        stop: tokio::sync::watch::Receiver<Option<Instant>>,
    ) -> Run {
        let barrier = Arc::new(tokio::sync::Barrier::new(self.in_flight + 1));
        let next_worker = Arc::new(AtomicUsize::new(0));
        let workers: Vec<_> = (0..self.in_flight)
            .map(|_| {
                let (http, url, sessions, retry) = (
                    self.http.clone(),
                    self.url.clone(),
                    self.sessions.clone(),
                    self.retry,
                );
                let (barrier, mut stop, next_worker) =
                    (barrier.clone(), stop.clone(), next_worker.clone());
                tokio::spawn(async move {
                    let w = next_worker.fetch_add(1, Ordering::Relaxed);
                    let s = &sessions[w % sessions.len()];
                    let mut hist = Histogram::<u64>::new(3).expect("histogram");
                    let mut tally = Tally::default();
                    let mut seq = 0u64;
                    let mut one = async || {
                        seq += 1;
                        // Unique in the session: JSON-RPC forbids reusing an id there.
                        let id = (w as u64) << 40 | seq;
                        let text = format!("{w:04}-{seq:012}-{}", "x".repeat(64 - 18));
                        call(&http, &url, s, id, &text, retry).await
                    };
                    let first = one().await;
                    tally.add_outcome(&first);
                    barrier.wait().await;
                    while stop.borrow_and_update().is_none() {
                        let o = one().await;
                        if o.verdict == Verdict::Ok {
                            hist.record(o.elapsed.as_micros() as u64).expect("in range");
                        }
                        tally.add_outcome(&o);
                    }
                    (hist, tally)
                })
            })
            .collect();
        barrier.wait().await;
        let started = Instant::now();
        let _ = warmed.send(());
        let mut all = Histogram::<u64>::new(3).expect("histogram");
        let mut tally = Tally::default();
        for w in workers {
            let (h, t) = w.await.expect("worker");
            all.add(h).expect("same bounds");
            tally.add(&t);
        }
        let stopped = stop.borrow().unwrap_or_else(Instant::now);
        Run {
            throughput: crate::load::throughput(&all, tally.failed(), stopped - started),
            tally,
        }
    }

    /// Runs for `d` after the warm-up.
    pub async fn run_for(&self, d: Duration) -> Run {
        let (warmed, is_warm) = tokio::sync::oneshot::channel();
        let (stop, stopped) = tokio::sync::watch::channel(None);
        let timer = tokio::spawn(async move {
            if is_warm.await.is_ok() {
                tokio::time::sleep(d).await;
            }
            stop.send_replace(Some(Instant::now()));
        });
        let run = self.run(warmed, stopped).await;
        let _ = timer.await;
        run
    }
}
