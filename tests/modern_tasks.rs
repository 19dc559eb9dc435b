//! The tasks extension (`io.modelcontextprotocol/tasks`) for modern (2026-07-28) clients,
//! mapped onto a plugin's 2025-11-25 tasks: the gateway decides which calls run as tasks and
//! answers with the flat `CreateTaskResult`; `tasks/get` inlines the result or the error and
//! shows what the task asks its client as `inputRequests`, which `tasks/update` answers;
//! `tasks/cancel` acknowledges; requests without the extension are refused with -32021 or run
//! plainly; a task id is its caller's alone. The real binary over HTTP, in front of the
//! fixture plugin's task receiver (`--task-receiver`).

mod common;

use std::time::{Duration, Instant};

use common::modern::{Answer, Modern};
use common::{FIXTURE, Gateway};
use serde_json::{Value, json};

const TASKS: &str = "io.modelcontextprotocol/tasks";
const RELATED: &str = "io.modelcontextprotocol/related-task";

/// The gateway in front of the fixture's task receiver.
fn gateway() -> Gateway {
    Gateway::fixture(&[], &["--task-receiver"])
}

/// A client that declares the tasks extension (and elicitation).
fn with_tasks(gw: &Gateway) -> Modern {
    Modern::new(
        gw.client(),
        json!({"elicitation": {}, "extensions": {TASKS: {}}}),
    )
}

/// A client that declares nothing.
fn without_tasks(gw: &Gateway) -> Modern {
    Modern::new(gw.client(), json!({}))
}

/// Calls `tool` and returns the id of the task it created, checking the `CreateTaskResult`'s
/// shape on the way.
async fn create(m: &Modern, id: i64, tool: &str, arguments: Value) -> String {
    let r = m.call(id, tool, arguments).await;
    assert_eq!(r.status, 200, "{}", r.message);
    let created = r.result();
    assert_eq!(created["resultType"], "task", "{created}");
    for absent in [
        "task",
        "ttl",
        "pollInterval",
        "result",
        "error",
        "inputRequests",
        "requestState",
        "content",
    ] {
        assert!(created.get(absent).is_none(), "no `{absent}`: {created}");
    }
    assert!(created["status"].is_string(), "{created}");
    assert!(created["createdAt"].is_string() && created["lastUpdatedAt"].is_string());
    assert!(
        created["ttlMs"].as_u64().is_some_and(|t| t > 0),
        "{created}"
    );
    assert!(created["pollIntervalMs"].as_u64().is_some_and(|t| t > 0));
    created["taskId"].as_str().unwrap().to_owned()
}

/// `tasks/get` of `task`, asserted to be a result.
async fn get(m: &Modern, id: i64, task: &str) -> Value {
    let r = m.post(id, "tasks/get", json!({"taskId": task})).await;
    let got = r.result().clone();
    assert_eq!(got["resultType"], "complete", "{got}");
    assert_eq!(got["taskId"], task, "{got}");
    assert!(got.get("ttl").is_none() && got.get("requestState").is_none());
    got
}

/// Polls `tasks/get` until `done` holds of the task (10 s at most).
async fn until(m: &Modern, task: &str, done: impl Fn(&Value) -> bool) -> Value {
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut id = 1000;
    loop {
        id += 1;
        let got = get(m, id, task).await;
        if done(&got) {
            return got;
        }
        assert!(Instant::now() < deadline, "the task never got there: {got}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

fn terminal(task: &Value) -> bool {
    matches!(
        task["status"].as_str(),
        Some("completed" | "failed" | "cancelled")
    )
}

fn ack(r: &Answer) {
    assert_eq!(r.status, 200, "{}", r.message);
    assert_eq!(r.result(), &json!({"resultType": "complete"}));
}

#[tokio::test]
async fn a_task_runs_from_its_creation_to_its_inlined_result() {
    let gw = gateway();
    let m = with_tasks(&gw);
    let discovered = m.post(1, "server/discover", json!({})).await;
    let caps = &discovered.result()["capabilities"];
    assert_eq!(caps["extensions"][TASKS], json!({}), "{caps}");
    assert!(caps.get("tasks").is_none(), "no 2025-11-25 slot: {caps}");

    // Decided by the gateway: no hint needed, and a tool without task support is never one.
    let task = create(
        &m,
        2,
        "slow_compute",
        json!({"seconds": 0.3, "label": "first"}),
    )
    .await;
    let now = get(&m, 3, &task).await;
    assert!(
        matches!(now["status"].as_str(), Some("working" | "completed")),
        "{now}"
    );
    let done = until(&m, &task, terminal).await;
    assert_eq!(done["status"], "completed", "{done}");
    assert_eq!(
        done["result"]["content"][0]["text"],
        "Computed first in 0.3 s"
    );
    assert!(done["result"]["_meta"].get(RELATED).is_none(), "{done}");
    assert!(done.get("error").is_none() && done.get("inputRequests").is_none());

    let greeted = m
        .post(
            4,
            "tools/call",
            json!({"name": "greet", "arguments": {"name": "hint"}, "task": {"ttl": 60000}}),
        )
        .await;
    assert_eq!(greeted.text(), "Hello, hint!");
    assert!(greeted.result().get("taskId").is_none());

    // A tool error is a result (completed); a JSON-RPC error fails the task.
    let tool_error = create(&m, 5, "failing_job", json!({})).await;
    let protocol_error = create(&m, 6, "protocol_error_job", json!({})).await;
    let done = until(&m, &tool_error, terminal).await;
    assert_eq!(done["status"], "completed", "{done}");
    assert_eq!(done["result"]["isError"], true, "{done}");
    let done = until(&m, &protocol_error, terminal).await;
    assert_eq!(done["status"], "failed", "{done}");
    assert_eq!(done["error"]["code"], -32603, "{done}");
    assert!(done["error"]["message"].is_string());
    assert!(done.get("result").is_none(), "{done}");
}

#[tokio::test]
async fn without_the_extension_tools_run_plainly_and_task_methods_are_refused() {
    let gw = gateway();
    let plain = without_tasks(&gw);
    let r = plain
        .call(1, "slow_compute", json!({"seconds": 0, "label": "now"}))
        .await;
    assert_eq!(r.text(), "Computed now in 0 s");
    assert!(r.result().get("taskId").is_none());

    // A tool that must run as a task, and the task methods, need the extension.
    let required = plain.call(2, "failing_job", json!({})).await;
    let missing = json!({"requiredCapabilities": {"extensions": {TASKS: {}}}});
    let (status, code, _) = required.error();
    assert_eq!((status, code), (400, -32021), "{}", required.message);
    assert_eq!(required.message["error"]["data"], missing);
    for (id, method, params) in [
        (3, "tasks/get", json!({"taskId": "t"})),
        (
            4,
            "tasks/update",
            json!({"taskId": "t", "inputResponses": {}}),
        ),
        (5, "tasks/cancel", json!({"taskId": "t"})),
    ] {
        let r = plain.post(id, method, params).await;
        let (status, code, _) = r.error();
        assert_eq!((status, code), (400, -32021), "{method}: {}", r.message);
        assert_eq!(r.message["error"]["data"], missing);
    }

    // The extension's client: 2025-11-25's methods are gone, and an id must be one it has.
    let m = with_tasks(&gw);
    for (id, method) in [(6, "tasks/result"), (7, "tasks/list")] {
        let r = m.post(id, method, json!({"taskId": "t"})).await;
        assert_eq!(r.error().1, -32601, "{method}: {}", r.message);
    }
    for (id, method) in [(8, "tasks/get"), (9, "tasks/cancel")] {
        let r = m.post(id, method, json!({"taskId": "no-such-task"})).await;
        assert_eq!(r.error().1, -32602, "{method}: {}", r.message);
    }
}

#[tokio::test]
async fn a_task_asks_its_client_through_tasks_get_and_tasks_update() {
    let gw = gateway();
    let m = with_tasks(&gw);
    let task = create(&m, 1, "multi_input", json!({})).await;
    let asking = until(&m, &task, |t| {
        t["inputRequests"].as_object().is_some_and(|r| r.len() == 2)
    })
    .await;
    assert_eq!(asking["status"], "input_required", "{asking}");
    let requests = asking["inputRequests"].as_object().unwrap();
    let mut keys: Vec<String> = requests.keys().cloned().collect();
    for r in requests.values() {
        assert_eq!(r["method"], "elicitation/create", "{r}");
        assert!(r["params"]["message"].is_string(), "{r}");
        assert!(r["params"].get("_meta").is_none(), "no related-task: {r}");
    }
    // Which key asks what: the one whose schema has `name`.
    keys.sort_by_key(|k| {
        requests[k]["params"]["requestedSchema"]["properties"]
            .get("name")
            .is_none()
    });
    let (name, confirm) = (keys[0].clone(), keys[1].clone());

    // Answered one at a time: the other still waits; an unknown key is ignored.
    let r = m
        .post(
            2,
            "tasks/update",
            json!({"taskId": task, "inputResponses": {
                name.as_str(): {"action": "accept", "content": {"name": "Ada"}},
                "no-such-key": {"action": "accept", "content": {}},
            }}),
        )
        .await;
    ack(&r);
    let waiting = get(&m, 3, &task).await;
    assert_eq!(waiting["status"], "input_required", "{waiting}");
    let left: Vec<&String> = waiting["inputRequests"]
        .as_object()
        .unwrap()
        .keys()
        .collect();
    assert_eq!(left, [&confirm], "{waiting}");
    // An answer to a key of the past changes nothing.
    ack(&m
        .post(
            4,
            "tasks/update",
            json!({"taskId": task, "inputResponses": {
                name.as_str(): {"action": "accept", "content": {"name": "Eve"}},
            }}),
        )
        .await);
    ack(&m
        .post(
            5,
            "tasks/update",
            json!({"taskId": task, "inputResponses": {
                confirm.as_str(): {"action": "accept", "content": {"confirm": true}},
            }}),
        )
        .await);
    let done = until(&m, &task, terminal).await;
    assert_eq!(done["status"], "completed", "{done}");
    assert_eq!(
        done["result"]["content"][0]["text"],
        "name: \"Ada\", confirm: true"
    );

    // Not an object of objects: invalid params.
    let bad = m
        .post(
            6,
            "tasks/update",
            json!({"taskId": task, "inputResponses": {"k": 1}}),
        )
        .await;
    assert_eq!(bad.error().1, -32602, "{}", bad.message);
}

#[tokio::test]
async fn a_task_asks_only_what_the_request_that_created_it_declared() {
    let gw = gateway();
    // The extension, but not elicitation: the task's question is refused to the plugin.
    let m = Modern::new(gw.client(), json!({"extensions": {TASKS: {}}}));
    let task = create(&m, 1, "confirm_delete", json!({"filename": "a.txt"})).await;
    let done = until(&m, &task, terminal).await;
    assert_eq!(done["status"], "failed", "{done}");
    assert!(done.get("inputRequests").is_none(), "{done}");
}

#[tokio::test]
async fn cancel_is_acknowledged_also_once_the_task_has_ended() {
    let gw = gateway();
    let m = with_tasks(&gw);
    let task = create(&m, 1, "slow_compute", json!({"seconds": 60})).await;
    ack(&m.post(2, "tasks/cancel", json!({"taskId": task})).await);
    let done = until(&m, &task, terminal).await;
    assert_eq!(done["status"], "cancelled", "{done}");
    assert!(done.get("result").is_none() && done.get("error").is_none());
    ack(&m.post(3, "tasks/cancel", json!({"taskId": task})).await);

    // A task waiting on its client: cancelled, it asks nothing any more.
    let asking = create(&m, 4, "confirm_delete", json!({"filename": "b.txt"})).await;
    until(&m, &asking, |t| t["status"] == "input_required").await;
    ack(&m.post(5, "tasks/cancel", json!({"taskId": asking})).await);
    let done = until(&m, &asking, terminal).await;
    assert_eq!(done["status"], "cancelled", "{done}");
    assert!(done.get("inputRequests").is_none(), "{done}");
}

#[tokio::test]
async fn input_gathered_before_the_task_reaches_its_result() {
    let gw = gateway();
    let m = with_tasks(&gw);
    // The tool asks (an InputRequiredResult) before it accepts the task.
    let first = m.call(1, "test_tool_with_task", json!({})).await;
    let key = common::modern::only(first.input_requests(), "elicitation/create");
    let second = m
        .retry(
            2,
            "test_tool_with_task",
            json!({}),
            json!({ key: {"action": "accept", "content": {"name": "Alice"}} }),
            &first.state(),
        )
        .await;
    let created = second.result();
    assert_eq!(created["resultType"], "task", "{created}");
    assert!(created.get("requestState").is_none(), "{created}");
    let task = created["taskId"].as_str().unwrap();
    let done = until(&m, task, terminal).await;
    assert_eq!(
        done["result"]["content"][0]["text"], "Hello, Alice!",
        "{done}"
    );
}

/// A gateway with authorization on (built-in mode) in front of the task receiver, and tokens
/// for two subjects, forged with its own key.
async fn with_two_callers() -> (Gateway, tempfile::TempDir, String, String) {
    let dir = tempfile::tempdir().unwrap();
    let base = "http://127.0.0.1:9";
    let config = common::write_config(
        &dir,
        &format!(
            "[auth]\nmode = \"builtin\"\npublic_url = \"{base}/mcp\"\n\
             [plugins.fix]\ncommand = \"{FIXTURE}\"\nargs = [\"--task-receiver\"]\n"
        ),
    );
    let db = format!("sqlite://{}/gw.db?mode=rwc", dir.path().display());
    let gw = Gateway::start(&["--config", &config, "--database-url", &db]);
    let now = mcp_gateway::auth::now_secs();
    let token = |sub: &str| json!({"iss": base, "sub": sub, "aud": format!("{base}/mcp"), "scope": "mcp", "client_id": "c", "exp": now + 300, "iat": now, "nbf": now, "jti": sub});
    let alice = common::oauth::forge(&db, token("alice")).await;
    let bob = common::oauth::forge(&db, token("bob")).await;
    (gw, dir, alice, bob)
}

#[tokio::test]
async fn a_task_is_its_callers_alone() {
    let (gw, _dir, alice, bob) = with_two_callers().await;
    let caps = json!({"elicitation": {}, "extensions": {TASKS: {}}});
    let alice = Modern::new(gw.client().with_token(&alice), caps.clone());
    let bob = Modern::new(gw.client().with_token(&bob), caps);
    let task = create(&alice, 1, "confirm_delete", json!({"filename": "c.txt"})).await;
    let asking = until(&alice, &task, |t| t["status"] == "input_required").await;
    let key = asking["inputRequests"]
        .as_object()
        .unwrap()
        .keys()
        .next()
        .unwrap()
        .clone();

    // Bob is told Alice's task does not exist, whatever he asks of it.
    for (id, method, params) in [
        (2, "tasks/get", json!({"taskId": task})),
        (
            3,
            "tasks/update",
            json!({"taskId": task, "inputResponses": {
                key.as_str(): {"action": "accept", "content": {"confirm": true}},
            }}),
        ),
        (4, "tasks/cancel", json!({"taskId": task})),
    ] {
        let r = bob.post(id, method, params).await;
        let (status, code, message) = r.error();
        assert_eq!(code, -32602, "{method} ({status}): {}", r.message);
        assert!(message.contains("not found"), "{message}");
    }
    // Nothing of it reached Alice's task: it still waits, and she answers it.
    let still = get(&alice, 5, &task).await;
    assert_eq!(still["status"], "input_required", "{still}");
    ack(&alice
        .post(
            6,
            "tasks/update",
            json!({"taskId": task, "inputResponses": {
                key.as_str(): {"action": "accept", "content": {"confirm": false}},
            }}),
        )
        .await);
    let done = until(&alice, &task, terminal).await;
    assert_eq!(done["result"]["content"][0]["text"], "Kept c.txt", "{done}");
}

#[tokio::test]
async fn the_task_id_header_must_match_the_body() {
    let gw = gateway();
    let m = with_tasks(&gw);
    let task = create(&m, 1, "slow_compute", json!({"seconds": 60})).await;
    let body = json!({"jsonrpc": "2.0", "id": 2, "method": "tasks/get", "params": {
        "taskId": task,
        "_meta": {
            "io.modelcontextprotocol/protocolVersion": common::modern::MODERN,
            "io.modelcontextprotocol/clientCapabilities": {"extensions": {TASKS: {}}},
        },
    }});
    let post = |name: Option<&str>| {
        let mut r = gw
            .client()
            .request(reqwest::Method::POST)
            .header("content-type", "application/json")
            .header("accept", "application/json, text/event-stream")
            .header("mcp-protocol-version", common::modern::MODERN)
            .header("mcp-method", "tasks/get");
        if let Some(name) = name {
            r = r.header("mcp-name", name);
        }
        r.body(body.to_string()).send()
    };
    for name in [Some("another-task"), None] {
        let r = post(name).await.unwrap();
        assert_eq!(r.status(), 400, "{name:?}");
        let v: Value = r.json().await.unwrap();
        assert_eq!(v["error"]["code"], -32020, "{v}");
    }
    let r = post(Some(&task)).await.unwrap();
    assert_eq!(r.status(), 200);
    ack(&m.post(3, "tasks/cancel", json!({"taskId": task})).await);
}

/// Opens a `subscriptions/listen` stream for `task_ids` (declaring `capabilities`): the
/// response, unread.
async fn listen_for(gw: &Gateway, capabilities: Value, task_ids: Value) -> reqwest::Response {
    let body = json!({"jsonrpc": "2.0", "id": "tasks-listener", "method": "subscriptions/listen",
    "params": {"notifications": {"taskIds": task_ids}, "_meta": {
        "io.modelcontextprotocol/protocolVersion": common::modern::MODERN,
        "io.modelcontextprotocol/clientCapabilities": capabilities,
    }}});
    gw.client()
        .request(reqwest::Method::POST)
        .header("content-type", "application/json")
        .header("accept", "application/json, text/event-stream")
        .header("mcp-protocol-version", common::modern::MODERN)
        .header("mcp-method", "subscriptions/listen")
        .body(body.to_string())
        .send()
        .await
        .unwrap()
}

#[tokio::test]
async fn a_listener_hears_how_the_tasks_it_asked_for_go() {
    let gw = gateway();
    let m = with_tasks(&gw);
    let task = create(&m, 1, "confirm_delete", json!({"filename": "d.txt"})).await;

    let refused = listen_for(&gw, json!({}), json!([task])).await;
    assert_eq!(refused.status(), 400);
    let v: Value = refused.json().await.unwrap();
    assert_eq!(v["error"]["code"], -32021, "{v}");

    let r = listen_for(
        &gw,
        json!({"extensions": {TASKS: {}}}),
        json!([task, "no-such-task"]),
    )
    .await;
    assert_eq!(r.status(), 200);
    let mut events = common::Events::new(r);
    let acked = events.next().await.unwrap();
    assert_eq!(acked["method"], "notifications/subscriptions/acknowledged");
    assert_eq!(
        acked["params"]["notifications"]["taskIds"],
        json!([task]),
        "{acked}"
    );

    let asking = loop {
        let n = next_status(&mut events, &task).await;
        if n["status"] == "input_required" {
            break n;
        }
        assert_eq!(n["status"], "working", "{n}");
    };
    let key = asking["inputRequests"]
        .as_object()
        .unwrap()
        .keys()
        .next()
        .unwrap()
        .clone();
    ack(&m
        .post(
            2,
            "tasks/update",
            json!({"taskId": task, "inputResponses": {
                key.as_str(): {"action": "accept", "content": {"confirm": true}},
            }}),
        )
        .await);
    let done = loop {
        let n = next_status(&mut events, &task).await;
        if n["status"] == "completed" {
            break n;
        }
    };
    assert_eq!(
        done["result"]["content"][0]["text"], "Deleted d.txt",
        "{done}"
    );
}

/// The next `notifications/tasks` of the listener, about `task`: the task as `tasks/get`
/// shows it, tagged with the subscription.
async fn next_status(events: &mut common::Events, task: &str) -> Value {
    let n = events.next().await.expect("a notification");
    assert_eq!(n["method"], "notifications/tasks", "{n}");
    assert_eq!(n["params"]["taskId"], task, "{n}");
    assert_eq!(
        n["params"]["_meta"]["io.modelcontextprotocol/subscriptionId"],
        "tasks-listener"
    );
    assert!(n["params"].get("resultType").is_none(), "{n}");
    assert!(n["params"]["ttlMs"].is_u64(), "{n}");
    n["params"].clone()
}
