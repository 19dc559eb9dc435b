//! How a credential is kept in the database: XChaCha20-Poly1305 under the storage key, which
//! is never in the database (`credentials.key_file` or the environment), with the subject and
//! the credential's name bound in as associated data, so a row copied to another person or
//! another credential does not open. A sealed value names its key by an id (a hash of the
//! key, not the key): a value sealed under a previous key still opens, and is sealed again
//! under the current key when it is next used ([`Opened::stale`]).
//!
//! Text form: `v1.<key id>.<base64url(nonce ‖ ciphertext)>`.

use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use chacha20poly1305::aead::{Aead, KeyInit, Payload};
use chacha20poly1305::{XChaCha20Poly1305, XNonce};
use sha2::{Digest, Sha256};

use crate::config::CredentialKeys;

const VERSION: &str = "v1";
const NONCE: usize = 24;

/// Why a sealed value did not open.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SealError {
    #[error("no storage key is configured")]
    NoKey,
    #[error("sealed under a key the gateway no longer has (key id {0})")]
    UnknownKey(String),
    #[error("not a sealed value, or altered, or another person's or credential's")]
    Invalid,
}

/// What opened, and whether it was under a previous key.
#[derive(Debug, PartialEq, Eq)]
pub struct Opened {
    pub plain: Vec<u8>,
    /// Sealed under a previous key: seal it again under the current one.
    pub stale: bool,
}

/// The storage keys, ready to seal and open.
pub struct Sealer {
    current: Option<(String, XChaCha20Poly1305)>,
    previous: Vec<(String, XChaCha20Poly1305)>,
}

impl std::fmt::Debug for Sealer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Sealer(***)")
    }
}

/// A key's id: the start of a hash of it, enough to tell keys apart, nothing to learn it by.
fn key_id(key: &[u8; 32]) -> String {
    let digest = Sha256::new()
        .chain_update(b"mcp-gateway credentials key id\0")
        .chain_update(key)
        .finalize();
    digest[..8].iter().map(|b| format!("{b:02x}")).collect()
}

/// What is bound to a value besides the key: whose it is and which credential.
fn associated(subject: &str, name: &str) -> Vec<u8> {
    let mut aad = Vec::with_capacity(32 + subject.len() + name.len());
    aad.extend_from_slice(b"mcp-gateway credential\0");
    // Lengths first: no two (subject, name) pairs give the same bytes.
    aad.extend_from_slice(&(subject.len() as u64).to_be_bytes());
    aad.extend_from_slice(subject.as_bytes());
    aad.extend_from_slice(name.as_bytes());
    aad
}

impl Sealer {
    pub fn new(keys: &CredentialKeys) -> Sealer {
        let cipher = |k: &[u8; 32]| (key_id(k), XChaCha20Poly1305::new(k.into()));
        Sealer {
            current: keys.current.as_ref().map(cipher),
            previous: keys.previous.iter().map(cipher).collect(),
        }
    }

    /// `plain`, sealed for `subject`'s credential `name`.
    pub fn seal(&self, subject: &str, name: &str, plain: &[u8]) -> Result<String, SealError> {
        let (id, cipher) = self.current.as_ref().ok_or(SealError::NoKey)?;
        let nonce: [u8; NONCE] = rand::random();
        let aad = associated(subject, name);
        let sealed = cipher
            .encrypt(
                &XNonce::from(nonce),
                Payload {
                    msg: plain,
                    aad: &aad,
                },
            )
            .map_err(|_| SealError::Invalid)?;
        let mut bytes = nonce.to_vec();
        bytes.extend_from_slice(&sealed);
        Ok(format!("{VERSION}.{id}.{}", URL_SAFE_NO_PAD.encode(bytes)))
    }

    /// Opens what [`Sealer::seal`] made for the same subject and name.
    pub fn open(&self, subject: &str, name: &str, sealed: &str) -> Result<Opened, SealError> {
        let mut parts = sealed.splitn(3, '.');
        let (Some(VERSION), Some(id), Some(body)) = (parts.next(), parts.next(), parts.next())
        else {
            return Err(SealError::Invalid);
        };
        let (cipher, stale) = match &self.current {
            Some((current, c)) if current == id => (c, false),
            _ => match self.previous.iter().find(|(p, _)| p == id) {
                Some((_, c)) => (c, true),
                None if self.current.is_none() => return Err(SealError::NoKey),
                None => return Err(SealError::UnknownKey(id.chars().take(16).collect())),
            },
        };
        let bytes = URL_SAFE_NO_PAD
            .decode(body)
            .map_err(|_| SealError::Invalid)?;
        if bytes.len() < NONCE {
            return Err(SealError::Invalid);
        }
        let (nonce, ciphertext) = bytes.split_at(NONCE);
        let nonce: [u8; NONCE] = nonce.try_into().expect("NONCE bytes");
        let aad = associated(subject, name);
        let plain = cipher
            .decrypt(
                &XNonce::from(nonce),
                Payload {
                    msg: ciphertext,
                    aad: &aad,
                },
            )
            .map_err(|_| SealError::Invalid)?;
        Ok(Opened { plain, stale })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn keys(current: u8, previous: &[u8]) -> CredentialKeys {
        CredentialKeys {
            current: Some([current; 32]),
            previous: previous.iter().map(|p| [*p; 32]).collect(),
        }
    }

    #[test]
    fn a_sealed_value_opens_only_for_its_subject_and_name() {
        let s = Sealer::new(&keys(1, &[]));
        let sealed = s.seal("alice", "github", b"gho_token").unwrap();
        assert!(!sealed.contains("gho_token"));
        let opened = s.open("alice", "github", &sealed).unwrap();
        assert_eq!(
            (opened.plain.as_slice(), opened.stale),
            (&b"gho_token"[..], false)
        );
        // Another person's row, another credential's, a changed byte: nothing opens.
        assert_eq!(s.open("bob", "github", &sealed), Err(SealError::Invalid));
        assert_eq!(s.open("alice", "jira", &sealed), Err(SealError::Invalid));
        assert_eq!(s.open("alic", "egithub", &sealed), Err(SealError::Invalid));
        let mut altered = sealed.clone().into_bytes();
        let last = altered.len() - 1;
        altered[last] = if altered[last] == b'A' { b'B' } else { b'A' };
        let altered = String::from_utf8(altered).unwrap();
        assert_eq!(s.open("alice", "github", &altered), Err(SealError::Invalid));
        assert_eq!(s.open("alice", "github", "v1.x"), Err(SealError::Invalid));
        // Two seals of one value differ (a nonce each).
        assert_ne!(sealed, s.seal("alice", "github", b"gho_token").unwrap());
    }

    #[test]
    fn a_rotated_key_still_opens_and_asks_for_a_new_seal() {
        let old = Sealer::new(&keys(1, &[]));
        let sealed = old.seal("alice", "github", b"t").unwrap();
        let rotated = Sealer::new(&keys(2, &[1]));
        let opened = rotated.open("alice", "github", &sealed).unwrap();
        assert!(opened.stale);
        let resealed = rotated.seal("alice", "github", &opened.plain).unwrap();
        assert!(!rotated.open("alice", "github", &resealed).unwrap().stale);
        // Once the old key is gone, what it sealed does not open, and says so.
        let gone = Sealer::new(&keys(2, &[]));
        assert!(matches!(
            gone.open("alice", "github", &sealed),
            Err(SealError::UnknownKey(_))
        ));
        assert_eq!(
            Sealer::new(&CredentialKeys::default()).seal("a", "b", b"c"),
            Err(SealError::NoKey)
        );
        assert_eq!(format!("{rotated:?}"), "Sealer(***)");
    }
}
