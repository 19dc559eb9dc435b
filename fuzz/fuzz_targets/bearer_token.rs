//! Bearer tokens: the `Authorization` header of a request to `/mcp`, read and checked by the
//! resource server, and the token itself checked by the built-in issuer's validator.
//!
//! The input is the header's value (the token alone is also validated directly: the text
//! after its first space). Invariants: a refusal makes a challenge, never a panic; a token
//! that is accepted carries a valid ES256 signature by the issuer's key over exactly its
//! header and payload (checked here independently of the validator), names this issuer and
//! this resource, has not expired, and the principal is what its claims say.

#![no_main]

use std::collections::BTreeSet;
use std::sync::OnceLock;

use axum::http::{HeaderMap, HeaderValue, Uri, header};
use base64::Engine;
use base64::engine::{DecodePaddingMode, GeneralPurpose, GeneralPurposeConfig};
use libfuzzer_sys::fuzz_target;
use mcp_gateway::auth::Principal;
use mcp_gateway::auth::now_secs;
use mcp_gateway_fuzz::{ISSUER, KID, PRIVATE_DER, PUBLIC_URL, setup};
use p256::ecdsa::signature::Verifier;
use p256::ecdsa::{Signature, VerifyingKey};
use p256::pkcs8::DecodePrivateKey;

fuzz_target!(|data: &[u8]| {
    let s = setup();
    let auth = &s.auth;
    if let Ok(value) = HeaderValue::from_bytes(data) {
        let mut headers = HeaderMap::new();
        headers.insert(header::AUTHORIZATION, value);
        let uri = Uri::from_static("/mcp");
        match s.runtime.block_on(auth.authenticate(&headers, &uri)) {
            Ok(Some(p)) => {
                let token = headers[header::AUTHORIZATION].to_str().unwrap();
                let token = token.split_once(' ').unwrap().1.trim();
                signed_by_us(token, &p);
                assert!(p.scopes.contains("mcp"), "the required scope");
            }
            Ok(None) => panic!("authorization is on"),
            Err(e) => {
                let c = auth.challenge(&e);
                assert!(c.status.is_client_error());
            }
        }
    }
    if let Ok(text) = std::str::from_utf8(data) {
        let token = text.split_once(' ').map_or(text, |(_, t)| t);
        if let Ok(p) = s.runtime.block_on(auth.validate(token)) {
            signed_by_us(token, &p);
        }
    }
});

/// Base64url as tokens use it, read leniently: this oracle judges signatures, not encodings.
const B64: GeneralPurpose = GeneralPurpose::new(
    &base64::alphabet::URL_SAFE,
    GeneralPurposeConfig::new()
        .with_decode_padding_mode(DecodePaddingMode::Indifferent)
        .with_decode_allow_trailing_bits(true),
);

fn key() -> &'static VerifyingKey {
    static KEY: OnceLock<VerifyingKey> = OnceLock::new();
    KEY.get_or_init(|| {
        let der = B64.decode(PRIVATE_DER).unwrap();
        VerifyingKey::from(p256::SecretKey::from_pkcs8_der(&der).unwrap().public_key())
    })
}

/// Checks an accepted token without the validator's code: signature, issuer, audience, times.
fn signed_by_us(token: &str, p: &Principal) {
    let parts: Vec<&str> = token.split('.').collect();
    assert_eq!(parts.len(), 3, "accepted {token:?}");
    let json = |part: &str| -> serde_json::Value {
        serde_json::from_slice(&B64.decode(part).expect("base64url")).expect("JSON")
    };
    let header = json(parts[0]);
    assert_eq!(header["alg"], "ES256", "accepted {token:?}");
    assert_eq!(header["kid"], KID);
    let signature = B64.decode(parts[2]).expect("base64url");
    let signature = Signature::from_slice(&signature).expect("an ES256 signature");
    let signed = format!("{}.{}", parts[0], parts[1]);
    key()
        .verify(signed.as_bytes(), &signature)
        .unwrap_or_else(|_| panic!("accepted a token we did not sign: {token:?}"));
    let claims = json(parts[1]);
    assert_eq!(claims["iss"], ISSUER);
    assert_eq!(claims["aud"], PUBLIC_URL);
    let now = now_secs();
    assert!(
        claims["exp"].as_i64().unwrap() >= now - 60,
        "expired: {claims}"
    );
    assert!(
        claims["nbf"].as_i64().unwrap() <= now + 60,
        "not yet valid: {claims}"
    );
    assert_eq!(claims["sub"], p.subject.as_str());
    assert_eq!(claims["client_id"], p.client_id.as_str());
    let scopes: BTreeSet<String> = claims["scope"]
        .as_str()
        .unwrap()
        .split_whitespace()
        .map(str::to_owned)
        .collect();
    assert_eq!(scopes, p.scopes);
}
