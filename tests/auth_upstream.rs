//! Sign-in at an upstream OpenID provider (`[auth.upstream]`), against a real one
//! (`oidc-provider` from npm, tests/common/oidc.rs) and the real binary: the official Python
//! SDK's OAuth client registers with the gateway, a person signs in at the provider's login
//! page in headless Chromium and approves at the gateway's consent page, and the client calls
//! a tool with the gateway's own token (the mapped subject and groups, none of the provider's
//! tokens); a person outside the allowed groups gets a refusal page and no code; a group rule
//! hides a plugin from one person and shows it to another; the leg toward the provider is
//! bound to the pending authorization and used once; a provider that cannot be used is
//! named on a page.

mod common;

use std::collections::HashMap;
use std::time::Duration;

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use common::browser::Browserdriver;
use common::oauth::*;
use common::oidc::OidcProvider;
use common::{FIXTURE, Gateway, free_port, tool_names, write_config, write_file};
use serde_json::{Value, json};

/// The gateway's client secret at the provider.
const SECRET: &str = "gateway-upstream-s3cret";

/// ann is in the allowed group and in `eng`; ben only in the allowed group; olaf in neither.
fn accounts() -> Value {
    json!([
        {"sub": "ann", "password": "ann-pw", "email": "ann@example.com", "name": "Ann Example", "groups": ["mcp-users", "eng"]},
        {"sub": "ben", "password": "ben-pw", "email": "ben@example.com", "name": "Ben Example", "groups": ["mcp-users"]},
        {"sub": "olaf", "password": "olaf-pw", "email": "olaf@outside.org", "name": "Olaf Outside", "groups": ["contractors"]},
    ])
}

/// A provider with the gateway as a client, and a gateway whose people sign in there:
/// `allowed_groups = ["mcp-users"]`, plugin `fix` open to all, `eng` for the `eng` group.
/// `issuer` overrides the provider's issuer in the gateway's config.
fn start(issuer: Option<&str>) -> (OidcProvider, AuthGateway) {
    start_with(issuer, "")
}

/// [`start`] with more config at the end (local users).
fn start_with(issuer: Option<&str>, extra: &str) -> (OidcProvider, AuthGateway) {
    let port = free_port();
    let base = format!("http://127.0.0.1:{port}");
    let provider = OidcProvider::start(json!({
        "clients": [{
            "client_id": "gateway",
            "client_secret": SECRET,
            "grant_types": ["authorization_code"],
            "response_types": ["code"],
            "redirect_uris": [format!("{base}/authorize/upstream/callback")],
        }],
        "accounts": accounts(),
    }));
    let dir = tempfile::tempdir().unwrap();
    let secret = write_file(&dir, "upstream-secret", &format!("{SECRET}\n"));
    let issuer = issuer.unwrap_or(provider.issuer());
    let config = format!(
        "[auth]\nmode = \"builtin\"\npublic_url = \"{base}/mcp\"\n\
         [auth.upstream]\nissuer = \"{issuer}\"\nclient_id = \"gateway\"\n\
         client_secret_file = \"{secret}\"\nscopes = [\"openid\", \"email\", \"profile\", \"groups\"]\n\
         allowed_groups = [\"mcp-users\"]\ndisplay_name = \"Test IdP\"\n\
         [plugins.fix]\ncommand = \"{FIXTURE}\"\n\
         [plugins.eng]\ncommand = \"{FIXTURE}\"\nallow_groups = [\"eng\"]\n{extra}"
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
    (provider, AuthGateway { gw, base, db, dir })
}

/// The next line a child printed, within two minutes.
async fn next_line<R: tokio::io::AsyncBufRead + Unpin>(
    lines: &mut tokio::io::Lines<R>,
) -> Option<String> {
    tokio::time::timeout(Duration::from_secs(120), lines.next_line())
        .await
        .expect("the Python client said nothing for 2 minutes")
        .unwrap()
}

/// The claims of a JWT, unchecked.
fn claims(token: &str) -> Value {
    let payload = token.split('.').nth(1).unwrap();
    serde_json::from_slice(&URL_SAFE_NO_PAD.decode(payload).unwrap()).unwrap()
}

/// The text the browser shows.
async fn page_text(b: &Browserdriver) -> String {
    b.cmd(
        "/execute/sync",
        json!({"script": "return document.body.innerText", "args": []}),
    )
    .await
    .as_str()
    .unwrap_or_default()
    .to_owned()
}

/// Signs in at the provider's login page, in the browser showing it.
async fn provider_sign_in(b: &Browserdriver, user: &str) {
    b.type_into("#login", user).await;
    b.type_into("#password", &format!("{user}-pw")).await;
    b.click("#submit").await;
}

/// A redirect URI of the test's own that hands what the browser brings to it to the test.
async fn callback_server() -> (
    String,
    tokio::sync::mpsc::UnboundedReceiver<HashMap<String, String>>,
) {
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel::<HashMap<String, String>>();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let callback = format!("http://{}/callback", listener.local_addr().unwrap());
    let app = axum::Router::new().route(
        "/callback",
        axum::routing::get(
            move |axum::extract::Query(q): axum::extract::Query<HashMap<String, String>>| {
                let _ = tx.send(q);
                async { "signed in; you can close this window" }
            },
        ),
    );
    tokio::spawn(async move { axum::serve(listener, app).await });
    (callback, rx)
}

/// The gateway's `/authorize` URL for `client`, redirecting to `callback`.
fn authorize_url(a: &AuthGateway, client: &str, callback: &str, challenge: &str) -> String {
    let mut u = url::Url::parse(&a.url("/authorize")).unwrap();
    u.query_pairs_mut()
        .append_pair("response_type", "code")
        .append_pair("client_id", client)
        .append_pair("redirect_uri", callback)
        .append_pair("code_challenge", challenge)
        .append_pair("code_challenge_method", "S256")
        .append_pair("state", "client-state")
        .append_pair("scope", "mcp")
        .append_pair("resource", &a.url("/mcp"));
    u.to_string()
}

#[tokio::test]
async fn the_python_sdk_signs_in_at_the_provider_in_a_real_browser_and_calls_a_tool() {
    let (_provider, a) = start(None);
    let python = common::tool("venv/bin/python");
    let script = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/clients/python_upstream_client.py"
    );
    let mut child = tokio::process::Command::new(python)
        .args([script, &a.url("/mcp"), "fix__echo"])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("run the Python client");
    use tokio::io::AsyncBufReadExt;
    let mut lines = tokio::io::BufReader::new(child.stdout.take().unwrap()).lines();
    let line: String = next_line(&mut lines)
        .await
        .expect("the Python client asks for a browser");
    let authorization_url = line.strip_prefix("authorize ").unwrap().to_owned();
    assert!(
        authorization_url.starts_with(&a.url("/authorize"))
            && authorization_url.contains("code_challenge_method=S256"),
        "the SDK sends the browser to the gateway: {authorization_url}"
    );

    let b = Browserdriver::start().await;
    b.goto(&authorization_url).await;
    // The gateway has no local users: straight to the provider's login page.
    provider_sign_in(&b, "ann").await;
    b.find("#approve").await;
    let consent = page_text(&b).await;
    assert!(
        consent.contains("Ann Example (ann@example.com)")
            && consent.contains("python-sdk-upstream"),
        "the consent page names the person and the client: {consent}"
    );
    b.click("#approve").await;

    let result = loop {
        let line = next_line(&mut lines).await;
        let Some(line) = line else {
            let out = child.wait_with_output().await.unwrap();
            panic!(
                "the Python client ended without a result ({}): {}",
                out.status,
                String::from_utf8_lossy(&out.stderr)
            );
        };
        if let Some(r) = line.strip_prefix("result ") {
            break serde_json::from_str::<Value>(r).unwrap();
        }
    };
    assert!(child.wait().await.unwrap().success());
    assert_eq!(result["echo"], "hello from upstream");
    assert_eq!(result["registered_client"], true, "registered itself");
    let tools: Vec<&str> = result["tools"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t.as_str().unwrap())
        .collect();
    assert!(
        tools.contains(&"fix__echo") && tools.contains(&"eng__echo"),
        "ann is in eng: {tools:?}"
    );
    // The client holds the gateway's token for the mapped subject and groups, and nothing of
    // the provider's.
    let c = &result["token_claims"];
    assert_eq!(c["iss"], a.base);
    assert_eq!(c["aud"], a.url("/mcp"));
    assert_eq!(c["sub"], "upstream:ann");
    assert_eq!(c["groups"], json!(["mcp-users", "eng"]));
    let fields = result["token_fields"].to_string();
    assert!(!fields.contains("id_token"), "{fields}");
    a.gw.wait_log("signed in at the upstream provider").await;
    a.gw.wait_log("upstream identity provider discovered").await;
    assert!(
        !a.gw.log().contains(SECRET),
        "the client secret is never logged"
    );
}

#[tokio::test]
async fn a_person_outside_the_allowed_groups_is_refused_and_group_rules_tell_people_apart() {
    let (_provider, a) = start(None);
    let (callback, mut landed) = callback_server().await;
    let (status, c) = register(
        &a,
        json!({"client_name": "Browser App", "redirect_uris": [callback], "token_endpoint_auth_method": "none"}),
    )
    .await;
    assert_eq!(status, 201, "{c}");
    let client = c["client_id"].as_str().unwrap().to_owned();

    // olaf signs in at the provider, but is not in an allowed group: a page says so.
    let (_, challenge) = pkce();
    let b = Browserdriver::start().await;
    b.goto(&authorize_url(&a, &client, &callback, &challenge))
        .await;
    provider_sign_in(&b, "olaf").await;
    b.find("#refused").await;
    let text = page_text(&b).await;
    assert!(
        text.contains("Access refused")
            && text.contains("olaf@outside.org")
            && text.contains("not among the people allowed"),
        "{text}"
    );
    assert!(
        landed.try_recv().is_err(),
        "nothing went back to the client"
    );
    drop(b);
    a.gw.wait_log("sign-in refused").await;

    // ben is let in, but is not in eng: the eng plugin is hidden from him and refused.
    let (verifier, challenge) = pkce();
    let b = Browserdriver::start().await;
    b.goto(&authorize_url(&a, &client, &callback, &challenge))
        .await;
    provider_sign_in(&b, "ben").await;
    b.click("#approve").await;
    let q = tokio::time::timeout(Duration::from_secs(60), landed.recv())
        .await
        .expect("the browser reached the client's redirect URI")
        .unwrap();
    assert_eq!(q["state"], "client-state");
    assert_eq!(q["iss"], a.base);
    let (status, t) = token(
        &a,
        &[
            ("grant_type", "authorization_code"),
            ("client_id", &client),
            ("code", &q["code"]),
            ("code_verifier", &verifier),
            ("redirect_uri", &callback),
        ],
    )
    .await;
    assert_eq!(status, 200, "{t}");
    let access = t["access_token"].as_str().unwrap();
    assert_eq!(claims(access)["sub"], "upstream:ben");
    assert_eq!(claims(access)["groups"], json!(["mcp-users"]));
    let mut mcp = a.gw.client().with_token(access);
    mcp.initialize().await;
    let tools = mcp.result(2, "tools/list", json!({})).await;
    let names = tool_names(&tools);
    assert!(
        names.contains(&"fix__echo") && !names.iter().any(|n| n.starts_with("eng__")),
        "{names:?}"
    );
    let r = mcp
        .call(
            3,
            "tools/call",
            json!({"name": "eng__echo", "arguments": {"text": "x"}}),
        )
        .await;
    assert_eq!(r.status, 403);
    assert!(
        r.headers["www-authenticate"]
            .to_str()
            .unwrap()
            .contains("insufficient_scope")
    );
    assert_eq!(
        mcp.tool_text(4, "fix__echo", json!({"text": "ben here"}))
            .await,
        "ben here"
    );
    // The refresh token keeps his groups.
    let (status, refreshed) = refresh_with(&a, &client, t["refresh_token"].as_str().unwrap()).await;
    assert_eq!(status, 200, "{refreshed}");
    assert_eq!(
        claims(refreshed["access_token"].as_str().unwrap())["groups"],
        json!(["mcp-users"])
    );
}

#[tokio::test]
async fn the_leg_toward_the_provider_is_bound_to_the_pending_request_and_used_once() {
    let (provider, a) = start(None);
    let client = public_client(&a).await;
    let (verifier, challenge) = pkce();
    let r = open_authorize(
        &a,
        &[
            ("response_type", "code"),
            ("client_id", &client),
            ("redirect_uri", REDIRECT),
            ("code_challenge", &challenge),
            ("code_challenge_method", "S256"),
            ("state", "st-1"),
            ("scope", "mcp"),
        ],
    )
    .await;
    assert_eq!(r.status(), 303, "straight to the provider");
    let cookie = r.headers()["set-cookie"].to_str().unwrap();
    assert!(cookie.contains("HttpOnly"), "{cookie}");
    let cookie = cookie.split(';').next().unwrap().to_owned();
    let to_provider = r.headers()["location"].to_str().unwrap().to_owned();
    assert!(
        to_provider.starts_with(&provider.url("/auth?")),
        "{to_provider}"
    );
    let q: HashMap<String, String> = url::Url::parse(&to_provider)
        .unwrap()
        .query_pairs()
        .into_owned()
        .collect();
    assert_eq!(q["response_type"], "code");
    assert_eq!(q["client_id"], "gateway");
    assert_eq!(q["redirect_uri"], a.url("/authorize/upstream/callback"));
    assert_eq!(q["code_challenge_method"], "S256");
    assert!(
        q["code_challenge"].len() >= 43 && q["nonce"].len() >= 43,
        "{q:?}"
    );
    assert!(q["scope"].split(' ').any(|s| s == "openid"), "{q:?}");
    assert_ne!(q["code_challenge"], challenge, "PKCE of the gateway's own");

    let back = provider.through(&to_provider, "ann").await;
    assert!(
        back.starts_with(&a.url("/authorize/upstream/callback?")),
        "{back}"
    );
    let answer: HashMap<String, String> = url::Url::parse(&back)
        .unwrap()
        .query_pairs()
        .into_owned()
        .collect();
    assert_eq!(answer["state"], q["state"]);
    let get = |url: String, cookie: Option<&str>| {
        let mut r = http().get(url);
        if let Some(c) = cookie {
            r = r.header("cookie", c);
        }
        async move { r.send().await.unwrap() }
    };
    // Another browser (no cookie) cannot finish this sign-in; a state whose random part is
    // not the one sent is not this sign-in's. Neither uses it up.
    let r = get(back.clone(), None).await;
    assert_eq!(r.status(), 403);
    let forged = back.replace(&answer["state"], &format!("{}x", answer["state"]));
    let r = get(forged, Some(&cookie)).await;
    assert_eq!(r.status(), 400);
    assert!(
        r.text()
            .await
            .unwrap()
            .contains("does not belong to this sign-in")
    );
    // The browser that started it goes on to the consent page; once only.
    let r = get(back.clone(), Some(&cookie)).await;
    assert_eq!(r.status(), 200);
    let html = r.text().await.unwrap();
    assert!(
        html.contains("Allow access") && html.contains("Ann Example"),
        "{html}"
    );
    let r = get(back.clone(), Some(&cookie)).await;
    assert_eq!(r.status(), 400);
    assert!(r.text().await.unwrap().contains("already used"));
    let b = Browser {
        cookie,
        request: hidden(&html, "request"),
        csrf: hidden(&html, "csrf"),
    };
    let r = post_form(&a, &b, "/authorize/consent", &[("decision", "approve")]).await;
    let p = redirect_params(&r);
    assert_eq!(p["state"], "st-1");
    let (status, t) = exchange(&a, &client, &p["code"], &verifier).await;
    assert_eq!(status, 200, "{t}");
    assert_eq!(
        claims(t["access_token"].as_str().unwrap())["sub"],
        "upstream:ann"
    );

    // The person cancels at the provider: the client hears access_denied.
    let r = open_authorize(
        &a,
        &[
            ("response_type", "code"),
            ("client_id", &client),
            ("redirect_uri", REDIRECT),
            ("code_challenge", &challenge),
            ("code_challenge_method", "S256"),
            ("state", "st-2"),
        ],
    )
    .await;
    let cookie = r.headers()["set-cookie"].to_str().unwrap();
    let cookie = cookie.split(';').next().unwrap().to_owned();
    let q: HashMap<String, String> = url::Url::parse(r.headers()["location"].to_str().unwrap())
        .unwrap()
        .query_pairs()
        .into_owned()
        .collect();
    let mut cancelled = url::Url::parse(&a.url("/authorize/upstream/callback")).unwrap();
    cancelled
        .query_pairs_mut()
        .append_pair("error", "access_denied")
        .append_pair("state", &q["state"]);
    let r = get(cancelled.into(), Some(&cookie)).await;
    let p = redirect_params(&r);
    assert_eq!(p["error"], "access_denied");
    assert_eq!(p["state"], "st-2");
}

#[tokio::test]
async fn a_provider_that_cannot_be_used_is_named_on_a_page() {
    // An issuer where nothing answers, and a provider whose configuration names another
    // issuer than the one configured (the same provider, by another host name).
    let other = OidcProvider::start(json!({}));
    let renamed = other.issuer().replace("127.0.0.1", "localhost");
    let nowhere = format!("http://127.0.0.1:{}", free_port());
    for (issuer, logged) in [
        (nowhere.as_str(), "error sending request"),
        (renamed.as_str(), "names the issuer"),
    ] {
        let (_provider, a) = start(Some(issuer));
        a.gw.wait_log(logged).await;
        let client = public_client(&a).await;
        let (_, challenge) = pkce();
        let (status, page) = {
            let r = open_authorize(
                &a,
                &[
                    ("response_type", "code"),
                    ("client_id", &client),
                    ("redirect_uri", REDIRECT),
                    ("code_challenge", &challenge),
                    ("code_challenge_method", "S256"),
                ],
            )
            .await;
            (r.status().as_u16(), r.text().await.unwrap())
        };
        assert_eq!(status, 502, "{page}");
        assert!(
            page.contains("Test IdP") && page.contains("cannot be reached"),
            "{page}"
        );
        a.gw.wait_log("upstream sign-in cannot start").await;
    }
}

#[tokio::test]
async fn with_local_users_the_sign_in_page_offers_the_provider_too() {
    let [alice, ..] = hashes();
    let (provider, a) = start_with(
        None,
        &format!("[[auth.users]]\nname = \"alice\"\npassword_hash = \"{alice}\"\n"),
    );
    let client = public_client(&a).await;
    let (verifier, challenge) = pkce();
    let b = login_page(&a, &client, &challenge, "st-3", "mcp").await;
    let r = post_form(&a, &b, "/authorize/upstream", &[]).await;
    assert_eq!(r.status(), 303);
    let to_provider = r.headers()["location"].to_str().unwrap().to_owned();
    assert!(
        to_provider.starts_with(&provider.url("/auth?")),
        "{to_provider}"
    );
    let back = provider.through(&to_provider, "ben").await;
    let r = http()
        .get(&back)
        .header("cookie", &b.cookie)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    assert!(r.text().await.unwrap().contains("Ben Example"));
    let r = post_form(&a, &b, "/authorize/consent", &[("decision", "approve")]).await;
    let p = redirect_params(&r);
    let (status, t) = exchange(&a, &client, &p["code"], &verifier).await;
    assert_eq!(status, 200, "{t}");
    assert_eq!(
        claims(t["access_token"].as_str().unwrap())["sub"],
        "upstream:ben"
    );
    // The local user still signs in with a password, on the same page.
    let code = authorize(&a, &client, &challenge, "alice", "mcp").await;
    let (status, t) = exchange(&a, &client, &code, &verifier).await;
    assert_eq!(status, 200, "{t}");
    assert_eq!(claims(t["access_token"].as_str().unwrap())["sub"], "alice");
}
