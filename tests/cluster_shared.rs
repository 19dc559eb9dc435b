//! What the replicas of a cluster share beyond sessions (issue 21, "Shared state"): an access
//! token revoked on one replica, alone or with its refresh token's grant, is refused by every
//! replica within a second; the registration limit is counted across replicas; a plugin
//! added or removed through one replica's admin API reaches the sessions of another, with
//! `notifications/tools/list_changed`; a signing key rotated on one replica validates on the
//! others at once. And while Redis is away: revocations still hold on
//! every replica within about a second (through the database), and registrations are still
//! limited, per replica.
//!
//! The replicas share the test Redis under a key prefix of the test's own and a PostgreSQL
//! database of the test's own (signing keys, revocations and the admin API's plugins live
//! there); each test calls the replicas directly.

mod common;

use std::time::{Duration, Instant};

use common::admin::{ADMIN_TOKEN as PLUGINS_ADMIN_TOKEN, fixture_plugin};
use common::cluster::ClusterFlags;
use common::oauth::{
    AuthGateway, REDIRECT, authorize, exchange, http, http_from, mcp_status, pkce, public_client,
    revoke_as_robot, robot_token, rotate,
};
use common::{Admin, Client, Cluster, Events, FIXTURE, Postgres, free_port, tool_names};
use serde_json::{Value, json};

/// The longest a revocation made on one replica may take to hold on another, as the README
/// promises (the subscription delivers it in milliseconds).
const REVOCATION_DELAY: Duration = Duration::from_secs(1);

/// `n` replicas of one gateway in `builtin` auth mode (one public URL: replica 0's address),
/// on `db`, each with the cluster flags `flags` gives for its port, and `extra_auth` in their
/// `[auth]` section.
fn auth_replicas(
    n: usize,
    flags: impl Fn(u16) -> Vec<String>,
    db: &str,
    extra_auth: &str,
) -> Vec<AuthGateway> {
    let public = free_port();
    (0..n)
        .map(|i| {
            let listen = if i == 0 { public } else { free_port() };
            let flags = flags(listen);
            let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
            AuthGateway::with_flags(public, listen, extra_auth, Some(db), &flags)
        })
        .collect()
}

/// What `replica` makes of `token` alone: a DELETE at `/mcp` without a session, which the
/// token's check answers (401) before anything else (400, no session named) and before any
/// call to Redis. The status and the challenge.
async fn token_status(replica: &AuthGateway, token: &str) -> (u16, String) {
    let r = http()
        .delete(&replica.gw.url)
        .bearer_auth(token)
        .send()
        .await
        .unwrap();
    let challenge = r
        .headers()
        .get("www-authenticate")
        .map(|v| v.to_str().unwrap().to_owned())
        .unwrap_or_default();
    (r.status().as_u16(), challenge)
}

/// Waits until `replica` refuses `token` (401), at most `within` after `since`.
async fn refused_by(replica: &AuthGateway, token: &str, since: Instant, within: Duration) {
    loop {
        let (status, challenge) = token_status(replica, token).await;
        if status == 401 {
            assert!(challenge.contains("invalid_token"), "{challenge}");
            return;
        }
        assert_eq!(status, 400, "the token is taken, no session named");
        assert!(
            since.elapsed() < within,
            "{} still takes the token {:?} after the revocation (status {status})",
            replica.gw.url,
            since.elapsed()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test]
async fn a_revocation_on_one_replica_is_enforced_by_every_replica_within_a_second() {
    let flags = ClusterFlags::new();
    let db = Postgres::create("shared_revoke");
    let r = auth_replicas(3, |port| flags.for_port(port), &db.url, "");

    // An access token revoked by itself.
    let token = robot_token(&r[0]).await;
    for replica in &r {
        assert_eq!(mcp_status(replica, Some(&token)).await.0, 200);
    }
    let kept = robot_token(&r[0]).await;
    revoke_as_robot(&r[0], &token).await;
    let revoked_at = Instant::now();
    assert_eq!(mcp_status(&r[0], Some(&token)).await.0, 401, "at once here");
    for replica in &r[1..] {
        refused_by(replica, &token, revoked_at, REVOCATION_DELAY).await;
    }
    for replica in &r {
        assert_eq!(
            mcp_status(replica, Some(&kept)).await.0,
            200,
            "only the revoked token is refused"
        );
    }

    // A refresh token revoked: its grant goes, the access token issued with it included.
    let client = public_client(&r[0]).await;
    let (verifier, challenge) = pkce();
    let code = authorize(&r[0], &client, &challenge, "alice", "mcp").await;
    let (status, tokens) = exchange(&r[0], &client, &code, &verifier).await;
    assert_eq!(status, 200, "{tokens}");
    let access = tokens["access_token"].as_str().unwrap();
    let refresh = tokens["refresh_token"].as_str().unwrap();
    for replica in &r {
        assert_eq!(mcp_status(replica, Some(access)).await.0, 200);
    }
    let revoke = http()
        .post(r[0].url("/revoke"))
        .form(&[("client_id", client.as_str()), ("token", refresh)])
        .send()
        .await
        .unwrap();
    assert_eq!(revoke.status(), 200);
    let revoked_at = Instant::now();
    for replica in &r {
        refused_by(replica, access, revoked_at, REVOCATION_DELAY).await;
    }
}

/// Waits until `replica` takes `token` (a DELETE without a session: 400, not 401), at most
/// `within` after `since`.
async fn taken_by(replica: &AuthGateway, token: &str, since: Instant, within: Duration) {
    loop {
        let (status, challenge) = token_status(replica, token).await;
        if status == 400 {
            return;
        }
        assert_eq!(status, 401, "{challenge}");
        assert!(
            since.elapsed() < within,
            "{} still refuses a token of the new key {:?} after the rotation: {challenge}",
            replica.gw.url,
            since.elapsed()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test]
async fn a_key_rotated_on_one_replica_validates_on_every_replica_at_once() {
    let flags = ClusterFlags::new();
    let db = Postgres::create("shared_rotate");
    let r = auth_replicas(3, |port| flags.for_port(port), &db.url, "");
    let old = robot_token(&r[0]).await;
    rotate(&r[0]).await;
    let rotated_at = Instant::now();
    let new = robot_token(&r[0]).await;
    assert_ne!(
        jsonwebtoken::decode_header(&new).unwrap().kid,
        jsonwebtoken::decode_header(&old).unwrap().kid,
        "signed with the new key"
    );
    for replica in &r {
        taken_by(replica, &new, rotated_at, REVOCATION_DELAY).await;
        assert_eq!(token_status(replica, &old).await.0, 400, "the old key too");
    }
}

/// Registers a public client at `replica`'s own address, from the loopback address `from`:
/// the status and, on 429, the `Retry-After`.
async fn register_at(replica: &AuthGateway, from: &str) -> (u16, Option<u64>) {
    let url = replica.gw.url.replace("/mcp", "/register");
    let r = http_from(from)
        .post(url)
        .json(&json!({"client_name": "Test App", "redirect_uris": [REDIRECT], "token_endpoint_auth_method": "none"}))
        .send()
        .await
        .unwrap();
    let retry = r
        .headers()
        .get("retry-after")
        .map(|v| v.to_str().unwrap().parse().unwrap());
    (r.status().as_u16(), retry)
}

#[tokio::test]
async fn the_registration_limit_is_counted_across_replicas() {
    let flags = ClusterFlags::new();
    let db = Postgres::create("shared_register");
    let r = auth_replicas(
        3,
        |port| flags.for_port(port),
        &db.url,
        "registrations_per_minute = 2",
    );
    // Two from one address, on two replicas: the third replica has none left to give.
    assert_eq!(register_at(&r[0], "127.0.0.1").await.0, 201);
    assert_eq!(register_at(&r[1], "127.0.0.1").await.0, 201);
    for replica in &r {
        let (status, retry) = register_at(replica, "127.0.0.1").await;
        assert_eq!(status, 429, "{}", replica.gw.url);
        let retry = retry.expect("Retry-After");
        assert!((1..=60).contains(&retry), "{retry}");
    }
    // Another address has its own count.
    assert_eq!(register_at(&r[2], "127.0.0.2").await.0, 201);
    // The counters are in the test's Redis, and expire.
    let keys = common::cluster::redis_scan(flags.key_prefix());
    assert!(
        keys.iter()
            .any(|k| k.ends_with("throttle:register:127.0.0.1")),
        "{keys:?}"
    );
}

#[tokio::test]
async fn a_plugin_added_on_one_replica_reaches_a_session_on_another() {
    let db = Postgres::create("shared_registry");
    let cluster = Cluster::start(
        3,
        &[
            "--database-url",
            &db.url,
            "--admin-token",
            PLUGINS_ADMIN_TOKEN,
            "--plugin-name",
            "main",
            "--",
            FIXTURE,
        ],
    );
    // A session on replica 2, with its GET stream open there.
    let mut c = Client::new(&cluster.url(2));
    c.initialize().await;
    let mut get = Events::new(c.get_stream().await);
    assert_eq!(
        c.tool_text(1, "echo", json!({"text": "alone"})).await,
        "alone"
    );

    // Added through replica 0's admin API.
    let admin = Admin::of(cluster.replica(0), PLUGINS_ADMIN_TOKEN);
    let (status, added) = admin.post("/admin/plugins", fixture_plugin("extra")).await;
    assert_eq!(status, 201, "{added}");
    let changed = get.next().await.expect("a notification on replica 2");
    assert_eq!(changed["method"], "notifications/tools/list_changed");
    let tools = wait_tools(&c, 10, |names| names.contains(&"extra__echo")).await;
    assert!(tool_names(&tools).contains(&"main__echo"), "{tools}");
    assert_eq!(
        c.tool_text(99, "extra__echo", json!({"text": "new"})).await,
        "new"
    );
    // Every replica's admin API knows it.
    let (status, _) = Admin::of(cluster.replica(1), PLUGINS_ADMIN_TOKEN)
        .get("/admin/plugins/extra")
        .await;
    assert_eq!(status, 200);

    // Removed through replica 1's: gone from replica 2's session too.
    let status = Admin::of(cluster.replica(1), PLUGINS_ADMIN_TOKEN)
        .delete("/admin/plugins/extra")
        .await;
    assert_eq!(status, 204);
    let changed = next_list_changed(&mut get).await;
    assert_eq!(changed["method"], "notifications/tools/list_changed");
    // Until the list is one plugin's again (unprefixed): while the removed plugin stops, a
    // list may lack its tools before the view is the new one.
    let tools = wait_tools(&c, 200, |names| {
        !names.contains(&"extra__echo") && names.contains(&"echo")
    })
    .await;
    assert!(
        tool_names(&tools).contains(&"echo"),
        "one plugin again: {tools}"
    );
}

/// The next `notifications/tools/list_changed` on `get` (the others may come first).
async fn next_list_changed(get: &mut Events) -> Value {
    loop {
        let m = get.next().await.expect("a notification");
        if m["method"] == "notifications/tools/list_changed" {
            return m;
        }
    }
}

/// `tools/list` on `c` until `want` holds of the names (a probe may still be running).
async fn wait_tools(c: &Client, first_id: i64, want: impl Fn(&[&str]) -> bool) -> Value {
    let deadline = Instant::now() + Duration::from_secs(20);
    for id in first_id.. {
        let tools = c.result(id, "tools/list", json!({})).await;
        if want(&tool_names(&tools)) {
            return tools;
        }
        assert!(Instant::now() < deadline, "never the tools wanted: {tools}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    unreachable!()
}

#[tokio::test]
async fn with_redis_gone_revocations_still_hold_everywhere_and_registrations_are_still_limited() {
    let mut redis = common::redis_server::RedisServer::start();
    let db = Postgres::create("shared_no_redis");
    let flags = |port: u16| {
        [
            "--redis-url",
            &redis.url(),
            "--redis-key-prefix",
            "shared:",
            "--cluster-secret",
            "0123456789abcdef0123",
            "--advertise-url",
            &format!("http://127.0.0.1:{port}"),
        ]
        .map(str::to_owned)
        .to_vec()
    };
    let r = auth_replicas(2, flags, &db.url, "registrations_per_minute = 2");
    let token = robot_token(&r[0]).await;
    assert_eq!(token_status(&r[1], &token).await.0, 400, "taken");

    redis.kill();
    // The replicas' subscriptions are lost: each now re-reads the database every second.
    revoke_as_robot(&r[0], &token).await;
    let revoked_at = Instant::now();
    refused_by(&r[1], &token, revoked_at, REVOCATION_DELAY * 3).await;

    // Registrations count on each replica alone: limited still, never unlimited.
    assert_eq!(register_at(&r[1], "127.0.0.3").await.0, 201);
    assert_eq!(register_at(&r[1], "127.0.0.3").await.0, 201);
    assert_eq!(register_at(&r[1], "127.0.0.3").await.0, 429);
}
