//! What every replica hears at once about access tokens: [`RedisAuthFeed`], the [`AuthFeed`]
//! of cluster mode. A replica that revokes tokens writes them to the database (which every
//! replica shares, and loads at start) and then publishes them on the channel
//! `<prefix>auth`, a `revoked <jti> <expiry>` line each; every replica adds what it hears to
//! the in-memory set its token checks read, so a request's check never waits on Redis. A
//! rotation of the signing keys is announced the same way (`keys`): every replica re-reads
//! the keys from the database, so the new key's tokens validate everywhere at once.
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
use crate::auth::shared::{AuthFeed, SharedFuture};

/// The channel's name under the cluster's prefix.
pub(super) const CHANNEL: &str = "auth";
/// The longest `jti` accepted from the channel (the issuer's are 43 characters).
const MAX_JTI: usize = 128;
/// The line that announces a rotation.
const KEYS: &str = "keys";

/// Announces this replica's revocations and rotations on the cluster's channel.
pub struct RedisAuthFeed {
    cluster: Arc<Cluster>,
    channel: String,
}

impl RedisAuthFeed {
    pub(super) fn new(cluster: Arc<Cluster>) -> RedisAuthFeed {
        let channel = cluster.channel(CHANNEL);
        RedisAuthFeed { cluster, channel }
    }

    async fn publish(&self, payload: &str, what: &str) {
        if let Err(e) = self.cluster.publish(&self.channel, payload).await {
            tracing::warn!(
                "{what} not announced to the other replicas ({e}); they will find it in the database within seconds"
            );
        }
    }
}

impl AuthFeed for RedisAuthFeed {
    fn announce_revoked<'a>(&'a self, revoked: &'a [(String, i64)]) -> SharedFuture<'a, ()> {
        Box::pin(async move {
            if let Some(payload) = encode(revoked) {
                self.publish(&payload, "a revocation").await;
            }
        })
    }

    fn announce_keys(&self) -> SharedFuture<'_, ()> {
        Box::pin(self.publish(KEYS, "a key rotation"))
    }

    fn listening(&self) -> bool {
        self.cluster.hears()
    }
}

/// Hands what is heard on the channel to this replica's key ring.
pub(super) struct Heard {
    pub(super) keys: Arc<KeyRing>,
}

impl Listener for Heard {
    fn message(&self, payload: &[u8]) {
        let message = parse(payload);
        if !message.revoked.is_empty() {
            self.keys.revoked_elsewhere(&message.revoked);
        }
        if message.keys {
            let keys = self.keys.clone();
            tokio::spawn(async move { reload_keys(&keys).await });
        }
    }

    fn resubscribed(&self) {
        // What was published while this replica was not listening is in the database.
        let keys = self.keys.clone();
        tokio::spawn(async move {
            if let Err(e) = keys.refresh_revocations().await {
                tracing::warn!("re-reading revoked access tokens: {e}");
            }
            reload_keys(&keys).await;
        });
    }
}

async fn reload_keys(keys: &KeyRing) {
    if let Err(e) = keys.reload_keys().await {
        tracing::warn!("re-reading the signing keys: {e}");
    }
}

/// A message of the channel.
#[derive(Debug, Default, PartialEq)]
struct Message {
    revoked: Vec<(String, i64)>,
    /// The keys changed.
    keys: bool,
}

/// `revoked <jti> <expiry>` lines; `None` when there is nothing to say.
fn encode(revoked: &[(String, i64)]) -> Option<String> {
    let lines: Vec<String> = revoked
        .iter()
        .filter(|(jti, _)| valid_jti(jti))
        .map(|(jti, exp)| format!("revoked {jti} {exp}"))
        .collect();
    (!lines.is_empty()).then(|| lines.join("\n"))
}

/// What a message says; lines that do not parse are skipped.
fn parse(payload: &[u8]) -> Message {
    let mut message = Message::default();
    let Ok(text) = std::str::from_utf8(payload) else {
        return message;
    };
    for line in text.lines() {
        if line == KEYS {
            message.keys = true;
        } else if let Some(revoked) = line.strip_prefix("revoked ").and_then(revocation) {
            message.revoked.push(revoked);
        }
    }
    message
}

/// `<jti> <expiry>`.
fn revocation(line: &str) -> Option<(String, i64)> {
    let (jti, exp) = line.split_once(' ')?;
    let exp = exp.parse::<i64>().ok()?;
    valid_jti(jti).then(|| (jti.to_owned(), exp))
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
        assert_eq!(
            parse(payload.as_bytes()),
            Message {
                revoked,
                keys: false
            }
        );
        assert_eq!(encode(&[]), None);
        assert_eq!(
            parse(KEYS.as_bytes()),
            Message {
                revoked: Vec::new(),
                keys: true
            }
        );
    }

    #[test]
    fn what_does_not_parse_is_skipped() {
        let long = "a".repeat(MAX_JTI + 1);
        let payload = format!(
            "revoked ok 1\nrevoked no-expiry\nrevoked bad jti 2\nrevoked x y\nrevoked {long} 3\nrevoked \u{e9} 4\nrevoked  5\nok3 7\nkeys please\nrevoked ok2 6"
        );
        assert_eq!(
            parse(payload.as_bytes()).revoked,
            vec![("ok".to_owned(), 1), ("ok2".to_owned(), 6)]
        );
        assert!(!parse(payload.as_bytes()).keys);
        assert_eq!(parse(&[0xff, 0xfe, b' ', b'1']), Message::default());
        assert_eq!(
            encode(&[("sp ace".to_owned(), 1)]),
            None,
            "a jti that could not be read back is not sent"
        );
    }
}
