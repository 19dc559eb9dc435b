//! Tasks (2025-11-25) through the gateway: the plugins' `tasks` capability merged, `tasks/*`
//! sent to the plugin instance that runs the task, under task ids of the gateway's own that
//! only the creating session can use; status notifications and related-task `_meta` carried
//! with those ids; tools that must run as tasks offered only to clients that can; the
//! per-session bound. Served in the test's process, in front of the fixture's `--tasks`.

mod common;

use common::{Client, Events, FIXTURE, InProcess, tool_names};
use mcp_gateway::session::tasks::MAX_TASKS;
use serde_json::{Value, json};

const RELATED: &str = "io.modelcontextprotocol/related-task";

/// Two task-capable fixtures that number their tasks alike: `alpha` and `beta` (prefix `b`),
/// with `process_model` for both.
async fn two_task_plugins(process_model: &str) -> (InProcess, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let config = common::write_config(
        &dir,
        &format!(
            "[plugins.alpha]\ncommand = \"{FIXTURE}\"\nargs = [\"--tasks\", \"--name\", \"alpha-server\"]\nprocess_model = \"{process_model}\"\n\
             [plugins.beta]\ncommand = \"{FIXTURE}\"\nargs = [\"--tasks\", \"--name\", \"beta-server\"]\nprefix = \"b\"\nprocess_model = \"{process_model}\"\n"
        ),
    );
    (InProcess::start(&["--config", &config]).await, dir)
}

/// A client at 2025-11-25 that declares tasks (and elicitation).
async fn task_client(gw: &InProcess) -> Client {
    let mut c = gw.client();
    c.initialize_at("2025-11-25", json!({"tasks": {}, "elicitation": {}}))
        .await;
    c
}

/// Calls `tool` as a task and returns the task id the client is given.
async fn start_task(c: &Client, id: i64, tool: &str, arguments: Value) -> String {
    let r = c
        .result(
            id,
            "tools/call",
            json!({"name": tool, "arguments": arguments, "task": {"ttl": 60000}}),
        )
        .await;
    assert_eq!(r["task"]["status"], "working", "{r}");
    r["task"]["taskId"].as_str().unwrap().to_owned()
}

#[tokio::test]
async fn tasks_go_to_the_plugin_that_runs_them_under_the_gateways_ids() {
    let (gw, _dir) = two_task_plugins("per_session").await;
    let c = task_client(&gw).await;
    let a = start_task(&c, 1, "alpha__task_job", json!({"text": "one"})).await;
    let b = start_task(&c, 2, "b__task_job", json!({"text": "two"})).await;
    // Both fixtures call their first task `task-1`: the client sees neither.
    assert!(a != "task-1" && b != "task-1" && a != b, "{a} {b}");

    let r = c.result(3, "tasks/result", json!({"taskId": a})).await;
    assert_eq!(r["content"][0]["text"], "alpha-server: one");
    assert_eq!(r["_meta"][RELATED]["taskId"], a.as_str());
    let r = c.result(4, "tasks/result", json!({"taskId": b})).await;
    assert_eq!(r["content"][0]["text"], "beta-server: two");
    let got = c.result(5, "tasks/get", json!({"taskId": b})).await;
    assert_eq!(got["taskId"], b.as_str());
    assert_eq!(got["status"], "completed");

    let long = start_task(&c, 6, "alpha__task_only", json!({"ms": 60000})).await;
    let listed = c.result(7, "tasks/list", json!({})).await;
    let ids: Vec<&str> = listed["tasks"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["taskId"].as_str().unwrap())
        .collect();
    assert_eq!(ids, [a.as_str(), b.as_str(), long.as_str()], "{listed}");

    let cancelled = c.result(8, "tasks/cancel", json!({"taskId": long})).await;
    assert_eq!(cancelled["status"], "cancelled");
    assert_eq!(cancelled["taskId"], long.as_str());
    let again = c.call(9, "tasks/cancel", json!({"taskId": long})).await;
    assert_eq!(
        again.error_code(),
        -32602,
        "the plugin refuses a terminal task"
    );

    for (n, method) in ["tasks/get", "tasks/result", "tasks/cancel"]
        .iter()
        .enumerate()
    {
        let r = c
            .call(10 + n as i64, method, json!({"taskId": "task-1"}))
            .await;
        assert_eq!(r.error_code(), -32602, "a plugin's own id is no id here");
    }
    let r = c
        .call(20, "tasks/list", json!({"cursor": "anything"}))
        .await;
    assert_eq!(
        r.error_code(),
        -32602,
        "the gateway never hands out a cursor"
    );
    gw.stop().await;
}

#[tokio::test]
async fn the_capability_is_merged_and_absent_without_task_plugins() {
    let (gw, _dir) = two_task_plugins("per_session").await;
    let mut c = gw.client();
    let init = c.initialize().await;
    assert_eq!(
        init["capabilities"]["tasks"],
        json!({"list": {}, "cancel": {}, "requests": {"tools": {"call": {}}}})
    );
    gw.stop().await;

    let plain = InProcess::fixture(&[], &[]).await;
    let mut c = plain.client();
    let init = c.initialize().await;
    assert!(init["capabilities"].get("tasks").is_none(), "{init}");
    let r = c.call(1, "tasks/get", json!({"taskId": "x"})).await;
    assert_eq!(r.error_code(), -32601, "no plugin has tasks");
    plain.stop().await;
}

#[tokio::test]
async fn another_session_cannot_reach_a_task_on_a_shared_plugin() {
    let (gw, _dir) = two_task_plugins("shared").await;
    let mine = task_client(&gw).await;
    let theirs = task_client(&gw).await;
    let task = start_task(&mine, 1, "alpha__task_job", json!({"ms": 60000})).await;

    for (n, method) in ["tasks/get", "tasks/result", "tasks/cancel"]
        .iter()
        .enumerate()
    {
        let r = theirs
            .call(2 + n as i64, method, json!({"taskId": task}))
            .await;
        assert_eq!(r.error_code(), -32602, "{method}: {r:?}");
    }
    let listed = theirs.result(5, "tasks/list", json!({})).await;
    assert_eq!(
        listed["tasks"],
        json!([]),
        "the shared plugin lists it; the gateway does not"
    );
    let own = start_task(&theirs, 6, "alpha__task_job", json!({"text": "theirs"})).await;
    let listed = theirs.result(7, "tasks/list", json!({})).await;
    assert_eq!(listed["tasks"].as_array().unwrap().len(), 1);
    assert_eq!(listed["tasks"][0]["taskId"], own.as_str());

    let still = mine.result(8, "tasks/get", json!({"taskId": task})).await;
    assert_eq!(
        still["status"], "working",
        "not cancelled by the other session"
    );
    let listed = mine.result(9, "tasks/list", json!({})).await;
    assert_eq!(listed["tasks"].as_array().unwrap().len(), 1);
    assert_eq!(listed["tasks"][0]["taskId"], task.as_str());
    gw.stop().await;
}

#[tokio::test]
async fn status_notifications_reach_only_the_tasks_client() {
    let (gw, _dir) = two_task_plugins("shared").await;
    let mine = task_client(&gw).await;
    let theirs = task_client(&gw).await;
    let mut my_get = Events::new(mine.get_stream().await);
    let mut their_get = Events::new(theirs.get_stream().await);
    let task = start_task(&mine, 1, "alpha__task_job", json!({"ms": 100})).await;
    let status = my_get.next().await.expect("a status notification");
    assert_eq!(status["method"], "notifications/tasks/status");
    assert_eq!(status["params"]["taskId"], task.as_str());
    assert_eq!(status["params"]["status"], "completed");

    // Had the first task's status gone to the other session too, it would come first there.
    let own = start_task(&theirs, 2, "alpha__task_job", json!({"ms": 100})).await;
    let status = their_get.next().await.expect("a status notification");
    assert_eq!(status["params"]["taskId"], own.as_str(), "{status}");
    gw.stop().await;
}

#[tokio::test]
async fn a_tasks_request_to_the_client_and_its_answer_carry_the_tasks_ids() {
    let (gw, _dir) = two_task_plugins("per_session").await;
    let c = task_client(&gw).await;
    let mut get = Events::new(c.get_stream().await);
    let task = start_task(
        &c,
        1,
        "b__task_job",
        json!({"ms": 50, "ask": true, "text": "hi"}),
    )
    .await;
    let request = loop {
        let m = get.next().await.expect("the elicitation");
        if m["method"] == "notifications/tasks/status" {
            assert_eq!(m["params"]["taskId"], task.as_str());
            continue;
        }
        break m;
    };
    assert_eq!(request["method"], "elicitation/create");
    assert_eq!(request["params"]["_meta"][RELATED]["taskId"], task.as_str());
    let r = c
        .post(&json!({"jsonrpc": "2.0", "id": request["id"], "result": {
            "action": "accept", "content": {"name": "ann"}, "_meta": {RELATED: {"taskId": task}}}}))
        .await;
    assert_eq!(r.status, 202);
    let done = c.result(2, "tasks/result", json!({"taskId": task})).await;
    assert_eq!(
        done["content"][0]["text"], "beta-server: hi (answer \"ann\", related to this task)",
        "the plugin got its own task id back"
    );
    gw.stop().await;
}

#[tokio::test]
async fn a_tool_that_must_run_as_a_task_is_offered_only_to_clients_that_can() {
    let gw = InProcess::fixture(&[], &["--tasks"]).await;
    let mut plain = gw.client();
    plain.initialize().await;
    let tools = plain.result(1, "tools/list", json!({})).await;
    let names = tool_names(&tools);
    assert!(
        names.contains(&"task_job") && !names.contains(&"task_only"),
        "{names:?}"
    );
    let mut old = gw.client();
    old.initialize_at("2025-06-18", json!({"tasks": {}})).await;
    let tools = old.result(1, "tools/list", json!({})).await;
    assert!(
        !tool_names(&tools).contains(&"task_only"),
        "tasks came in 2025-11-25"
    );
    let able = task_client(&gw).await;
    let tools = able.result(1, "tools/list", json!({})).await;
    let only = tools["tools"]
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["name"] == "task_only")
        .expect("listed to a client with tasks");
    assert_eq!(only["execution"]["taskSupport"], "required");
    gw.stop().await;

    // Merged from several plugins, the same.
    let (gw, _dir) = two_task_plugins("per_session").await;
    let mut plain = gw.client();
    plain.initialize().await;
    let tools = plain.result(1, "tools/list", json!({})).await;
    let names = tool_names(&tools);
    assert!(names.contains(&"alpha__task_job"), "{names:?}");
    assert!(!names.iter().any(|n| n.ends_with("task_only")), "{names:?}");
    let able = task_client(&gw).await;
    let tools = able.result(1, "tools/list", json!({})).await;
    let names = tool_names(&tools);
    assert!(
        names.contains(&"alpha__task_only") && names.contains(&"b__task_only"),
        "{names:?}"
    );
    gw.stop().await;
}

#[tokio::test]
async fn a_session_holds_a_bounded_number_of_tasks() {
    let gw = InProcess::fixture(&[], &["--tasks"]).await;
    let c = task_client(&gw).await;
    for i in 0..MAX_TASKS as i64 {
        start_task(&c, i, "task_job", json!({"ms": 60000})).await;
    }
    let r = c
        .call(
            1000,
            "tools/call",
            json!({"name": "task_job", "arguments": {}, "task": {}}),
        )
        .await;
    assert_eq!(r.error_code(), -32600, "{r:?}");
    assert!(
        r.last()["error"]["message"]
            .as_str()
            .unwrap()
            .contains("Too many tasks")
    );
    let listed = c.result(1001, "tasks/list", json!({})).await;
    assert_eq!(listed["tasks"].as_array().unwrap().len(), MAX_TASKS);
    gw.stop().await;
}
