//! Who owns a session, remembered for a moment: a replica forwarding a session's requests
//! asks Redis for the owner (the session's record, then the owner's heartbeat: two round trips)
//! at most once per [`OWNER_TTL`], and otherwise reuses the answer.
//!
//! Only "alive, at this URL" is remembered; every other answer (draining, gone, unsure, no
//! such session) is asked again each time. A remembered answer can be stale in three ways,
//! each of which the forward itself finds out:
//! - the owner is gone (killed, restarted on its port): the forward cannot connect or gets
//!   421, never reaching a replica that serves the session;
//! - the owner let the session go (it ended, expired, or another replica took it over): the
//!   owner answers a forwarded request for a session it does not hold with 404 and
//!   [`NOT_HERE_HEADER`](super::forward::NOT_HERE_HEADER);
//! - the owner started draining: it goes on serving for [`DRAIN_NOTICE`], longer than any
//!   answer is remembered, before it stops taking connections.
//!
//! In the first two cases the forwarder forgets the answer and asks Redis again
//! ([`crate::http`]'s `reach`). The cache is bounded: past [`MAX_OWNERS`] entries the
//! expired ones are dropped, and while it stays full nothing new is remembered.

use std::sync::Arc;
use std::time::{Duration, Instant};

use dashmap::DashMap;

/// How long an owner's answer is reused.
pub const OWNER_TTL: Duration = Duration::from_secs(1);
/// How long a draining replica goes on taking connections after its heartbeat says it is
/// draining: every remembered answer naming it has expired by then.
pub const DRAIN_NOTICE: Duration = Duration::from_millis(1250);
/// The most sessions whose owners are remembered.
const MAX_OWNERS: usize = 65_536;

/// A live owner, as Redis named it.
#[derive(Clone)]
pub(super) struct Remembered {
    pub replica: Arc<str>,
    pub url: Arc<str>,
    at: Instant,
}

#[derive(Default)]
pub(super) struct Owners {
    sessions: DashMap<Box<str>, Remembered>,
}

impl Owners {
    /// The owner remembered for `session`, if it was asked within [`OWNER_TTL`].
    pub fn get(&self, session: &str) -> Option<Remembered> {
        let found = self.sessions.get(session)?;
        if found.at.elapsed() < OWNER_TTL {
            return Some(found.clone());
        }
        drop(found);
        self.sessions
            .remove_if(session, |_, r| r.at.elapsed() >= OWNER_TTL);
        None
    }

    pub fn remember(&self, session: &str, replica: &str, url: &str) {
        if self.sessions.len() >= MAX_OWNERS {
            self.sessions.retain(|_, r| r.at.elapsed() < OWNER_TTL);
            if self.sessions.len() >= MAX_OWNERS {
                return;
            }
        }
        self.sessions.insert(
            session.into(),
            Remembered {
                replica: replica.into(),
                url: url.into(),
                at: Instant::now(),
            },
        );
    }

    pub fn forget(&self, session: &str) {
        self.sessions.remove(session);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn remembers_forgets_and_stays_bounded() {
        let owners = Owners::default();
        assert!(owners.get("s").is_none());
        owners.remember("s", "r1", "http://127.0.0.1:1");
        let r = owners.get("s").expect("remembered");
        assert_eq!((&*r.replica, &*r.url), ("r1", "http://127.0.0.1:1"));
        owners.forget("s");
        assert!(owners.get("s").is_none());

        for i in 0..MAX_OWNERS + 10 {
            owners.remember(&i.to_string(), "r", "http://127.0.0.1:1");
        }
        assert_eq!(owners.sessions.len(), MAX_OWNERS);
        assert!(owners.get(&(MAX_OWNERS + 5).to_string()).is_none());
    }

    #[test]
    fn an_old_answer_is_not_reused() {
        let owners = Owners::default();
        owners.sessions.insert(
            "s".into(),
            Remembered {
                replica: "r".into(),
                url: "http://127.0.0.1:1".into(),
                at: Instant::now() - OWNER_TTL,
            },
        );
        assert!(owners.get("s").is_none());
        assert!(owners.sessions.is_empty());
    }
}
