//! Plugins as processes: started per session on first use, isolated from each other,
//! restarted after a crash with the session intact, stopped without orphans or zombies, and
//! never trusted to write only valid JSON-RPC.

mod common;

use std::time::Duration;

use common::{
    Admin, FIXTURE, Gateway, alive, descendants, rss_kib, stat_fields, tool_names, wait_until,
};
use serde_json::json;

#[tokio::test]
async fn each_session_gets_its_own_plugin_started_on_first_use() {
    let gw = Gateway::fixture(&[], &[]);
    // The start-up probe's child is gone once the gateway is ready to answer.
    let mut a = gw.client();
    a.initialize().await;
    wait_until("probe child stopped", Duration::from_secs(10), || {
        descendants(gw.pid()).is_empty()
    })
    .await;
    let mut b = gw.client();
    b.initialize().await;
    assert!(
        descendants(gw.pid()).is_empty(),
        "initialize alone starts no child"
    );

    assert_eq!(a.tool_text(1, "counter", json!({})).await, "1");
    assert_eq!(a.tool_text(2, "counter", json!({})).await, "2");
    assert_eq!(
        b.tool_text(1, "counter", json!({})).await,
        "1",
        "state never leaks between sessions"
    );
    let pa = a.tool_text(3, "pid", json!({})).await;
    let pb = b.tool_text(2, "pid", json!({})).await;
    assert_ne!(pa, pb);
    assert_eq!(descendants(gw.pid()).len(), 2);
}

#[tokio::test]
async fn a_crash_fails_the_call_and_the_session_survives() {
    let gw = Gateway::fixture(&[], &[]);
    let mut c = gw.client();
    c.initialize().await;
    assert_eq!(c.tool_text(1, "counter", json!({})).await, "1");
    let first_pid: u32 = c.tool_text(2, "pid", json!({})).await.parse().unwrap();

    let r = c
        .call(3, "tools/call", json!({"name": "crash", "arguments": {}}))
        .await;
    assert_eq!(r.status, 200);
    let err = &r.last()["error"];
    assert_eq!(r.last()["id"], 3);
    assert!(
        err["message"].as_str().unwrap().contains("plugin 'stdio'"),
        "{err}"
    );
    assert!(
        err["message"].as_str().unwrap().contains("exit status: 7"),
        "{err}"
    );
    wait_until("crashed child reaped", Duration::from_secs(5), || {
        !alive(first_pid)
    })
    .await;

    // The next request restarts and re-initializes the plugin: same session, new process.
    assert_eq!(
        c.tool_text(4, "echo", json!({"text": "back"})).await,
        "back"
    );
    let second_pid: u32 = c.tool_text(5, "pid", json!({})).await.parse().unwrap();
    assert_ne!(first_pid, second_pid);
    assert_eq!(
        c.tool_text(6, "counter", json!({})).await,
        "1",
        "a fresh process"
    );
    gw.wait_log("restarts on the next request").await;
}

#[tokio::test]
async fn in_flight_requests_all_fail_when_the_plugin_dies() {
    let gw = Gateway::fixture(&[], &[]);
    let mut c = gw.client();
    c.initialize().await;
    let slow: Vec<_> = (10..15).map(|id| c.spawn_slow(id, 30000)).collect();
    gw.wait_log_count("slow request", 5).await;
    c.call(20, "tools/call", json!({"name": "crash", "arguments": {}}))
        .await;
    for h in slow {
        let r = h.await.unwrap();
        assert!(
            r.last()["error"]["message"]
                .as_str()
                .unwrap()
                .contains("exited"),
            "{r:?}"
        );
    }
}

#[tokio::test]
async fn garbage_lines_are_dropped_and_logged_stderr_is_tagged() {
    let gw = Gateway::fixture(&[], &[]);
    let mut c = gw.client();
    c.initialize().await;
    let r = c
        .call(1, "tools/call", json!({"name": "garbage", "arguments": {}}))
        .await;
    // Only the real response reached the client: no garbage, no stray response.
    assert_eq!(r.messages.len(), 1, "{r:?}");
    assert_eq!(r.last()["result"]["content"][0]["text"], "after garbage");
    gw.wait_log("this line is not JSON-RPC").await;
    assert!(gw.log().contains("dropped a line that is not JSON-RPC"));

    c.tool_text(
        2,
        "stderr",
        json!({"text": "hello from the plugin's stderr"}),
    )
    .await;
    gw.wait_log("hello from the plugin's stderr").await;
    let sid = c.session.clone().unwrap();
    let line = gw
        .log()
        .lines()
        .find(|l| l.contains("hello from the plugin's stderr"))
        .unwrap()
        .to_owned();
    assert!(
        line.contains("plugin=stdio") && line.contains(&sid),
        "{line}"
    );
}

#[tokio::test]
async fn a_plugin_that_fails_to_start_leaves_the_others_working() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("gw.toml");
    std::fs::write(
        &config,
        format!(
            "[plugins.good]\ncommand = \"{FIXTURE}\"\n[plugins.bad]\ncommand = \"{FIXTURE}\"\nargs = [\"--fail-start\"]\n[plugins.missing]\ncommand = \"/nonexistent/server\"\n"
        ),
    )
    .unwrap();
    let gw = Gateway::start(&["--config", config.to_str().unwrap()]);
    let mut c = gw.client();
    c.initialize().await;
    let tools = c.result(1, "tools/list", json!({})).await;
    let names = tool_names(&tools);
    assert!(names.contains(&"good__echo"), "{names:?}");
    assert!(
        !names
            .iter()
            .any(|n| n.starts_with("bad__") || n.starts_with("missing__")),
        "{names:?}"
    );
    assert_eq!(
        c.tool_text(2, "good__echo", json!({"text": "ok"})).await,
        "ok"
    );
    // The failures are logged with the command and the plugin's own words.
    let log = gw.log();
    assert!(
        log.contains("--fail-start") && log.contains("refusing to start"),
        "{log}"
    );
    assert!(log.contains("/nonexistent/server"), "{log}");
}

#[tokio::test]
async fn delete_and_shutdown_leave_no_process_behind() {
    let mut gw = Gateway::fixture(&[], &[]);
    let mut a = gw.client();
    a.initialize().await;
    let pid_a: u32 = a.tool_text(1, "pid", json!({})).await.parse().unwrap();
    assert!(alive(pid_a));
    assert_eq!(a.delete().await, 200);
    wait_until(
        "session's child gone after DELETE",
        Duration::from_secs(10),
        || !alive(pid_a),
    )
    .await;

    let mut b = gw.client();
    b.initialize().await;
    let mut c = gw.client();
    c.initialize().await;
    let pids: Vec<u32> = vec![
        b.tool_text(1, "pid", json!({})).await.parse().unwrap(),
        c.tool_text(1, "pid", json!({})).await.parse().unwrap(),
    ];
    // A call still running when the gateway is told to stop.
    let slow = b.spawn_slow(2, 60000);
    gw.wait_log("slow request").await;
    let status = gw.terminate();
    assert!(status.success(), "clean exit on SIGTERM: {status}");
    for pid in pids {
        assert!(!alive(pid), "plugin {pid} outlived the gateway");
    }
    let _ = slow.await;
}

#[tokio::test]
async fn plugins_speaking_2024_11_05_work_behind_newer_clients() {
    let gw = Gateway::fixture(&[], &["--protocol-version", "2024-11-05"]);
    let mut c = gw.client();
    let result = c.initialize().await;
    assert_eq!(result["protocolVersion"], "2025-11-25");
    assert_eq!(c.tool_text(1, "echo", json!({"text": "old"})).await, "old");
    gw.wait_log("version=2024-11-05").await;
}

#[tokio::test]
async fn plugins_speaking_an_unknown_version_are_refused() {
    let gw = Gateway::fixture(&[], &["--protocol-version", "1999-01-01"]);
    let mut c = gw.client();
    c.initialize().await;
    let tools = c.result(1, "tools/list", json!({})).await;
    assert_eq!(
        tools["tools"],
        json!([]),
        "the refused plugin's tools are absent"
    );
    gw.wait_log("1999-01-01").await;
}

#[tokio::test]
async fn many_requests_in_flight_on_one_plugin() {
    let gw = Gateway::fixture(&[], &[]);
    let mut c = gw.client();
    c.initialize().await;
    let calls: Vec<_> = (1..=40)
        .map(|i| {
            let c = c.clone();
            tokio::spawn(async move {
                (
                    i,
                    c.tool_text(i, "echo", json!({"text": format!("m{i}")}))
                        .await,
                )
            })
        })
        .collect();
    for h in calls {
        let (i, text) = h.await.unwrap();
        assert_eq!(text, format!("m{i}"));
    }
    assert_eq!(descendants(gw.pid()).len(), 1, "one child for the session");
}

#[tokio::test]
async fn cancellation_reaches_the_plugin_with_its_id_and_ends_the_stream() {
    let gw = Gateway::fixture(&[], &[]);
    let mut c = gw.client();
    c.initialize().await;
    let slow = c.spawn_slow(77, 60000);
    gw.wait_log("slow request").await;
    let r = c
        .notify(
            "notifications/cancelled",
            json!({"requestId": 77, "reason": "user gave up"}),
        )
        .await;
    assert_eq!(r.status, 202);
    // The plugin saw its own id for the request (the gateway's, not the client's 77)...
    gw.wait_log("cancelled").await;
    let started = gw
        .log()
        .lines()
        .find(|l| l.contains("slow request"))
        .unwrap()
        .to_owned();
    let plugin_id = started
        .split("slow request ")
        .nth(1)
        .unwrap()
        .split(' ')
        .next()
        .unwrap()
        .to_owned();
    assert_ne!(
        plugin_id, "77",
        "the plugin sees the gateway's id, not the client's"
    );
    assert!(
        gw.log().contains(&format!("request {plugin_id} cancelled")),
        "{}",
        gw.log()
    );
    // ...and the client's stream ended without a response, well before the 60 s sleep.
    let reply = tokio::time::timeout(Duration::from_secs(10), slow)
        .await
        .unwrap()
        .unwrap();
    assert!(
        reply
            .messages
            .iter()
            .all(|m| m.get("id") != Some(&json!(77))),
        "{reply:?}"
    );
    assert_eq!(
        c.tool_text(78, "echo", json!({"text": "after"})).await,
        "after"
    );
}

#[tokio::test]
async fn the_whole_process_group_goes_with_the_plugin() {
    // The plugin leaves a grandchild that ignores stdin; stopping the plugin must take it too.
    let script = format!("sleep 300 & exec {FIXTURE}");
    let gw = Gateway::start(&["--", "sh", "-c", &script]);
    let mut c = gw.client();
    c.initialize().await;
    wait_until("probe tree gone", Duration::from_secs(10), || {
        descendants(gw.pid()).is_empty()
    })
    .await;
    let pid: u32 = c.tool_text(1, "pid", json!({})).await.parse().unwrap();
    let tree = descendants(gw.pid());
    assert!(tree.len() >= 2, "the plugin and its grandchild: {tree:?}");
    assert!(tree.contains(&pid));
    assert_eq!(c.delete().await, 200);
    wait_until(
        "the plugin's whole group gone",
        Duration::from_secs(15),
        || tree.iter().all(|p| !alive(*p)),
    )
    .await;
}

#[tokio::test]
async fn regression_shutdown_does_not_wait_for_json_mode_calls() {
    // Guards: SIGTERM waited for a JSON-mode call to finish (here 10 minutes), because only SSE
    // streams listened for the end of their session.
    let mut gw = Gateway::fixture(&["--response-mode", "json"], &[]);
    let mut c = gw.client();
    c.initialize().await;
    let slow = c.spawn_slow(1, 600000);
    gw.wait_log("slow request").await;
    assert!(gw.terminate().success());
    let r = slow.await.unwrap();
    assert!(
        r.last()["error"]["message"]
            .as_str()
            .unwrap()
            .contains("session ended"),
        "{r:?}"
    );
}

#[tokio::test]
async fn regression_stderr_without_newlines_stays_bounded() {
    // Guards: a plugin writing stderr without a newline grew the gateway without limit (the
    // whole "line" was buffered, then logged as one line); `\r` did not end a line.
    let gw = Gateway::fixture(&[], &[]);
    let mut c = gw.client();
    c.initialize().await;
    c.tool_text(1, "echo", json!({"text": "up"})).await;
    let before = rss_kib(gw.pid());
    // 64 MiB without a newline: the plugin's write blocks until the gateway has read all but
    // a pipe's worth, so when the call answers the gateway holds what it kept of it.
    let x = "x".repeat(1024);
    c.tool_text(2, "stderr_raw", json!({"text": x, "repeat": 64 * 1024}))
        .await;
    let grown = rss_kib(gw.pid()).saturating_sub(before);
    c.tool_text(
        3,
        "stderr_raw",
        json!({"text": "\nprogress 10%\rprogress 20%\rstderr flood over\n"}),
    )
    .await;
    gw.wait_log("stderr flood over").await;
    assert!(
        grown < 16 * 1024,
        "the gateway grew by {grown} KiB while the plugin wrote one endless line"
    );
    let log = gw.log();
    let flood: Vec<&str> = log.lines().filter(|l| l.contains("xxxxxxxx")).collect();
    assert_eq!(flood.len(), 1, "one cut line for the flood");
    assert!(
        flood[0].len() < 8 * 1024 && flood[0].contains("[cut"),
        "the flood's line is cut with a marker ({} bytes)",
        flood[0].len()
    );
    for part in ["progress 10%", "progress 20%"] {
        let line = log.lines().find(|l| l.contains(part)).unwrap();
        assert!(
            !line.contains("stderr flood over") && line.contains("plugin=stdio"),
            "`\\r` ends a line: {line}"
        );
    }
}

#[tokio::test]
async fn regression_a_plugin_that_stops_reading_gets_a_bounded_queue() {
    // Guards: the queue to a plugin's stdin had no bound: a plugin that stopped reading grew
    // the gateway by every request sent to it, and requests that timed out stayed queued.
    let dir = tempfile::tempdir().unwrap();
    let cfg = common::write_config(
        &dir,
        &format!("[plugins.stuck]\ncommand = \"{FIXTURE}\"\nrequest_timeout_secs = 5\n"),
    );
    let gw = Gateway::start(&["--config", &cfg]);
    let mut c = gw.client();
    c.initialize().await;
    assert_eq!(
        c.tool_text(1, "stop_reading", json!({})).await,
        "no longer reading input"
    );
    // 12 × 2 MiB for a plugin that reads nothing: more than the queue holds.
    let big = "x".repeat(2 * 1024 * 1024);
    let calls: Vec<_> = (0..12)
        .map(|i| {
            let (c, big) = (c.clone(), big.clone());
            tokio::spawn(async move {
                let started = std::time::Instant::now();
                let r = c
                    .call(
                        100 + i,
                        "tools/call",
                        json!({"name": "echo", "arguments": {"text": big}}),
                    )
                    .await;
                (r, started.elapsed())
            })
        })
        .collect();
    let (mut refused, mut timed_out) = (0, 0);
    for h in calls {
        let (r, took) = h.await.unwrap();
        assert_eq!(r.status, 200, "{r:?}");
        if r.error_code() == -32001 {
            timed_out += 1;
            continue;
        }
        let message = r.last()["error"]["message"].as_str().unwrap();
        assert!(
            message.contains("plugin 'stuck'") && message.contains("input"),
            "{message}"
        );
        assert!(
            took < Duration::from_secs(5),
            "refused at once, not at the timeout: {took:?}"
        );
        refused += 1;
    }
    assert!(
        refused > 0 && timed_out > 0,
        "the queue took some and refused the rest: {timed_out} queued, {refused} refused"
    );
    // The timed-out requests left the queue: a new one is taken again (and times out).
    let r = c
        .call(
            200,
            "tools/call",
            json!({"name": "echo", "arguments": {"text": big}}),
        )
        .await;
    assert_eq!(r.error_code(), -32001, "{r:?}");
}

#[tokio::test]
async fn regression_a_failed_start_tells_the_client_only_that_it_failed() {
    // Guards: a plugin's start failure sent the tail of its stderr (and its command line) to
    // the remote client in the JSON-RPC error.
    let dir = tempfile::tempdir().unwrap();
    let flag = dir.path().join("fail-from-now-on");
    let script = format!(
        "if [ -e {} ]; then echo 'the db password is hunter2' >&2; exit 3; fi; exec {FIXTURE}",
        flag.display()
    );
    let cfg = common::write_config(
        &dir,
        &format!(
            "[plugins.flaky]\ncommand = \"sh\"\nargs = [\"-c\", {}]\n",
            serde_json::to_string(&script).unwrap()
        ),
    );
    let gw = Gateway::start(&[
        "--config",
        &cfg,
        "--admin-token",
        "t-admin-token-0123456789",
    ]);
    let mut c = gw.client();
    c.initialize().await; // the probe started it fine
    std::fs::write(&flag, "").unwrap();
    let r = c
        .call(
            1,
            "tools/call",
            json!({"name": "echo", "arguments": {"text": "x"}}),
        )
        .await;
    let message = r.last()["error"]["message"].as_str().unwrap();
    assert!(
        message.contains("plugin 'flaky'") && message.contains("failed to start"),
        "{message}"
    );
    assert!(
        !message.contains("hunter2") && !message.contains("fail-from-now-on"),
        "the client saw the plugin's stderr or command line: {message}"
    );
    assert_eq!(r.error_code(), -32603);
    // The operator still sees it all: in the logs and the admin API.
    gw.wait_log("the db password is hunter2").await;
    let (_, p) = Admin::of(&gw, "t-admin-token-0123456789")
        .get("/admin/plugins/flaky")
        .await;
    assert!(p["last_error"].as_str().unwrap().contains("hunter2"), "{p}");
}

/// Kills the processes a test left behind, even when it fails.
struct KillOnDrop(Vec<u32>);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        for pid in &self.0 {
            let _ = std::process::Command::new("kill")
                .args(["-KILL", &pid.to_string()])
                .status();
        }
    }
}

#[tokio::test]
async fn regression_a_grandchild_that_calls_setsid_goes_with_its_session_and_the_gateway() {
    // Guards: only the plugin's process group was killed, so a grandchild that called
    // `setsid` outlived its session and the gateway.
    let mut gw = Gateway::fixture(&[], &[]);
    let mut left = KillOnDrop(Vec::new());
    let mut a = gw.client();
    a.initialize().await;
    let plugin: u32 = a.tool_text(1, "pid", json!({})).await.parse().unwrap();
    let grandchild: u32 = a
        .tool_text(2, "setsid_grandchild", json!({}))
        .await
        .parse()
        .unwrap();
    left.0.push(grandchild);
    // `setsid` runs as the grandchild a moment after the plugin answers.
    wait_until(
        "the grandchild left the plugin's process group",
        Duration::from_secs(10),
        || stat_fields(grandchild).is_some_and(|f| f[2] != plugin.to_string()),
    )
    .await;
    assert_eq!(a.delete().await, 200);
    // Gone, and reaped: no zombie left either.
    wait_until(
        "the setsid grandchild gone with its session",
        Duration::from_secs(15),
        || stat_fields(grandchild).is_none(),
    )
    .await;
    assert!(!alive(plugin));

    // One still running when the gateway stops goes with it.
    let mut b = gw.client();
    b.initialize().await;
    let second: u32 = b
        .tool_text(1, "setsid_grandchild", json!({}))
        .await
        .parse()
        .unwrap();
    left.0.push(second);
    assert!(alive(second));
    assert!(gw.terminate().success());
    wait_until(
        "the setsid grandchild gone with the gateway",
        Duration::from_secs(5),
        || !alive(second),
    )
    .await;
}

#[tokio::test]
async fn regression_a_missing_cwd_is_reported_as_such() {
    // Guards: a `cwd` that does not exist was reported as if the command were missing.
    let dir = tempfile::tempdir().unwrap();
    let cfg = common::write_config(
        &dir,
        &format!("[plugins.lost]\ncommand = \"{FIXTURE}\"\ncwd = \"/nonexistent/workdir\"\n"),
    );
    let gw = Gateway::start(&[
        "--config",
        &cfg,
        "--admin-token",
        "t-admin-token-0123456789",
    ]);
    gw.wait_log("/nonexistent/workdir").await;
    let (_, p) = Admin::of(&gw, "t-admin-token-0123456789")
        .get("/admin/plugins/lost")
        .await;
    let last = p["last_error"].as_str().unwrap_or_default();
    assert!(
        last.contains("working directory") && last.contains("/nonexistent/workdir"),
        "{p}"
    );
}
