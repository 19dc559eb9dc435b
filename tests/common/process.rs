//! The real `mcp-gateway` binary as a child process on 127.0.0.1:0: started directly, through
//! a wrapper command or in a chosen directory, its ports read from its log, its log kept for
//! the test to read, signals sent to it, and the binary's other commands (`check`, ...) run to
//! their exit. Tests that read logs or `/metrics` counts, send signals, check exit codes or
//! process trees, or run the command line use this harness; it never serves in the test's own
//! process.

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::admin::{admin_get, metric_in};
use super::{Client, Endpoints, FIXTURE, GATEWAY, claim_harness, wait_until};

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

impl Endpoints for Gateway {
    fn public_addr(&self) -> &str {
        &self.addr
    }

    fn admin_addr(&self) -> Option<&str> {
        self.admin.as_deref()
    }
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

    /// Starts the gateway with `args` like [`Gateway::start`], or says why it did not start
    /// (its log): for a caller that can try again, e.g. on a port taken in the meantime.
    pub fn try_start(args: &[&str]) -> Result<Gateway, String> {
        Gateway::try_launch(&[], args, &[], None)
    }

    fn launch(
        wrapper: &[&str],
        args: &[&str],
        env: &[(&str, &str)],
        cwd: Option<&std::path::Path>,
    ) -> Gateway {
        Gateway::try_launch(wrapper, args, env, cwd).unwrap_or_else(|e| panic!("{e}"))
    }

    fn try_launch(
        wrapper: &[&str],
        args: &[&str],
        env: &[(&str, &str)],
        cwd: Option<&std::path::Path>,
    ) -> Result<Gateway, String> {
        claim_harness("child-process");
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
        let Ok(addr) = rx.recv_timeout(Duration::from_secs(30)) else {
            let _ = child.kill();
            let _ = child.wait();
            return Err(format!(
                "gateway did not start; log:\n{}",
                log.lock().unwrap().join("\n")
            ));
        };
        // The admin listener is announced before the public one, on the same reader thread.
        let admin = admin.lock().unwrap().clone();
        Ok(Gateway {
            child,
            url: format!("http://{addr}/mcp"),
            addr,
            admin,
            log,
            _db_dir: db_dir,
        })
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
        admin_get(self, path).await
    }

    /// The value of one sample in the admin listener's `/metrics` (`name{labels}` exactly as
    /// the text format writes it, labels in name order), or `None` when absent. Only here:
    /// the counters are global to a process, so only a gateway alone in its process has
    /// counts of its own.
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

    /// Sends the signal `sig` (as `kill` names it: `-TERM`, `-HUP`, ...), asserting it was sent.
    pub fn signal(&self, sig: &str) {
        assert!(send_signal(self.pid(), sig), "kill {sig}");
    }

    /// SIGTERM, then wait for the process to exit; returns its exit status.
    pub fn terminate(&mut self) -> std::process::ExitStatus {
        send_signal(self.pid(), "-TERM");
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
            send_signal(self.pid(), "-TERM");
            let deadline = Instant::now() + Duration::from_secs(10);
            while self.child.try_wait().ok().flatten().is_none() && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(20));
            }
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// `kill SIG PID`; whether it was sent.
pub fn send_signal(pid: u32, sig: &str) -> bool {
    Command::new("kill")
        .args([sig, &pid.to_string()])
        .status()
        .is_ok_and(|s| s.success())
}

/// Runs the binary with `args` (a command such as `check`, or flags alone) to its exit, with
/// no config file from the test's environment: its exit code (-1 for a signal), stdout and
/// stderr.
pub fn run_cli(args: &[&str], env: &[(&str, &str)]) -> (i32, String, String) {
    claim_harness("child-process");
    let mut cmd = Command::new(GATEWAY);
    cmd.args(args).env_remove("MCP_GATEWAY_CONFIG");
    for (k, v) in env {
        cmd.env(k, v);
    }
    let out = cmd.output().unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}
