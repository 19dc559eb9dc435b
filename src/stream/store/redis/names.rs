//! What stands for a session in Redis key names ([`SessionNames`]): never its id, which is what
//! a client presents to use the session, but a keyed hash of it, so that whoever can list the
//! keys (a `SCAN`, a dump, a monitoring tool) learns no session id. The key is the cluster's,
//! derived from its secret (see `crate::cluster`), so every replica names a session alike and
//! nobody without the secret can tell which name is which session's.
//!
//! A name is computed once per session and kept with it (the writer's operations carry it), not
//! per event.

use hmac::{Hmac, Mac};
use sha2::Sha256;

/// Hashes session ids into the names their keys carry.
#[derive(Clone)]
pub struct SessionNames {
    /// Keyed and nothing else; cloned for each use.
    keyed: Hmac<Sha256>,
}

impl SessionNames {
    /// Names under `key`, one every replica of a cluster derives alike.
    pub fn new(key: &[u8]) -> SessionNames {
        SessionNames {
            keyed: Hmac::<Sha256>::new_from_slice(key).expect("any key length"),
        }
    }

    /// The name of session `id` in key names: the first 128 bits of its HMAC-SHA256, as 32 hex
    /// digits.
    pub fn of(&self, id: &str) -> String {
        const HEX: &[u8; 16] = b"0123456789abcdef";
        let mut mac = self.keyed.clone();
        mac.update(id.as_bytes());
        let digest = mac.finalize().into_bytes();
        let mut out = String::with_capacity(32);
        for b in &digest[..16] {
            out.push(HEX[usize::from(b >> 4)] as char);
            out.push(HEX[usize::from(b & 15)] as char);
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_name_is_stable_keyed_and_tells_nothing_of_the_id() {
        let names = SessionNames::new(b"one cluster's key");
        let id = "smhpJPIIrKiiUyxlN1uZ3C45MfHTiWU3Di7735EuHog";
        let name = names.of(id);
        assert_eq!(name.len(), 32);
        assert!(name.bytes().all(|b| b.is_ascii_hexdigit()));
        assert_eq!(names.clone().of(id), name);
        assert_ne!(names.of("another"), name);
        assert_ne!(SessionNames::new(b"another cluster's key").of(id), name);
    }
}
