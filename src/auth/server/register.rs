//! Dynamic client registration (RFC 7591): a client describes itself in JSON and gets a
//! random client id (and a secret, unless it is public). What it may describe is narrowed
//! here: the authorization code and refresh token grants only (`client_credentials` is for
//! clients the operator provisions), acceptable redirect URIs, offered scopes. Registrations
//! are limited per client address and for all together. Registration never issues a token.
//!
//! In a cluster the limit is counted across replicas ([`SharedThrottle`]), so N replicas do
//! not allow N times it. When that count cannot be taken (Redis unreachable), each replica
//! counts on its own until it can again: the limit then holds per replica, N times looser in
//! all but never gone (failing open to no limit would let a flood of registrations fill the
//! database while Redis is down; failing closed would refuse every new client for as long
//! as a cache is out, though nothing about registering needs it).

use std::net::IpAddr;
use std::time::Duration;

use axum::body::Bytes;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::Response;
use serde_json::{Value, json};

use super::error::wait_words;
use super::{AuthServer, ClientAddr, OAuthError, St, json_response, server};
use crate::auth::redirect::valid_redirect_uri;
use crate::auth::shared::{Admission, SharedThrottle};
use crate::auth::store::Client;
use crate::auth::{hash_secret, now_secs, random_token};

impl AuthServer {
    /// A registration slot in the current minute for the client at `addr` (and for all
    /// together), across the cluster when there is one; the wait if there is none.
    async fn may_register(&self, addr: Option<IpAddr>) -> Result<(), Duration> {
        let key = addr.unwrap_or(IpAddr::V4(std::net::Ipv4Addr::UNSPECIFIED));
        if let Some(shared) = &self.shared_registrations {
            match shared_slot(&**shared, key, self.config.registrations_per_minute).await {
                Ok(Admission::Admitted) => return Ok(()),
                Ok(Admission::Refused(wait)) => return Err(wait),
                Err(e) => tracing::warn!(
                    "registration limit: the cluster's count failed ({e}); counting on this replica alone"
                ),
            }
        }
        if let Some(wait) = self.registrations.blocked(&key) {
            return Err(wait);
        }
        self.registrations_total.acquire(())?;
        self.registrations.hit(key);
        Ok(())
    }
}

/// The window registrations are counted in.
pub(super) const WINDOW: Duration = Duration::from_secs(60);

/// The registrations allowed for all client addresses together: 20 times one address's.
pub(super) fn total_limit(per_address: u32) -> u32 {
    per_address.saturating_mul(20)
}

/// A registration slot in the shared count: `limit` per client address and
/// [`total_limit`] for all together, per [`WINDOW`] (the limits the replica's own tables
/// keep).
async fn shared_slot(
    shared: &dyn SharedThrottle,
    addr: IpAddr,
    limit: u32,
) -> Result<Admission, String> {
    let counters = [
        (format!("register:{addr}"), limit),
        ("register".to_owned(), total_limit(limit)),
    ];
    shared.acquire(&counters, WINDOW).await
}

/// Dynamic client registration (RFC 7591).
pub(super) async fn register(
    State(auth): St,
    ClientAddr(addr): ClientAddr,
    body: Bytes,
) -> Result<Response, OAuthError> {
    let s = server(&auth);
    let bad = OAuthError::InvalidClientMetadata;
    let Ok(meta) = serde_json::from_slice::<Value>(&body) else {
        return Err(bad(
            "the body must be a JSON object of client metadata".into()
        ));
    };
    let Some(meta) = meta.as_object() else {
        return Err(bad(
            "the body must be a JSON object of client metadata".into()
        ));
    };
    let strings = |key: &str| -> Result<Option<Vec<String>>, String> {
        match meta.get(key) {
            None | Some(Value::Null) => Ok(None),
            Some(Value::Array(a)) => a
                .iter()
                .map(|v| {
                    v.as_str()
                        .map(str::to_owned)
                        .ok_or(format!("{key} must be strings"))
                })
                .collect::<Result<Vec<_>, _>>()
                .map(Some),
            Some(_) => Err(format!("{key} must be an array of strings")),
        }
    };
    let text = |key: &str| meta.get(key).and_then(Value::as_str).map(str::to_owned);
    let redirect_uris = strings("redirect_uris").map_err(bad)?.unwrap_or_default();
    let auth_method =
        text("token_endpoint_auth_method").unwrap_or_else(|| "client_secret_basic".into());
    if !["none", "client_secret_basic", "client_secret_post"].contains(&auth_method.as_str()) {
        return Err(bad(format!(
            "token_endpoint_auth_method `{auth_method}` is not supported (none, client_secret_basic, client_secret_post)"
        )));
    }
    let grant_types = strings("grant_types")
        .map_err(bad)?
        .unwrap_or_else(|| vec!["authorization_code".into(), "refresh_token".into()]);
    for g in &grant_types {
        if !["authorization_code", "refresh_token", "client_credentials"].contains(&g.as_str()) {
            return Err(bad(format!("grant type `{g}` is not supported")));
        }
    }
    // A client that registers itself speaks for nobody: client_credentials would let anyone
    // mint a token without a person signing in. Only the operator provisions such clients.
    if grant_types.iter().any(|g| g == "client_credentials") {
        return Err(bad(
            "the client_credentials grant is not available to registered clients; an operator provisions such clients in the gateway's config ([[auth.clients]])"
                .into(),
        ));
    }
    if grant_types.iter().any(|g| g == "authorization_code") && redirect_uris.is_empty() {
        return Err(OAuthError::InvalidRedirectUri(
            "redirect_uris is required for the authorization_code grant".into(),
        ));
    }
    for r in &redirect_uris {
        valid_redirect_uri(r).map_err(OAuthError::InvalidRedirectUri)?;
    }
    if let Ok(Some(types)) = strings("response_types")
        && types.iter().any(|t| t != "code")
    {
        return Err(bad("only the `code` response type is supported".into()));
    }
    let application_type = text("application_type").unwrap_or_else(|| "web".into());
    if !["web", "native"].contains(&application_type.as_str()) {
        return Err(bad(format!(
            "application_type `{application_type}` is not web or native"
        )));
    }
    let scope = text("scope");
    if let Some(sc) = &scope {
        let supported = s.scopes_supported();
        if let Some(bad_scope) = sc
            .split_whitespace()
            .find(|x| !supported.iter().any(|y| y == x))
        {
            return Err(bad(format!("scope `{bad_scope}` is not offered here")));
        }
    }
    if let Err(wait) = s.may_register(addr).await {
        tracing::info!(address = ?addr, "registration refused: too many");
        return Err(OAuthError::TooManyRequests {
            description: format!("too many registrations; try again in {}", wait_words(wait)),
            retry_after: wait,
        });
    }
    let secret = (auth_method != "none").then(random_token);
    let client = Client {
        client_id: random_token(),
        secret_hash: secret.as_deref().map(hash_secret),
        name: text("client_name"),
        redirect_uris,
        auth_method,
        grant_types,
        application_type,
        scope,
        provisioned: false,
    };
    s.store.add_client(&client).await?;
    tracing::info!(client_id = %client.client_id, name = ?client.name, "client registered");
    let mut out = json!({
        "client_id": client.client_id,
        "client_id_issued_at": now_secs(),
        "redirect_uris": client.redirect_uris,
        "token_endpoint_auth_method": client.auth_method,
        "grant_types": client.grant_types,
        "response_types": ["code"],
        "application_type": client.application_type,
    });
    if let Some(name) = &client.name {
        out["client_name"] = json!(name);
    }
    if let Some(sc) = &client.scope {
        out["scope"] = json!(sc);
    }
    if let Some(secret) = secret {
        out["client_secret"] = json!(secret);
        out["client_secret_expires_at"] = json!(0);
    }
    Ok(json_response(StatusCode::CREATED, out))
}
