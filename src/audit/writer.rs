//! The audit log's writer: one task takes the queued records, writes each as a JSON line
//! (the log's layer for [`TARGET`](super::TARGET) writes into [`Lines`], and a batch's lines
//! go to stderr in one write) and stores them in batches, one transaction per moment; another
//! deletes records past the retention hourly. What the writer itself has to say (a failed
//! store) goes under a target of its own, never among the records.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use tokio::sync::{Notify, mpsc};
use tokio_util::sync::CancellationToken;

use super::{AuditStore, Record, TARGET, rfc3339, time};

/// The target of what the writer itself has to say (a failed store): ordinary log lines,
/// never among the records.
const WRITER: &str = "mcp_gateway::audit::writer";

/// Log lines of records formatted but not yet written: the writer writes a batch's lines to
/// stderr at once, rather than one write each.
static LINES: std::sync::Mutex<Vec<u8>> = std::sync::Mutex::new(Vec::new());
/// Bytes of lines held at most: beyond, they are written at once.
const MAX_LINE_BYTES: usize = 1 << 20;

/// Where the log's layer for [`TARGET`] writes (see `logs.rs`): into the batch's buffer.
pub struct Lines;

/// One line's writer (see [`Lines`]).
pub struct LineWriter;

impl std::io::Write for LineWriter {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        let mut lines = LINES.lock().expect("audit lines lock");
        lines.extend_from_slice(bytes);
        if lines.len() > MAX_LINE_BYTES {
            let full = std::mem::take(&mut *lines);
            drop(lines);
            std::io::stderr().write_all(&full)?;
        }
        Ok(bytes.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl<'a> tracing_subscriber::fmt::MakeWriter<'a> for Lines {
    type Writer = LineWriter;

    fn make_writer(&'a self) -> LineWriter {
        LineWriter
    }
}

/// Writes the lines held.
fn write_lines() {
    use std::io::Write as _;
    let lines = std::mem::take(&mut *LINES.lock().expect("audit lines lock"));
    if !lines.is_empty() {
        let _ = std::io::stderr().write_all(&lines);
    }
}

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
    /// Bytes of the records queued (see [`super::QUEUE_BYTES`]).
    pub(super) bytes: std::sync::atomic::AtomicUsize,
}

/// The writer: a JSON line per record, then the batch into the store. Ends when the queue's
/// sender is gone and the queue is empty.
pub(super) async fn write(w: Arc<Writer>, mut rx: mpsc::Receiver<Record>) {
    let mut batch = Vec::with_capacity(BATCH);
    loop {
        let flushing = tokio::select! {
            n = rx.recv_many(&mut batch, BATCH) => {
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
            while batch.len() < BATCH {
                match rx.try_recv() {
                    Ok(r) => batch.push(r),
                    Err(_) => break,
                }
            }
            if batch.is_empty() {
                break;
            }
            let full = batch.len() == BATCH;
            store(&*w.store, &batch).await;
            let weight: usize = batch.iter().map(Record::weight).sum();
            w.bytes.fetch_sub(weight, Ordering::AcqRel);
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
    for r in batch {
        log(r);
    }
    write_lines();
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

/// One record as a log line: JSON (the log's JSON layer takes this target whatever the
/// log format).
fn log(r: &Record) {
    tracing::info!(
        target: TARGET,
        id = %r.id,
        time = %rfc3339(r.at_ms),
        kind = %r.kind,
        subject = r.subject.as_deref(),
        session = r.session.as_deref(),
        client = r.client.as_deref(),
        plugin = r.plugin.as_deref(),
        target = r.target.as_deref(),
        outcome = r.outcome.as_str(),
        error_code = r.error_code,
        duration_ms = r.duration_us as f64 / 1000.0,
        arguments = r.arguments.as_deref(),
        replica = r.replica.as_deref(),
        "audit"
    );
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
