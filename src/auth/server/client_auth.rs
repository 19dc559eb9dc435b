//! How a client proves who it is at `/token` and `/revoke`: HTTP Basic, form credentials,
//! or (a public client) its id alone, and only the way it registered. Provisioned clients'
//! secrets are argon2 hashes checked like passwords, and wrong ones count against the
//! client's address as failed sign-ins do. Every failure is `invalid_client` (401, with a
//! Basic challenge when Basic was tried); this module never issues or revokes anything.

use std::net::IpAddr;

use axum::http::{HeaderMap, header};
use base64::Engine;
use base64::engine::general_purpose::STANDARD;

use super::error::wait_words;
use super::signin::verify_argon2;
use super::token::TokenForm;
use super::{AuthServer, Lookup, OAuthError};
use crate::auth::store::Client;
use crate::auth::{constant_time_eq, hash_secret};

/// Authenticates the client of a token or revocation request: HTTP Basic, form credentials,
/// or (a public client) its id alone.
pub(super) async fn authenticate_client(
    s: &AuthServer,
    headers: &HeaderMap,
    addr: Option<IpAddr>,
    f: &TokenForm,
) -> Result<Client, OAuthError> {
    let basic = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| {
            v.strip_prefix("Basic ")
                .or_else(|| v.strip_prefix("basic "))
        })
        .and_then(|b| STANDARD.decode(b.trim()).ok())
        .and_then(|b| String::from_utf8(b).ok())
        .and_then(|s| {
            let (id, secret) = s.split_once(':')?;
            let dec = |x: &str| {
                url::form_urlencoded::parse(format!("x={x}").as_bytes())
                    .next()
                    .map(|(_, v)| v.into_owned())
            };
            Some((dec(id)?, dec(secret)?))
        });
    let invalid = |why: &str| OAuthError::InvalidClient {
        description: why.to_owned(),
        basic: basic.is_some(),
    };
    let (client_id, secret, method) = match (&basic, &f.client_id, &f.client_secret) {
        (Some((id, secret)), _, None) => (id.clone(), Some(secret.clone()), "client_secret_basic"),
        (Some(_), _, Some(_)) => return Err(invalid("use one way of client authentication")),
        (None, Some(id), Some(secret)) => (id.clone(), Some(secret.clone()), "client_secret_post"),
        (None, Some(id), None) => (id.clone(), None, "none"),
        (None, None, _) => return Err(invalid("the request names no client")),
    };
    let client = match s.client(&client_id, addr).await {
        Ok(Some(c)) => c,
        Ok(None) => return Err(invalid("unknown client")),
        Err(Lookup::Limited(wait)) => {
            return Err(OAuthError::TooManyRequests {
                description: format!(
                    "too many client metadata documents were fetched; try again in {}",
                    wait_words(wait)
                ),
                retry_after: wait,
            });
        }
        Err(Lookup::Failed(e)) => return Err(invalid(&e)),
    };
    if client.provisioned {
        // Either way of sending the secret; the secret is an operator's, hashed with argon2.
        let Some(secret) = secret else {
            return Err(invalid("this client authenticates with a client secret"));
        };
        // Guessing it is guessing a password: wrong secrets count against the address as
        // failed sign-ins do (not against the client, which a stranger could lock out).
        if let Some(wait) = addr.and_then(|a| s.signins.addresses.blocked(&a)) {
            return Err(OAuthError::TooManyRequests {
                description: format!(
                    "too many failed sign-ins from this address; try again in {}",
                    wait_words(wait)
                ),
                retry_after: wait,
            });
        }
        if !verify_argon2(client.secret_hash.clone(), &secret).await {
            if let Some(a) = addr {
                s.signins.addresses.hit(a);
            }
            return Err(invalid("wrong client secret"));
        }
        return Ok(client);
    }
    if client.auth_method != method {
        return Err(invalid(&format!(
            "this client authenticates with {}, not {method}",
            client.auth_method
        )));
    }
    if let Some(secret) = secret {
        let ok = client
            .secret_hash
            .as_deref()
            .is_some_and(|h| constant_time_eq(h, &hash_secret(&secret)));
        if !ok {
            return Err(invalid("wrong client secret"));
        }
    }
    Ok(client)
}
