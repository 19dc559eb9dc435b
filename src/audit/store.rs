//! Where records are kept: the [`AuditStore`] seam (the database implements it, in
//! `database/audit.rs`), the [`Segment`] a batch is stored as, and the [`Filter`] records are
//! read back with ([`Gather`] finds them in segments).
//!
//! A batch's records are stored as one segment: their JSON lines (`line.rs`, the text the log
//! shows) in one row with the times they span, not a row each. A row per record cost the
//! database more than the call it recorded (the binding of fourteen values, two B-tree
//! inserts); a segment costs a copy of its text. Reading back scans the segments of the time
//! asked for, newest first, looking for a filter's values in each segment's text before
//! reading any record of it, and stops once no older segment can hold a record among the
//! newest `limit`.

use std::future::Future;
use std::pin::Pin;

use memchr::memmem::Finder;

use super::{Outcome, Record, line};

/// Bytes of lines in one segment, about (a line more at most): what a query holds of one
/// at a time, and what goes to stderr in one write.
const SEGMENT_BYTES: usize = 1 << 20;

/// Most records one query returns.
pub const MAX_LIMIT: usize = 1000;

/// A store's failure.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("database error: {0}")]
    Database(String),
}

pub type StoreFuture<'a, T> = Pin<Box<dyn Future<Output = Result<T, StoreError>> + Send + 'a>>;

/// Records stored together: their lines, and the earliest and latest time among them.
#[derive(Debug, Clone)]
pub struct Segment {
    /// The earliest `at_ms` among its records.
    pub first_ms: i64,
    /// The latest `at_ms` among its records: a query newest first reads segments in this
    /// order.
    pub last_ms: i64,
    /// How many records.
    pub records: i64,
    /// Their JSON lines, each ending in a newline.
    pub lines: String,
}

impl Segment {
    /// `batch`'s lines, written at `now_ms`, in segments of about [`SEGMENT_BYTES`] at most.
    pub fn of(batch: &[Record], now_ms: i64) -> Vec<Segment> {
        let mut segments = Vec::new();
        let mut lines = Vec::new();
        let mut open: Option<Segment> = None;
        let mut writer = line::Lines::at(now_ms);
        for r in batch {
            writer.write(&mut lines, r);
            let s = open.get_or_insert(Segment {
                first_ms: r.at_ms,
                last_ms: r.at_ms,
                records: 0,
                lines: String::new(),
            });
            s.first_ms = s.first_ms.min(r.at_ms);
            s.last_ms = s.last_ms.max(r.at_ms);
            s.records += 1;
            if lines.len() >= SEGMENT_BYTES {
                segments.extend(Segment::close(open.take(), &mut lines));
            }
        }
        segments.extend(Segment::close(open, &mut lines));
        segments
    }

    /// The segment with its lines, taken from `lines`.
    fn close(open: Option<Segment>, lines: &mut Vec<u8>) -> Option<Segment> {
        let mut s = open?;
        s.lines = String::from_utf8(std::mem::take(lines)).expect("lines are made of strings");
        Some(s)
    }
}

/// The audit log's storage.
pub trait AuditStore: Send + Sync {
    /// Stores a batch's segments in one transaction.
    fn insert<'a>(&'a self, segments: &'a [Segment]) -> StoreFuture<'a, ()>;
    /// Records matching `filter`, newest first.
    fn query<'a>(&'a self, filter: &'a Filter) -> StoreFuture<'a, Vec<Record>>;
    /// Deletes records from before `before_ms` (a segment once all of its are); how many.
    fn prune(&self, before_ms: i64) -> StoreFuture<'_, u64>;
}

/// Which records to read back. Every set field must match exactly; times are milliseconds
/// since the epoch, `since` inclusive, `until` exclusive.
#[derive(Debug, Clone, Default)]
pub struct Filter {
    pub subject: Option<String>,
    pub plugin: Option<String>,
    /// The tool, prompt, resource URI or admin action.
    pub target: Option<String>,
    pub kind: Option<String>,
    pub outcome: Option<Outcome>,
    pub since_ms: Option<i64>,
    pub until_ms: Option<i64>,
    /// At most this many (capped at [`MAX_LIMIT`]).
    pub limit: usize,
}

impl Filter {
    /// Whether `r` is one of the records it asks for (the limit aside).
    pub fn matches(&self, r: &Record) -> bool {
        let text = |want: &Option<String>, have: &Option<String>| {
            want.as_ref().is_none_or(|w| have.as_ref() == Some(w))
        };
        text(&self.subject, &r.subject)
            && text(&self.plugin, &r.plugin)
            && text(&self.target, &r.target)
            && self.kind.as_ref().is_none_or(|k| *k == r.kind)
            && self.outcome.is_none_or(|o| o == r.outcome)
            && self.since_ms.is_none_or(|t| r.at_ms >= t)
            && self.until_ms.is_none_or(|t| r.at_ms < t)
    }

    /// The filter a query string asks for: `subject`, `plugin`, `tool` (or `target`), `kind`,
    /// `outcome`, `since` and `until` (milliseconds since the epoch), `limit`. Empty values
    /// are ignored; anything else wrong is said.
    pub fn from_query(query: &str) -> Result<Filter, String> {
        let mut f = Filter {
            limit: 100,
            ..Filter::default()
        };
        for (k, v) in url::form_urlencoded::parse(query.as_bytes()) {
            let v = v.into_owned();
            let ms = |v: &str| {
                v.parse::<i64>()
                    .map_err(|_| format!("`{k}` must be milliseconds since the epoch"))
            };
            match &*k {
                _ if v.is_empty() => {}
                "subject" => f.subject = Some(v),
                "plugin" => f.plugin = Some(v),
                "tool" | "target" => f.target = Some(v),
                "kind" => f.kind = Some(v),
                "outcome" => {
                    f.outcome =
                        Some(Outcome::parse(&v).ok_or_else(|| format!("unknown outcome `{v}`"))?)
                }
                "since" => f.since_ms = Some(ms(&v)?),
                "until" => f.until_ms = Some(ms(&v)?),
                "limit" => {
                    f.limit = v
                        .parse::<usize>()
                        .ok()
                        .filter(|n| (1..=MAX_LIMIT).contains(n))
                        .ok_or_else(|| format!("`limit` must be between 1 and {MAX_LIMIT}"))?
                }
                other => return Err(format!("unknown filter `{other}`")),
            }
        }
        Ok(f)
    }
}

/// The records a [`Filter`] asks for, gathered from segments read in the order of their
/// `last_ms`, newest first (and from any single records, in any order): the newest `limit`,
/// newest first.
pub struct Gather<'f> {
    filter: &'f Filter,
    /// A filter's values as a matching line holds them: a segment or line without one of them
    /// holds no record asked for, and is not read.
    needles: Vec<Finder<'static>>,
    found: Vec<Record>,
    limit: usize,
}

impl<'f> Gather<'f> {
    pub fn new(filter: &'f Filter) -> Gather<'f> {
        let outcome = filter.outcome.map(|o| o.as_str().to_owned());
        let needles = [
            ("subject", &filter.subject),
            ("plugin", &filter.plugin),
            ("target", &filter.target),
            ("kind", &filter.kind),
            ("outcome", &outcome),
        ]
        .into_iter()
        .filter_map(|(name, value)| {
            value
                .as_ref()
                .map(|v| Finder::new(&line::needle(name, v)).into_owned())
        })
        .collect();
        Gather {
            filter,
            needles,
            found: Vec::new(),
            limit: filter.limit.clamp(1, MAX_LIMIT),
        }
    }

    /// Whether a segment whose records are all from `last_ms` or before can hold one of the
    /// newest `limit`: once `limit` are found, all newer than that, no older segment can.
    pub fn wants(&mut self, last_ms: i64) -> bool {
        self.trim();
        self.found.len() < self.limit || self.found[self.limit - 1].at_ms <= last_ms
    }

    /// Reads a segment's lines.
    pub fn segment(&mut self, lines: &str) {
        let text = lines.as_bytes();
        if !self.needles.iter().all(|n| n.find(text).is_some()) {
            return;
        }
        for line in text.split(|b| *b == b'\n').filter(|l| !l.is_empty()) {
            if !self.needles.iter().all(|n| n.find(line).is_some()) {
                continue;
            }
            if let Some(r) = line::read(line) {
                self.record(r);
            }
        }
    }

    /// A record read otherwise (a row of its own).
    pub fn record(&mut self, r: Record) {
        if self.filter.matches(&r) {
            self.found.push(r);
            if self.found.len() >= 2 * self.limit {
                self.trim();
            }
        }
    }

    /// Newest first, at most `limit`.
    fn trim(&mut self) {
        self.found
            .sort_unstable_by(|a, b| (b.at_ms, &b.id).cmp(&(a.at_ms, &a.id)));
        self.found.truncate(self.limit);
    }

    pub fn finish(mut self) -> Vec<Record> {
        self.trim();
        self.found
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn filters_are_read_and_checked() {
        let f = Filter::from_query("subject=alice&tool=echo&outcome=ok&since=5&limit=7").unwrap();
        assert_eq!(f.subject.as_deref(), Some("alice"));
        assert_eq!(f.target.as_deref(), Some("echo"));
        assert_eq!(f.outcome, Some(Outcome::Ok));
        assert_eq!((f.since_ms, f.limit), (Some(5), 7));
        assert_eq!(Filter::from_query("").unwrap().limit, 100);
        for bad in [
            "outcome=fine",
            "since=yesterday",
            "limit=0",
            "limit=5000",
            "nope=1",
        ] {
            assert!(Filter::from_query(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn a_batch_is_cut_into_segments_that_say_their_times() {
        let batch: Vec<Record> = (0..20_000i64)
            .map(|n| Record {
                id: format!("{n:028}"),
                // Requests arrive in one order and end in another.
                at_ms: 1_000_000 + (n * 7919) % 20_000,
                kind: "tools/call".into(),
                subject: Some("alice".into()),
                session: None,
                client: None,
                plugin: Some("p".into()),
                credentials: None,
                target: Some("echo".into()),
                outcome: Outcome::Ok,
                error_code: None,
                duration_us: 5,
                arguments: None,
                replica: None,
                count: None,
            })
            .collect();
        let segments = Segment::of(&batch, 2_000_000);
        assert!(segments.len() > 1);
        assert_eq!(segments.iter().map(|s| s.records).sum::<i64>(), 20_000);
        let mut seen = 0;
        for s in &segments {
            assert!(s.lines.len() < SEGMENT_BYTES + 1024);
            let lines: Vec<&str> = s.lines.lines().collect();
            assert_eq!(lines.len() as i64, s.records);
            let times: Vec<i64> = batch[seen..seen + lines.len()]
                .iter()
                .map(|r| r.at_ms)
                .collect();
            assert_eq!(s.first_ms, *times.iter().min().unwrap());
            assert_eq!(s.last_ms, *times.iter().max().unwrap());
            seen += lines.len();
        }
        assert!(Segment::of(&[], 0).is_empty());
    }
}
