//! 2026-07-28 clients without a token: each address is a caller of its own (its own hidden
//! session, `per_session` instances, parked calls and listeners), and a plugin's question
//! reaches only the request that caused it, or nobody. 127.0.0.1 is a trusted proxy here, so
//! `X-Forwarded-For` names the clients.

mod common;

use std::time::Duration;

use common::InProcess;
use common::modern::{Modern, accept, all_capabilities, only};
use serde_json::json;

async fn gateway(extra: &[&str]) -> InProcess {
    let mut args = vec!["--trusted-proxies", "127.0.0.1"];
    args.extend_from_slice(extra);
    InProcess::fixture(&args, &[]).await
}

fn at(gw: &InProcess, address: &str) -> Modern {
    Modern::new(
        gw.client().with_header("x-forwarded-for", address),
        all_capabilities(),
    )
}

#[tokio::test]
async fn anonymous_clients_at_other_addresses_never_share_a_per_session_instance() {
    // Guards: every client without a token shared one `per_session` instance, so an operator
    // who chose `per_session` for isolation got none.
    let gw = gateway(&[]).await;
    let a = at(&gw, "203.0.113.1");
    let b = at(&gw, "203.0.113.2");
    assert_eq!(a.call(1, "counter", json!({})).await.text(), "1");
    assert_eq!(a.call(2, "counter", json!({})).await.text(), "2");
    assert_eq!(b.call(3, "counter", json!({})).await.text(), "1");
    let pid_a = a.call(4, "pid", json!({})).await.text();
    let pid_b = b.call(5, "pid", json!({})).await.text();
    assert_ne!(pid_a, pid_b, "two processes");
    // The same address is the same caller (an IPv6 client's /64 likewise).
    let a_again = at(&gw, "203.0.113.1");
    assert_eq!(a_again.call(6, "counter", json!({})).await.text(), "3");
    gw.stop().await;
}

#[tokio::test]
async fn one_anonymous_address_cannot_take_every_listener_or_parked_call() {
    // Guards: one client without a token took every `subscriptions/listen` place (or
    // parked call) of every other such client. Each address has its own.
    let gw = gateway(&["--max-sessions-per-client", "2"]).await;
    let greedy = at(&gw, "203.0.113.7");
    let other = at(&gw, "203.0.113.8");
    // A parked call of the greedy address leaves the other's to park and resume.
    let parked = greedy.call(1, "ask_twice", json!({})).await;
    only(parked.input_requests(), "elicitation/create");
    let first = other.call(200, "ask_twice", json!({})).await;
    let key = only(first.input_requests(), "elicitation/create");
    let second = other
        .retry(
            201,
            "ask_twice",
            json!({}),
            json!({ key: accept("x") }),
            &first.state(),
        )
        .await;
    only(second.input_requests(), "elicitation/create");

    // Listeners: two per caller here; the greedy address's third is refused, another's not.
    let listen = |m: &Modern, id: i64| {
        let m = m.client.clone();
        async move {
            let body = json!({"jsonrpc": "2.0", "id": id, "method": "subscriptions/listen",
                "params": {"notifications": {"toolsListChanged": true}, "_meta": {
                    "io.modelcontextprotocol/protocolVersion": common::modern::MODERN,
                    "io.modelcontextprotocol/clientInfo": {"name": "t", "version": "1"},
                    "io.modelcontextprotocol/clientCapabilities": {}}}});
            m.request(reqwest::Method::POST)
                .header("content-type", "application/json")
                .header("accept", "application/json, text/event-stream")
                .header("mcp-protocol-version", common::modern::MODERN)
                .header("mcp-method", "subscriptions/listen")
                .body(body.to_string())
                .send()
                .await
                .unwrap()
        }
    };
    let _l1 = listen(&greedy, 1).await;
    let _l2 = listen(&greedy, 2).await;
    assert_eq!(listen(&greedy, 3).await.status(), 429);
    let other_listener = listen(&other, 4).await;
    assert_eq!(other_listener.status(), 200);
    gw.stop().await;
}

#[tokio::test]
async fn a_question_reaches_only_the_request_that_caused_it() {
    // Guards: client A's call asked a question; client B, also without a token, got it as the
    // InputRequiredResult of B's own unrelated call, and B's answer completed A's call. Two
    // clients behind one address are one caller, so the gateway cannot tell whose a question
    // is while both have calls in flight at the instance: it refuses it to the plugin.
    let gw = gateway(&[]).await;
    let a = at(&gw, "203.0.113.30");
    let b = at(&gw, "203.0.113.30");
    // A's call is in flight first; its question comes once B's call is in flight too.
    let a_call = tokio::spawn(async move { a.call(1, "ask_when_slow", json!({})).await });
    let admin = gw.admin.clone().unwrap();
    wait_until_in_flight(&admin, 1.0).await;
    let b_answer = b.call(2, "slow", json!({"ms": 1500})).await;
    let a_answer = a_call.await.unwrap();
    assert_eq!(
        b_answer.message["result"]["resultType"], "complete",
        "B is never asked A's question: {}",
        b_answer.message
    );
    assert_eq!(b_answer.text(), "slept 1500 ms");
    assert_eq!(
        a_answer.message["result"]["resultType"], "complete",
        "{}",
        a_answer.message
    );
    assert_eq!(a_answer.text(), "later=(none)", "refused to the plugin");
    // Alone at the instance, a question goes to the request that asked it.
    let c = at(&gw, "203.0.113.30");
    let first = c
        .call(3, "test_elicitation", json!({"message": "mine"}))
        .await;
    let key = only(first.input_requests(), "elicitation/create");
    assert_eq!(first.input_requests()[&key]["params"]["message"], "mine");
    gw.stop().await;
}

/// Waits until `n` plugin requests are in flight.
async fn wait_until_in_flight(admin: &str, n: f64) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    loop {
        let text = reqwest::get(format!("http://{admin}/metrics"))
            .await
            .unwrap()
            .text()
            .await
            .unwrap();
        let in_flight = text
            .lines()
            .filter(|l| l.starts_with("mcp_gateway_plugin_requests_in_flight{"))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .sum::<f64>();
        if in_flight >= n {
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "no request in flight"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}
