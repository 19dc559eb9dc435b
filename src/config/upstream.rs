//! `[auth.upstream]`: the built-in authorization server lets people sign in at an OpenID
//! provider (Keycloak, Entra ID, Okta, Auth0, Google) instead of, or beside, the local
//! password form. The provider's issuer, the gateway's client there (its secret read from a
//! file or the environment, never from the config file itself), how an ID token's claims
//! become the gateway's subject and groups, and who may sign in at all. Plain data, checked
//! here; the `auth` module does the signing in.

use std::path::PathBuf;

use serde::Deserialize;

use super::{ConfigError, invalid};

/// The environment variable the upstream client secret is read from when the section names
/// neither a file nor another variable.
pub const UPSTREAM_SECRET_ENV: &str = "MCP_GATEWAY_UPSTREAM_CLIENT_SECRET";

/// Which claim of the ID token becomes the gateway's subject.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum SubjectClaim {
    /// `upstream:<sub>`: stable for as long as the account exists at the provider, never
    /// reassigned, but opaque to a person reading the rules.
    #[default]
    Sub,
    /// The (verified) email address: readable in access rules, but it changes when the
    /// person's address does, and a provider may reassign it.
    Email,
}

/// The upstream client's secret: kept out of `Debug` and logs.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret(String);

impl Secret {
    pub fn new(s: String) -> Secret {
        Secret(s)
    }

    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Secret(..)")
    }
}

/// Sign-in at an OpenID provider (`[auth.upstream]`).
#[derive(Debug, Clone)]
pub struct UpstreamConfig {
    /// The provider's issuer, exactly as its discovery document and ID tokens name it.
    pub issuer: String,
    /// The gateway's client id at the provider (also the `aud` of its ID tokens).
    pub client_id: String,
    /// The client secret; `None`: a public client (PKCE only).
    pub client_secret: Option<Secret>,
    /// Scopes asked of the provider (`openid` always among them).
    pub scopes: Vec<String>,
    pub subject: SubjectClaim,
    /// The ID token claim that lists the person's groups.
    pub groups_claim: String,
    /// Who may sign in: any of these addresses (compared without case), addresses at these
    /// domains, members of these groups. All empty: whoever the provider signs in.
    pub allowed_emails: Vec<String>,
    pub allowed_domains: Vec<String>,
    pub allowed_groups: Vec<String>,
    /// How the sign-in page names the provider.
    pub display_name: String,
    /// A person's subject is the ID token's `sub` as it is (mode `external`, where the
    /// people's pages sign in at the issuer whose tokens name people so), not `subject`'s.
    pub token_subject: bool,
}

impl UpstreamConfig {
    /// Whether any allow-list is set.
    pub fn restricts(&self) -> bool {
        !self.allowed_emails.is_empty()
            || !self.allowed_domains.is_empty()
            || !self.allowed_groups.is_empty()
    }
}

/// `[auth.upstream]` as written.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct UpstreamSection {
    pub issuer: String,
    pub client_id: String,
    /// A file holding the client secret (a mounted secret).
    pub client_secret_file: Option<PathBuf>,
    /// The environment variable holding the client secret [default:
    /// `MCP_GATEWAY_UPSTREAM_CLIENT_SECRET`, when set].
    pub client_secret_env: Option<String>,
    pub scopes: Option<Vec<String>>,
    pub subject: Option<SubjectClaim>,
    pub groups_claim: Option<String>,
    #[serde(default)]
    pub allowed_emails: Vec<String>,
    #[serde(default)]
    pub allowed_domains: Vec<String>,
    #[serde(default)]
    pub allowed_groups: Vec<String>,
    pub display_name: Option<String>,
}

/// A client secret given one way or none, under the settings `client_secret_file` (a
/// mounted secret, its trailing newline dropped) or `client_secret_env` (a variable of the
/// gateway's environment, read through `env`) of section `section`.
pub(super) fn client_secret(
    section: &str,
    file: Option<&std::path::Path>,
    var: Option<&str>,
    env: &impl Fn(&str) -> Option<String>,
) -> Result<Option<String>, ConfigError> {
    let key = |k: &str| format!("{section}.{k}");
    match (file, var) {
        (Some(_), Some(_)) => Err(invalid(
            key("client_secret_file"),
            "give the secret one way: client_secret_file or client_secret_env",
        )),
        (Some(path), None) => {
            let text = std::fs::read_to_string(path).map_err(|e| {
                invalid(
                    key("client_secret_file"),
                    format!("cannot read {}: {e}", path.display()),
                )
            })?;
            Ok(Some(text.trim_end_matches(['\r', '\n']).to_owned()))
        }
        (None, Some(var)) => env(var).map(Some).ok_or_else(|| {
            invalid(
                key("client_secret_env"),
                format!("`{var}` is not set in the gateway's environment"),
            )
        }),
        (None, None) => Ok(None),
    }
}

/// Whether `url` is on loopback (where plain http is allowed, for development).
pub fn is_loopback_url(url: &url::Url) -> bool {
    match url.host() {
        Some(url::Host::Domain(d)) => d.eq_ignore_ascii_case("localhost"),
        Some(url::Host::Ipv4(ip)) => ip.is_loopback(),
        Some(url::Host::Ipv6(ip)) => ip.is_loopback(),
        None => false,
    }
}

/// Checks `[auth.upstream]` and reads the client secret, with `env` standing for the
/// process environment.
pub(super) fn upstream_config(
    s: UpstreamSection,
    env: impl Fn(&str) -> Option<String>,
) -> Result<UpstreamConfig, ConfigError> {
    let key = |k: &str| format!("auth.upstream.{k}");
    let issuer = url::Url::parse(&s.issuer)
        .map_err(|e| invalid(key("issuer"), format!("`{}` is not a URL: {e}", s.issuer)))?;
    if issuer.scheme() != "https" && !(issuer.scheme() == "http" && is_loopback_url(&issuer)) {
        return Err(invalid(
            key("issuer"),
            "must be https (plain http only on loopback, for development)",
        ));
    }
    if issuer.query().is_some() || issuer.fragment().is_some() || !issuer.username().is_empty() {
        return Err(invalid(
            key("issuer"),
            "must have no query, fragment or credentials",
        ));
    }
    if s.client_id.is_empty() || s.client_id.chars().any(char::is_control) {
        return Err(invalid(key("client_id"), "must not be empty"));
    }
    let client_secret = match client_secret(
        "auth.upstream",
        s.client_secret_file.as_deref(),
        s.client_secret_env.as_deref(),
        &env,
    )? {
        Some(secret) => Some(secret),
        None => env(UPSTREAM_SECRET_ENV),
    };
    if client_secret.as_ref().is_some_and(|s| s.is_empty()) {
        return Err(invalid(
            key("client_secret_file"),
            "the client secret is empty",
        ));
    }
    let mut scopes = s
        .scopes
        .unwrap_or_else(|| vec!["openid".into(), "email".into(), "profile".into()]);
    if scopes
        .iter()
        .any(|w| w.is_empty() || w.contains([' ', '"', '\\']))
    {
        return Err(invalid(
            key("scopes"),
            "scopes are non-empty words without spaces or quotes",
        ));
    }
    if !scopes.iter().any(|w| w == "openid") {
        scopes.insert(0, "openid".into());
    }
    let groups_claim = s.groups_claim.unwrap_or_else(|| "groups".into());
    if groups_claim.is_empty() {
        return Err(invalid(key("groups_claim"), "must not be empty"));
    }
    let lists = [
        ("allowed_emails", &s.allowed_emails),
        ("allowed_domains", &s.allowed_domains),
        ("allowed_groups", &s.allowed_groups),
    ];
    for (k, list) in lists {
        if list
            .iter()
            .any(|v| v.is_empty() || v.chars().any(char::is_control))
        {
            return Err(invalid(key(k), "entries must not be empty"));
        }
    }
    if let Some(bad) = s.allowed_emails.iter().find(|e| !e.contains('@')) {
        return Err(invalid(
            key("allowed_emails"),
            format!("`{bad}` is not an email address"),
        ));
    }
    if let Some(bad) = s
        .allowed_domains
        .iter()
        .find(|d| d.contains('@') || d.starts_with('.'))
    {
        return Err(invalid(
            key("allowed_domains"),
            format!("`{bad}` is not a domain (write `example.com`)"),
        ));
    }
    let display_name = s.display_name.unwrap_or_else(|| {
        issuer
            .host_str()
            .unwrap_or("the identity provider")
            .to_owned()
    });
    Ok(UpstreamConfig {
        issuer: s.issuer,
        client_id: s.client_id,
        client_secret: client_secret.map(Secret::new),
        scopes,
        subject: s.subject.unwrap_or_default(),
        groups_claim,
        allowed_emails: s
            .allowed_emails
            .iter()
            .map(|e| e.to_ascii_lowercase())
            .collect(),
        allowed_domains: s
            .allowed_domains
            .iter()
            .map(|d| d.to_ascii_lowercase())
            .collect(),
        allowed_groups: s.allowed_groups,
        display_name,
        token_subject: false,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn section(extra: &str) -> UpstreamSection {
        toml::from_str(&format!(
            "issuer = \"https://id.example.com/realms/acme\"\nclient_id = \"gw\"\n{extra}"
        ))
        .unwrap()
    }

    #[test]
    fn upstream_settings_are_checked_and_the_secret_kept_out_of_debug() {
        let none = |_: &str| None;
        let c = upstream_config(section(""), none).unwrap();
        assert_eq!(c.scopes, ["openid", "email", "profile"]);
        assert_eq!(c.subject, SubjectClaim::Sub);
        assert_eq!(c.groups_claim, "groups");
        assert_eq!(c.display_name, "id.example.com");
        assert!(c.client_secret.is_none() && !c.restricts());

        let env = |v: &str| (v == UPSTREAM_SECRET_ENV).then(|| "s3cret-value".to_owned());
        let c = upstream_config(section("scopes = [\"email\"]"), env).unwrap();
        assert_eq!(c.client_secret.as_ref().unwrap().expose(), "s3cret-value");
        assert_eq!(c.scopes, ["openid", "email"], "openid is always asked");
        assert!(!format!("{c:?}").contains("s3cret"), "no secret in Debug");

        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("secret");
        std::fs::write(&file, "from-a-file\n").unwrap();
        let c = upstream_config(
            section(&format!(
                "client_secret_file = \"{}\"\nallowed_domains = [\"Example.COM\"]\nsubject = \"email\"",
                file.display()
            )),
            none,
        )
        .unwrap();
        assert_eq!(c.client_secret.unwrap().expose(), "from-a-file");
        assert_eq!(c.allowed_domains, ["example.com"]);
        assert_eq!(c.subject, SubjectClaim::Email);

        for (extra, says) in [
            ("client_secret_env = \"NOPE\"", "NOPE"),
            (
                "client_secret_env = \"A\"\nclient_secret_file = \"/x\"",
                "one way",
            ),
            (
                "client_secret_file = \"/nonexistent/secret\"",
                "cannot read",
            ),
            ("allowed_emails = [\"not-an-address\"]", "allowed_emails"),
            ("allowed_domains = [\"@example.com\"]", "allowed_domains"),
            ("groups_claim = \"\"", "groups_claim"),
            ("scopes = [\"a b\"]", "auth.upstream.scopes"),
        ] {
            let e = upstream_config(section(extra), none).unwrap_err();
            assert!(e.to_string().contains(says), "{extra}: {e}");
        }
        let mut s = section("");
        s.issuer = "http://id.example.com".into();
        assert!(
            upstream_config(s, none)
                .unwrap_err()
                .to_string()
                .contains("https")
        );
        let mut s = section("");
        s.issuer = "http://127.0.0.1:4000".into();
        assert!(upstream_config(s, none).is_ok(), "http on loopback");
    }
}
