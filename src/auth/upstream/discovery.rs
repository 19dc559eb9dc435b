//! OpenID discovery (OpenID Connect Discovery 1.0 §4): the provider's configuration at
//! `<issuer>/.well-known/openid-configuration`, checked to name the configured issuer exactly
//! (§4.3), to have the endpoints a code flow needs on https (plain http only on loopback),
//! and to allow PKCE S256 when it lists the methods it supports.

use serde_json::Value;

use super::{UpstreamError, get_json};

/// The largest discovery document read.
const DOCUMENT_LIMIT: usize = 256 * 1024;

/// What the gateway uses of a provider's configuration.
#[derive(Debug, Clone)]
pub struct Discovered {
    pub issuer: String,
    pub authorization_endpoint: String,
    pub token_endpoint: String,
    pub jwks_uri: String,
    /// `token_endpoint_auth_methods_supported`, when given.
    pub token_auth_methods: Option<Vec<String>>,
    /// `id_token_signing_alg_values_supported`, when given.
    pub id_token_algs: Option<Vec<String>>,
}

impl Discovered {
    /// Whether the provider takes the client secret only in the request body
    /// (`client_secret_post`) and not by HTTP Basic (the default, RFC 6749 §2.3.1).
    pub fn secret_in_body_only(&self) -> bool {
        self.token_auth_methods.as_ref().is_some_and(|m| {
            m.iter().any(|x| x == "client_secret_post")
                && !m.iter().any(|x| x == "client_secret_basic")
        })
    }
}

/// Fetches and checks the configuration of the provider at `issuer`.
pub(super) async fn discover(
    http: &reqwest::Client,
    issuer: &str,
) -> Result<Discovered, UpstreamError> {
    let url = format!(
        "{}/.well-known/openid-configuration",
        issuer.trim_end_matches('/')
    );
    let doc = get_json(http, &url, DOCUMENT_LIMIT).await?;
    read(&doc, issuer)
}

fn read(doc: &Value, issuer: &str) -> Result<Discovered, UpstreamError> {
    let bad = |why: String| UpstreamError::Provider(format!("its OpenID configuration {why}"));
    let text = |key: &str| -> Result<String, UpstreamError> {
        doc.get(key)
            .and_then(Value::as_str)
            .map(str::to_owned)
            .ok_or_else(|| bad(format!("has no `{key}`")))
    };
    let list = |key: &str| -> Option<Vec<String>> {
        doc.get(key).and_then(Value::as_array).map(|a| {
            a.iter()
                .filter_map(Value::as_str)
                .map(str::to_owned)
                .collect()
        })
    };
    let named = text("issuer")?;
    if named != issuer {
        return Err(bad(format!(
            "names the issuer `{named}`, not `{issuer}` (auth.upstream.issuer must be exactly the provider's)"
        )));
    }
    let endpoint = |key: &str| -> Result<String, UpstreamError> {
        let value = text(key)?;
        let url = url::Url::parse(&value).map_err(|e| bad(format!("`{key}` is not a URL: {e}")))?;
        let loopback = match url.host() {
            Some(url::Host::Domain(d)) => d.eq_ignore_ascii_case("localhost"),
            Some(url::Host::Ipv4(ip)) => ip.is_loopback(),
            Some(url::Host::Ipv6(ip)) => ip.is_loopback(),
            None => false,
        };
        if url.scheme() != "https" && !(url.scheme() == "http" && loopback) {
            return Err(bad(format!("`{key}` is not https")));
        }
        Ok(value)
    };
    if let Some(methods) = list("code_challenge_methods_supported")
        && !methods.iter().any(|m| m == "S256")
    {
        return Err(bad("does not offer PKCE S256".into()));
    }
    Ok(Discovered {
        issuer: named,
        authorization_endpoint: endpoint("authorization_endpoint")?,
        token_endpoint: endpoint("token_endpoint")?,
        jwks_uri: endpoint("jwks_uri")?,
        token_auth_methods: list("token_endpoint_auth_methods_supported"),
        id_token_algs: list("id_token_signing_alg_values_supported"),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn doc() -> Value {
        json!({
            "issuer": "https://id.example.com/realms/a",
            "authorization_endpoint": "https://id.example.com/auth",
            "token_endpoint": "https://id.example.com/token",
            "jwks_uri": "https://id.example.com/certs",
            "code_challenge_methods_supported": ["plain", "S256"],
            "token_endpoint_auth_methods_supported": ["client_secret_post"],
        })
    }

    #[test]
    fn the_configuration_must_name_the_issuer_and_offer_what_a_code_flow_needs() {
        let d = read(&doc(), "https://id.example.com/realms/a").unwrap();
        assert_eq!(d.token_endpoint, "https://id.example.com/token");
        assert!(d.secret_in_body_only());
        let e = read(&doc(), "https://id.example.com/realms/b").unwrap_err();
        assert!(e.to_string().contains("names the issuer"), "{e}");
        for (key, value, says) in [
            ("code_challenge_methods_supported", json!(["plain"]), "S256"),
            (
                "token_endpoint",
                json!("http://id.example.com/token"),
                "https",
            ),
            ("jwks_uri", Value::Null, "jwks_uri"),
        ] {
            let mut d = doc();
            d[key] = value;
            let e = read(&d, "https://id.example.com/realms/a").unwrap_err();
            assert!(e.to_string().contains(says), "{key}: {e}");
        }
        let mut d = doc();
        d["token_endpoint"] = json!("http://127.0.0.1:4000/token");
        assert!(
            read(&d, "https://id.example.com/realms/a").is_ok(),
            "http on loopback"
        );
    }
}
