//! The write side of a plugin's stdin pipe.
//!
//! A message goes into the pipe from the sender's own task when nothing is queued ahead of
//! it: one non-blocking `writev`, no hand-over to another task. What the pipe does not take
//! at once (the plugin is not reading fast enough) waits in a queue that a drain task writes
//! as the pipe empties; while that queue holds anything, new messages line up behind it, so
//! messages never interleave or overtake each other.
//!
//! The queue is bounded in messages and in bytes: a plugin that stops reading must not grow
//! the gateway, so once it is full a message is refused ([`SendError::Full`]) rather than
//! queued. A request still queued whole can be withdrawn (it timed out, or was cancelled) so
//! it never reaches the plugin; closing the pipe frees the queue.

use std::collections::VecDeque;
use std::io::{ErrorKind, IoSlice};
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use tokio::net::unix::pipe;
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

use super::transport::SendError;

/// Most messages waiting for a plugin that does not read.
pub const MAX_QUEUED_MESSAGES: usize = 1024;
/// Most bytes waiting for a plugin that does not read (an empty queue takes any one message,
/// so the largest a client may send always fits).
pub const MAX_QUEUED_BYTES: usize = 16 * 1024 * 1024;
/// Messages written together by one `writev` when the drain task catches up.
const BATCH: usize = 64;

pub struct PipeWriter {
    state: Mutex<State>,
    queued: Notify,
}

struct State {
    /// `None` once closed, or once a write failed (the plugin is gone).
    pipe: Option<Arc<pipe::Sender>>,
    /// Messages the pipe has not taken yet, in order; each is followed by a newline.
    queue: VecDeque<Queued>,
    /// Their bytes.
    bytes: usize,
    /// The drain task owns the pipe until the queue is empty again.
    draining: bool,
}

struct Queued {
    /// Set on a request nothing of which is written yet: it can still be withdrawn.
    tag: Option<u64>,
    /// What is left of the message (its newline not included).
    data: Bytes,
}

impl State {
    fn close(&mut self) {
        self.pipe = None;
        self.queue = VecDeque::new();
        self.bytes = 0;
    }

    fn push(&mut self, tag: Option<u64>, data: Bytes) {
        self.bytes += data.len();
        self.queue.push_back(Queued { tag, data });
    }
}

impl PipeWriter {
    /// Takes the pipe and starts its drain task, which ends (closing the pipe, so the plugin
    /// reads end of input) when `close` fires or a write fails.
    pub fn start(pipe: pipe::Sender, close: CancellationToken) -> Arc<PipeWriter> {
        let writer = Arc::new(PipeWriter {
            state: Mutex::new(State {
                pipe: Some(Arc::new(pipe)),
                queue: VecDeque::new(),
                bytes: 0,
                draining: false,
            }),
            queued: Notify::new(),
        });
        let drain = writer.clone();
        tokio::spawn(async move {
            tokio::select! {
                () = drain.drain() => {}
                () = close.cancelled() => {}
            }
            drain.state.lock().expect("stdin lock").close();
        });
        writer
    }

    /// Writes one message and its newline, or queues what the pipe does not take now. A
    /// `tag` lets a request still queued whole be [withdrawn](Self::withdraw). Refused when
    /// the pipe is closed, or when the queue is full (the plugin is not reading).
    pub fn send(&self, message: Bytes, tag: Option<u64>) -> Result<(), SendError> {
        let mut st = self.state.lock().expect("stdin lock");
        let Some(pipe) = &st.pipe else {
            return Err(SendError::Closed);
        };
        if !st.draining {
            match pipe.try_write_vectored(&[IoSlice::new(&message), IoSlice::new(b"\n")]) {
                Ok(n) if n == message.len() + 1 => return Ok(()),
                // Partly written: the rest must follow, whatever the queue holds.
                Ok(n) => st.push(None, message.slice(n..)),
                Err(e) if e.kind() == ErrorKind::WouldBlock => st.push(tag, message),
                Err(_) => {
                    st.close();
                    return Err(SendError::Closed);
                }
            }
            st.draining = true;
            self.queued.notify_one();
            return Ok(());
        }
        if !st.queue.is_empty()
            && (st.queue.len() >= MAX_QUEUED_MESSAGES
                || st.bytes + message.len() > MAX_QUEUED_BYTES)
        {
            return Err(SendError::Full {
                messages: st.queue.len(),
                bytes: st.bytes,
            });
        }
        st.push(tag, message);
        Ok(())
    }

    /// Takes a request out of the queue if none of it is written yet; true if it was there.
    pub fn withdraw(&self, tag: u64) -> bool {
        let mut st = self.state.lock().expect("stdin lock");
        let Some(i) = st.queue.iter().position(|q| q.tag == Some(tag)) else {
            return false;
        };
        let q = st.queue.remove(i).expect("found");
        st.bytes -= q.data.len();
        true
    }

    /// Writes the queue out whenever something is put in it; returns when a write fails.
    async fn drain(&self) {
        loop {
            self.queued.notified().await;
            loop {
                let (pipe, batch): (Arc<pipe::Sender>, Vec<Bytes>) = {
                    let mut st = self.state.lock().expect("stdin lock");
                    let Some(pipe) = st.pipe.clone() else { return };
                    if st.queue.is_empty() {
                        st.draining = false;
                        break;
                    }
                    let n = st.queue.len().min(BATCH);
                    let batch: Vec<Bytes> = st.queue.drain(..n).map(|q| q.data).collect();
                    st.bytes -= batch.iter().map(Bytes::len).sum::<usize>();
                    (pipe, batch)
                };
                if write_all(&pipe, &batch).await.is_err() {
                    return;
                }
            }
        }
    }
}

/// Writes each message followed by a newline.
async fn write_all(pipe: &pipe::Sender, messages: &[Bytes]) -> std::io::Result<()> {
    let mut slices: Vec<IoSlice<'_>> = messages
        .iter()
        .flat_map(|m| [IoSlice::new(m), IoSlice::new(b"\n")])
        .filter(|s| !s.is_empty())
        .collect();
    let mut slices = &mut slices[..];
    while !slices.is_empty() {
        pipe.writable().await?;
        match pipe.try_write_vectored(slices) {
            Ok(n) => IoSlice::advance_slices(&mut slices, n),
            Err(e) if e.kind() == ErrorKind::WouldBlock => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::AsyncReadExt;

    #[tokio::test]
    async fn what_the_pipe_cannot_take_is_queued_and_nothing_overtakes_it() {
        let (tx, mut rx) = pipe::pipe().unwrap();
        let close = CancellationToken::new();
        let w = PipeWriter::start(tx, close.clone());
        // Far over a pipe's 64 KiB: the first write is partial, the rest queues behind it.
        let big = vec![b'x'; 300 * 1024];
        assert!(w.send(Bytes::from(big.clone()), None).is_ok());
        for i in 0..100 {
            assert!(w.send(Bytes::from(format!("m{i}")), None).is_ok());
        }
        let mut expected = big.clone();
        expected.push(b'\n');
        for i in 0..100 {
            expected.extend_from_slice(format!("m{i}\n").as_bytes());
        }
        let mut got = vec![0; expected.len()];
        rx.read_exact(&mut got).await.unwrap();
        assert!(got == expected, "bytes out of order");
        // Once drained, a message goes straight into the pipe again.
        tokio::time::timeout(std::time::Duration::from_secs(5), async {
            while w.state.lock().unwrap().draining {
                tokio::task::yield_now().await;
            }
        })
        .await
        .unwrap();
        assert!(w.send(Bytes::from_static(b"direct"), None).is_ok());
        let mut line = [0; 7];
        rx.read_exact(&mut line).await.unwrap();
        assert_eq!(&line, b"direct\n");
        // Closing ends the input, even with a write pending.
        assert!(w.send(Bytes::from(big.clone()), None).is_ok());
        close.cancel();
        let mut rest = Vec::new();
        rx.read_to_end(&mut rest).await.unwrap();
        assert!(rest.len() <= big.len() + 1);
        tokio::time::timeout(std::time::Duration::from_secs(5), async {
            while w.send(Bytes::from_static(b"late"), None).is_ok() {
                tokio::task::yield_now().await;
            }
        })
        .await
        .unwrap();
    }

    #[tokio::test]
    async fn a_full_queue_refuses_and_a_withdrawn_request_leaves_it() {
        let (tx, mut rx) = pipe::pipe().unwrap();
        let w = PipeWriter::start(tx, CancellationToken::new());
        // Nobody reads: the pipe fills, then the queue up to its byte bound.
        let chunk = Bytes::from(vec![b'x'; 1024 * 1024]);
        let mut taken = 0;
        let refused = loop {
            match w.send(chunk.clone(), Some(taken)) {
                Ok(()) => taken += 1,
                Err(e) => break e,
            }
            assert!(taken < 100, "no bound");
        };
        assert!(matches!(refused, SendError::Full { bytes, .. } if bytes <= MAX_QUEUED_BYTES));
        // Withdrawing the last makes room for one more; a withdrawn one is gone for good.
        assert!(w.withdraw(taken - 1));
        assert!(!w.withdraw(taken - 1));
        assert!(w.send(chunk.clone(), None).is_ok());
        assert!(w.send(chunk.clone(), None).is_err());
        // The count is bounded too.
        let (tx2, _rx2) = pipe::pipe().unwrap();
        let w2 = PipeWriter::start(tx2, CancellationToken::new());
        let small = Bytes::from(vec![b'y'; 1024]);
        let mut n = 0;
        while w2.send(small.clone(), None).is_ok() {
            n += 1;
            assert!(n <= MAX_QUEUED_MESSAGES + 100, "no bound on the count");
        }
        // What was queued reaches the reader in order, with nothing of the withdrawn one.
        let mut first = vec![0; chunk.len() + 1];
        rx.read_exact(&mut first).await.unwrap();
        assert_eq!(first.last(), Some(&b'\n'));
    }

    #[tokio::test]
    async fn a_closed_reader_makes_send_fail() {
        let (tx, rx) = pipe::pipe().unwrap();
        let w = PipeWriter::start(tx, CancellationToken::new());
        drop(rx);
        // The first message may be queued (the pipe's readiness is not known yet); the write
        // then fails with EPIPE and every later send is refused.
        tokio::time::timeout(std::time::Duration::from_secs(5), async {
            while w.send(Bytes::from_static(b"x"), None).is_ok() {
                tokio::task::yield_now().await;
            }
        })
        .await
        .unwrap();
        assert_eq!(
            w.send(Bytes::from_static(b"y"), None),
            Err(SendError::Closed)
        );
    }
}
