//! Whether a stdio plugin has settled: everything it wrote has been read and handed on, and
//! none of its processes is running. The bridge asks this to know when a plugin has sent all
//! the requests of one round to a 2026-07-28 client (they are usually written together, but
//! each is a write of its own, and a plugin can be descheduled between them).
//!
//! Three things are looked at, in this order, so that a write can slip between none of them:
//! every thread of the plugin's process tree is asleep (or stopped), so it writes nothing
//! more by itself; its stdout pipe holds no unread byte; and the reader is parked on that
//! pipe with no partial line, so every line it read has been handed on. The reader marks
//! itself busy before it reads and idle only once it has found nothing more to read, so a
//! write read between the last two looks is seen as busy or, once handed on, is waiting in
//! its stream for whoever asked.

use std::os::fd::{AsFd, OwnedFd};
use std::pin::Pin;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::{Context, Poll};

use futures_util::Stream;
use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
use tokio::process::ChildStdout;
use tokio_util::codec::FramedRead;

use super::stdio::{Line, LineCodec};

/// Threads of a plugin's process tree looked at, at most; a tree with more is taken as
/// not known to have settled.
const MAX_TASKS: usize = 512;

/// What the reader of one plugin's stdout tells the bridge (see the module's doc).
pub struct Settle {
    /// The plugin's main process.
    pid: u32,
    /// A duplicate of the stdout pipe's read end, to see whether bytes wait in it; dropped
    /// when the reader is.
    pipe: Mutex<Option<OwnedFd>>,
    /// The reader is reading, or handing on what it read.
    busy: AtomicBool,
}

impl Settle {
    pub fn new(pid: u32, stdout: &ChildStdout) -> Option<Settle> {
        let pipe = stdout.as_fd().try_clone_to_owned().ok()?;
        Some(Settle {
            pid,
            pipe: Mutex::new(Some(pipe)),
            busy: AtomicBool::new(true),
        })
    }

    /// True when the plugin has settled; false when it may still write; `None` when it
    /// cannot be told (its processes cannot be read).
    pub fn settled(&self) -> Option<bool> {
        if !asleep(self.pid)? {
            return Some(false);
        }
        let unread = match &*self.pipe.lock().expect("settle lock") {
            Some(pipe) => {
                let mut fds = [PollFd::new(pipe.as_fd(), PollFlags::POLLIN)];
                poll(&mut fds, PollTimeout::ZERO).ok()? > 0
            }
            // The reader is gone: so is the plugin's output.
            None => false,
        };
        Some(!unread && !self.busy.load(Ordering::SeqCst))
    }
}

/// True if no thread of `pid`'s process tree is running or in an uninterruptible wait;
/// `None` if the tree cannot be read (or is too large to read quickly).
fn asleep(pid: u32) -> Option<bool> {
    let mut pending = vec![pid];
    let mut seen = 0usize;
    while let Some(pid) = pending.pop() {
        let tasks = match std::fs::read_dir(format!("/proc/{pid}/task")) {
            Ok(tasks) => tasks,
            // Gone since its parent listed it: it runs no more.
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
            Err(_) => return None,
        };
        for task in tasks {
            let task = task.ok()?.path();
            seen += 1;
            if seen > MAX_TASKS {
                return None;
            }
            let Ok(stat) = std::fs::read(task.join("stat")) else {
                continue;
            };
            if matches!(state(&stat)?, b'R' | b'D') {
                return Some(false);
            }
            if let Ok(children) = std::fs::read_to_string(task.join("children")) {
                pending.extend(
                    children
                        .split_ascii_whitespace()
                        .filter_map(|c| c.parse::<u32>().ok()),
                );
            }
        }
    }
    Some(true)
}

/// The state letter of a `/proc/…/stat` line: the first field after the command's name,
/// which is in parentheses and may itself hold any character.
fn state(stat: &[u8]) -> Option<u8> {
    let close = stat.iter().rposition(|b| *b == b')')?;
    stat.get(close + 2).copied()
}

/// A plugin's stdout read into lines, telling its [`Settle`] when it is busy.
pub struct Watched {
    inner: FramedRead<ChildStdout, LineCodec>,
    settle: std::sync::Arc<Settle>,
}

impl Watched {
    pub fn new(inner: FramedRead<ChildStdout, LineCodec>, settle: std::sync::Arc<Settle>) -> Self {
        Watched { inner, settle }
    }
}

impl Stream for Watched {
    type Item = std::io::Result<Line>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        self.settle.busy.store(true, Ordering::SeqCst);
        let next = Pin::new(&mut self.inner).poll_next(cx);
        // Idle only with nothing read and not yet handed on: a line arriving in pieces
        // keeps it busy until its end came.
        if next.is_pending() && self.inner.read_buffer().is_empty() {
            self.settle.busy.store(false, Ordering::SeqCst);
        }
        next
    }
}

impl Drop for Watched {
    fn drop(&mut self) {
        self.settle.pipe.lock().expect("settle lock").take();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_state_follows_the_last_parenthesis() {
        assert_eq!(state(b"12 (node) S 1 12"), Some(b'S'));
        assert_eq!(state(b"12 (a) R (b)) R 1"), Some(b'R'));
        assert_eq!(state(b"12 (x"), None);
    }

    /// A child killed when the test ends, passed or not.
    struct Killed(std::process::Child);

    impl Drop for Killed {
        fn drop(&mut self) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }

    #[test]
    fn a_sleeping_child_has_settled_and_a_spinning_one_has_not() {
        let sleeper = Killed(
            std::process::Command::new("sleep")
                .arg("30")
                .spawn()
                .unwrap(),
        );
        let spinner = Killed(
            std::process::Command::new("sh")
                .args(["-c", "while :; do :; done"])
                .spawn()
                .unwrap(),
        );
        let (sleeper, spinner) = (&sleeper.0, &spinner.0);
        // The sleeper reaches its sleep soon after it starts; the spinner never sleeps.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while asleep(sleeper.id()) != Some(true) {
            assert!(std::time::Instant::now() < deadline, "sleep never slept");
            std::thread::yield_now();
        }
        let mut ran = false;
        for _ in 0..1000 {
            if asleep(spinner.id()) == Some(false) {
                ran = true;
                break;
            }
            std::thread::yield_now();
        }
        assert!(ran, "a busy loop was never seen running");
    }
}
