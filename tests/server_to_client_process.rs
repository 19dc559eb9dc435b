//! What plugins send on their own in JSON response mode, checked against the real binary
//! because each waits on its log: a plugin's request with no client stream open fails at once,
//! and a cancelled call still gets an error body. The rest of the server-to-client traffic is
//! in `server_to_client.rs`, served in-process.

mod common;

use common::Gateway;
use serde_json::json;

#[tokio::test]
async fn regression_json_mode_plugin_requests_without_a_stream_fail_fast() {
    // Guards: in JSON mode with no GET stream, a plugin's elicitation waited forever in the
    // backlog, and so did the client's call.
    let gw = Gateway::fixture(&["--response-mode", "json"], &[]);
    let mut c = gw.client();
    c.initialize().await;
    let r = c
        .call(
            1,
            "tools/call",
            json!({"name": "test_elicitation", "arguments": {"message": "anyone?"}}),
        )
        .await;
    assert_eq!(
        r.last()["result"]["content"][0]["text"],
        "User response: null",
        "{r:?}"
    );
    gw.wait_log("no client stream open").await;
}

#[tokio::test]
async fn regression_json_mode_cancelled_request_gets_an_error_body() {
    let gw = Gateway::fixture(&["--response-mode", "json"], &[]);
    let mut c = gw.client();
    c.initialize().await;
    let slow = c.spawn_slow(9, 60000);
    gw.wait_log("slow request").await;
    assert_eq!(
        c.notify("notifications/cancelled", json!({"requestId": 9}))
            .await
            .status,
        202
    );
    let r = slow.await.unwrap();
    assert_eq!(r.status, 200);
    assert_eq!(r.last()["id"], 9);
    assert!(
        r.last()["error"]["message"]
            .as_str()
            .unwrap()
            .contains("cancelled"),
        "{r:?}"
    );
}
