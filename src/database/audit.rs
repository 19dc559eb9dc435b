//! The audit log in the gateway's database: [`SqlAuditStore`], the SQL implementation of
//! [`AuditStore`] (the `audit_records` table of `migrations/0007_audit.sql`). Rows in, rows
//! out: what a record says is the audit module's to decide.

use sqlx::{AnyPool, Row};

use crate::audit::{AuditStore, Filter, Outcome, Record, StoreError, StoreFuture};

/// The SQL store (SQLite or PostgreSQL), on the gateway's database pool.
pub struct SqlAuditStore {
    pool: AnyPool,
    /// SQLite: an insert's placeholders are `?`. SQLite finds a numbered placeholder's name
    /// by a scan of all of them, so binding a statement of `$N`s costs the square of its
    /// values; PostgreSQL knows only `$N`.
    sqlite: bool,
}

impl SqlAuditStore {
    pub fn new(pool: AnyPool, sqlite: bool) -> SqlAuditStore {
        SqlAuditStore { pool, sqlite }
    }
}

fn failed(e: sqlx::Error) -> StoreError {
    StoreError::Database(e.to_string())
}

const COLUMNS: &str = "id, at_ms, kind, subject, session, client, plugin, target, outcome, \
                       error_code, duration_us, arguments, replica, count";
/// Values of one row.
const VALUES: usize = 14;

/// Rows one `INSERT` carries, at most (14 values each: far below SQLite's and PostgreSQL's
/// limits on bound values).
const ROWS_PER_INSERT: usize = 64;

/// `INSERT` of `rows` rows, with placeholders only (`?`, or numbered).
fn insert_sql(rows: usize, anonymous: bool) -> String {
    let mut sql = format!("INSERT INTO audit_records ({COLUMNS}) VALUES ");
    for row in 0..rows {
        if row > 0 {
            sql.push_str(", ");
        }
        sql.push('(');
        for column in 0..VALUES {
            if column > 0 {
                sql.push_str(", ");
            }
            if anonymous {
                sql.push('?');
            } else {
                sql.push_str(&format!("${}", row * VALUES + column + 1));
            }
        }
        sql.push(')');
    }
    sql
}

impl AuditStore for SqlAuditStore {
    fn insert<'a>(&'a self, records: &'a [Record]) -> StoreFuture<'a, ()> {
        Box::pin(async move {
            let mut tx = self.pool.begin().await.map_err(failed)?;
            // Many rows per statement: one statement per row costs more than the rows.
            for chunk in records.chunks(ROWS_PER_INSERT) {
                let sql = insert_sql(chunk.len(), self.sqlite);
                let mut query = sqlx::query(sqlx::AssertSqlSafe(sql));
                for r in chunk {
                    query = query
                        .bind(r.id.clone())
                        .bind(r.at_ms)
                        .bind(r.kind.clone())
                        .bind(r.subject.clone())
                        .bind(r.session.clone())
                        .bind(r.client.clone())
                        .bind(r.plugin.clone())
                        .bind(r.target.clone())
                        .bind(r.outcome.as_str())
                        .bind(r.error_code)
                        .bind(r.duration_us)
                        .bind(r.arguments.clone())
                        .bind(r.replica.clone())
                        .bind(r.count);
                }
                query.execute(&mut *tx).await.map_err(failed)?;
            }
            tx.commit().await.map_err(failed)
        })
    }

    fn query<'a>(&'a self, filter: &'a Filter) -> StoreFuture<'a, Vec<Record>> {
        Box::pin(async move {
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
        })
    }

    fn prune(&self, before_ms: i64) -> StoreFuture<'_, u64> {
        Box::pin(async move {
            let done = sqlx::query("DELETE FROM audit_records WHERE at_ms < $1")
                .bind(before_ms)
                .execute(&self.pool)
                .await
                .map_err(failed)?;
            Ok(done.rows_affected())
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
        store.insert(&batch).await.unwrap();
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
        assert_eq!(store.prune(1_005).await.unwrap(), 5);
        assert_eq!(q(Filter::default()).await.len(), 5);
    }

    #[tokio::test]
    async fn batches_larger_than_one_statement_are_stored_whole() {
        let db = Database::connect("sqlite::memory:").await.unwrap();
        let store = db.audit_store();
        let batch: Vec<Record> = (0..150).map(|n| record(n, "a", Outcome::Ok)).collect();
        store.insert(&batch).await.unwrap();
        let all = store
            .query(&Filter {
                limit: 1000,
                ..Filter::default()
            })
            .await
            .unwrap();
        assert_eq!(all.len(), 150);
        assert_eq!(all[0].id, "r149");
        assert_eq!(all[149].client.as_deref(), Some("c 1"));
    }
}
