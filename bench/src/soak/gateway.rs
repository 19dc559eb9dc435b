//! The gateway under soak: started in front of the fixture plugin, its log kept in a file and
//! its warnings and errors grouped by what they say; stopped with SIGTERM.

use std::collections::BTreeMap;
use std::path::Path;
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::process::{Child, Command};

use super::stats::{Tally, tally};
use super::{Options, PLUGIN};

/// The gateway process, where it listens, and what its log warned of.
pub(super) struct Gateway {
    child: Child,
    pub(super) pid: u32,
    pub(super) url: String,
    pub(super) admin: String,
    /// WARN and ERROR lines of its log, grouped by what they say.
    pub(super) warnings: Arc<Mutex<BTreeMap<String, Tally>>>,
    _dir: tempfile::TempDir,
}

pub(super) async fn start_gateway(opts: &Options, fixture: &Path, log: &Path) -> Gateway {
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
    pub(super) async fn stop(&mut self) -> bool {
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
