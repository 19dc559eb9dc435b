//! People's `oauth2` credentials (issue 41) against a real authorization server: a second
//! `oidc-provider` plays the service behind a plugin. A person connects through the
//! gateway's connect page and the service's own sign-in (state, PKCE, the browser's cookie);
//! their process gets their own token; the gateway refreshes it before its end (the refresh
//! token rotated), replaces the process, asks again when the service refuses a refresh, and
//! revokes the token at the service (RFC 7009) when it is disconnected. A database file and
//! the logs hold no token.

mod common;

use std::time::Duration;

use common::credentials::{Page, form, gateway_with_credentials, json_call, token};
use common::oauth::ADMIN_TOKEN;
use common::oidc::OidcProvider;
use common::{FIXTURE, free_port};
use mcp_gateway::config::CredentialKeys;
use mcp_gateway::credentials::Sealer;
use mcp_gateway::database::Database;
use serde_json::{Value, json};

const KEY: u8 = 0x5e;
const CLIENT: (&str, &str) = ("gw", "gw-secret");

/// The service's authorization server: the gateway's client there, and its people (`ann`,
/// `ben`), its access tokens good for `ttl` seconds, its refresh tokens rotated.
fn service(base: &str, ttl: u64) -> OidcProvider {
    OidcProvider::start(json!({
        "clients": [{
            "client_id": CLIENT.0,
            "client_secret": CLIENT.1,
            "grant_types": ["authorization_code", "refresh_token"],
            "response_types": ["code"],
            "redirect_uris": [format!("{base}/connect/callback")],
            "token_endpoint_auth_method": "client_secret_basic",
            "access_token_format": "opaque",
        }],
        "accounts": [
            {"sub": "ann", "password": "ann-pw"},
            {"sub": "ben", "password": "ben-pw"},
        ],
        "access_token_ttl": ttl,
        "refresh_tokens": true,
        "rotate_refresh": true,
    }))
}

/// The value `subject`'s credential `svc` holds now, opened as the gateway would.
async fn stored(db: &str, subject: &str) -> Option<Value> {
    let database = Database::connect(db).await.unwrap();
    let row = database
        .credential_store()
        .get(subject, "svc")
        .await
        .unwrap()?;
    let sealer = Sealer::new(&CredentialKeys {
        current: Some([KEY; 32]),
        previous: Vec::new(),
    });
    let opened = sealer.open(subject, "svc", &row.sealed).unwrap();
    Some(serde_json::from_slice(&opened.plain).unwrap())
}

/// The service (its tokens good for `ttl` seconds) and a gateway whose plugin `fix` is started
/// with the caller's credential `svc` from it; the directory holding the client secret.
fn oauth_gateway(ttl: u64) -> (OidcProvider, common::oauth::AuthGateway, tempfile::TempDir) {
    let port = free_port();
    let provider = service(&format!("http://127.0.0.1:{port}"), ttl);
    let secrets = tempfile::tempdir().unwrap();
    let secret_file = secrets.path().join("client-secret");
    std::fs::write(&secret_file, CLIENT.1).unwrap();
    let credentials = format!(
        "[credentials.svc]\nkind = \"oauth2\"\nlabel = \"Test service\"\nissuer = \"{}\"\n\
         client_id = \"{}\"\nclient_secret_file = \"{}\"\nscopes = [\"openid\"]\n",
        provider.issuer(),
        CLIENT.0,
        secret_file.display()
    );
    let plugins = format!(
        "[plugins.fix]\ncommand = \"{FIXTURE}\"\nenv = {{ TOKEN = \"${{credential:svc}}\" }}\n"
    );
    let a = gateway_with_credentials(KEY, port, &credentials, &plugins);
    (provider, a, secrets)
}

#[tokio::test]
async fn an_oauth_credential_is_connected_at_its_service_refreshed_and_revoked() {
    let (provider, a, _secrets) = oauth_gateway(9);
    let base = a.base.clone();
    let getenv = json_call("TOKEN");
    let mut alice = a.gw.client().with_token(&token(&a, "alice").await);
    alice.initialize().await;
    let reply = alice.call(2, "tools/call", getenv.clone()).await;
    let error = &reply.last()["error"];
    assert_eq!(error["code"], -32042, "{reply:?}");
    let link = error["data"]["elicitations"][0]["url"]
        .as_str()
        .unwrap()
        .to_owned();

    let http = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .unwrap();
    // Signed in on the gateway's page as the link's subject: on to the service, with the
    // flow bound to this browser by a cookie the service's redirect back carries.
    let page = Page::open(&http, &link).await;
    assert!(page.cookie.starts_with("mcpgw-connect="));
    let r = page
        .post(&http, "alice", "alice-pw", "")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 303, "{}", r.text().await.unwrap());
    let to_service = r.headers()["location"].to_str().unwrap().to_owned();
    assert!(to_service.starts_with(provider.issuer()), "{to_service}");
    let authorize = url::Url::parse(&to_service).unwrap();
    let q: std::collections::HashMap<_, _> = authorize.query_pairs().into_owned().collect();
    assert_eq!(q["code_challenge_method"], "S256");
    assert_eq!(q["redirect_uri"], format!("{base}/connect/callback"));
    let set = r.headers()["set-cookie"].to_str().unwrap().to_owned();
    assert!(
        set.contains("SameSite=Lax") && set.contains("HttpOnly"),
        "{set}"
    );
    let flow = set.split(';').next().unwrap().to_owned();
    assert!(flow.starts_with("mcpgw-oauth="), "{flow}");

    // The service sends the person back; only this browser's cookie and the state it was
    // sent with finish it.
    let back = provider.through(&to_service, "ann").await;
    assert!(
        back.starts_with(&format!("{base}/connect/callback?")),
        "{back}"
    );
    let callback = |url: String, cookie: Option<String>| {
        let mut r = http.get(url);
        if let Some(c) = cookie {
            r = r.header("cookie", c);
        }
        r.send()
    };
    let r = callback(back.clone(), None).await.unwrap();
    assert_eq!(r.status(), 403);
    let mut other_state = url::Url::parse(&back).unwrap();
    let code = other_state
        .query_pairs()
        .find(|(k, _)| k == "code")
        .unwrap()
        .1
        .into_owned();
    other_state
        .query_pairs_mut()
        .clear()
        .append_pair("code", &code)
        .append_pair("state", "another-state");
    let r = callback(other_state.to_string(), Some(flow.clone()))
        .await
        .unwrap();
    assert_eq!(r.status(), 403);
    assert!(r.text().await.unwrap().contains("id=\"mismatch\""));
    assert!(stored(&a.db, "alice").await.is_none(), "nothing stored");
    // The right state, but another server's name (RFC 9207): a mix-up, refused.
    let mut mixed = url::Url::parse(&back).unwrap();
    let pairs: Vec<(String, String)> = mixed
        .query_pairs()
        .filter(|(k, _)| k != "iss")
        .map(|(k, v)| (k.into_owned(), v.into_owned()))
        .collect();
    mixed
        .query_pairs_mut()
        .clear()
        .extend_pairs(pairs)
        .append_pair("iss", "https://another-server.example");
    let r = callback(mixed.to_string(), Some(flow.clone()))
        .await
        .unwrap();
    assert_eq!(r.status(), 403);
    assert!(stored(&a.db, "alice").await.is_none(), "nothing stored");
    let r = callback(back.clone(), Some(flow.clone())).await.unwrap();
    assert_eq!(r.status(), 200);
    let cleared = r.headers()["set-cookie"].to_str().unwrap().to_owned();
    assert!(cleared.contains("Max-Age=0"), "{cleared}");
    assert!(r.text().await.unwrap().contains("id=\"connected\""));
    // Replayed: the link is used.
    let r = callback(back.clone(), Some(flow.clone())).await.unwrap();
    assert_eq!(r.status(), 404);

    // Alice's process acts as ann at the service.
    let first = stored(&a.db, "alice").await.unwrap();
    let got = alice.result(3, "tools/call", getenv.clone()).await;
    let used = got["content"][0]["text"].as_str().unwrap().to_owned();
    let seen = provider.introspect(CLIENT, &used).await;
    assert_eq!(
        (seen["active"].clone(), seen["sub"].clone()),
        (json!(true), json!("ann")),
        "{seen}"
    );
    let first_refresh = first["refresh_token"].as_str().unwrap().to_owned();

    // Bob connects as ben through the connect page too: his process has his own token.
    let mut bob = a.gw.client().with_token(&token(&a, "bob").await);
    bob.initialize().await;
    let reply = bob.call(2, "tools/call", getenv.clone()).await;
    let link = reply.last()["error"]["data"]["elicitations"][0]["url"]
        .as_str()
        .unwrap()
        .to_owned();
    let page = Page::open(&http, &link).await;
    let r = http
        .post(&page.link)
        .header("cookie", &page.cookie)
        .form(&form(&page.csrf, "bob", "bob-pw", ""))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 303);
    let flow_b = r.headers()["set-cookie"]
        .to_str()
        .unwrap()
        .split(';')
        .next()
        .unwrap()
        .to_owned();
    let back_b = provider
        .through(r.headers()["location"].to_str().unwrap(), "ben")
        .await;
    assert_eq!(callback(back_b, Some(flow_b)).await.unwrap().status(), 200);
    let got = bob.result(3, "tools/call", getenv.clone()).await;
    let bobs = got["content"][0]["text"].as_str().unwrap().to_owned();
    assert_eq!(provider.introspect(CLIENT, &bobs).await["sub"], "ben");
    assert_ne!(bobs, used);

    // Before the 9 s token ends, the gateway refreshes it (the refresh token rotated) and
    // replaces the idle process: its next call has the new token.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    let mut id = 10;
    let now_used = loop {
        id += 1;
        let got = alice.result(id, "tools/call", getenv.clone()).await;
        let now = got["content"][0]["text"].as_str().unwrap().to_owned();
        if now != used {
            break now;
        }
        assert!(tokio::time::Instant::now() < deadline, "never refreshed");
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    let seen = provider.introspect(CLIENT, &now_used).await;
    assert_eq!(seen["sub"], "ann", "{seen}");
    let refreshed = stored(&a.db, "alice").await.unwrap();
    assert_ne!(
        refreshed["refresh_token"], first["refresh_token"],
        "rotated"
    );
    assert_eq!(
        provider.introspect(CLIENT, &first_refresh).await["active"],
        false
    );

    // The service revokes ann's grant: the next refresh is refused, the value forgotten, the
    // process stopped, and the next call asks again.
    let mut revoked: Vec<String> = Vec::new();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    // Revoked again if a refresh rotated it meanwhile.
    while let Some(v) = stored(&a.db, "alice").await {
        let current = v["refresh_token"].as_str().unwrap().to_owned();
        if !revoked.contains(&current) {
            provider.revoke(CLIENT, &current).await;
            revoked.push(current);
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the refused refresh never forgot it"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let reply = alice.call(40, "tools/call", getenv.clone()).await;
    assert_eq!(reply.last()["error"]["code"], -32042, "{reply:?}");
    let admin = common::Admin::of(&a.gw, ADMIN_TOKEN);
    let (_, audit) = admin.get("/admin/audit?kind=credential").await;
    assert!(
        audit["records"]
            .as_array()
            .unwrap()
            .iter()
            .any(|r| r["subject"] == "alice"
                && r["target"].as_str().unwrap_or_default().contains("refresh")),
        "{audit}"
    );

    // The operator revokes bob's: revoked at the service too (RFC 7009).
    let bobs_value = stored(&a.db, "bob").await.unwrap();
    let bobs_refresh = bobs_value["refresh_token"].as_str().unwrap().to_owned();
    assert_eq!(
        provider.introspect(CLIENT, &bobs_refresh).await["active"],
        true
    );
    assert_eq!(
        admin.delete("/admin/credentials/svc/connections/bob").await,
        200
    );
    // Revoked at the service too, in the background.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(15);
    while provider.introspect(CLIENT, &bobs_refresh).await["active"] != false {
        assert!(
            tokio::time::Instant::now() < deadline,
            "never revoked at the service"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let reply = bob.call(41, "tools/call", getenv.clone()).await;
    assert_eq!(reply.last()["error"]["code"], -32042, "{reply:?}");

    // No token in the database file or the log, byte for byte.
    let log = a.gw.log();
    let mut file = std::fs::read(a.dir.path().join("gw.db")).unwrap();
    file.extend(std::fs::read(a.dir.path().join("gw.db-wal")).unwrap_or_default());
    let mut secrets = vec![&used, &now_used, &bobs, &first_refresh, &bobs_refresh];
    secrets.extend(revoked.iter());
    for secret in secrets {
        assert!(!log.contains(secret.as_str()), "a token in the log");
        assert!(
            !file.windows(secret.len()).any(|w| w == secret.as_bytes()),
            "a token in the database file"
        );
    }
    assert!(!log.contains(CLIENT.1));
}

/// The gateway of `config` (written in `dir`, its SQLite database there too) on `port`.
fn gateway_on(port: u16, dir: tempfile::TempDir, config: &str) -> common::oauth::AuthGateway {
    let path = common::write_config(&dir, config);
    let db = format!("sqlite://{}/gw.db?mode=rwc", dir.path().display());
    let gw = common::Gateway::start(&[
        "--listen",
        &format!("127.0.0.1:{port}"),
        "--config",
        &path,
        "--database-url",
        &db,
    ]);
    common::oauth::AuthGateway {
        gw,
        base: format!("http://127.0.0.1:{port}"),
        db,
        dir,
    }
}

/// The payload of a JWT.
fn claims(jwt: &str) -> Value {
    use base64::Engine as _;
    let part = jwt.split('.').nth(1).unwrap();
    let bytes = base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(part)
        .unwrap();
    serde_json::from_slice(&bytes).unwrap()
}

/// `token_exchange` in mode `external`: each caller's own access token is exchanged at the
/// organisation's authorization server (RFC 8693) for one with the configured audience,
/// which their process is started with; no page is involved. An audience the server will
/// not exchange for is an error naming the credential, and reaches no plugin.
#[tokio::test]
async fn a_caller_s_token_is_exchanged_for_one_with_the_credential_s_audience() {
    const EXCHANGER: (&str, &str) = ("gw-exchange", "exchange-secret");
    let provider = OidcProvider::start(json!({
        "clients": [
            {"client_id": "robot-a", "client_secret": "a-secret",
             "grant_types": ["client_credentials"], "scope": "mcp"},
            {"client_id": "robot-b", "client_secret": "b-secret",
             "grant_types": ["client_credentials"], "scope": "mcp"},
            {"client_id": EXCHANGER.0, "client_secret": EXCHANGER.1,
             "grant_types": ["urn:ietf:params:oauth:grant-type:token-exchange"]},
        ],
        "exchange_audiences": ["https://api.example.com"],
    }));
    let dir = tempfile::tempdir().unwrap();
    let secret_file = dir.path().join("exchange-secret");
    std::fs::write(&secret_file, EXCHANGER.1).unwrap();
    let key_file = dir.path().join("credentials.key");
    std::fs::write(&key_file, "7a".repeat(32)).unwrap();
    let port = free_port();
    let base = format!("http://127.0.0.1:{port}");
    let exchange = |name: &str, audience: &str| {
        format!(
            "[credentials.{name}]\nkind = \"token_exchange\"\nissuer = \"{}\"\n\
             client_id = \"{}\"\nclient_secret_file = \"{}\"\naudience = \"{audience}\"\n\
             scopes = [\"read\"]\n",
            provider.issuer(),
            EXCHANGER.0,
            secret_file.display()
        )
    };
    let config = format!(
        "[auth]\nmode = \"external\"\npublic_url = \"{base}/mcp\"\nissuer = \"{}\"\n\
         [credentials]\nkey_file = \"{}\"\n{}{}\
         [plugins.api]\ncommand = \"{FIXTURE}\"\nenv = {{ TOKEN = \"${{credential:api}}\" }}\n\
         [plugins.other]\ncommand = \"{FIXTURE}\"\nenv = {{ TOKEN = \"${{credential:other}}\" }}\n",
        provider.issuer(),
        key_file.display(),
        exchange("api", "https://api.example.com"),
        exchange("other", "https://not-exchanged.example.com"),
    );
    let a = gateway_on(port, dir, &config);
    let gw = &a.gw;
    let resource = format!("{base}/mcp");
    let call =
        |tool: &str| json!({"name": format!("{tool}__getenv"), "arguments": {"name": "TOKEN"}});

    let mut seen = Vec::new();
    for (robot, secret) in [("robot-a", "a-secret"), ("robot-b", "b-secret")] {
        let caller = provider
            .access_token((robot, secret), "mcp", &resource)
            .await;
        let mut client = gw.client().with_token(&caller);
        client.initialize().await;
        let got = client.result(2, "tools/call", call("api")).await;
        let token = got["content"][0]["text"].as_str().unwrap().to_owned();
        assert_ne!(
            token, caller,
            "the caller's own token never reaches a plugin"
        );
        let c = claims(&token);
        assert_eq!(c["aud"], "https://api.example.com", "{c}");
        assert_eq!(c["sub"], robot, "{c}");
        assert_eq!(c["act"]["sub"], EXCHANGER.0, "{c}");
        assert_eq!(c["scope"], "read", "{c}");
        // Refused: an error that names the credential, and no process.
        let reply = client.call(3, "tools/call", call("other")).await;
        let error = &reply.last()["error"];
        let text = error.to_string();
        assert!(
            text.contains("credential `other`") && text.contains("refused to exchange"),
            "{reply:?}"
        );
        seen.push((caller, token));
    }
    assert_ne!(seen[0].1, seen[1].1);
    // A 2026-07-28 call of the same caller gets its exchanged token too.
    let caller = provider
        .access_token(("robot-a", "a-secret"), "mcp", &resource)
        .await;
    let modern = common::modern::Modern::new(gw.client().with_token(&caller), json!({}));
    let got = modern
        .call(1, "api__getenv", json!({"name": "TOKEN"}))
        .await;
    let token = got.message["result"]["content"][0]["text"]
        .as_str()
        .unwrap_or_else(|| panic!("{}", got.message))
        .to_owned();
    assert_eq!(claims(&token)["sub"], "robot-a");
    // Neither the callers' tokens nor the exchanged ones are in the log.
    let log = gw.log();
    for (caller, token) in &seen {
        assert!(!log.contains(caller.as_str()) && !log.contains(token.as_str()));
    }
    assert!(!log.contains(EXCHANGER.1));
}

/// The whole connect flow of an `oauth2` credential in a real browser (Debian's chromium
/// through chromedriver): the gateway's page and sign-in, the service's login page, back to
/// the gateway's callback, "Connected"; the call then runs with the person's token.
#[tokio::test]
async fn a_person_connects_an_oauth_credential_in_a_real_browser() {
    use common::browser::Browserdriver;
    let (provider, a, _secrets) = oauth_gateway(300);
    let getenv = json_call("TOKEN");
    let mut alice = a.gw.client().with_token(&token(&a, "alice").await);
    alice.initialize().await;
    let reply = alice.call(2, "tools/call", getenv.clone()).await;
    let link = reply.last()["error"]["data"]["elicitations"][0]["url"]
        .as_str()
        .unwrap()
        .to_owned();

    let b = Browserdriver::start().await;
    b.goto(&link).await;
    b.type_into("#username", "alice").await;
    b.type_into("#password", "alice-pw").await;
    b.click("button[type=submit]").await;
    // The service's own login page.
    b.type_into("#login", "ann").await;
    b.type_into("#password", "ann-pw").await;
    b.click("#submit").await;
    b.find("#connected").await;
    let connected = b
        .eval("return document.getElementById('connected').innerText")
        .await;
    assert!(
        connected
            .as_str()
            .unwrap_or_default()
            .contains("Test service"),
        "{connected}"
    );

    let got = alice.result(3, "tools/call", getenv).await;
    let used = got["content"][0]["text"].as_str().unwrap().to_owned();
    let seen = provider.introspect(CLIENT, &used).await;
    assert_eq!(
        (seen["active"].clone(), seen["sub"].clone()),
        (json!(true), json!("ann")),
        "{seen}"
    );
}

/// The value of the hidden field `name` in a page.
fn field(html: &str, name: &str) -> String {
    let needle = format!("name=\"{name}\" value=\"");
    let at = html
        .find(&needle)
        .unwrap_or_else(|| panic!("no {name} in {html}"))
        + needle.len();
    html[at..at + html[at..].find('"').unwrap()].to_owned()
}

/// The first cookie a response sets, as `name=value`.
fn set_cookie(r: &reqwest::Response) -> String {
    r.headers()["set-cookie"]
        .to_str()
        .unwrap()
        .split(';')
        .next()
        .unwrap()
        .to_owned()
}

/// People sign in on the credential pages at the `[auth.upstream]` provider: the connect
/// page keeps the value only for the person the link was made for (`upstream:<sub>`, as
/// their tokens name them), and the connections page lists theirs. A sign-in answer
/// without this browser's cookie, or with another state, stores nothing.
#[tokio::test]
async fn people_sign_in_on_the_pages_at_the_upstream_provider() {
    let port = free_port();
    let base = format!("http://127.0.0.1:{port}");
    let provider = OidcProvider::start(json!({
        "clients": [{
            "client_id": CLIENT.0,
            "client_secret": CLIENT.1,
            "grant_types": ["authorization_code"],
            "response_types": ["code"],
            "redirect_uris": [
                format!("{base}/authorize/upstream/callback"),
                format!("{base}/connect/signin/callback"),
            ],
            "token_endpoint_auth_method": "client_secret_basic",
        }],
        "accounts": [
            {"sub": "ann", "password": "ann-pw", "email": "ann@example.com"},
            {"sub": "ben", "password": "ben-pw"},
        ],
    }));
    let secrets = tempfile::tempdir().unwrap();
    let secret_file = secrets.path().join("client-secret");
    std::fs::write(&secret_file, CLIENT.1).unwrap();
    let credentials = "[credentials.tok]\nkind = \"secret\"\nlabel = \"Service token\"\n";
    let rest = format!(
        "[auth.upstream]\nissuer = \"{}\"\nclient_id = \"{}\"\nclient_secret_file = \"{}\"\n\
         display_name = \"Test IdP\"\n\
         [plugins.fix]\ncommand = \"{FIXTURE}\"\nenv = {{ TOKEN = \"${{credential:tok}}\" }}\n",
        provider.issuer(),
        CLIENT.0,
        secret_file.display()
    );
    let a = gateway_with_credentials(KEY, port, credentials, &rest);
    let (broker, _db) = common::credentials::broker_of(&a, KEY).await;
    let http = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .unwrap();

    // The page offers the provider beside the local users' form.
    let asked = broker.request("upstream:ann", "tok").await.unwrap();
    let page = Page::open(&http, &asked.url).await;
    let opened = http
        .get(&asked.url)
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(opened.contains("Sign in with Test IdP"), "{opened}");
    let leave = |page: &Page| {
        http.post(format!("{}/signin", page.link))
            .header("cookie", &page.cookie)
            .form(&[("csrf", page.csrf.as_str())])
            .send()
    };
    // Without the page's cookie: refused.
    let r = http
        .post(format!("{}/signin", asked.url))
        .form(&[("csrf", page.csrf.as_str())])
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 403);
    let r = leave(&page).await.unwrap();
    assert_eq!(r.status(), 303);
    let flow = set_cookie(&r);
    assert!(flow.starts_with("mcpgw-signin="), "{flow}");
    let to_provider = r.headers()["location"].to_str().unwrap().to_owned();
    assert!(to_provider.starts_with(provider.issuer()), "{to_provider}");
    let back = provider.through(&to_provider, "ann").await;
    assert!(
        back.starts_with(&format!("{base}/connect/signin/callback?")),
        "{back}"
    );
    // Another browser (no cookie), and another state: refused.
    assert_eq!(http.get(&back).send().await.unwrap().status(), 403);
    let mut forged = url::Url::parse(&back).unwrap();
    let code = forged
        .query_pairs()
        .find(|(k, _)| k == "code")
        .unwrap()
        .1
        .into_owned();
    forged
        .query_pairs_mut()
        .clear()
        .append_pair("code", &code)
        .append_pair("state", "not-the-state");
    let r = http
        .get(forged.as_str())
        .header("cookie", &flow)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 403);
    let r = http
        .get(&back)
        .header("cookie", &flow)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let form_cookie = set_cookie(&r);
    let html = r.text().await.unwrap();
    let (grant, csrf) = (field(&html, "grant"), field(&html, "csrf"));
    let r = http
        .post(&asked.url)
        .header("cookie", &form_cookie)
        .form(&[
            ("csrf", csrf.as_str()),
            ("grant", grant.as_str()),
            ("value", "ann-secret-1"),
        ])
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    assert!(r.text().await.unwrap().contains("id=\"connected\""));
    assert_eq!(
        broker
            .value("upstream:ann", "tok")
            .await
            .unwrap()
            .unwrap()
            .value,
        "ann-secret-1"
    );

    // Ann signed in on a link made for ben: refused, nothing kept.
    let bens = broker.request("upstream:ben", "tok").await.unwrap();
    let page = Page::open(&http, &bens.url).await;
    let r = leave(&page).await.unwrap();
    let flow = set_cookie(&r);
    let back = provider
        .through(r.headers()["location"].to_str().unwrap(), "ann")
        .await;
    let r = http
        .get(&back)
        .header("cookie", &flow)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 403);
    assert!(r.text().await.unwrap().contains("id=\"another\""));
    assert!(broker.value("upstream:ben", "tok").await.unwrap().is_none());

    // The connections page, signed in at the provider: ann's own list.
    let r = http
        .get(format!("{base}/connections"))
        .send()
        .await
        .unwrap();
    let cookie = set_cookie(&r);
    let html = r.text().await.unwrap();
    let csrf = field(&html, "csrf");
    let r = http
        .post(format!("{base}/connections/signin"))
        .header("cookie", &cookie)
        .form(&[("csrf", csrf.as_str())])
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 303);
    let flow = set_cookie(&r);
    let back = provider
        .through(r.headers()["location"].to_str().unwrap(), "ann")
        .await;
    let r = http
        .get(&back)
        .header("cookie", &flow)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let html = r.text().await.unwrap();
    assert!(html.contains("Signed in as upstream:ann"), "{html}");
    assert!(html.contains("id=\"credential-tok\""), "{html}");
    assert!(!html.contains("ann-secret-1"));
}

/// In mode `external` the pages sign in at the issuer itself (`[auth.upstream]` naming it):
/// a person is the `sub` its tokens carry, so a link made for `ann` is hers to use.
#[tokio::test]
async fn in_external_mode_the_pages_sign_in_at_the_issuer() {
    let port = free_port();
    let base = format!("http://127.0.0.1:{port}");
    let provider = OidcProvider::start(json!({
        "clients": [{
            "client_id": CLIENT.0,
            "client_secret": CLIENT.1,
            "grant_types": ["authorization_code"],
            "response_types": ["code"],
            "redirect_uris": [format!("{base}/connect/signin/callback")],
            "token_endpoint_auth_method": "client_secret_basic",
        }],
        "accounts": [{"sub": "ann", "password": "ann-pw"}],
    }));
    let dir = tempfile::tempdir().unwrap();
    let secret_file = dir.path().join("client-secret");
    std::fs::write(&secret_file, CLIENT.1).unwrap();
    let key_file = dir.path().join("credentials.key");
    std::fs::write(&key_file, format!("{KEY:02x}").repeat(32)).unwrap();
    let config = format!(
        "[auth]\nmode = \"external\"\npublic_url = \"{base}/mcp\"\nissuer = \"{issuer}\"\n\
         [auth.upstream]\nissuer = \"{issuer}\"\nclient_id = \"{}\"\nclient_secret_file = \"{}\"\n\
         [credentials]\nkey_file = \"{}\"\n\
         [credentials.tok]\nkind = \"secret\"\n\
         [plugins.fix]\ncommand = \"{FIXTURE}\"\nenv = {{ TOKEN = \"${{credential:tok}}\" }}\n",
        CLIENT.0,
        secret_file.display(),
        key_file.display(),
        issuer = provider.issuer(),
    );
    let a = gateway_on(port, dir, &config);
    let (broker, _db) = common::credentials::broker_of(&a, KEY).await;
    let http = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .unwrap();
    let asked = broker.request("ann", "tok").await.unwrap();
    let page = Page::open(&http, &asked.url).await;
    let r = http
        .post(format!("{}/signin", page.link))
        .header("cookie", &page.cookie)
        .form(&[("csrf", page.csrf.as_str())])
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 303);
    let flow = set_cookie(&r);
    let back = provider
        .through(r.headers()["location"].to_str().unwrap(), "ann")
        .await;
    let r = http
        .get(&back)
        .header("cookie", &flow)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let form_cookie = set_cookie(&r);
    let html = r.text().await.unwrap();
    let r = http
        .post(&asked.url)
        .header("cookie", &form_cookie)
        .form(&[
            ("csrf", field(&html, "csrf").as_str()),
            ("grant", field(&html, "grant").as_str()),
            ("value", "ann-external-1"),
        ])
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    assert_eq!(
        broker.value("ann", "tok").await.unwrap().unwrap().value,
        "ann-external-1"
    );
}

/// `token_exchange` in built-in mode: the access token a person's sign-in at the
/// `[auth.upstream]` provider gave (kept sealed by the gateway) is exchanged for one with the
/// credential's audience when their instance starts.
#[tokio::test]
async fn the_upstream_sign_in_s_token_is_exchanged_in_built_in_mode() {
    use common::oauth::{
        Browser, REDIRECT, exchange, hidden, open_authorize, pkce, post_form, public_client,
        redirect_params,
    };
    const EXCHANGER: (&str, &str) = ("gw-exchange", "exchange-secret");
    let port = free_port();
    let base = format!("http://127.0.0.1:{port}");
    let provider = OidcProvider::start(json!({
        "clients": [
            {"client_id": CLIENT.0, "client_secret": CLIENT.1,
             "grant_types": ["authorization_code"], "response_types": ["code"],
             "redirect_uris": [format!("{base}/authorize/upstream/callback")],
             "token_endpoint_auth_method": "client_secret_basic"},
            {"client_id": EXCHANGER.0, "client_secret": EXCHANGER.1,
             "grant_types": ["urn:ietf:params:oauth:grant-type:token-exchange"]},
        ],
        "accounts": [{"sub": "ann", "password": "ann-pw", "name": "Ann Example"}],
        "exchange_audiences": ["https://api.example.com"],
    }));
    let dir = tempfile::tempdir().unwrap();
    let write = |name: &str, text: &str| {
        let p = dir.path().join(name);
        std::fs::write(&p, text).unwrap();
        p.display().to_string()
    };
    let (upstream_secret, exchange_secret) = (
        write("upstream-secret", CLIENT.1),
        write("exchange-secret", EXCHANGER.1),
    );
    let key_file = write("credentials.key", &"4f".repeat(32));
    let config = format!(
        "[auth]\nmode = \"builtin\"\npublic_url = \"{base}/mcp\"\n\
         [auth.upstream]\nissuer = \"{issuer}\"\nclient_id = \"{}\"\nclient_secret_file = \"{upstream_secret}\"\n\
         [credentials]\nkey_file = \"{key_file}\"\n\
         [credentials.api]\nkind = \"token_exchange\"\nissuer = \"{issuer}\"\nclient_id = \"{}\"\n\
         client_secret_file = \"{exchange_secret}\"\naudience = \"https://api.example.com\"\n\
         [plugins.fix]\ncommand = \"{FIXTURE}\"\nenv = {{ TOKEN = \"${{credential:api}}\" }}\n",
        CLIENT.0,
        EXCHANGER.0,
        issuer = provider.issuer(),
    );
    let a = gateway_on(port, dir, &config);

    // Ann signs in at the provider for an MCP client of the gateway's.
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
            ("state", "st"),
            ("scope", "mcp"),
        ],
    )
    .await;
    assert_eq!(r.status(), 303);
    let cookie = set_cookie(&r);
    let back = provider
        .through(r.headers()["location"].to_str().unwrap(), "ann")
        .await;
    let r = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .unwrap()
        .get(&back)
        .header("cookie", &cookie)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let html = r.text().await.unwrap();
    let b = Browser {
        cookie,
        request: hidden(&html, "request"),
        csrf: hidden(&html, "csrf"),
    };
    let r = post_form(&a, &b, "/authorize/consent", &[("decision", "approve")]).await;
    let p = redirect_params(&r);
    let (status, t) = exchange(&a, &client, &p["code"], &verifier).await;
    assert_eq!(status, 200, "{t}");
    let gateway_token = t["access_token"].as_str().unwrap().to_owned();

    // Her instance is started with the provider's token exchanged for the API's audience.
    let mut ann = a.gw.client().with_token(&gateway_token);
    ann.initialize().await;
    let got = ann.result(2, "tools/call", json_call("TOKEN")).await;
    let exchanged = got["content"][0]["text"].as_str().unwrap().to_owned();
    let c = claims(&exchanged);
    assert_eq!(c["aud"], "https://api.example.com", "{c}");
    assert_eq!(c["sub"], "ann", "{c}");
    assert_eq!(c["act"]["sub"], EXCHANGER.0, "{c}");
    assert_ne!(exchanged, gateway_token);
    let log = a.gw.log();
    assert!(!log.contains(&exchanged) && !log.contains(&gateway_token));
}
