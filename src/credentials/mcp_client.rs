//! The gateway as an OAuth client of a remote MCP server (an `oauth2` credential with
//! `mcp_server`), as the MCP authorization spec has clients do: the server's protected
//! resource metadata (RFC 9728, at the well-known URI with the server's path, then at the
//! origin's) names its authorization server and the scopes it knows; the gateway then
//! registers itself there unless a client id is configured: by a client ID metadata document
//! it serves at `/connect/clients/NAME` where the server supports them, else by dynamic
//! registration (RFC 7591, kept in the database, its secret sealed, so that every replica
//! uses the first registration).

use serde::Deserialize;

use super::oauth::OAuthError;
use crate::auth::external::fetch::Http;
use crate::config::Registration;
use crate::protocol::challenge::{bearer, bearer_param};

/// The largest metadata document read.
const MAX_BYTES: usize = 64 * 1024;

/// The path under which the gateway serves its client ID metadata documents.
pub const CLIENTS_PATH: &str = "/connect/clients";

/// What an MCP server's protected resource metadata says.
pub struct Resource {
    /// Its authorization server's issuer.
    pub issuer: String,
    /// The resource, as the server names itself (the `resource` asked for).
    pub resource: String,
    pub scopes: Vec<String>,
}

/// What an MCP server's refusal of a request without a token says (its `WWW-Authenticate`
/// challenge): where its metadata is, and the scope it wants.
#[derive(Default)]
struct Challenge {
    resource_metadata: Option<url::Url>,
    scope: Option<String>,
}

/// POSTs an `initialize` without a token to `server` and reads the Bearer challenge of its 401;
/// a server that lets `initialize` through is asked `tools/list` (nothing when it answers
/// otherwise).
async fn challenge(http: &Http, server: &url::Url) -> Challenge {
    let initialize = serde_json::json!({"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {
        "protocolVersion": crate::protocol::PLUGIN_VERSIONS[0], "capabilities": {},
        "clientInfo": {"name": "mcp-gateway", "version": env!("CARGO_PKG_VERSION")}}});
    let list = serde_json::json!({"jsonrpc": "2.0", "id": 1, "method": "tools/list", "params": {}});
    for body in [initialize, list] {
        if let Some(c) = refused(http, server, &body).await {
            return c;
        }
    }
    Challenge::default()
}

/// The challenge of a 401 to `body`, if that is the answer.
async fn refused(http: &Http, server: &url::Url, body: &serde_json::Value) -> Option<Challenge> {
    let Ok(request) = oauth2::http::Request::builder()
        .method(oauth2::http::Method::POST)
        .uri(server.as_str())
        .header("content-type", "application/json")
        .header("accept", "application/json, text/event-stream")
        .body(body.to_string().into_bytes())
    else {
        return None;
    };
    let answer = http.send(request, MAX_BYTES).await.ok()?;
    if answer.status().as_u16() != 401 {
        return None;
    }
    let values = answer.headers().get_all("www-authenticate");
    let value = bearer(values.iter().filter_map(|v| v.to_str().ok())).unwrap_or("Bearer");
    let param = |name: &str| bearer_param(value, name);
    Some(Challenge {
        resource_metadata: param("resource_metadata").and_then(|u| url::Url::parse(&u).ok()),
        scope: param("scope").filter(|s| !s.trim().is_empty()),
    })
}

/// Reads the protected resource metadata of `server`: where its challenge says, else at the
/// well-known URI with the server's path, else at the origin's. The scopes asked for are the
/// challenge's, else the metadata's. `None` when there is none (a server of 2025-03-26,
/// whose authorization server is at its origin); an error when it is not this server's.
pub async fn protected_resource(
    http: &Http,
    server: &url::Url,
) -> Result<Option<Resource>, OAuthError> {
    #[derive(Deserialize)]
    struct Metadata {
        resource: String,
        #[serde(default)]
        authorization_servers: Vec<String>,
        #[serde(default)]
        scopes_supported: Vec<String>,
    }
    let hint = challenge(http, server).await;
    let path = server.path().trim_end_matches('/');
    // Where the challenge says, if https (http only on loopback), like every URL an upstream
    // names.
    let mut urls: Vec<url::Url> = hint
        .resource_metadata
        .clone()
        .into_iter()
        .filter(secure)
        .collect();
    for p in [
        format!("/.well-known/oauth-protected-resource{path}"),
        "/.well-known/oauth-protected-resource".to_owned(),
    ] {
        let mut u = server.clone();
        u.set_path(&p);
        u.set_query(None);
        if !urls.contains(&u) {
            urls.push(u);
        }
    }
    let mut failures = Vec::new();
    // Whether every place answered that it has none (404): only then is it a server of
    // 2025-03-26; anything else (a timeout, a 5xx) is a failure, not found again for an hour.
    let mut none = true;
    for url in urls {
        match http.get_json::<Metadata>(&url, MAX_BYTES).await {
            Ok((m, _)) => {
                // RFC 9728 §3.3: the metadata is the server's own only if it names it, or a
                // resource that holds it (the origin's metadata names the origin).
                if !covers(&m.resource, server) {
                    return Err(OAuthError::Provider(format!(
                        "{url} describes the resource `{}`, not `{server}`",
                        m.resource
                    )));
                }
                let issuer = m.authorization_servers.into_iter().next().ok_or_else(|| {
                    OAuthError::Provider(format!("{url} names no authorization server"))
                })?;
                // People's codes, verifiers and tokens go there: never over plain http but
                // on loopback.
                if !url::Url::parse(&issuer).is_ok_and(|u| secure(&u)) {
                    return Err(OAuthError::Provider(format!(
                        "{url} names the authorization server `{issuer}`, which is not https"
                    )));
                }
                let scopes = match &hint.scope {
                    Some(s) => s.split_whitespace().map(str::to_owned).collect(),
                    None => m.scopes_supported,
                };
                return Ok(Some(Resource {
                    issuer,
                    resource: m.resource,
                    scopes,
                }));
            }
            Err(e) => {
                none &= matches!(
                    e,
                    crate::auth::external::fetch::FetchError::Status { status: 404, .. }
                );
                failures.push(e.to_string());
            }
        }
    }
    if !none || hint.resource_metadata.is_some() {
        return Err(OAuthError::Provider(format!(
            "no protected resource metadata: {}",
            failures.join("; ")
        )));
    }
    tracing::info!(
        server = %server,
        "no protected resource metadata ({}); its origin is taken for its authorization server, as in 2025-03-26",
        failures.join("; ")
    );
    Ok(None)
}

/// https, or http on loopback (development).
fn secure(u: &url::Url) -> bool {
    u.scheme() == "https" || (u.scheme() == "http" && crate::config::is_loopback_url(u))
}

/// Whether `resource` names `server` or a resource holding it: the same origin, and a path
/// that is `server`'s or a leading part of it (whole segments).
fn covers(resource: &str, server: &url::Url) -> bool {
    let Ok(r) = url::Url::parse(resource) else {
        return false;
    };
    if r.origin() != server.origin() || r.query().is_some() || r.fragment().is_some() {
        return false;
    }
    let (rp, sp) = (
        r.path().trim_end_matches('/'),
        server.path().trim_end_matches('/'),
    );
    sp == rp || sp.starts_with(&format!("{rp}/"))
}

/// What the authorization server's metadata says of registering.
pub struct Registrable<'a> {
    pub issuer: &'a str,
    pub registration_endpoint: Option<&'a url::Url>,
    pub metadata_documents: bool,
    /// The `token_endpoint_auth_method` asked for when registering.
    pub auth_method_asked: &'a str,
}

/// The gateway's client at an authorization server: its id, and for a confidential client
/// its secret and how the server said to send it (`token_endpoint_auth_method`).
pub struct OurClient {
    pub id: String,
    pub secret: Option<String>,
    pub auth_method: Option<String>,
    /// A dynamic registration (kept in the store), not a document or a configured id.
    pub registered: bool,
}

/// What the sealed secret of a registration is bound to (no person's subject looks so).
fn sealed_for(issuer: &str) -> String {
    format!("\0oauth-registration {issuer}")
}

/// The client the gateway uses at the server: its metadata document's URL, or a dynamic
/// registration's (kept, or made and kept; a secret it came with is sealed).
pub async fn client_id(
    http: &Http,
    store: &dyn super::store::CredentialStore,
    sealer: &super::Sealer,
    name: &str,
    base: &str,
    how: Registration,
    at: Registrable<'_>,
) -> Result<OurClient, OAuthError> {
    let document =
        matches!(how, Registration::Auto | Registration::MetadataDocument) && at.metadata_documents;
    if document {
        return Ok(OurClient {
            id: document_url(base, name),
            secret: None,
            auth_method: None,
            registered: false,
        });
    }
    if how == Registration::MetadataDocument {
        return Err(OAuthError::Provider(
            "the authorization server does not take client ID metadata documents".into(),
        ));
    }
    let stored = |e: super::store::StoreError| OAuthError::Provider(e.to_string());
    let open = |r: super::store::Registered| -> Result<OurClient, OAuthError> {
        let secret = match &r.sealed_secret {
            Some(sealed) => {
                let opened = sealer
                    .open(&sealed_for(at.issuer), name, sealed)
                    .map_err(|e| OAuthError::Provider(format!("the registration's secret: {e}")))?;
                Some(String::from_utf8(opened.plain).map_err(|_| {
                    OAuthError::Provider("the registration's secret is not text".into())
                })?)
            }
            None => None,
        };
        Ok(OurClient {
            id: r.client_id,
            secret,
            auth_method: r.auth_method,
            registered: true,
        })
    };
    if let Some(r) = store
        .registration(name, at.issuer, None, super::now_ms())
        .await
        .map_err(stored)?
    {
        return open(r);
    }
    let Some(endpoint) = at.registration_endpoint else {
        return Err(OAuthError::Provider(
            "the authorization server offers neither client ID metadata documents nor dynamic registration; configure client_id".into(),
        ));
    };
    // Its secret could not be kept without the storage key: no registration made for nothing.
    sealer
        .seal(&sealed_for(at.issuer), name, b"")
        .map_err(|e| OAuthError::Provider(format!("a registration's secret: {e}")))?;
    let request = serde_json::json!({
        "client_name": format!("mcp-gateway ({name})"),
        "redirect_uris": [format!("{base}{}", super::connect::CALLBACK_PATH)],
        "grant_types": ["authorization_code", "refresh_token"],
        "response_types": ["code"],
        "token_endpoint_auth_method": at.auth_method_asked,
        "application_type": "web",
    });
    let request = oauth2::http::Request::builder()
        .method(oauth2::http::Method::POST)
        .uri(endpoint.as_str())
        .header("content-type", "application/json")
        .header("accept", "application/json")
        .body(request.to_string().into_bytes())
        .map_err(|e| OAuthError::Provider(e.to_string()))?;
    let answer = http
        .send(request, MAX_BYTES)
        .await
        .map_err(|e| OAuthError::Provider(e.to_string()))?;
    if !answer.status().is_success() {
        return Err(OAuthError::Provider(format!(
            "dynamic registration was refused: HTTP {}",
            answer.status()
        )));
    }
    #[derive(Deserialize)]
    struct Answer {
        client_id: String,
        #[serde(default)]
        client_secret: Option<String>,
        #[serde(default)]
        token_endpoint_auth_method: Option<String>,
    }
    let r: Answer = serde_json::from_slice(answer.body())
        .map_err(|e| OAuthError::Provider(format!("unreadable registration: {e}")))?;
    let bounded = |s: &str| !s.is_empty() && s.len() <= 512 && !s.chars().any(char::is_control);
    if !bounded(&r.client_id)
        || r.client_secret.as_deref().is_some_and(|s| !bounded(s))
        || r.token_endpoint_auth_method
            .as_deref()
            .is_some_and(|s| !bounded(s))
    {
        return Err(OAuthError::Provider(
            "a registration without a usable client_id, or with an unusable secret".into(),
        ));
    }
    let sealed_secret = match &r.client_secret {
        Some(secret) => Some(
            sealer
                .seal(&sealed_for(at.issuer), name, secret.as_bytes())
                .map_err(|e| OAuthError::Provider(format!("the registration's secret: {e}")))?,
        ),
        None => None,
    };
    let registered = super::store::Registered {
        client_id: r.client_id,
        sealed_secret,
        auth_method: r.token_endpoint_auth_method,
    };
    let kept = store
        .registration(name, at.issuer, Some(&registered), super::now_ms())
        .await
        .map_err(stored)?;
    tracing::info!(
        credential = name,
        issuer = at.issuer,
        "registered the gateway as an OAuth client"
    );
    open(kept.unwrap_or(registered))
}

/// Where the gateway serves the client ID metadata document of credential `name`.
pub fn document_url(base: &str, name: &str) -> String {
    format!("{base}{CLIENTS_PATH}/{name}")
}

/// The client ID metadata document of credential `name`.
pub fn document(base: &str, name: &str, label: &str) -> serde_json::Value {
    serde_json::json!({
        "client_id": document_url(base, name),
        "client_name": format!("mcp-gateway ({label})"),
        "client_uri": base,
        "redirect_uris": [format!("{base}{}", super::connect::CALLBACK_PATH)],
        "grant_types": ["authorization_code", "refresh_token"],
        "response_types": ["code"],
        "token_endpoint_auth_method": "none",
    })
}

#[cfg(test)]
mod tests {

    #[test]
    fn a_resource_covers_its_server_or_what_it_holds() {
        let server = url::Url::parse("http://localhost:9/mcp").unwrap();
        for yes in [
            "http://localhost:9/mcp",
            "http://localhost:9/mcp/",
            "http://localhost:9",
            "http://localhost:9/",
        ] {
            assert!(super::covers(yes, &server), "{yes}");
        }
        for no in [
            "https://evil.example.com/mcp",
            "http://localhost:10/mcp",
            "http://localhost:9/mc",
            "http://localhost:9/mcp/x",
            "http://localhost:9/mcp?x=1",
        ] {
            assert!(!super::covers(no, &server), "{no}");
        }
    }
}
