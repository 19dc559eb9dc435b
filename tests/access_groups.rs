//! Access by group and subject, with the built-in authorization server's own users (groups
//! in the config file) over real HTTP against the real binary: a plugin's `allow_groups` /
//! `allow_subjects` and its `tool_access` rules hide plugins and tools from the callers they
//! leave out and refuse their calls with the challenge of a missing scope, for legacy
//! sessions and modern (2026-07-28) callers alike; the groups travel in the gateway's tokens
//! (through refresh, too); the admin API shows the rules and takes new ones.

mod common;

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use common::modern::Modern;
use common::oauth::*;
use common::{Admin, FIXTURE, Gateway, free_port, tool_names, write_config};
use serde_json::{Value, json};

/// A gateway in `builtin` mode whose users have groups: alice is in `eng`, bob in `ops`;
/// plugin `fix` is open to all but its `pid` and `count*` tools are for `ops`; `eng` is for
/// the `eng` group; `bobs` is for bob alone. The provisioned client `robot` has no groups.
fn start() -> AuthGateway {
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let base = format!("http://127.0.0.1:{port}");
    let [alice, bob, robot] = hashes();
    let config = format!(
        "[auth]\nmode = \"builtin\"\npublic_url = \"{base}/mcp\"\n\
         [[auth.users]]\nname = \"alice\"\npassword_hash = \"{alice}\"\ngroups = [\"eng\"]\n\
         [[auth.users]]\nname = \"bob\"\npassword_hash = \"{bob}\"\ngroups = [\"ops\"]\n\
         [[auth.clients]]\nclient_id = \"robot\"\nsecret_hash = \"{robot}\"\nscopes = [\"mcp\"]\n\
         [plugins.fix]\ncommand = \"{FIXTURE}\"\n\
         [[plugins.fix.tool_access]]\ntools = [\"pid\", \"count*\"]\nallow_groups = [\"ops\"]\n\
         [plugins.eng]\ncommand = \"{FIXTURE}\"\nallow_groups = [\"eng\"]\n\
         [plugins.bobs]\ncommand = \"{FIXTURE}\"\nallow_subjects = [\"bob\"]\n"
    );
    let path = write_config(&dir, &config);
    let listen = format!("127.0.0.1:{port}");
    let db = format!("sqlite://{}/auth.db?mode=rwc", dir.path().display());
    let gw = Gateway::start(&[
        "--listen",
        &listen,
        "--config",
        &path,
        "--database-url",
        &db,
        "--admin-token",
        ADMIN_TOKEN,
    ]);
    AuthGateway { gw, base, db, dir }
}

/// `user` signs in (password, consent) for a new public client: the token answer.
async fn sign_in(a: &AuthGateway, user: &str) -> Value {
    let client = public_client(a).await;
    let (verifier, challenge) = pkce();
    let code = authorize(a, &client, &challenge, user, "mcp").await;
    let (status, mut t) = exchange(a, &client, &code, &verifier).await;
    assert_eq!(status, 200, "{t}");
    t["client"] = json!(client);
    t
}

/// The claims of a JWT, unchecked.
fn claims(token: &str) -> Value {
    let payload = token.split('.').nth(1).unwrap();
    serde_json::from_slice(&URL_SAFE_NO_PAD.decode(payload).unwrap()).unwrap()
}

fn access(t: &Value) -> &str {
    t["access_token"].as_str().unwrap()
}

/// The names a legacy session of `token` lists.
async fn listed(a: &AuthGateway, token: &str) -> Vec<String> {
    let mut c = a.gw.client().with_token(token);
    c.initialize().await;
    let tools = c.result(2, "tools/list", json!({})).await;
    let mut names: Vec<String> = tool_names(&tools).into_iter().map(str::to_owned).collect();
    names.sort();
    names
}

/// A refusal's challenge, checked to be the one a missing scope gets.
fn refused_like_a_scope(status: u16, challenge: &str) {
    assert_eq!(status, 403, "{challenge}");
    assert!(
        challenge.contains("error=\"insufficient_scope\"")
            && challenge.contains("scope=\"mcp\"")
            && challenge.contains("not open to the token's subject or groups")
            && challenge.contains("resource_metadata="),
        "{challenge}"
    );
}

#[tokio::test]
async fn group_rules_hide_plugins_and_tools_from_legacy_sessions() {
    let a = start();
    let alice = sign_in(&a, "alice").await;
    let bob = sign_in(&a, "bob").await;
    assert_eq!(claims(access(&alice))["groups"], json!(["eng"]));
    assert_eq!(claims(access(&bob))["groups"], json!(["ops"]));

    let seen = listed(&a, access(&alice)).await;
    assert!(
        seen.contains(&"eng__echo".to_owned()) && seen.contains(&"fix__echo".to_owned()),
        "{seen:?}"
    );
    assert!(
        !seen
            .iter()
            .any(|n| n.starts_with("bobs__") || n == "fix__pid" || n.starts_with("fix__count")),
        "alice is not in ops and not bob: {seen:?}"
    );
    let seen_by_bob = listed(&a, access(&bob)).await;
    assert!(
        seen_by_bob.contains(&"fix__pid".to_owned())
            && seen_by_bob.contains(&"fix__counter".to_owned())
            && seen_by_bob.contains(&"bobs__echo".to_owned()),
        "{seen_by_bob:?}"
    );
    assert!(
        !seen_by_bob.iter().any(|n| n.starts_with("eng__")),
        "{seen_by_bob:?}"
    );

    // Calls: what is listed works; what is hidden is refused like a missing scope, and
    // never reaches the plugin.
    let mut c = a.gw.client().with_token(access(&alice));
    c.initialize().await;
    assert_eq!(
        c.tool_text(2, "eng__echo", json!({"text": "for eng"}))
            .await,
        "for eng"
    );
    for (id, tool) in [(3, "fix__pid"), (4, "fix__counter"), (5, "bobs__echo")] {
        let r = c
            .call(id, "tools/call", json!({"name": tool, "arguments": {}}))
            .await;
        let challenge = r.headers["www-authenticate"].to_str().unwrap().to_owned();
        refused_like_a_scope(r.status, &challenge);
        assert_eq!(r.last()["error"]["code"], -32000, "{tool}: {}", r.body);
    }
    let mut b = a.gw.client().with_token(access(&bob));
    b.initialize().await;
    let pid = b.tool_text(2, "fix__pid", json!({})).await;
    assert!(pid.parse::<u32>().is_ok(), "{pid}");
    let r = b
        .call(
            3,
            "tools/call",
            json!({"name": "eng__echo", "arguments": {"text": "x"}}),
        )
        .await;
    refused_like_a_scope(r.status, r.headers["www-authenticate"].to_str().unwrap());
    // A session's view follows the token: bob's session with alice's token is not hers to
    // use (sessions belong to their subject), and a caller's groups come from the token, not
    // from the session.
    let mut stolen = a.gw.client().with_token(access(&alice));
    stolen.session = b.session.clone();
    stolen.version = b.version.clone();
    assert_eq!(stolen.call(4, "tools/list", json!({})).await.status, 404);

    // A client without groups (client credentials) sees only what is open to all.
    let robot = robot_token(&a).await;
    assert!(claims(&robot).get("groups").is_none(), "{}", claims(&robot));
    let seen = listed(&a, &robot).await;
    assert!(seen.contains(&"fix__echo".to_owned()), "{seen:?}");
    assert!(
        !seen
            .iter()
            .any(|n| n.starts_with("eng__") || n.starts_with("bobs__") || n == "fix__pid"),
        "{seen:?}"
    );

    // Refreshed tokens carry the groups too.
    let client = alice["client"].as_str().unwrap();
    let (status, refreshed) =
        refresh_with(&a, client, alice["refresh_token"].as_str().unwrap()).await;
    assert_eq!(status, 200, "{refreshed}");
    assert_eq!(claims(access(&refreshed))["groups"], json!(["eng"]));
    assert!(
        listed(&a, access(&refreshed))
            .await
            .contains(&"eng__echo".to_owned())
    );
}

#[tokio::test]
async fn group_rules_hold_for_modern_callers() {
    let a = start();
    let alice = sign_in(&a, "alice").await;
    let bob = sign_in(&a, "bob").await;
    let modern = |t: &Value| Modern::new(a.gw.client().with_token(access(t)), json!({}));
    let names = |answer: &common::modern::Answer| -> Vec<String> {
        tool_names(answer.result())
            .into_iter()
            .map(str::to_owned)
            .collect()
    };
    let (ma, mb) = (modern(&alice), modern(&bob));
    let listed = ma.post(1, "tools/list", json!({})).await;
    // What a caller's token lets it see is its own: not to be cached for others.
    assert_eq!(
        listed.result()["cacheScope"],
        "private",
        "{}",
        listed.message
    );
    assert_eq!(listed.result()["ttlMs"], 0);
    let seen = names(&listed);
    assert!(seen.contains(&"eng__echo".to_owned()), "{seen:?}");
    assert!(
        !seen
            .iter()
            .any(|n| n == "fix__pid" || n.starts_with("bobs__")),
        "{seen:?}"
    );
    let seen = names(&mb.post(2, "tools/list", json!({})).await);
    assert!(
        seen.contains(&"fix__pid".to_owned()) && !seen.iter().any(|n| n.starts_with("eng__")),
        "{seen:?}"
    );
    // What server/discover shows is what the caller may use.
    let discover = ma.post(3, "server/discover", json!({})).await;
    assert_eq!(discover.status, 200);
    assert_eq!(
        ma.call(4, "eng__echo", json!({"text": "modern eng"}))
            .await
            .text(),
        "modern eng"
    );
    for (id, answer) in [
        (5, ma.call(5, "fix__pid", json!({})).await),
        (6, mb.call(6, "eng__echo", json!({"text": "x"})).await),
    ] {
        let (status, code, message) = answer.error();
        assert_eq!((status, code), (403, -32000), "{id}: {message}");
        assert!(message.contains("not open"), "{message}");
    }
}

#[tokio::test]
async fn the_admin_api_shows_and_takes_access_rules() {
    let a = start();
    let admin = Admin::of(&a.gw, ADMIN_TOKEN);
    let (status, eng) = admin.get("/admin/plugins/eng").await;
    assert_eq!(status, 200);
    assert_eq!(eng["allow_groups"], json!(["eng"]));
    let (_, fix) = admin.get("/admin/plugins/fix").await;
    assert_eq!(
        fix["tool_access"],
        json!([{"tools": ["pid", "count*"], "allow_groups": ["ops"]}])
    );
    assert_eq!(fix["allow_groups"], json!([]));

    // A rule that names no one is refused by name.
    let (status, e) = admin
        .post(
            "/admin/plugins",
            json!({"name": "ops", "command": FIXTURE, "tool_access": [{"tools": ["echo"]}]}),
        )
        .await;
    assert_eq!(status, 400, "{e}");
    assert!(e.to_string().contains("tool_access[0]"), "{e}");

    // A plugin added for ops: bob sees it once it is ready, alice never.
    let (status, ops) = admin
        .post(
            "/admin/plugins",
            json!({"name": "ops", "command": FIXTURE, "allow_groups": ["ops"],
                   "tool_access": [{"tools": ["echo"], "allow_subjects": ["carol"]}]}),
        )
        .await;
    assert_eq!(status, 201, "{ops}");
    assert_eq!(ops["allow_groups"], json!(["ops"]));
    admin.wait_state("ops", "ready").await;
    let alice = sign_in(&a, "alice").await;
    let bob = sign_in(&a, "bob").await;
    assert!(
        !listed(&a, access(&alice))
            .await
            .iter()
            .any(|n| n.starts_with("ops__"))
    );
    let seen = listed(&a, access(&bob)).await;
    assert!(seen.contains(&"ops__pid".to_owned()), "{seen:?}");
    assert!(
        !seen.contains(&"ops__echo".to_owned()),
        "echo is carol's alone: {seen:?}"
    );

    // Opened to everyone by an update: alice sees it now.
    let (status, _) = admin
        .put("/admin/plugins/ops", json!({"command": FIXTURE}))
        .await;
    assert_eq!(status, 200);
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(20);
    while !listed(&a, access(&alice))
        .await
        .contains(&"ops__echo".to_owned())
    {
        assert!(
            tokio::time::Instant::now() < deadline,
            "ops never opened to alice"
        );
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
}
