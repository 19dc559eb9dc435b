//! `auth.mode = "external"`: the gateway as resource server for an authorization server of
//! its own, a real OpenID provider (`oidc-provider` from npm, tests/common/oidc.rs) started by
//! each test, against the real gateway binary.

mod common;

use std::time::{Duration, Instant};

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use common::oidc::OidcProvider;
use common::{FIXTURE, Gateway, INIT, JSON_BOTH, free_port, raw_post, write_config};
use jsonwebtoken::{Algorithm, EncodingKey, Header};
use serde_json::{Value, json};

/// A client of the provider that gets JWT access tokens, in group `robots`.
const ROBOT: (&str, &str) = ("robot", "robot-secret");
/// A client that gets opaque access tokens (for introspection).
const OPAQUE: (&str, &str) = ("opaque-robot", "opaque-secret");

fn provider_settings() -> Value {
    json!({
        "clients": [
            {"client_id": ROBOT.0, "client_secret": ROBOT.1,
             "grant_types": ["client_credentials"], "scope": "mcp", "groups": ["robots"]},
            {"client_id": OPAQUE.0, "client_secret": OPAQUE.1,
             "grant_types": ["client_credentials"], "scope": "mcp",
             "access_token_format": "opaque", "groups": ["robots"]},
        ],
    })
}

fn claims(jwt: &str) -> Value {
    let part = jwt.split('.').nth(1).unwrap();
    let bytes = URL_SAFE_NO_PAD.decode(part).unwrap();
    serde_json::from_slice(&bytes).unwrap()
}

/// The harness itself: the provider mints JWTs for a resource, introspects and revokes
/// opaque tokens, and rotates its keys.
#[tokio::test]
async fn the_test_provider_mints_introspects_revokes_and_rotates() {
    let p = OidcProvider::start(provider_settings());
    let resource = "http://127.0.0.1:9/mcp";
    let jwt = p.access_token(ROBOT, "mcp", resource).await;
    let header = jsonwebtoken::decode_header(&jwt).unwrap();
    let first = p.signing_key().await;
    assert_eq!(header.kid.as_deref(), first["kid"].as_str());
    let c = claims(&jwt);
    assert_eq!(c["aud"], resource);
    assert_eq!(c["iss"], p.issuer());
    assert_eq!(c["groups"], json!(["robots"]));
    assert_eq!(c["scope"], "mcp");
    assert!(first["pem"].as_str().unwrap().contains("PRIVATE KEY"));

    let opaque = p.access_token(OPAQUE, "mcp", resource).await;
    assert_eq!(opaque.split('.').count(), 1, "opaque: {opaque}");
    let i = p.introspect(ROBOT, &opaque).await;
    assert_eq!(i["active"], true, "{i}");
    assert_eq!(i["aud"], resource);
    p.revoke(OPAQUE, &opaque).await;
    assert_eq!(p.introspect(ROBOT, &opaque).await["active"], false);

    let kid = p.rotate_keys(true).await;
    assert_ne!(Some(kid.as_str()), first["kid"].as_str());
    let jwks: Value = reqwest::get(p.url("/jwks"))
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(jwks["keys"].as_array().unwrap().len(), 2, "{jwks}");
    let jwt = p.access_token(ROBOT, "mcp", resource).await;
    assert_eq!(jsonwebtoken::decode_header(&jwt).unwrap().kid, Some(kid));
    assert!(p.count("/token").await >= 3);
}

/// A gateway in external mode, trusting `issuer`, on a port chosen first (the public URL,
/// and so the resource, names it): the fixture as plugin `fix`, and again as `vault`, whose
/// tools need the scope `vault`.
struct ExternalGateway {
    gw: Gateway,
    base: String,
    /// Holds the config file.
    _dir: tempfile::TempDir,
}

impl ExternalGateway {
    fn start(issuer: &str, extra_auth: &str) -> ExternalGateway {
        ExternalGateway::start_with(issuer, extra_auth, "")
    }

    /// [`ExternalGateway::start`], with more of the config file after the two plugins.
    fn start_with(issuer: &str, extra_auth: &str, more: &str) -> ExternalGateway {
        let dir = tempfile::tempdir().unwrap();
        let port = free_port();
        let base = format!("http://127.0.0.1:{port}");
        let config = format!(
            "[auth]\nmode = \"external\"\npublic_url = \"{base}/mcp\"\nissuer = \"{issuer}\"\n\
             jwks_refresh_min_secs = 1\n{extra_auth}\n\
             [plugins.fix]\ncommand = \"{FIXTURE}\"\n\
             [plugins.vault]\ncommand = \"{FIXTURE}\"\nscope = \"vault\"\n{more}"
        );
        let path = write_config(&dir, &config);
        let listen = format!("127.0.0.1:{port}");
        let gw = Gateway::start(&["--listen", &listen, "--config", &path]);
        ExternalGateway {
            gw,
            base,
            _dir: dir,
        }
    }

    fn resource(&self) -> String {
        format!("{}/mcp", self.base)
    }

    /// An `initialize` with `token`: the status and the `WWW-Authenticate` challenge.
    async fn try_token(&self, token: &str) -> (u16, String) {
        let auth = format!("Bearer {token}");
        let mut headers = JSON_BOTH.to_vec();
        headers.push(("authorization", &auth));
        let (status, _, h) = raw_post(&self.gw, &headers, INIT).await;
        let challenge = h
            .get("www-authenticate")
            .map(|v| v.to_str().unwrap().to_owned())
            .unwrap_or_default();
        (status, challenge)
    }

    /// Tries `token` until it is accepted (the gateway fetches keys it does not know at most
    /// once a second).
    async fn until_accepted(&self, token: &str) {
        let deadline = Instant::now() + Duration::from_secs(15);
        loop {
            let (status, challenge) = self.try_token(token).await;
            if status == 200 {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "the token was never accepted: {status} {challenge}"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}

/// Runs tests/clients/python_bearer_client.py in `mode`; what it printed, as JSON.
async fn python_client(mode: &str, url: &str, args: &[&str]) -> Value {
    let mut all = vec![mode.to_owned(), url.to_owned()];
    all.extend(args.iter().map(|a| a.to_string()));
    tokio::task::spawn_blocking(move || {
        let all: Vec<&str> = all.iter().map(String::as_str).collect();
        common::python_client("python_bearer_client.py", &all)
    })
    .await
    .unwrap()
}

/// A provider that also knows the gateway as a client (secret `gateway-secret`), the file
/// holding `secret` (what the gateway will present), and the `[auth]` lines that make the
/// gateway introspect opaque tokens there with it.
fn introspecting(secret: &str) -> (OidcProvider, tempfile::NamedTempFile, String) {
    let mut settings = provider_settings();
    settings["clients"].as_array_mut().unwrap().push(
        json!({"client_id": "gateway", "client_secret": "gateway-secret",
            "grant_types": ["client_credentials"]}),
    );
    let p = OidcProvider::start(settings);
    let file = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(file.path(), secret).unwrap();
    let auth = format!(
        "introspection_endpoint = \"{}\"\nintrospection_client_id = \"gateway\"\n\
         introspection_client_secret_file = \"{}\"\n",
        p.url("/token/introspection"),
        file.path().display()
    );
    (p, file, auth)
}

/// A JWT with `claims`, signed by `alg` with `key` (DER as [`OidcProvider::signing_key`]
/// gives it, or an HMAC secret), its header naming `kid`.
fn sign(alg: Algorithm, kid: &str, key: &[u8], claims: &Value) -> String {
    sign_typed(alg, kid, key, "at+jwt", claims)
}

/// [`sign`], with the header's `typ` given.
fn sign_typed(alg: Algorithm, kid: &str, key: &[u8], typ: &str, claims: &Value) -> String {
    let key = match alg {
        Algorithm::RS256 => EncodingKey::from_rsa_der(key),
        Algorithm::ES256 => EncodingKey::from_ec_der(key),
        Algorithm::HS256 => EncodingKey::from_secret(key),
        other => panic!("no test key for {other:?}"),
    };
    let mut header = Header::new(alg);
    header.kid = Some(kid.to_owned());
    header.typ = Some(typ.into());
    jsonwebtoken::encode(&header, claims, &key).unwrap()
}

#[tokio::test]
async fn the_metadata_names_the_external_issuer_and_no_authorization_server_is_served() {
    let p = OidcProvider::start(provider_settings());
    let g = ExternalGateway::start(p.issuer(), "");
    let http = reqwest::Client::new();
    for path in [
        "/.well-known/oauth-protected-resource/mcp",
        "/.well-known/oauth-protected-resource",
    ] {
        let m: Value = http
            .get(format!("{}{path}", g.base))
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        assert_eq!(m["resource"], g.resource());
        assert_eq!(m["authorization_servers"], json!([p.issuer()]));
        assert_eq!(m["scopes_supported"], json!(["mcp"]));
    }
    for (method, path) in [
        ("GET", "/.well-known/oauth-authorization-server"),
        ("GET", "/.well-known/openid-configuration"),
        ("GET", "/jwks.json"),
        ("GET", "/authorize"),
        ("POST", "/token"),
        ("POST", "/register"),
        ("POST", "/revoke"),
    ] {
        let r = http
            .request(method.parse().unwrap(), format!("{}{path}", g.base))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 404, "{method} {path}");
    }
    // No token: the challenge of every mode, sending the client to the metadata.
    let (status, _, h) = raw_post(&g.gw, JSON_BOTH, INIT).await;
    assert_eq!(status, 401);
    let challenge = h["www-authenticate"].to_str().unwrap();
    assert!(
        challenge.contains(&format!(
            "resource_metadata=\"{}/.well-known/oauth-protected-resource/mcp\"",
            g.base
        )),
        "{challenge}"
    );
}

#[tokio::test]
async fn a_token_the_provider_issues_works_with_the_python_sdk() {
    let p = OidcProvider::start(provider_settings());
    let g = ExternalGateway::start(p.issuer(), "");
    let token = p.access_token(ROBOT, "mcp", &g.resource()).await;
    let out = python_client("bearer", &g.resource(), &[&token]).await;
    assert_eq!(out["protocol_version"], "2025-11-25");
    assert_eq!(out["echo"], "hello from an external token");
    let tools = out["tools"].as_array().unwrap();
    assert!(tools.iter().any(|t| t == "fix__echo"), "{out}");
    assert!(
        !tools
            .iter()
            .any(|t| t.as_str().unwrap().starts_with("vault__")),
        "the vault scope was not granted: {out}"
    );
    // The principal: the client's subject, its scope and the provider's groups claim.
    g.gw.wait_log("bearer token accepted").await;
    let line =
        g.gw.log()
            .lines()
            .find(|l| l.contains("bearer token accepted"))
            .unwrap()
            .to_owned();
    assert!(
        line.contains("subject=robot") && line.contains("\"robots\""),
        "{line}"
    );

    // The SDK's own OAuth client finds the provider through the resource metadata and gets
    // a token for this resource from it.
    let out = python_client(
        "client_credentials",
        &g.resource(),
        &[ROBOT.0, ROBOT.1, p.issuer()],
    )
    .await;
    assert_eq!(out["echo"], "hello from an external token");
    assert_eq!(out["token_scope"], "mcp");
    let c = claims(out["access_token"].as_str().unwrap());
    assert_eq!(
        c["aud"],
        g.resource(),
        "a token for this resource (RFC 8707)"
    );
}

#[tokio::test]
async fn tokens_are_refused_unless_the_issuer_signed_them_for_this_resource() {
    let p = OidcProvider::start(provider_settings());
    let g = ExternalGateway::start(p.issuer(), "audiences = [\"api://mcp-gateway\"]");
    let key = p.signing_key().await;
    let kid = key["kid"].as_str().unwrap().to_owned();
    let der = |k: &Value| {
        base64::engine::general_purpose::STANDARD
            .decode(k["der"].as_str().unwrap())
            .unwrap()
    };
    let provider_der = der(&key);
    let now = mcp_gateway::auth::now_secs();
    let claims_with = |changes: Value| {
        let mut c = json!({"iss": p.issuer(), "sub": "alice", "aud": g.resource(),
            "scope": "mcp", "client_id": "app", "exp": now + 300, "iat": now, "jti": "j"});
        for (k, v) in changes.as_object().unwrap() {
            if v.is_null() {
                c.as_object_mut().unwrap().remove(k);
            } else {
                c[k] = v.clone();
            }
        }
        c
    };
    let forged =
        |changes: Value| sign(Algorithm::RS256, &kid, &provider_der, &claims_with(changes));

    // What the provider issues for this resource, and what the test signs as it would.
    let issued = p.access_token(ROBOT, "mcp", &g.resource()).await;
    assert_eq!(g.try_token(&issued).await.0, 200);
    assert_eq!(
        g.try_token(&forged(json!({}))).await.0,
        200,
        "the forge signs as the provider"
    );
    // Another accepted audience, and scopes as a `scp` list.
    assert_eq!(
        g.try_token(&forged(json!({"aud": ["api://mcp-gateway"]})))
            .await
            .0,
        200
    );
    assert_eq!(
        g.try_token(&forged(json!({"scope": null, "scp": ["mcp"]})))
            .await
            .0,
        200
    );

    // Typed only as `JWT`, as many servers type access tokens: good, unless it is an ID token.
    let plain = |changes: Value| {
        sign_typed(
            Algorithm::RS256,
            &kid,
            &provider_der,
            "JWT",
            &claims_with(changes),
        )
    };
    assert_eq!(g.try_token(&plain(json!({}))).await.0, 200);
    assert_eq!(
        g.try_token(&plain(json!({"typ": "Bearer", "nonce": "n"})))
            .await
            .0,
        200,
        "Keycloak's access tokens say typ Bearer in the payload, and may carry the nonce"
    );
    assert_eq!(
        g.try_token(&forged(json!({"nonce": "n"}))).await.0,
        200,
        "a token typed at+jwt is an access token, whatever its claims"
    );

    // Another key, with the provider's kid: another provider's.
    let other = OidcProvider::start(provider_settings());
    let other_key = other.signing_key().await;
    let other_der = der(&other_key);
    // A key of the test's own, P-256, under a kid the provider never had.
    let own = p256::SecretKey::random(&mut p256::elliptic_curve::rand_core::OsRng);
    let own_der = {
        use p256::pkcs8::EncodePrivateKey;
        own.to_pkcs8_der().unwrap().as_bytes().to_vec()
    };
    let parts: Vec<String> = forged(json!({})).split('.').map(str::to_owned).collect();
    let header_with = |h: Value| URL_SAFE_NO_PAD.encode(h.to_string());
    let cases = [
        (
            "wrong audience (a token the provider issued for another resource)",
            p.access_token(ROBOT, "mcp", "http://127.0.0.1:9/other")
                .await,
            "another resource",
        ),
        (
            "wrong issuer",
            forged(json!({"iss": "https://other.example"})),
            "another issuer",
        ),
        ("expired", forged(json!({"exp": now - 120})), "expired"),
        (
            "not valid yet",
            forged(json!({"nbf": now + 600})),
            "not valid yet",
        ),
        ("no subject", forged(json!({"sub": null})), "malformed"),
        (
            "signed by another key under the provider's kid",
            sign(Algorithm::RS256, &kid, &other_der, &claims_with(json!({}))),
            "signature is invalid",
        ),
        (
            "unknown kid",
            sign(
                Algorithm::ES256,
                "not-a-kid",
                &own_der,
                &claims_with(json!({})),
            ),
            "signing key is unknown",
        ),
        (
            "alg none",
            format!(
                "{}.{}.",
                header_with(json!({"alg": "none", "typ": "at+jwt", "kid": kid})),
                parts[1]
            ),
            "algorithm none",
        ),
        (
            "HMAC keyed with the provider's public key",
            sign(
                Algorithm::HS256,
                &kid,
                key["public_pem"].as_str().unwrap().as_bytes(),
                &claims_with(json!({})),
            ),
            "algorithm HS256",
        ),
        (
            "ES256 under the provider's RSA kid",
            sign(Algorithm::ES256, &kid, &own_der, &claims_with(json!({}))),
            "algorithm ES256",
        ),
        (
            "an ID token's type",
            format!(
                "{}.{}.{}",
                header_with(json!({"alg": "RS256", "typ": "JWT+id", "kid": kid})),
                parts[1],
                parts[2]
            ),
            "typ",
        ),
        (
            "an ID token of the issuer for a client id in auth.audiences (it has a nonce)",
            plain(json!({"aud": "api://mcp-gateway", "nonce": "n", "scope": null})),
            "ID token",
        ),
        (
            "an ID token with at_hash",
            plain(json!({"at_hash": "x"})),
            "ID token",
        ),
        (
            "Keycloak's ID token (typ ID in the payload)",
            plain(json!({"typ": "ID"})),
            "ID token",
        ),
        (
            "tampered claims",
            format!(
                "{}.{}.{}",
                parts[0],
                URL_SAFE_NO_PAD.encode(claims_with(json!({"sub": "bob"})).to_string()),
                parts[2]
            ),
            "signature is invalid",
        ),
        (
            "opaque, without introspection",
            "an-opaque-token".into(),
            "not a JWT",
        ),
    ];
    for (why, token, says) in cases {
        let (status, challenge) = g.try_token(&token).await;
        assert_eq!(status, 401, "{why}: {challenge}");
        assert!(
            challenge.contains("error=\"invalid_token\"") && challenge.contains(says),
            "{why}: {challenge}"
        );
    }
    // Scopes: without `mcp`, a 403 asking for it.
    let (status, challenge) = g.try_token(&forged(json!({"scope": "other"}))).await;
    assert_eq!(status, 403, "{challenge}");
    assert!(challenge.contains("insufficient_scope") && challenge.contains("scope=\"mcp\""));

    // Unknown kids fetch the keys again at most once a second, however many arrive.
    let before = p.count("/jwks").await;
    let started = Instant::now();
    for i in 0..20 {
        let t = sign(
            Algorithm::ES256,
            &format!("k{i}"),
            &own_der,
            &claims_with(json!({})),
        );
        assert_eq!(g.try_token(&t).await.0, 401);
    }
    let fetched = p.count("/jwks").await - before;
    let allowed = started.elapsed().as_secs() + 1;
    assert!(
        fetched <= allowed,
        "{fetched} key set fetches for 20 unknown kids in {:?}",
        started.elapsed()
    );
}

#[tokio::test]
async fn keys_the_provider_rotates_to_work_without_a_restart() {
    let p = OidcProvider::start(provider_settings());
    let g = ExternalGateway::start(p.issuer(), "");
    let first = p.access_token(ROBOT, "mcp", &g.resource()).await;
    assert_eq!(g.try_token(&first).await.0, 200);

    // A new key beside the old one: tokens of both are good.
    let kid = p.rotate_keys(true).await;
    let second = p.access_token(ROBOT, "mcp", &g.resource()).await;
    assert_eq!(jsonwebtoken::decode_header(&second).unwrap().kid, Some(kid));
    g.until_accepted(&second).await;
    assert_eq!(
        g.try_token(&first).await.0,
        200,
        "the old key still verifies"
    );

    // The old keys dropped: a third key's tokens are good, the first's no longer.
    p.rotate_keys(false).await;
    let third = p.access_token(ROBOT, "mcp", &g.resource()).await;
    g.until_accepted(&third).await;
    let (status, challenge) = g.try_token(&first).await;
    assert_eq!(status, 401, "{challenge}");
    assert!(challenge.contains("signing key is unknown"), "{challenge}");
    assert!(
        g.gw.log()
            .matches("fetched the authorization server's signing keys")
            .count()
            >= 3,
        "at start and after each rotation"
    );
}

#[tokio::test]
async fn opaque_tokens_are_introspected_and_a_revocation_is_seen() {
    let (p, _secret, auth) = introspecting("gateway-secret\n");
    let g = ExternalGateway::start(p.issuer(), &format!("{auth}introspection_cache_secs = 2\n"));
    let token = p.access_token(OPAQUE, "mcp", &g.resource()).await;
    assert_eq!(token.split('.').count(), 1, "opaque");
    let out = python_client("bearer", &g.resource(), &[&token]).await;
    assert_eq!(out["echo"], "hello from an external token");
    // The answer is cached: more requests at once ask the provider no more.
    let asked = p.count("/token/introspection").await;
    for _ in 0..5 {
        assert_eq!(g.try_token(&token).await.0, 200);
    }
    assert!(
        p.count("/token/introspection").await <= asked + 1,
        "cached for 2 s"
    );
    assert!(
        !g.gw.log().contains("gateway-secret"),
        "the secret is never logged"
    );

    // Refused: an opaque token for another resource, and one the provider never issued.
    let elsewhere = p
        .access_token(OPAQUE, "mcp", "http://127.0.0.1:9/other")
        .await;
    let (status, challenge) = g.try_token(&elsewhere).await;
    assert_eq!(status, 401);
    assert!(challenge.contains("another resource"), "{challenge}");
    let (status, challenge) = g.try_token("made-up-token").await;
    assert_eq!(status, 401);
    assert!(challenge.contains("not active"), "{challenge}");

    // Revoked at the provider: refused once the cached answer has ended.
    p.revoke(OPAQUE, &token).await;
    let revoked = Instant::now();
    let deadline = revoked + Duration::from_secs(10);
    loop {
        let (status, challenge) = g.try_token(&token).await;
        if status == 401 {
            assert!(challenge.contains("not active"), "{challenge}");
            break;
        }
        assert_eq!(status, 200);
        assert!(Instant::now() < deadline, "the revocation was never seen");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(
        revoked.elapsed() <= Duration::from_secs(3),
        "within the cache's 2 s"
    );
}

#[tokio::test]
async fn an_authorization_server_that_cannot_be_asked_is_a_503_not_a_refusal() {
    // Introspection with a wrong client secret: the provider refuses the gateway, not the
    // token.
    let (p, _secret, auth) = introspecting("not-the-secret");
    let g = ExternalGateway::start(p.issuer(), &auth);
    let token = p.access_token(OPAQUE, "mcp", &g.resource()).await;
    let auth = format!("Bearer {token}");
    let mut headers = JSON_BOTH.to_vec();
    headers.push(("authorization", &auth));
    let (status, body, h) = raw_post(&g.gw, &headers, INIT).await;
    assert_eq!(status, 503, "{body}");
    assert!(h.contains_key("retry-after"));
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("the authorization server cannot be asked about this token"),
        "{body}"
    );
    // The cause is in the log, not in the answer.
    g.gw.wait_log("a bearer token could not be checked: the token cannot be introspected")
        .await;
    assert!(!body.to_string().contains("/token/introspection"), "{body}");
    assert!(
        !g.gw.log().contains("not-the-secret"),
        "the secret is never logged"
    );

    // An issuer whose metadata names another issuer (here: a trailing slash) is not used.
    let g = ExternalGateway::start(&format!("{}/", p.issuer()), "");
    let token = p.access_token(ROBOT, "mcp", &g.resource()).await;
    let (status, _) = g.try_token(&token).await;
    assert_eq!(status, 503);
    g.gw.wait_log("names the issuer").await;

    // An issuer that is not up yet when the gateway starts: tokens wait for it (503), then
    // work once it answers, without a restart.
    let port = free_port();
    let g = ExternalGateway::start(&format!("http://127.0.0.1:{port}"), "");
    g.gw.wait_log("cannot fetch the authorization server's signing keys")
        .await;
    let mut later = provider_settings();
    later["port"] = json!(port);
    let p = OidcProvider::start(later);
    let token = p.access_token(ROBOT, "mcp", &g.resource()).await;
    g.until_accepted(&token).await;
}

/// Access by group and subject with an external issuer's tokens: the groups come from the
/// token's claim (a JWT's, or an introspection answer's), the subject from `sub`; a plugin
/// or tool left out is hidden from lists and refused like a missing scope.
#[tokio::test]
async fn group_rules_hold_for_an_external_issuers_tokens() {
    let (p, _secret, auth) = introspecting("gateway-secret\n");
    let g = ExternalGateway::start_with(
        p.issuer(),
        &auth,
        &format!(
            "[plugins.bots]\ncommand = \"{FIXTURE}\"\nallow_groups = [\"robots\"]\n\
             [plugins.people]\ncommand = \"{FIXTURE}\"\nallow_groups = [\"people\"]\n\
             [plugins.alices]\ncommand = \"{FIXTURE}\"\nallow_subjects = [\"alice\"]\n\
             [[plugins.fix.tool_access]]\ntools = [\"pid\"]\nallow_groups = [\"people\"]\n"
        ),
    );
    let key = p.signing_key().await;
    let der = base64::engine::general_purpose::STANDARD
        .decode(key["der"].as_str().unwrap())
        .unwrap();
    let now = mcp_gateway::auth::now_secs();
    let alice = sign(
        Algorithm::RS256,
        key["kid"].as_str().unwrap(),
        &der,
        &json!({"iss": p.issuer(), "sub": "alice", "aud": g.resource(), "scope": "mcp",
            "groups": ["people"], "exp": now + 300, "iat": now}),
    );
    let jwt = p.access_token(ROBOT, "mcp", &g.resource()).await;
    let opaque = p.access_token(OPAQUE, "mcp", &g.resource()).await;

    let gw = &g.gw;
    let listed = |token: String| async move {
        let mut c = gw.client().with_token(&token);
        c.initialize().await;
        let tools = c.result(2, "tools/list", json!({})).await;
        let names: Vec<String> = common::tool_names(&tools)
            .into_iter()
            .map(str::to_owned)
            .collect();
        (c, names)
    };
    for (who, token) in [
        ("the JWT", jwt.clone()),
        ("the opaque token", opaque.clone()),
    ] {
        let (c, names) = listed(token).await;
        assert!(
            names.contains(&"bots__echo".to_owned()) && names.contains(&"fix__echo".to_owned()),
            "{who}: a robot sees the robots' plugin: {names:?}"
        );
        assert!(
            !names
                .iter()
                .any(|n| n.starts_with("people__") || n.starts_with("alices__") || n == "fix__pid"),
            "{who}: {names:?}"
        );
        for (id, tool) in [(3, "people__echo"), (4, "alices__echo"), (5, "fix__pid")] {
            let r = c
                .call(
                    id,
                    "tools/call",
                    json!({"name": tool, "arguments": {"text": "x"}}),
                )
                .await;
            assert_eq!(r.status, 403, "{who}: {tool}: {}", r.body);
            let challenge = r.headers["www-authenticate"].to_str().unwrap();
            assert!(
                challenge.contains("error=\"insufficient_scope\"")
                    && challenge.contains("not open to the token's subject or groups"),
                "{who}: {challenge}"
            );
        }
    }
    let (c, names) = listed(alice).await;
    for shown in ["people__echo", "alices__echo", "fix__pid"] {
        assert!(names.contains(&shown.to_owned()), "{shown}: {names:?}");
    }
    assert!(!names.iter().any(|n| n.starts_with("bots__")), "{names:?}");
    assert_eq!(
        c.tool_text(3, "alices__echo", json!({"text": "mine"}))
            .await,
        "mine"
    );
}
