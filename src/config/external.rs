//! `auth.mode = "external"`: the gateway is the resource server of an authorization server it
//! does not run. The settings that say which one (its issuer), which audiences its tokens may
//! carry besides the resource itself, which claim lists groups, how often its keys may be
//! fetched again, and the introspection endpoint for opaque tokens with the gateway's client
//! there (its secret read from a file or the environment, never from the config file, and
//! never printed). Plain data, checked here; `auth::external` does the validating.

use std::path::PathBuf;
use std::time::Duration;

use super::file::AuthSection;
use super::{ConfigError, invalid};

/// The environment variable the introspection client's secret is read from when `[auth]`
/// names neither a file nor another variable.
pub const INTROSPECTION_SECRET_ENV: &str = "MCP_GATEWAY_INTROSPECTION_CLIENT_SECRET";

/// An external authorization server.
#[derive(Debug, Clone)]
pub struct ExternalConfig {
    /// The issuer, exactly as its metadata and its tokens name it.
    pub issuer: String,
    /// Audiences accepted besides the resource's own URL (for servers that cannot mint a
    /// token for a resource indicator).
    pub audiences: Vec<String>,
    /// The claim that lists the subject's groups.
    pub groups_claim: String,
    /// A token with an unknown `kid` fetches the keys again at most this often.
    pub jwks_refresh_min: Duration,
    /// Opaque tokens are introspected here.
    pub introspection: Option<IntrospectionConfig>,
    /// An introspection answer is reused for at most this long (and never past the token's
    /// `exp`).
    pub introspection_cache: Duration,
}

/// The introspection endpoint and the gateway's client there (client_secret_basic).
#[derive(Clone)]
pub struct IntrospectionConfig {
    pub endpoint: url::Url,
    pub client_id: String,
    client_secret: String,
}

impl IntrospectionConfig {
    pub fn client_secret(&self) -> &str {
        &self.client_secret
    }
}

impl std::fmt::Debug for IntrospectionConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("IntrospectionConfig")
            .field("endpoint", &self.endpoint.as_str())
            .field("client_id", &self.client_id)
            .finish_non_exhaustive()
    }
}

/// `[auth]`'s keys of this mode as written (`deny_unknown_fields` does not mix with
/// `flatten`, so they sit in [`AuthSection`] itself).
pub(super) fn given(file: &AuthSection) -> Option<&'static str> {
    [
        (file.issuer.is_some(), "auth.issuer"),
        (file.audiences.is_some(), "auth.audiences"),
        (file.groups_claim.is_some(), "auth.groups_claim"),
        (
            file.jwks_refresh_min_secs.is_some(),
            "auth.jwks_refresh_min_secs",
        ),
        (
            file.introspection_endpoint.is_some(),
            "auth.introspection_endpoint",
        ),
        (
            file.introspection_client_id.is_some(),
            "auth.introspection_client_id",
        ),
        (
            file.introspection_client_secret_file.is_some(),
            "auth.introspection_client_secret_file",
        ),
        (
            file.introspection_client_secret_env.is_some(),
            "auth.introspection_client_secret_env",
        ),
        (
            file.introspection_cache_secs.is_some(),
            "auth.introspection_cache_secs",
        ),
    ]
    .into_iter()
    .find_map(|(set, key)| set.then_some(key))
}

/// Whether `url` is on loopback (where plain http is allowed, for development).
fn on_loopback(url: &url::Url) -> bool {
    match url.host() {
        Some(url::Host::Domain(d)) => d.eq_ignore_ascii_case("localhost"),
        Some(url::Host::Ipv4(ip)) => ip.is_loopback(),
        Some(url::Host::Ipv6(ip)) => ip.is_loopback(),
        None => false,
    }
}

/// An https URL (plain http only on loopback), without query, fragment or credentials.
fn endpoint_url(key: &str, text: &str) -> Result<url::Url, ConfigError> {
    let url =
        url::Url::parse(text).map_err(|e| invalid(key, format!("`{text}` is not a URL: {e}")))?;
    if url.scheme() != "https" && !(url.scheme() == "http" && on_loopback(&url)) {
        return Err(invalid(
            key,
            "must be https (plain http only on loopback, for development)",
        ));
    }
    if url.query().is_some() || url.fragment().is_some() || !url.username().is_empty() {
        return Err(invalid(key, "must have no query, fragment or credentials"));
    }
    Ok(url)
}

/// Checks the external mode's keys of `[auth]` and reads the introspection client's secret,
/// with `env` standing for the process environment.
pub(super) fn external_config(
    file: &AuthSection,
    env: impl Fn(&str) -> Option<String>,
) -> Result<ExternalConfig, ConfigError> {
    let Some(issuer) = file.issuer.clone() else {
        return Err(invalid(
            "auth.issuer",
            "auth.mode = \"external\" needs the issuer of the authorization server, e.g. https://login.example.com/realms/company",
        ));
    };
    endpoint_url("auth.issuer", &issuer)?;
    let audiences = file.audiences.clone().unwrap_or_default();
    if audiences
        .iter()
        .any(|a| a.is_empty() || a.chars().any(char::is_control))
    {
        return Err(invalid(
            "auth.audiences",
            "audiences are non-empty strings without control characters",
        ));
    }
    let groups_claim = file.groups_claim.clone().unwrap_or_else(|| "groups".into());
    if groups_claim.is_empty() || groups_claim.chars().any(char::is_control) {
        return Err(invalid(
            "auth.groups_claim",
            "must be a claim name (not empty)",
        ));
    }
    let secs = |v: Option<u64>, default: u64, key: &str| match v {
        Some(0) => Err(invalid(format!("auth.{key}"), "must be at least 1")),
        Some(n) => Ok(Duration::from_secs(n)),
        None => Ok(Duration::from_secs(default)),
    };
    let introspection = match &file.introspection_endpoint {
        None => {
            if let Some(key) = [
                (
                    file.introspection_client_id.is_some(),
                    "auth.introspection_client_id",
                ),
                (
                    file.introspection_client_secret_file.is_some(),
                    "auth.introspection_client_secret_file",
                ),
                (
                    file.introspection_client_secret_env.is_some(),
                    "auth.introspection_client_secret_env",
                ),
            ]
            .into_iter()
            .find_map(|(set, key)| set.then_some(key))
            {
                return Err(invalid(
                    key,
                    "is for introspection: set auth.introspection_endpoint too",
                ));
            }
            None
        }
        Some(endpoint) => {
            let endpoint = endpoint_url("auth.introspection_endpoint", endpoint)?;
            let client_id = file
                .introspection_client_id
                .clone()
                .filter(|c| !c.is_empty() && !c.chars().any(char::is_control))
                .ok_or_else(|| {
                    invalid(
                        "auth.introspection_client_id",
                        "introspection needs the gateway's client id at the authorization server",
                    )
                })?;
            let client_secret = read_secret(
                file.introspection_client_secret_file.as_ref(),
                file.introspection_client_secret_env.as_deref(),
                env,
            )?;
            Some(IntrospectionConfig {
                endpoint,
                client_id,
                client_secret,
            })
        }
    };
    Ok(ExternalConfig {
        issuer,
        audiences,
        groups_claim,
        jwks_refresh_min: secs(file.jwks_refresh_min_secs, 10, "jwks_refresh_min_secs")?,
        introspection,
        introspection_cache: secs(
            file.introspection_cache_secs,
            60,
            "introspection_cache_secs",
        )?,
    })
}

/// The introspection client's secret: from a file (a mounted secret; a trailing newline is
/// not part of it), from a named environment variable, or from
/// [`INTROSPECTION_SECRET_ENV`].
fn read_secret(
    file: Option<&PathBuf>,
    var: Option<&str>,
    env: impl Fn(&str) -> Option<String>,
) -> Result<String, ConfigError> {
    let secret = match (file, var) {
        (Some(_), Some(_)) => {
            return Err(invalid(
                "auth.introspection_client_secret_file",
                "give the secret one way: introspection_client_secret_file or introspection_client_secret_env",
            ));
        }
        (Some(path), None) => std::fs::read_to_string(path)
            .map_err(|e| {
                invalid(
                    "auth.introspection_client_secret_file",
                    format!("cannot read {}: {e}", path.display()),
                )
            })?
            .trim_end_matches(['\r', '\n'])
            .to_owned(),
        (None, Some(var)) => env(var).ok_or_else(|| {
            invalid(
                "auth.introspection_client_secret_env",
                format!("`{var}` is not set in the gateway's environment"),
            )
        })?,
        (None, None) => env(INTROSPECTION_SECRET_ENV).ok_or_else(|| {
            invalid(
                "auth.introspection_client_secret_file",
                format!(
                    "introspection needs the client secret: a file (introspection_client_secret_file), or an environment variable (introspection_client_secret_env, or {INTROSPECTION_SECRET_ENV})"
                ),
            )
        })?,
    };
    if secret.is_empty() {
        return Err(invalid(
            "auth.introspection_client_secret_file",
            "the introspection client secret is empty",
        ));
    }
    Ok(secret)
}

#[cfg(test)]
mod tests {
    use crate::config::tests::cli;
    use crate::config::{AuthMode, Config, FileConfig};

    fn load(auth: &str) -> Result<Config, String> {
        let file = FileConfig::parse(&format!(
            "[auth]\npublic_url = \"https://gw.example.com/mcp\"\n{auth}\n[plugins.p]\ncommand = \"x\"\n"
        ))
        .unwrap();
        Config::merge(&cli(&[]), file).map_err(|e| e.to_string())
    }

    #[test]
    fn external_mode_is_checked_at_load() {
        let c = load(
            "mode = \"external\"\nissuer = \"https://idp.example.com/realms/acme\"\n\
             audiences = [\"api://mcp\"]\ngroups_claim = \"roles\"",
        )
        .unwrap();
        assert_eq!(c.auth.mode, AuthMode::External);
        let e = c.auth.external.unwrap();
        assert_eq!(e.issuer, "https://idp.example.com/realms/acme");
        assert_eq!(e.audiences, ["api://mcp"]);
        assert_eq!(e.groups_claim, "roles");
        assert!(e.introspection.is_none());
        assert_eq!(e.jwks_refresh_min.as_secs(), 10);

        for (auth, says) in [
            ("mode = \"external\"", "auth.issuer"),
            (
                "mode = \"external\"\nissuer = \"http://idp.example.com\"",
                "must be https",
            ),
            (
                "mode = \"external\"\nissuer = \"https://idp.example.com/?x=1\"",
                "no query",
            ),
            (
                "mode = \"external\"\nissuer = \"https://i\"\naudiences = [\"\"]",
                "auth.audiences",
            ),
            (
                "mode = \"external\"\nissuer = \"https://i\"\ngroups_claim = \"\"",
                "auth.groups_claim",
            ),
            (
                "mode = \"external\"\nissuer = \"https://i\"\njwks_refresh_min_secs = 0",
                "auth.jwks_refresh_min_secs",
            ),
            (
                "mode = \"external\"\nissuer = \"https://i\"\nintrospection_client_id = \"gw\"",
                "set auth.introspection_endpoint too",
            ),
            (
                "mode = \"external\"\nissuer = \"https://i\"\nintrospection_endpoint = \"https://i/introspect\"",
                "auth.introspection_client_id",
            ),
            (
                "mode = \"external\"\nissuer = \"https://i\"\nintrospection_endpoint = \"https://i/introspect\"\n\
                 introspection_client_id = \"gw\"\nintrospection_client_secret_env = \"MCP_GATEWAY_TEST_UNSET_VARIABLE\"",
                "MCP_GATEWAY_TEST_UNSET_VARIABLE",
            ),
            (
                "mode = \"external\"\nissuer = \"https://i\"\nintrospection_endpoint = \"https://i/introspect\"\n\
                 introspection_client_id = \"gw\"\nintrospection_client_secret_file = \"/nonexistent/secret\"",
                "cannot read /nonexistent/secret",
            ),
            (
                "mode = \"external\"\nissuer = \"https://i\"\nintrospection_endpoint = \"https://i/introspect\"\n\
                 introspection_client_id = \"gw\"\nintrospection_client_secret_file = \"/f\"\n\
                 introspection_client_secret_env = \"V\"",
                "one way",
            ),
            (
                "mode = \"external\"\nissuer = \"https://i\"\n[[auth.users]]\nname = \"a\"\npassword_hash = \"h\"",
                "auth.users",
            ),
            (
                "mode = \"builtin\"\nissuer = \"https://i\"",
                "`auth.issuer`: is for auth.mode = \"external\"",
            ),
            ("groups_claim = \"roles\"", "auth.groups_claim"),
        ] {
            let e = load(auth).unwrap_err();
            assert!(e.contains(says), "{auth}: {e}");
        }
    }

    #[test]
    fn the_introspection_secret_comes_from_a_file_and_is_never_printed() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("secret");
        std::fs::write(&path, "s3cret-value\n").unwrap();
        let c = load(&format!(
            "mode = \"external\"\nissuer = \"http://127.0.0.1:1\"\n\
             introspection_endpoint = \"http://127.0.0.1:1/introspect\"\n\
             introspection_client_id = \"gw\"\nintrospection_client_secret_file = \"{}\"\n\
             introspection_cache_secs = 5",
            path.display()
        ))
        .unwrap();
        let e = c.auth.external.as_ref().unwrap();
        let i = e.introspection.as_ref().unwrap();
        assert_eq!(i.client_secret(), "s3cret-value", "without the newline");
        assert_eq!(i.client_id, "gw");
        assert_eq!(e.introspection_cache.as_secs(), 5);
        assert!(!format!("{:?}", c.auth).contains("s3cret"));
    }
}
