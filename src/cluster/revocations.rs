//! Access-token revocations heard by every replica at once: [`RedisRevocations`], the
//! [`RevocationFeed`] of cluster mode. A replica that revokes tokens writes them to the
//! database (which every replica shares, and loads at start) and then publishes them on the
//! channel `<prefix>revocations`, one `<jti> <expiry>` line each; every replica adds what it
//! hears to the in-memory set its token checks read. A request's check never waits on Redis.
//!
//! When Redis is unreachable, tokens are still checked, against what each replica knows:
//! failing open to the database, not closed. A revocation is in the database before anyone is
//! told of it, and a replica that does not hear the channel re-reads the database every
//! second (instead of every ten), and at once when it hears it again; so a revocation still
//! holds everywhere within about a second. Refusing every token while Redis is away would
//! turn a cache outage into an outage of every client, for no revocation that the database
//! does not already carry.

use std::sync::Arc;

use super::Cluster;
use super::bus::Listener;
use crate::auth::keys::KeyRing;
use crate::auth::shared::{RevocationFeed, SharedFuture};

/// The channel's name under the cluster's prefix.
pub(super) const CHANNEL: &str = "revocations";
/// The longest `jti` accepted from the channel (the issuer's are 43 characters).
const MAX_JTI: usize = 128;

/// Announces this replica's revocations on the cluster's channel.
pub struct RedisRevocations {
    cluster: Arc<Cluster>,
    channel: String,
}

impl RedisRevocations {
    pub(super) fn new(cluster: Arc<Cluster>) -> RedisRevocations {
        let channel = cluster.channel(CHANNEL);
        RedisRevocations { cluster, channel }
    }
}

impl RevocationFeed for RedisRevocations {
    fn announce<'a>(&'a self, revoked: &'a [(String, i64)]) -> SharedFuture<'a, ()> {
        Box::pin(async move {
            let Some(payload) = encode(revoked) else {
                return;
            };
            if let Err(e) = self.cluster.publish(&self.channel, &payload).await {
                tracing::warn!(
                    count = revoked.len(),
                    "revocation not announced to the other replicas ({e}); they will find it in the database within seconds"
                );
            }
        })
    }

    fn listening(&self) -> bool {
        self.cluster.hears()
    }
}

/// Hands the revocations heard on the channel to this replica's key ring.
pub(super) struct Heard {
    pub(super) keys: Arc<KeyRing>,
}

impl Listener for Heard {
    fn message(&self, payload: &[u8]) {
        let revoked = parse(payload);
        if !revoked.is_empty() {
            self.keys.revoked_elsewhere(&revoked);
        }
    }

    fn resubscribed(&self) {
        // What was published while this replica was not listening is in the database.
        let keys = self.keys.clone();
        tokio::spawn(async move {
            if let Err(e) = keys.refresh_revocations().await {
                tracing::warn!("re-reading revoked access tokens: {e}");
            }
        });
    }
}

/// `<jti> <expiry>` lines; `None` when there is nothing to say.
fn encode(revoked: &[(String, i64)]) -> Option<String> {
    let lines: Vec<String> = revoked
        .iter()
        .filter(|(jti, _)| valid_jti(jti))
        .map(|(jti, exp)| format!("{jti} {exp}"))
        .collect();
    (!lines.is_empty()).then(|| lines.join("\n"))
}

/// The revocations of a message; lines that do not parse are skipped.
fn parse(payload: &[u8]) -> Vec<(String, i64)> {
    let Ok(text) = std::str::from_utf8(payload) else {
        return Vec::new();
    };
    text.lines()
        .filter_map(|line| {
            let (jti, exp) = line.split_once(' ')?;
            let exp = exp.parse::<i64>().ok()?;
            valid_jti(jti).then(|| (jti.to_owned(), exp))
        })
        .collect()
}

/// A `jti` as the issuer makes them: base64url, not too long.
fn valid_jti(jti: &str) -> bool {
    !jti.is_empty()
        && jti.len() <= MAX_JTI
        && jti
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn revocations_go_through_a_message_and_back() {
        let revoked = vec![
            (crate::auth::random_token(), 1_800_000_000),
            ("abc-_D9".to_owned(), -5),
        ];
        let payload = encode(&revoked).unwrap();
        assert_eq!(parse(payload.as_bytes()), revoked);
        assert_eq!(encode(&[]), None);
    }

    #[test]
    fn what_does_not_parse_is_skipped() {
        let long = "a".repeat(MAX_JTI + 1);
        let payload = format!("ok 1\nno-expiry\nbad jti 2\nx y\n{long} 3\n\u{e9} 4\n 5\nok2 6");
        assert_eq!(
            parse(payload.as_bytes()),
            vec![("ok".to_owned(), 1), ("ok2".to_owned(), 6)]
        );
        assert!(parse(&[0xff, 0xfe, b' ', b'1']).is_empty());
        assert_eq!(
            encode(&[("sp ace".to_owned(), 1)]),
            None,
            "a jti that could not be read back is not sent"
        );
    }
}
