//! What a replica reads from Redis to decide where to forward a request, signed with the
//! cluster secret: whoever can write to Redis without knowing the secret must not be able to
//! send a session's requests (with the secret and the client's bearer token on them) to an
//! address of their choosing.
//!
//! Two values decide a forward: a session record's `replica` (its owner, see [`super::sessions`])
//! and that replica's heartbeat (its state and the URL it is reached at). Each is written with an
//! HMAC-SHA256 under a key derived from the secret for this purpose alone, over what the value
//! is for (heartbeat or owner), the name of the key it is stored under, and the value itself:
//! a signature moved to another session's record, to another replica's heartbeat, or kept with
//! another value does not verify. A value that does not verify is treated as absent (a
//! heartbeat as lapsed, a record's owner as unknown), counted in
//! `mcp_gateway_cluster_unverified_total` and logged at most once a minute; it is never
//! forwarded to. What a signature cannot stop: deleting keys, or putting back a value a replica
//! once wrote under the same key. A heartbeat signs the time it expires, so one put back is
//! believed only as long as its replica was alive anyway (its address could be another's
//! later); an owner put back names a replica of the cluster, whose own heartbeat decides.
//!
//! The key that names sessions in key names ([`session_names`], see
//! [`crate::stream::SessionNames`]) is derived from the secret too, for that purpose alone.
//!
//! The MACs are keyed once, at start, and cloned for each use.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use hmac::{Hmac, Mac};
use sha2::Sha256;

use crate::stream::SessionNames;

type HmacSha256 = Hmac<Sha256>;

/// What the forwarding signatures' key is derived with (an HMAC of it under the secret).
const FORWARD_SIGNING: &str = "mcp-gateway forward-signing v1";

/// What the key of the sessions' names in key names is derived with.
const KEY_NAMES: &str = "mcp-gateway key-names v1";

/// The shortest time between two warnings about values that did not verify.
const WARN_EVERY: Duration = Duration::from_secs(60);

/// What a signed value is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Signed {
    /// A replica's heartbeat: its state and URL.
    Heartbeat,
    /// The replica a session record names as its owner.
    Owner,
}

impl Signed {
    fn label(self) -> &'static str {
        match self {
            Signed::Heartbeat => "heartbeat",
            Signed::Owner => "owner",
        }
    }
}

/// A key for one purpose, derived from the cluster secret.
pub(super) fn derive(secret: &str, purpose: &str) -> [u8; 32] {
    let mut mac = HmacSha256::new_from_slice(secret.as_bytes()).expect("any key length");
    mac.update(purpose.as_bytes());
    mac.finalize().into_bytes().into()
}

/// What a session is called in the key names of the cluster whose secret is `secret`.
pub fn session_names(secret: &str) -> SessionNames {
    SessionNames::new(&derive(secret, KEY_NAMES))
}

/// Signs and checks the values forwards depend on (see the module's doc).
pub struct Signing {
    /// Keyed with the forwarding key and nothing else; cloned for each use.
    keyed: HmacSha256,
    born: Instant,
    /// When a warning was last logged, in milliseconds since `born` (0: never).
    last_warned: AtomicU64,
}

impl Signing {
    /// Signing under `secret`, the cluster's.
    pub fn new(secret: &str) -> Signing {
        let key = derive(secret, FORWARD_SIGNING);
        Signing {
            keyed: HmacSha256::new_from_slice(&key).expect("any key length"),
            born: Instant::now(),
            last_warned: AtomicU64::new(0),
        }
    }

    fn mac(&self, what: Signed, key: &str, value: &str) -> HmacSha256 {
        let mut mac = self.keyed.clone();
        // Each part length-prefixed, so no two lists of parts read the same.
        for part in [what.label(), key, value] {
            mac.update(&(part.len() as u64).to_be_bytes());
            mac.update(part.as_bytes());
        }
        mac
    }

    /// The signature of `value`, stored under the Redis key `key` as `what`: 64 hex digits.
    pub fn sign(&self, what: Signed, key: &str, value: &str) -> String {
        const HEX: &[u8; 16] = b"0123456789abcdef";
        let mut out = String::with_capacity(64);
        for b in self.mac(what, key, value).finalize().into_bytes() {
            out.push(HEX[usize::from(b >> 4)] as char);
            out.push(HEX[usize::from(b & 15)] as char);
        }
        out
    }

    /// Whether `signature` is [`Signing::sign`]'s for these (compared in constant time).
    pub fn verify(&self, what: Signed, key: &str, value: &str, signature: &str) -> bool {
        let Some(bytes) = unhex(signature) else {
            return false;
        };
        self.mac(what, key, value).verify_slice(&bytes).is_ok()
    }

    /// A value read from Redis under `key` did not verify: counted, and logged at most once
    /// per [`WARN_EVERY`].
    pub(super) fn unverified(&self, what: Signed, key: &str) {
        crate::metrics::get()
            .cluster_unverified
            .with_label_values(&[what.label()])
            .inc();
        let now = self.born.elapsed().as_millis() as u64 + 1;
        let last = self.last_warned.load(Ordering::Relaxed);
        let due = last == 0 || now - last.min(now) >= WARN_EVERY.as_millis() as u64;
        if due
            && self
                .last_warned
                .compare_exchange(last, now, Ordering::Relaxed, Ordering::Relaxed)
                .is_ok()
        {
            tracing::warn!(
                key,
                what = what.label(),
                "a value in Redis that decides where requests are forwarded is not signed with \
                 the cluster secret: ignored (something other than this cluster's replicas \
                 writes to its Redis, or a replica has another secret); logged at most once a \
                 minute, counted in mcp_gateway_cluster_unverified_total"
            );
        }
    }

    /// Counts each kind at zero, so the metric is there before anything fails to verify.
    pub(super) fn register_metrics() {
        for what in [Signed::Heartbeat, Signed::Owner] {
            let _ = crate::metrics::get()
                .cluster_unverified
                .with_label_values(&[what.label()]);
        }
    }
}

/// The bytes of 64 lowercase or uppercase hex digits; `None` for anything else.
fn unhex(text: &str) -> Option<[u8; 32]> {
    let digits = text.as_bytes();
    if digits.len() != 64 {
        return None;
    }
    let nibble = |c: u8| (c as char).to_digit(16).map(|d| d as u8);
    let mut out = [0u8; 32];
    for (i, pair) in digits.chunks_exact(2).enumerate() {
        out[i] = nibble(pair[0])? << 4 | nibble(pair[1])?;
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_signature_holds_only_for_its_value_key_purpose_and_secret() {
        let s = Signing::new("0123456789abcdef");
        let sig = s.sign(Signed::Heartbeat, "p:replica:r1", "http://10.0.0.1:8080");
        assert_eq!(sig.len(), 64);
        assert!(s.verify(
            Signed::Heartbeat,
            "p:replica:r1",
            "http://10.0.0.1:8080",
            &sig
        ));
        assert!(s.verify(
            Signed::Heartbeat,
            "p:replica:r1",
            "http://10.0.0.1:8080",
            &sig.to_uppercase()
        ));
        // Another value, another key, another purpose, another secret: no.
        assert!(!s.verify(
            Signed::Heartbeat,
            "p:replica:r1",
            "http://10.6.6.6:80",
            &sig
        ));
        assert!(!s.verify(
            Signed::Heartbeat,
            "p:replica:r2",
            "http://10.0.0.1:8080",
            &sig
        ));
        assert!(!s.verify(Signed::Owner, "p:replica:r1", "http://10.0.0.1:8080", &sig));
        let other = Signing::new("0123456789abcdeF");
        assert!(!other.verify(
            Signed::Heartbeat,
            "p:replica:r1",
            "http://10.0.0.1:8080",
            &sig
        ));
        // The parts cannot be shifted into one another.
        let a = s.sign(Signed::Owner, "k:x", "y");
        assert!(!s.verify(Signed::Owner, "k:", "xy", &a));
        // Nothing that is not a signature verifies.
        for bad in [
            "",
            "zz",
            &sig[..63],
            &format!("{sig}0"),
            &sig.replace(|_| true, "g"),
        ] {
            assert!(
                !s.verify(
                    Signed::Heartbeat,
                    "p:replica:r1",
                    "http://10.0.0.1:8080",
                    bad
                ),
                "{bad:?}"
            );
        }
    }

    #[test]
    fn the_forwarding_key_is_not_the_secret() {
        let key = derive("0123456789abcdef", FORWARD_SIGNING);
        assert_ne!(&key[..16], b"0123456789abcdef");
        assert_ne!(key, derive("0123456789abcdef", KEY_NAMES));
    }
}
