//! The `[auth]` section: how `/mcp` is authorized, the built-in authorization server's
//! users, provisioned clients, lifetimes and rate limits, merged over the flags and checked
//! against the listen address. Plain data: the `auth` module does the authorizing.

use std::net::SocketAddr;
use std::time::Duration;

use clap::ValueEnum;
use serde::{Deserialize, Serialize};

use super::external::{ExternalConfig, external_config};
use super::file::AuthSection;
use super::upstream::{SubjectClaim, UpstreamConfig, is_loopback_url, upstream_config};
use super::{Cli, ConfigError, invalid};

/// How `/mcp` is authorized.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, ValueEnum, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum AuthMode {
    /// No authorization (loopback quick start).
    #[default]
    None,
    /// The gateway is resource server and authorization server.
    Builtin,
    /// The gateway is resource server for an authorization server it does not run.
    External,
}

/// A user who can sign in at the built-in authorization server.
#[derive(Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct UserConfig {
    pub name: String,
    /// An argon2 PHC string (`mcp-gateway hash-password` makes one).
    pub password_hash: String,
    /// The groups the user's tokens carry (for plugins' `allow_groups`).
    #[serde(default)]
    pub groups: Vec<String>,
}

impl std::fmt::Debug for UserConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "UserConfig({})", self.name)
    }
}

/// A confidential client the operator provisions (`[[auth.clients]]`): the only kind that may
/// use the `client_credentials` grant. Self-registered clients (RFC 7591, metadata documents)
/// never can.
#[derive(Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ClientConfig {
    pub client_id: String,
    /// An argon2 PHC string of the client secret (`mcp-gateway hash-password` makes one).
    pub secret_hash: String,
    /// The scopes it may be given. [default: `auth.scopes`]
    pub scopes: Option<Vec<String>>,
    /// A name for logs.
    pub name: Option<String>,
}

impl std::fmt::Debug for ClientConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "ClientConfig({})", self.client_id)
    }
}

/// OAuth 2.1 settings (`[auth]`).
#[derive(Debug, Clone)]
pub struct AuthConfig {
    pub mode: AuthMode,
    /// The public URL of `/mcp`.
    pub public_url: Option<url::Url>,
    /// Scopes every request to `/mcp` needs.
    pub scopes: Vec<String>,
    /// The authorization server of mode `external`.
    pub external: Option<ExternalConfig>,
    pub users: Vec<UserConfig>,
    /// Clients provisioned by the operator (client credentials).
    pub clients: Vec<ClientConfig>,
    pub access_ttl: Duration,
    pub refresh_ttl: Duration,
    pub code_ttl: Duration,
    /// Let client ID metadata documents be fetched from private and loopback addresses (and
    /// over http on loopback): for development only.
    pub cimd_allow_private: bool,
    /// Dynamic client registrations accepted per minute from one client address (and 20
    /// times that from all together, a ceiling on what strangers can store).
    pub registrations_per_minute: u32,
    /// Client ID metadata documents fetched per minute for one client address, and for all
    /// together (cached documents do not count).
    pub cimd_fetches_per_minute: u32,
    pub cimd_fetches_per_minute_total: u32,
    /// Failed sign-ins a user name, and a client address, may have in `signin_lockout`
    /// before further sign-ins with it (even right ones) are refused until the window ends.
    pub failed_signins_per_user: u32,
    pub failed_signins_per_address: u32,
    pub signin_lockout: Duration,
    /// People sign in at this OpenID provider (`[auth.upstream]`).
    pub upstream: Option<UpstreamConfig>,
}

impl Default for AuthConfig {
    fn default() -> Self {
        AuthConfig {
            mode: AuthMode::None,
            public_url: None,
            scopes: vec!["mcp".into()],
            external: None,
            users: Vec::new(),
            clients: Vec::new(),
            access_ttl: Duration::from_secs(600),
            refresh_ttl: Duration::from_secs(30 * 24 * 3600),
            code_ttl: Duration::from_secs(60),
            cimd_allow_private: false,
            registrations_per_minute: 30,
            cimd_fetches_per_minute: 20,
            cimd_fetches_per_minute_total: 200,
            failed_signins_per_user: 10,
            failed_signins_per_address: 30,
            signin_lockout: Duration::from_secs(900),
            upstream: None,
        }
    }
}

/// The `[auth]` settings over the flags, validated against the listen address.
pub(super) fn auth_config(
    cli: &Cli,
    file: AuthSection,
    listen: SocketAddr,
) -> Result<AuthConfig, ConfigError> {
    let d = AuthConfig::default();
    let mode = cli.auth_mode.or(file.mode).unwrap_or_default();
    let allow_unauthenticated =
        cli.allow_unauthenticated || file.allow_unauthenticated == Some(true);
    if mode == AuthMode::None && !listen.ip().is_loopback() && !allow_unauthenticated {
        return Err(invalid(
            "auth.mode",
            format!(
                "listening on {listen}, beyond loopback, without authorization: set auth.mode = \"builtin\" (--auth-mode builtin), or allow it explicitly with auth.allow_unauthenticated = true (--allow-unauthenticated)"
            ),
        ));
    }
    let public_url = match cli.public_url.clone().or(file.public_url.clone()) {
        None if mode != AuthMode::None => {
            return Err(invalid(
                "auth.public_url",
                format!(
                    "auth.mode = \"{}\" needs the public URL of /mcp, e.g. https://mcp.example.com/mcp",
                    if mode == AuthMode::Builtin {
                        "builtin"
                    } else {
                        "external"
                    }
                ),
            ));
        }
        None => None,
        Some(u) => {
            let url = url::Url::parse(&u)
                .map_err(|e| invalid("auth.public_url", format!("`{u}` is not a URL: {e}")))?;
            let loopback = is_loopback_url(&url);
            if url.scheme() != "https" && !(url.scheme() == "http" && loopback) {
                return Err(invalid(
                    "auth.public_url",
                    "must be https (plain http only on loopback, for development)",
                ));
            }
            if url.query().is_some() || url.fragment().is_some() || !url.username().is_empty() {
                return Err(invalid(
                    "auth.public_url",
                    "must have no query, fragment or credentials",
                ));
            }
            Some(url)
        }
    };
    let external = match mode {
        AuthMode::External => {
            if !file.users.is_empty() || !file.clients.is_empty() {
                return Err(invalid(
                    if file.users.is_empty() {
                        "auth.clients"
                    } else {
                        "auth.users"
                    },
                    "users and clients are the built-in authorization server's; in external mode they are the authorization server's",
                ));
            }
            Some(external_config(&file, crate::config::secret_env_var)?)
        }
        _ => {
            if let Some(key) = super::external::given(&file) {
                return Err(invalid(key, "is for auth.mode = \"external\""));
            }
            None
        }
    };
    let scopes = file.scopes.unwrap_or(d.scopes);
    if scopes
        .iter()
        .any(|s| s.is_empty() || s.contains([' ', '"', '\\']))
    {
        return Err(invalid(
            "auth.scopes",
            "scopes are non-empty words without spaces or quotes",
        ));
    }
    for u in &file.users {
        if argon2::PasswordHash::new(&u.password_hash).is_err() {
            return Err(invalid(
                format!("auth.users.{}.password_hash", u.name),
                "not an argon2 hash (make one with `mcp-gateway hash-password`)",
            ));
        }
        if u.groups
            .iter()
            .any(|g| g.is_empty() || g.len() > 256 || g.chars().any(char::is_control))
        {
            return Err(invalid(
                format!("auth.users.{}.groups", u.name),
                "group names are 1 to 256 characters, no control characters",
            ));
        }
    }
    let upstream = match file.upstream {
        None => None,
        Some(_) if mode == AuthMode::None => {
            return Err(invalid(
                "auth.upstream",
                "sign-in at an upstream provider needs auth.mode = \"builtin\" (or \"external\", for the people's credential pages)",
            ));
        }
        Some(section) => {
            let mut up = upstream_config(section, crate::config::secret_env_var)?;
            if mode == AuthMode::External {
                // The people's pages sign in at the issuer whose tokens name them: the same
                // `sub` names the same person.
                if Some(up.issuer.trim_end_matches('/'))
                    != file.issuer.as_deref().map(|i| i.trim_end_matches('/'))
                {
                    return Err(invalid(
                        "auth.upstream.issuer",
                        "in external mode, the people's pages sign in at auth.issuer: name the same issuer",
                    ));
                }
                if up.subject != SubjectClaim::Sub {
                    return Err(invalid(
                        "auth.upstream.subject",
                        "in external mode a person is the `sub` of the issuer's tokens",
                    ));
                }
                up.token_subject = true;
            }
            Some(up)
        }
    };
    // An upstream person's subject must never be a local user's or a provisioned client's:
    // their tokens would speak for each other.
    if let Some(up) = &upstream {
        let names = file
            .users
            .iter()
            .map(|u| ("auth.users", &u.name))
            .chain(file.clients.iter().map(|c| ("auth.clients", &c.client_id)));
        for (section, name) in names {
            let clash = match up.subject {
                SubjectClaim::Sub => name.starts_with("upstream:"),
                SubjectClaim::Email => name.contains('@'),
            };
            if clash {
                return Err(invalid(
                    format!("{section}.{name}"),
                    "this name could be the subject of a person signed in upstream (`upstream:…`, or an email address with auth.upstream.subject = \"email\"); pick another",
                ));
            }
        }
    }
    let word = |s: &String| !s.is_empty() && !s.contains([' ', '"', '\\']);
    let mut client_ids = std::collections::BTreeSet::new();
    for c in &file.clients {
        let key = format!("auth.clients.{}", c.client_id);
        if c.client_id.is_empty()
            || c.client_id.len() > 128
            || !c.client_id.bytes().all(|b| b.is_ascii_graphic())
            || c.client_id.contains(':')
        {
            return Err(invalid(
                "auth.clients.client_id",
                format!(
                    "`{}` is not a client id: 1 to 128 printable ASCII characters without spaces or `:`",
                    c.client_id.escape_debug()
                ),
            ));
        }
        if !client_ids.insert(c.client_id.as_str()) {
            return Err(invalid(key, "this client_id is given twice"));
        }
        // A client_credentials token's subject is its client id: it must not be a user's.
        if file.users.iter().any(|u| u.name == c.client_id) {
            return Err(invalid(
                key,
                "a client_id may not be a user's name (its tokens would speak for that user)",
            ));
        }
        if argon2::PasswordHash::new(&c.secret_hash).is_err() {
            return Err(invalid(
                format!("{key}.secret_hash"),
                "not an argon2 hash (make one with `mcp-gateway hash-password`)",
            ));
        }
        if c.scopes.as_ref().is_some_and(|s| !s.iter().all(word)) {
            return Err(invalid(
                format!("{key}.scopes"),
                "scopes are non-empty words without spaces or quotes",
            ));
        }
    }
    let at_least_one = |v: Option<u32>, default: u32, key: &str| match v {
        Some(0) => Err(invalid(format!("auth.{key}"), "must be at least 1")),
        Some(n) => Ok(n),
        None => Ok(default),
    };
    let secs = |v: Option<u64>, default: Duration, key: &str| match v {
        Some(0) => Err(invalid(format!("auth.{key}"), "must be at least 1")),
        Some(n) => Ok(Duration::from_secs(n)),
        None => Ok(default),
    };
    Ok(AuthConfig {
        mode,
        public_url,
        scopes,
        external,
        users: file.users,
        clients: file.clients,
        access_ttl: secs(
            file.access_token_ttl_secs,
            d.access_ttl,
            "access_token_ttl_secs",
        )?,
        refresh_ttl: secs(
            file.refresh_token_ttl_secs,
            d.refresh_ttl,
            "refresh_token_ttl_secs",
        )?,
        code_ttl: secs(file.code_ttl_secs, d.code_ttl, "code_ttl_secs")?,
        cimd_allow_private: file.cimd_allow_private.unwrap_or(false),
        registrations_per_minute: at_least_one(
            file.registrations_per_minute,
            d.registrations_per_minute,
            "registrations_per_minute",
        )?,
        cimd_fetches_per_minute: at_least_one(
            file.cimd_fetches_per_minute,
            d.cimd_fetches_per_minute,
            "cimd_fetches_per_minute",
        )?,
        cimd_fetches_per_minute_total: at_least_one(
            file.cimd_fetches_per_minute_total,
            d.cimd_fetches_per_minute_total,
            "cimd_fetches_per_minute_total",
        )?,
        failed_signins_per_user: at_least_one(
            file.failed_signins_per_user,
            d.failed_signins_per_user,
            "failed_signins_per_user",
        )?,
        failed_signins_per_address: at_least_one(
            file.failed_signins_per_address,
            d.failed_signins_per_address,
            "failed_signins_per_address",
        )?,
        signin_lockout: secs(
            file.signin_lockout_secs,
            d.signin_lockout,
            "signin_lockout_secs",
        )?,
        upstream,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::tests::cli;
    use crate::config::{Config, FileConfig};

    #[test]
    fn authorization_settings_are_checked() {
        let beyond = ["--listen", "0.0.0.0:8080", "--allowed-hosts", "h"];
        let e = Config::load(&cli(&[&beyond[..], &["--", "x"]].concat())).unwrap_err();
        assert!(e.to_string().contains("auth.mode"), "{e}");
        let e = Config::load(&cli(
            &[&beyond[..], &["--auth-mode", "builtin", "--", "x"]].concat()
        ))
        .unwrap_err();
        assert!(e.to_string().contains("auth.public_url"), "{e}");
        let e = Config::load(&cli(&[
            &beyond[..],
            &[
                "--auth-mode",
                "builtin",
                "--public-url",
                "http://h/mcp",
                "--",
                "x",
            ],
        ]
        .concat()))
        .unwrap_err();
        assert!(e.to_string().contains("https"), "{e}");
        let c = Config::load(&cli(&[
            &beyond[..],
            &[
                "--auth-mode",
                "builtin",
                "--public-url",
                "https://h/mcp",
                "--",
                "x",
            ],
        ]
        .concat()))
        .unwrap();
        assert_eq!(c.auth.mode, AuthMode::Builtin);
        assert_eq!(c.auth.scopes, ["mcp"]);
        let file = FileConfig::parse(
            "[auth]\nmode = \"builtin\"\npublic_url = \"http://127.0.0.1:1/mcp\"\n\
             [[auth.users]]\nname = \"a\"\npassword_hash = \"plain\"\n\
             [plugins.p]\ncommand = \"x\"\n",
        )
        .unwrap();
        let e = Config::merge(&cli(&[]), file).unwrap_err();
        assert!(e.to_string().contains("auth.users.a.password_hash"), "{e}");
    }

    /// In external mode `[auth.upstream]` is the people's pages' sign-in at `auth.issuer`
    /// itself, where a person is the `sub` of the issuer's tokens.
    #[test]
    fn upstream_in_external_mode_names_the_issuer() {
        let load = |text: &str| Config::merge(&cli(&[]), FileConfig::parse(text).unwrap());
        let external = |issuer: &str, extra: &str| {
            format!(
                "[auth]\nmode = \"external\"\npublic_url = \"https://gw.example.com/mcp\"\n\
                 issuer = \"https://id.example.com\"\n\
                 [auth.upstream]\nissuer = \"{issuer}\"\nclient_id = \"pages\"\n{extra}\
                 [plugins.p]\ncommand = \"x\"\n"
            )
        };
        let c = load(&external("https://id.example.com", "")).unwrap();
        assert!(c.auth.upstream.unwrap().token_subject);
        let e = load(&external("https://other.example.com", "")).unwrap_err();
        assert!(e.to_string().contains("auth.upstream.issuer"), "{e}");
        let e = load(&external("https://id.example.com", "subject = \"email\"\n")).unwrap_err();
        assert!(e.to_string().contains("auth.upstream.subject"), "{e}");
        let e = load("[auth.upstream]\nissuer = \"https://id.example.com\"\nclient_id = \"x\"\n[plugins.p]\ncommand = \"x\"\n").unwrap_err();
        assert!(e.to_string().contains("auth.upstream"), "{e}");
    }

    #[test]
    fn access_rules_need_authorization_and_upstream_subjects_stay_apart() {
        let hash = "$argon2id$v=19$m=19456,t=2,p=1$TjWAhc8wjdae+vBP5NQT9g$iTI0JoWUp/tLsdNm2l75KZd1QY/kLNiZ5XM6eYAZjYs";
        let load = |text: &str| Config::merge(&cli(&[]), FileConfig::parse(text).unwrap());
        let e = load("[plugins.p]\ncommand = \"x\"\nallow_groups = [\"eng\"]\n").unwrap_err();
        assert!(e.to_string().contains("plugins.p.allow_groups"), "{e}");
        let e = load(
            "[plugins.p]\ncommand = \"x\"\n[[plugins.p.tool_access]]\ntools = [\"a\"]\nallow_subjects = [\"s\"]\n",
        )
        .unwrap_err();
        assert!(e.to_string().contains("set auth.mode"), "{e}");
        let builtin = |extra: &str| {
            format!(
                "[auth]\nmode = \"builtin\"\npublic_url = \"http://127.0.0.1:1/mcp\"\n{extra}\
                 [plugins.p]\ncommand = \"x\"\nallow_groups = [\"eng\"]\n"
            )
        };
        let c = load(&builtin(&format!(
            "[[auth.users]]\nname = \"alice\"\npassword_hash = \"{hash}\"\ngroups = [\"eng\"]\n"
        )))
        .unwrap();
        assert_eq!(c.auth.users[0].groups, ["eng"]);
        assert!(c.plugins[0].restricts_callers());
        let upstream = "[auth.upstream]\nissuer = \"https://id.example.com\"\nclient_id = \"gw\"\n";
        let c = load(&builtin(upstream)).unwrap();
        assert_eq!(c.auth.upstream.unwrap().client_id, "gw");
        for (users, says) in [
            (
                format!("[[auth.users]]\nname = \"upstream:1\"\npassword_hash = \"{hash}\"\n"),
                "auth.users.upstream:1",
            ),
            (
                format!(
                    "subject = \"email\"\n[[auth.users]]\nname = \"a@example.com\"\npassword_hash = \"{hash}\"\n"
                ),
                "auth.users.a@example.com",
            ),
        ] {
            let e = load(&builtin(&format!("{upstream}{users}"))).unwrap_err();
            assert!(e.to_string().contains(says), "{e}");
        }
        let e = load(&format!("{upstream}[plugins.p]\ncommand = \"x\"\n")).unwrap_err();
        assert!(e.to_string().contains("auth.upstream"), "{e}");
    }

    #[test]
    fn provisioned_clients_are_checked() {
        let hash = "$argon2id$v=19$m=19456,t=2,p=1$TjWAhc8wjdae+vBP5NQT9g$iTI0JoWUp/tLsdNm2l75KZd1QY/kLNiZ5XM6eYAZjYs";
        let load = |clients: &str| {
            let file = FileConfig::parse(&format!(
                "[auth]\nmode = \"builtin\"\npublic_url = \"http://127.0.0.1:1/mcp\"\n\
                 [[auth.users]]\nname = \"alice\"\npassword_hash = \"{hash}\"\n{clients}\
                 [plugins.p]\ncommand = \"x\"\n"
            ))
            .unwrap();
            Config::merge(&cli(&[]), file)
        };
        let c = load(&format!(
            "[[auth.clients]]\nclient_id = \"robot\"\nsecret_hash = \"{hash}\"\nscopes = [\"mcp\"]\n"
        ))
        .unwrap();
        assert_eq!(c.auth.clients[0].client_id, "robot");
        assert!(
            !format!("{:?}", c.auth).contains("argon2"),
            "no hash in Debug"
        );
        for (clients, says) in [
            (
                "[[auth.clients]]\nclient_id = \"robot\"\nsecret_hash = \"plain\"\n".to_owned(),
                "auth.clients.robot.secret_hash",
            ),
            (
                format!("[[auth.clients]]\nclient_id = \"alice\"\nsecret_hash = \"{hash}\"\n"),
                "user's name",
            ),
            (
                format!(
                    "[[auth.clients]]\nclient_id = \"https://x/c\"\nsecret_hash = \"{hash}\"\n"
                ),
                "not a client id",
            ),
            (
                format!(
                    "[[auth.clients]]\nclient_id = \"r\"\nsecret_hash = \"{hash}\"\n\
                     [[auth.clients]]\nclient_id = \"r\"\nsecret_hash = \"{hash}\"\n"
                ),
                "given twice",
            ),
            (
                format!(
                    "[[auth.clients]]\nclient_id = \"r\"\nsecret_hash = \"{hash}\"\nscopes = [\"a b\"]\n"
                ),
                "auth.clients.r.scopes",
            ),
        ] {
            let e = load(&clients).unwrap_err();
            assert!(e.to_string().contains(says), "{says}: {e}");
        }
    }
}
