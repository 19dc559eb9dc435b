//! How plugin processes serve sessions: `shared` (one process or a pool for everyone, with
//! every answer and every server-to-client request finding the right session) and warm pools
//! for per-session plugins; and client capabilities gating what a plugin may ask.

mod common;

use std::time::Duration;

use common::{Admin, FIXTURE, Gateway, descendants, sched_policy, wait_until};
use serde_json::json;

use common::write_config as config;

#[tokio::test]
async fn a_shared_process_serves_fifty_sessions_each_answer_to_its_session() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = config(
        &dir,
        &format!("[plugins.a]\ncommand = \"{FIXTURE}\"\nprocess_model = \"shared\"\n"),
    );
    let gw = Gateway::start(&["--config", &cfg]);
    let mut clients = Vec::new();
    for _ in 0..50 {
        let mut c = gw.client();
        c.initialize().await;
        clients.push(c);
    }
    let calls: Vec<_> = clients
        .iter()
        .enumerate()
        .map(|(i, c)| {
            let c = c.clone();
            tokio::spawn(async move {
                let mut out = Vec::new();
                for k in 0..3 {
                    out.push(
                        c.tool_text(k, "echo", json!({"text": format!("s{i}-m{k}")}))
                            .await,
                    );
                }
                (i, out, c.tool_text(9, "pid", json!({})).await)
            })
        })
        .collect();
    let mut pids = std::collections::HashSet::new();
    for h in calls {
        let (i, out, pid) = h.await.unwrap();
        assert_eq!(
            out,
            [format!("s{i}-m0"), format!("s{i}-m1"), format!("s{i}-m2")]
        );
        pids.insert(pid);
    }
    assert_eq!(pids.len(), 1, "one process for everyone");
    assert_eq!(descendants(gw.pid()).len(), 1);
    // State is shared: that is what the operator chose.
    let a = clients[0]
        .tool_text(20, "counter", json!({}))
        .await
        .parse::<u32>()
        .unwrap();
    let b = clients[1]
        .tool_text(20, "counter", json!({}))
        .await
        .parse::<u32>()
        .unwrap();
    assert_eq!(b, a + 1);
}

#[tokio::test]
async fn a_shared_pool_spreads_sessions_over_its_processes() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = config(
        &dir,
        &format!(
            "[plugins.a]\ncommand = \"{FIXTURE}\"\nprocess_model = \"shared\"\npool_size = 2\n"
        ),
    );
    let gw = Gateway::start(&["--config", &cfg]);
    let mut pids = std::collections::HashSet::new();
    for _ in 0..6 {
        let mut c = gw.client();
        c.initialize().await;
        pids.insert(c.tool_text(1, "pid", json!({})).await);
    }
    assert_eq!(pids.len(), 2);
    assert_eq!(descendants(gw.pid()).len(), 2);
}

#[tokio::test]
async fn sampling_from_a_shared_process_reaches_the_session_whose_call_caused_it() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = config(
        &dir,
        &format!("[plugins.a]\ncommand = \"{FIXTURE}\"\nprocess_model = \"shared\"\n"),
    );
    let gw = Gateway::start(&["--config", &cfg]);
    let mut other = gw.client();
    other.initialize().await;
    other
        .tool_text(1, "echo", json!({"text": "warm the shared process"}))
        .await;
    let mut c = gw.client();
    c.initialize().await;
    let mut events = c
        .stream(&json!({"jsonrpc": "2.0", "id": 7, "method": "tools/call", "params": {"name": "test_sampling", "arguments": {"prompt": "mine"}}}))
        .await;
    let ask = events.next().await.unwrap();
    assert_eq!(ask["method"], "sampling/createMessage");
    assert_eq!(ask["params"]["messages"][0]["content"]["text"], "mine");
    let r = c
        .post(&json!({"jsonrpc": "2.0", "id": ask["id"], "result": {"role": "assistant", "content": {"type": "text", "text": "yes"}, "model": "m"}}))
        .await;
    assert_eq!(r.status, 202);
    let done = events.next().await.unwrap();
    assert_eq!(done["result"]["content"][0]["text"], "LLM response: yes");
    // The other session cannot answer a request it never saw.
    let r = other
        .post(&json!({"jsonrpc": "2.0", "id": ask["id"], "result": {}}))
        .await;
    assert_eq!(r.status, 400);
}

#[tokio::test]
async fn warm_processes_wait_ready_and_are_replaced_when_taken() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = config(
        &dir,
        &format!("[plugins.a]\ncommand = \"{FIXTURE}\"\nwarm = 2\n"),
    );
    let gw = Gateway::start(&["--config", &cfg]);
    wait_until("two warm processes", Duration::from_secs(15), || {
        descendants(gw.pid()).len() == 2
    })
    .await;
    let warm = descendants(gw.pid());
    let mut c = gw.client();
    c.initialize().await;
    let pid: u32 = c.tool_text(1, "pid", json!({})).await.parse().unwrap();
    assert!(
        warm.contains(&pid),
        "the session got a warm process: {pid} not in {warm:?}"
    );
    wait_until("the pool refilled", Duration::from_secs(15), || {
        descendants(gw.pid()).len() == 3
    })
    .await;
    // The session keeps its process; it is not shared.
    let mut d = gw.client();
    d.initialize().await;
    let other: u32 = d.tool_text(1, "pid", json!({})).await.parse().unwrap();
    assert_ne!(pid, other);
    assert_eq!(c.tool_text(2, "counter", json!({})).await, "1");
    assert_eq!(d.tool_text(2, "counter", json!({})).await, "1");
}

#[tokio::test]
async fn a_plugin_may_not_ask_what_the_client_did_not_declare() {
    let gw = Gateway::fixture(&[], &[]);
    let mut c = gw.client();
    c.initialize_at("2025-11-25", json!({})).await;
    let text = c
        .tool_text(1, "test_sampling", json!({"prompt": "x"}))
        .await;
    assert_eq!(text, "LLM response: (no answer)");
    gw.wait_log("did not declare").await;
}

fn two_plugins(dir: &tempfile::TempDir, shared_extra: &str) -> String {
    config(
        dir,
        &format!(
            "[plugins.s]\ncommand = \"{FIXTURE}\"\nprocess_model = \"shared\"\nresponse_mode = \"json\"\n{shared_extra}\n[plugins.p]\ncommand = \"{FIXTURE}\"\n"
        ),
    )
}

#[tokio::test]
async fn regression_a_shared_plugin_never_shows_one_sessions_messages_to_another() {
    // Guards: logs of a JSON-mode call on a shared process went to every session; a sampling
    // request (with its prompt) reached another session's open stream.
    let dir = tempfile::tempdir().unwrap();
    let gw = Gateway::start(&["--config", &two_plugins(&dir, "")]);
    let mut a = gw.client();
    a.initialize().await;
    let mut b = gw.client();
    b.initialize_at("2025-03-26", json!({"sampling": {}})).await;
    let mut b_get = common::Events::new(b.get_stream().await);

    a.tool_text(1, "s__test_tool_with_logging", json!({})).await;
    a.tool_text(2, "s__notify_changed", json!({})).await;
    let first = b_get.next().await.unwrap();
    assert_eq!(
        first["method"], "notifications/tools/list_changed",
        "B saw A's logs first: {first}"
    );

    // B keeps a call in flight on the shared process (on an SSE stream, through a batch).
    let mut b_stream = b
        .stream(&json!([
            {"jsonrpc": "2.0", "id": 10, "method": "tools/call", "params": {"name": "s__slow", "arguments": {"ms": 3000}}},
            {"jsonrpc": "2.0", "id": 11, "method": "tools/call", "params": {"name": "p__echo", "arguments": {"text": "x"}}},
        ]))
        .await;
    gw.wait_log("slow request").await;
    let text = a
        .tool_text(
            3,
            "s__test_sampling",
            json!({"prompt": "A's secret prompt"}),
        )
        .await;
    assert_eq!(
        text, "LLM response: (no answer)",
        "refused: two sessions' calls were in flight"
    );
    gw.wait_log("so it is refused").await;
    while let Some(m) = b_stream.next().await {
        assert_ne!(
            m["method"], "sampling/createMessage",
            "A's request reached B: {m}"
        );
    }
}

#[tokio::test]
async fn regression_stopping_or_losing_a_shared_process_is_not_held_against_it() {
    // Guards: stopping a shared pool on purpose counted as crashes (three updates opened the
    // breaker); a dead shared process kept its place under the limits.
    let dir = tempfile::tempdir().unwrap();
    let cfg = config(
        &dir,
        &format!(
            "max_children = 1\n[plugins.s]\ncommand = \"{FIXTURE}\"\nprocess_model = \"shared\"\n[plugins.p]\ncommand = \"{FIXTURE}\"\n"
        ),
    );
    let gw = Gateway::start(&[
        "--config",
        &cfg,
        "--admin-token",
        "t-admin-token-0123456789",
    ]);
    let admin = Admin::of(&gw, "t-admin-token-0123456789");
    let mut c = gw.client();
    c.initialize().await;
    for i in 0..3 {
        c.tool_text(i, "s__echo", json!({"text": "up"})).await;
        let (status, _) = admin
            .put(
                "/admin/plugins/s",
                json!({"command": FIXTURE, "process_model": "shared", "args": ["--name", format!("v{i}")]}),
            )
            .await;
        assert_eq!(status, 200);
        // Wait for the new definition to be usable.
        for k in 0..100 {
            let r = c
                .call(
                    100 + k,
                    "tools/call",
                    json!({"name": "s__echo", "arguments": {"text": "again"}}),
                )
                .await;
            if r.last().get("result").is_some() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
    let (_, p) = admin.get("/admin/plugins/s").await;
    assert_eq!(p["restarts"], 0, "{p}");
    assert_ne!(p["state"], "failed");
    // The shared process dies: its place is free for the other plugin at once.
    let _ = c.call(200, "tools/call", json!({"name": "s__crash"})).await;
    let mut ok = false;
    for k in 0..100 {
        let r = c
            .call(
                300 + k,
                "tools/call",
                json!({"name": "p__echo", "arguments": {"text": "room"}}),
            )
            .await;
        if r.last().get("result").is_some() {
            ok = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(ok, "the dead shared process still held the only place");
}

#[tokio::test]
async fn plugin_processes_run_under_sched_batch_unless_configured_normal() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = config(
        &dir,
        &format!(
            "[plugins.b]\ncommand = \"{FIXTURE}\"\n\n[plugins.s]\ncommand = \"{FIXTURE}\"\nprocess_model = \"shared\"\n\n[plugins.n]\ncommand = \"{FIXTURE}\"\nscheduling = \"normal\"\n"
        ),
    );
    let gw = Gateway::start(&["--config", &cfg]);
    assert_eq!(
        sched_policy(gw.pid()),
        0,
        "the gateway itself keeps the default"
    );
    let mut c = gw.client();
    c.initialize().await;
    let mut seen = Vec::new();
    for (i, (tool, want)) in [("b__pid", 3), ("s__pid", 3), ("n__pid", 0)]
        .into_iter()
        .enumerate()
    {
        let pid: u32 = c
            .tool_text(i as i64, tool, json!({}))
            .await
            .parse()
            .unwrap();
        assert_eq!(sched_policy(pid), want, "{tool}");
        seen.push(pid);
    }
    assert!(seen.iter().all(|p| descendants(gw.pid()).contains(p)));
}

#[tokio::test]
async fn regression_a_shared_plugins_late_notifications_reach_no_other_session() {
    // Guards: a call on a shared plugin that had returned left notifications behind (here a
    // log), and they went to whichever other session had a call in flight there.
    let dir = tempfile::tempdir().unwrap();
    let cfg = config(
        &dir,
        &format!(
            "[plugins.s]\ncommand = \"{FIXTURE}\"\nprocess_model = \"shared\"\n[plugins.p]\ncommand = \"{FIXTURE}\"\n"
        ),
    );
    let gw = Gateway::start(&["--config", &cfg]);
    let mut a = gw.client();
    a.initialize().await;
    let mut b = gw.client();
    b.initialize().await;
    // B has a call in flight on the shared process, with a progress token.
    let mut b_stream = b
        .stream(
            &json!({"jsonrpc": "2.0", "id": 10, "method": "tools/call", "params": {
            "name": "s__slow", "arguments": {"ms": 2500}, "_meta": {"progressToken": "b-1"}}}),
        )
        .await;
    gw.wait_log("slow request").await;
    // A's call returns at once; its log comes while only B's call is in flight.
    assert_eq!(
        a.tool_text(
            1,
            "s__background_log",
            json!({"text": "A's private log", "after_ms": 300})
        )
        .await,
        "logging later"
    );
    let mut got = Vec::new();
    while let Some(m) = b_stream.next().await {
        got.push(m);
    }
    assert!(
        got.iter()
            .all(|m| !m.to_string().contains("A's private log")),
        "A's log reached B: {got:?}"
    );
    // What names B's request (its progress token) still reaches B, and the answer.
    assert!(
        got.iter()
            .any(|m| m["method"] == "notifications/progress"
                && m["params"]["progressToken"] == "b-1"),
        "{got:?}"
    );
    assert_eq!(got.last().unwrap()["id"], 10, "{got:?}");
    gw.wait_metric(
        "mcp_gateway_plugin_notifications_dropped_total{plugin=\"s\"}",
        1.0,
    )
    .await;
}
