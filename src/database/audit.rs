//! The audit log in the gateway's database: [`SqlAuditStore`], the SQL implementation of
//! [`AuditStore`]: segments in the `audit_segments` table (`migrations/0009_audit_segments.sql`),
//! and the rows of `audit_records` (`0007_audit.sql`) that records were before, read and
//! pruned beside them until the retention has deleted the last. Rows in, rows out: what a
//! record says, and which a query finds in a segment, is the audit module's to decide.

use futures_util::TryStreamExt;
use sqlx::{AnyPool, Row};

use crate::audit::{AuditStore, Filter, Gather, Outcome, Record, Segment, StoreError, StoreFuture};

/// The SQL store (SQLite or PostgreSQL), on the gateway's database pool.
pub struct SqlAuditStore {
    pool: AnyPool,
}

impl SqlAuditStore {
    pub fn new(pool: AnyPool) -> SqlAuditStore {
        SqlAuditStore { pool }
    }

    /// Records of `audit_records` (from before segments) matching `filter`, newest first.
    async fn rows(&self, filter: &Filter) -> Result<Vec<Record>, StoreError> {
        let mut sql = format!("SELECT {COLUMNS} FROM audit_records WHERE 1 = 1");
        let mut texts: Vec<String> = Vec::new();
        let mut n = 0;
        let mut text = |sql: &mut String, column: &str, value: &str| {
            n += 1;
            sql.push_str(&format!(" AND {column} = ${n}"));
            texts.push(value.to_owned());
        };
        for (column, value) in [
            ("subject", filter.subject.as_deref()),
            ("plugin", filter.plugin.as_deref()),
            ("target", filter.target.as_deref()),
            ("kind", filter.kind.as_deref()),
            ("outcome", filter.outcome.map(Outcome::as_str)),
        ] {
            if let Some(v) = value {
                text(&mut sql, column, v);
            }
        }
        let mut times = Vec::new();
        for (op, value) in [(">=", filter.since_ms), ("<", filter.until_ms)] {
            if let Some(v) = value {
                times.push(v);
                sql.push_str(&format!(" AND at_ms {op} ${}", texts.len() + times.len()));
            }
        }
        let limit = filter.limit.clamp(1, crate::audit::MAX_LIMIT) as i64;
        sql.push_str(&format!(
            " ORDER BY at_ms DESC, id DESC LIMIT ${}",
            texts.len() + times.len() + 1
        ));
        // Made of the constant fragments above and numbered placeholders only: every value
        // is bound.
        let mut query = sqlx::query(sqlx::AssertSqlSafe(sql));
        for t in texts {
            query = query.bind(t);
        }
        for t in times {
            query = query.bind(t);
        }
        let rows = query
            .bind(limit)
            .fetch_all(&self.pool)
            .await
            .map_err(failed)?;
        rows.iter()
            .map(record)
            .collect::<Result<_, _>>()
            .map_err(failed)
    }
}

fn failed(e: sqlx::Error) -> StoreError {
    StoreError::Database(e.to_string())
}

const COLUMNS: &str = "id, at_ms, kind, subject, session, client, plugin, target, outcome, \
                       error_code, duration_us, arguments, replica, count";
impl AuditStore for SqlAuditStore {
    fn insert<'a>(&'a self, segments: &'a [Segment]) -> StoreFuture<'a, ()> {
        Box::pin(async move {
            let mut tx = self.pool.begin().await.map_err(failed)?;
            for s in segments {
                sqlx::query(
                    "INSERT INTO audit_segments (first_ms, last_ms, records, lines) \
                     VALUES ($1, $2, $3, $4)",
                )
                .bind(s.first_ms)
                .bind(s.last_ms)
                .bind(s.records)
                .bind(s.lines.as_str())
                .execute(&mut *tx)
                .await
                .map_err(failed)?;
            }
            tx.commit().await.map_err(failed)
        })
    }

    fn query<'a>(&'a self, filter: &'a Filter) -> StoreFuture<'a, Vec<Record>> {
        Box::pin(async move {
            let mut gather = Gather::new(filter);
            for r in self.rows(filter).await? {
                gather.record(r);
            }
            let mut segments = sqlx::query(
                "SELECT last_ms, lines FROM audit_segments WHERE last_ms >= $1 AND first_ms < $2 \
                 ORDER BY last_ms DESC",
            )
            .bind(filter.since_ms.unwrap_or(i64::MIN))
            .bind(filter.until_ms.unwrap_or(i64::MAX))
            .fetch(&self.pool);
            while let Some(row) = segments.try_next().await.map_err(failed)? {
                let last_ms: i64 = row.try_get(0).map_err(failed)?;
                if !gather.wants(last_ms) {
                    break;
                }
                let lines: String = row.try_get(1).map_err(failed)?;
                gather.segment(&lines);
            }
            Ok(gather.finish())
        })
    }

    fn prune(&self, before_ms: i64) -> StoreFuture<'_, u64> {
        Box::pin(async move {
            let rows = sqlx::query("DELETE FROM audit_records WHERE at_ms < $1")
                .bind(before_ms)
                .execute(&self.pool)
                .await
                .map_err(failed)?;
            let segments =
                sqlx::query("DELETE FROM audit_segments WHERE last_ms < $1 RETURNING records")
                    .bind(before_ms)
                    .fetch_all(&self.pool)
                    .await
                    .map_err(failed)?;
            let mut records = rows.rows_affected();
            for s in segments {
                let n: i64 = s.try_get(0).map_err(failed)?;
                records += n.max(0) as u64;
            }
            Ok(records)
        })
    }
}

fn record(row: &sqlx::any::AnyRow) -> Result<Record, sqlx::Error> {
    let outcome: String = row.try_get("outcome")?;
    Ok(Record {
        id: row.try_get("id")?,
        at_ms: row.try_get("at_ms")?,
        kind: row.try_get("kind")?,
        subject: row.try_get("subject")?,
        session: row.try_get("session")?,
        client: row.try_get("client")?,
        plugin: row.try_get("plugin")?,
        credentials: None,
        target: row.try_get("target")?,
        outcome: Outcome::parse(&outcome).unwrap_or(Outcome::NoAnswer),
        error_code: row.try_get("error_code")?,
        duration_us: row.try_get("duration_us")?,
        arguments: row.try_get("arguments")?,
        replica: row.try_get("replica")?,
        count: row.try_get("count")?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::database::Database;

    fn record(n: i64, subject: &str, outcome: Outcome) -> Record {
        Record {
            id: format!("r{n}"),
            at_ms: 1_000 + n,
            kind: "tools/call".into(),
            subject: Some(subject.into()),
            session: None,
            client: Some("c 1".into()),
            plugin: Some("p".into()),
            credentials: None,
            target: Some(format!("tool{}", n % 2)),
            outcome,
            error_code: None,
            duration_us: 5,
            arguments: None,
            replica: None,
            count: None,
        }
    }

    #[tokio::test]
    async fn records_are_filtered_newest_first_and_pruned() {
        let db = Database::connect("sqlite::memory:").await.unwrap();
        let store = db.audit_store();
        let batch: Vec<Record> = (0..10)
            .map(|n| {
                let who = if n < 6 { "alice" } else { "bob" };
                let o = if n == 3 { Outcome::Error } else { Outcome::Ok };
                record(n, who, o)
            })
            .collect();
        store.insert(&Segment::of(&batch, 0)).await.unwrap();
        let ids = |rs: Vec<Record>| rs.into_iter().map(|r| r.id).collect::<Vec<_>>();
        let q = |f: Filter| {
            let store = store.clone();
            async move { ids(store.query(&Filter { limit: 100, ..f }).await.unwrap()) }
        };
        assert_eq!(q(Filter::default()).await.len(), 10);
        assert_eq!(q(Filter::default()).await[0], "r9");
        let bob = q(Filter {
            subject: Some("bob".into()),
            ..Filter::default()
        })
        .await;
        assert_eq!(bob, ["r9", "r8", "r7", "r6"]);
        let failed = q(Filter {
            outcome: Some(Outcome::Error),
            ..Filter::default()
        })
        .await;
        assert_eq!(failed, ["r3"]);
        let window = q(Filter {
            subject: Some("alice".into()),
            target: Some("tool1".into()),
            since_ms: Some(1_002),
            until_ms: Some(1_005),
            ..Filter::default()
        })
        .await;
        assert_eq!(window, ["r3"]);
        let two = store
            .query(&Filter {
                limit: 2,
                ..Filter::default()
            })
            .await
            .unwrap();
        assert_eq!(two.len(), 2);
        // The batch is one segment: it goes once all of its records are past the retention.
        assert_eq!(store.prune(1_005).await.unwrap(), 0);
        assert_eq!(q(Filter::default()).await.len(), 10);
        assert_eq!(store.prune(1_010).await.unwrap(), 10);
        assert_eq!(q(Filter::default()).await.len(), 0);
    }

    /// Segments whose times overlap (records arrive in one order and end in another), and
    /// rows from before segments: every query gives what a sort of all of them would.
    #[tokio::test]
    async fn queries_over_segments_and_old_rows_find_the_newest_that_match() {
        let db = Database::connect("sqlite::memory:").await.unwrap();
        let store = db.audit_store();
        let subjects = ["alice", "bob", "c\"a\\r\nol"];
        let outcomes = [Outcome::Ok, Outcome::Error, Outcome::Refused];
        let make = |n: i64| {
            let mut r = record(
                n,
                subjects[(n % 3) as usize],
                outcomes[(n / 3 % 3) as usize],
            );
            // Out of order, with ties, each batch's times overlapping the next's.
            r.at_ms = 10_000 + n + (n * 37) % 30;
            r
        };
        let all: Vec<Record> = (0..600).map(make).collect();
        for batch in all[..540].chunks(90) {
            store.insert(&Segment::of(batch, 0)).await.unwrap();
        }
        // The last 60 as rows of the table records were kept in before.
        for r in &all[540..] {
            sqlx::query(
                "INSERT INTO audit_records (id, at_ms, kind, subject, client, plugin, target, \
                 outcome, duration_us) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)",
            )
            .bind(r.id.clone())
            .bind(r.at_ms)
            .bind(r.kind.clone())
            .bind(r.subject.clone())
            .bind(r.client.clone())
            .bind(r.plugin.clone())
            .bind(r.target.clone())
            .bind(r.outcome.as_str())
            .bind(r.duration_us)
            .execute(&db.pool)
            .await
            .unwrap();
        }
        let filters = [
            Filter::default(),
            Filter {
                subject: Some(subjects[2].into()),
                ..Filter::default()
            },
            Filter {
                subject: Some("bob".into()),
                outcome: Some(Outcome::Refused),
                target: Some("tool1".into()),
                ..Filter::default()
            },
            Filter {
                since_ms: Some(10_100),
                until_ms: Some(10_150),
                kind: Some("tools/call".into()),
                ..Filter::default()
            },
            Filter {
                plugin: Some("nobody".into()),
                ..Filter::default()
            },
        ];
        for filter in filters {
            for limit in [1, 7, 100, 1000] {
                let filter = Filter {
                    limit,
                    ..filter.clone()
                };
                let mut want: Vec<&Record> = all.iter().filter(|r| filter.matches(r)).collect();
                want.sort_by(|a, b| (b.at_ms, &b.id).cmp(&(a.at_ms, &a.id)));
                want.truncate(limit);
                let got = store.query(&filter).await.unwrap();
                let ids = |rs: &[&Record]| rs.iter().map(|r| r.id.clone()).collect::<Vec<_>>();
                assert_eq!(
                    ids(&got.iter().collect::<Vec<_>>()),
                    ids(&want),
                    "{filter:?}"
                );
            }
        }
        // A segment goes once all its records are past the retention; the old rows by their own.
        let pruned = store.prune(10_200).await.unwrap();
        let left = store
            .query(&Filter {
                limit: 1000,
                ..Filter::default()
            })
            .await
            .unwrap();
        assert_eq!(pruned as usize + left.len(), 600);
        let old = |r: &Record| r.id[1..].parse::<i64>().unwrap() >= 540;
        assert!(left.iter().all(|r| r.at_ms >= 10_200 || !old(r)));
        let recent = |rs: &[Record]| rs.iter().filter(|r| r.at_ms >= 10_200).count();
        assert_eq!(recent(&left), recent(&all));
        assert!(pruned >= 90, "{pruned}");
    }
}
