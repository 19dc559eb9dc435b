//! `auth.mode = "external"`: the gateway as resource server for an authorization server of
//! its own, a real OpenID provider (`oidc-provider` from npm, tests/common/oidc.rs) started by
//! each test, against the real gateway binary.

mod common;

use common::oidc::OidcProvider;
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
    use base64::Engine;
    let part = jwt.split('.').nth(1).unwrap();
    let bytes = base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(part)
        .unwrap();
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
