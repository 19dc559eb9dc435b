//! Each person's own credentials for the services behind the plugins (`[credentials.NAME]`):
//! the [`Broker`] keeps them, sealed (`seal.rs`) in a [`CredentialStore`] (`store.rs`, the
//! database implements it), and gives a person's value to whoever starts that person's
//! plugin instance. Only the values' metadata ([`Connection`]: the credential's name, the
//! subject, when it was connected and expires, its scopes) ever leaves this module towards
//! a log, an answer or a page; a value goes only into the process it was connected for.
//!
//! This module decides what a credential is worth (is it there, does it match its pattern,
//! is it sealed under the current key); it does not ask anyone for one.

mod connect;
mod definitions;
mod discovery;
pub mod mcp_client;
pub mod oauth;
mod seal;
pub mod store;
mod values;

use std::sync::Arc;

use serde::{Deserialize, Serialize};

use crate::config::{CredentialConfig, CredentialKind, CredentialsConfig};
pub use connect::{CALLBACK_PATH, ConnectRefused};
pub use definitions::DefineError;
pub use oauth::{OAuth, OAuthError, Tokens};
pub use seal::{SealError, Sealer};
pub use store::{CredentialStore, Request, StoreError, StoreFuture, Stored};
pub use values::ProviderTokenKeeper;

/// Why a credential could not be read or kept.
#[derive(Debug, thiserror::Error)]
pub enum CredentialError {
    #[error("no credential `{0}` is defined")]
    Undefined(String),
    #[error("the value does not have the form credential `{0}` asks for")]
    Pattern(String),
    #[error("the value is empty, too long or holds control characters")]
    Malformed,
    #[error("credential `{0}` is not entered by hand")]
    NotSecret(String),
    #[error("credential `{name}` could not be read: {why}")]
    Sealed { name: String, why: SealError },
    #[error("credential `{0}` is not connected through its authorization server")]
    NotOAuth(String),
    #[error("credential `{name}`: {why}")]
    Upstream { name: String, why: OAuthError },
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// The most bytes a value may hold.
pub const MAX_VALUE_BYTES: usize = 16 * 1024;

/// A credential's value, kept out of `Debug` and logs.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Value {
    /// What a plugin is given: the token or the secret.
    pub value: String,
    /// `oauth2`: the refresh token, if the server gave one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub refresh_token: Option<String>,
    /// `oauth2`: how long the access token was good for when given, in milliseconds (how
    /// early it is refreshed follows from it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lifetime_ms: Option<i64>,
}

impl std::fmt::Debug for Value {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Value(***)")
    }
}

/// A request to connect: the link, its id, and how the credential is named to people.
#[derive(Debug, Clone)]
pub struct Asked {
    pub id: String,
    pub url: String,
    pub label: String,
}

/// What may be shown of a person's credential: never its value.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Connection {
    pub credential: String,
    pub label: String,
    pub subject: String,
    pub connected_at_ms: i64,
    pub expires_at_ms: Option<i64>,
    pub scopes: Option<String>,
}

/// How long a link to connect a credential may be used.
pub const REQUEST_TTL_MS: i64 = 10 * 60 * 1000;

/// How long a person signed in on their connections page stays so.
pub const GRANT_TTL_MS: i64 = 10 * 60 * 1000;

/// What a page's grant is sealed as, in place of a credential's name (which has no NUL).
const GRANT: &str = "\0connections-page";

/// The row of a person's access token from the `[auth.upstream]` provider: a name no
/// credential can have (theirs are letters, digits, `-` and `_`).
const PROVIDER_TOKEN: &str = "@provider";

/// What a page's sign-in at the provider is sealed as.
const SIGNIN: &str = "\0page-signin";

/// What happened to a person's credential that whoever runs processes with it must hear of.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Event {
    /// A new value replaced the one processes were started with (a refresh).
    Refreshed { subject: String, name: String },
    /// The value is gone without the person disconnecting it (the server refused its
    /// refresh): the next call asks again.
    Lost {
        subject: String,
        name: String,
        why: String,
    },
}

/// How long a replica may take to refresh a token before another may try: longer than the
/// server's metadata (three documents) and the token request may take together.
const REFRESH_CLAIM_MS: i64 = 90_000;

/// A duration in milliseconds, saturating (a server's `expires_in` is its own to choose).
fn millis(d: std::time::Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}

/// `now_ms` plus `d`, saturating.
fn expiry(now_ms: i64, d: std::time::Duration) -> i64 {
    now_ms.saturating_add(millis(d))
}

/// The credentials defined at one moment.
pub type Definitions = Arc<Vec<Arc<CredentialConfig>>>;

/// Keeps people's credentials and hands them out.
pub struct Broker {
    /// The credentials defined now (the config file's, then the admin API's), by name.
    defs: std::sync::RwLock<Definitions>,
    /// The names the config file defines: the admin API does not change those.
    from_file: std::collections::BTreeSet<String>,
    sealer: Sealer,
    store: Arc<dyn CredentialStore>,
    /// Where the connect page is: `{base}/connect/{id}` (the gateway's public origin).
    base: String,
    oauth: Arc<OAuth>,
    events: tokio::sync::broadcast::Sender<Event>,
    /// What this replica last handed out of each person's credential, to see it change.
    known: std::sync::Mutex<std::collections::HashMap<(String, String), Known>>,
    /// The scopes to ask each person for at their next connect of a credential, beyond its
    /// own (a server's step-up), until the request to connect is made. This replica's
    /// memory: a person whose next call another replica serves is asked for the
    /// credential's own scopes there, and stepped up again when the server refuses them.
    more_scopes: std::sync::Mutex<std::collections::HashMap<(String, String), String>>,
}

/// What a handed-out value was: when it was connected and until when it is good (a refresh
/// or a new connection changes one of them), and how early it is refreshed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Known {
    connected_at_ms: i64,
    expires_at_ms: Option<i64>,
    /// When to refresh it, if it can be.
    refresh_at_ms: Option<i64>,
}

/// The most values remembered ([`Broker::known`]); past it the memory starts again.
const MAX_KNOWN: usize = 100_000;

/// What [`Broker::check`] found of a credential handed out before.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Check {
    /// As handed out.
    Same,
    /// Refreshed or connected again since (on any replica): processes started with the old
    /// value should be replaced.
    Changed,
    /// Disconnected or revoked (on any replica).
    Gone,
}

fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64)
}

impl Broker {
    /// The broker, its connect page under `base` (the gateway's public origin).
    pub fn new(
        config: CredentialsConfig,
        store: Arc<dyn CredentialStore>,
        base: &str,
    ) -> Arc<Broker> {
        let from_file: std::collections::BTreeSet<String> =
            config.credentials.iter().map(|c| c.name.clone()).collect();
        Arc::new(Broker {
            sealer: Sealer::new(&config.keys),
            defs: std::sync::RwLock::new(Arc::new(
                config.credentials.into_iter().map(Arc::new).collect(),
            )),
            oauth: Arc::new(OAuth::new(
                base.trim_end_matches('/'),
                store.clone(),
                Sealer::new(&config.keys),
                from_file.clone(),
                config.remote_networks.clone(),
            )),
            from_file,
            store,
            base: base.trim_end_matches('/').to_owned(),
            events: tokio::sync::broadcast::channel(256).0,
            known: Default::default(),
            more_scopes: Default::default(),
        })
    }

    /// What happens to people's credentials from now on (refreshes, values lost).
    pub fn subscribe(&self) -> tokio::sync::broadcast::Receiver<Event> {
        self.events.subscribe()
    }

    /// The gateway's public origin.
    pub fn base(&self) -> &str {
        &self.base
    }

    /// Where an authorization server sends the person back after a connect.
    pub fn callback_url(&self) -> String {
        format!("{}{}", self.base, connect::CALLBACK_PATH)
    }

    /// Asks `subject` to connect credential `name`: a single-use link to the connect page,
    /// bound to them and that credential, usable for [`REQUEST_TTL_MS`]. Its id (random,
    /// naming no one) is also the URL elicitation's.
    pub async fn request(&self, subject: &str, name: &str) -> Result<Asked, CredentialError> {
        let c = self.defined(name)?;
        let id = format!("{:032x}", rand::random::<u128>());
        let now = now_ms();
        let key = (subject.to_owned(), name.to_owned());
        let scopes = self.more_scopes.lock().expect("scopes lock").remove(&key);
        self.store
            .open_request(&Request {
                id: id.clone(),
                subject: subject.to_owned(),
                name: name.to_owned(),
                created_at_ms: now,
                expires_at_ms: now + REQUEST_TTL_MS,
                scopes,
            })
            .await?;
        Ok(Asked {
            url: format!("{}/connect/{id}", self.base),
            id,
            label: c.label.clone(),
        })
    }

    /// The credential defined as `name`.
    pub fn defined(&self, name: &str) -> Result<Arc<CredentialConfig>, CredentialError> {
        self.definitions()
            .iter()
            .find(|c| c.name == name)
            .cloned()
            .ok_or_else(|| CredentialError::Undefined(name.to_owned()))
    }

    /// A proof, for the people's own pages, that `subject` signed in: good for
    /// [`GRANT_TTL_MS`], sealed under the storage key and bound to the subject.
    pub fn grant(&self, subject: &str) -> Result<String, CredentialError> {
        let until = (now_ms() + GRANT_TTL_MS).to_be_bytes();
        self.seal_for(subject, GRANT, &until)
    }

    /// The subject a [`Broker::grant`] proves, while it is good.
    pub fn granted(&self, grant: &str) -> Option<String> {
        let (subject, plain) = self.open_for(grant, GRANT)?;
        let until = i64::from_be_bytes(plain.try_into().ok()?);
        (until > now_ms()).then_some(subject)
    }

    /// What a page's sign-in at the OpenID provider remembers while the person is there,
    /// sealed under the storage key (for the browser's cookie).
    pub fn seal_signin(&self, plain: &[u8]) -> Result<String, CredentialError> {
        self.seal_for("", SIGNIN, plain)
    }

    /// What [`Broker::seal_signin`] sealed; `None` if tampered with.
    pub fn open_signin(&self, sealed: &str) -> Option<Vec<u8>> {
        self.open_for(sealed, SIGNIN).map(|(_, plain)| plain)
    }

    /// `plain`, sealed for `subject` and `purpose` (not a credential's name), and the subject
    /// beside it: `<subject in base64url>~<sealed>`.
    fn seal_for(
        &self,
        subject: &str,
        purpose: &str,
        plain: &[u8],
    ) -> Result<String, CredentialError> {
        use base64::Engine as _;
        let sealed =
            self.sealer
                .seal(subject, purpose, plain)
                .map_err(|why| CredentialError::Sealed {
                    name: purpose.trim_start_matches('\0').into(),
                    why,
                })?;
        let who = base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(subject);
        Ok(format!("{who}~{sealed}"))
    }

    /// What [`Broker::seal_for`] sealed for `purpose`, and for whom; `None` if tampered with.
    fn open_for(&self, token: &str, purpose: &str) -> Option<(String, Vec<u8>)> {
        use base64::Engine as _;
        let (who, sealed) = token.split_once('~')?;
        let subject = base64::engine::general_purpose::URL_SAFE_NO_PAD
            .decode(who)
            .ok()
            .and_then(|b| String::from_utf8(b).ok())?;
        let opened = self.sealer.open(&subject, purpose, sealed).ok()?;
        Some((subject, opened.plain))
    }

    /// The credentials defined now.
    pub fn definitions(&self) -> Definitions {
        self.defs.read().expect("definitions lock").clone()
    }

    /// The open request to connect `id` (unused, unexpired), leaving it open.
    pub async fn peek(&self, id: &str) -> Result<Option<Request>, CredentialError> {
        Ok(self.store.peek_request(id, now_ms()).await?)
    }

    /// The open request `id`, used up: no one can use it again, on any replica.
    pub async fn take(&self, id: &str) -> Result<Option<Request>, CredentialError> {
        Ok(self.store.take_request(id, now_ms()).await?)
    }

    /// Whether `value` may be kept as credential `name` (of kind `secret`): not empty, not
    /// too long, no control characters, and of its pattern's form.
    pub fn check_secret(&self, name: &str, value: &str) -> Result<(), CredentialError> {
        let c = self.defined(name)?;
        if value.is_empty() || value.len() > MAX_VALUE_BYTES || value.chars().any(char::is_control)
        {
            return Err(CredentialError::Malformed);
        }
        match &c.kind {
            CredentialKind::Secret {
                pattern: Some(pattern),
            } if !pattern.is_match(value) => Err(CredentialError::Pattern(name.to_owned())),
            CredentialKind::Secret { .. } => Ok(()),
            _ => Err(CredentialError::NotSecret(name.to_owned())),
        }
    }

    /// Keeps `value` as `subject`'s credential `name`, of kind `secret`: checked first
    /// ([`Broker::check_secret`]).
    pub async fn connect_secret(
        &self,
        subject: &str,
        name: &str,
        value: &str,
    ) -> Result<Connection, CredentialError> {
        self.check_secret(name, value)?;
        self.keep(
            subject,
            name,
            &Value {
                value: value.to_owned(),
                refresh_token: None,
                lifetime_ms: None,
            },
            None,
            None,
        )
        .await
    }

    /// Keeps `value` as `subject`'s credential `name`, connected now.
    pub async fn keep(
        &self,
        subject: &str,
        name: &str,
        value: &Value,
        expires_at_ms: Option<i64>,
        scopes: Option<String>,
    ) -> Result<Connection, CredentialError> {
        self.store_value(subject, name, value, now_ms(), expires_at_ms, scopes)
            .await
    }

    async fn store_value(
        &self,
        subject: &str,
        name: &str,
        value: &Value,
        connected_at_ms: i64,
        expires_at_ms: Option<i64>,
        scopes: Option<String>,
    ) -> Result<Connection, CredentialError> {
        let c = self.defined(name)?;
        let plain = serde_json::to_vec(value).expect("serializable");
        let row = Stored {
            subject: subject.to_owned(),
            name: name.to_owned(),
            sealed: self.sealer.seal(subject, name, &plain).map_err(|why| {
                CredentialError::Sealed {
                    name: name.to_owned(),
                    why,
                }
            })?,
            connected_at_ms,
            expires_at_ms,
            scopes,
        };
        self.store.put(&row).await?;
        Ok(connection(&c, &row))
    }

    /// Forgets `subject`'s credential `name`, or everyone's (`None`); how many there were.
    /// An OAuth token is then revoked at its server too (RFC 7009) where the server offers
    /// it, in the background: a failed revocation is logged, and the value is gone already.
    pub async fn disconnect(
        &self,
        subject: Option<&str>,
        name: &str,
    ) -> Result<u64, CredentialError> {
        let c = self.defined(name)?;
        let rows = match (&c.kind, subject) {
            (CredentialKind::OAuth2 { .. }, Some(s)) => {
                self.store.get(s, name).await?.into_iter().collect()
            }
            (CredentialKind::OAuth2 { .. }, None) => self.store.of_credential(name).await?,
            _ => Vec::new(),
        };
        // Forgotten first: a slow or failing server must not keep a value usable.
        let removed = self.store.delete(subject, name).await?;
        if let CredentialKind::OAuth2 { server, .. } = &c.kind {
            let tokens: Vec<(String, Value)> = rows
                .iter()
                .filter_map(|r| {
                    let opened = self.sealer.open(&r.subject, name, &r.sealed).ok()?;
                    Some((
                        r.subject.clone(),
                        serde_json::from_slice(&opened.plain).ok()?,
                    ))
                })
                .collect();
            if !tokens.is_empty() {
                let (oauth, server, name) = (self.oauth.clone(), server.clone(), name.to_owned());
                tokio::spawn(async move {
                    for (subject, v) in tokens {
                        match oauth
                            .revoke(&name, &server, &v.value, v.refresh_token.as_deref())
                            .await
                        {
                            Ok(true) => {
                                tracing::info!(subject = %subject, credential = %name, "revoked at the authorization server")
                            }
                            Ok(false) => {}
                            Err(e) => {
                                tracing::warn!(subject = %subject, credential = %name, "revocation at the authorization server failed: {e}")
                            }
                        }
                    }
                });
            }
        }
        Ok(removed)
    }

    /// What `subject` has connected, among the credentials defined now.
    pub async fn connections(&self, subject: &str) -> Result<Vec<Connection>, CredentialError> {
        let rows = self.store.of_subject(subject).await?;
        let defs = self.definitions();
        Ok(rows
            .iter()
            .filter_map(|r| Some(connection(defs.iter().find(|c| c.name == r.name)?, r)))
            .collect())
    }

    /// Who has connected credential `name`.
    pub async fn connected(&self, name: &str) -> Result<Vec<Connection>, CredentialError> {
        let c = self.defined(name)?;
        let rows = self.store.of_credential(name).await?;
        Ok(rows.iter().map(|r| connection(&c, r)).collect())
    }
}

fn connection(c: &CredentialConfig, r: &Stored) -> Connection {
    Connection {
        credential: r.name.clone(),
        label: c.label.clone(),
        subject: r.subject.clone(),
        connected_at_ms: r.connected_at_ms,
        expires_at_ms: r.expires_at_ms,
        scopes: r.scopes.clone(),
    }
}
