//! People's credentials (issue 41): kept sealed in the real databases (a SQLite file and
//! PostgreSQL), opened only for the person and the credential they were connected for, with
//! the storage key rotated; a database dump reveals no value.

mod common;

use common::credentials::{Page, broker_of, form, gateway_with, hidden, json_call, token};
use common::oauth::ADMIN_TOKEN;

use std::sync::Arc;

use mcp_gateway::config::{CredentialKeys, CredentialSpec, CredentialsConfig, credential_config};
use mcp_gateway::credentials::{Broker, CredentialError, CredentialStore, Stored};
use mcp_gateway::database::Database;

const BASE: &str = "https://gateway.example";
const TOKEN: &str = "ghp_k33pTh1sS3cretAbCdEfGhIjKlMnOpQrSt";

fn config(current: u8, previous: &[u8]) -> CredentialsConfig {
    let spec = |text: &str| toml::from_str::<CredentialSpec>(text).unwrap();
    let env = |_: &str| None;
    CredentialsConfig {
        keys: CredentialKeys {
            current: Some([current; 32]),
            previous: previous.iter().map(|p| [*p; 32]).collect(),
        },
        credentials: vec![
            credential_config(
                "github",
                spec("kind = \"secret\"\nlabel = \"GitHub token\"\npattern = \"ghp_[A-Za-z0-9]{20,}\""),
                env,
            )
            .unwrap(),
            credential_config("jira", spec("kind = \"secret\""), env).unwrap(),
        ],
        secret_files: Vec::new(),
        remote_networks: Vec::new(),
    }
}

async fn exercise(store: Arc<dyn CredentialStore>) {
    let broker = Broker::new(config(1, &[]), store.clone(), BASE);
    assert!(broker.value("alice", "github").await.unwrap().is_none());
    // A value not of the credential's form is refused, and nothing is kept.
    assert!(matches!(
        broker
            .connect_secret("alice", "github", "not-a-token")
            .await,
        Err(CredentialError::Pattern(_))
    ));
    assert!(matches!(
        broker.connect_secret("alice", "github", "ghp_a\nb").await,
        Err(CredentialError::Malformed)
    ));
    assert!(store.get("alice", "github").await.unwrap().is_none());
    assert!(matches!(
        broker.connect_secret("alice", "nope", TOKEN).await,
        Err(CredentialError::Undefined(_))
    ));

    let c = broker
        .connect_secret("alice", "github", TOKEN)
        .await
        .unwrap();
    assert_eq!(
        (c.credential.as_str(), c.label.as_str()),
        ("github", "GitHub token")
    );
    broker
        .connect_secret("bob", "jira", "bobs-jira")
        .await
        .unwrap();
    assert_eq!(
        broker
            .value("alice", "github")
            .await
            .unwrap()
            .unwrap()
            .value,
        TOKEN
    );
    // Each person has only their own.
    assert!(broker.value("bob", "github").await.unwrap().is_none());
    assert!(broker.value("alice", "jira").await.unwrap().is_none());

    // A row moved to another person does not open for them.
    let mut stolen = store.get("alice", "github").await.unwrap().unwrap();
    assert!(!stolen.sealed.contains(TOKEN));
    stolen.subject = "mallory".into();
    store.put(&stolen).await.unwrap();
    assert!(matches!(
        broker.value("mallory", "github").await,
        Err(CredentialError::Sealed { .. })
    ));

    // What may be shown: names, subjects, times; never a value.
    let shown = serde_json::to_string(&broker.connections("alice").await.unwrap()).unwrap();
    assert!(
        shown.contains("\"github\"") && !shown.contains(TOKEN),
        "{shown}"
    );
    let who = broker.connected("github").await.unwrap();
    let subjects: Vec<&str> = who.iter().map(|c| c.subject.as_str()).collect();
    assert_eq!(subjects, ["alice", "mallory"]);

    // The key rotated: the old one still opens, and the value is sealed again under the new.
    let old = store.get("alice", "github").await.unwrap().unwrap().sealed;
    let rotated = Broker::new(config(2, &[1]), store.clone(), BASE);
    assert_eq!(
        rotated
            .value("alice", "github")
            .await
            .unwrap()
            .unwrap()
            .value,
        TOKEN
    );
    let new = store.get("alice", "github").await.unwrap().unwrap().sealed;
    assert_ne!(old, new);
    // Now the old key is not needed for it; bob's, never used since, still needs it.
    let only_new = Broker::new(config(2, &[]), store.clone(), BASE);
    assert_eq!(
        only_new
            .value("alice", "github")
            .await
            .unwrap()
            .unwrap()
            .value,
        TOKEN
    );
    assert!(matches!(
        only_new.value("bob", "jira").await,
        Err(CredentialError::Sealed { .. })
    ));

    // A refresh claims, replaces and forgets only the value it read: one changed meanwhile
    // (a new connection, a disconnection, another replica's refresh) stands.
    let now = mcp_gateway::audit::now_ms();
    let read = store.get("alice", "github").await.unwrap().unwrap();
    broker
        .connect_secret("alice", "github", "ghp_r3placedMeanwhile000000000")
        .await
        .unwrap();
    let current = store.get("alice", "github").await.unwrap().unwrap();
    assert!(
        !store
            .claim_refresh("alice", "github", &read.sealed, now, now + 90_000)
            .await
            .unwrap()
    );
    let stale = Stored {
        sealed: "stale".into(),
        ..read.clone()
    };
    assert!(!store.swap(&stale, &read.sealed).await.unwrap());
    assert!(
        !store
            .delete_if("alice", "github", &read.sealed)
            .await
            .unwrap()
    );
    assert_eq!(
        store.get("alice", "github").await.unwrap().unwrap(),
        current
    );
    // Of two claims on the current value, one holds.
    assert!(
        store
            .claim_refresh("alice", "github", &current.sealed, now, now + 90_000)
            .await
            .unwrap()
    );
    assert!(
        !store
            .claim_refresh("alice", "github", &current.sealed, now, now + 90_000)
            .await
            .unwrap()
    );

    assert_eq!(broker.disconnect(Some("alice"), "github").await.unwrap(), 1);
    assert!(broker.value("alice", "github").await.unwrap().is_none());
    assert_eq!(broker.disconnect(None, "github").await.unwrap(), 1);
    assert!(broker.connected("github").await.unwrap().is_empty());
}

#[tokio::test]
async fn credentials_are_sealed_in_a_sqlite_file_and_the_file_holds_no_value() {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}/gw.db?mode=rwc", dir.path().display());
    let db = Database::connect(&url).await.unwrap();
    exercise(db.credential_store()).await;
    // Alice's token was stored, read, sealed again and deleted; bob's is still there. No
    // file of the database holds either in the clear.
    let broker = Broker::new(config(1, &[]), db.credential_store(), BASE);
    broker
        .connect_secret("bob_again", "github", TOKEN)
        .await
        .unwrap();
    drop(db);
    for entry in std::fs::read_dir(dir.path()).unwrap() {
        let bytes = std::fs::read(entry.unwrap().path()).unwrap();
        for secret in [TOKEN.as_bytes(), b"bobs-jira"] {
            assert!(
                !bytes.windows(secret.len()).any(|w| w == secret),
                "a value in the clear in the database's files"
            );
        }
    }
}

#[tokio::test]
async fn credentials_are_sealed_in_postgres() {
    let pg = common::Postgres::create("credentials");
    let db = Database::connect(&pg.url).await.unwrap();
    exercise(db.credential_store()).await;
}

#[tokio::test]
async fn a_request_to_connect_is_used_once_and_not_after_it_expires() {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}/gw.db?mode=rwc", dir.path().display());
    let db = Database::connect(&url).await.unwrap();
    let store = db.credential_store();
    let broker = Broker::new(config(1, &[]), store.clone(), BASE);
    let asked = broker.request("alice", "github").await.unwrap();
    assert_eq!(asked.url, format!("{BASE}/connect/{}", asked.id));
    assert_eq!(asked.label, "GitHub token");
    // The link names no one: only a random id.
    assert!(!asked.url.contains("alice") && asked.id.len() >= 32);
    let now = mcp_gateway::audit::now_ms();
    let peeked = store.peek_request(&asked.id, now).await.unwrap().unwrap();
    assert_eq!(
        (peeked.subject.as_str(), peeked.name.as_str()),
        ("alice", "github")
    );
    let taken = store.take_request(&asked.id, now).await.unwrap().unwrap();
    assert_eq!(taken, peeked);
    assert!(store.take_request(&asked.id, now).await.unwrap().is_none());
    assert!(store.peek_request(&asked.id, now).await.unwrap().is_none());
    // Expired: neither seen nor taken.
    let late = broker.request("alice", "github").await.unwrap();
    let after = now + mcp_gateway::credentials::REQUEST_TTL_MS + 1_000;
    assert!(store.peek_request(&late.id, after).await.unwrap().is_none());
    assert!(store.take_request(&late.id, after).await.unwrap().is_none());
    assert!(
        store
            .take_request("no-such-id", now)
            .await
            .unwrap()
            .is_none()
    );
}

/// A remote server refusing a person's token (issue 42): the broker judges the value the
/// instance sent, not whatever is kept now; a step-up asks for the scopes granted and those
/// named, only well-formed and within the configured ones; a refusal of scopes already
/// granted is not asked again; a token refused outright is forgotten.
#[tokio::test]
async fn a_refused_token_is_judged_by_the_value_sent() {
    use mcp_gateway::credentials::Value;
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}/gw.db?mode=rwc", dir.path().display());
    let db = Database::connect(&url).await.unwrap();
    let store = db.credential_store();
    let mut defs = config(1, &[]);
    let spec = |text: &str| toml::from_str::<CredentialSpec>(text).unwrap();
    for (name, extra) in [("up", ""), ("capped", "scopes = [\"a\", \"b\"]\n")] {
        defs.credentials.push(
            credential_config(
                name,
                spec(&format!(
                    "kind = \"oauth2\"\nmcp_server = \"http://127.0.0.1:9/mcp\"\n\
                     authorization_endpoint = \"http://127.0.0.1:9/authorize\"\n\
                     token_endpoint = \"http://127.0.0.1:9/token\"\nclient_id = \"gw\"\n{extra}"
                )),
                |_| None,
            )
            .unwrap(),
        );
    }
    let broker = Broker::new(defs, store.clone(), BASE);
    let value = |v: &str| Value {
        value: v.to_owned(),
        refresh_token: None,
        lifetime_ms: None,
    };
    let keep = |name: &'static str, v: &'static str| {
        let broker = broker.clone();
        async move {
            broker
                .keep("alice", name, &value(v), None, Some("a".into()))
                .await
                .unwrap();
        }
    };
    let insufficient = |scope: &'static str| (403, Some("insufficient_scope"), Some(scope));
    keep("up", "t1").await;
    // An instance started before the value kept now: it ends, and the value stays.
    assert!(broker.refused("alice", "up", "t0", (401, None, None)).await);
    assert!(store.get("alice", "up").await.unwrap().is_some());
    // Refused for a scope it was granted: not asked again, the value stays.
    assert!(!broker.refused("alice", "up", "t1", insufficient("a")).await);
    // Malformed or too many scopes: not asked.
    assert!(
        !broker
            .refused("alice", "up", "t1", insufficient("a \"b"))
            .await
    );
    let many = Box::leak(vec!["s"; 40].join(" ").into_boxed_str());
    assert!(
        !broker
            .refused("alice", "up", "t1", insufficient(many))
            .await
    );
    assert!(store.get("alice", "up").await.unwrap().is_some());
    // A step-up: the value forgotten, and the next request to connect asks for both.
    assert!(
        broker
            .refused("alice", "up", "t1", insufficient("a b"))
            .await
    );
    assert!(store.get("alice", "up").await.unwrap().is_none());
    let asked = broker.request("alice", "up").await.unwrap();
    let now = mcp_gateway::audit::now_ms();
    let r = store.peek_request(&asked.id, now).await.unwrap().unwrap();
    assert_eq!(r.scopes.as_deref(), Some("a b"));
    // Asked once: the request after it carries the credential's own scopes only.
    let again = broker.request("alice", "up").await.unwrap();
    let r = store.peek_request(&again.id, now).await.unwrap().unwrap();
    assert_eq!(r.scopes, None);
    // Configured scopes bound what a server may have people asked for.
    keep("capped", "c1").await;
    assert!(
        !broker
            .refused("alice", "capped", "c1", insufficient("admin"))
            .await
    );
    assert!(
        broker
            .refused("alice", "capped", "c1", insufficient("b"))
            .await
    );
    // A token refused outright, with no refresh token: forgotten.
    keep("up", "t2").await;
    assert!(broker.refused("alice", "up", "t2", (401, None, None)).await);
    assert!(store.get("alice", "up").await.unwrap().is_none());
    // Someone else's value is not theirs to refuse.
    keep("up", "t3").await;
    assert!(broker.refused("bob", "up", "t3", (401, None, None)).await);
    assert!(store.get("alice", "up").await.unwrap().is_some());
}

/// The server of a credential defined through the admin API (issue 42): its discovery
/// reaches only global addresses and `[sandbox] remote_networks`, as a remote plugin added
/// there does; the config file's reach what the operator chose.
#[tokio::test]
async fn an_api_credential_s_server_is_reached_only_at_allowed_addresses() {
    // A listener on loopback answers 404 everywhere: reaching it fails otherwise.
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    tokio::spawn(async move {
        let app = axum::Router::new();
        axum::serve(listener, app).await.unwrap();
    });
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}/gw.db?mode=rwc", dir.path().display());
    let db = Database::connect(&url).await.unwrap();
    let begin = |host: &'static str, networks: Vec<ipnet::IpNet>, from_file: bool| {
        let store = db.credential_store();
        let mcp = format!("http://{host}:{port}/mcp");
        let spec: CredentialSpec =
            toml::from_str(&format!("kind = \"oauth2\"\nmcp_server = {mcp:?}\n")).unwrap();
        async move {
            let mut defs = config(1, &[]);
            defs.remote_networks = networks;
            if from_file {
                defs.credentials
                    .push(credential_config("up", spec.clone(), |_| None).unwrap());
            }
            let broker = Broker::new(defs, store.clone(), BASE);
            if !from_file {
                broker.define("up", &spec).await.unwrap();
            }
            let asked = broker.request("alice", "up").await.unwrap();
            let now = mcp_gateway::audit::now_ms();
            let request = store.peek_request(&asked.id, now).await.unwrap().unwrap();
            broker
                .begin_connect(&request)
                .await
                .unwrap_err()
                .to_string()
        }
    };
    // An address, or a name that resolves to one, outside what is allowed: not reached.
    for host in ["127.0.0.1", "localhost"] {
        let refused = begin(host, Vec::new(), false).await;
        assert!(!refused.contains("404"), "{refused}");
        if host == "127.0.0.1" {
            assert!(refused.contains("neither a global address"), "{refused}");
        }
    }
    // Allowed, or the file's: reached (and found to have no metadata).
    for (networks, from_file) in [
        (
            vec!["127.0.0.0/8".parse().unwrap(), "::1/128".parse().unwrap()],
            false,
        ),
        (Vec::new(), true),
    ] {
        let reached = begin("localhost", networks, from_file).await;
        assert!(!reached.contains("neither a global address"), "{reached}");
        assert!(reached.contains("404"), "{reached}");
    }
}

/// The real gateway, built-in sign-in for alice and bob, and a per-session plugin started
/// with the caller's own `tok`: a call before `tok` is connected gets the spec's
/// URLElicitationRequiredError (-32042) with a link to the connect page; once connected, each
/// person's process has their own value and no one else's.
#[tokio::test]
async fn each_person_s_process_gets_their_own_credential_and_a_missing_one_is_asked_for() {
    use common::FIXTURE;
    use common::modern::{Modern, only};
    let plugins = format!(
        "[plugins.fix]\ncommand = \"{FIXTURE}\"\nenv = {{ TOKEN = \"${{credential:tok}}\" }}\n"
    );
    let a = gateway_with(0xab, &plugins);
    let (base, db) = (a.base.clone(), a.db.clone());
    let token_of = |user: &'static str| token(&a, user);
    let alices_token = token_of("alice").await;
    // A 2026-07-28 client is asked in a round of its own: a URL mode elicitation of the link.
    let modern = Modern::new(
        a.gw.client().with_token(&alices_token),
        serde_json::json!({"elicitation": {"url": {}}}),
    );
    let args = serde_json::json!({"name": "TOKEN"});
    let round = modern.call(1, "getenv", args.clone()).await;
    let requests = round.input_requests();
    let key = only(requests, "elicitation/create");
    assert_eq!(key, "connect-tok");
    let asked = &requests[&key]["params"];
    assert_eq!(asked["mode"], "url");
    let modern_link = asked["url"].as_str().unwrap();
    assert!(
        modern_link.starts_with(&format!("{base}/connect/")),
        "{asked}"
    );
    let state = round.state();
    // Declined: the call is not made.
    let declined = modern
        .retry(
            2,
            "getenv",
            args.clone(),
            serde_json::json!({"connect-tok": {"action": "decline"}}),
            &state,
        )
        .await;
    assert_eq!(declined.error().1, -32600, "{}", declined.message);
    // A modern client that cannot open URLs is told what it lacks.
    let no_url = Modern::new(
        a.gw.client().with_token(&alices_token),
        serde_json::json!({"elicitation": {"form": {}}}),
    );
    let refused = no_url.call(1, "getenv", args.clone()).await;
    let (status, code, _) = refused.error();
    assert_eq!((status, code), (400, -32021), "{}", refused.message);
    assert_eq!(
        refused.message["error"]["data"]["requiredCapabilities"],
        serde_json::json!({"elicitation": {"url": {}}})
    );

    let mut alice = a.gw.client().with_token(&alices_token);
    alice.initialize().await;
    let getenv = json_call("TOKEN");
    let reply = alice.call(2, "tools/call", getenv.clone()).await;
    let error = &reply.last()["error"];
    assert_eq!(error["code"], -32042, "{reply:?}");
    let asked = &error["data"]["elicitations"][0];
    assert_eq!(asked["mode"], "url");
    let id = asked["elicitationId"].as_str().unwrap();
    assert_eq!(asked["url"], format!("{base}/connect/{id}"));
    assert!(
        error["message"].as_str().unwrap().contains("Service token"),
        "{error}"
    );

    let link = asked["url"].as_str().unwrap().to_owned();
    let http = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .unwrap();

    // A link that does not exist, and one opened without its page: refused.
    let r = http
        .get(format!("{base}/connect/{}", "0".repeat(32)))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 404);
    let page = Page::open(&http, &link).await;
    let no_cookie = http
        .post(&link)
        .form(&form(&page.csrf, "alice", "alice-pw", "alice-secret-1"))
        .send()
        .await
        .unwrap();
    assert_eq!(no_cookie.status(), 403);
    assert!(no_cookie.text().await.unwrap().contains("id=\"csrf\""));
    // A cross-site post, cookie and all (a browser sends it only with SameSite=None).
    let r = page
        .post(&http, "alice", "alice-pw", "alice-secret-1")
        .header("origin", "https://evil.example")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 403);
    // Refused at the edge, before the form was read.
    assert!(!r.text().await.unwrap().contains("id=\"csrf\""));
    // Bob signs in on alice's link: refused, nothing kept for anyone.
    let r = page
        .post(&http, "bob", "bob-pw", "bob-wants-in")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 403);
    let body = r.text().await.unwrap();
    assert!(body.contains("id=\"another\""), "{body}");
    let r = page
        .post(&http, "alice", "wrong", "alice-secret-1")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 401);
    let reply = alice.call(3, "tools/call", getenv.clone()).await;
    assert_eq!(reply.last()["error"]["code"], -32042, "{reply:?}");

    // Alice herself: kept, and her next call's process has it.
    let r = page
        .post(&http, "alice", "alice-pw", "alice-secret-1")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    assert!(r.text().await.unwrap().contains("id=\"connected\""));
    let got = alice.result(4, "tools/call", getenv.clone()).await;
    assert_eq!(got["content"][0]["text"], "alice-secret-1");
    // The modern client's retry, once she is connected, runs the call.
    let done = modern
        .retry(
            3,
            "getenv",
            args.clone(),
            serde_json::json!({"connect-tok": {"action": "accept"}}),
            &state,
        )
        .await;
    assert_eq!(done.text(), "alice-secret-1");
    // The link is used up.
    let r = page
        .post(&http, "alice", "alice-pw", "alice-secret-X")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 404);
    assert_eq!(http.get(&link).send().await.unwrap().status(), 404);

    // Bob's client can open links (URL elicitation, 2025-11-25): it is asked on the call's
    // stream, and the call waits for him.
    let mut bob = a.gw.client().with_token(&token_of("bob").await);
    bob.initialize_at(
        "2025-11-25",
        serde_json::json!({"elicitation": {"url": {}}}),
    )
    .await;
    let call = |id: i64| serde_json::json!({"jsonrpc": "2.0", "id": id, "method": "tools/call", "params": getenv.clone()});
    // Declined: the call ends with the error.
    let mut events = bob.stream(&call(20)).await;
    let asked = events.next().await.unwrap();
    assert_eq!(asked["method"], "elicitation/create", "{asked}");
    assert_eq!(asked["params"]["mode"], "url");
    let r = bob
        .post(&serde_json::json!({"jsonrpc": "2.0", "id": asked["id"], "result": {"action": "decline"}}))
        .await;
    assert_eq!(r.status, 202);
    let answer = events.next().await.unwrap();
    assert_eq!(answer["error"]["code"], -32042, "{answer}");
    // Accepted: the call waits until he connected, then goes on.
    let mut events = bob.stream(&call(21)).await;
    let asked = events.next().await.unwrap();
    let elicitation = asked["params"]["elicitationId"].clone();
    let bobs_link = asked["params"]["url"].as_str().unwrap().to_owned();
    let r = bob
        .post(&serde_json::json!({"jsonrpc": "2.0", "id": asked["id"], "result": {"action": "accept"}}))
        .await;
    assert_eq!(r.status, 202);
    let page = Page::open(&http, &bobs_link).await;
    let r = page
        .post(&http, "bob", "bob-pw", "bob-secret-2")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let complete = events.next().await.unwrap();
    assert_eq!(
        complete["method"], "notifications/elicitation/complete",
        "{complete}"
    );
    assert_eq!(complete["params"]["elicitationId"], elicitation);
    let answer = events.next().await.unwrap();
    assert_eq!(answer["id"], 21);
    assert_eq!(
        answer["result"]["content"][0]["text"], "bob-secret-2",
        "{answer}"
    );
    let got = bob.result(3, "tools/call", getenv.clone()).await;
    assert_eq!(got["content"][0]["text"], "bob-secret-2");
    let got = alice.result(5, "tools/call", getenv.clone()).await;
    assert_eq!(got["content"][0]["text"], "alice-secret-1");

    // The operator sees who connected, never a value, and revokes alice's: her running
    // process stops, and her next call asks again.
    let admin = common::Admin::of(&a.gw, ADMIN_TOKEN);
    let (status, all) = admin.get("/admin/credentials").await;
    assert_eq!(status, 200, "{all}");
    assert_eq!(all["credentials"][0]["connected"], 2, "{all}");
    assert_eq!(all["credentials"][0]["plugins"], serde_json::json!(["fix"]));
    let (_, tok) = admin.get("/admin/credentials/tok").await;
    let who: Vec<&str> = tok["connections"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["subject"].as_str().unwrap())
        .collect();
    assert_eq!(who, ["alice", "bob"]);
    assert!(!tok.to_string().contains("secret-"), "{tok}");
    assert_eq!(admin.get("/admin/credentials/nope").await.0, 404);
    let (status, revoked) = admin
        .send(
            reqwest::Method::DELETE,
            "/admin/credentials/tok/connections/alice",
            None,
            Some(ADMIN_TOKEN),
        )
        .await;
    assert_eq!(status, 200, "{revoked}");
    assert_eq!(
        revoked,
        serde_json::json!({"revoked": 1, "instances_stopped": 2}),
        "her legacy session's and her 2026-07-28 calls' instances"
    );
    let reply = alice.call(6, "tools/call", getenv.clone()).await;
    assert_eq!(reply.last()["error"]["code"], -32042, "{reply:?}");
    let again = modern.call(4, "getenv", args.clone()).await;
    only(again.input_requests(), "elicitation/create");
    let got = bob.result(4, "tools/call", getenv.clone()).await;
    assert_eq!(got["content"][0]["text"], "bob-secret-2");
    let (_, audit) = admin.get("/admin/audit?kind=admin").await;
    assert!(
        audit.to_string().contains("credential.revoke:tok"),
        "{audit}"
    );
    // The person's own connections, and the refused one, by name only, newest first.
    let (_, audit) = admin.get("/admin/audit?kind=credential").await;
    let records: Vec<(&str, &str, &str)> = audit["records"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| {
            (
                r["subject"].as_str().unwrap(),
                r["target"].as_str().unwrap(),
                r["outcome"].as_str().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        records,
        [
            ("bob", "connect tok", "ok"),
            ("alice", "connect tok", "ok"),
            ("bob", "connect tok", "refused")
        ],
        "{audit}"
    );
    assert!(!audit.to_string().contains("secret-"), "{audit}");

    // An expired link is refused.
    let mut bob_again = a.gw.client().with_token(&token_of("bob").await);
    bob_again.initialize().await;
    let database = Database::connect(&db).await.unwrap();
    sqlx::query("DELETE FROM credentials")
        .execute(database.pool())
        .await
        .unwrap();
    let reply = bob_again.call(2, "tools/call", getenv.clone()).await;
    let late = reply.last()["error"]["data"]["elicitations"][0]["url"]
        .as_str()
        .unwrap_or_else(|| panic!("{reply:?}"))
        .to_owned();
    sqlx::query("UPDATE credential_requests SET expires_at_ms = 1")
        .execute(database.pool())
        .await
        .unwrap();
    assert_eq!(http.get(&late).send().await.unwrap().status(), 404);

    // No value in the gateway's log, nor in its database's files.
    let log = a.gw.log();
    assert!(!log.contains("alice-secret-1") && !log.contains("bob-secret-2"));
    drop(database);
    for entry in std::fs::read_dir(a.dir.path()).unwrap() {
        let bytes = std::fs::read(entry.unwrap().path()).unwrap();
        assert!(!bytes.windows(14).any(|w| w == b"alice-secret-1"));
    }
}

/// `${credential_file:NAME}`: the person's value in a file of their instance's own home
/// (mode 0600), which another person's instance cannot read.
#[tokio::test]
async fn a_credential_file_is_the_person_s_own() {
    const HOSTILE: &str = env!("CARGO_BIN_EXE_mcp-fixture-hostile");
    let plugins = format!(
        "[plugins.vault]\ncommand = \"{HOSTILE}\"\nenv = {{ TOKEN_FILE = \"${{credential_file:tok}}\" }}\n"
    );
    let a = gateway_with(0xcd, &plugins);
    let (broker, _db) = broker_of(&a, 0xcd).await;
    broker
        .connect_secret("alice", "tok", "alice-file-secret")
        .await
        .unwrap();
    broker
        .connect_secret("bob", "tok", "bob-file-secret")
        .await
        .unwrap();

    let mut files = Vec::new();
    let mut clients = Vec::new();
    for user in ["alice", "bob"] {
        let mut c = a.gw.client().with_token(&token(&a, user).await);
        c.initialize().await;
        let who = c
            .result(
                2,
                "tools/call",
                serde_json::json!({"name": "whoami", "arguments": {}}),
            )
            .await;
        let who: serde_json::Value =
            serde_json::from_str(who["content"][0]["text"].as_str().unwrap()).unwrap();
        let file = who["env"]["TOKEN_FILE"].as_str().unwrap().to_owned();
        assert!(file.ends_with("/.credentials/tok"), "{file}");
        files.push(file);
        clients.push(c);
    }
    let read = |c: &common::Client, path: &str| {
        let c = c.clone();
        let path = path.to_owned();
        async move {
            let r = c
                .result(
                    3,
                    "tools/call",
                    serde_json::json!({"name": "escape", "arguments": {"read": [path]}}),
                )
                .await;
            let report: serde_json::Value =
                serde_json::from_str(r["content"][0]["text"].as_str().unwrap()).unwrap();
            report["read"][0].clone()
        }
    };
    let own = read(&clients[0], &files[0]).await;
    assert_eq!(own["ok"], true, "{own}");
    assert!(
        own["detail"]
            .as_str()
            .unwrap()
            .ends_with("alice-file-secret"),
        "{own}"
    );
    let mode = std::fs::metadata(&files[0]).map(|m| {
        use std::os::unix::fs::PermissionsExt;
        m.permissions().mode() & 0o777
    });
    assert_eq!(mode.unwrap(), 0o600);
    // Alice's instance cannot read bob's file.
    let other = read(&clients[0], &files[1]).await;
    assert_eq!(other["ok"], false, "{other}");
    assert!(!other.to_string().contains("bob-file-secret"));

    // Alice connects a new value: her running instance's file is written again in place (the
    // same instance, the same path), and bob's is untouched.
    broker
        .connect_secret("alice", "tok", "alice-file-secret-2")
        .await
        .unwrap();
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(15);
    loop {
        let now = read(&clients[0], &files[0]).await;
        if now["detail"]
            .as_str()
            .unwrap_or_default()
            .ends_with("alice-file-secret-2")
        {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "never written again: {now}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    }
    let bobs = read(&clients[1], &files[1]).await;
    assert!(
        bobs["detail"]
            .as_str()
            .unwrap()
            .ends_with("bob-file-secret"),
        "{bobs}"
    );
    assert!(a.gw.log().contains("written again in place"));
    assert!(!a.gw.log().contains("file-secret"));
}

/// The people's own page: signed in, a person sees their credentials (never a value) and
/// disconnects one, which stops their process and makes the next call ask again; a grant
/// is theirs alone and cannot be altered; connecting again goes through a link of their own.
#[tokio::test]
async fn people_see_and_disconnect_their_own_credentials() {
    use common::FIXTURE;
    let plugins = format!(
        "[plugins.fix]\ncommand = \"{FIXTURE}\"\nenv = {{ TOKEN = \"${{credential:tok}}\" }}\n"
    );
    let a = gateway_with(0x5a, &plugins);
    let (broker, _db) = broker_of(&a, 0x5a).await;
    broker
        .connect_secret("alice", "tok", "alice-page-secret")
        .await
        .unwrap();
    broker
        .connect_secret("bob", "tok", "bob-page-secret")
        .await
        .unwrap();
    let mut alice = a.gw.client().with_token(&token(&a, "alice").await);
    alice.initialize().await;
    let getenv = json_call("TOKEN");
    let got = alice.result(2, "tools/call", getenv.clone()).await;
    assert_eq!(got["content"][0]["text"], "alice-page-secret");

    let http = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .unwrap();
    let url = format!("{}/connections", a.base);
    let r = http.get(&url).send().await.unwrap();
    assert_eq!(r.status(), 200);
    let set = r.headers()["set-cookie"].to_str().unwrap().to_owned();
    assert!(
        set.contains("SameSite=Strict") && set.contains("HttpOnly"),
        "{set}"
    );
    let cookie = set.split(';').next().unwrap().to_owned();
    let html = r.text().await.unwrap();
    let csrf = hidden(&html, "csrf");
    let post = |fields: Vec<(&'static str, String)>| {
        http.post(&url)
            .header("cookie", &cookie)
            .form(&fields)
            .send()
    };
    // Without the browser's cookie: refused.
    let r = http
        .post(&url)
        .form(&[
            ("csrf", csrf.as_str()),
            ("username", "alice"),
            ("password", "alice-pw"),
        ])
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 403);
    let r = post(vec![
        ("csrf", csrf.clone()),
        ("username", "alice".into()),
        ("password", "nope".into()),
    ])
    .await
    .unwrap();
    assert_eq!(r.status(), 401);
    let r = post(vec![
        ("csrf", csrf.clone()),
        ("username", "alice".into()),
        ("password", "alice-pw".into()),
    ])
    .await
    .unwrap();
    assert_eq!(r.status(), 200);
    let html = r.text().await.unwrap();
    assert!(
        html.contains("Signed in as alice") && html.contains("credential-tok"),
        "{html}"
    );
    assert!(
        html.contains("connected 20") && !html.contains("page-secret"),
        "{html}"
    );
    let grant = hidden(&html, "grant");

    // A grant altered (another subject named in it) proves nothing.
    let (_, sealed) = grant.split_once('~').unwrap();
    use base64::Engine as _;
    let forged = format!(
        "{}~{sealed}",
        base64::engine::general_purpose::URL_SAFE_NO_PAD.encode("bob")
    );
    let r = post(vec![
        ("csrf", csrf.clone()),
        ("grant", forged),
        ("action", "disconnect".into()),
        ("credential", "tok".into()),
    ])
    .await
    .unwrap();
    assert_eq!(r.status(), 401);
    assert!(broker.value("bob", "tok").await.unwrap().is_some());

    // Alice disconnects hers: bob's stays, her process stops, her next call asks again.
    let r = post(vec![
        ("csrf", csrf.clone()),
        ("grant", grant.clone()),
        ("action", "disconnect".into()),
        ("credential", "tok".into()),
    ])
    .await
    .unwrap();
    assert_eq!(r.status(), 200);
    assert!(r.text().await.unwrap().contains("not connected"));
    assert!(broker.value("alice", "tok").await.unwrap().is_none());
    assert!(broker.value("bob", "tok").await.unwrap().is_some());
    let reply = alice.call(3, "tools/call", getenv.clone()).await;
    assert_eq!(reply.last()["error"]["code"], -32042, "{reply:?}");

    // Connect again: a link of her own, to the connect page.
    let r = post(vec![
        ("csrf", csrf.clone()),
        ("grant", grant),
        ("action", "connect".into()),
        ("credential", "tok".into()),
    ])
    .await
    .unwrap();
    assert_eq!(r.status(), 303);
    let link = r.headers()["location"].to_str().unwrap().to_owned();
    assert!(link.starts_with(&format!("{}/connect/", a.base)), "{link}");
    let page = Page::open(&http, &link).await;
    let r = page
        .post(&http, "alice", "alice-pw", "alice-again")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let got = alice.result(4, "tools/call", getenv).await;
    assert_eq!(got["content"][0]["text"], "alice-again");

    let admin = common::Admin::of(&a.gw, ADMIN_TOKEN);
    let (_, audit) = admin.get("/admin/audit?kind=credential").await;
    assert!(audit.to_string().contains("disconnect tok"), "{audit}");
    // Each call's record names the credential its plugin was started with, never its value.
    let (_, calls) = admin.get("/admin/audit?kind=tools/call").await;
    let records = calls["records"].as_array().unwrap();
    assert!(!records.is_empty(), "{calls}");
    assert!(records.iter().all(|r| r["credentials"] == "tok"), "{calls}");
    assert!(!calls.to_string().contains("alice-"), "{calls}");
}

/// `connect = "eager"`: a legacy session's first request asks its person for the plugin's
/// credential (a client without URL elicitation gets -32042 for it; one with it is asked and
/// its request goes on, and hears `notifications/elicitation/complete` on its GET stream once
/// the person connected). Before they connect, lists show what the plugin listed when probed
/// as no one, so the tools whose calls ask are there to find.
#[tokio::test]
async fn an_eager_plugin_asks_at_a_session_s_first_request() {
    use common::FIXTURE;
    use common::sse::Events;
    let plugins = format!(
        "[plugins.fix]\ncommand = \"{FIXTURE}\"\nconnect = \"eager\"\n\
         env = {{ TOKEN = \"${{credential:tok}}\" }}\n"
    );
    let a = gateway_with(0x3c, &plugins);
    let names = |tools: &serde_json::Value| -> Vec<String> {
        tools["tools"]
            .as_array()
            .unwrap()
            .iter()
            .map(|t| t["name"].as_str().unwrap().to_owned())
            .collect()
    };

    // No URL elicitation: the first request is answered with the link.
    let mut alice = a.gw.client().with_token(&token(&a, "alice").await);
    alice.initialize().await;
    let first = alice.call(2, "tools/list", serde_json::json!({})).await;
    let error = &first.last()["error"];
    assert_eq!(error["code"], -32042, "{first:?}");
    assert!(
        error["data"]["elicitations"][0]["url"]
            .as_str()
            .unwrap()
            .starts_with(&format!("{}/connect/", a.base))
    );
    // Asked once: the next request goes on, and lists the plugin's tools from its probe.
    let listed = alice.result(3, "tools/list", serde_json::json!({})).await;
    assert!(names(&listed).contains(&"getenv".to_owned()), "{listed}");

    // URL elicitation: asked on the first request's stream, which then goes on.
    let mut bob = a.gw.client().with_token(&token(&a, "bob").await);
    bob.initialize_at(
        "2025-11-25",
        serde_json::json!({"elicitation": {"url": {}}}),
    )
    .await;
    let mut get = Events::new(bob.get_stream().await);
    let mut events = bob
        .stream(&serde_json::json!({"jsonrpc": "2.0", "id": 2, "method": "tools/list"}))
        .await;
    let asked = events.next().await.unwrap();
    assert_eq!(asked["method"], "elicitation/create", "{asked}");
    let link = asked["params"]["url"].as_str().unwrap().to_owned();
    let elicitation = asked["params"]["elicitationId"].clone();
    let r = bob
        .post(&serde_json::json!({"jsonrpc": "2.0", "id": asked["id"], "result": {"action": "accept"}}))
        .await;
    assert_eq!(r.status, 202);
    let answer = events.next().await.unwrap();
    assert_eq!(answer["id"], 2, "{answer}");
    assert!(
        names(&answer["result"]).contains(&"getenv".to_owned()),
        "{answer}"
    );
    // Bob connects in his own time; his client hears it on the GET stream.
    let http = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .unwrap();
    let page = Page::open(&http, &link).await;
    let r = page
        .post(&http, "bob", "bob-pw", "bob-eager-1")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let complete = tokio::time::timeout(std::time::Duration::from_secs(10), get.next())
        .await
        .expect("the completion on the GET stream")
        .unwrap();
    assert_eq!(
        complete["method"], "notifications/elicitation/complete",
        "{complete}"
    );
    assert_eq!(complete["params"]["elicitationId"], elicitation);
    let got = bob.result(3, "tools/call", json_call("TOKEN")).await;
    assert_eq!(got["content"][0]["text"], "bob-eager-1");
}

/// `process_model = "per_subject"`: one process per person, shared by all their legacy
/// sessions and their 2026-07-28 calls, started with their own credential; another person
/// gets their own. Ending one of a person's sessions leaves the process to the others; a
/// revocation stops it.
#[tokio::test]
async fn a_per_subject_plugin_runs_one_process_per_person() {
    use common::FIXTURE;
    use common::modern::Modern;
    let plugins = format!(
        "[plugins.fix]\ncommand = \"{FIXTURE}\"\nprocess_model = \"per_subject\"\n\
         env = {{ TOKEN = \"${{credential:tok}}\" }}\n"
    );
    let a = gateway_with(0x4d, &plugins);
    let (broker, _db) = broker_of(&a, 0x4d).await;
    broker
        .connect_secret("alice", "tok", "alice-tok")
        .await
        .unwrap();
    broker
        .connect_secret("bob", "tok", "bob-tok")
        .await
        .unwrap();
    let alices = token(&a, "alice").await;
    let mut one = a.gw.client().with_token(&alices);
    one.initialize().await;
    let mut two = a.gw.client().with_token(&alices);
    two.initialize().await;
    let pid = one.tool_text(2, "pid", serde_json::json!({})).await;
    assert_eq!(two.tool_text(2, "pid", serde_json::json!({})).await, pid);
    let modern = Modern::new(a.gw.client().with_token(&alices), serde_json::json!({}));
    assert_eq!(
        modern.call(1, "pid", serde_json::json!({})).await.text(),
        pid
    );
    assert_eq!(
        two.tool_text(3, "getenv", serde_json::json!({"name": "TOKEN"}))
            .await,
        "alice-tok"
    );

    let mut bob = a.gw.client().with_token(&token(&a, "bob").await);
    bob.initialize().await;
    let bobs = bob.tool_text(2, "pid", serde_json::json!({})).await;
    assert_ne!(bobs, pid, "a process of his own");
    assert_eq!(
        bob.tool_text(3, "getenv", serde_json::json!({"name": "TOKEN"}))
            .await,
        "bob-tok"
    );
    assert_eq!(common::descendants(a.gw.pid()).len(), 2);

    // One of alice's sessions ends: her process goes on serving the other.
    assert_eq!(one.delete().await, 200);
    assert_eq!(two.tool_text(4, "pid", serde_json::json!({})).await, pid);

    // Revoked: her process stops, and her next call asks again; bob's is untouched.
    let admin = common::Admin::of(&a.gw, ADMIN_TOKEN);
    assert_eq!(
        admin
            .delete("/admin/credentials/tok/connections/alice")
            .await,
        200
    );
    let reply = two.call(5, "tools/call", json_call("TOKEN")).await;
    assert_eq!(reply.last()["error"]["code"], -32042, "{reply:?}");
    assert_eq!(bob.tool_text(4, "pid", serde_json::json!({})).await, bobs);
    common::wait_until(
        "alice's process to stop",
        std::time::Duration::from_secs(10),
        || common::descendants(a.gw.pid()).len() == 1,
    )
    .await;
}

/// The console's Credentials view: per credential, who connected it and until when (never a
/// value), and revoking one person's or everyone's, audited as the admin API's revocation.
#[tokio::test]
async fn the_console_shows_who_connected_and_revokes() {
    use common::FIXTURE;
    use common::admin::{console_browser, console_change, console_sign_in_with};
    let plugins = format!(
        "[plugins.fix]\ncommand = \"{FIXTURE}\"\nenv = {{ TOKEN = \"${{credential:tok}}\" }}\n"
    );
    let a = gateway_with(0x6b, &plugins);
    let (broker, _db) = broker_of(&a, 0x6b).await;
    for who in ["alice", "bob"] {
        broker
            .connect_secret(who, "tok", &format!("{who}-console-secret"))
            .await
            .unwrap();
    }
    let ui = format!("http://{}/ui", a.gw.admin.clone().unwrap());
    let (cookie, csrf) = console_sign_in_with(&ui, ADMIN_TOKEN).await;
    let http = console_browser();
    let view = http
        .get(format!("{ui}/api/credentials"))
        .header("cookie", &cookie)
        .send()
        .await
        .unwrap();
    assert_eq!(view.status(), 200);
    let view: serde_json::Value = view.json().await.unwrap();
    let tok = &view["credentials"][0];
    assert_eq!(
        (
            tok["name"].as_str(),
            tok["kind"].as_str(),
            tok["label"].as_str()
        ),
        (Some("tok"), Some("secret"), Some("Service token"))
    );
    assert_eq!(tok["plugins"], serde_json::json!(["fix"]));
    let subjects: Vec<&str> = tok["connections"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["subject"].as_str().unwrap())
        .collect();
    assert_eq!(subjects, ["alice", "bob"]);
    assert!(!view.to_string().contains("console-secret"), "{view}");
    // Without the page's CSRF token: refused, nothing revoked.
    let r = http
        .delete(format!("{ui}/api/credentials/tok/connections/alice"))
        .header("cookie", &cookie)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 403);
    let r = console_change(
        &http,
        (&cookie, &csrf),
        reqwest::Method::DELETE,
        &format!("{ui}/api/credentials/tok/connections/alice"),
        None,
    )
    .await;
    assert_eq!(r.status(), 200);
    assert!(broker.value("alice", "tok").await.unwrap().is_none());
    assert!(broker.value("bob", "tok").await.unwrap().is_some());
    let r = console_change(
        &http,
        (&cookie, &csrf),
        reqwest::Method::DELETE,
        &format!("{ui}/api/credentials/tok/connections"),
        None,
    )
    .await;
    assert_eq!(r.status(), 200);
    assert!(broker.value("bob", "tok").await.unwrap().is_none());
    // Defining one from the console, and removing it.
    let r = console_change(
        &http,
        (&cookie, &csrf),
        reqwest::Method::POST,
        &format!("{ui}/api/credentials"),
        Some(&serde_json::json!({"name": "extra", "kind": "secret", "label": "Extra key"})),
    )
    .await;
    assert_eq!(r.status(), 201);
    let view: serde_json::Value = http
        .get(format!("{ui}/api/credentials"))
        .header("cookie", &cookie)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let extra = view["credentials"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["name"] == "extra")
        .cloned()
        .unwrap_or_else(|| panic!("{view}"));
    assert_eq!(
        (extra["source"].as_str(), extra["label"].as_str()),
        (Some("api"), Some("Extra key"))
    );
    assert_eq!(view["credentials"][0]["source"], "config");
    let r = console_change(
        &http,
        (&cookie, &csrf),
        reqwest::Method::DELETE,
        &format!("{ui}/api/credentials/extra"),
        None,
    )
    .await;
    assert_eq!(r.status(), 204);
    let admin = common::Admin::of(&a.gw, ADMIN_TOKEN);
    let (_, audit) = admin.get("/admin/audit?kind=admin").await;
    let revocations = audit["records"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|r| r["target"] == "credential.revoke:tok")
        .count();
    assert_eq!(revocations, 2, "{audit}");
}

/// The official Python SDK (2.x) as the client, both eras: its elicitation callback is given
/// the connect page's link (a legacy session: `elicitation/create` on the call's stream; a
/// 2026-07-28 client: an `InputRequiredResult` the SDK resolves and retries), connects as a
/// person's browser would, and the call goes on with that person's own value.
#[tokio::test]
async fn the_python_sdk_is_asked_to_connect_and_its_call_goes_on() {
    use common::FIXTURE;
    let plugins = format!(
        "[plugins.fix]\ncommand = \"{FIXTURE}\"\nenv = {{ TOKEN = \"${{credential:tok}}\" }}\n"
    );
    let a = gateway_with(0x91, &plugins);
    for (mode, user, value) in [
        ("legacy", "alice", "alice-from-python"),
        ("2026-07-28", "bob", "bob-from-python"),
    ] {
        let caller = token(&a, user).await;
        let args = [
            mode.to_owned(),
            a.gw.url.clone(),
            caller,
            user.to_owned(),
            format!("{user}-pw"),
            value.to_owned(),
        ];
        let out = tokio::task::spawn_blocking(move || {
            let args: Vec<&str> = args.iter().map(String::as_str).collect();
            common::python_client("python_credentials_client.py", &args)
        })
        .await
        .unwrap();
        assert_eq!(out["asked"].as_array().unwrap().len(), 1, "{out}");
        assert_eq!(out["asked"][0]["mode"], "url", "{out}");
        assert!(
            out["asked"][0]["url"]
                .as_str()
                .unwrap()
                .starts_with(&format!("{}/connect/", a.base)),
            "{out}"
        );
        assert_eq!(out["page"], 200, "{out}");
        assert_eq!(
            (out["is_error"].as_bool(), out["text"].as_str()),
            (Some(false), Some(value)),
            "{out}"
        );
        assert_eq!(out["again"], value, "{out}");
    }
}

/// Credentials defined through the admin API beside the config file's: checked as the file's
/// are, usable by plugins added through the API, kept in the database (a second gateway on it
/// reads them at start, and hears a removal), not changed where the file defines them, and
/// removed only when no plugin uses them (with everyone's values).
#[tokio::test]
async fn credentials_are_defined_through_the_admin_api() {
    use common::FIXTURE;
    use common::credentials::replica_with_credentials;
    let plain = format!("[plugins.plain]\ncommand = \"{FIXTURE}\"\n");
    let a = gateway_with(0x77, &plain);
    let admin = common::Admin::of(&a.gw, ADMIN_TOKEN);
    let jira = serde_json::json!({"name": "jira", "kind": "secret", "label": "Jira token", "pattern": "[a-z]{4}-[0-9]+"});
    let (status, body) = admin.post("/admin/credentials", jira.clone()).await;
    assert_eq!(status, 201, "{body}");
    assert_eq!(body["source"], "api");
    assert_eq!(admin.post("/admin/credentials", jira).await.0, 409);
    let (status, body) = admin
        .post(
            "/admin/credentials",
            serde_json::json!({"name": "bad", "kind": "oauth2", "client_id": "x"}),
        )
        .await;
    assert_eq!(status, 400, "{body}");
    assert!(body.to_string().contains("issuer"), "{body}");
    // The API may not point a client secret at the gateway's own secrets, nor at a file.
    for (key, value) in [
        ("client_secret_env", "MCP_GATEWAY_CREDENTIALS_KEY"),
        ("client_secret_file", "/etc/passwd"),
    ] {
        let (status, body) = admin
            .post(
                "/admin/credentials",
                serde_json::json!({"name": "exfil", "kind": "oauth2", "client_id": "x",
                    "token_endpoint": "https://evil.example/token",
                    "authorization_endpoint": "https://evil.example/auth", key: value}),
            )
            .await;
        assert_eq!(status, 400, "{key}: {body}");
        assert!(
            body.to_string().contains("MCP_GATEWAY_CLIENT_SECRET_"),
            "{body}"
        );
    }
    let (status, _) = admin
        .put(
            "/admin/credentials/tok",
            serde_json::json!({"kind": "secret", "label": "Changed"}),
        )
        .await;
    assert_eq!(status, 409, "the config file's is the file's");

    // A plugin added through the API uses it; a call asks; the page takes a value of its form.
    let (status, body) = admin
        .post(
            "/admin/plugins",
            serde_json::json!({"name": "uses", "command": FIXTURE, "env": {"TOKEN": "${credential:jira}"}}),
        )
        .await;
    assert_eq!(status, 201, "{body}");
    admin.wait_state("uses", "ready").await;
    let mut alice = a.gw.client().with_token(&token(&a, "alice").await);
    alice.initialize().await;
    let call = serde_json::json!({"name": "uses__getenv", "arguments": {"name": "TOKEN"}});
    let reply = alice.call(2, "tools/call", call.clone()).await;
    let link = reply.last()["error"]["data"]["elicitations"][0]["url"]
        .as_str()
        .unwrap_or_else(|| panic!("{reply:?}"))
        .to_owned();
    assert!(
        reply.last()["error"]["message"]
            .as_str()
            .unwrap()
            .contains("Jira token")
    );
    let http = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .unwrap();
    let page = Page::open(&http, &link).await;
    let r = page
        .post(&http, "alice", "alice-pw", "NOT-IT")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 400, "the pattern holds");
    let r = page
        .post(&http, "alice", "alice-pw", "abcd-42")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let got = alice.result(3, "tools/call", call).await;
    assert_eq!(got["content"][0]["text"], "abcd-42");

    // Another gateway on the same database reads it at start.
    let port = common::free_port();
    let b = replica_with_credentials(
        0x77,
        port,
        port,
        "[credentials.tok]\nkind = \"secret\"\nlabel = \"Service token\"\n",
        &plain,
        Some(&a.db),
        &[],
    );
    let other = common::Admin::of(&b.gw, ADMIN_TOKEN);
    let (status, listed) = other.get("/admin/credentials/jira").await;
    assert_eq!(status, 200, "{listed}");
    assert_eq!(listed["connections"][0]["subject"], "alice");

    // Removal: refused while a plugin uses it; then everyone's values go with it, and the
    // other gateway hears it.
    assert_eq!(admin.delete("/admin/credentials/jira").await, 409);
    assert_eq!(admin.delete("/admin/plugins/uses").await, 204);
    assert_eq!(admin.delete("/admin/credentials/jira").await, 204);
    assert_eq!(admin.get("/admin/credentials/jira").await.0, 404);
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(15);
    while other.get("/admin/credentials/jira").await.0 != 404 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the other gateway never heard"
        );
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    }
    let (_, audit) = admin.get("/admin/audit?kind=admin").await;
    let text = audit.to_string();
    assert!(
        text.contains("credential.add") && text.contains("credential.remove:jira"),
        "{audit}"
    );
}
