//! A record's JSON line, written by hand and read back: the one text a record becomes, both
//! on stderr (the JSON log's shape: `timestamp`, `level`, `fields` with `message` first,
//! `target`; an absent value left out) and in the database, where a batch's lines are stored
//! together (`store.rs`, [`Segment`](super::Segment)).
//!
//! Written straight into a buffer: through serde every string went through its escaping
//! machinery and every time through `format!`, and a line cost more than a fifth of the
//! gateway's own work on an audited call. Strings are escaped exactly as serde_json escapes
//! them (`"`, `\` and control characters only), so that a filter's value, escaped the same way,
//! is found in the stored text as it is ([`needle`]).

use serde::Deserialize;

use super::{Outcome, Record, TARGET};

/// Lines written together: the time they are written, as text once, and the date of the
/// last record's time (records of a moment share their day).
pub(super) struct Lines {
    timestamp: Vec<u8>,
    day: i64,
    date: Vec<u8>,
}

impl Lines {
    /// Lines written at `now_ms`.
    pub(super) fn at(now_ms: i64) -> Lines {
        let mut timestamp = Vec::with_capacity(24);
        rfc3339_into(&mut timestamp, now_ms);
        Lines {
            timestamp,
            day: i64::MIN,
            date: Vec::new(),
        }
    }

    /// Appends one record's line (with its newline) to `out`.
    pub(super) fn write(&mut self, out: &mut Vec<u8>, r: &Record) {
        out.extend_from_slice(b"{\"timestamp\":\"");
        out.extend_from_slice(&self.timestamp);
        out.extend_from_slice(b"\",\"level\":\"INFO\",\"fields\":{\"message\":\"audit\",\"id\":");
        string(out, &r.id);
        out.extend_from_slice(b",\"time\":\"");
        let day = r.at_ms.div_euclid(86_400_000);
        if day != self.day {
            self.date.clear();
            rfc3339_into(&mut self.date, day * 86_400_000);
            self.date.truncate(11);
            self.day = day;
        }
        // `YYYY-MM-DDT`: else a year past 9999, written the long way.
        if self.date.len() == 11 && self.date[10] == b'T' {
            out.extend_from_slice(&self.date);
            clock_into(out, r.at_ms.rem_euclid(86_400_000));
        } else {
            rfc3339_into(out, r.at_ms);
        }
        fields(out, r);
    }
}

/// The rest of a record's line after its time.
fn fields(out: &mut Vec<u8>, r: &Record) {
    out.extend_from_slice(b"\",\"kind\":");
    string(out, &r.kind);
    for (name, value) in [
        (&b",\"subject\":"[..], &r.subject),
        (b",\"session\":", &r.session),
        (b",\"client\":", &r.client),
        (b",\"plugin\":", &r.plugin),
        (b",\"credentials\":", &r.credentials),
        (b",\"target\":", &r.target),
    ] {
        if let Some(v) = value {
            out.extend_from_slice(name);
            string(out, v);
        }
    }
    out.extend_from_slice(b",\"outcome\":\"");
    out.extend_from_slice(r.outcome.as_str().as_bytes());
    out.push(b'"');
    if let Some(code) = r.error_code {
        out.extend_from_slice(b",\"error_code\":");
        integer(out, code);
    }
    out.extend_from_slice(b",\"duration_ms\":");
    millis(out, r.duration_us);
    for (name, value) in [
        (&b",\"arguments\":"[..], &r.arguments),
        (b",\"replica\":", &r.replica),
    ] {
        if let Some(v) = value {
            out.extend_from_slice(name);
            string(out, v);
        }
    }
    if let Some(count) = r.count {
        out.extend_from_slice(b",\"count\":");
        integer(out, count);
    }
    out.extend_from_slice(b"},\"target\":\"");
    out.extend_from_slice(TARGET.as_bytes());
    out.extend_from_slice(b"\"}\n");
}

/// `"name":"value"` as a line has it: what a stored line holding that value contains.
pub(super) fn needle(name: &str, value: &str) -> Vec<u8> {
    let mut out = Vec::with_capacity(name.len() + value.len() + 6);
    string(&mut out, name);
    out.push(b':');
    string(&mut out, value);
    out
}

/// A JSON string, escaped as serde_json escapes one.
fn string(out: &mut Vec<u8>, s: &str) {
    out.push(b'"');
    let bytes = s.as_bytes();
    // Most values need no escape: found so by a test of every byte with no early exit, which
    // the compiler does many bytes at a time.
    let plain = bytes.iter().fold(true, |plain, &b| {
        plain & (b >= 0x20) & (b != b'"') & (b != b'\\')
    });
    if plain {
        out.extend_from_slice(bytes);
        out.push(b'"');
        return;
    }
    let mut start = 0;
    for (i, &b) in bytes.iter().enumerate() {
        if b >= 0x20 && b != b'"' && b != b'\\' {
            continue;
        }
        out.extend_from_slice(&bytes[start..i]);
        start = i + 1;
        match b {
            b'"' => out.extend_from_slice(b"\\\""),
            b'\\' => out.extend_from_slice(b"\\\\"),
            b'\n' => out.extend_from_slice(b"\\n"),
            b'\r' => out.extend_from_slice(b"\\r"),
            b'\t' => out.extend_from_slice(b"\\t"),
            0x08 => out.extend_from_slice(b"\\b"),
            0x0c => out.extend_from_slice(b"\\f"),
            _ => {
                const HEX: &[u8; 16] = b"0123456789abcdef";
                out.extend_from_slice(b"\\u00");
                out.push(HEX[usize::from(b >> 4)]);
                out.push(HEX[usize::from(b & 15)]);
            }
        }
    }
    out.extend_from_slice(&bytes[start..]);
    out.push(b'"');
}

fn integer(out: &mut Vec<u8>, n: i64) {
    let mut digits = itoa::Buffer::new();
    out.extend_from_slice(digits.format(n).as_bytes());
}

/// Microseconds as milliseconds, the way serde_json writes the `f64` they make: the fewest
/// decimals that say it, and `.0` for a whole number.
fn millis(out: &mut Vec<u8>, us: i64) {
    if us < 0 {
        out.push(b'-');
    }
    let us = us.unsigned_abs();
    let mut digits = itoa::Buffer::new();
    out.extend_from_slice(digits.format(us / 1000).as_bytes());
    out.push(b'.');
    let mut frac = us % 1000;
    if frac == 0 {
        out.push(b'0');
        return;
    }
    let mut width = 3;
    while frac.is_multiple_of(10) {
        frac /= 10;
        width -= 1;
    }
    let text = digits.format(frac);
    out.extend(std::iter::repeat_n(b'0', width - text.len()));
    out.extend_from_slice(text.as_bytes());
}

/// Two digits.
fn two(out: &mut Vec<u8>, n: u32) {
    out.push(b'0' + (n / 10) as u8);
    out.push(b'0' + (n % 10) as u8);
}

/// `ms` since the epoch as `2026-11-29T04:15:10.123Z`, appended.
fn rfc3339_into(out: &mut Vec<u8>, ms: i64) {
    let days = ms.div_euclid(86_400_000);
    let (y, m, d) = super::time::civil(days);
    if !(0..=9999).contains(&y) {
        // Not a time this log will see; written the long way.
        out.extend_from_slice(super::time::rfc3339(ms).as_bytes());
        return;
    }
    let y = y as u32;
    two(out, y / 100);
    two(out, y % 100);
    out.push(b'-');
    two(out, m);
    out.push(b'-');
    two(out, d);
    out.push(b'T');
    clock_into(out, ms.rem_euclid(86_400_000));
}

/// `04:15:10.123Z`: `ms` into its day.
fn clock_into(out: &mut Vec<u8>, ms: i64) {
    let (secs, millis) = ((ms / 1000) as u32, (ms % 1000) as u32);
    two(out, secs / 3600);
    out.push(b':');
    two(out, secs % 3600 / 60);
    out.push(b':');
    two(out, secs % 60);
    out.push(b'.');
    out.push(b'0' + (millis / 100) as u8);
    two(out, millis % 100);
    out.push(b'Z');
}

/// A stored line, as read back.
#[derive(Deserialize)]
struct Stored {
    fields: Fields,
}

#[derive(Deserialize)]
struct Fields {
    id: String,
    time: String,
    kind: String,
    subject: Option<String>,
    session: Option<String>,
    client: Option<String>,
    plugin: Option<String>,
    credentials: Option<String>,
    target: Option<String>,
    outcome: String,
    error_code: Option<i64>,
    duration_ms: f64,
    arguments: Option<String>,
    replica: Option<String>,
    count: Option<i64>,
}

/// The record a stored line says; `None` for a line that is not one.
pub(super) fn read(line: &[u8]) -> Option<Record> {
    let Stored { fields: f } = serde_json::from_slice(line).ok()?;
    Some(Record {
        at_ms: super::time::parse_rfc3339(&f.time)?,
        id: f.id,
        kind: f.kind,
        subject: f.subject,
        session: f.session,
        client: f.client,
        plugin: f.plugin,
        credentials: f.credentials,
        target: f.target,
        outcome: Outcome::parse(&f.outcome)?,
        error_code: f.error_code,
        duration_us: (f.duration_ms * 1000.0).round() as i64,
        arguments: f.arguments,
        replica: f.replica,
        count: f.count,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record() -> Record {
        Record {
            id: "01a2".into(),
            at_ms: 1_795_925_710_123,
            kind: "tools/call".into(),
            subject: None,
            session: Some("91rijzP0".into()),
            client: Some("c \"1\"".into()),
            plugin: Some("main".into()),
            credentials: None,
            target: Some("echo".into()),
            outcome: Outcome::Error,
            error_code: Some(-32602),
            duration_us: 1070,
            arguments: None,
            replica: Some("r1".into()),
            count: None,
        }
    }

    #[test]
    fn a_line_has_the_json_log_shape_without_absent_values() {
        let mut out = Vec::new();
        Lines::at(1_795_925_710_200).write(&mut out, &record());
        assert_eq!(
            String::from_utf8(out).unwrap(),
            concat!(
                r#"{"timestamp":"2026-11-29T04:15:10.200Z","level":"INFO","fields":{"message":"audit","#,
                r#""id":"01a2","time":"2026-11-29T04:15:10.123Z","kind":"tools/call","session":"91rijzP0","#,
                r#""client":"c \"1\"","plugin":"main","target":"echo","outcome":"error","error_code":-32602,"#,
                r#""duration_ms":1.07,"replica":"r1"},"target":"mcp_gateway::audit"}"#,
                "\n"
            )
        );
    }

    /// Guards the hand-written line against serde_json: every string escaped alike, every
    /// duration written alike, every value read back.
    #[test]
    fn lines_say_what_serde_json_would_and_read_back() {
        let strange = "a\"b\\c\nd\re\tf\u{8}g\u{c}h\u{1}i\u{1f}j\u{7f}k é ✓ /";
        for us in [0, 1, 10, 100, 999, 1000, 1001, 1070, 1_500_000, 123_456_789] {
            let mut r = record();
            r.duration_us = us;
            r.subject = Some(strange.into());
            r.arguments = Some("{\"text\":\"x\"}".into());
            r.count = Some(3);
            let mut out = Vec::new();
            Lines::at(0).write(&mut out, &r);
            let line: serde_json::Value = serde_json::from_slice(&out).unwrap();
            let f = &line["fields"];
            assert_eq!(f["subject"], strange);
            assert_eq!(
                serde_json::to_string(&f["duration_ms"]).unwrap(),
                serde_json::to_string(&(us as f64 / 1000.0)).unwrap(),
                "{us} µs"
            );
            let mut escaped = Vec::new();
            string(&mut escaped, strange);
            assert_eq!(escaped, serde_json::to_vec(strange).unwrap());
            let back = read(&out).unwrap();
            assert_eq!(back.duration_us, us);
            assert_eq!(back.at_ms, r.at_ms);
            assert_eq!(back.subject.as_deref(), Some(strange));
            assert_eq!((back.count, back.error_code), (Some(3), Some(-32602)));
            assert_eq!(back.outcome, Outcome::Error);
            let found = memchr::memmem::find(&out, &needle("subject", strange));
            assert!(found.is_some());
        }
        // Records of several days in one batch, and times this log will not see.
        let mut lines = Lines::at(0);
        for at_ms in [
            0,
            86_399_999,
            86_400_000,
            1_795_925_710_123,
            1_795_925_710_124,
            -1,
            253_402_300_800_000,
        ] {
            let mut r = record();
            r.at_ms = at_ms;
            let mut out = Vec::new();
            lines.write(&mut out, &r);
            let line: serde_json::Value = serde_json::from_slice(&out).unwrap();
            assert_eq!(
                line["fields"]["time"],
                super::super::time::rfc3339(at_ms),
                "{at_ms}"
            );
        }
        assert!(read(b"{\"fields\":{}}").is_none());
        assert!(read(b"not json").is_none());
    }
}
