//! Test harness: the real `mcp-gateway` binary on 127.0.0.1:0 in front of real stdio servers,
//! a small HTTP client that speaks the transport by hand (so tests see status codes and
//! streams as they are), and /proc helpers for process checks. Waits are on conditions with a
//! deadline, never bare sleeps.

#![allow(dead_code)]

use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures_util::StreamExt;
use serde_json::{Value, json};

pub const FIXTURE: &str = env!("CARGO_BIN_EXE_mcp-fixture-server");
pub const GATEWAY: &str = env!("CARGO_BIN_EXE_mcp-gateway");
pub const ACCEPT_BOTH: &str = "application/json, text/event-stream";

/// Where `scripts/install-test-deps` puts Node 22, npm packages and the Python venv.
pub fn tools_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(".tools")
}

/// A path under .tools that must exist; a clear failure when the installer has not run.
pub fn tool(rel: &str) -> PathBuf {
    let p = tools_dir().join(rel);
    assert!(
        p.exists(),
        "{} is missing: run scripts/install-test-deps (scripts/test does)",
        p.display()
    );
    p
}

/// Writes a gateway config file into `dir`; its path.
pub fn write_config(dir: &tempfile::TempDir, text: &str) -> String {
    let p = dir.path().join("gw.toml");
    std::fs::write(&p, text).unwrap();
    p.to_str().unwrap().to_owned()
}

/// Polls `cond` until it holds or `timeout` passes.
pub async fn wait_until(what: &str, timeout: Duration, mut cond: impl FnMut() -> bool) {
    let deadline = Instant::now() + timeout;
    while !cond() {
        assert!(Instant::now() < deadline, "timed out waiting for: {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// A running gateway process.
pub struct Gateway {
    pub child: Child,
    pub url: String,
    pub addr: String,
    /// The admin listener's address (health, readiness, metrics; the admin API with
    /// `--admin-token`).
    pub admin: Option<String>,
    log: Arc<Mutex<Vec<String>>>,
    /// Holds the gateway's database unless the test gave its own.
    _db_dir: tempfile::TempDir,
}

impl Gateway {
    /// Starts the gateway with `args` (before any `--`), listening on a free port.
    pub fn start(args: &[&str]) -> Gateway {
        Gateway::start_with_env(args, &[])
    }

    pub fn start_with_env(args: &[&str], env: &[(&str, &str)]) -> Gateway {
        Gateway::launch(&[], args, env, None)
    }

    /// Starts the gateway through `wrapper`, a command that runs the rest of its arguments in
    /// its own place (e.g. `prlimit --nofile=256`), so the gateway keeps the process id.
    pub fn start_wrapped(wrapper: &[&str], args: &[&str]) -> Gateway {
        Gateway::launch(wrapper, args, &[], None)
    }

    /// Starts the gateway in the working directory `cwd`, with no `--database-url` of the
    /// harness's own: the gateway's default database (if any) is what it chooses there.
    pub fn start_in(cwd: &std::path::Path, args: &[&str]) -> Gateway {
        Gateway::launch(&[], args, &[], Some(cwd))
    }

    fn launch(
        wrapper: &[&str],
        args: &[&str],
        env: &[(&str, &str)],
        cwd: Option<&std::path::Path>,
    ) -> Gateway {
        let db_dir = tempfile::tempdir().unwrap();
        let mut cmd = match wrapper {
            [] => Command::new(GATEWAY),
            [program, rest @ ..] => {
                let mut cmd = Command::new(program);
                cmd.args(rest).arg(GATEWAY);
                cmd
            }
        };
        if !args.contains(&"--listen") {
            cmd.args(["--listen", "127.0.0.1:0"]);
        }
        if let Some(dir) = cwd {
            cmd.current_dir(dir);
        } else if !args.contains(&"--database-url") {
            cmd.arg("--database-url").arg(format!(
                "sqlite://{}/gw.db?mode=rwc",
                db_dir.path().display()
            ));
        }
        if !args.contains(&"--admin-listen") {
            cmd.args(["--admin-listen", "127.0.0.1:0"]);
        }
        cmd.args(args)
            .env("RUST_LOG", "info,mcp_gateway=debug")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        for (k, v) in env {
            cmd.env(k, v);
        }
        let mut child = cmd.spawn().expect("start mcp-gateway");
        let stderr = child.stderr.take().expect("stderr piped");
        let log = Arc::new(Mutex::new(Vec::new()));
        let (tx, rx) = std::sync::mpsc::channel();
        let keep = log.clone();
        let admin = Arc::new(Mutex::new(None));
        let admin_seen = admin.clone();
        std::thread::spawn(move || {
            let mut tx = Some(tx);
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                if let Some(rest) = line.split("admin listener on http://").nth(1) {
                    let addr: String = rest
                        .chars()
                        .take_while(|c| *c != '"' && !c.is_whitespace())
                        .collect();
                    *admin_seen.lock().unwrap() = Some(addr);
                }
                if let Some(rest) = line.split("listening on http://").nth(1)
                    && let Some(tx) = tx.take()
                {
                    // Text or JSON log line: the address runs up to the path.
                    let addr: String = rest
                        .chars()
                        .take_while(|c| *c != '/' && *c != '"' && !c.is_whitespace())
                        .collect();
                    let _ = tx.send(addr);
                }
                if std::env::var_os("GATEWAY_LOG").is_some() {
                    eprintln!("[gateway] {line}");
                }
                keep.lock().unwrap().push(line);
            }
        });
        let addr = rx
            .recv_timeout(Duration::from_secs(30))
            .unwrap_or_else(|_| {
                panic!(
                    "gateway did not start; log:\n{}",
                    log.lock().unwrap().join("\n")
                )
            });
        // The admin listener is announced before the public one, on the same reader thread.
        let admin = admin.lock().unwrap().clone();
        Gateway {
            child,
            url: format!("http://{addr}/mcp"),
            addr,
            admin,
            log,
            _db_dir: db_dir,
        }
    }

    /// Quick mode in front of the fixture server (with extra fixture flags).
    pub fn fixture(extra_gateway_args: &[&str], fixture_args: &[&str]) -> Gateway {
        let mut args: Vec<&str> = extra_gateway_args.to_vec();
        args.push("--");
        args.push(FIXTURE);
        args.extend_from_slice(fixture_args);
        Gateway::start(&args)
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    pub fn log(&self) -> String {
        self.log.lock().unwrap().join("\n")
    }

    pub async fn wait_log(&self, needle: &str) {
        let log = self.log.clone();
        wait_until(
            &format!("log line containing {needle:?}"),
            Duration::from_secs(20),
            || log.lock().unwrap().iter().any(|l| l.contains(needle)),
        )
        .await;
    }

    /// Waits until `n` log lines contain `needle`.
    pub async fn wait_log_count(&self, needle: &str, n: usize) {
        let log = self.log.clone();
        wait_until(
            &format!("{n} log lines containing {needle:?}"),
            Duration::from_secs(20),
            || {
                log.lock()
                    .unwrap()
                    .iter()
                    .filter(|l| l.contains(needle))
                    .count()
                    >= n
            },
        )
        .await;
    }

    /// GET on the admin listener: status and body.
    pub async fn admin_get(&self, path: &str) -> (u16, String) {
        let admin = self.admin.as_deref().expect("admin listener announced");
        let r = reqwest::get(format!("http://{admin}{path}")).await.unwrap();
        (r.status().as_u16(), r.text().await.unwrap())
    }

    /// The value of one sample in the admin listener's `/metrics` (`name{labels}` exactly as
    /// the text format writes it, labels in name order), or `None` when absent.
    pub async fn metric(&self, sample: &str) -> Option<f64> {
        let (status, text) = self.admin_get("/metrics").await;
        assert_eq!(status, 200);
        metric_in(&text, sample)
    }

    /// Waits until a `/metrics` sample has the value `want`.
    pub async fn wait_metric(&self, sample: &str, want: f64) {
        let deadline = Instant::now() + Duration::from_secs(20);
        while self.metric(sample).await != Some(want) {
            assert!(
                Instant::now() < deadline,
                "timed out waiting for {sample} = {want}"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    pub fn client(&self) -> Client {
        Client::new(&self.url)
    }

    /// SIGTERM, then wait for the process to exit; returns its exit status.
    pub fn terminate(&mut self) -> std::process::ExitStatus {
        let _ = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status();
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                return status;
            }
            assert!(
                Instant::now() < deadline,
                "gateway did not exit after SIGTERM"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Gateway {
    fn drop(&mut self) {
        if self.child.try_wait().ok().flatten().is_none() {
            let _ = Command::new("kill")
                .args(["-TERM", &self.child.id().to_string()])
                .status();
            let deadline = Instant::now() + Duration::from_secs(10);
            while self.child.try_wait().ok().flatten().is_none() && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(20));
            }
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// A hand-rolled transport client.
#[derive(Clone)]
pub struct Client {
    pub url: String,
    pub http: reqwest::Client,
    pub session: Option<String>,
    pub version: Option<String>,
    /// Headers sent on every request besides the transport's own.
    pub headers: reqwest::header::HeaderMap,
}

/// An HTTP response, read whole: its status, headers and JSON-RPC messages (from a JSON body
/// or from each SSE event).
#[derive(Debug)]
pub struct Reply {
    pub status: u16,
    pub headers: reqwest::header::HeaderMap,
    pub body: String,
    pub messages: Vec<Value>,
}

impl Reply {
    pub fn content_type(&self) -> String {
        self.headers
            .get("content-type")
            .map(|v| v.to_str().unwrap().to_owned())
            .unwrap_or_default()
    }

    /// The only message, or the last one (the response, on an SSE stream).
    pub fn last(&self) -> &Value {
        self.messages
            .last()
            .unwrap_or_else(|| panic!("no message in reply: {self:?}"))
    }

    pub fn error_code(&self) -> i64 {
        self.last()["error"]["code"]
            .as_i64()
            .unwrap_or_else(|| panic!("no error in {self:?}"))
    }
}

impl Client {
    pub fn new(url: &str) -> Client {
        Client {
            url: url.to_owned(),
            // A hung request fails the test instead of hanging it.
            http: reqwest::Client::builder()
                .timeout(Duration::from_secs(90))
                .build()
                .expect("HTTP client"),
            session: None,
            version: None,
            headers: Default::default(),
        }
    }

    /// The same client sending `name: value` on every request.
    pub fn with_header(mut self, name: &'static str, value: &str) -> Client {
        self.headers
            .insert(name, value.parse().expect("a header value"));
        self
    }

    /// The same session from another HTTP client, so its requests go on another connection:
    /// a client whose connection broke.
    pub fn on_new_connection(&self) -> Client {
        Client {
            session: self.session.clone(),
            version: self.version.clone(),
            headers: self.headers.clone(),
            ..Client::new(&self.url)
        }
    }

    /// The same session over HTTP/2 (cleartext, prior knowledge).
    pub fn over_http2(&self) -> Client {
        Client {
            http: reqwest::Client::builder()
                .timeout(Duration::from_secs(90))
                .http2_prior_knowledge()
                .build()
                .expect("HTTP client"),
            ..self.on_new_connection()
        }
    }

    /// The same client sending `Authorization: Bearer <token>` on every request.
    pub fn with_token(mut self, token: &str) -> Client {
        let mut headers = reqwest::header::HeaderMap::new();
        headers.insert(
            "authorization",
            format!("Bearer {token}").parse().expect("a header value"),
        );
        self.http = reqwest::Client::builder()
            .timeout(Duration::from_secs(90))
            .default_headers(headers)
            .build()
            .expect("HTTP client");
        self
    }

    pub fn request(&self, method: reqwest::Method) -> reqwest::RequestBuilder {
        let mut r = self
            .http
            .request(method, &self.url)
            .headers(self.headers.clone());
        if let Some(s) = &self.session {
            r = r.header("mcp-session-id", s);
        }
        if let Some(v) = &self.version {
            r = r.header("mcp-protocol-version", v);
        }
        r
    }

    /// POSTs a raw body with the standard headers.
    pub async fn post_raw(&self, body: impl Into<reqwest::Body>) -> Reply {
        let r = self
            .request(reqwest::Method::POST)
            .header("content-type", "application/json")
            .header("accept", ACCEPT_BOTH)
            .body(body)
            .send()
            .await
            .expect("POST");
        read_reply(r).await
    }

    pub async fn post(&self, message: &Value) -> Reply {
        self.post_raw(message.to_string()).await
    }

    /// Sends a request and returns the reply (JSON or a finished SSE stream).
    pub async fn call(&self, id: i64, method: &str, params: Value) -> Reply {
        self.post(&json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params}))
            .await
    }

    /// The result of a request, asserting it succeeded.
    pub async fn result(&self, id: i64, method: &str, params: Value) -> Value {
        let reply = self.call(id, method, params).await;
        assert_eq!(reply.status, 200, "{reply:?}");
        let last = reply.last().clone();
        assert!(last.get("result").is_some(), "no result: {reply:?}");
        assert_eq!(last["id"], id);
        last["result"].clone()
    }

    /// The text of the first content item of a tool call's result.
    pub async fn tool_text(&self, id: i64, name: &str, arguments: Value) -> String {
        let r = self
            .result(
                id,
                "tools/call",
                json!({"name": name, "arguments": arguments}),
            )
            .await;
        r["content"][0]["text"]
            .as_str()
            .unwrap_or_else(|| panic!("no text in {r}"))
            .to_owned()
    }

    /// Starts the fixture's `slow` tool (sleeps `ms` unless cancelled) in the background.
    pub fn spawn_slow(&self, id: i64, ms: u64) -> tokio::task::JoinHandle<Reply> {
        let c = self.clone();
        tokio::spawn(async move {
            c.call(
                id,
                "tools/call",
                json!({"name": "slow", "arguments": {"ms": ms}}),
            )
            .await
        })
    }

    pub async fn notify(&self, method: &str, params: Value) -> Reply {
        self.post(&json!({"jsonrpc": "2.0", "method": method, "params": params}))
            .await
    }

    /// `initialize` at `version`, then `notifications/initialized`; keeps the session id.
    pub async fn initialize_at(&mut self, version: &str, capabilities: Value) -> Value {
        let reply = self
            .call(
                0,
                "initialize",
                json!({"protocolVersion": version, "capabilities": capabilities, "clientInfo": {"name": "gateway-tests", "version": "1"}}),
            )
            .await;
        assert_eq!(reply.status, 200, "{reply:?}");
        self.session = Some(
            reply.headers["mcp-session-id"]
                .to_str()
                .expect("session id is ASCII")
                .to_owned(),
        );
        let result = reply.last()["result"].clone();
        self.version = Some(result["protocolVersion"].as_str().unwrap().to_owned());
        let r = self.notify("notifications/initialized", json!({})).await;
        assert_eq!(r.status, 202, "{r:?}");
        result
    }

    pub async fn initialize(&mut self) -> Value {
        self.initialize_at(
            "2025-11-25",
            json!({"sampling": {}, "elicitation": {}, "roots": {"listChanged": true}}),
        )
        .await
    }

    /// Opens a streaming POST: the response, checked to be an SSE stream.
    pub async fn post_sse(&self, message: &Value) -> reqwest::Response {
        let r = self
            .request(reqwest::Method::POST)
            .header("content-type", "application/json")
            .header("accept", ACCEPT_BOTH)
            .body(message.to_string())
            .send()
            .await
            .expect("POST");
        assert_eq!(r.status(), 200);
        assert!(
            r.headers()["content-type"]
                .to_str()
                .unwrap()
                .starts_with("text/event-stream")
        );
        assert_eq!(r.headers()["x-accel-buffering"], "no");
        r
    }

    /// Opens a streaming POST and returns its live messages.
    pub async fn stream(&self, message: &Value) -> Events {
        Events::new(self.post_sse(message).await)
    }

    /// Opens the GET stream.
    pub async fn get_stream(&self) -> reqwest::Response {
        self.request(reqwest::Method::GET)
            .header("accept", "text/event-stream")
            .send()
            .await
            .expect("GET")
    }

    pub async fn delete(&self) -> u16 {
        self.request(reqwest::Method::DELETE)
            .send()
            .await
            .expect("DELETE")
            .status()
            .as_u16()
    }
}

async fn read_reply(r: reqwest::Response) -> Reply {
    let status = r.status().as_u16();
    let headers = r.headers().clone();
    let body = r.text().await.unwrap_or_default();
    let is_sse = headers
        .get("content-type")
        .is_some_and(|v| v.to_str().unwrap().starts_with("text/event-stream"));
    let messages = if is_sse {
        parse_sse(&body)
            .into_iter()
            .filter_map(|e| serde_json::from_str(&e.data).ok())
            .collect()
    } else if body.trim().is_empty() {
        Vec::new()
    } else {
        match serde_json::from_str::<Value>(&body) {
            Ok(Value::Array(v)) => v,
            Ok(v) => vec![v],
            Err(_) => Vec::new(),
        }
    };
    Reply {
        status,
        headers,
        body,
        messages,
    }
}

/// One SSE event.
#[derive(Debug, Clone, Default)]
pub struct SseEvent {
    pub id: Option<String>,
    pub data: String,
    pub retry: Option<u64>,
}

/// Parses a complete SSE body.
pub fn parse_sse(body: &str) -> Vec<SseEvent> {
    let mut out = Vec::new();
    for block in body.replace("\r\n", "\n").split("\n\n") {
        let mut ev = SseEvent::default();
        let mut any = false;
        for line in block.lines() {
            if line.starts_with(':') {
                continue;
            }
            let (field, value) = line
                .split_once(':')
                .map_or((line, ""), |(f, v)| (f, v.strip_prefix(' ').unwrap_or(v)));
            match field {
                "data" => {
                    if any && !ev.data.is_empty() {
                        ev.data.push('\n');
                    }
                    ev.data.push_str(value);
                    any = true;
                }
                "id" => {
                    ev.id = Some(value.to_owned());
                    any = true;
                }
                "retry" => {
                    ev.retry = value.parse().ok();
                    any = true;
                }
                _ => {}
            }
        }
        if any {
            out.push(ev);
        }
    }
    out
}

/// A live SSE stream, read event by event, as raw events (ids, retry, data) with the bytes
/// read so far counted (to cut a connection at a chosen point).
pub struct RawEvents {
    stream:
        std::pin::Pin<Box<dyn futures_util::Stream<Item = reqwest::Result<bytes::Bytes>> + Send>>,
    buf: String,
    pub bytes_read: usize,
    /// Keep-alive comments seen.
    pub comments: usize,
}

impl RawEvents {
    pub fn new(r: reqwest::Response) -> RawEvents {
        RawEvents {
            stream: Box::pin(r.bytes_stream()),
            buf: String::new(),
            bytes_read: 0,
            comments: 0,
        }
    }

    /// The next complete event, or `None` when the stream ends. Panics after 20 s.
    pub async fn next(&mut self) -> Option<SseEvent> {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
        loop {
            if let Some(pos) = self.buf.find("\n\n") {
                let block: String = self.buf.drain(..pos + 2).collect();
                match parse_sse(&block).into_iter().next() {
                    Some(ev) => return Some(ev),
                    None => {
                        self.comments += 1;
                        continue;
                    }
                }
            }
            let chunk = tokio::time::timeout_at(deadline, self.stream.next())
                .await
                .expect("timed out waiting for an SSE event");
            match chunk {
                Some(Ok(bytes)) => {
                    self.bytes_read += bytes.len();
                    self.buf
                        .push_str(&String::from_utf8_lossy(&bytes).replace("\r\n", "\n"));
                }
                _ => return None,
            }
        }
    }
}

/// A live SSE stream, read message by message.
pub struct Events {
    stream:
        std::pin::Pin<Box<dyn futures_util::Stream<Item = reqwest::Result<bytes::Bytes>> + Send>>,
    buf: String,
}

impl Events {
    pub fn new(r: reqwest::Response) -> Events {
        Events {
            stream: Box::pin(r.bytes_stream()),
            buf: String::new(),
        }
    }

    /// The next JSON-RPC message, or `None` when the stream ends. Panics after 20 s.
    pub async fn next(&mut self) -> Option<Value> {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
        loop {
            if let Some(pos) = self.buf.find("\n\n") {
                let block: String = self.buf.drain(..pos + 2).collect();
                if let Some(ev) = parse_sse(&block).into_iter().next()
                    && let Ok(v) = serde_json::from_str(&ev.data)
                {
                    return Some(v);
                }
                continue;
            }
            let chunk = tokio::time::timeout_at(deadline, self.stream.next())
                .await
                .expect("timed out waiting for an SSE event");
            match chunk {
                Some(Ok(bytes)) => self
                    .buf
                    .push_str(&String::from_utf8_lossy(&bytes).replace("\r\n", "\n")),
                _ => return None,
            }
        }
    }
}

/// The value of the sample `name{labels}` in a Prometheus text exposition.
pub fn metric_in(text: &str, sample: &str) -> Option<f64> {
    text.lines().filter(|l| !l.starts_with('#')).find_map(|l| {
        l.strip_prefix(sample)?
            .strip_prefix(' ')?
            .trim()
            .parse()
            .ok()
    })
}

/// Whether a process exists and is not a zombie.
pub fn alive(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(stat) => stat
            .rsplit_once(')')
            .and_then(|(_, rest)| rest.split_whitespace().next())
            .is_some_and(|state| state != "Z" && state != "X"),
        Err(_) => false,
    }
}

/// Every live descendant of `pid`, found through /proc parent links.
pub fn descendants(pid: u32) -> Vec<u32> {
    let mut parents = Vec::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(p) = entry.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{p}/stat")) else {
            continue;
        };
        let Some((_, rest)) = stat.rsplit_once(')') else {
            continue;
        };
        let fields: Vec<&str> = rest.split_whitespace().collect();
        if fields.len() > 2 && fields[0] != "Z" {
            parents.push((p, fields[1].parse::<u32>().unwrap_or(0)));
        }
    }
    let mut out = Vec::new();
    let mut frontier = vec![pid];
    while let Some(parent) = frontier.pop() {
        for (p, pp) in &parents {
            if *pp == parent {
                out.push(*p);
                frontier.push(*p);
            }
        }
    }
    out
}

/// A database of its own on the PostgreSQL server CI runs on 127.0.0.1:5432, dropped after.
pub struct Postgres {
    server: String,
    name: String,
    pub url: String,
}

impl Postgres {
    fn psql(server: &str, sql: &str) {
        let out = std::process::Command::new("psql")
            .args([
                &format!("{server}/postgres"),
                "-v",
                "ON_ERROR_STOP=1",
                "-c",
                sql,
            ])
            .output()
            .expect("psql (PostgreSQL client) on PATH");
        assert!(
            out.status.success(),
            "psql {sql}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }

    pub fn create(what: &str) -> Postgres {
        let server = std::env::var("MCP_GATEWAY_TEST_POSTGRES")
            .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432".into());
        let name = format!("mcpgw_test_{what}_{}", std::process::id());
        Postgres::psql(&server, &format!("DROP DATABASE IF EXISTS {name}"));
        Postgres::psql(&server, &format!("CREATE DATABASE {name}"));
        Postgres {
            url: format!("{server}/{name}"),
            server,
            name,
        }
    }
}

impl Postgres {
    /// Drops the database now, cutting off whoever is connected (a database gone mid-run).
    pub fn destroy(&self) {
        Postgres::psql(
            &self.server,
            &format!("DROP DATABASE IF EXISTS {} WITH (FORCE)", self.name),
        );
    }
}

impl Drop for Postgres {
    fn drop(&mut self) {
        Postgres::psql(
            &self.server,
            &format!("DROP DATABASE IF EXISTS {} WITH (FORCE)", self.name),
        );
    }
}
