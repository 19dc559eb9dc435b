//! Calls parked while their modern client gathers the input a plugin asked for (multi
//! round-trip requests): this replica's table of them, bounded in count and bytes, in total
//! and per caller, and the key their `requestState` is sealed with.
//!
//! A call is parked when its `InputRequiredResult` goes out and leaves the table when its
//! client's retry takes it back ([`ParkedCalls::resume`], once: the retry's state must name
//! the round it was parked for) or when it times out (its bridge takes it back, see
//! `bridge.rs`). The table holds only the way to wake each call; the calls themselves are
//! their bridges' tasks.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::oneshot;

use super::bridge::Resume;
use crate::protocol::mrtr::StateKey;

/// How much may be parked.
#[derive(Debug, Clone, Copy)]
pub struct ParkLimits {
    /// Calls parked at once.
    pub calls: usize,
    /// Calls one caller may have parked at once.
    pub per_caller: usize,
    /// Bytes of the requests the parked calls wait on, together.
    pub bytes: usize,
}

impl Default for ParkLimits {
    fn default() -> ParkLimits {
        ParkLimits {
            calls: 4096,
            per_caller: 64,
            bytes: 64 * 1024 * 1024,
        }
    }
}

/// Why a call was not parked.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum ParkRefused {
    #[error("the gateway holds as many calls waiting for their clients' input as it may")]
    Full,
    #[error("this client has as many calls waiting for its input as one client may")]
    CallerFull,
}

/// Why a retry found no call to resume.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum ResumeRefused {
    /// Not parked here (it ended, timed out, or was resumed already), or parked for another
    /// round or caller.
    #[error("no such call is waiting for input here")]
    NotParked,
}

struct Parked {
    caller: Option<Arc<str>>,
    /// Who it counts against ([`ParkLimits::per_caller`]): the client key, so that clients
    /// without a token are counted by address, not as one.
    counted_as: Arc<str>,
    nonce: u64,
    bytes: usize,
    wake: oneshot::Sender<Resume>,
}

#[derive(Default)]
struct Table {
    calls: HashMap<u64, Parked>,
    per_caller: HashMap<Arc<str>, usize>,
    bytes: usize,
}

/// This replica's parked calls (see the module's doc).
pub struct ParkedCalls {
    /// Seals every `requestState` this replica hands out; the same on every replica.
    pub key: StateKey,
    /// Names this replica in the states it seals.
    pub replica: Arc<str>,
    /// How long a call waits for its client's retry.
    pub timeout: Duration,
    limits: ParkLimits,
    table: Mutex<Table>,
}

impl ParkedCalls {
    pub fn new(key: StateKey, replica: Arc<str>, timeout: Duration) -> ParkedCalls {
        ParkedCalls::with_limits(key, replica, timeout, ParkLimits::default())
    }

    pub fn with_limits(
        key: StateKey,
        replica: Arc<str>,
        timeout: Duration,
        limits: ParkLimits,
    ) -> ParkedCalls {
        ParkedCalls {
            key,
            replica,
            timeout,
            limits,
            table: Mutex::default(),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Table> {
        self.table.lock().expect("parked lock")
    }

    /// Parks call `call` of `caller` for the round `nonce` names, `bytes` of requests waiting
    /// on its client; `wake` takes the retry to it.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn park(
        &self,
        call: u64,
        caller: Option<&str>,
        counted_as: &Arc<str>,
        nonce: u64,
        bytes: usize,
        wake: oneshot::Sender<Resume>,
    ) -> Result<(), ParkRefused> {
        let caller: Option<Arc<str>> = caller.map(Arc::from);
        let mut t = self.lock();
        let theirs = t.per_caller.get(counted_as).copied().unwrap_or(0);
        if theirs >= self.limits.per_caller {
            return Err(ParkRefused::CallerFull);
        }
        if t.calls.len() >= self.limits.calls
            || t.bytes + bytes > self.limits.bytes
            || t.calls.contains_key(&call)
        {
            return Err(ParkRefused::Full);
        }
        *t.per_caller.entry(counted_as.clone()).or_default() += 1;
        t.bytes += bytes;
        t.calls.insert(
            call,
            Parked {
                caller,
                counted_as: counted_as.clone(),
                nonce,
                bytes,
                wake,
            },
        );
        Ok(())
    }

    /// Takes call `call` out of the table for its client's retry, once: the caller and the
    /// round must be those it was parked for.
    pub fn resume(
        &self,
        call: u64,
        caller: Option<&str>,
        nonce: u64,
    ) -> Result<oneshot::Sender<Resume>, ResumeRefused> {
        let mut t = self.lock();
        let matches = t
            .calls
            .get(&call)
            .is_some_and(|p| p.nonce == nonce && p.caller.as_deref() == caller);
        if !matches {
            return Err(ResumeRefused::NotParked);
        }
        let parked = Self::remove(&mut t, call).expect("just found");
        Ok(parked.wake)
    }

    /// Takes call `call` out of the table on its own (it timed out, or its session ended):
    /// false when a retry took it first.
    pub(super) fn unpark(&self, call: u64) -> bool {
        Self::remove(&mut self.lock(), call).is_some()
    }

    fn remove(t: &mut Table, call: u64) -> Option<Parked> {
        let parked = t.calls.remove(&call)?;
        t.bytes -= parked.bytes;
        if let Some(n) = t.per_caller.get_mut(&parked.counted_as) {
            *n -= 1;
            if *n == 0 {
                t.per_caller.remove(&parked.counted_as);
            }
        }
        Some(parked)
    }

    /// Calls parked now, and the bytes they hold.
    pub fn usage(&self) -> (usize, usize) {
        let t = self.lock();
        (t.calls.len(), t.bytes)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn table(limits: ParkLimits) -> ParkedCalls {
        ParkedCalls::with_limits(
            StateKey::new(&[0; 32]),
            Arc::from("r"),
            Duration::from_secs(1),
            limits,
        )
    }

    fn wake() -> oneshot::Sender<Resume> {
        oneshot::channel().0
    }

    #[test]
    fn a_call_is_resumed_once_by_its_caller_for_its_round() {
        let t = table(ParkLimits::default());
        t.park(1, Some("alice"), &Arc::from("alice"), 10, 100, wake())
            .unwrap();
        assert_eq!(
            t.resume(1, Some("bob"), 10).err(),
            Some(ResumeRefused::NotParked)
        );
        assert_eq!(t.resume(1, None, 10).err(), Some(ResumeRefused::NotParked));
        assert_eq!(
            t.resume(1, Some("alice"), 11).err(),
            Some(ResumeRefused::NotParked)
        );
        assert!(t.resume(1, Some("alice"), 10).is_ok());
        assert_eq!(
            t.resume(1, Some("alice"), 10).err(),
            Some(ResumeRefused::NotParked),
            "a replayed state finds nothing"
        );
        assert_eq!(t.usage(), (0, 0));
        t.park(2, None, &Arc::from("anonymous"), 1, 5, wake())
            .unwrap();
        assert!(t.unpark(2));
        assert!(!t.unpark(2));
        assert!(t.resume(2, None, 1).is_err(), "timed out: gone");
    }

    #[test]
    fn the_table_is_bounded_in_count_bytes_and_per_caller() {
        let t = table(ParkLimits {
            calls: 3,
            per_caller: 2,
            bytes: 1000,
        });
        t.park(1, Some("a"), &Arc::from("a"), 0, 10, wake())
            .unwrap();
        t.park(2, Some("a"), &Arc::from("a"), 0, 10, wake())
            .unwrap();
        assert_eq!(
            t.park(3, Some("a"), &Arc::from("a"), 0, 10, wake()),
            Err(ParkRefused::CallerFull)
        );
        assert_eq!(
            t.park(3, Some("b"), &Arc::from("b"), 0, 990, wake()),
            Err(ParkRefused::Full),
            "bytes"
        );
        t.park(3, Some("b"), &Arc::from("b"), 0, 980, wake())
            .unwrap();
        assert_eq!(
            t.park(4, None, &Arc::from("anonymous"), 0, 0, wake()),
            Err(ParkRefused::Full),
            "count"
        );
        assert!(t.unpark(1));
        t.park(4, Some("a"), &Arc::from("a"), 0, 0, wake()).unwrap();
        assert_eq!(t.usage(), (3, 990));
    }
}
