//! The gateway's secrets in its environment: the variables it knows ([`SECRET_ENV_VARS`])
//! and those the config reads a secret from under a name of its own. At start they are sealed
//! away ([`seal_environment`]): kept in memory for the config (a reload included), gone from
//! the environment children could inherit, and never given to a plugin's `env`.

use std::collections::{BTreeMap, BTreeSet};

use super::SECRET_ENV_VARS;

/// The gateway's secrets, taken out of its environment at start ([`seal_environment`]): read
/// from here, so that a reload still finds them and no child can inherit them.
static SEALED: std::sync::OnceLock<BTreeMap<String, String>> = std::sync::OnceLock::new();

/// Variables the config read a secret from under a name of its own choosing
/// (`client_secret_env`, `introspection_client_secret_env`): secrets like [`SECRET_ENV_VARS`].
static NAMED_SECRETS: std::sync::Mutex<BTreeSet<String>> = std::sync::Mutex::new(BTreeSet::new());

/// A variable of the gateway's environment, or a secret it sealed away at start.
pub fn env_var(name: &str) -> Option<String> {
    SEALED
        .get()
        .and_then(|m| m.get(name).cloned())
        .or_else(|| std::env::var(name).ok())
}

/// [`env_var`] for a secret: the name is remembered as one (sealed at start, never given to
/// a plugin's `env`).
pub fn secret_env_var(name: &str) -> Option<String> {
    NAMED_SECRETS
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .insert(name.to_owned());
    env_var(name)
}

/// Whether `name` holds a secret of the gateway's.
pub(super) fn is_secret_env(name: &str) -> bool {
    SECRET_ENV_VARS.contains(&name)
        || name.starts_with(super::credentials::API_CLIENT_SECRET_PREFIX)
        || NAMED_SECRETS
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .contains(name)
}

/// The secrets of the gateway's environment ([`SECRET_ENV_VARS`] and those the config read by
/// a name of its own): kept in memory once ([`env_var`] finds them). Returns their names; the
/// caller removes them from the environment.
pub fn seal_environment() -> Vec<String> {
    let named = NAMED_SECRETS
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .clone();
    let names: Vec<String> = SECRET_ENV_VARS
        .iter()
        .map(|s| (*s).to_owned())
        .chain(named)
        .filter(|n| std::env::var_os(n).is_some())
        .collect();
    let kept = names
        .iter()
        .filter_map(|n| Some((n.clone(), std::env::var(n).ok()?)))
        .collect();
    let _ = SEALED.set(kept);
    names
}
