//! The processes a run measures: a gateway (the binary beside this one, or one named) on free
//! ports with the echo plugin behind it, the in-process ceiling, or a peer gateway from a
//! package registry; each a [`Target`], its process tree killed when it is dropped. And the
//! gist of a gateway's log line, to group the lines that say the same.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::io::{AsyncBufReadExt, AsyncReadExt, BufReader};
use tokio::process::{Child, Command};

use crate::mcp::{client, initialize};

/// A binary beside this one (the workspace shares its target directory).
pub(crate) fn sibling(name: &str) -> PathBuf {
    let me = std::env::current_exe().expect("own path");
    let p = me.parent().expect("a directory").join(name);
    assert!(
        p.exists(),
        "{} is missing: build with `cargo build --release --workspace`",
        p.display()
    );
    p
}

/// The gateway's configuration with one plugin process for every session.
pub(crate) const SHARED_PLUGIN: &str =
    "[plugins.echo]\ncommand = \"ECHO\"\nprocess_model = \"shared\"\n";

/// A target under test: an HTTP endpoint and the process tree behind it.
pub(crate) struct Target {
    pub(crate) name: String,
    pub(crate) url: String,
    pub(crate) child: Child,
    /// What it printed before it said where it listens (its start-up log, for a gateway).
    pub(crate) head: Vec<String>,
    _dir: tempfile::TempDir,
}

impl Target {
    /// The gateway beside this one, with `extra` arguments; behind it the echo plugin, or the
    /// plugins of `config` (a TOML text in which `ECHO` stands for the echo plugin's path).
    pub(crate) async fn gateway(name: &str, extra: &[&str], config: Option<&str>) -> Target {
        Target::gateway_at(&sibling("mcp-gateway"), name, extra, config).await
    }

    /// [`Target::gateway`] on the gateway binary at `binary`.
    pub(crate) async fn gateway_at(
        binary: &Path,
        name: &str,
        extra: &[&str],
        config: Option<&str>,
    ) -> Target {
        let dir = tempfile::tempdir().expect("temp dir");
        let mut cmd = Command::new(binary);
        cmd.args(["--listen", "127.0.0.1:0", "--admin-listen", "127.0.0.1:0"])
            // Every session comes from this one load generator.
            .args([
                "--max-sessions",
                "20000",
                "--max-sessions-per-client",
                "20000",
            ])
            .arg("--database-url")
            .arg(format!("sqlite://{}/gw.db?mode=rwc", dir.path().display()))
            .args(extra)
            .env("RUST_LOG", "warn,mcp_gateway=info");
        match config {
            Some(text) => {
                let path = dir.path().join("gw.toml");
                std::fs::write(
                    &path,
                    text.replace("ECHO", &sibling("bench-echo-plugin").display().to_string()),
                )
                .expect("config");
                cmd.arg("--config").arg(path);
            }
            None => {
                cmd.arg("--").arg(sibling("bench-echo-plugin"));
            }
        }
        Target::spawn(name, cmd, dir).await
    }

    pub(crate) async fn inproc() -> Target {
        let mut cmd = Command::new(std::env::current_exe().expect("own path"));
        cmd.args(["serve-inproc", "--listen", "127.0.0.1:0"]);
        Target::spawn(
            "in-process axum ceiling",
            cmd,
            tempfile::tempdir().expect("temp dir"),
        )
        .await
    }

    async fn spawn(name: &str, mut cmd: Command, dir: tempfile::TempDir) -> Target {
        cmd.stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true);
        let mut child = cmd.spawn().expect("start the target");
        // Targets print `listening on http://ADDR/mcp` on stdout or stderr.
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
        let head = Arc::new(std::sync::Mutex::new(Vec::new()));
        for stream in [
            child
                .stdout
                .take()
                .map(|s| Box::new(s) as Box<dyn tokio::io::AsyncRead + Unpin + Send>),
            child
                .stderr
                .take()
                .map(|s| Box::new(s) as Box<dyn tokio::io::AsyncRead + Unpin + Send>),
        ]
        .into_iter()
        .flatten()
        {
            let (tx, head) = (tx.clone(), head.clone());
            // For a diagnosis: MCP_BENCH_TARGET_LOG=FILE appends every line a target writes.
            let mut log = std::env::var_os("MCP_BENCH_TARGET_LOG").and_then(|path| {
                std::fs::OpenOptions::new()
                    .create(true)
                    .append(true)
                    .open(path)
                    .ok()
            });
            tokio::spawn(async move {
                use std::io::Write;
                let mut reader = BufReader::new(stream);
                let mut line = String::new();
                // Lines until the target is up: its head kept, its address found...
                while !tx.is_closed() {
                    line.clear();
                    if !matches!(reader.read_line(&mut line).await, Ok(1..)) {
                        return;
                    }
                    let line = line.trim_end_matches(['\n', '\r']);
                    if let Some(f) = &mut log {
                        let _ = writeln!(f, "{line}");
                    }
                    head.lock().expect("lock").push(line.to_owned());
                    if let Some(rest) = line.split("listening on http://").nth(1) {
                        let addr: String = rest
                            .chars()
                            .take_while(|c| *c != '/' && *c != '"' && !c.is_whitespace())
                            .collect();
                        let _ = tx.send(addr);
                    }
                }
                // ...then bytes, taken off the pipe as a log collector takes them, unsplit:
                // a split and a search of every line cost this process CPU per audit record.
                let mut chunk = vec![0; 64 << 10];
                loop {
                    match reader.read(&mut chunk).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => {
                            if let Some(f) = &mut log {
                                let _ = f.write_all(&chunk[..n]);
                            }
                        }
                    }
                }
            });
        }
        let addr = tokio::time::timeout(Duration::from_secs(60), rx.recv())
            .await
            .ok()
            .flatten()
            .unwrap_or_else(|| panic!("{name} did not start"));
        rx.close();
        let head = std::mem::take(&mut *head.lock().expect("lock"));
        Target {
            name: name.to_owned(),
            url: format!("http://{addr}/mcp"),
            child,
            head,
            _dir: dir,
        }
    }

    pub(crate) fn pid(&self) -> u32 {
        self.child.id().expect("running")
    }

    /// A peer gateway from a package registry, started with `args` (which contain `{port}`)
    /// and ready once it answers `initialize` on `path`.
    pub(crate) async fn peer(
        name: &str,
        program: &Path,
        args: &[&str],
        env: &[(&str, String)],
        path: &str,
    ) -> Result<Target, String> {
        if !program.exists() {
            return Err(format!(
                "not installed ({}); run scripts/install-bench-peers",
                program.display()
            ));
        }
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .map_err(|e| e.to_string())?
            .port();
        let echo = sibling("bench-echo-plugin").display().to_string();
        let args: Vec<String> = args
            .iter()
            .map(|a| {
                a.replace("{port}", &port.to_string())
                    .replace("{echo}", &echo)
            })
            .collect();
        let mut cmd = Command::new(program);
        cmd.args(&args)
            .envs(env.iter().map(|(k, v)| (*k, v.as_str())))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .kill_on_drop(true);
        let dir = tempfile::tempdir().map_err(|e| e.to_string())?;
        cmd.current_dir(dir.path());
        let child = cmd.spawn().map_err(|e| e.to_string())?;
        let url = format!("http://127.0.0.1:{port}{path}");
        let http = client();
        let deadline = Instant::now() + Duration::from_secs(90);
        loop {
            if initialize(&http, &url).await.is_ok() {
                break;
            }
            if Instant::now() > deadline {
                return Err("did not answer initialize within 90 s".into());
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        Ok(Target {
            name: name.to_owned(),
            url,
            child,
            head: Vec::new(),
            _dir: dir,
        })
    }
}

/// A log line's gist, to group lines that say the same: its level, target and message, with
/// the stderr tail a crash report quotes cut, session ids and pids left out, and numbers
/// blanked.
pub(crate) fn gist(line: &str) -> Option<String> {
    let rest = line.split_once(' ')?.1.trim_start();
    if !(rest.starts_with("WARN") || rest.starts_with("ERROR")) {
        return None;
    }
    let rest = match rest.split_once("; its stderr ended with:") {
        Some((head, _)) => format!("{head}; its stderr ended with: …"),
        None => rest.to_owned(),
    };
    let mut out = String::new();
    for word in rest.split_whitespace() {
        if ["session=", "pid=", "id="]
            .iter()
            .any(|k| word.starts_with(k))
        {
            continue;
        }
        if !out.is_empty() {
            out.push(' ');
        }
        let mut digits = false;
        for c in word.chars() {
            if c.is_ascii_digit() {
                if !digits {
                    out.push('#');
                }
                digits = true;
            } else {
                digits = false;
                out.push(c);
            }
        }
    }
    Some(out.chars().take(200).collect())
}
