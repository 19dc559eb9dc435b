//! Where records are kept: the [`AuditStore`] seam (the database implements it, in
//! `database/audit.rs`), and the [`Filter`] records are read back with.

use std::future::Future;
use std::pin::Pin;

use super::{Outcome, Record};

/// Most records one query returns.
pub const MAX_LIMIT: usize = 1000;

/// A store's failure.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("database error: {0}")]
    Database(String),
}

pub type StoreFuture<'a, T> = Pin<Box<dyn Future<Output = Result<T, StoreError>> + Send + 'a>>;

/// The audit log's storage.
pub trait AuditStore: Send + Sync {
    /// Stores a batch in one transaction.
    fn insert<'a>(&'a self, records: &'a [Record]) -> StoreFuture<'a, ()>;
    /// Records matching `filter`, newest first.
    fn query<'a>(&'a self, filter: &'a Filter) -> StoreFuture<'a, Vec<Record>>;
    /// Deletes records from before `before_ms`; how many.
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
}
