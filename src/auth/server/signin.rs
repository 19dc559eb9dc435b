//! Signing a person in (`POST /authorize/login`): the configured users' argon2 passwords,
//! checked off the async threads and at the same cost for unknown users, and the lockout
//! after too many failed sign-ins per user name and per client address ([`SignInThrottle`],
//! whose per-address count also covers wrong secrets of provisioned clients). A signed-in
//! person goes on to the consent page, or straight back to the client with a code when this
//! user already allowed this client these scopes. Passwords are never logged or stored.

use std::hash::BuildHasher;
use std::net::IpAddr;
use std::time::Duration;

use axum::extract::{Form, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::Response;
use serde::Deserialize;

use super::authorize::client_view;
use super::consent::issue_code;
use super::error::{refused, retry_after, wait_words};
use super::pending::pending_for;
use super::{ADDRESS_TABLE, ClientAddr, PageError, St, server};
use crate::auth::pages;
use crate::auth::throttle::Throttle;
use crate::config::AuthConfig;

/// Failed sign-ins, counted per user name and per client address.
pub(super) struct SignInThrottle {
    /// The configured users (a bounded set).
    users: Throttle<String>,
    /// Every other name tried, by a keyed hash (names are the attacker's to choose, so they
    /// are neither kept nor allowed to grow the table): counted the same, so a lockout does
    /// not tell which users exist.
    others: Throttle<u64>,
    hasher: std::collections::hash_map::RandomState,
    /// Failed sign-ins (and wrong provisioned client secrets) per client address.
    pub(super) addresses: Throttle<IpAddr>,
}

impl SignInThrottle {
    pub(super) fn new(config: &AuthConfig) -> SignInThrottle {
        let (limit, window) = (config.failed_signins_per_user, config.signin_lockout);
        SignInThrottle {
            users: Throttle::new(limit, window, config.users.len()),
            others: Throttle::new(limit, window, ADDRESS_TABLE),
            hasher: std::collections::hash_map::RandomState::new(),
            addresses: Throttle::new(
                config.failed_signins_per_address,
                config.signin_lockout,
                ADDRESS_TABLE,
            ),
        }
    }

    fn known(config: &AuthConfig, name: &str) -> bool {
        config.users.iter().any(|u| u.name == name)
    }

    /// How long sign-ins for `name` or from `addr` must wait, if either is locked out.
    fn blocked(&self, config: &AuthConfig, name: &str, addr: Option<IpAddr>) -> Option<Duration> {
        let user = if Self::known(config, name) {
            self.users.blocked(&name.to_owned())
        } else {
            self.others.blocked(&self.hasher.hash_one(name))
        };
        let address = addr.and_then(|a| self.addresses.blocked(&a));
        user.max(address)
    }

    fn failed(&self, config: &AuthConfig, name: &str, addr: Option<IpAddr>) {
        if Self::known(config, name) {
            self.users.hit(name.to_owned());
        } else {
            self.others.hit(self.hasher.hash_one(name));
        }
        if let Some(a) = addr {
            self.addresses.hit(a);
        }
    }

    fn succeeded(&self, name: &str) {
        self.users.clear(&name.to_owned());
    }
}

/// A name a stranger typed, cut for the log (a form field can be megabytes).
fn shown(name: &str) -> &str {
    match name.char_indices().nth(64) {
        Some((at, _)) => &name[..at],
        None => name,
    }
}

#[derive(Deserialize)]
pub(super) struct LoginForm {
    request: String,
    csrf: String,
    username: String,
    password: String,
}

/// An argon2id PHC string for a password (`mcp-gateway hash-password`).
pub fn hash_password(password: &str) -> String {
    use argon2::PasswordHasher;
    use argon2::password_hash::SaltString;
    let bytes: [u8; 16] = rand::random();
    let salt = SaltString::encode_b64(&bytes).expect("16 bytes make a salt");
    argon2::Argon2::default()
        .hash_password(password.as_bytes(), &salt)
        .expect("argon2 hashes any password")
        .to_string()
}

/// Checks a password against the configured users (argon2, off the async threads). An unknown
/// user costs the same as a known one.
async fn check_password(config: &AuthConfig, username: &str, password: &str) -> bool {
    let user = config.users.iter().find(|u| u.name == username);
    let hash = user.map(|u| u.password_hash.clone());
    verify_argon2(hash, password).await && user.is_some()
}

/// Checks a secret against an argon2 PHC string, off the async threads; with no hash, does
/// the same work and fails.
pub(super) async fn verify_argon2(hash: Option<String>, password: &str) -> bool {
    let password = password.to_owned();
    tokio::task::spawn_blocking(move || match hash {
        Some(hash) => {
            use argon2::PasswordVerifier;
            argon2::PasswordHash::new(&hash).is_ok_and(|h| {
                argon2::Argon2::default()
                    .verify_password(password.as_bytes(), &h)
                    .is_ok()
            })
        }
        None => {
            // The same work as a verification, so timing does not tell who exists.
            let _ = hash_password(&password);
            false
        }
    })
    .await
    .unwrap_or(false)
}

/// Why a person was not signed in on another page of the gateway's (the connect page).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refused {
    /// Too many failed sign-ins for the name or from the address: try again after this.
    Locked(Duration),
    /// A wrong name or password.
    Wrong,
}

impl super::AuthServer {
    /// Signs `username` in with `password` for a page other than `/authorize` (the connect
    /// page), under the same lockout as the sign-in form: the subject, or why not.
    pub async fn sign_in(
        &self,
        username: &str,
        password: &str,
        addr: Option<IpAddr>,
    ) -> Result<String, Refused> {
        if let Some(wait) = self.signins.blocked(&self.config, username, addr) {
            refused("signin_locked");
            tracing::warn!(user = %shown(username), address = ?addr, "sign-in refused: too many failed sign-ins");
            return Err(Refused::Locked(wait));
        }
        if !check_password(&self.config, username, password).await {
            self.signins.failed(&self.config, username, addr);
            refused("bad_credentials");
            tracing::info!(user = %shown(username), address = ?addr, "sign-in refused");
            return Err(Refused::Wrong);
        }
        self.signins.succeeded(username);
        Ok(username.to_owned())
    }

    /// Whether people sign in here with a password (configured users).
    pub fn has_users(&self) -> bool {
        !self.config.users.is_empty()
    }

    /// Whether the pages' cookies are `Secure` (the public URL is https).
    pub fn secure_cookies(&self) -> bool {
        self.secure_cookies
    }
}

pub(super) async fn login(
    State(auth): St,
    ClientAddr(addr): ClientAddr,
    headers: HeaderMap,
    Form(f): Form<LoginForm>,
) -> Result<Response, PageError> {
    let s = server(&auth);
    let (mut p, request, client) = pending_for(s, &headers, addr, &f.request, &f.csrf).await?;
    let view = client_view(&client, &request.redirect_uri);
    // Checked before the password, which is not looked at during a lockout (right or wrong).
    if let Some(wait) = s.signins.blocked(&s.config, &f.username, addr) {
        refused("signin_locked");
        tracing::warn!(user = %shown(&f.username), address = ?addr, client_id = %client.client_id, "sign-in refused: too many failed sign-ins");
        let mut r = pages::login(
            &p.id,
            &f.csrf,
            &view,
            Some(&format!(
                "Too many failed sign-ins for this user or from this address. Try again in {}.",
                wait_words(wait)
            )),
            s.upstream_name(),
        );
        *r.status_mut() = StatusCode::TOO_MANY_REQUESTS;
        retry_after(&mut r, wait);
        return Ok(r);
    }
    if !check_password(&s.config, &f.username, &f.password).await {
        s.signins.failed(&s.config, &f.username, addr);
        refused("bad_credentials");
        tracing::info!(user = %shown(&f.username), address = ?addr, client_id = %client.client_id, "sign-in refused");
        return Ok(pages::login(
            &p.id,
            &f.csrf,
            &view,
            Some("Wrong user name or password."),
            s.upstream_name(),
        ));
    }
    s.signins.succeeded(&f.username);
    let groups = s.groups_for(&f.username, &[]);
    let scope = request.scopes.join(" ");
    if s.store
        .has_consent(&f.username, &client.client_id, &scope)
        .await?
    {
        let _ = s.store.delete_pending(&p.id).await;
        return Ok(issue_code(s, &request, &f.username, &groups).await?);
    }
    p.subject = Some(f.username.clone());
    p.groups = groups;
    s.store.put_pending(&p).await?;
    Ok(pages::consent(
        &p.id,
        &f.csrf,
        &view,
        &f.username,
        &request.scopes,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_cut_for_the_log() {
        assert_eq!(shown("alice"), "alice");
        let long = "é".repeat(1000);
        assert_eq!(shown(&long).chars().count(), 64);
    }
}
