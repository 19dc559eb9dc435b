//! The processes of one cluster run: gateway replicas on ports this harness chose (so that a
//! replica can advertise its address and come back on it after a kill or a stop), HAProxy from
//! Debian in front (round-robin, no stickiness, its config written here, as
//! tests/common/cluster.rs does for the tests), and in cluster mode a Redis key prefix of the
//! run's own, whose keys are deleted once every replica has stopped. In memory mode the same
//! HAProxy has one replica behind it, which keeps its sessions in memory.
//!
//! Every process is started by this harness and ended by it, by its own pid.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::process::{Child, Command};

use super::redis::delete_keys;

/// Which gateway setup a run measures.
#[derive(Debug, Clone)]
pub struct Spec {
    /// Replicas behind HAProxy.
    pub replicas: usize,
    /// Cluster mode on this Redis (`None`: memory mode).
    pub redis_url: Option<String>,
    /// The gateway binary.
    pub binary: PathBuf,
    /// A config file's text (`ECHO` is replaced by the echo plugin's path); `None`: the echo
    /// plugin on the command line, a process per session.
    pub config: Option<&'static str>,
    /// HAProxy keeps each session on the replica that answers for it, with the shipped
    /// configuration's rules ([`shipped_affinity`]); otherwise plain round-robin.
    pub affinity: bool,
}

/// One gateway process and what it takes to start it again on the same port.
struct Replica {
    child: Option<Child>,
    port: u16,
    args: Vec<String>,
    admin: Option<String>,
}

/// Replicas behind HAProxy.
pub struct Setup {
    spec: Spec,
    replicas: Vec<Replica>,
    lb: Option<Child>,
    lb_port: u16,
    stats: PathBuf,
    /// The run's Redis key prefix, in cluster mode.
    prefix: Option<String>,
    /// The replicas' warnings and errors (their log at `warn`), capped.
    warnings: Arc<Mutex<Vec<String>>>,
    /// Databases, config, HAProxy's config and stats socket.
    dir: tempfile::TempDir,
}

/// The most warning lines kept per run.
const MAX_WARNINGS: usize = 2000;

/// What runs now, for [`clean_up_and_exit`].
struct Running {
    /// The pids this harness started and has not reaped.
    pids: Vec<u32>,
    /// The Redis key prefixes in use, each with its Redis URL: `(url, prefix)`.
    prefixes: Vec<(String, String)>,
}

static RUNNING: Mutex<Running> = Mutex::new(Running {
    pids: Vec::new(),
    prefixes: Vec::new(),
});

fn started(pid: Option<u32>) {
    if let Some(pid) = pid {
        RUNNING.lock().expect("registry lock").pids.push(pid);
    }
}

fn ended(pid: Option<u32>) {
    if let Some(pid) = pid {
        RUNNING
            .lock()
            .expect("registry lock")
            .pids
            .retain(|p| *p != pid);
    }
}

/// On SIGINT or SIGTERM: kills every process this harness started and still runs (by pid),
/// deletes the keys under the prefixes in use, and exits.
pub async fn clean_up_and_exit() {
    use tokio::signal::unix::{SignalKind, signal};
    let (Ok(mut int), Ok(mut term)) = (
        signal(SignalKind::interrupt()),
        signal(SignalKind::terminate()),
    ) else {
        return;
    };
    tokio::select! {
        _ = int.recv() => {}
        _ = term.recv() => {}
    }
    let (pids, prefixes) = {
        let r = RUNNING.lock().expect("registry lock");
        (r.pids.clone(), r.prefixes.clone())
    };
    for pid in pids {
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(pid as i32),
            nix::sys::signal::Signal::SIGKILL,
        );
    }
    // Let the killed replicas go before their keys do.
    tokio::time::sleep(Duration::from_millis(200)).await;
    for (url, prefix) in prefixes {
        delete_keys(&url, &prefix).await;
    }
    eprintln!("mcp-bench: stopped; every process it started killed, its Redis keys deleted");
    std::process::exit(130);
}

impl Setup {
    /// Starts the replicas and HAProxy; returns once HAProxy sees every replica up.
    pub async fn start(spec: &Spec) -> Result<Setup, String> {
        let dir = tempfile::tempdir().map_err(|e| e.to_string())?;
        let prefix = spec
            .redis_url
            .as_ref()
            .map(|_| format!("mcp-bench-{}:", uuid::Uuid::new_v4().simple()));
        if let (Some(url), Some(prefix)) = (&spec.redis_url, &prefix) {
            RUNNING
                .lock()
                .expect("registry lock")
                .prefixes
                .push((url.clone(), prefix.clone()));
        }
        let secret = uuid::Uuid::new_v4().simple().to_string();
        let config = match spec.config {
            Some(text) => {
                let path = dir.path().join("gw.toml");
                let echo = crate::harness::sibling("bench-echo-plugin");
                std::fs::write(&path, text.replace("ECHO", &echo.display().to_string()))
                    .map_err(|e| e.to_string())?;
                Some(path)
            }
            None => None,
        };
        let mut setup = Setup {
            spec: spec.clone(),
            replicas: Vec::new(),
            lb: None,
            lb_port: 0,
            stats: dir.path().join("stats.sock"),
            prefix,
            warnings: Arc::new(Mutex::new(Vec::new())),
            dir,
        };
        for i in 0..spec.replicas {
            let port = free_port()?;
            let mut args: Vec<String> = [
                "--listen",
                &format!("127.0.0.1:{port}"),
                "--admin-listen",
                "127.0.0.1:0",
                "--max-sessions",
                "20000",
                "--max-sessions-per-client",
                "20000",
                "--database-url",
                &format!("sqlite://{}/gw{i}.db?mode=rwc", setup.dir.path().display()),
            ]
            .map(str::to_owned)
            .to_vec();
            if let (Some(url), Some(prefix)) = (&spec.redis_url, &setup.prefix) {
                args.extend(
                    [
                        "--redis-url",
                        url,
                        "--redis-key-prefix",
                        prefix,
                        "--cluster-secret",
                        &secret,
                        "--advertise-url",
                        &format!("http://127.0.0.1:{port}"),
                    ]
                    .map(str::to_owned),
                );
            }
            match &config {
                Some(path) => args.extend(["--config".into(), path.display().to_string()]),
                None => args.extend([
                    "--".into(),
                    crate::harness::sibling("bench-echo-plugin")
                        .display()
                        .to_string(),
                ]),
            }
            setup.replicas.push(Replica {
                child: None,
                port,
                args,
                admin: None,
            });
            setup.launch(i).await?;
        }
        setup.start_lb().await?;
        for i in 0..spec.replicas {
            setup.wait_lb(i, "UP").await?;
        }
        Ok(setup)
    }

    /// The MCP endpoint through HAProxy.
    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}/mcp", self.lb_port)
    }

    /// Replica `i`'s own MCP endpoint.
    pub fn replica_url(&self, i: usize) -> String {
        format!("http://127.0.0.1:{}/mcp", self.replicas[i].port)
    }

    pub fn len(&self) -> usize {
        self.replicas.len()
    }

    /// The running replicas' pids.
    pub fn replica_pids(&self) -> Vec<u32> {
        self.replicas
            .iter()
            .filter_map(|r| r.child.as_ref()?.id())
            .collect()
    }

    pub fn lb_pid(&self) -> Option<u32> {
        self.lb.as_ref()?.id()
    }

    /// Replica `i`'s admin listener, `http://ADDR`, while it runs.
    pub fn admin_url(&self, i: usize) -> Option<String> {
        let r = &self.replicas[i];
        r.child.as_ref()?;
        r.admin.as_ref().map(|a| format!("http://{a}"))
    }

    /// The replicas' warnings and errors so far.
    pub fn warnings(&self) -> Vec<String> {
        self.warnings.lock().expect("warnings lock").clone()
    }

    /// SIGKILLs replica `i` and reaps it.
    pub async fn kill(&mut self, i: usize) {
        if let Some(mut child) = self.replicas[i].child.take() {
            let pid = child.id();
            let _ = child.kill().await;
            ended(pid);
        }
    }

    /// SIGTERMs replica `i` and waits for it to exit (a deploy's stop); how long it took.
    pub async fn terminate(&mut self, i: usize) -> Duration {
        let started = Instant::now();
        if let Some(mut child) = self.replicas[i].child.take() {
            let pid = child.id();
            if let Some(pid) = pid {
                let _ = nix::sys::signal::kill(
                    nix::unistd::Pid::from_raw(pid as i32),
                    nix::sys::signal::Signal::SIGTERM,
                );
            }
            if tokio::time::timeout(Duration::from_secs(60), child.wait())
                .await
                .is_err()
            {
                let _ = child.kill().await;
            }
            ended(pid);
        }
        started.elapsed()
    }

    /// Starts replica `i` again on its port and flags; returns once HAProxy sees it up.
    pub async fn restart(&mut self, i: usize) -> Result<(), String> {
        self.launch(i).await?;
        self.wait_lb(i, "UP").await
    }

    /// Stops everything: HAProxy, then every replica (SIGKILL, reaped), then the run's
    /// Redis keys.
    pub async fn stop(mut self) {
        if let Some(mut lb) = self.lb.take() {
            let pid = lb.id();
            let _ = lb.kill().await;
            ended(pid);
        }
        for i in 0..self.replicas.len() {
            self.kill(i).await;
        }
        if let (Some(url), Some(prefix)) = (&self.spec.redis_url, self.prefix.take()) {
            delete_keys(url, &prefix).await;
            RUNNING
                .lock()
                .expect("registry lock")
                .prefixes
                .retain(|(_, p)| *p != prefix);
        }
    }

    /// Starts replica `i`'s process (a few tries: the port may be held a moment after a stop)
    /// and waits until it says it listens.
    async fn launch(&mut self, i: usize) -> Result<(), String> {
        let mut last = String::new();
        for attempt in 0..5 {
            if attempt > 0 {
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            match self.try_launch(i).await {
                Ok(()) => return Ok(()),
                Err(e) => last = e,
            }
        }
        Err(format!("replica {i} did not start: {last}"))
    }

    async fn try_launch(&mut self, i: usize) -> Result<(), String> {
        let replica = &mut self.replicas[i];
        let mut child = Command::new(&self.spec.binary)
            .args(&replica.args)
            .env("RUST_LOG", "warn,mcp_gateway=info")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .map_err(|e| format!("{}: {e}", self.spec.binary.display()))?;
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
        let streams = [
            child
                .stdout
                .take()
                .map(|s| Box::new(s) as Box<dyn tokio::io::AsyncRead + Unpin + Send>),
            child
                .stderr
                .take()
                .map(|s| Box::new(s) as Box<dyn tokio::io::AsyncRead + Unpin + Send>),
        ];
        for stream in streams.into_iter().flatten() {
            let (tx, warnings) = (tx.clone(), self.warnings.clone());
            // Read to the end, so the replica never blocks on a full pipe.
            tokio::spawn(async move {
                let mut lines = BufReader::new(stream).lines();
                while let Ok(Some(line)) = lines.next_line().await {
                    if line.contains(" WARN ") || line.contains(" ERROR ") {
                        let mut w = warnings.lock().expect("warnings lock");
                        if w.len() < MAX_WARNINGS {
                            w.push(format!("replica {i}: {line}"));
                        }
                    }
                    for (marker, what) in [
                        ("admin listener on http://", 0),
                        ("listening on http://", 1),
                    ] {
                        if let Some(rest) = line.split(marker).nth(1) {
                            let addr: String = rest
                                .chars()
                                .take_while(|c| *c != '/' && *c != '"' && !c.is_whitespace())
                                .collect();
                            let _ = tx.send((what, addr));
                        }
                    }
                }
            });
        }
        drop(tx);
        let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
        loop {
            match tokio::time::timeout_at(deadline, rx.recv()).await {
                Ok(Some((0, admin))) => replica.admin = Some(admin),
                Ok(Some(_)) => break,
                Ok(None) => {
                    let status = child.wait().await.map_err(|e| e.to_string())?;
                    return Err(format!("exited ({status}) before it listened"));
                }
                Err(_) => {
                    let _ = child.kill().await;
                    return Err("did not listen within 30 s".into());
                }
            }
        }
        started(child.id());
        replica.child = Some(child);
        Ok(())
    }

    async fn start_lb(&mut self) -> Result<(), String> {
        let mut last = String::new();
        for _ in 0..3 {
            self.lb_port = free_port()?;
            let cfg = self.dir.path().join("haproxy.cfg");
            let ports: Vec<u16> = self.replicas.iter().map(|r| r.port).collect();
            let affinity = if self.spec.affinity {
                shipped_affinity()?
            } else {
                Vec::new()
            };
            std::fs::write(
                &cfg,
                haproxy_config(self.lb_port, &ports, &self.stats, &affinity),
            )
            .map_err(|e| e.to_string())?;
            // For a diagnosis: HAPROXY_LOG=FILE appends its log of failed requests there.
            let log = match std::env::var_os("HAPROXY_LOG") {
                Some(path) => std::fs::OpenOptions::new()
                    .create(true)
                    .append(true)
                    .open(path)
                    .map(Stdio::from)
                    .map_err(|e| format!("HAPROXY_LOG: {e}"))?,
                None => Stdio::null(),
            };
            let mut child = Command::new(haproxy_binary())
                .arg("-f")
                .arg(&cfg)
                .arg("-db")
                .stdin(Stdio::null())
                .stdout(log)
                .stderr(Stdio::piped())
                .kill_on_drop(true)
                .spawn()
                .map_err(|e| format!("start {}: {e}", haproxy_binary()))?;
            let deadline = Instant::now() + Duration::from_secs(20);
            loop {
                if let Ok(Some(status)) = child.try_wait() {
                    let mut err = String::new();
                    if let Some(mut s) = child.stderr.take() {
                        let _ = s.read_to_string(&mut err).await;
                    }
                    last = format!("HAProxy exited ({status}): {err}");
                    break;
                }
                if show_stat(&self.stats).await.is_some() {
                    // Its stderr is not read past this point: it says little at its level.
                    drop(child.stderr.take());
                    started(child.id());
                    self.lb = Some(child);
                    return Ok(());
                }
                if Instant::now() > deadline {
                    let _ = child.kill().await;
                    last = "HAProxy's stats socket did not answer within 20 s".into();
                    break;
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
        Err(last)
    }

    /// Waits until HAProxy's health checks say `want` of replica `i`.
    pub async fn wait_lb(&self, i: usize, want: &str) -> Result<(), String> {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let status = show_stat(&self.stats)
                .await
                .and_then(|text| server_status(&text, i));
            if status.as_deref() == Some(want) {
                return Ok(());
            }
            if Instant::now() > deadline {
                return Err(format!(
                    "HAProxy says {status:?} of replica {i}, not {want}"
                ));
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

/// Where Debian's `haproxy` package puts the binary.
pub fn haproxy_binary() -> &'static str {
    const DEBIAN: &str = "/usr/sbin/haproxy";
    if Path::new(DEBIAN).exists() {
        DEBIAN
    } else {
        "haproxy"
    }
}

/// The tests' HAProxy config: one HTTP frontend that names the client in `X-Forwarded-For`
/// (as `deploy/config/haproxy.cfg` does; it also tells the replicas a proxy is in front, so a
/// kept-alive backend connection's next request is no proof of reading), round-robin over the replicas with no
/// stickiness (each request balanced on its own), connections to the replicas kept alive, TCP
/// health checks every 100 ms (down at the first failure, up at the first success), and a
/// failed connect sent to another replica (never a request a replica saw). For a diagnosis or
/// an experiment: a log of every request when HAPROXY_LOG names a file, and more backend lines
/// from MCP_BENCH_HAPROXY_BACKEND.
fn haproxy_config(lb_port: u16, ports: &[u16], stats: &Path, affinity: &[String]) -> String {
    let log = if std::env::var_os("HAPROXY_LOG").is_some() {
        "    log stdout format raw local0\n"
    } else {
        ""
    };
    let defaults_log = if log.is_empty() {
        ""
    } else {
        "    log global\n    option httplog\n"
    };
    let mut cfg = format!(
        "global
{log}    stats socket {stats} mode 600 level admin
    stats timeout 10s

defaults
{defaults_log}    mode http
    timeout connect 2s
    timeout client 1h
    timeout server 1h
    timeout tunnel 1h
    timeout http-request 30s
    timeout http-keep-alive 1m
    retries 2
    retry-on conn-failure empty-response
    option redispatch 1

frontend mcp
    bind 127.0.0.1:{lb_port}
    option forwardfor
    default_backend gateways

backend gateways
    balance roundrobin
    default-server check inter 100ms fall 1 rise 1
",
        stats = stats.display()
    );
    for line in affinity {
        cfg.push_str(&format!("    {line}\n"));
    }
    // For an experiment: more lines for the backend (e.g. `retry-on ...`).
    if let Ok(extra) = std::env::var("MCP_BENCH_HAPROXY_BACKEND") {
        for line in extra.lines() {
            cfg.push_str(&format!("    {}\n", line.trim()));
        }
    }
    for (i, port) in ports.iter().enumerate() {
        cfg.push_str(&format!("    server r{i} 127.0.0.1:{port}\n"));
    }
    cfg
}

/// The shipped configuration's affinity (`deploy/config/haproxy.cfg`, read from the working
/// directory, the repository's root): its backend's `stick` lines, the stick table without
/// its peers (one balancer here).
pub fn shipped_affinity() -> Result<Vec<String>, String> {
    const SHIPPED: &str = "deploy/config/haproxy.cfg";
    let text = std::fs::read_to_string(SHIPPED).map_err(|e| format!("{SHIPPED}: {e}"))?;
    let lines: Vec<String> = text
        .lines()
        .map(str::trim)
        .filter(|l| l.starts_with("stick"))
        .map(|l| l.split(" peers ").next().unwrap_or(l).to_owned())
        .collect();
    if !lines.iter().any(|l| l.starts_with("stick-table"))
        || !lines.iter().any(|l| l.starts_with("stick store-response"))
    {
        return Err(format!("{SHIPPED} has no affinity: {lines:?}"));
    }
    Ok(lines)
}

/// `show stat` on HAProxy's stats socket.
async fn show_stat(stats: &Path) -> Option<String> {
    let work = async {
        let mut s = tokio::net::UnixStream::connect(stats).await.ok()?;
        s.write_all(b"show stat\n").await.ok()?;
        let mut text = String::new();
        s.read_to_string(&mut text).await.ok()?;
        Some(text)
    };
    tokio::time::timeout(Duration::from_secs(5), work)
        .await
        .ok()
        .flatten()
}

/// The `status` column of server `r<i>` in `show stat`'s CSV.
fn server_status(text: &str, i: usize) -> Option<String> {
    let mut lines = text.lines();
    let header: Vec<&str> = lines.next()?.strip_prefix("# ")?.split(',').collect();
    let col = |name: &str| header.iter().position(|c| *c == name);
    let (px, sv, status) = (col("pxname")?, col("svname")?, col("status")?);
    let server = format!("r{i}");
    lines
        .map(|l| l.split(',').collect::<Vec<_>>())
        .find(|row| row.get(px) == Some(&"gateways") && row.get(sv) == Some(&server.as_str()))
        .and_then(|row| row.get(status).map(|s| s.to_string()))
}

fn free_port() -> Result<u16, String> {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .map_err(|e| e.to_string())
}
