//! Each person's own credentials for the services behind the plugins (`[credentials.NAME]`):
//! the [`Broker`] keeps them, sealed (`seal.rs`) in a [`CredentialStore`] (`store.rs`, the
//! database implements it), and gives a person's value to whoever starts that person's
//! plugin instance. Only the values' metadata ([`Connection`]: the credential's name, the
//! subject, when it was connected and expires, its scopes) ever leaves this module towards
//! a log, an answer or a page; a value goes only into the process it was connected for.
//!
//! This module decides what a credential is worth (is it there, does it match its pattern,
//! is it sealed under the current key); it does not ask anyone for one.

mod seal;
pub mod store;

use std::sync::Arc;

use serde::{Deserialize, Serialize};

use crate::config::{CredentialConfig, CredentialKind, CredentialsConfig};
pub use seal::{SealError, Sealer};
pub use store::{CredentialStore, Request, StoreError, StoreFuture, Stored};

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

/// Keeps people's credentials and hands them out.
pub struct Broker {
    config: CredentialsConfig,
    sealer: Sealer,
    store: Arc<dyn CredentialStore>,
    /// Where the connect page is: `{base}/connect/{id}` (the gateway's public origin).
    base: String,
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
        Arc::new(Broker {
            sealer: Sealer::new(&config.keys),
            config,
            store,
            base: base.trim_end_matches('/').to_owned(),
        })
    }

    /// Asks `subject` to connect credential `name`: a single-use link to the connect page,
    /// bound to them and that credential, usable for [`REQUEST_TTL_MS`]. Its id (random,
    /// naming no one) is also the URL elicitation's.
    pub async fn request(&self, subject: &str, name: &str) -> Result<Asked, CredentialError> {
        let c = self.defined(name)?;
        let id = format!("{:032x}", rand::random::<u128>());
        let now = now_ms();
        self.store
            .open_request(&Request {
                id: id.clone(),
                subject: subject.to_owned(),
                name: name.to_owned(),
                created_at_ms: now,
                expires_at_ms: now + REQUEST_TTL_MS,
            })
            .await?;
        Ok(Asked {
            url: format!("{}/connect/{id}", self.base),
            id,
            label: c.label.clone(),
        })
    }

    /// The credential defined as `name`.
    pub fn defined(&self, name: &str) -> Result<&CredentialConfig, CredentialError> {
        self.config
            .get(name)
            .ok_or_else(|| CredentialError::Undefined(name.to_owned()))
    }

    /// `subject`'s value of credential `name`, if they connected it (and it has not expired).
    /// A value sealed under a previous key is sealed again under the current one.
    pub async fn value(&self, subject: &str, name: &str) -> Result<Option<Value>, CredentialError> {
        self.defined(name)?;
        let Some(row) = self.store.get(subject, name).await? else {
            return Ok(None);
        };
        if row.expires_at_ms.is_some_and(|t| t <= now_ms()) {
            return Ok(None);
        }
        let sealed = |why| CredentialError::Sealed {
            name: name.to_owned(),
            why,
        };
        let opened = self
            .sealer
            .open(subject, name, &row.sealed)
            .map_err(sealed)?;
        let value: Value =
            serde_json::from_slice(&opened.plain).map_err(|_| sealed(SealError::Invalid))?;
        if opened.stale {
            let again = Stored {
                sealed: self
                    .sealer
                    .seal(subject, name, &opened.plain)
                    .map_err(sealed)?,
                ..row.clone()
            };
            // Lost to a connection made meanwhile: that one is sealed under the current key.
            self.store.reseal(&again, &row.sealed).await?;
        }
        Ok(Some(value))
    }

    /// A proof, for the people's own pages, that `subject` signed in: good for
    /// [`GRANT_TTL_MS`], sealed under the storage key and bound to the subject.
    pub fn grant(&self, subject: &str) -> Result<String, CredentialError> {
        use base64::Engine as _;
        let until = (now_ms() + GRANT_TTL_MS).to_be_bytes();
        let sealed =
            self.sealer
                .seal(subject, GRANT, &until)
                .map_err(|why| CredentialError::Sealed {
                    name: GRANT.into(),
                    why,
                })?;
        let who = base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(subject);
        Ok(format!("{who}~{sealed}"))
    }

    /// The subject a [`Broker::grant`] proves, while it is good.
    pub fn granted(&self, grant: &str) -> Option<String> {
        use base64::Engine as _;
        let (who, sealed) = grant.split_once('~')?;
        let subject = base64::engine::general_purpose::URL_SAFE_NO_PAD
            .decode(who)
            .ok()
            .and_then(|b| String::from_utf8(b).ok())?;
        let opened = self.sealer.open(&subject, GRANT, sealed).ok()?;
        let until = i64::from_be_bytes(opened.plain.try_into().ok()?);
        (until > now_ms()).then_some(subject)
    }

    /// The credentials defined.
    pub fn definitions(&self) -> &[CredentialConfig] {
        &self.config.credentials
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
            },
            None,
            None,
        )
        .await
    }

    /// Keeps `value` as `subject`'s credential `name`.
    pub async fn keep(
        &self,
        subject: &str,
        name: &str,
        value: &Value,
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
            connected_at_ms: now_ms(),
            expires_at_ms,
            scopes,
        };
        self.store.put(&row).await?;
        Ok(connection(c, &row))
    }

    /// Forgets `subject`'s credential `name`, or everyone's (`None`); how many there were.
    pub async fn disconnect(
        &self,
        subject: Option<&str>,
        name: &str,
    ) -> Result<u64, CredentialError> {
        self.defined(name)?;
        Ok(self.store.delete(subject, name).await?)
    }

    /// What `subject` has connected, among the credentials defined now.
    pub async fn connections(&self, subject: &str) -> Result<Vec<Connection>, CredentialError> {
        let rows = self.store.of_subject(subject).await?;
        Ok(rows
            .iter()
            .filter_map(|r| Some(connection(self.config.get(&r.name)?, r)))
            .collect())
    }

    /// Who has connected credential `name`.
    pub async fn connected(&self, name: &str) -> Result<Vec<Connection>, CredentialError> {
        let c = self.defined(name)?;
        let rows = self.store.of_credential(name).await?;
        Ok(rows.iter().map(|r| connection(c, r)).collect())
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
