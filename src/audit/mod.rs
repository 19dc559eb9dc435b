//! The audit log: one [`Record`] per `tools/call`, `prompts/get` and `resources/read` a client
//! made, and per admin action: when, who (subject, session, client), what (plugin, tool,
//! prompt or resource, action), how it ended and how long it took. A call's arguments are
//! kept only as an HMAC (a key the replicas share) unless `audit.include_arguments`.
//!
//! A call's record is made by a [`Ticket`] that travels with the request to the plugin and
//! back: whatever ends the request (an answer, an error, a timeout, a cancellation, the
//! plugin's exit, a refusal) drops the ticket, and the drop submits the record. A ticket
//! takes its record's room in the queue when it is made, before the call is dispatched
//! (`room.rs`: calls may use the whole queue, records of what never ran half of it, one
//! caller half), so a call that runs is always recorded; a call that finds no room is
//! refused instead ([`Full`]). Submitting never waits: records go through the bounded queue
//! to one writer task, which writes each as a JSON line under the target
//! `mcp_gateway::audit` (`line.rs`) and stores a moment's lines together in the database
//! ([`AuditStore`], [`Segment`]; `writer.rs`), where records past the retention are deleted
//! hourly. A record of what never ran that finds no room is dropped and counted
//! (`mcp_gateway_audit_dropped_total`); requests refused together (a batch) are one record
//! with their count.
//!
//! This module decides what a record says; the only say it has in whether a call runs is
//! that one without room for its record does not.

mod arguments;
mod line;
mod params;
mod room;
mod store;
mod time;
mod writer;

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use hmac::{Hmac, Mac};
use serde::Deserialize;
use serde_json::value::RawValue;
use serde_json::{Value, json};
use sha2::Sha256;
use tokio::sync::{Notify, mpsc};
use tokio_util::sync::CancellationToken;

use crate::config::AuditConfig;

use arguments::{canonical, hmac_hex};
use room::{Class, Held, Room};
pub use store::{AuditStore, Filter, Gather, MAX_LIMIT, Segment, StoreError, StoreFuture};
pub use time::{now_ms, rfc3339};
use writer::{STORE_TIMEOUT, Writer};

/// The target the records' log lines carry, and which `RUST_LOG` turns on or off (this
/// target only: the log's layers match it exactly).
pub const TARGET: &str = "mcp_gateway::audit";
/// Records waiting for the writer, at most...
const QUEUE: usize = 32_768;
/// ...and their bytes, at most (arguments kept as sent make a record large).
const QUEUE_BYTES: usize = 32 << 20;
/// Bytes of arguments a record keeps as sent (`include_arguments`); longer arguments are
/// kept as their hash, marked so.
const MAX_ARGUMENT_BYTES: usize = 8 * 1024;
/// Characters of a session id a record keeps: enough to find the session, not enough to use.
pub const SESSION_PREFIX: usize = 8;

/// How a request ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// Answered with a result (an admin action: a 2xx status).
    Ok,
    /// A tool's result with `isError: true`.
    ToolError,
    /// Answered with a JSON-RPC error (an admin action: a 4xx or 5xx status).
    Error,
    /// Refused by the gateway before any plugin saw it: unknown tool, not allowed (its HTTP
    /// status, 403), over a rate limit (429).
    Refused,
    /// No answer within the plugin's request timeout.
    Timeout,
    /// The client cancelled it, or closed its stream.
    Cancelled,
    /// The request ended without an answer (its plugin exited or was stopped).
    NoAnswer,
}

impl Outcome {
    pub fn as_str(self) -> &'static str {
        match self {
            Outcome::Ok => "ok",
            Outcome::ToolError => "tool_error",
            Outcome::Error => "error",
            Outcome::Refused => "refused",
            Outcome::Timeout => "timeout",
            Outcome::Cancelled => "cancelled",
            Outcome::NoAnswer => "no_answer",
        }
    }

    pub fn parse(s: &str) -> Option<Outcome> {
        [
            Outcome::Ok,
            Outcome::ToolError,
            Outcome::Error,
            Outcome::Refused,
            Outcome::Timeout,
            Outcome::Cancelled,
            Outcome::NoAnswer,
        ]
        .into_iter()
        .find(|o| o.as_str() == s)
    }
}

/// One audit record.
#[derive(Debug, Clone)]
pub struct Record {
    /// The time in hexadecimal, then 64 random bits: unique across replicas.
    pub id: String,
    /// When the request arrived, in milliseconds since the epoch.
    pub at_ms: i64,
    /// `tools/call`, `prompts/get`, `resources/read`, or `admin`.
    pub kind: String,
    /// The token's subject (`admin` for the admin token), when known.
    pub subject: Option<String>,
    /// The first characters of the session id ([`SESSION_PREFIX`]); none for a modern client.
    pub session: Option<String>,
    /// The client's name and version, as it gave them.
    pub client: Option<String>,
    pub plugin: Option<String>,
    /// The credentials of the caller's own that the plugin was started with (by name,
    /// comma-separated; never a value), when it uses any.
    pub credentials: Option<String>,
    /// The tool or prompt name as the client used it, the resource URI, or the admin action.
    pub target: Option<String>,
    pub outcome: Outcome,
    /// The JSON-RPC error code (or an admin action's HTTP status) of an error or refusal.
    pub error_code: Option<i64>,
    pub duration_us: i64,
    /// The arguments as sent, or `hmac-sha256:<hex>` of them; none when the request had none.
    pub arguments: Option<String>,
    /// The replica that served it.
    pub replica: Option<String>,
    /// How many requests it stands for, when more than one were refused together (a batch);
    /// none for one request.
    pub count: Option<i64>,
}

impl Record {
    /// Bytes it holds, about.
    fn weight(&self) -> usize {
        let text = [
            &self.subject,
            &self.session,
            &self.client,
            &self.plugin,
            &self.credentials,
            &self.target,
            &self.arguments,
            &self.replica,
        ];
        std::mem::size_of::<Record>()
            + self.id.len()
            + self.kind.len()
            + text
                .iter()
                .map(|t| t.as_ref().map_or(0, String::len))
                .sum::<usize>()
    }

    /// The record as the admin API, the console and the log show it.
    pub fn to_json(&self) -> Value {
        json!({
            "id": self.id,
            "time": rfc3339(self.at_ms),
            "at_ms": self.at_ms,
            "kind": self.kind,
            "subject": self.subject,
            "session": self.session,
            "client": self.client,
            "plugin": self.plugin,
            "credentials": self.credentials,
            "target": self.target,
            "outcome": self.outcome.as_str(),
            "error_code": self.error_code,
            "duration_ms": self.duration_us as f64 / 1000.0,
            "arguments": self.arguments,
            "replica": self.replica,
            "count": self.count,
        })
    }
}

/// Who made a request, as far as a record says.
#[derive(Debug, Default, Clone, Copy)]
pub struct Who<'a> {
    pub subject: Option<&'a str>,
    /// The full session id (the record keeps its prefix).
    pub session: Option<&'a str>,
    pub client: Option<&'a str>,
    /// Who the queue counts the record against: the token's subject, else the client's
    /// address (`http::checks::client_key`); never written in the record.
    pub caller: Option<&'a str>,
}

/// The audit queue has no room for another call's record: the call is refused before it
/// runs, rather than run unrecorded.
#[derive(Debug, Clone, Copy, thiserror::Error)]
#[error("the audit log's queue is full: the call was not run; retry in a moment")]
pub struct Full;

/// A record on its way to the writer, with the room it holds.
struct Queued {
    record: Record,
    held: Held,
}

/// The audit log: makes tickets and admin records, and feeds the writer.
pub struct Auditor {
    config: AuditConfig,
    /// The arguments' HMAC with its key already taken in: a clone per record skips the two
    /// compressions of the key's blocks (of four or five per call).
    mac: Hmac<Sha256>,
    replica: Arc<str>,
    tx: mpsc::Sender<Queued>,
    /// What the writer shares: it stops when the auditor (the queue's sender) is dropped.
    writer: Arc<Writer>,
    /// Records submitted to the queue (counted before they go in): a flush waits until as
    /// many are handled.
    queued: AtomicU64,
}

/// The methods whose requests are audited.
pub fn audited(method: &str) -> bool {
    matches!(method, "tools/call" | "prompts/get" | "resources/read")
}

impl Auditor {
    /// Starts the writer (and the hourly pruning) on `store`. The writer stops when the
    /// auditor is dropped, after storing what is queued; the pruning, with `shutdown`.
    pub fn start(
        config: AuditConfig,
        key: [u8; 32],
        replica: Arc<str>,
        store: Arc<dyn AuditStore>,
        shutdown: CancellationToken,
    ) -> Arc<Auditor> {
        let (tx, rx) = mpsc::channel(QUEUE);
        let writer = Arc::new(Writer {
            store,
            flush: Notify::new(),
            flushed: Notify::new(),
            handled: AtomicU64::new(0),
            room: Room::default(),
        });
        if config.enabled {
            tokio::spawn(writer::write(writer.clone(), rx));
            tokio::spawn(writer::prune(
                writer.store.clone(),
                config.retention,
                shutdown,
            ));
        }
        Arc::new(Auditor {
            config,
            mac: Hmac::<Sha256>::new_from_slice(&key).expect("any key length"),
            replica,
            tx,
            writer,
            queued: AtomicU64::new(0),
        })
    }

    pub fn enabled(&self) -> bool {
        self.config.enabled
    }

    /// A ticket for a client's request, if it is audited (see [`audited`]); `plugin` is the
    /// plugin it was routed to, when one was found.
    pub fn call(
        self: &Arc<Self>,
        who: Who<'_>,
        method: &str,
        plugin: Option<&str>,
        params: Option<&RawValue>,
    ) -> Result<Option<Ticket>, Full> {
        if !self.config.enabled || !audited(method) {
            return Ok(None);
        }
        let (target, arguments) = params::read(params);
        self.call_read(who, method, plugin, target.as_deref(), arguments)
    }

    /// [`Auditor::call`] of a request whose params were read already: the `name` or `uri`
    /// they target, and their `arguments` as sent. The ticket holds its record's room in the
    /// queue from now on; [`Full`] when there is none (the call must not run).
    pub fn call_read(
        self: &Arc<Self>,
        who: Who<'_>,
        method: &str,
        plugin: Option<&str>,
        target: Option<&str>,
        arguments: Option<&str>,
    ) -> Result<Option<Ticket>, Full> {
        if !self.config.enabled || !audited(method) {
            return Ok(None);
        }
        let record = self.call_record(who, method, plugin, target, arguments);
        // Room for what the record may still gain (the plugin's name, once routed).
        let weight = record.weight() + 128;
        let Some(held) = self.writer.room.take(Class::Call, who.caller, weight) else {
            crate::metrics::get().audit_dropped.inc();
            return Err(Full);
        };
        Ok(Some(Ticket {
            auditor: self.clone(),
            started: Instant::now(),
            record: Some(Box::new(record)),
            held: Some(held),
        }))
    }

    fn call_record(
        &self,
        who: Who<'_>,
        method: &str,
        plugin: Option<&str>,
        target: Option<&str>,
        arguments: Option<&str>,
    ) -> Record {
        let mut record = self.record(method, who);
        record.plugin = plugin.map(str::to_owned);
        record.target = target.map(|t| bounded(t, 512));
        record.arguments = arguments.map(|a| self.arguments(a));
        record
    }

    /// Records requests refused before they were routed (not allowed, over a rate limit)
    /// with the HTTP `status` they were answered with: one audited request among `requests`
    /// (method, plugin if known, params) as its own record; several (a batch) as one record,
    /// of the first, with their count. Nothing ran, so this uses only the queue's first half.
    pub fn refused<'a>(
        self: &Arc<Self>,
        who: Who<'_>,
        requests: impl Iterator<Item = (&'a str, Option<&'a str>, Option<&'a RawValue>)>,
        status: u16,
    ) {
        if !self.config.enabled {
            return;
        }
        let mut audited = requests.filter(|(method, ..)| audited(method));
        let Some((method, plugin, params)) = audited.next() else {
            return;
        };
        let others = audited.count();
        let (target, arguments) = params::read(params);
        let mut record = self.call_record(who, method, plugin, target.as_deref(), arguments);
        record.outcome = Outcome::Refused;
        record.error_code = Some(status.into());
        if others > 0 {
            record.count = Some(others as i64 + 1);
        }
        self.submit(record, Class::Other, who.caller);
    }

    /// Records an admin action: `action` such as `plugin.disable`, on `plugin` if it names
    /// one, by `subject`, answered with `status` after `took`.
    pub fn admin(
        &self,
        subject: &str,
        action: &str,
        plugin: Option<&str>,
        status: u16,
        took: Duration,
    ) {
        if !self.config.enabled {
            return;
        }
        let mut record = self.record("admin", Who::default());
        record.at_ms -= took.as_millis() as i64;
        record.subject = Some(subject.to_owned());
        record.plugin = plugin.map(|p| bounded(p, 256));
        record.target = Some(action.to_owned());
        record.duration_us = took.as_micros() as i64;
        if (200..300).contains(&status) {
            record.outcome = Outcome::Ok;
        } else {
            record.outcome = Outcome::Error;
            record.error_code = Some(status.into());
        }
        self.submit(record, Class::Other, None);
    }

    /// Records a failed authentication on the admin listener (`action`: the API's bearer
    /// token or the console's sign-in) from `address`: no subject (nobody was let in), the
    /// address as the client, an error with 401, as any refused admin action. The admin listener's throttle bounds how many one address
    /// adds.
    pub fn auth_failed(&self, action: &str, address: std::net::IpAddr, took: Duration) {
        if !self.config.enabled {
            return;
        }
        let mut record = self.record("admin", Who::default());
        record.at_ms -= took.as_millis() as i64;
        let client = format!("address {address}");
        record.target = Some(action.to_owned());
        record.duration_us = took.as_micros() as i64;
        record.outcome = Outcome::Error;
        record.error_code = Some(401);
        record.client = Some(client.clone());
        self.submit(record, Class::Other, Some(&client));
    }

    /// Records what happened to a person's own credential (kind `credential`): `action`
    /// (`connect`, `disconnect`, ...) by or for `subject`, on credential `credential` (the
    /// record's target; never its value), answered with HTTP `status`.
    pub fn credential(&self, subject: &str, action: &str, credential: &str, status: u16) {
        if !self.config.enabled {
            return;
        }
        let mut record = self.record("credential", Who::default());
        record.subject = Some(bounded(subject, 256));
        record.target = Some(format!("{action} {}", bounded(credential, 64)));
        if (200..300).contains(&status) {
            record.outcome = Outcome::Ok;
        } else {
            record.outcome = Outcome::Refused;
            record.error_code = Some(status.into());
        }
        self.submit(record, Class::Other, Some(subject));
    }

    /// Stored records, newest first.
    pub async fn query(&self, filter: &Filter) -> Result<Vec<Record>, StoreError> {
        self.writer.store.query(filter).await
    }

    /// Waits (a few seconds at most) until what was submitted before is stored: for a
    /// stop, and for whoever wants to read what just happened.
    pub async fn flush(&self) {
        if !self.config.enabled {
            return;
        }
        let target = self.queued.load(Ordering::Acquire);
        let w = &self.writer;
        let _ = tokio::time::timeout(STORE_TIMEOUT, async {
            while w.handled.load(Ordering::Acquire) < target {
                let flushed = w.flushed.notified();
                w.flush.notify_one();
                flushed.await;
            }
        })
        .await;
    }

    fn record(&self, kind: &str, who: Who<'_>) -> Record {
        let now = time::now_ms();
        Record {
            // Time first: ids sort by time.
            id: record_id(now, rand::random()),
            at_ms: now,
            kind: kind.to_owned(),
            subject: who.subject.map(|s| bounded(s, 256)),
            session: who
                .session
                .map(|s| s.chars().take(SESSION_PREFIX).collect()),
            client: who.client.map(|c| bounded(c, 256)),
            plugin: None,
            credentials: None,
            target: None,
            outcome: Outcome::NoAnswer,
            error_code: None,
            duration_us: 0,
            arguments: None,
            replica: Some(self.replica.to_string()),
            count: None,
        }
    }

    /// Arguments as a record keeps them.
    fn arguments(&self, raw: &str) -> String {
        if self.config.include_arguments && raw.len() <= MAX_ARGUMENT_BYTES {
            return raw.to_owned();
        }
        let mut out = hmac_hex(&self.mac, canonical(raw).as_bytes());
        if self.config.include_arguments {
            out.push_str(" (too long)");
        }
        out
    }

    /// Queues a record that holds no room yet (not a call's): dropped and counted when the
    /// queue has no room for it.
    fn submit(&self, record: Record, class: Class, caller: Option<&str>) {
        match self.writer.room.take(class, caller, record.weight()) {
            Some(held) => self.queue(record, held),
            None => crate::metrics::get().audit_dropped.inc(),
        }
    }

    /// Queues a record into the room it holds.
    fn queue(&self, record: Record, held: Held) {
        let m = crate::metrics::get();
        // Counted before it is queued, so a flush that begins once it is queued waits for it.
        self.queued.fetch_add(1, Ordering::AcqRel);
        match self.tx.try_send(Queued { record, held }) {
            Ok(()) => m.audit_records.inc(),
            Err(e) => {
                // The room held guarantees a place; only a stopped writer gets here. Done
                // with, as far as a flush is concerned.
                self.writer.handled.fetch_add(1, Ordering::AcqRel);
                self.writer.room.give_back(e.into_inner().held);
                m.audit_dropped.inc();
            }
        }
    }
}

/// `now` as 12 hexadecimal digits, then `random` as 16.
fn record_id(now: i64, random: u64) -> String {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let mut id = String::with_capacity(28);
    for (n, digits) in [(now as u64, 12), (random, 16)] {
        for shift in (0..digits).rev() {
            id.push(HEX[((n >> (shift * 4)) & 15) as usize] as char);
        }
    }
    id
}

/// At most `max` bytes of `s` (on a character boundary), so a hostile name cannot swell the
/// log.
fn bounded(s: &str, max: usize) -> String {
    if s.len() <= max {
        return s.to_owned();
    }
    let mut end = max;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…", &s[..end])
}

/// A request's ticket, if it has one, told how the request ended.
pub trait Ends {
    fn ended(&mut self, outcome: Outcome, code: Option<i64>);
}

impl Ends for Option<Ticket> {
    fn ended(&mut self, outcome: Outcome, code: Option<i64>) {
        if let Some(t) = self {
            t.set(outcome, code);
        }
    }
}

/// A request's record in the making: travels with the request; dropped, it is submitted.
pub struct Ticket {
    auditor: Arc<Auditor>,
    started: Instant,
    record: Option<Box<Record>>,
    /// The record's room in the queue, taken when the ticket was made.
    held: Option<Held>,
}

impl Ticket {
    /// The plugin answered with `result`.
    pub fn result(&mut self, result: &RawValue) {
        let tool_error = self.is_call() && crate::jsonrpc::is_tool_error(result.get());
        self.set(
            if tool_error {
                Outcome::ToolError
            } else {
                Outcome::Ok
            },
            None,
        );
    }

    /// The request was answered with JSON-RPC error `error`.
    pub fn error(&mut self, error: &RawValue) {
        #[derive(Deserialize)]
        struct Code {
            code: Option<i64>,
        }
        let code = serde_json::from_str::<Code>(error.get())
            .ok()
            .and_then(|c| c.code);
        self.set(Outcome::Error, code);
    }

    /// How it ended, when not by an answer.
    pub fn set(&mut self, outcome: Outcome, code: Option<i64>) {
        if let Some(r) = &mut self.record {
            r.outcome = outcome;
            r.error_code = code;
        }
    }

    /// The plugin it went to, when known only after routing.
    pub fn set_plugin(&mut self, plugin: &str) {
        if let Some(r) = &mut self.record
            && r.plugin.is_none()
        {
            r.plugin = Some(plugin.to_owned());
        }
    }

    /// The caller's own credentials its plugin was started with, by name (comma-separated).
    pub fn set_credentials(&mut self, names: &str) {
        if let Some(r) = &mut self.record {
            r.credentials = Some(names.to_owned());
        }
    }

    /// Whether it is a `tools/call` (whose result may be a tool error).
    pub fn is_call(&self) -> bool {
        self.record
            .as_deref()
            .is_some_and(|r| r.kind == "tools/call")
    }
}

impl Ticket {
    /// The request will not be made after all (another request with it found no room): no
    /// record, and its room is given back.
    pub fn withdraw(mut self) {
        self.record = None;
        if let Some(held) = self.held.take() {
            self.auditor.writer.room.give_back(held);
        }
    }
}

impl Drop for Ticket {
    fn drop(&mut self) {
        if let (Some(mut record), Some(mut held)) = (self.record.take(), self.held.take()) {
            record.duration_us = self.started.elapsed().as_micros() as i64;
            self.auditor.writer.room.settle(&mut held);
            self.auditor.queue(*record, held);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn long_values_are_cut_on_a_character_boundary() {
        assert_eq!(bounded("abc", 5), "abc");
        assert_eq!(bounded("ééé", 3), "é…");
    }

    #[test]
    fn ids_are_the_time_then_random_bits_in_hexadecimal() {
        let now = 1_795_925_710_123;
        let random = 0x0123_4567_89ab_cdef;
        assert_eq!(record_id(now, random), format!("{now:012x}{random:016x}"));
        assert_eq!(record_id(5, u64::MAX).len(), 28);
    }

    #[test]
    fn outcomes_read_back() {
        for o in [
            "ok",
            "tool_error",
            "error",
            "refused",
            "timeout",
            "cancelled",
            "no_answer",
        ] {
            assert_eq!(Outcome::parse(o).unwrap().as_str(), o);
        }
        assert!(Outcome::parse("OK").is_none());
    }
}
