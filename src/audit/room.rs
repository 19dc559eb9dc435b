//! Room in the audit queue, taken before a record is made and given back when the writer is
//! done with it, so that no client can make another's calls go unrecorded.
//!
//! Three rules, in records and in bytes alike:
//! - a call that will reach a plugin may take the whole queue; records of what never ran
//!   (refusals, admin actions, failed sign-ins) only its first half, so the other half is
//!   always there for calls;
//! - one caller (a token's subject, else a client address) holds at most half of the queue:
//!   callers are counted in [`SLOTS`] buckets by a hash with a key of this process's,
//!   so nobody can pick a name that shares another's bucket;
//! - room for a call is taken before it is dispatched: when there is none, the call is
//!   refused (503, `Retry-After`) rather than run with no record. A call holds that room as
//!   long as it runs (a slow tool's, a parked call's), so one caller's calls running at once
//!   hold at most a sixteenth of the queue: a flood of slow calls from two callers cannot
//!   leave everyone else without room.

use std::hash::BuildHasher;
use std::sync::atomic::{AtomicUsize, Ordering};

use super::{QUEUE, QUEUE_BYTES};

/// Buckets callers are counted in.
const SLOTS: usize = 256;
/// What one caller may hold: half the queue, so another always finds the other half. Less
/// would refuse a busy caller's calls outright: at 25,000 calls a second one caller's
/// records of one writer's moment (200 ms, and the store's time) are some 8,000.
const CALLER_RECORDS: usize = QUEUE / 2;
const CALLER_BYTES: usize = QUEUE_BYTES / 2;
/// Of which its calls still running, at most.
const CALLER_RUNNING: usize = QUEUE / 16;

/// What a record is for, and so how much of the queue it may use.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Class {
    /// A call on its way to a plugin: the whole queue.
    Call,
    /// Anything else (a refusal, an admin action): the first half.
    Other,
}

/// The queue's room, shared by the auditor (which takes) and the writer (which gives back).
pub(super) struct Room {
    records: AtomicUsize,
    bytes: AtomicUsize,
    callers: Box<[Bucket]>,
    hasher: foldhash::fast::RandomState,
}

#[derive(Default)]
struct Bucket {
    records: AtomicUsize,
    bytes: AtomicUsize,
    /// Room held by calls that still run (their records not made yet).
    running: AtomicUsize,
}

/// Room held for one record until the writer is done with it.
#[derive(Debug)]
pub(super) struct Held {
    /// The caller's bucket, if the record has a caller.
    slot: Option<u16>,
    pub(super) weight: usize,
    /// Held for a call that still runs ([`Room::settle`] when its record is made).
    running: bool,
}

impl Default for Room {
    fn default() -> Self {
        Room {
            records: AtomicUsize::new(0),
            bytes: AtomicUsize::new(0),
            callers: (0..SLOTS).map(|_| Bucket::default()).collect(),
            hasher: foldhash::fast::RandomState::default(),
        }
    }
}

/// Adds `n` to `counter` unless that would pass `limit`.
fn add(counter: &AtomicUsize, n: usize, limit: usize) -> bool {
    counter
        .fetch_update(Ordering::AcqRel, Ordering::Acquire, |held| {
            held.checked_add(n).filter(|total| *total <= limit)
        })
        .is_ok()
}

impl Room {
    /// Takes room for a record of `weight` bytes of `class`, by `caller` when it has one.
    pub(super) fn take(&self, class: Class, caller: Option<&str>, weight: usize) -> Option<Held> {
        let (records, bytes) = match class {
            Class::Call => (QUEUE, QUEUE_BYTES),
            Class::Other => (QUEUE / 2, QUEUE_BYTES / 2),
        };
        let slot = caller.map(|c| (self.hasher.hash_one(c) % SLOTS as u64) as u16);
        let running = class == Class::Call;
        if let Some(s) = slot {
            let bucket = &self.callers[usize::from(s)];
            if running && !add(&bucket.running, 1, CALLER_RUNNING) {
                return None;
            }
            if !add(&bucket.records, 1, CALLER_RECORDS) {
                if running {
                    bucket.running.fetch_sub(1, Ordering::AcqRel);
                }
                return None;
            }
            if !add(&bucket.bytes, weight, CALLER_BYTES) {
                bucket.records.fetch_sub(1, Ordering::AcqRel);
                if running {
                    bucket.running.fetch_sub(1, Ordering::AcqRel);
                }
                return None;
            }
        }
        let held = Held {
            slot,
            weight,
            running,
        };
        if !add(&self.records, 1, records) {
            self.give_back_caller(&held);
            return None;
        }
        if !add(&self.bytes, weight, bytes) {
            self.records.fetch_sub(1, Ordering::AcqRel);
            self.give_back_caller(&held);
            return None;
        }
        Some(held)
    }

    /// The call `held` was taken for has ended: its record goes to the queue, in the room
    /// held, no longer counted among its caller's running calls.
    pub(super) fn settle(&self, held: &mut Held) {
        if std::mem::take(&mut held.running)
            && let Some(s) = held.slot
        {
            self.callers[usize::from(s)]
                .running
                .fetch_sub(1, Ordering::AcqRel);
        }
    }

    /// The record `held` was taken for is done with (stored, failed, or never made).
    pub(super) fn give_back(&self, mut held: Held) {
        self.settle(&mut held);
        self.records.fetch_sub(1, Ordering::AcqRel);
        self.bytes.fetch_sub(held.weight, Ordering::AcqRel);
        self.give_back_caller(&held);
    }

    fn give_back_caller(&self, held: &Held) {
        if let Some(s) = held.slot {
            let bucket = &self.callers[usize::from(s)];
            bucket.records.fetch_sub(1, Ordering::AcqRel);
            bucket.bytes.fetch_sub(held.weight, Ordering::AcqRel);
        }
    }

    /// Records held now.
    #[cfg(test)]
    fn held(&self) -> usize {
        self.records.load(Ordering::Acquire)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn other_records_leave_half_the_queue_to_calls() {
        let room = Room::default();
        let mut held = Vec::new();
        // Many callers' refusals, none over its own share: they stop at half.
        for i in 0.. {
            match room.take(
                Class::Other,
                Some(&format!("address 10.0.{}.{}", i / 256, i % 256)),
                100,
            ) {
                Some(h) => held.push(h),
                None => break,
            }
        }
        assert_eq!(room.held(), QUEUE / 2);
        // Calls still find room.
        let call = room.take(Class::Call, Some("subject alice"), 100);
        assert!(call.is_some());
        room.give_back(call.unwrap());
        for h in held {
            room.give_back(h);
        }
        assert_eq!(room.held(), 0);
    }

    #[test]
    fn one_callers_running_calls_hold_at_most_a_sixteenth() {
        let room = Room::default();
        let mut running = Vec::new();
        while let Some(h) = room.take(Class::Call, Some("address 203.0.113.9"), 100) {
            running.push(h);
        }
        assert_eq!(running.len(), CALLER_RUNNING);
        // Ended calls' records wait for the writer in the caller's larger share.
        for h in &mut running {
            room.settle(h);
        }
        assert!(
            room.take(Class::Call, Some("address 203.0.113.9"), 100)
                .is_some()
        );
        for h in running {
            room.give_back(h);
        }
    }

    #[test]
    fn one_caller_holds_at_most_its_share() {
        let room = Room::default();
        let mut held = Vec::new();
        while let Some(mut h) = room.take(Class::Call, Some("address 203.0.113.7"), 100) {
            // Each call ended at once: its record waits for the writer.
            room.settle(&mut h);
            held.push(h);
        }
        assert_eq!(held.len(), CALLER_RECORDS);
        // A busy caller is not refused its own calls: one writer's moment of its records at
        // 25,000 calls a second (some 8,000) fits with room to spare.
        assert!(held.len() >= 12_000);
        // Another caller is not held back (unless it shares the bucket, one chance in 256).
        let others = (0..4)
            .filter(|i| {
                room.take(Class::Call, Some(&format!("subject u{i}")), 100)
                    .is_some()
            })
            .count();
        assert!(others >= 3);
        // Bytes count too.
        let room = Room::default();
        assert!(
            room.take(Class::Call, Some("subject big"), CALLER_BYTES + 1)
                .is_none()
        );
        assert_eq!(room.held(), 0, "a refused take holds nothing");
    }
}
