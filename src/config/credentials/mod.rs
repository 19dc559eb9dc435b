//! `[credentials]`: each person's own credentials for the services behind the plugins. The
//! storage key's settings (`key_file`, else `key_env`, and `previous_key_files` still read
//! during a rotation), then a table per credential, `[credentials.NAME]`, of one of three
//! kinds: `oauth2` (the gateway is the OAuth client of an upstream authorization server),
//! `secret` (a value the person enters once) and `token_exchange` (RFC 8693 at the
//! organisation's authorization server). A plugin names one in its `env` or `args` as
//! `${credential:NAME}`, or `${credential_file:NAME}` for a file holding it
//! ([`references`]). Plain data, checked here; the `credentials` module keeps the values.

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use super::plugin::{PluginConfig, ProcessModel};
use super::upstream::{Secret, client_secret, is_loopback_url};
use super::{ConfigError, invalid};

/// The environment variable the storage key is read from when `key_file` is not set.
pub const CREDENTIALS_KEY_ENV: &str = "MCP_GATEWAY_CREDENTIALS_KEY";

/// The only variables a credential defined through the admin API may read its client secret
/// from: an operator provides them for that purpose, so the API cannot send the gateway's
/// other secrets (or a file's contents) to a token endpoint of its choosing.
pub const API_CLIENT_SECRET_PREFIX: &str = "MCP_GATEWAY_CLIENT_SECRET_";

/// What a definition given through the admin API may not do that the config file may: read
/// its client secret from a file, or from a variable not set aside for the purpose.
pub fn check_api_spec(name: &str, s: &CredentialSpec) -> Result<(), ConfigError> {
    if s.client_secret_file.is_some() {
        return Err(invalid(
            format!("credentials.{name}.client_secret_file"),
            format!(
                "a credential defined through the admin API reads its client secret from client_secret_env, a variable whose name begins with {API_CLIENT_SECRET_PREFIX} (files are for the config file)"
            ),
        ));
    }
    if let Some(var) = &s.client_secret_env
        && !var.starts_with(API_CLIENT_SECRET_PREFIX)
    {
        return Err(invalid(
            format!("credentials.{name}.client_secret_env"),
            format!(
                "through the admin API a client secret comes only from a variable whose name begins with {API_CLIENT_SECRET_PREFIX}"
            ),
        ));
    }
    Ok(())
}

/// Names that are settings of the section, not credentials.
const SETTINGS: &[&str] = &["key_file", "key_env", "previous_key_files"];

/// `[credentials]` as written: the key's settings, and every other table a credential.
#[derive(Debug, Default, Deserialize)]
pub struct CredentialsSection {
    /// A file holding the storage key: 32 bytes as 64 hexadecimal digits or in base64.
    pub key_file: Option<PathBuf>,
    /// The variable holding the key when there is no `key_file` [default:
    /// `MCP_GATEWAY_CREDENTIALS_KEY`].
    pub key_env: Option<String>,
    /// Keys that still decrypt what they encrypted, until it is used and encrypted again
    /// under the current one.
    #[serde(default)]
    pub previous_key_files: Vec<PathBuf>,
    #[serde(flatten)]
    pub credentials: BTreeMap<String, CredentialSpec>,
}

/// One `[credentials.NAME]` table as written (also an admin API body).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CredentialSpec {
    pub kind: CredentialKindName,
    /// How the connect page and the console name it [default: its name].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub label: Option<String>,
    /// `secret`: a regular expression the whole value must match.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pattern: Option<String>,
    /// `oauth2`, `token_exchange`: the authorization server's issuer, whose metadata (RFC
    /// 8414, else OpenID discovery) names the endpoints not given here.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub issuer: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub authorization_endpoint: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub token_endpoint: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub revocation_endpoint: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub client_id: Option<String>,
    /// A file holding the client secret (never the secret itself in the config).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub client_secret_file: Option<PathBuf>,
    /// The environment variable holding the client secret.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub client_secret_env: Option<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub scopes: Vec<String>,
    /// `oauth2`: PKCE (S256) [default: true; only a server that refuses it needs false].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pkce: Option<bool>,
    /// `token_exchange`: the `audience` and `resource` asked for.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub audience: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resource: Option<String>,
    /// `oauth2`: the remote MCP server the token is for. Its protected resource metadata
    /// (RFC 9728) names the authorization server (no `issuer` needed); the token is asked for
    /// it (`resource`, RFC 8707); without a `client_id` the gateway registers itself.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mcp_server: Option<String>,
    /// `oauth2` with `mcp_server` and no `client_id`: how the gateway registers itself.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub registration: Option<Registration>,
}

/// How the gateway becomes a client of an MCP server's authorization server.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Registration {
    /// A client ID metadata document where the server supports them, else dynamic
    /// registration (RFC 7591).
    #[default]
    Auto,
    /// Only a client ID metadata document (served by the gateway at
    /// `/connect/clients/NAME`).
    MetadataDocument,
    /// Only dynamic client registration.
    Dynamic,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CredentialKindName {
    Oauth2,
    Secret,
    TokenExchange,
}

/// A credential, checked.
#[derive(Debug, Clone)]
pub struct CredentialConfig {
    pub name: String,
    pub label: String,
    pub kind: CredentialKind,
}

/// Where an OAuth client finds the authorization server's endpoints.
#[derive(Debug, Clone)]
pub struct OAuthServer {
    pub issuer: Option<url::Url>,
    pub authorization_endpoint: Option<url::Url>,
    pub token_endpoint: Option<url::Url>,
    pub revocation_endpoint: Option<url::Url>,
    /// Empty when the gateway registers itself (`mcp_server` without `client_id`).
    pub client_id: String,
    pub client_secret: Option<Secret>,
    pub scopes: Vec<String>,
    /// The MCP server the token is for (see [`CredentialSpec::mcp_server`]).
    pub mcp_server: Option<url::Url>,
    pub registration: Registration,
}

#[derive(Debug, Clone)]
pub enum CredentialKind {
    OAuth2 {
        server: OAuthServer,
        pkce: bool,
    },
    Secret {
        pattern: Option<regex::Regex>,
    },
    TokenExchange {
        server: OAuthServer,
        audience: Option<String>,
        resource: Option<String>,
    },
}

/// The storage key and the keys before it.
#[derive(Clone, Default)]
pub struct CredentialKeys {
    /// Encrypts, and decrypts what it encrypted.
    pub current: Option<[u8; 32]>,
    /// Only decrypt.
    pub previous: Vec<[u8; 32]>,
}

impl std::fmt::Debug for CredentialKeys {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "CredentialKeys {{ current: {}, previous: {} }}",
            if self.current.is_some() {
                "set"
            } else {
                "none"
            },
            self.previous.len()
        )
    }
}

/// `[credentials]`, checked.
#[derive(Debug, Clone, Default)]
pub struct CredentialsConfig {
    pub keys: CredentialKeys,
    pub credentials: Vec<CredentialConfig>,
    /// Files the section read a secret from: hidden from plugins like the config file.
    pub secret_files: Vec<PathBuf>,
    /// Networks the servers of credentials defined through the admin API may be reached in,
    /// besides global unicast addresses (`[sandbox] remote_networks`).
    pub remote_networks: Vec<ipnet::IpNet>,
}

impl CredentialsConfig {
    pub fn get(&self, name: &str) -> Option<&CredentialConfig> {
        self.credentials.iter().find(|c| c.name == name)
    }

    /// The names of the credentials defined.
    pub fn names(&self) -> Vec<String> {
        self.credentials.iter().map(|c| c.name.clone()).collect()
    }
}

/// What a value of a plugin's `env` or `args` refers to: `${NAME}`, `${credential:NAME}`,
/// `${credential_file:NAME}`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reference<'a> {
    /// A variable of the gateway's environment.
    Env(&'a str),
    /// The caller's credential, as its value.
    Credential(&'a str),
    /// The caller's credential, as the path of a file holding it.
    CredentialFile(&'a str),
}

impl<'a> Reference<'a> {
    /// The credential it names, if it names one.
    pub fn credential(self) -> Option<&'a str> {
        match self {
            Reference::Env(_) => None,
            Reference::Credential(n) | Reference::CredentialFile(n) => Some(n),
        }
    }
}

/// Replaces each reference in `value` with what `lookup` gives for it.
pub fn expand(
    value: &str,
    mut lookup: impl FnMut(Reference<'_>) -> Result<String, String>,
) -> Result<String, String> {
    let mut out = String::with_capacity(value.len());
    let mut rest = value;
    while let Some(start) = rest.find("${") {
        out.push_str(&rest[..start]);
        let after = &rest[start + 2..];
        let end = after
            .find('}')
            .ok_or_else(|| format!("`{value}` has an unclosed `${{`"))?;
        out.push_str(&lookup(reference(&after[..end])?)?);
        rest = &after[end + 1..];
    }
    out.push_str(rest);
    Ok(out)
}

/// The references in `value` (an error names a malformed one).
pub fn references(value: &str) -> Result<Vec<Reference<'_>>, String> {
    let mut found = Vec::new();
    let mut rest = value;
    while let Some(start) = rest.find("${") {
        let after = &rest[start + 2..];
        let end = after
            .find('}')
            .ok_or_else(|| format!("`{value}` has an unclosed `${{`"))?;
        found.push(reference(&after[..end])?);
        rest = &after[end + 1..];
    }
    Ok(found)
}

fn reference(inner: &str) -> Result<Reference<'_>, String> {
    let word = |s: &str| !s.is_empty() && s.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
    let credential = |s: &str| word_or_dash(s);
    match inner.split_once(':') {
        None if word(inner) => Ok(Reference::Env(inner)),
        Some(("credential", n)) if credential(n) => Ok(Reference::Credential(n)),
        Some(("credential_file", n)) if credential(n) => Ok(Reference::CredentialFile(n)),
        _ => Err(format!(
            "`${{{inner}}}` is neither a variable name nor `credential:NAME` or `credential_file:NAME`"
        )),
    }
}

/// A credential's name: letters, digits, `-` and `_`.
fn word_or_dash(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 64
        && s.chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
}

/// The credentials `p` is started with (`${credential:NAME}` or `${credential_file:NAME}` in
/// its `env` or `args`): a process of it serves one person.
pub fn credentials_used(p: &PluginConfig) -> BTreeSet<&str> {
    p.referring_values()
        .filter_map(|(_, v)| references(v).ok())
        .flatten()
        .filter_map(Reference::credential)
        .collect()
}

/// Whether plugin `p` is given credential `name` only as a file (`${credential_file:NAME}`),
/// which can be written again while it runs, and never as a value in its `env` or `args`.
pub fn credential_in_files_only(p: &PluginConfig, name: &str) -> bool {
    let refs: Vec<Reference<'_>> = p
        .referring_values()
        .filter_map(|(_, v)| references(v).ok())
        .flatten()
        .filter(|r| r.credential() == Some(name))
        .collect();
    !refs.is_empty()
        && refs
            .iter()
            .all(|r| matches!(r, Reference::CredentialFile(_)))
}

/// Checks what plugin `p` refers to of the credentials defined (`credentials`): each one it
/// names is defined; one in a file needs its sandbox, which makes the file; a plugin started
/// with a person's credential runs a process per session and keeps none warm.
pub(super) fn check_plugin(p: &PluginConfig, credentials: &[String]) -> Result<(), ConfigError> {
    let key = |k: &str| format!("plugins.{}.{k}", p.name);
    let values = p.referring_values();
    let (mut used, mut in_a_file) = (BTreeSet::new(), None);
    for (k, value) in values {
        for r in references(value).map_err(|m| invalid(key(&k), m))? {
            let Some(n) = r.credential() else { continue };
            if !credentials.iter().any(|c| c == n) {
                return Err(invalid(
                    key(&k),
                    format!("refers to credential `{n}`, which [credentials.{n}] does not define"),
                ));
            }
            if matches!(r, Reference::CredentialFile(_)) {
                in_a_file.get_or_insert(n);
            }
            used.insert(n);
        }
    }
    if let Some(n) = in_a_file
        && p.sandbox.is_none()
    {
        return Err(invalid(
            key("sandbox"),
            format!(
                "`${{credential_file:{n}}}` is a file in the instance's own home, which its sandbox makes: leave the sandbox on"
            ),
        ));
    }
    let Some(first) = used.first() else {
        if p.connect == super::plugin::Connect::Eager {
            return Err(invalid(
                key("connect"),
                "\"eager\" asks for the plugin's people's credentials, and it uses none",
            ));
        }
        return Ok(());
    };
    if p.process_model == ProcessModel::Shared {
        return Err(invalid(
            key("process_model"),
            format!(
                "uses `{first}`, a person's own credential, so a process of it must serve one person: process_model = \"per_session\" or \"per_subject\""
            ),
        ));
    }
    if p.warm > 0 {
        return Err(invalid(
            key("warm"),
            format!(
                "uses `{first}`, a person's own credential: a process started ahead of demand would not know whose"
            ),
        ));
    }
    Ok(())
}

/// Checks `[credentials]`, reading the keys and client secrets, with `env` standing for the
/// process environment.
pub fn credentials_config(
    s: CredentialsSection,
    env: impl Fn(&str) -> Option<String>,
) -> Result<CredentialsConfig, ConfigError> {
    let mut secret_files = Vec::new();
    let current = match (&s.key_file, &s.key_env) {
        (Some(_), Some(_)) => {
            return Err(invalid(
                "credentials.key_file",
                "give the key one way: key_file or key_env",
            ));
        }
        (Some(path), None) => {
            secret_files.push(path.clone());
            Some(key_from_file("credentials.key_file", path)?)
        }
        (None, var) => {
            let var = var.as_deref().unwrap_or(CREDENTIALS_KEY_ENV);
            match env(var) {
                Some(text) => Some(
                    parse_key(&text)
                        .map_err(|m| invalid("credentials.key_env", format!("`{var}`: {m}")))?,
                ),
                None if s.key_env.is_some() => {
                    return Err(invalid(
                        "credentials.key_env",
                        format!("`{var}` is not set in the gateway's environment"),
                    ));
                }
                None => None,
            }
        }
    };
    let mut previous = Vec::new();
    for path in &s.previous_key_files {
        secret_files.push(path.clone());
        previous.push(key_from_file("credentials.previous_key_files", path)?);
    }
    let mut credentials = Vec::new();
    for (name, spec) in s.credentials {
        // A client secret's file is as secret as the key.
        secret_files.extend(spec.client_secret_file.clone());
        credentials.push(credential_config(&name, spec, &env)?);
    }
    if !credentials.is_empty() && current.is_none() {
        return Err(invalid(
            "credentials.key_file",
            format!(
                "credentials are stored encrypted under a key that is not in the database: set credentials.key_file, or {CREDENTIALS_KEY_ENV} (32 bytes, as 64 hexadecimal digits or base64)"
            ),
        ));
    }
    Ok(CredentialsConfig {
        keys: CredentialKeys { current, previous },
        credentials,
        secret_files,
        // From `[sandbox]`, set where both sections are read.
        remote_networks: Vec::new(),
    })
}

/// Checks one credential's definition (also for the admin API).
pub fn credential_config(
    name: &str,
    s: CredentialSpec,
    env: impl Fn(&str) -> Option<String>,
) -> Result<CredentialConfig, ConfigError> {
    let key = |k: &str| format!("credentials.{name}.{k}");
    if SETTINGS.contains(&name) || !word_or_dash(name) {
        return Err(invalid(
            format!("credentials.{name}"),
            "a credential's name is letters, digits, '-' and '_' (at most 64), and not one of the section's settings",
        ));
    }
    let label = s.label.clone().unwrap_or_else(|| name.to_owned());
    if label.is_empty() || label.len() > 200 || label.chars().any(char::is_control) {
        return Err(invalid(
            key("label"),
            "must be 1 to 200 characters, none a control",
        ));
    }
    // What belongs to another kind is refused rather than silently ignored.
    let stray = |k: &str, set: bool| -> Result<(), ConfigError> {
        if set {
            return Err(invalid(
                key(k),
                format!("is not a setting of a `{}` credential", kind_name(s.kind)),
            ));
        }
        Ok(())
    };
    let oauth = matches!(
        s.kind,
        CredentialKindName::Oauth2 | CredentialKindName::TokenExchange
    );
    stray("pattern", s.pattern.is_some() && oauth)?;
    for (k, set) in [
        ("issuer", s.issuer.is_some()),
        ("authorization_endpoint", s.authorization_endpoint.is_some()),
        ("token_endpoint", s.token_endpoint.is_some()),
        ("revocation_endpoint", s.revocation_endpoint.is_some()),
        ("client_id", s.client_id.is_some()),
        ("client_secret_file", s.client_secret_file.is_some()),
        ("client_secret_env", s.client_secret_env.is_some()),
        ("scopes", !s.scopes.is_empty()),
    ] {
        stray(k, set && !oauth)?;
    }
    stray(
        "pkce",
        s.pkce.is_some() && s.kind != CredentialKindName::Oauth2,
    )?;
    for (k, set) in [
        ("mcp_server", s.mcp_server.is_some()),
        ("registration", s.registration.is_some()),
    ] {
        stray(k, set && s.kind != CredentialKindName::Oauth2)?;
    }
    stray(
        "registration",
        s.registration.is_some() && (s.mcp_server.is_none() || s.client_id.is_some()),
    )?;
    for (k, set) in [
        ("audience", s.audience.is_some()),
        ("resource", s.resource.is_some()),
    ] {
        stray(k, set && s.kind != CredentialKindName::TokenExchange)?;
    }
    stray(
        "authorization_endpoint",
        s.authorization_endpoint.is_some() && s.kind == CredentialKindName::TokenExchange,
    )?;
    let kind = match s.kind {
        CredentialKindName::Secret => {
            let pattern = match &s.pattern {
                None => None,
                Some(p) => Some(
                    // Anchored: the whole value must match, not a part of it.
                    regex::Regex::new(&format!("^(?:{p})$"))
                        .map_err(|e| invalid(key("pattern"), format!("not a pattern: {e}")))?,
                ),
            };
            CredentialKind::Secret { pattern }
        }
        CredentialKindName::Oauth2 => {
            let server = oauth_server(name, &s, &env)?;
            if server.issuer.is_none()
                && server.mcp_server.is_none()
                && (server.authorization_endpoint.is_none() || server.token_endpoint.is_none())
            {
                return Err(invalid(
                    key("issuer"),
                    "set the issuer (its metadata names the endpoints), mcp_server (whose metadata names the issuer), or both authorization_endpoint and token_endpoint",
                ));
            }
            CredentialKind::OAuth2 {
                server,
                pkce: s.pkce.unwrap_or(true),
            }
        }
        CredentialKindName::TokenExchange => {
            let server = oauth_server(name, &s, &env)?;
            if server.issuer.is_none() && server.token_endpoint.is_none() {
                return Err(invalid(
                    key("issuer"),
                    "set the issuer (its metadata names the token endpoint), or token_endpoint",
                ));
            }
            for (k, v) in [("audience", &s.audience), ("resource", &s.resource)] {
                if v.as_ref()
                    .is_some_and(|v| v.is_empty() || v.chars().any(char::is_control))
                {
                    return Err(invalid(key(k), "must not be empty"));
                }
            }
            if let Some(r) = &s.resource {
                url::Url::parse(r).map_err(|e| {
                    invalid(key("resource"), format!("must be an absolute URI: {e}"))
                })?;
            }
            CredentialKind::TokenExchange {
                server,
                audience: s.audience.clone(),
                resource: s.resource.clone(),
            }
        }
    };
    Ok(CredentialConfig {
        name: name.to_owned(),
        label,
        kind,
    })
}

fn kind_name(k: CredentialKindName) -> &'static str {
    match k {
        CredentialKindName::Oauth2 => "oauth2",
        CredentialKindName::Secret => "secret",
        CredentialKindName::TokenExchange => "token_exchange",
    }
}

fn oauth_server(
    name: &str,
    s: &CredentialSpec,
    env: &impl Fn(&str) -> Option<String>,
) -> Result<OAuthServer, ConfigError> {
    let key = |k: &str| format!("credentials.{name}.{k}");
    let url = |k: &str, v: &Option<String>| -> Result<Option<url::Url>, ConfigError> {
        let Some(v) = v else { return Ok(None) };
        let u =
            url::Url::parse(v).map_err(|e| invalid(key(k), format!("`{v}` is not a URL: {e}")))?;
        if u.scheme() != "https" && !(u.scheme() == "http" && is_loopback_url(&u)) {
            return Err(invalid(
                key(k),
                "must be https (plain http only on loopback, for development)",
            ));
        }
        if u.fragment().is_some() || !u.username().is_empty() || u.password().is_some() {
            return Err(invalid(key(k), "must have no fragment or credentials"));
        }
        Ok(Some(u))
    };
    let registers = s.mcp_server.is_some() && s.client_id.is_none();
    let client_id = match s.client_id.clone() {
        None if registers => String::new(),
        c => c
            .filter(|c| !c.is_empty() && !c.chars().any(char::is_control))
            .ok_or_else(|| {
                invalid(
                    key("client_id"),
                    "the gateway's client id there is needed (or mcp_server, and the gateway registers itself)",
                )
            })?,
    };
    let client_secret = client_secret(
        &format!("credentials.{name}"),
        s.client_secret_file.as_deref(),
        s.client_secret_env.as_deref(),
        env,
    )?;
    if client_secret.as_ref().is_some_and(String::is_empty) {
        return Err(invalid(
            key("client_secret_file"),
            "the client secret is empty",
        ));
    }
    if s.scopes
        .iter()
        .any(|w| w.is_empty() || w.contains([' ', '"', '\\']) || w.chars().any(char::is_control))
    {
        return Err(invalid(
            key("scopes"),
            "scopes are non-empty words without spaces or quotes",
        ));
    }
    Ok(OAuthServer {
        issuer: url("issuer", &s.issuer)?,
        authorization_endpoint: url("authorization_endpoint", &s.authorization_endpoint)?,
        token_endpoint: url("token_endpoint", &s.token_endpoint)?,
        revocation_endpoint: url("revocation_endpoint", &s.revocation_endpoint)?,
        client_id,
        client_secret: client_secret.map(Secret::new),
        scopes: s.scopes.clone(),
        mcp_server: url("mcp_server", &s.mcp_server)?,
        registration: s.registration.unwrap_or_default(),
    })
}

fn key_from_file(key: &str, path: &std::path::Path) -> Result<[u8; 32], ConfigError> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| invalid(key, format!("cannot read {}: {e}", path.display())))?;
    parse_key(&text).map_err(|m| invalid(key, format!("{}: {m}", path.display())))
}

/// A storage key: 32 bytes, as 64 hexadecimal digits or in base64 (standard or URL-safe,
/// padded or not).
pub fn parse_key(text: &str) -> Result<[u8; 32], String> {
    use base64::Engine as _;
    let text = text.trim();
    let bytes = if text.len() == 64 && text.bytes().all(|b| b.is_ascii_hexdigit()) {
        (0..32)
            .map(|i| u8::from_str_radix(&text[2 * i..2 * i + 2], 16).expect("hex digits"))
            .collect()
    } else {
        let t = text.trim_end_matches('=');
        base64::engine::general_purpose::STANDARD_NO_PAD
            .decode(t)
            .or_else(|_| base64::engine::general_purpose::URL_SAFE_NO_PAD.decode(t))
            .map_err(|_| "a key is 32 bytes, as 64 hexadecimal digits or base64".to_owned())?
    };
    <[u8; 32]>::try_from(bytes).map_err(|b| format!("a key is 32 bytes, this one is {}", b.len()))
}

#[cfg(test)]
mod tests;
