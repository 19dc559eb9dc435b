//! A cluster under test: several `mcp-gateway` processes (each a [`Gateway`] of `process`, on
//! a port the harness chose so that it can advertise it and come back on it) behind a real
//! load balancer, HAProxy from Debian: round-robin with no stickiness, its config written
//! here, or the shipped configuration (deploy/config/haproxy.cfg, affinity learned from the
//! answers) run as it is as two peered balancers ([`Cluster::start_shipped`]). In cluster mode the replicas share the Redis at 127.0.0.1:6379 (or a Redis of the
//! test's own, `redis_server`) under a key prefix of the test's own and a cluster secret of
//! the test's own; plain replicas (no cluster flags)
//! share nothing. The harness kills, stops and restarts replicas on the same flags and port,
//! and reads what HAProxy thinks of each through its stats socket. On drop it kills every
//! process it started and deletes the test's Redis keys; it never touches a key outside the
//! test's prefix, nor a process it did not start.

use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::{Client, Gateway, free_port, send_signal};

/// The Redis every cluster test shares, each under a key prefix of its own.
pub const REDIS_URL: &str = "redis://127.0.0.1:6379";

/// The backend's name in the HAProxy config, as its stats name it.
const BACKEND: &str = "gateways";

/// Gateways behind HAProxy.
pub struct Cluster {
    /// The replicas, in HAProxy's server order (server `r<i>` is replica `i`).
    replicas: Vec<Replica>,
    /// The load balancer in front of them.
    lb: Haproxy,
    /// A second balancer, the first's peer (the shipped configuration only).
    peer: Option<Haproxy>,
    /// The secret the replicas share in cluster mode.
    cluster_secret: Option<String>,
    /// The Redis key prefix of this test (`test-<random>:`), when the replicas run in cluster
    /// mode; its keys are deleted when it drops, after everything else here has stopped.
    redis: Option<RedisPrefix>,
}

/// A Redis key prefix of a test's own, on the Redis at `url`, whose keys are deleted when it
/// drops (also when the cluster fails to start half-way).
struct RedisPrefix {
    url: String,
    prefix: String,
}

impl Drop for RedisPrefix {
    fn drop(&mut self) {
        delete_redis_keys_at(&self.url, &self.prefix);
    }
}

/// Cluster mode for gateways a test starts on its own (not through [`Cluster`], e.g. with
/// a config file each, as [`super::oauth::AuthGateway`] writes): a Redis key prefix and a
/// cluster secret of the test's own, and the flags that put a replica in that cluster. The
/// prefix's keys are deleted when this drops: declare it before the gateways, so that it
/// drops after them.
pub struct ClusterFlags {
    redis: RedisPrefix,
    secret: String,
}

impl Default for ClusterFlags {
    fn default() -> ClusterFlags {
        ClusterFlags::new()
    }
}

impl ClusterFlags {
    pub fn new() -> ClusterFlags {
        assert_redis_up();
        ClusterFlags {
            redis: RedisPrefix {
                url: REDIS_URL.to_owned(),
                prefix: format!("test-{:016x}:", rand::random::<u64>()),
            },
            secret: format!("{:032x}", rand::random::<u128>()),
        }
    }

    /// The flags of a replica listening on `port` (advertised as `http://127.0.0.1:port`).
    pub fn for_port(&self, port: u16) -> Vec<String> {
        [
            "--redis-url",
            REDIS_URL,
            "--redis-key-prefix",
            &self.redis.prefix,
            "--cluster-secret",
            &self.secret,
            "--advertise-url",
            &format!("http://127.0.0.1:{port}"),
        ]
        .map(str::to_owned)
        .to_vec()
    }

    /// The Redis key prefix of this test.
    pub fn key_prefix(&self) -> &str {
        &self.redis.prefix
    }
}

/// One gateway process of the cluster, and what it takes to start it again as it was.
struct Replica {
    /// The running process; `None` after a kill or a stop, until a restart.
    gw: Option<Gateway>,
    /// Its public port, fixed for its life: HAProxy's config and its advertise URL name it.
    port: u16,
    /// Its admin port when fixed for its life too (the shipped configuration health-checks
    /// `/readyz` there); `None`: a new one at each start.
    admin_port: Option<u16>,
    /// Its whole command line, replayed by a restart.
    args: Vec<String>,
}

impl Cluster {
    /// `n` replicas in cluster mode (`--redis-url`, a key prefix and a cluster secret of this
    /// test's own, `--advertise-url`), each also given `args` (plugins and any other flag;
    /// `--` and a command last, as for [`Gateway::start`]; each replica has a SQLite
    /// database of its own unless `args` name one), behind HAProxy; returns once HAProxy sees
    /// all of them up.
    pub fn start(n: usize, args: &[&str]) -> Cluster {
        assert_redis_up();
        Cluster::start_on_redis(n, REDIS_URL, args)
    }

    /// [`Cluster::start`] on the Redis at `redis_url` (a test's own, see `redis_server`),
    /// which need not answer yet: the replicas start without it and are up for HAProxy,
    /// which checks only that they listen.
    pub fn start_on_redis(n: usize, redis_url: &str, args: &[&str]) -> Cluster {
        let tag = format!("{:016x}", rand::random::<u64>());
        let prefix = format!("test-{tag}:");
        let secret = format!("{:032x}", rand::random::<u128>());
        let redis = RedisPrefix {
            url: redis_url.to_owned(),
            prefix: prefix.clone(),
        };
        let cluster_flags = [
            "--redis-url",
            redis_url,
            "--redis-key-prefix",
            &prefix,
            "--cluster-secret",
            &secret,
        ];
        Cluster::launch(
            n,
            &cluster_flags,
            true,
            args,
            Some(redis),
            Some(secret.clone()),
        )
    }

    /// `n` replicas that share nothing (no cluster flags, each its own sessions), behind the
    /// same HAProxy: the harness on today's binary, and the baseline the benchmark compares
    /// cluster mode with.
    pub fn start_plain(n: usize, args: &[&str]) -> Cluster {
        Cluster::launch(n, &[], false, args, None, None)
    }

    /// Three replicas in cluster mode, as [`Cluster::start`], behind the shipped HAProxy
    /// configuration (`deploy/config/haproxy.cfg`, as it is, its addresses given by the
    /// environment variables it reads) run as its two balancers, `lb` ([`Cluster::lb_url`])
    /// and `lb-2` ([`Cluster::peer_url`]), peers of each other. Each replica keeps its admin
    /// port across restarts: the balancers health-check `/readyz` there.
    pub fn start_shipped(args: &[&str]) -> Cluster {
        assert_redis_up();
        let prefix = format!("test-{:016x}:", rand::random::<u64>());
        let secret = format!("{:032x}", rand::random::<u128>());
        let redis = RedisPrefix {
            url: REDIS_URL.to_owned(),
            prefix: prefix.clone(),
        };
        let flags = [
            "--redis-url",
            REDIS_URL,
            "--redis-key-prefix",
            &prefix,
            "--cluster-secret",
            &secret,
        ];
        let replicas: Vec<Replica> = (0..3)
            .map(|_| Replica::start_on_a_free_port(&flags, true, true, args))
            .collect();
        let servers: Vec<(u16, u16)> = replicas
            .iter()
            .map(|r| (r.port, r.admin_port.expect("a fixed admin port")))
            .collect();
        let peers = (free_port(), free_port());
        let lb = Haproxy::start_shipped("lb", &servers, peers);
        let peer = Haproxy::start_shipped("lb-2", &servers, peers);
        let cluster = Cluster {
            replicas,
            lb,
            peer: Some(peer),
            cluster_secret: Some(secret),
            redis: Some(redis),
        };
        for i in 0..3 {
            cluster.wait_up(i);
        }
        cluster
    }

    fn launch(
        n: usize,
        cluster_flags: &[&str],
        advertise: bool,
        args: &[&str],
        redis: Option<RedisPrefix>,
        cluster_secret: Option<String>,
    ) -> Cluster {
        assert!(n > 0, "a cluster of no replica");
        let mut replicas = Vec::with_capacity(n);
        for _ in 0..n {
            replicas.push(Replica::start_on_a_free_port(
                cluster_flags,
                advertise,
                false,
                args,
            ));
        }
        let ports: Vec<u16> = replicas.iter().map(|r| r.port).collect();
        let lb = Haproxy::start(&ports);
        let cluster = Cluster {
            replicas,
            lb,
            peer: None,
            cluster_secret,
            redis,
        };
        for i in 0..n {
            cluster.wait_up(i);
        }
        cluster
    }

    /// How many replicas the cluster has (running or not).
    pub fn len(&self) -> usize {
        self.replicas.len()
    }

    /// The MCP endpoint through the load balancer, `http://127.0.0.1:<lb port>/mcp`.
    pub fn lb_url(&self) -> String {
        format!("http://{}/mcp", self.lb.addr)
    }

    /// The load balancer's address, `127.0.0.1:<port>`.
    pub fn lb_addr(&self) -> &str {
        &self.lb.addr
    }

    /// The MCP endpoint through the second balancer ([`Cluster::start_shipped`]).
    pub fn peer_url(&self) -> String {
        let peer = self.peer.as_ref().expect("a cluster behind two balancers");
        format!("http://{}/mcp", peer.addr)
    }

    /// The replica each balancer has learned serves session `id` (`show table`), by index;
    /// `None` where it has not learned it.
    pub fn learned(&self, id: &str) -> Vec<Option<usize>> {
        std::iter::once(&self.lb)
            .chain(self.peer.as_ref())
            .map(|lb| lb.learned(id))
            .collect()
    }

    /// A hand-rolled transport client on the load balancer.
    pub fn client(&self) -> Client {
        Client::new(&self.lb_url())
    }

    /// Replica `i`'s gateway (its URL, admin address, log, metrics, signals, pid); panics
    /// while it is down.
    pub fn replica(&self, i: usize) -> &Gateway {
        self.replicas[i]
            .gw
            .as_ref()
            .unwrap_or_else(|| panic!("replica {i} is not running"))
    }

    /// Replica `i`'s own MCP endpoint (bypassing the load balancer).
    pub fn url(&self, i: usize) -> String {
        format!("http://127.0.0.1:{}/mcp", self.replicas[i].port)
    }

    /// Replica `i`'s public port, the same across restarts.
    pub fn port(&self, i: usize) -> u16 {
        self.replicas[i].port
    }

    /// Replica `i`'s admin listener, `http://127.0.0.1:<port>` (a new port after each
    /// restart).
    pub fn admin_url(&self, i: usize) -> String {
        let addr = self.replica(i).admin.as_deref();
        format!("http://{}", addr.expect("admin listener announced"))
    }

    /// Which of `replicas` (all running) holds the test's one session: the one whose metrics
    /// count a session open.
    pub async fn holder(&self, replicas: &[usize]) -> usize {
        for &i in replicas {
            if self.replica(i).metric("mcp_gateway_sessions_active").await == Some(1.0) {
                return i;
            }
        }
        panic!("none of replicas {replicas:?} holds the session");
    }

    /// Replica `i`'s process id.
    pub fn pid(&self, i: usize) -> u32 {
        self.replica(i).pid()
    }

    /// Whether replica `i` is running (as far as the harness knows: started and not stopped
    /// by it, and not exited on its own).
    pub fn is_running(&mut self, i: usize) -> bool {
        match &mut self.replicas[i].gw {
            Some(gw) => gw.child.try_wait().ok().flatten().is_none(),
            None => false,
        }
    }

    /// The Redis key prefix of this test, in cluster mode.
    pub fn key_prefix(&self) -> Option<&str> {
        self.redis.as_ref().map(|r| r.prefix.as_str())
    }

    /// The cluster secret the replicas share, in cluster mode.
    pub fn cluster_secret(&self) -> Option<&str> {
        self.cluster_secret.as_deref()
    }

    /// What session `id` is called in the replicas' Redis key names (a keyed hash of it), in
    /// cluster mode.
    pub fn session_name(&self, id: &str) -> String {
        let secret = self.cluster_secret().expect("cluster mode");
        mcp_gateway::cluster::signing::session_names(secret).of(id)
    }

    /// SIGKILL replica `i` (a crash, a lost node) and reap it; returns once it is gone.
    pub fn kill(&mut self, i: usize) {
        let mut gw = self.replicas[i]
            .gw
            .take()
            .unwrap_or_else(|| panic!("replica {i} is not running"));
        gw.child.kill().expect("SIGKILL the replica");
        gw.child.wait().expect("reap the replica");
    }

    /// SIGTERM replica `i` (a deploy's stop) and wait for it to exit; its exit status.
    pub fn terminate(&mut self, i: usize) -> ExitStatus {
        let mut gw = self.replicas[i]
            .gw
            .take()
            .unwrap_or_else(|| panic!("replica {i} is not running"));
        gw.terminate()
    }

    /// Starts replica `i` again with the flags and port it had, stopping it first (SIGTERM)
    /// if it still runs, and returns once HAProxy sees it up.
    pub fn restart(&mut self, i: usize) {
        if self.replicas[i].gw.is_some() {
            self.terminate(i);
        }
        let replica = &mut self.replicas[i];
        // The port was free when the replica left it, but a process of another test may take
        // it meanwhile, or the kernel may hold it a moment: a few tries, then give up.
        let mut last = String::new();
        for attempt in 0..3 {
            if attempt > 0 {
                std::thread::sleep(Duration::from_millis(200));
            }
            match Gateway::try_start(&replica.argv()) {
                Ok(gw) => {
                    replica.gw = Some(gw);
                    self.wait_up(i);
                    return;
                }
                Err(e) => last = e,
            }
        }
        panic!(
            "replica {i} did not start again on port {}: {last}",
            replica.port
        );
    }

    /// Replica `i`'s state as HAProxy's stats report it (`UP`, `DOWN`, `UP 1/2`, ...), as
    /// the first balancer sees it.
    pub fn lb_status(&self, i: usize) -> String {
        self.lb.server_status(i)
    }

    /// Waits until HAProxy's health checks see replica `i` up, so requests go to it again.
    pub fn wait_up(&self, i: usize) {
        self.wait_lb_status(i, "UP");
    }

    /// Waits until HAProxy's health checks see replica `i` down, so requests go around it.
    pub fn wait_down(&self, i: usize) {
        self.wait_lb_status(i, "DOWN");
    }

    fn wait_lb_status(&self, i: usize, want: &str) {
        let deadline = Instant::now() + Duration::from_secs(20);
        for lb in std::iter::once(&self.lb).chain(self.peer.as_ref()) {
            loop {
                let status = lb.server_status(i);
                if status == want {
                    break;
                }
                assert!(
                    Instant::now() < deadline,
                    "HAProxy still says {status:?} of replica {i}, not {want:?}; its log:\n{}",
                    lb.log()
                );
                std::thread::sleep(Duration::from_millis(20));
            }
        }
    }

    /// The Redis keys under this test's prefix (none outside cluster mode).
    pub fn redis_keys(&self) -> Vec<String> {
        self.redis
            .as_ref()
            .map(|r| redis_scan_at(&r.url, &r.prefix))
            .unwrap_or_default()
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        // The load balancer first, so no request reaches a replica while they stop; then the
        // replicas, all told at once (SIGTERM) and given a few seconds together, the rest
        // killed, so none writes to Redis after the clean-up (`redis`, dropped after this).
        self.lb.stop();
        if let Some(peer) = &mut self.peer {
            peer.stop();
        }
        let mut running: Vec<Gateway> = self
            .replicas
            .iter_mut()
            .filter_map(|r| r.gw.take())
            .collect();
        for gw in &mut running {
            // Only one not reaped yet: the pid of one reaped may be another process's now.
            if gw.child.try_wait().ok().flatten().is_none() {
                send_signal(gw.pid(), "-TERM");
            }
        }
        let deadline = Instant::now() + Duration::from_secs(5);
        while Instant::now() < deadline
            && running
                .iter_mut()
                .any(|gw| gw.child.try_wait().ok().flatten().is_none())
        {
            std::thread::sleep(Duration::from_millis(20));
        }
        for gw in &mut running {
            let _ = gw.child.kill();
            let _ = gw.child.wait();
        }
    }
}

impl Replica {
    /// Starts a replica on a port free a moment ago; if another process took it meanwhile,
    /// tries once more on another.
    fn start_on_a_free_port(
        cluster_flags: &[&str],
        advertise: bool,
        fixed_admin: bool,
        args: &[&str],
    ) -> Replica {
        let mut last = String::new();
        for _ in 0..2 {
            let port = free_port();
            let admin_port = fixed_admin.then(free_port);
            let mut all: Vec<String> = vec![
                "--listen".into(),
                format!("127.0.0.1:{port}"),
                "--admin-listen".into(),
                format!("127.0.0.1:{}", admin_port.unwrap_or(0)),
            ];
            if advertise {
                all.push("--advertise-url".into());
                all.push(format!("http://127.0.0.1:{port}"));
            }
            all.extend(cluster_flags.iter().map(|s| s.to_string()));
            all.extend(args.iter().map(|s| s.to_string()));
            let mut replica = Replica {
                gw: None,
                port,
                admin_port,
                args: all,
            };
            match Gateway::try_start(&replica.argv()) {
                Ok(gw) => {
                    replica.gw = Some(gw);
                    return replica;
                }
                Err(e) => last = e,
            }
        }
        panic!("a replica did not start, twice: {last}");
    }

    fn argv(&self) -> Vec<&str> {
        self.args.iter().map(String::as_str).collect()
    }
}

/// HAProxy in the foreground (`-db`), with the config this harness wrote or the shipped one.
struct Haproxy {
    child: Option<Child>,
    /// `127.0.0.1:<port>` of its one frontend.
    addr: String,
    /// Its servers' names, replica `i` the `i`th.
    servers: Vec<String>,
    /// Its stats socket (admin level), for the servers' states.
    stats: PathBuf,
    /// What it wrote to stdout and stderr, for failure messages.
    log: Arc<Mutex<Vec<String>>>,
    /// Holds the config and the stats socket.
    _dir: tempfile::TempDir,
}

/// Where Debian's `haproxy` package puts the binary (`/usr/sbin`, often not on a user's PATH).
fn haproxy_binary() -> &'static str {
    const DEBIAN: &str = "/usr/sbin/haproxy";
    if Path::new(DEBIAN).exists() {
        DEBIAN
    } else {
        "haproxy"
    }
}

/// The config: one HTTP frontend that names the client in `X-Forwarded-For` (so the
/// replicas know a proxy is in front), round-robin over the replicas with no stickiness of any
/// kind (each request is balanced on its own, kept-alive client connections included;
/// connections to the replicas are kept alive and reused, as HAProxy does by default), TCP
/// health checks every 100 ms that take a dead replica out at the first failure and put it
/// back at the first success, and timeouts long enough for an SSE stream to sit idle. A
/// request whose connection to a replica fails, or that a replica closed without a byte of
/// answer (a draining replica closing a kept-alive connection), is sent to another
/// (`retries`, `retry-on`, `redispatch`), as `deploy/config/haproxy.cfg` does.
fn haproxy_config(lb_port: u16, ports: &[u16], stats: &Path) -> String {
    let mut cfg = format!(
        "global
    stats socket {stats} mode 600 level admin
    stats timeout 10s

defaults
    mode http
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
    default_backend {BACKEND}

backend {BACKEND}
    balance roundrobin
    default-server check inter 100ms fall 1 rise 1
",
        stats = stats.display()
    );
    for (i, port) in ports.iter().enumerate() {
        cfg.push_str(&format!("    server r{i} 127.0.0.1:{port}\n"));
    }
    cfg
}

impl Haproxy {
    /// Starts HAProxy in front of `ports` on a port free a moment ago (once more on another
    /// if it was taken meanwhile); returns once its stats socket answers.
    fn start(ports: &[u16]) -> Haproxy {
        let mut last = String::new();
        for _ in 0..2 {
            let dir = tempfile::tempdir().unwrap();
            let stats = dir.path().join("stats.sock");
            let lb_port = free_port();
            let cfg = dir.path().join("haproxy.cfg");
            std::fs::write(&cfg, haproxy_config(lb_port, ports, &stats)).unwrap();
            let servers = (0..ports.len()).map(|i| format!("r{i}")).collect();
            let mut cmd = Command::new(haproxy_binary());
            cmd.arg("-f").arg(&cfg);
            match Haproxy::spawn(cmd, dir, stats, lb_port, servers) {
                Ok(lb) => return lb,
                Err(e) => last = e,
            }
        }
        panic!("HAProxy did not start, twice: {last}");
    }

    /// Starts the shipped configuration as balancer `name` (`lb` or `lb-2`) in front of
    /// `servers` (each replica's public and admin port), its peers listening on `peers`; a
    /// second file adds only a stats socket. Returns once its stats socket answers.
    fn start_shipped(name: &str, servers: &[(u16, u16)], peers: (u16, u16)) -> Haproxy {
        let shipped = Path::new(env!("CARGO_MANIFEST_DIR")).join("deploy/config/haproxy.cfg");
        let mut last = String::new();
        for _ in 0..2 {
            let dir = tempfile::tempdir().unwrap();
            let stats = dir.path().join("stats.sock");
            let extra = dir.path().join("stats.cfg");
            std::fs::write(
                &extra,
                format!(
                    "global\n    stats socket {} mode 600 level admin\n",
                    stats.display()
                ),
            )
            .unwrap();
            let lb_port = free_port();
            let mut cmd = Command::new(haproxy_binary());
            cmd.arg("-f")
                .arg(&shipped)
                .arg("-f")
                .arg(&extra)
                .args(["-L", name])
                .env("MCP_LB_BIND", format!("127.0.0.1:{lb_port}"))
                .env("MCP_LB_PEER_1", format!("127.0.0.1:{}", peers.0))
                .env("MCP_LB_PEER_2", format!("127.0.0.1:{}", peers.1));
            for (i, (port, admin)) in servers.iter().enumerate() {
                cmd.env(
                    format!("MCP_GATEWAY_{}", i + 1),
                    format!("127.0.0.1:{port}"),
                )
                .env(format!("MCP_GATEWAY_{}_CHECK", i + 1), admin.to_string());
            }
            let names = (1..=servers.len())
                .map(|i| format!("gateway-{i}"))
                .collect();
            match Haproxy::spawn(cmd, dir, stats, lb_port, names) {
                Ok(lb) => return lb,
                Err(e) => last = e,
            }
        }
        panic!("the shipped HAProxy configuration did not start as {name}, twice: {last}");
    }

    fn spawn(
        mut cmd: Command,
        dir: tempfile::TempDir,
        stats: PathBuf,
        lb_port: u16,
        servers: Vec<String>,
    ) -> Result<Haproxy, String> {
        let mut child = cmd
            .arg("-db")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| {
                panic!(
                    "start {}: {e} (run scripts/install-test-deps)",
                    haproxy_binary()
                )
            });
        let log = Arc::new(Mutex::new(Vec::new()));
        for out in [
            Box::new(child.stdout.take().unwrap()) as Box<dyn Read + Send>,
            Box::new(child.stderr.take().unwrap()),
        ] {
            let keep = log.clone();
            std::thread::spawn(move || {
                for line in BufReader::new(out).lines().map_while(Result::ok) {
                    if std::env::var_os("HAPROXY_LOG").is_some() {
                        eprintln!("[haproxy] {line}");
                    }
                    keep.lock().unwrap().push(line);
                }
            });
        }
        let mut lb = Haproxy {
            child: None,
            addr: format!("127.0.0.1:{lb_port}"),
            servers,
            stats,
            log,
            _dir: dir,
        };
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            if let Some(status) = child.try_wait().unwrap() {
                // Let the reader threads take in its last words.
                std::thread::sleep(Duration::from_millis(100));
                return Err(format!("HAProxy exited ({status}):\n{}", lb.log()));
            }
            if lb.show_stat().is_some() {
                lb.child = Some(child);
                return Ok(lb);
            }
            if Instant::now() >= deadline {
                let _ = child.kill();
                let _ = child.wait();
                return Err(format!("HAProxy did not come up:\n{}", lb.log()));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    fn log(&self) -> String {
        self.log.lock().unwrap().join("\n")
    }

    /// `show stat` on the stats socket: its CSV, or `None` when the socket does not answer.
    fn show_stat(&self) -> Option<String> {
        self.command("show stat")
    }

    /// A command's answer on the stats socket, or `None` when the socket does not answer.
    fn command(&self, command: &str) -> Option<String> {
        let mut s = UnixStream::connect(&self.stats).ok()?;
        s.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
        s.write_all(format!("{command}\n").as_bytes()).ok()?;
        let mut text = String::new();
        s.read_to_string(&mut text).ok()?;
        Some(text)
    }

    /// The replica the stick table names for session `id` (`server_id` counts from 1).
    fn learned(&self, id: &str) -> Option<usize> {
        let table = self.command(&format!("show table {BACKEND} key {id}"))?;
        let at = table.find("server_id=")? + "server_id=".len();
        let n: usize = table[at..]
            .split(|c: char| !c.is_ascii_digit())
            .next()?
            .parse()
            .ok()?;
        n.checked_sub(1)
    }

    /// The `status` column of server `r<i>` in `show stat`.
    fn server_status(&self, i: usize) -> String {
        let text = self.show_stat().expect("HAProxy's stats socket answers");
        let mut lines = text.lines();
        let header: Vec<&str> = lines
            .next()
            .and_then(|h| h.strip_prefix("# "))
            .expect("a show stat header")
            .split(',')
            .collect();
        let col = |name: &str| {
            header
                .iter()
                .position(|c| *c == name)
                .unwrap_or_else(|| panic!("no {name} column in show stat"))
        };
        let (px, sv, status) = (col("pxname"), col("svname"), col("status"));
        let server = &self.servers[i];
        lines
            .map(|l| l.split(',').collect::<Vec<_>>())
            .find(|row| row.get(px) == Some(&BACKEND) && row.get(sv) == Some(&server.as_str()))
            .and_then(|row| row.get(status).map(|s| s.to_string()))
            .unwrap_or_else(|| panic!("no server {server} in HAProxy's stats:\n{text}"))
    }

    fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

impl Drop for Haproxy {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Fails clearly when the test Redis is not there.
pub fn assert_redis_up() {
    let out = Command::new("redis-cli")
        .args(["-u", REDIS_URL, "PING"])
        .output()
        .expect("run redis-cli");
    assert!(
        String::from_utf8_lossy(&out.stdout).trim() == "PONG",
        "no Redis at {REDIS_URL}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Every key under `prefix` in the shared test Redis (SCAN, never KEYS).
pub fn redis_scan(prefix: &str) -> Vec<String> {
    redis_scan_at(REDIS_URL, prefix)
}

/// `redis-cli` on the Redis at `url`, given 10 s (a frozen Redis never answers).
fn redis_cli(url: &str) -> Command {
    let mut cmd = Command::new("timeout");
    cmd.args(["10", "redis-cli", "-u", url]);
    cmd
}

/// Every key under `prefix` in the Redis at `url`; none when it does not answer.
pub fn redis_scan_at(url: &str, prefix: &str) -> Vec<String> {
    let Ok(out) = redis_cli(url)
        .args(["--scan", "--pattern"])
        .arg(format!("{}*", glob_escape(prefix)))
        .output()
    else {
        return Vec::new();
    };
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter(|l| !l.is_empty())
        .map(str::to_owned)
        .collect()
}

/// Deletes every key under `prefix` in the shared test Redis (and nothing else); never
/// panics, for Drop.
pub fn delete_redis_keys(prefix: &str) {
    delete_redis_keys_at(REDIS_URL, prefix);
}

/// [`delete_redis_keys`] in the Redis at `url`.
pub fn delete_redis_keys_at(url: &str, prefix: &str) {
    for chunk in redis_scan_at(url, prefix).chunks(500) {
        let _ = redis_cli(url)
            .arg("DEL")
            .args(chunk)
            .stdout(Stdio::null())
            .status();
    }
}

/// `s` with Redis's glob characters escaped, so a pattern matches it literally.
fn glob_escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        if matches!(c, '*' | '?' | '[' | ']' | '\\') {
            out.push('\\');
        }
        out.push(c);
    }
    out
}
