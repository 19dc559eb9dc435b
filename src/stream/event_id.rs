//! SSE event ids: `<session tag>-<stream>-<sequence>`, e.g. `9f3a12c0-3-17`, and for priming
//! events `<tag>-<stream>-<sequence>-p<n>`.
//!
//! The tag is a random 32-bit value per session (so an id from another session is recognised
//! as such), the stream number is unique in its session (0 is the GET stream), and the
//! sequence counts that stream's events from 1. A priming event carries the position its
//! connection starts after, plus the connection's number on that stream, so its id is never
//! another event's. Together they make every id unique across the session's streams and let a
//! `Last-Event-ID` name both the stream to resume and the cursor in it. Parsing accepts only
//! the canonical form.

use std::fmt;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EventId {
    pub tag: u32,
    pub stream: u64,
    pub seq: u64,
    /// For a priming event: the number of the connection it opened.
    pub prime: Option<u64>,
}

/// Why a `Last-Event-ID` was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EventIdError {
    #[error("`{0}` is not an event id this gateway issued")]
    Malformed(String),
}

impl fmt::Display for EventId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut text = Vec::with_capacity(48);
        self.write_to(&mut text);
        f.write_str(std::str::from_utf8(&text).expect("ASCII"))
    }
}

impl EventId {
    /// Appends the id's text, what `Display` writes, without the formatting machinery: every
    /// event of a resumable stream carries one.
    pub fn write_to(&self, out: &mut Vec<u8>) {
        const HEX: &[u8; 16] = b"0123456789abcdef";
        out.extend(
            (0..8)
                .rev()
                .map(|i| HEX[(self.tag >> (4 * i)) as usize & 0xf]),
        );
        let mut digits = itoa::Buffer::new();
        out.push(b'-');
        out.extend_from_slice(digits.format(self.stream).as_bytes());
        out.push(b'-');
        out.extend_from_slice(digits.format(self.seq).as_bytes());
        if let Some(n) = self.prime {
            out.extend_from_slice(b"-p");
            out.extend_from_slice(digits.format(n).as_bytes());
        }
    }

    pub fn parse(text: &str) -> Result<EventId, EventIdError> {
        let bad = || EventIdError::Malformed(text.chars().take(64).collect());
        let mut parts = text.split('-');
        let (Some(tag), Some(stream), Some(seq)) = (parts.next(), parts.next(), parts.next())
        else {
            return Err(bad());
        };
        let prime = match (parts.next(), parts.next()) {
            (None, _) => None,
            (Some(p), None) => Some(p.strip_prefix('p').and_then(decimal).ok_or_else(bad)?),
            _ => return Err(bad()),
        };
        if tag.len() != 8
            || !tag
                .bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
        {
            return Err(bad());
        }
        let tag = u32::from_str_radix(tag, 16).map_err(|_| bad())?;
        Ok(EventId {
            tag,
            stream: decimal(stream).ok_or_else(bad)?,
            seq: decimal(seq).ok_or_else(bad)?,
            prime,
        })
    }
}

/// A canonical decimal: digits only, no leading zero unless it is `0`, fits in u64.
fn decimal(s: &str) -> Option<u64> {
    let canonical =
        !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit()) && (s == "0" || !s.starts_with('0'));
    if canonical { s.parse().ok() } else { None }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    #[test]
    fn round_trip_and_refusals() {
        let id = EventId {
            tag: 0x9f3a12c0,
            stream: 3,
            seq: 17,
            prime: None,
        };
        assert_eq!(id.to_string(), "9f3a12c0-3-17");
        assert_eq!(EventId::parse("9f3a12c0-3-17"), Ok(id));
        assert_eq!(EventId::parse("00000000-0-0").unwrap().seq, 0);
        for bad in [
            "",
            "9f3a12c0-3",
            "9f3a12c0-3-17-1",
            "9F3A12C0-3-17",
            "9f3a12c-3-17",
            "9f3a12c00-3-17",
            "9f3a12c0-03-17",
            "9f3a12c0-3-+17",
            "9f3a12c0--17",
            "9f3a12c0-3-18446744073709551616",
            "9f3a12c0-3-1 ",
            "xyz",
            "1::2",
            "9f3a12c0-3-17-2",
            "9f3a12c0-3-17-p",
            "9f3a12c0-3-17-p02",
            "9f3a12c0-3-17-p1-p2",
        ] {
            assert!(EventId::parse(bad).is_err(), "{bad:?}");
        }
    }

    proptest! {
        #[test]
        fn every_id_round_trips(tag in any::<u32>(), stream in any::<u64>(), seq in any::<u64>(), prime in any::<Option<u64>>()) {
            let id = EventId { tag, stream, seq, prime };
            prop_assert_eq!(EventId::parse(&id.to_string()), Ok(id));
        }

        #[test]
        fn parsing_any_text_never_panics_and_accepts_only_canonical_ids(s in "\\PC{0,40}") {
            if let Ok(id) = EventId::parse(&s) {
                prop_assert_eq!(id.to_string(), s);
            }
        }

        #[test]
        fn near_misses_are_refused(s in "[0-9a-fA-F]{7,9}-[0-9]{1,3}-[0-9+]{1,3}") {
            if let Ok(id) = EventId::parse(&s) {
                prop_assert_eq!(id.to_string(), s);
            }
        }
    }
}
