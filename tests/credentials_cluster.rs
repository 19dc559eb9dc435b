//! People's credentials across a cluster (issue 41): replicas in cluster mode sharing a
//! PostgreSQL database of the test's own and the test Redis under a prefix of the test's own.
//! A person who connects on one replica serves the call parked on another; a revocation made
//! through one replica stops the person's instances on every replica, and their next call
//! there asks again.

mod common;

use std::time::Duration;

use common::cluster::ClusterFlags;
use common::credentials::{Page, json_call, replica_with_credentials, token};
use common::oauth::{ADMIN_TOKEN, AuthGateway};
use common::{FIXTURE, Postgres, free_port};
use serde_json::json;

const KEY: u8 = 0x2e;

fn replicas(n: usize, flags: &ClusterFlags, db: &str) -> Vec<AuthGateway> {
    let public = free_port();
    let credentials = "[credentials.tok]\nkind = \"secret\"\nlabel = \"Service token\"\n";
    let plugins = format!(
        "[plugins.fix]\ncommand = \"{FIXTURE}\"\nenv = {{ TOKEN = \"${{credential:tok}}\" }}\n"
    );
    (0..n)
        .map(|i| {
            let listen = if i == 0 { public } else { free_port() };
            let flags = flags.for_port(listen);
            let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
            replica_with_credentials(KEY, public, listen, credentials, &plugins, Some(db), &flags)
        })
        .collect()
}

#[tokio::test]
async fn a_connection_on_one_replica_serves_another_and_a_revocation_reaches_every_one() {
    let flags = ClusterFlags::new();
    let db = Postgres::create("credentials_cluster");
    let r = replicas(2, &flags, &db.url);
    let http = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .unwrap();

    // Bob's call waits on replica 1 while he connects through the page of replica 0 (the
    // public URL the link names).
    let mut bob = r[1].gw.client().with_token(&token(&r[0], "bob").await);
    bob.initialize_at("2025-11-25", json!({"elicitation": {"url": {}}}))
        .await;
    let mut events = bob
        .stream(&json!({"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": json_call("TOKEN")}))
        .await;
    let asked = events.next().await.unwrap();
    assert_eq!(asked["method"], "elicitation/create", "{asked}");
    let link = asked["params"]["url"].as_str().unwrap().to_owned();
    assert!(link.starts_with(&r[0].base), "{link}");
    let accepted = bob
        .post(&json!({"jsonrpc": "2.0", "id": asked["id"], "result": {"action": "accept"}}))
        .await;
    assert_eq!(accepted.status, 202);
    let page = Page::open(&http, &link).await;
    let r0 = page
        .post(&http, "bob", "bob-pw", "bob-cluster-1")
        .send()
        .await
        .unwrap();
    assert_eq!(r0.status(), 200);
    let complete = events.next().await.unwrap();
    assert_eq!(
        complete["method"], "notifications/elicitation/complete",
        "{complete}"
    );
    let answer = events.next().await.unwrap();
    assert_eq!(
        answer["result"]["content"][0]["text"], "bob-cluster-1",
        "{answer}"
    );

    // Alice's instance runs on replica 1; her credential is revoked through replica 0.
    let (b, _db) = common::credentials::secret_broker(&db.url, &r[0].base, KEY).await;
    b.connect_secret("alice", "tok", "alice-cluster-1")
        .await
        .unwrap();
    let mut alice = r[1].gw.client().with_token(&token(&r[0], "alice").await);
    alice.initialize().await;
    let got = alice.result(2, "tools/call", json_call("TOKEN")).await;
    assert_eq!(got["content"][0]["text"], "alice-cluster-1");
    let admin = common::Admin::of(&r[0].gw, ADMIN_TOKEN);
    assert_eq!(
        admin
            .delete("/admin/credentials/tok/connections/alice")
            .await,
        200
    );
    // Replica 1 stops her instance within seconds (it looks at its instances' credentials in
    // the database every 3 s).
    let deadline = tokio::time::Instant::now() + Duration::from_secs(15);
    while !r[1]
        .gw
        .log()
        .contains("credential gone: its instances stopped")
    {
        assert!(
            tokio::time::Instant::now() < deadline,
            "replica 1 never heard"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let reply = alice.call(3, "tools/call", json_call("TOKEN")).await;
    assert_eq!(reply.last()["error"]["code"], -32042, "{reply:?}");
    // Bob's, untouched.
    let got = bob.result(5, "tools/call", json_call("TOKEN")).await;
    assert_eq!(got["content"][0]["text"], "bob-cluster-1");
}
