//! The audit log's writer: one task takes the queued records, writes each as a JSON line
//! (serialized here, in the shape of the JSON log's lines, when the log wants
//! [`TARGET`](super::TARGET) at `info`; a batch's lines go to stderr in a few writes) and
//! stores them in batches, one transaction per moment; another deletes records past the
//! retention hourly. What the writer itself has to say (a failed store) goes under a target
//! of its own, never among the records.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use serde::Serialize;
use tokio::sync::{Notify, mpsc};
use tokio_util::sync::CancellationToken;

use super::{AuditStore, Queued, Record, Room, TARGET, rfc3339, time};

/// The target of what the writer itself has to say (a failed store): ordinary log lines,
/// never among the records.
const WRITER: &str = "mcp_gateway::audit::writer";

/// Bytes of lines held at most before they are written: a batch's lines go to stderr in a
/// few writes, not one each.
const MAX_LINE_BYTES: usize = 1 << 20;

/// Records stored in one transaction, at most.
const BATCH: usize = 4096;
/// How long the writer gathers records after the first before storing them: a transaction
/// per moment rather than per record, which at thousands of calls a second cost more than
/// the calls. A flush does not wait for it.
const GATHER: Duration = Duration::from_millis(200);
/// How long a batch may take to store before the writer gives up on it.
pub(super) const STORE_TIMEOUT: Duration = Duration::from_secs(10);
/// How often records past the retention are deleted.
const PRUNE_EVERY: Duration = Duration::from_secs(3600);
/// The writer's side.
pub(super) struct Writer {
    pub(super) store: Arc<dyn AuditStore>,
    /// Woken by [`Auditor::flush`]; the writer answers on `flushed`.
    pub(super) flush: Notify,
    pub(super) flushed: Notify,
    /// Records done with: stored, failed to store, or dropped at a full queue.
    pub(super) handled: AtomicU64,
    /// The queue's room, given back as records are done with (`room.rs`).
    pub(super) room: Room,
}

/// The writer: a JSON line per record, then the batch into the store. Ends when the queue's
/// sender is gone and the queue is empty.
pub(super) async fn write(w: Arc<Writer>, mut rx: mpsc::Receiver<Queued>) {
    let mut queued = Vec::with_capacity(BATCH);
    let mut batch = Vec::with_capacity(BATCH);
    let mut held = Vec::with_capacity(BATCH);
    loop {
        let flushing = tokio::select! {
            n = rx.recv_many(&mut queued, BATCH) => {
                if n == 0 {
                    return;
                }
                false
            }
            () = w.flush.notified() => true,
        };
        if !flushing {
            let _ = tokio::time::timeout(GATHER, w.flush.notified()).await;
        }
        // Store what came; at once again only while batches come full (what comes while a
        // batch is being stored waits for the next moment).
        loop {
            while queued.len() < BATCH {
                match rx.try_recv() {
                    Ok(q) => queued.push(q),
                    Err(_) => break,
                }
            }
            if queued.is_empty() {
                break;
            }
            let full = queued.len() == BATCH;
            for q in queued.drain(..) {
                batch.push(q.record);
                held.push(q.held);
            }
            store(&*w.store, &batch).await;
            for h in held.drain(..) {
                w.room.give_back(h);
            }
            w.handled.fetch_add(batch.len() as u64, Ordering::Release);
            batch.clear();
            if !full {
                break;
            }
        }
        w.flushed.notify_waiters();
    }
}

/// Writes `batch`'s log lines and stores it; a failure is counted and logged, not retried.
async fn store(store: &dyn AuditStore, batch: &[Record]) {
    log(batch);
    let why = match tokio::time::timeout(STORE_TIMEOUT, store.insert(batch)).await {
        Ok(Ok(())) => return,
        Ok(Err(e)) => e.to_string(),
        Err(_) => format!(
            "the database did not answer within {} s",
            STORE_TIMEOUT.as_secs()
        ),
    };
    crate::metrics::get()
        .audit_dropped
        .inc_by(batch.len() as u64);
    tracing::warn!(target: WRITER, "audit: {} records not stored: {why}", batch.len());
}

/// A record's log line, in the shape of the JSON log's lines (`timestamp`, `level`, `fields`
/// with `message` first, `target`), a value that is absent left out as there. Serialized
/// straight into a buffer: through `tracing`'s JSON formatter every value went through a
/// `fmt::Write` adapter, and a line cost about a fifth of an audited call's CPU.
#[derive(Serialize)]
struct Line<'a> {
    timestamp: &'a str,
    level: &'static str,
    fields: Fields<'a>,
    target: &'static str,
}

#[derive(Serialize)]
struct Fields<'a> {
    message: &'static str,
    id: &'a str,
    time: String,
    kind: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    subject: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    session: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    client: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    plugin: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    target: Option<&'a str>,
    outcome: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    error_code: Option<i64>,
    duration_ms: f64,
    #[serde(skip_serializing_if = "Option::is_none")]
    arguments: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    replica: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    count: Option<i64>,
}

/// Writes `batch` as log lines on stderr, if the log wants [`TARGET`] at `info` (on unless
/// `RUST_LOG` turns it off; see `logs.rs`).
fn log(batch: &[Record]) {
    use std::io::Write as _;
    if batch.is_empty() || !tracing::enabled!(target: TARGET, tracing::Level::INFO) {
        return;
    }
    let timestamp = rfc3339(time::now_ms());
    let mut lines = Vec::with_capacity(MAX_LINE_BYTES.min(batch.len() * 512));
    for r in batch {
        line(&mut lines, r, &timestamp);
        if lines.len() >= MAX_LINE_BYTES {
            let _ = std::io::stderr().write_all(&lines);
            lines.clear();
        }
    }
    let _ = std::io::stderr().write_all(&lines);
}

/// Appends one record's line to `out`.
fn line(out: &mut Vec<u8>, r: &Record, timestamp: &str) {
    let line = Line {
        timestamp,
        level: "INFO",
        fields: Fields {
            message: "audit",
            id: &r.id,
            time: rfc3339(r.at_ms),
            kind: &r.kind,
            subject: r.subject.as_deref(),
            session: r.session.as_deref(),
            client: r.client.as_deref(),
            plugin: r.plugin.as_deref(),
            target: r.target.as_deref(),
            outcome: r.outcome.as_str(),
            error_code: r.error_code,
            duration_ms: r.duration_us as f64 / 1000.0,
            arguments: r.arguments.as_deref(),
            replica: r.replica.as_deref(),
            count: r.count,
        },
        target: TARGET,
    };
    serde_json::to_writer(&mut *out, &line).expect("a record serializes");
    out.push(b'\n');
}

/// Deletes records past the retention, hourly (and once at start).
pub(super) async fn prune(
    store: Arc<dyn AuditStore>,
    retention: Duration,
    shutdown: CancellationToken,
) {
    loop {
        let before = time::now_ms() - retention.as_millis() as i64;
        match tokio::time::timeout(STORE_TIMEOUT, store.prune(before)).await {
            Ok(Ok(0)) => {}
            Ok(Ok(n)) => {
                tracing::info!(target: WRITER, "audit: {n} records past the retention deleted")
            }
            Ok(Err(e)) => {
                tracing::warn!(target: WRITER, "audit: records past the retention not deleted: {e}")
            }
            Err(_) => tracing::warn!(target: WRITER, "audit: deleting old records took too long"),
        }
        tokio::select! {
            () = tokio::time::sleep(PRUNE_EVERY) => {}
            () = shutdown.cancelled() => return,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::audit::Outcome;

    #[test]
    fn a_line_has_the_json_log_shape_without_absent_values() {
        let record = Record {
            id: "01a2".into(),
            at_ms: 1_795_925_710_123,
            kind: "tools/call".into(),
            subject: None,
            session: Some("91rijzP0".into()),
            client: Some("c \"1\"".into()),
            plugin: Some("main".into()),
            target: Some("echo".into()),
            outcome: Outcome::Error,
            error_code: Some(-32602),
            duration_us: 1070,
            arguments: None,
            replica: Some("r1".into()),
            count: None,
        };
        let mut out = Vec::new();
        line(&mut out, &record, "2026-11-29T04:15:10.200Z");
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
}
