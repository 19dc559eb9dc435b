//! The Redis the replicas share, through `redis-cli` (as the tests reach it): whether it
//! answers, its pid (for its CPU time), a key's value, and deleting a run's keys, only those
//! under the run's own prefix.

use std::process::Stdio;

use tokio::process::Command;

/// `redis-cli` on `url`, given 10 s.
fn cli(url: &str) -> Command {
    let mut cmd = Command::new("timeout");
    cmd.args(["10", "redis-cli", "-u", url]);
    cmd.stdin(Stdio::null()).stderr(Stdio::null());
    cmd
}

/// Whether Redis at `url` answers `PING`.
pub async fn up(url: &str) -> bool {
    cli(url)
        .arg("PING")
        .output()
        .await
        .is_ok_and(|o| String::from_utf8_lossy(&o.stdout).trim() == "PONG")
}

/// The Redis server's pid (for its CPU time), when it runs on this machine.
pub async fn pid(url: &str) -> Option<u32> {
    let out = cli(url).args(["INFO", "server"]).output().await.ok()?;
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let pid: u32 = text
        .lines()
        .find_map(|l| l.strip_prefix("process_id:"))?
        .trim()
        .parse()
        .ok()?;
    let comm = std::fs::read_to_string(format!("/proc/{pid}/comm")).ok()?;
    comm.starts_with("redis").then_some(pid)
}

/// Deletes every key under `prefix` (SCAN, never KEYS; nothing outside the prefix).
pub async fn delete_keys(url: &str, prefix: &str) {
    let Ok(out) = cli(url)
        .args(["--scan", "--pattern", &format!("{prefix}*")])
        .output()
        .await
    else {
        return;
    };
    let keys: Vec<String> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter(|l| l.starts_with(prefix))
        .map(str::to_owned)
        .collect();
    for chunk in keys.chunks(500) {
        let _ = cli(url)
            .arg("DEL")
            .args(chunk)
            .stdout(Stdio::null())
            .status()
            .await;
    }
}
