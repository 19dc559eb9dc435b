//! The gateway as an OAuth client of a remote MCP server (an `oauth2` credential with
//! `mcp_server`), as the MCP authorization spec has clients do: the server's protected
//! resource metadata (RFC 9728, at the well-known URI with the server's path, then at the
//! origin's) names its authorization server and the scopes it knows; the gateway then
//! registers itself there unless a client id is configured: by a client ID metadata document
//! it serves at `/connect/clients/NAME` where the server supports them, else by dynamic
//! registration (RFC 7591, as a public client, kept in the database so that every replica
//! uses the first registration).

use serde::Deserialize;

use super::oauth::OAuthError;
use crate::auth::external::fetch::Http;
use crate::config::Registration;

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

/// Reads the protected resource metadata of `server`.
pub async fn protected_resource(http: &Http, server: &url::Url) -> Result<Resource, OAuthError> {
    #[derive(Deserialize)]
    struct Metadata {
        resource: String,
        #[serde(default)]
        authorization_servers: Vec<String>,
        #[serde(default)]
        scopes_supported: Vec<String>,
    }
    let path = server.path().trim_end_matches('/');
    let mut urls = Vec::new();
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
    for url in urls {
        match http.get_json::<Metadata>(&url, MAX_BYTES).await {
            Ok((m, _)) => {
                // RFC 9728 §3.3: the metadata is the server's own only if it names it.
                let same = |a: &str, b: &str| a.trim_end_matches('/') == b.trim_end_matches('/');
                if !same(&m.resource, server.as_str()) {
                    return Err(OAuthError::Provider(format!(
                        "{url} describes the resource `{}`, not `{server}`",
                        m.resource
                    )));
                }
                let issuer = m.authorization_servers.into_iter().next().ok_or_else(|| {
                    OAuthError::Provider(format!("{url} names no authorization server"))
                })?;
                return Ok(Resource {
                    issuer,
                    resource: m.resource,
                    scopes: m.scopes_supported,
                });
            }
            Err(e) => failures.push(e.to_string()),
        }
    }
    Err(OAuthError::Provider(format!(
        "no protected resource metadata: {}",
        failures.join("; ")
    )))
}

/// What the authorization server's metadata says of registering.
pub struct Registrable<'a> {
    pub issuer: &'a str,
    pub registration_endpoint: Option<&'a url::Url>,
    pub metadata_documents: bool,
}

/// The client id the gateway uses at the server: its metadata document's URL, or a dynamic
/// registration's (kept, or made and kept).
pub async fn client_id(
    http: &Http,
    store: &dyn super::store::CredentialStore,
    name: &str,
    base: &str,
    how: Registration,
    at: Registrable<'_>,
) -> Result<String, OAuthError> {
    let document =
        matches!(how, Registration::Auto | Registration::MetadataDocument) && at.metadata_documents;
    if document {
        return Ok(document_url(base, name));
    }
    if how == Registration::MetadataDocument {
        return Err(OAuthError::Provider(
            "the authorization server does not take client ID metadata documents".into(),
        ));
    }
    let stored = |e: super::store::StoreError| OAuthError::Provider(e.to_string());
    if let Some(id) = store
        .registration(name, at.issuer, None, super::now_ms())
        .await
        .map_err(stored)?
    {
        return Ok(id);
    }
    let Some(endpoint) = at.registration_endpoint else {
        return Err(OAuthError::Provider(
            "the authorization server offers neither client ID metadata documents nor dynamic registration; configure client_id".into(),
        ));
    };
    let request = serde_json::json!({
        "client_name": format!("mcp-gateway ({name})"),
        "redirect_uris": [format!("{base}{}", super::connect::CALLBACK_PATH)],
        "grant_types": ["authorization_code", "refresh_token"],
        "response_types": ["code"],
        "token_endpoint_auth_method": "none",
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
    struct Registered {
        client_id: String,
        #[serde(default)]
        client_secret: Option<String>,
    }
    let r: Registered = serde_json::from_slice(answer.body())
        .map_err(|e| OAuthError::Provider(format!("unreadable registration: {e}")))?;
    if r.client_secret.is_some() {
        // Asked as a public client; a secret given anyway is not kept (nor needed: PKCE).
        tracing::info!(
            credential = name,
            "the registration came with a client secret, which the gateway does not use"
        );
    }
    if r.client_id.is_empty() || r.client_id.len() > 512 {
        return Err(OAuthError::Provider(
            "a registration without a usable client_id".into(),
        ));
    }
    let kept = store
        .registration(name, at.issuer, Some(&r.client_id), super::now_ms())
        .await
        .map_err(stored)?;
    tracing::info!(
        credential = name,
        issuer = at.issuer,
        "registered the gateway as an OAuth client"
    );
    Ok(kept.unwrap_or(r.client_id))
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
