//! Finding a credential's authorization server and the gateway's client there: from its
//! configured issuer (RFC 8414, then OpenID discovery), or for an MCP server
//! (`mcp_server`) from the issuer its protected resource metadata names, whose metadata must
//! name that issuer exactly (RFC 8414 §3.3: a server that names another is refused before any
//! of its endpoints is used; a bare origin is the same with or without its `/`). A server
//! of 2025-03-26, which answers 404 wherever its protected resource metadata could be, has
//! its authorization server at its origin: the metadata there (its issuer on that origin),
//! else the endpoints that version names (`/authorize`, `/token`, `/register`), which are a
//! guess: found again at each use, and no `iss` checked against them. Configured endpoints
//! win over discovered ones (and do without the server's metadata); every discovered
//! endpoint must be https (plain http only on loopback). Where the server's scopes are asked
//! for and it lists `offline_access`, that is asked for too.

use serde::Deserialize;

use super::mcp_client::{self, OurClient, Registrable};
use super::oauth::{ClientAuth, Endpoints, MAX_ANSWER_BYTES, OAuth, OAuthError};
use crate::auth::external::fetch::Http;
use crate::config::OAuthServer;

/// What the gateway reads of an authorization server's metadata.
#[derive(Deserialize, Default)]
struct Metadata {
    issuer: String,
    authorization_endpoint: Option<String>,
    token_endpoint: Option<String>,
    revocation_endpoint: Option<String>,
    token_endpoint_auth_methods_supported: Option<Vec<String>>,
    #[serde(default)]
    authorization_response_iss_parameter_supported: bool,
    registration_endpoint: Option<String>,
    #[serde(default)]
    client_id_metadata_document_supported: bool,
    scopes_supported: Option<Vec<String>>,
    /// Not read from the server: 2025-03-26's default endpoints, or configured ones where
    /// the server has no metadata. Its `issuer` is a guess, checked against nothing.
    #[serde(skip)]
    guessed: bool,
}

/// The scope that asks for a refresh token where the server offers it (OpenID Connect's,
/// which the 2026-07-28 authorization spec has clients ask for when listed).
const OFFLINE_ACCESS: &str = "offline_access";

/// The endpoints of credential `name`'s server, and the gateway's client there.
pub(super) async fn discover(
    oauth: &OAuth,
    name: &str,
    server: &OAuthServer,
) -> Result<Endpoints, OAuthError> {
    let http = oauth.http_for(name);
    let found = match &server.mcp_server {
        Some(mcp) => mcp_client::protected_resource(http, mcp).await?,
        None => None,
    };
    // Where the metadata was found (for messages), and the issuer it must name.
    let (url, issuer, meta) = match (&server.issuer, &found, &server.mcp_server) {
        (Some(configured), _, _) => {
            // As configured, without the slash `Url` adds to a bare origin.
            let issuer = configured.as_str().trim_end_matches('/').to_owned();
            let (url, meta) = metadata(http, &issuer).await?;
            if meta.issuer.trim_end_matches('/') != issuer {
                return Err(mismatch(&url, &meta.issuer, &issuer));
            }
            (url.to_string(), issuer, meta)
        }
        (None, Some(f), _) => match metadata(http, &f.issuer).await {
            Ok((url, meta)) => {
                if !same_issuer(&meta.issuer, &f.issuer) {
                    return Err(mismatch(&url, &meta.issuer, &f.issuer));
                }
                (url.to_string(), f.issuer.clone(), meta)
            }
            // Endpoints configured for a server without metadata: those, and the resource
            // and scopes its protected resource metadata names.
            Err(_) if server.token_endpoint.is_some() => (
                f.issuer.clone(),
                f.issuer.clone(),
                Metadata {
                    issuer: f.issuer.clone(),
                    guessed: true,
                    ..Metadata::default()
                },
            ),
            Err(e) => return Err(e),
        },
        (None, None, Some(mcp)) => legacy(http, mcp).await?,
        (None, None, None) => {
            return Err(OAuthError::Provider("no issuer and no endpoints".into()));
        }
    };
    let endpoint = |key: &str, v: Option<String>| -> Result<Option<url::Url>, OAuthError> {
        let Some(v) = v else { return Ok(None) };
        let u =
            url::Url::parse(&v).map_err(|e| OAuthError::Provider(format!("{url}: {key}: {e}")))?;
        if u.scheme() != "https" && !(u.scheme() == "http" && crate::config::is_loopback_url(&u)) {
            return Err(OAuthError::Provider(format!("{url}: {key} is not https")));
        }
        Ok(Some(u))
    };
    let token = match &server.token_endpoint {
        Some(t) => t.clone(),
        None => endpoint("token_endpoint", meta.token_endpoint)?
            .ok_or_else(|| OAuthError::Provider(format!("{url} names no token_endpoint")))?,
    };
    let authorization = match &server.authorization_endpoint {
        Some(a) => Some(a.clone()),
        None => endpoint("authorization_endpoint", meta.authorization_endpoint)?,
    };
    let revocation = match &server.revocation_endpoint {
        Some(r) => Some(r.clone()),
        None => endpoint("revocation_endpoint", meta.revocation_endpoint)?,
    };
    let supported = meta
        .token_endpoint_auth_methods_supported
        .unwrap_or_default();
    let client = if server.client_id.is_empty() {
        let registration = endpoint("registration_endpoint", meta.registration_endpoint)?;
        mcp_client::client_id(
            http,
            &*oauth.store,
            &oauth.sealer,
            name,
            &oauth.base,
            server.registration,
            Registrable {
                issuer: &issuer,
                registration_endpoint: registration.as_ref(),
                metadata_documents: meta.client_id_metadata_document_supported,
                auth_method_asked: ClientAuth::asked(&supported),
            },
        )
        .await?
    } else {
        OurClient {
            id: server.client_id.clone(),
            secret: server.client_secret.as_ref().map(|s| s.expose().to_owned()),
            auth_method: None,
            registered: false,
        }
    };
    let auth = match &client.secret {
        // A configured secret is always sent: by HTTP Basic unless the server takes only the
        // form.
        Some(_) if !client.registered && client.auth_method.is_none() => {
            match ClientAuth::choose(None, &supported) {
                ClientAuth::None => ClientAuth::Basic,
                auth => auth,
            }
        }
        Some(_) => ClientAuth::choose(client.auth_method.as_deref(), &supported),
        None => ClientAuth::None,
    };
    let (resource, mut scopes) = match found {
        Some(f) => (Some(f.resource), f.scopes),
        None => (None, Vec::new()),
    };
    // A refresh token, where the server offers one by this scope, so that people are not
    // asked again when their access token ends.
    if !scopes.is_empty()
        && meta
            .scopes_supported
            .as_deref()
            .unwrap_or_default()
            .iter()
            .any(|s| s == OFFLINE_ACCESS)
        && !scopes.iter().any(|s| s == OFFLINE_ACCESS)
    {
        scopes.push(OFFLINE_ACCESS.to_owned());
    }
    Ok(Endpoints {
        registered_at: client.registered.then(|| issuer.clone()),
        client_id: client.id,
        client_secret: client.secret,
        auth,
        issuer: (server.issuer.is_none() && !meta.guessed).then_some(meta.issuer),
        guessed: meta.guessed,
        resource,
        scopes,
        authorization,
        token,
        revocation,
        iss_in_responses: meta.authorization_response_iss_parameter_supported,
    })
}

async fn metadata(http: &Http, issuer: &str) -> Result<(url::Url, Metadata), OAuthError> {
    // (`guessed` is never read from a document: serde skips it.)
    crate::auth::external::first_metadata(http, issuer, MAX_ANSWER_BYTES)
        .await
        .map_err(OAuthError::Provider)
}

/// Whether a metadata document's `issuer` is the one named (RFC 8414 §3.3: identical),
/// taking a bare origin with and without its `/` for the same (RFC 3986's empty path).
fn same_issuer(named_by_metadata: &str, named: &str) -> bool {
    if named_by_metadata == named {
        return true;
    }
    let bare = |s: &str| {
        url::Url::parse(s)
            .ok()
            .filter(|u| u.path() == "/" && u.query().is_none() && u.fragment().is_none())
            .map(|u| u.origin())
    };
    matches!((bare(named_by_metadata), bare(named)), (Some(a), Some(b)) if a == b)
}

fn mismatch(url: &url::Url, named: &str, expected: &str) -> OAuthError {
    OAuthError::Provider(format!(
        "{url} names the issuer `{named}`, not `{expected}`"
    ))
}

/// A 2025-03-26 server without protected resource metadata: its origin's authorization
/// server metadata (naming an issuer on that origin), else the endpoints that version
/// names at the origin.
async fn legacy(http: &Http, mcp: &url::Url) -> Result<(String, String, Metadata), OAuthError> {
    let origin = mcp.origin().ascii_serialization();
    if let Ok((url, meta)) = metadata(http, &origin).await {
        let same = url::Url::parse(&meta.issuer).is_ok_and(|i| i.origin() == mcp.origin());
        if !same {
            return Err(OAuthError::Provider(format!(
                "{url} names the issuer `{}`, not one at {origin}",
                meta.issuer
            )));
        }
        return Ok((url.to_string(), meta.issuer.clone(), meta));
    }
    let at = |path: &str| Some(format!("{origin}{path}"));
    let meta = Metadata {
        issuer: origin.clone(),
        authorization_endpoint: at("/authorize"),
        token_endpoint: at("/token"),
        registration_endpoint: at("/register"),
        guessed: true,
        ..Metadata::default()
    };
    Ok((origin.clone(), origin, meta))
}

#[cfg(test)]
mod tests {
    use super::same_issuer;

    #[test]
    fn an_issuer_is_the_same_as_written_or_a_bare_origin_with_its_slash() {
        assert!(same_issuer("https://as.example", "https://as.example"));
        assert!(same_issuer("https://as.example", "https://as.example/"));
        assert!(same_issuer("https://as.example/", "https://as.example"));
        assert!(!same_issuer(
            "https://as.example/t1",
            "https://as.example/t1/"
        ));
        assert!(!same_issuer(
            "https://attacker.example",
            "https://as.example"
        ));
        assert!(!same_issuer(
            "https://as.example/oauth",
            "https://as.example"
        ));
        assert!(!same_issuer("http://as.example", "https://as.example"));
    }
}
