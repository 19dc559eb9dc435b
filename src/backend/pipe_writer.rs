//! The write side of a plugin's stdin pipe.
//!
//! A message goes into the pipe from the sender's own task when nothing is queued ahead of
//! it: one non-blocking `writev`, no hand-over to another task. What the pipe does not take
//! at once (the plugin is not reading fast enough) waits in a queue that a drain task writes
//! as the pipe empties; while that queue holds anything, new messages line up behind it, so
//! messages never interleave or overtake each other.

use std::io::{ErrorKind, IoSlice};
use std::sync::{Arc, Mutex};

use bytes::{Bytes, BytesMut};
use tokio::net::unix::pipe;
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

pub struct PipeWriter {
    state: Mutex<State>,
    queued: Notify,
}

struct State {
    /// `None` once closed, or once a write failed (the plugin is gone).
    pipe: Option<Arc<pipe::Sender>>,
    /// Bytes the pipe has not taken yet, in order.
    queue: BytesMut,
    /// The drain task owns the pipe until the queue is empty again.
    draining: bool,
}

impl PipeWriter {
    /// Takes the pipe and starts its drain task, which ends (closing the pipe, so the plugin
    /// reads end of input) when `close` fires or a write fails.
    pub fn start(pipe: pipe::Sender, close: CancellationToken) -> Arc<PipeWriter> {
        let writer = Arc::new(PipeWriter {
            state: Mutex::new(State {
                pipe: Some(Arc::new(pipe)),
                queue: BytesMut::new(),
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
            drain.state.lock().expect("stdin lock").pipe = None;
        });
        writer
    }

    /// Writes one message and its newline, or queues what the pipe does not take now. False
    /// once the pipe is closed.
    pub fn send(&self, message: &[u8]) -> bool {
        let mut st = self.state.lock().expect("stdin lock");
        let Some(pipe) = &st.pipe else { return false };
        let mut written = 0;
        if !st.draining {
            match pipe.try_write_vectored(&[IoSlice::new(message), IoSlice::new(b"\n")]) {
                Ok(n) if n == message.len() + 1 => return true,
                Ok(n) => written = n,
                Err(e) if e.kind() == ErrorKind::WouldBlock => {}
                Err(_) => {
                    st.pipe = None;
                    return false;
                }
            }
        }
        if written < message.len() {
            st.queue.extend_from_slice(&message[written..]);
        }
        st.queue.extend_from_slice(b"\n");
        if !st.draining {
            st.draining = true;
            self.queued.notify_one();
        }
        true
    }

    /// Writes the queue out whenever something is put in it; returns when a write fails.
    async fn drain(&self) {
        loop {
            self.queued.notified().await;
            loop {
                let (pipe, chunk): (Arc<pipe::Sender>, Bytes) = {
                    let mut st = self.state.lock().expect("stdin lock");
                    let Some(pipe) = st.pipe.clone() else { return };
                    if st.queue.is_empty() {
                        st.draining = false;
                        break;
                    }
                    (pipe, st.queue.split().freeze())
                };
                if write_all(&pipe, &chunk).await.is_err() {
                    return;
                }
            }
        }
    }
}

async fn write_all(pipe: &pipe::Sender, mut data: &[u8]) -> std::io::Result<()> {
    while !data.is_empty() {
        pipe.writable().await?;
        match pipe.try_write(data) {
            Ok(n) => data = &data[n..],
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
        assert!(w.send(&big));
        for i in 0..100 {
            assert!(w.send(format!("m{i}").as_bytes()));
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
        assert!(w.send(b"direct"));
        let mut line = [0; 7];
        rx.read_exact(&mut line).await.unwrap();
        assert_eq!(&line, b"direct\n");
        // Closing ends the input, even with a write pending.
        assert!(w.send(&big));
        close.cancel();
        let mut rest = Vec::new();
        rx.read_to_end(&mut rest).await.unwrap();
        assert!(rest.len() <= big.len() + 1);
        tokio::time::timeout(std::time::Duration::from_secs(5), async {
            while w.send(b"late") {
                tokio::task::yield_now().await;
            }
        })
        .await
        .unwrap();
    }

    #[tokio::test]
    async fn a_closed_reader_makes_send_fail() {
        let (tx, rx) = pipe::pipe().unwrap();
        let w = PipeWriter::start(tx, CancellationToken::new());
        drop(rx);
        // The first message may be queued (the pipe's readiness is not known yet); the write
        // then fails with EPIPE and every later send is refused.
        tokio::time::timeout(std::time::Duration::from_secs(5), async {
            while w.send(b"x") {
                tokio::task::yield_now().await;
            }
        })
        .await
        .unwrap();
        assert!(!w.send(b"y"));
    }
}
