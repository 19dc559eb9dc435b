//! Multi round-trip requests through the bridge (issue 22): the legacy fixture plugin asks its
//! client for input the legacy way (`elicitation/create`, `sampling/createMessage` while a
//! tool runs); a modern (2026-07-28) client gets an `InputRequiredResult` instead, retries
//! with `inputResponses` and `requestState`, and the call goes on where it stopped, for as
//! many rounds as the plugin asks. A state that fails a check is refused; a capability the
//! request did not declare is never asked for; a call nobody resumes is cancelled. Raw HTTP
//! against an in-process gateway. The official Python SDK doing the same: tests/python_sdk.rs.

mod common;

use std::time::Duration;

use common::InProcess;
use common::modern::{Answer, Modern, accept, all_capabilities, only, sampled};
use serde_json::{Value, json};

#[tokio::test]
async fn an_elicitation_and_a_sampling_are_answered_through_input_required_results() {
    let gw = InProcess::fixture(&[], &[]).await;
    let m = Modern::new(gw.client(), all_capabilities());

    let args = json!({"message": "who are you?"});
    let first = m.call(1, "test_elicitation", args.clone()).await;
    assert_eq!(first.status, 200);
    let requests = first.input_requests();
    let key = only(requests, "elicitation/create");
    assert_eq!(requests[&key]["params"]["message"], "who are you?");
    let answer =
        json!({"action": "accept", "content": {"username": "octocat", "email": "o@example.com"}});
    let done = m
        .retry(
            2,
            "test_elicitation",
            args,
            json!({ key: answer }),
            &first.state(),
        )
        .await;
    assert_eq!(done.status, 200);
    assert_eq!(done.message["id"], 2, "the retry's own id");
    let text = done.text();
    assert!(
        text.starts_with("User response: ") && text.contains("octocat"),
        "{text}"
    );

    let args = json!({"prompt": "what is 2+2"});
    let first = m.call(3, "test_sampling", args.clone()).await;
    let requests = first.input_requests();
    let key = only(requests, "sampling/createMessage");
    assert_eq!(
        requests[&key]["params"]["messages"][0]["content"]["text"],
        "what is 2+2"
    );
    let done = m
        .retry(
            4,
            "test_sampling",
            args,
            json!({ key: sampled("4") }),
            &first.state(),
        )
        .await;
    assert_eq!(done.text(), "LLM response: 4");

    // roots/list too, and a call that asks nothing is answered at once.
    let first = m.call(5, "roots", json!({})).await;
    let key = only(first.input_requests(), "roots/list");
    let roots = json!({"roots": [{"uri": "file:///work", "name": "work"}]});
    let done = m
        .retry(6, "roots", json!({}), json!({ key: roots }), &first.state())
        .await;
    assert!(done.text().contains("file:///work"), "{}", done.message);
    assert_eq!(
        m.call(7, "echo", json!({"text": "plain"})).await.text(),
        "plain"
    );
    gw.stop().await;
}

#[tokio::test]
async fn rounds_follow_each_other_and_requests_that_come_together_go_together() {
    let gw = InProcess::fixture(&[], &[]).await;
    let m = Modern::new(gw.client(), all_capabilities());

    // Two rounds: each retry gets the next question, under a new state.
    let first = m.call(1, "ask_twice", json!({})).await;
    let key = only(first.input_requests(), "elicitation/create");
    assert_eq!(first.input_requests()[&key]["params"]["message"], "first?");
    let second = m
        .retry(
            2,
            "ask_twice",
            json!({}),
            json!({ key.clone(): accept("a") }),
            &first.state(),
        )
        .await;
    let key2 = only(second.input_requests(), "elicitation/create");
    assert_eq!(
        second.input_requests()[&key2]["params"]["message"],
        "second?"
    );
    assert_ne!(key, key2);
    assert_ne!(first.state(), second.state());
    let done = m
        .retry(
            3,
            "ask_twice",
            json!({}),
            json!({ key2: accept("b") }),
            &second.state(),
        )
        .await;
    assert_eq!(done.text(), "first=a second=b");

    // An elicitation and a sampling sent at once come in one result.
    let first = m.call(4, "ask_both", json!({})).await;
    let requests = first.input_requests();
    assert_eq!(requests.len(), 2, "{requests:?}");
    let key_of = |method: &str| {
        requests
            .iter()
            .find(|(_, r)| r["method"] == method)
            .map(|(k, _)| k.clone())
            .unwrap_or_else(|| panic!("no {method} in {requests:?}"))
    };
    let (elicit, sample) = (
        key_of("elicitation/create"),
        key_of("sampling/createMessage"),
    );
    // Answering one of them, plus a key nobody asked for, gets the other asked again.
    let again = m
        .retry(
            5,
            "ask_both",
            json!({}),
            json!({ elicit.clone(): accept("x"), "nobody-asked": accept("?") }),
            &first.state(),
        )
        .await;
    assert_eq!(
        only(again.input_requests(), "sampling/createMessage"),
        sample
    );
    let done = m
        .retry(
            6,
            "ask_both",
            json!({}),
            json!({ sample: sampled("y") }),
            &again.state(),
        )
        .await;
    assert_eq!(done.text(), "elicited=x sampled=y");
    gw.stop().await;
}

#[tokio::test]
async fn a_capability_the_request_did_not_declare_is_never_asked_for() {
    let gw = InProcess::fixture(&[], &[]).await;
    let missing = |a: &Answer, caps: serde_json::Value| {
        let (status, code, message) = a.error();
        assert_eq!(code, -32021, "{}", a.message);
        assert_eq!(status, 400, "-32021 is a 400 on HTTP");
        assert!(message.contains("capability"), "{message}");
        assert_eq!(a.message["error"]["data"]["requiredCapabilities"], caps);
    };
    // No capability at all: the tool needs one, so the client is told which (-32021) and the
    // call is cancelled toward the plugin.
    let none = Modern::new(gw.client(), json!({}));
    let a = none
        .call(1, "test_elicitation", json!({"message": "m"}))
        .await;
    missing(&a, json!({"elicitation": {}}));

    // Sampling only: of the two requests that come together, only the sampling is asked; the
    // elicitation is refused to the plugin, as a legacy session refuses it.
    let sampling = Modern::new(gw.client(), json!({"sampling": {}}));
    let first = sampling.call(2, "ask_both", json!({})).await;
    let key = only(first.input_requests(), "sampling/createMessage");
    let done = sampling
        .retry(
            3,
            "ask_both",
            json!({}),
            json!({ key: sampled("s") }),
            &first.state(),
        )
        .await;
    assert_eq!(done.text(), "elicited=(none) sampled=s");

    // A retry declaring less than the first request: the next round needs what it lacks.
    let both = Modern::new(gw.client(), all_capabilities());
    let first = both.call(4, "ask_twice", json!({})).await;
    let key = only(first.input_requests(), "elicitation/create");
    let a = sampling
        .retry(
            5,
            "ask_twice",
            json!({}),
            json!({ key: accept("a") }),
            &first.state(),
        )
        .await;
    missing(&a, json!({"elicitation": {}}));
    gw.stop().await;
}

#[tokio::test]
async fn requests_are_keyed_by_the_plugins_ids_and_answers_given_before_are_taken() {
    let gw = InProcess::fixture(&[], &[]).await;
    let m = Modern::new(gw.client(), all_capabilities());
    let tool = "test_input_required_result_elicitation";
    let first = m.call(1, tool, json!({})).await;
    assert_eq!(
        only(first.input_requests(), "elicitation/create"),
        "user_name"
    );
    let name = |n: &str| json!({"action": "accept", "content": {"name": n}});
    let done = m
        .retry(
            2,
            tool,
            json!({}),
            json!({"user_name": name("Alice")}),
            &first.state(),
        )
        .await;
    assert_eq!(done.text(), "Hello, Alice!");

    // A first request that brings the answer (and keys nobody asks for) completes at once.
    let seeded = m
        .post(
            3,
            "tools/call",
            json!({"name": tool, "arguments": {}, "inputResponses": {"user_name": name("Bob"), "extra": {"x": 1}}}),
        )
        .await;
    assert_eq!(seeded.text(), "Hello, Bob!");
    // One whose answers do not fit (another key, not an object, none) is asked as usual.
    for (id, responses) in [
        (4, json!({"wrong_key": name("x")})),
        (5, json!({"user_name": 12345})),
        (6, Value::Null),
    ] {
        let a = m
            .post(
                id,
                "tools/call",
                json!({"name": tool, "arguments": {}, "inputResponses": responses}),
            )
            .await;
        assert_eq!(only(a.input_requests(), "elicitation/create"), "user_name");
    }
    gw.stop().await;
}

#[tokio::test]
async fn a_state_that_fails_a_check_is_refused() {
    let gw = InProcess::fixture(&[], &[]).await;
    let m = Modern::new(gw.client(), all_capabilities());
    let refused = |a: &Answer, why: &str| {
        let (status, code, message) = a.error();
        assert_eq!((status, code), (400, -32602), "{why}: {}", a.message);
        assert!(message.contains("requestState"), "{why}: {message}");
    };

    let first = m.call(1, "ask_twice", json!({})).await;
    let key = only(first.input_requests(), "elicitation/create");
    let state = first.state();
    let answers = json!({ key.clone(): accept("a") });

    // Tampered: one character changed.
    let mut tampered = state.clone().into_bytes();
    let at = tampered.len() / 2;
    tampered[at] = if tampered[at] == b'A' { b'B' } else { b'A' };
    let tampered = String::from_utf8(tampered).unwrap();
    let a = m
        .retry(2, "ask_twice", json!({}), answers.clone(), &tampered)
        .await;
    refused(&a, "tampered");
    // Another request: the state is bound to the method and params.
    let a = m
        .retry(3, "ask_twice", json!({"extra": 1}), answers.clone(), &state)
        .await;
    refused(&a, "other params");
    let a = m
        .post(
            4,
            "prompts/get",
            json!({"name": "test_simple_prompt", "inputResponses": answers, "requestState": state}),
        )
        .await;
    refused(&a, "other method");
    // Malformed inputResponses with a state.
    let a = m
        .retry(
            5,
            "ask_twice",
            json!({}),
            json!({ key.clone(): 12345 }),
            &state,
        )
        .await;
    refused_params(&a);

    // None of that spent the state: the call is still parked, and resumes once.
    let second = m
        .retry(6, "ask_twice", json!({}), answers.clone(), &state)
        .await;
    only(second.input_requests(), "elicitation/create");
    let replayed = m.retry(7, "ask_twice", json!({}), answers, &state).await;
    refused(&replayed, "replayed");

    // A state from nowhere.
    let a = m
        .retry(8, "ask_twice", json!({}), json!({}), "bm90IGEgc3RhdGU")
        .await;
    refused(&a, "forged");
    gw.stop().await;
}

fn refused_params(a: &Answer) {
    let (status, code, message) = a.error();
    assert_eq!((status, code), (400, -32602), "{}", a.message);
    assert!(message.contains("inputResponses"), "{message}");
}

#[tokio::test]
async fn a_parked_call_nobody_resumes_is_cancelled_and_its_state_expires() {
    let gw = InProcess::fixture(&["--session-input-timeout-secs", "1"], &[]).await;
    let m = Modern::new(gw.client(), all_capabilities());
    let cancelled = || async { m.call(100, "cancelled_asks", json!({})).await.text() };
    assert_eq!(cancelled().await, "0");

    let first = m.call(1, "ask_until_cancelled", json!({})).await;
    let key = only(first.input_requests(), "elicitation/create");
    // The plugin hears the cancellation once the call has waited past the timeout.
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while cancelled().await != "1" {
        assert!(
            std::time::Instant::now() < deadline,
            "the parked call was never cancelled"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let late = m
        .retry(
            2,
            "ask_until_cancelled",
            json!({}),
            json!({ key: accept("late") }),
            &first.state(),
        )
        .await;
    let (status, code, message) = late.error();
    assert_eq!((status, code), (400, -32602), "{}", late.message);
    assert!(message.contains("expired"), "{message}");
    gw.stop().await;
}

/// A gateway with authorization on (built-in mode) and tokens for two subjects, forged with
/// its own key.
async fn with_two_callers() -> (InProcess, tempfile::TempDir, String, String) {
    let dir = tempfile::tempdir().unwrap();
    let base = "http://127.0.0.1:9";
    let config = common::write_config(
        &dir,
        &format!(
            "[auth]\nmode = \"builtin\"\npublic_url = \"{base}/mcp\"\n\
             [plugins.fix]\ncommand = \"{}\"\n",
            common::FIXTURE
        ),
    );
    let db = format!("sqlite://{}/gw.db?mode=rwc", dir.path().display());
    let gw = InProcess::start(&["--config", &config, "--database-url", &db]).await;
    let now = mcp_gateway::auth::now_secs();
    let token = |sub: &str| json!({"iss": base, "sub": sub, "aud": format!("{base}/mcp"), "scope": "mcp", "client_id": "c", "exp": now + 300, "iat": now, "nbf": now, "jti": sub});
    let alice = common::oauth::forge(&db, token("alice")).await;
    let bob = common::oauth::forge(&db, token("bob")).await;
    (gw, dir, alice, bob)
}

/// A `resources/read` and a `prompts/get` whose plugin asks the client are bridged as a
/// `tools/call` is: an `InputRequiredResult` (no caching hints), then the retry's result,
/// which has them.
#[tokio::test]
async fn a_resource_read_and_a_prompt_that_ask_the_client_are_bridged() {
    let gw = InProcess::fixture(&[], &[]).await;
    let m = Modern::new(gw.client(), all_capabilities());
    let uri = json!({"uri": "test://asks-the-client"});
    let first = m.post(1, "resources/read", uri.clone()).await;
    let key = only(first.input_requests(), "elicitation/create");
    assert_eq!(key, "resource_part");
    let mut retry = uri.clone();
    retry["inputResponses"] =
        json!({ key: {"action": "accept", "content": {"part": "the middle"}} });
    retry["requestState"] = json!(first.state());
    let done = m.post(2, "resources/read", retry).await;
    let r = done.result();
    assert_eq!(r["contents"][0]["text"], "the part: the middle", "{r}");
    assert_eq!(r["resultType"], "complete");

    let prompt = json!({"name": "test_input_required_result_prompt"});
    let first = m.post(3, "prompts/get", prompt.clone()).await;
    let key = only(first.input_requests(), "elicitation/create");
    let mut retry = prompt;
    retry["inputResponses"] = json!({ key: {"action": "accept", "content": {"context": "tea"}} });
    retry["requestState"] = json!(first.state());
    let done = m.post(4, "prompts/get", retry).await;
    let text = done.result()["messages"][0]["content"]["text"].clone();
    assert_eq!(text, "Answer with this context in mind: tea");
    gw.stop().await;
}

/// A `per_session` plugin runs one instance per caller (the token's subject): each keeps
/// its own state between its requests, and another caller's requests do not reach it.
#[tokio::test]
async fn each_caller_has_a_plugin_instance_of_its_own() {
    let (gw, _dir, alice, bob) = with_two_callers().await;
    let alice = Modern::new(gw.client().with_token(&alice), json!({}));
    let bob = Modern::new(gw.client().with_token(&bob), json!({}));
    assert_eq!(alice.call(1, "counter", json!({})).await.text(), "1");
    assert_eq!(alice.call(2, "counter", json!({})).await.text(), "2");
    assert_eq!(bob.call(3, "counter", json!({})).await.text(), "1");
    assert_eq!(alice.call(4, "counter", json!({})).await.text(), "3");
    let alices = alice.call(5, "pid", json!({})).await.text();
    let bobs = bob.call(6, "pid", json!({})).await.text();
    assert_ne!(alices, bobs, "two processes");
    assert_eq!(alice.call(7, "pid", json!({})).await.text(), alices);
    gw.stop().await;
}

#[tokio::test]
async fn another_callers_state_is_refused() {
    let (gw, _dir, alice, bob) = with_two_callers().await;
    let alice = Modern::new(gw.client().with_token(&alice), all_capabilities());
    let bob = Modern::new(gw.client().with_token(&bob), all_capabilities());

    let first = alice.call(1, "ask_twice", json!({})).await;
    let key = only(first.input_requests(), "elicitation/create");
    let answers = json!({ key: accept("a") });
    let stolen = bob
        .retry(2, "ask_twice", json!({}), answers.clone(), &first.state())
        .await;
    let (status, code, _) = stolen.error();
    assert_eq!((status, code), (400, -32602), "{}", stolen.message);
    // Alice's own retry still resumes her call.
    let second = alice
        .retry(3, "ask_twice", json!({}), answers, &first.state())
        .await;
    only(second.input_requests(), "elicitation/create");
    gw.stop().await;
}

#[tokio::test]
async fn a_client_that_leaves_a_bridged_call_cancels_it() {
    let gw = InProcess::fixture(&[], &[]).await;
    let m = Modern::new(gw.client(), all_capabilities());
    let cancelled = || async { m.call(100, "cancelled_asks", json!({})).await.text() };
    assert_eq!(cancelled().await, "0");
    // The client gives up on the call: its connection closes mid-stream.
    let impatient = common::Client {
        http: reqwest::Client::builder()
            .timeout(Duration::from_millis(300))
            .build()
            .unwrap(),
        ..gw.client()
    };
    let impatient = Modern::new(impatient, all_capabilities());
    let left = tokio::time::timeout(
        Duration::from_secs(5),
        impatient.try_post(
            1,
            "tools/call",
            json!({"name": "hold_until_cancelled", "arguments": {}}),
        ),
    )
    .await
    .expect("the client's own timeout ends it");
    assert!(left.is_err(), "no answer within 300 ms");
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while cancelled().await != "1" {
        assert!(
            std::time::Instant::now() < deadline,
            "the call the client left was never cancelled"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    gw.stop().await;
}
