//! Start and stop as an orchestrator sees them: SIGTERM mid-call drains (readiness fails, no
//! new connections, GET streams told to reconnect, the call completes) and exits 0 with no
//! child left; a grace period that runs out still stops everything; start-up problems fail
//! fast with a message naming them and a non-zero exit.

mod common;

use std::process::Command;
use std::time::{Duration, Instant};

use common::{GATEWAY, Gateway, alive, descendants};
use serde_json::json;

async fn wait_exit(gw: &mut Gateway, within: Duration) -> std::process::ExitStatus {
    let deadline = Instant::now() + within;
    loop {
        if let Some(status) = gw.child.try_wait().unwrap() {
            return status;
        }
        assert!(
            Instant::now() < deadline,
            "still running; log:\n{}",
            gw.log()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test]
async fn sigterm_mid_call_drains_completes_the_call_and_leaves_no_child() {
    let mut gw = Gateway::fixture(&[], &[]);
    let mut c = gw.client();
    c.initialize_at("2025-11-25", json!({})).await;
    let mut get = common::RawEvents::new(c.get_stream().await);
    let priming = get.next().await.expect("priming event");
    assert!(priming.id.is_some());

    let call = c.spawn_slow(1, 1500);
    gw.wait_log("fixture: slow request").await;
    let children = descendants(gw.pid());
    assert!(!children.is_empty(), "the plugin runs as a child");

    gw.signal("-TERM");

    // The GET stream is told to come back later, then closed.
    let retry = get.next().await.expect("a retry event before the close");
    assert!(retry.retry.is_some(), "{retry:?}");
    assert!(get.next().await.is_none(), "the GET stream ends");

    // Draining: not ready, and no new connection is accepted.
    let (status, body) = gw.admin_get("/readyz").await;
    assert_eq!(status, 503, "{body}");
    assert!(body.contains("shutting down"), "{body}");
    let refused = reqwest::Client::new()
        .post(&gw.url)
        .header("content-type", "application/json")
        .header("accept", common::ACCEPT_BOTH)
        .body("{}")
        .send()
        .await;
    assert!(
        refused.is_err(),
        "a new connection during the drain: {refused:?}"
    );

    // The call in flight completes.
    let reply = call.await.unwrap();
    assert_eq!(reply.status, 200);
    assert_eq!(
        reply.last()["result"]["content"][0]["text"],
        "slept 1500 ms",
        "{reply:?}"
    );

    let status = wait_exit(&mut gw, Duration::from_secs(20)).await;
    assert_eq!(status.code(), Some(0), "log:\n{}", gw.log());
    for pid in children {
        assert!(!alive(pid), "child {pid} survived the gateway");
    }
    let log = gw.log();
    assert!(log.contains("plugin stopped"), "{log}");
    assert!(log.contains("stopped"), "{log}");
}

#[tokio::test]
async fn a_grace_period_that_runs_out_still_stops_everything() {
    let mut gw = Gateway::fixture(&["--shutdown-grace-secs", "1"], &[]);
    let mut c = gw.client();
    c.initialize().await;
    let call = c.spawn_slow(1, 60_000);
    gw.wait_log("fixture: slow request").await;
    let children = descendants(gw.pid());
    assert!(!children.is_empty());
    let started = Instant::now();
    gw.signal("-INT");
    let status = wait_exit(&mut gw, Duration::from_secs(30)).await;
    assert_eq!(status.code(), Some(0), "log:\n{}", gw.log());
    assert!(
        started.elapsed() < Duration::from_secs(30),
        "did not wait for the 60 s call"
    );
    assert!(gw.log().contains("grace period ended"), "{}", gw.log());
    for pid in children {
        assert!(!alive(pid), "child {pid} survived the gateway");
    }
    // The cut-off call got no result.
    let reply = call.await.unwrap();
    assert!(
        !reply.body.contains("slept"),
        "the call cannot have completed: {reply:?}"
    );
}

/// Runs the gateway until it exits by itself; exit code and stderr. Fails if it serves.
fn start_fails(args: &[&str]) -> (i32, String) {
    let dir = tempfile::tempdir().unwrap();
    let mut cmd = Command::new(GATEWAY);
    if !args.contains(&"--database-url") {
        cmd.arg("--database-url")
            .arg(format!("sqlite://{}/gw.db?mode=rwc", dir.path().display()));
    }
    let mut child = cmd
        .args(args)
        .arg("--")
        .arg(common::FIXTURE)
        .env_remove("MCP_GATEWAY_CONFIG")
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    while child.try_wait().unwrap().is_none() {
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("the gateway kept running with {args:?}");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let out = child.wait_with_output().unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn start_up_problems_fail_fast_with_a_message_naming_them() {
    // Bad config.
    let (code, err) = start_fails(&["--listen", "not-an-address"]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("--listen"), "{err}");

    // A port in use, public or admin.
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = taken.local_addr().unwrap().to_string();
    let (code, err) = start_fails(&["--listen", &addr, "--admin-listen", "127.0.0.1:0"]);
    assert_eq!(code, 1, "{err}");
    assert!(err.contains(&format!("cannot listen on {addr}")), "{err}");
    let (code, err) = start_fails(&["--listen", "127.0.0.1:0", "--admin-listen", &addr]);
    assert_eq!(code, 1, "{err}");
    assert!(err.contains(&addr) && err.contains("admin"), "{err}");

    // A database nobody answers for.
    let started = Instant::now();
    let (code, err) = start_fails(&[
        "--listen",
        "127.0.0.1:0",
        "--admin-listen",
        "127.0.0.1:0",
        "--database-url",
        "postgres://gw:pw@127.0.0.1:1/gateway",
    ]);
    assert_eq!(code, 1, "{err}");
    assert!(
        err.contains("database") && err.contains("127.0.0.1:1"),
        "{err}"
    );
    assert!(!err.contains(":pw@"), "the password in a message: {err}");
    assert!(started.elapsed() < Duration::from_secs(25));
}

#[test]
fn a_migration_that_fails_stops_the_start() {
    // A database whose record of an applied migration does not match ours.
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("gw.db");
    let url = format!("sqlite://{}?mode=rwc", db.display());
    let out = Command::new("python3")
        .arg("-c")
        .arg(format!(
            "import sqlite3; c = sqlite3.connect({:?}); \
             c.execute('CREATE TABLE _sqlx_migrations (version BIGINT PRIMARY KEY, description TEXT NOT NULL, installed_on TIMESTAMP NOT NULL DEFAULT CURRENT_TIMESTAMP, success BOOLEAN NOT NULL, checksum BLOB NOT NULL, execution_time BIGINT NOT NULL)'); \
             c.execute(\"INSERT INTO _sqlx_migrations VALUES (1, 'tampered', CURRENT_TIMESTAMP, 1, x'00', 0)\"); \
             c.commit()",
            db.display().to_string()
        ))
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let (code, err) = start_fails(&[
        "--listen",
        "127.0.0.1:0",
        "--admin-listen",
        "127.0.0.1:0",
        "--database-url",
        &url,
    ]);
    assert_eq!(code, 1, "{err}");
    assert!(err.contains("migration"), "{err}");
}
