//! What the replicas of a cluster share about authorization, as seams: [`AuthFeed`] tells
//! the other replicas of revoked access tokens and of a new signing key, and
//! [`SharedThrottle`] counts attempts
//! (registrations) across replicas. Both are optional ([`Shared::default`] is a replica of
//! its own) and implemented above, by cluster mode, on Redis.
//!
//! Neither replaces the database: a revocation or a key is written there first (the record
//! every replica loads at start and re-reads now and then), the feed only makes the others
//! hear of it at once. This module knows nothing of Redis.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

/// What an [`AuthFeed`] or a [`SharedThrottle`] call returns: a boxed future, so the
/// traits stay object-safe.
pub type SharedFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// Tells every replica of the access tokens revoked here and of signing keys made here; the
/// implementation also hands the others' announcements to the [`super::keys::KeyRing`]
/// ([`revoked_elsewhere`](super::keys::KeyRing::revoked_elsewhere),
/// [`reload_keys`](super::keys::KeyRing::reload_keys)).
pub trait AuthFeed: Send + Sync + 'static {
    /// Announces that the access tokens `revoked` (`jti`, expiry in Unix seconds) are refused
    /// from now on. Best effort: the database holds them already, so a failure (logged and
    /// counted by the implementation) delays the others until their next re-read.
    fn announce_revoked<'a>(&'a self, revoked: &'a [(String, i64)]) -> SharedFuture<'a, ()>;

    /// Announces that the signing keys changed (a rotation): the others re-read them, so the
    /// new key's tokens validate everywhere. Best effort, as above.
    fn announce_keys(&self) -> SharedFuture<'_, ()>;

    /// Whether the others' announcements reach this replica now. While they do not (the
    /// subscription is down), the revoked set is re-read from the database every
    /// [`super::keys::REVOCATION_REFRESH_UNHEARD`] instead of every
    /// [`super::keys::REVOCATION_REFRESH`].
    fn listening(&self) -> bool;
}

/// Whether an attempt may go ahead.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Admission {
    /// Counted.
    Admitted,
    /// A counter is at its limit: nothing was counted; try again after this wait.
    Refused(Duration),
}

/// Fixed-window attempt counters every replica shares.
pub trait SharedThrottle: Send + Sync + 'static {
    /// One attempt counted under every `(key, limit)` of `counters`, whose windows last
    /// `window` from their first attempt, unless one of them has reached its limit: then
    /// nothing is counted and the wait until that window ends comes back. `Err` when the
    /// count could not be taken (the caller decides what that means).
    fn acquire<'a>(
        &'a self,
        counters: &'a [(String, u32)],
        window: Duration,
    ) -> SharedFuture<'a, Result<Admission, String>>;
}

/// What a replica shares with the others ([`Shared::default`]: nothing, a replica of its own).
#[derive(Clone, Default)]
pub struct Shared {
    /// Revocations and key rotations announced to, and heard from, the other replicas.
    pub feed: Option<Arc<dyn AuthFeed>>,
    /// The registration limit counted across replicas.
    pub throttle: Option<Arc<dyn SharedThrottle>>,
}
