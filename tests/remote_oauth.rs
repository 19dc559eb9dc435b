//! A remote plugin behind OAuth (issue 42): the gateway in front of another instance of
//! itself in `auth.mode = "builtin"`, as an MCP client that finds the upstream's
//! authorization server through its protected resource metadata, registers itself there (by
//! a client ID metadata document it serves, or by dynamic registration), and gets each
//! person's own token through the connect flow (PKCE, `resource` = the upstream), refreshing
//! it. The client's own token to the front gateway never goes upstream.

mod common;

use common::credentials::{connect_at_service, gateway_with_credentials, token};
use common::free_port;
use common::oauth::{AuthGateway, hidden};
use serde_json::json;

/// Through the upstream gateway's sign-in and consent pages as `user`, from the authorization
/// URL the front gateway sent the person to: where the upstream sends them back.
async fn through(b: &AuthGateway, authorize: &str, user: &str) -> String {
    let http = common::oauth::http();
    let r = http.get(authorize).send().await.unwrap();
    assert_eq!(r.status(), 200, "{authorize}");
    let cookie = r.headers()["set-cookie"].to_str().unwrap();
    let cookie = cookie.split(';').next().unwrap().to_owned();
    let html = r.text().await.unwrap();
    let (request, csrf) = (hidden(&html, "request"), hidden(&html, "csrf"));
    let post = |path: &str, fields: Vec<(&str, String)>| {
        let mut form = vec![("request", request.clone()), ("csrf", csrf.clone())];
        form.extend(fields);
        http.post(b.url(path))
            .header("cookie", &cookie)
            .form(&form)
            .send()
    };
    let pw = format!("{user}-pw");
    let r = post(
        "/authorize/login",
        vec![("username", user.into()), ("password", pw)],
    )
    .await
    .unwrap();
    let r = if r.status() == 200 {
        post("/authorize/consent", vec![("decision", "approve".into())])
            .await
            .unwrap()
    } else {
        r
    };
    assert_eq!(r.status(), 303);
    r.headers()["location"].to_str().unwrap().to_owned()
}

/// Connects `user`'s credential at the front gateway `a` (whose call answered with `link`),
/// signing in at the upstream `b` as `upstream_user`: the authorization URL the front gateway
/// used.
async fn connect(
    a: &AuthGateway,
    b: &AuthGateway,
    link: &str,
    user: &str,
    upstream_user: &str,
) -> url::Url {
    let http = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .unwrap();
    let (to_upstream, flow) = connect_at_service(&http, link, user).await;
    assert!(
        to_upstream.starts_with(&b.url("/authorize")),
        "{to_upstream}"
    );
    let back = through(b, &to_upstream, upstream_user).await;
    assert!(back.starts_with(&a.url("/connect/callback")), "{back}");
    let r = http.get(&back).header("cookie", flow).send().await.unwrap();
    let status = r.status();
    let text = r.text().await.unwrap();
    assert_eq!(status, 200, "{text}");
    assert!(text.contains("id=\"connected\""), "{text}");
    url::Url::parse(&to_upstream).unwrap()
}

async fn the_front_gateway_gets_each_person_their_own_upstream_token(registration: &str) {
    // The upstream: the gateway in built-in mode, fetching client metadata documents from
    // loopback (a test's; in production they are https on global addresses).
    let b = AuthGateway::start("cimd_allow_private = true\naccess_token_ttl_secs = 5", None);
    let port = free_port();
    let credentials = format!(
        "[credentials.up]\nkind = \"oauth2\"\nmcp_server = \"{}\"\n{registration}",
        b.url("/mcp")
    );
    let plugin = format!(
        "[plugins.up]\nurl = \"{}\"\nprocess_model = \"per_subject\"\nconnect = \"eager\"\n\
         headers = {{ Authorization = \"Bearer ${{credential:up}}\" }}\n",
        b.url("/mcp")
    );
    let a = gateway_with_credentials(31, port, &credentials, &plugin);
    let alice_token = token(&a, "alice").await;
    let mut alice = a.gw.client().with_token(&alice_token);
    alice.initialize().await;
    let call = json!({"name": "fix__echo", "arguments": {"text": "hi"}});
    let reply = alice.call(1, "tools/call", call.clone()).await;
    let error = &reply.last()["error"];
    assert_eq!(error["code"], -32042, "{reply:?}");
    let link = error["data"]["elicitations"][0]["url"]
        .as_str()
        .unwrap()
        .to_owned();
    let authorize = connect(&a, &b, &link, "alice", "alice").await;
    let q: std::collections::HashMap<_, _> = authorize.query_pairs().into_owned().collect();
    assert_eq!(
        q["resource"],
        b.url("/mcp"),
        "RFC 8707 resource: the upstream"
    );
    assert_eq!(q["code_challenge_method"], "S256");
    let client_id = q["client_id"].clone();
    if registration.is_empty() {
        assert_eq!(
            client_id,
            a.url("/connect/clients/up"),
            "a client ID metadata document"
        );
        let doc: serde_json::Value = reqwest::get(&client_id)
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        assert_eq!(doc["client_id"], client_id.as_str());
        assert_eq!(doc["redirect_uris"][0], a.url("/connect/callback"));
    } else {
        assert!(
            !client_id.starts_with("http"),
            "a registered client: {client_id}"
        );
    }
    let text = alice.tool_text(2, "fix__echo", json!({"text": "hi"})).await;
    assert!(text.contains("hi"), "{text}");

    // Bob connects as bob upstream: his own token, his own instance.
    let mut bob = a.gw.client().with_token(&token(&a, "bob").await);
    bob.initialize().await;
    let reply = bob.call(1, "tools/call", call.clone()).await;
    let link = reply.last()["error"]["data"]["elicitations"][0]["url"]
        .as_str()
        .unwrap()
        .to_owned();
    connect(&a, &b, &link, "bob", "bob").await;
    assert!(
        bob.tool_text(2, "fix__echo", json!({"text": "b"}))
            .await
            .contains('b')
    );

    // Tokens upstream live 5 s: refreshed, alice's calls go on past their end.
    tokio::time::sleep(std::time::Duration::from_secs(7)).await;
    let text = alice
        .tool_text(3, "fix__echo", json!({"text": "later"}))
        .await;
    assert!(text.contains("later"), "{text}");
    // The front gateway's token for alice never reached the upstream: it is not valid there.
    let (status, _) = common::oauth::mcp_status(&b, Some(&alice_token)).await;
    assert_eq!(status, 401);
}

#[tokio::test]
async fn through_a_client_id_metadata_document() {
    the_front_gateway_gets_each_person_their_own_upstream_token("").await;
}

#[tokio::test]
async fn through_dynamic_registration() {
    the_front_gateway_gets_each_person_their_own_upstream_token("registration = \"dynamic\"\n")
        .await;
}
