//! Credentials defined through the admin API (and the console), beside the config file's:
//! checked as the file's are, kept in the database (`credential_definitions`) so that every
//! replica and the next start read them, and installed at once on the replica that took
//! them; other replicas pick them up when they read the table again
//! ([`Broker::reload_definitions`]). A definition of the config file is not the API's to
//! change.

use std::sync::Arc;

use super::{Broker, CredentialError, now_ms};
use crate::config::{CredentialConfig, CredentialSpec, credential_config};

/// Why a definition was not taken.
#[derive(Debug, thiserror::Error)]
pub enum DefineError {
    #[error("credential `{0}` is defined in the config file; change it there")]
    FromFile(String),
    #[error("{0}")]
    Invalid(String),
    #[error(transparent)]
    Credential(#[from] CredentialError),
}

impl Broker {
    /// Whether credential `name` comes from the config file.
    pub fn is_from_file(&self, name: &str) -> bool {
        self.from_file.contains(name)
    }

    /// The names of the credentials defined now.
    pub fn names(&self) -> Vec<String> {
        self.definitions().iter().map(|c| c.name.clone()).collect()
    }

    /// Defines (or redefines) credential `name` as `spec`: checked, kept in the database,
    /// then in force here.
    pub async fn define(
        &self,
        name: &str,
        spec: &CredentialSpec,
    ) -> Result<Arc<CredentialConfig>, DefineError> {
        if self.is_from_file(name) {
            return Err(DefineError::FromFile(name.to_owned()));
        }
        crate::config::check_api_spec(name, spec)
            .map_err(|e| DefineError::Invalid(e.to_string()))?;
        let checked = credential_config(name, spec.clone(), crate::config::secret_env_var)
            .map_err(|e| DefineError::Invalid(e.to_string()))?;
        // A change of server or client leaves nothing of the old one behind: the values it
        // gave are revoked there and forgotten, its metadata dropped.
        if let Ok(old) = self.defined(name)
            && !same_server(&old, &checked)
        {
            self.disconnect(None, name).await?;
        }
        self.oauth.forget(name);
        let json = serde_json::to_string(spec).expect("serializable");
        self.store
            .put_definition(name, &json, now_ms())
            .await
            .map_err(CredentialError::from)?;
        let checked = Arc::new(checked);
        self.install(|defs| {
            defs.retain(|c| c.name != name);
            defs.push(checked.clone());
        });
        Ok(checked)
    }

    /// Forgets credential `name` (defined through the API) and everyone's value of it
    /// (revoked at its server where it offers that); whether it was defined.
    pub async fn undefine(&self, name: &str) -> Result<bool, DefineError> {
        if self.is_from_file(name) {
            return Err(DefineError::FromFile(name.to_owned()));
        }
        if self.defined(name).is_err() {
            return Ok(false);
        }
        self.disconnect(None, name).await?;
        self.oauth.forget(name);
        self.store
            .delete_definition(name)
            .await
            .map_err(CredentialError::from)?;
        self.install(|defs| defs.retain(|c| c.name != name));
        Ok(true)
    }

    /// Reads the API's definitions from the database again (another replica may have changed
    /// them); whether the names defined changed. A definition that no longer checks out here
    /// (its client secret's file or variable missing on this replica) is left out, logged.
    pub async fn reload_definitions(&self) -> Result<bool, CredentialError> {
        let stored = self.store.definitions().await?;
        let mut api = Vec::new();
        for (name, json) in stored {
            if self.is_from_file(&name) {
                continue;
            }
            let spec: CredentialSpec = match serde_json::from_str(&json) {
                Ok(s) => s,
                Err(e) => {
                    tracing::warn!(credential = %name, "a stored definition is unreadable: {e}");
                    continue;
                }
            };
            let checked = crate::config::check_api_spec(&name, &spec)
                .and_then(|()| credential_config(&name, spec, crate::config::secret_env_var));
            match checked {
                Ok(c) => {
                    if self.defined(&name).is_ok_and(|old| !same_server(&old, &c)) {
                        self.oauth.forget(&name);
                    }
                    api.push(Arc::new(c))
                }
                Err(e) => {
                    tracing::warn!(credential = %name, "a stored definition is left out: {e}")
                }
            }
        }
        let before = self.names();
        self.install(|defs| {
            defs.retain(|c| self.from_file.contains(&c.name));
            defs.extend(api);
        });
        Ok(before != self.names())
    }

    fn install(&self, change: impl FnOnce(&mut Vec<Arc<CredentialConfig>>)) {
        let mut defs = self.defs.write().expect("definitions lock");
        let mut next: Vec<Arc<CredentialConfig>> = defs.iter().cloned().collect();
        change(&mut next);
        *defs = Arc::new(next);
    }
}

/// Whether two definitions name the same server and client: the kind, the endpoints and the
/// client id (a label, a pattern or scopes may change without forgetting anyone's value).
fn same_server(a: &CredentialConfig, b: &CredentialConfig) -> bool {
    use crate::config::CredentialKind as K;
    let server = |k: &K| match k {
        K::OAuth2 { server, .. } | K::TokenExchange { server, .. } => Some((
            server.issuer.clone(),
            server.authorization_endpoint.clone(),
            server.token_endpoint.clone(),
            server.client_id.clone(),
        )),
        K::Secret { .. } => None,
    };
    std::mem::discriminant(&a.kind) == std::mem::discriminant(&b.kind)
        && server(&a.kind) == server(&b.kind)
}
