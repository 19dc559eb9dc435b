//! The audit log's writer: one task takes the queued records, makes each its JSON line
//! (`line.rs`), writes the lines on stderr when the log wants [`TARGET`](super::TARGET) at
//! `info` (a write per segment) and stores them as segments, one transaction per moment;
//! another deletes records past the retention hourly. What the writer itself has to say (a failed store) goes under a target
//! of its own, never among the records.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use tokio::sync::{Notify, mpsc};
use tokio_util::sync::CancellationToken;

use super::{AuditStore, Queued, Record, Room, Segment, TARGET, time};

/// The target of what the writer itself has to say (a failed store): ordinary log lines,
/// never among the records.
const WRITER: &str = "mcp_gateway::audit::writer";

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

/// Stores `batch` as segments of its lines (writing them on stderr first, when the log wants
/// them); a failure is counted and logged, not retried.
async fn store(store: &dyn AuditStore, batch: &[Record]) {
    let segments = Segment::of(batch, time::now_ms());
    log(&segments);
    let why = match tokio::time::timeout(STORE_TIMEOUT, store.insert(&segments)).await {
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

/// Writes the segments' lines on stderr, if the log wants [`TARGET`] at `info` (on unless
/// `RUST_LOG` turns it off; see `logs.rs`): a write per segment.
fn log(segments: &[Segment]) {
    use std::io::Write as _;
    if segments.is_empty() || !tracing::enabled!(target: TARGET, tracing::Level::INFO) {
        return;
    }
    let mut stderr = std::io::stderr().lock();
    for s in segments {
        let _ = stderr.write_all(s.lines.as_bytes());
    }
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
