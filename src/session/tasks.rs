//! The tasks a session's client created on its plugins (2025-11-25 tasks), each under an id
//! of the gateway's own.
//!
//! When a plugin answers a task-augmented request with a task, the client is given a fresh
//! random id in place of the plugin's, and this table remembers which plugin instance runs it
//! and under which id. `tasks/get`, `tasks/result` and `tasks/cancel` find their plugin here,
//! so a task is reachable only from the session that created it (another session's table
//! does not hold it, and a shared plugin's ids are never shown), and two plugins that number
//! their tasks alike never meet. What the plugin later says about the task (its status
//! notifications, `_meta` that relates a request to it) has its id swapped back on the way
//! out, and the client's answers on the way in.
//!
//! The table is bounded: [`MAX_TASKS`] per session, each kept for the task's own `ttl` (at
//! most [`MAX_TTL`]), and all of it goes with the session. It never holds a plugin instance
//! alive.
//!
//! For a modern (2026-07-28) caller the table also keeps what the tasks extension needs and a
//! legacy plugin does not give: the requests a task sends its client (related-task `_meta`),
//! which wait here as the task's `inputRequests` until `tasks/update` answers them (bounded
//! like a bridged call's: [`MAX_INPUTS`], [`MAX_INPUT_BYTES`]), the capabilities the request
//! that created the task declared (what the task may ask), and what each plugin's tools say
//! of tasks (`execution.taskSupport`), learned from its `tools/list`.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

use serde_json::Value;
use serde_json::value::RawValue;

use super::Session;
use crate::backend::{PluginConnection, RELATED_TASK};
use crate::jsonrpc::{self, Id, Outcome, code};
use crate::protocol::mrtr;

/// Tasks one session may have at once.
pub const MAX_TASKS: usize = 256;
/// Longest a task is remembered, whatever `ttl` its plugin gave (also for `ttl: null`).
pub const MAX_TTL: Duration = Duration::from_secs(24 * 3600);
/// Requests one task may have waiting on its (modern) client.
pub const MAX_INPUTS: usize = 32;
/// Bytes of those requests.
pub const MAX_INPUT_BYTES: usize = 1024 * 1024;

/// One task, as the table keeps it.
struct Entry {
    /// The plugin that runs it.
    plugin: Arc<str>,
    /// The instance that runs it: its tasks are its own, another instance of the same plugin
    /// (a restart, another member of a shared pool) does not know them.
    conn: Weak<PluginConnection>,
    /// The plugin's own id.
    local: Arc<str>,
    /// When the table forgets it.
    expires: Instant,
    /// Creation order, for `tasks/list`.
    seq: u64,
    /// The capabilities the (modern) request that created it declared: what it may ask.
    declared: Option<Box<RawValue>>,
    /// Its requests waiting on a modern client, in the order they came.
    inputs: Vec<Input>,
}

/// A task's request to its modern client, waiting for `tasks/update`.
#[derive(Clone)]
pub struct Input {
    /// Its key in `inputRequests`: the number the session gave it among its requests to the
    /// client, so never used twice.
    pub key: String,
    pub n: u64,
    pub method: String,
    /// Its params, without the related-task `_meta` (the task is named at the root).
    pub params: Option<Box<RawValue>>,
    bytes: usize,
}

/// A task found by its public id: where requests about it go.
pub struct Found {
    pub plugin: Arc<str>,
    pub conn: Arc<PluginConnection>,
    /// The plugin's own id.
    pub local: Arc<str>,
}

/// The session's tasks by public id (see the module's doc).
#[derive(Default)]
pub struct Tasks {
    entries: Mutex<HashMap<Arc<str>, Entry>>,
    next_seq: AtomicU64,
    /// `execution.taskSupport` of each plugin's tools that have one, by plugin; forgotten
    /// when the plugin's tools change or its instance goes.
    support: Mutex<HashMap<String, Arc<HashMap<String, String>>>>,
}

impl Tasks {
    /// Whether another task may be created now (expired tasks are forgotten first).
    pub fn has_room(&self) -> bool {
        let mut entries = self.entries.lock().expect("tasks lock");
        purge(&mut entries, Instant::now());
        entries.len() < MAX_TASKS
    }

    /// Records a task `conn` created under `local`, kept for `ttl` (capped), and returns the
    /// id the client is given; `declared` is what a modern request that created it declared.
    /// Should the table be full (requests raced past [`has_room`](Self::has_room)), the task
    /// that would expire first is forgotten.
    pub fn add(
        &self,
        conn: &Arc<PluginConnection>,
        local: &str,
        ttl: Option<Duration>,
        declared: Option<Box<RawValue>>,
    ) -> Arc<str> {
        let public: Arc<str> = Arc::from(format!("{:032x}", rand::random::<u128>()));
        let now = Instant::now();
        let entry = Entry {
            plugin: Arc::from(conn.name()),
            conn: Arc::downgrade(conn),
            local: Arc::from(local),
            expires: now + ttl.map_or(MAX_TTL, |t| t.min(MAX_TTL)),
            seq: self.next_seq.fetch_add(1, Ordering::Relaxed),
            declared,
            inputs: Vec::new(),
        };
        let mut entries = self.entries.lock().expect("tasks lock");
        purge(&mut entries, now);
        if entries.len() >= MAX_TASKS
            && let Some(first) = entries
                .iter()
                .min_by_key(|(_, e)| e.expires)
                .map(|(k, _)| k.clone())
        {
            entries.remove(&first);
        }
        entries.insert(public.clone(), entry);
        public
    }

    /// The task behind a public id, if this session has it and its instance still runs (a
    /// task whose instance is gone is forgotten).
    pub fn get(&self, public: &str) -> Option<Found> {
        let mut entries = self.entries.lock().expect("tasks lock");
        let entry = entries.get(public)?;
        let conn = entry
            .conn
            .upgrade()
            .filter(|c| c.is_alive() && entry.expires > Instant::now());
        let Some(conn) = conn else {
            entries.remove(public);
            return None;
        };
        Some(Found {
            plugin: entry.plugin.clone(),
            conn,
            local: entry.local.clone(),
        })
    }

    /// Every task of the session still running somewhere, oldest first, with its public id.
    pub fn all(&self) -> Vec<(Arc<str>, Found)> {
        let mut entries = self.entries.lock().expect("tasks lock");
        purge(&mut entries, Instant::now());
        let mut found: Vec<(u64, Arc<str>, Found)> = entries
            .iter()
            .filter_map(|(public, e)| {
                let conn = e.conn.upgrade().filter(|c| c.is_alive())?;
                Some((
                    e.seq,
                    public.clone(),
                    Found {
                        plugin: e.plugin.clone(),
                        conn,
                        local: e.local.clone(),
                    },
                ))
            })
            .collect();
        found.sort_unstable_by_key(|(seq, ..)| *seq);
        found.into_iter().map(|(_, p, f)| (p, f)).collect()
    }

    /// Forgets a task (its plugin no longer knows it).
    pub fn forget(&self, public: &str) {
        self.entries.lock().expect("tasks lock").remove(public);
    }

    /// The public id of `conn`'s task `local`, if it is this session's.
    pub fn public_id(&self, conn: &PluginConnection, local: &str) -> Option<Arc<str>> {
        let entries = self.entries.lock().expect("tasks lock");
        entries
            .iter()
            .find(|(_, e)| std::ptr::eq(e.conn.as_ptr(), conn) && &*e.local == local)
            .map(|(k, _)| k.clone())
    }

    /// The plugin's own id of the public `public`, if `conn` runs it for this session.
    pub fn local_id(&self, conn: &PluginConnection, public: &str) -> Option<Arc<str>> {
        let entries = self.entries.lock().expect("tasks lock");
        entries
            .get(public)
            .filter(|e| std::ptr::eq(e.conn.as_ptr(), conn))
            .map(|e| e.local.clone())
    }
}

// === modern callers: a task's requests to its client, and the plugins' task support ===

impl Tasks {
    /// What the request that created task `public` declared, if the task is this table's.
    fn declared(&self, public: &str) -> Option<Option<Box<RawValue>>> {
        let entries = self.entries.lock().expect("tasks lock");
        entries.get(public).map(|e| e.declared.clone())
    }

    /// Adds a request of task `public` waiting on its client; the error says why not.
    fn add_input(&self, public: &str, input: Input) -> Result<(), String> {
        let mut entries = self.entries.lock().expect("tasks lock");
        let entry = entries
            .get_mut(public)
            .ok_or_else(|| "the task is no longer known".to_owned())?;
        let bytes: usize = entry.inputs.iter().map(|i| i.bytes).sum();
        if entry.inputs.len() >= MAX_INPUTS || bytes + input.bytes > MAX_INPUT_BYTES {
            return Err(format!(
                "too many requests of this task wait on the client already ({MAX_INPUTS} or {MAX_INPUT_BYTES} bytes at most)"
            ));
        }
        entry.inputs.push(input);
        Ok(())
    }

    /// The requests of task `public` waiting on its client, keeping those `waiting` says
    /// still wait (the others, withdrawn or gone with their instance, are forgotten).
    fn inputs(&self, public: &str, waiting: impl Fn(u64) -> bool) -> Vec<Input> {
        let mut entries = self.entries.lock().expect("tasks lock");
        let Some(entry) = entries.get_mut(public) else {
            return Vec::new();
        };
        entry.inputs.retain(|i| waiting(i.n));
        entry.inputs.clone()
    }

    /// Takes the requests of task `public` whose keys `answered` names.
    fn take_inputs(&self, public: &str, answered: impl Fn(&str) -> bool) -> Vec<Input> {
        let mut entries = self.entries.lock().expect("tasks lock");
        let Some(entry) = entries.get_mut(public) else {
            return Vec::new();
        };
        let (taken, left) = std::mem::take(&mut entry.inputs)
            .into_iter()
            .partition(|i| answered(&i.key));
        entry.inputs = left;
        taken
    }

    /// What a plugin's tools say of tasks (tool name to `taskSupport`), if learned.
    pub fn tool_support(&self, plugin: &str) -> Option<Arc<HashMap<String, String>>> {
        self.support
            .lock()
            .expect("support lock")
            .get(plugin)
            .cloned()
    }

    /// Remembers what a plugin's tools say of tasks.
    pub fn learn_tool_support(&self, plugin: &str, support: HashMap<String, String>) {
        self.support
            .lock()
            .expect("support lock")
            .insert(plugin.to_owned(), Arc::new(support));
    }

    /// Forgets what a plugin's tools said of tasks (they changed, or its instance went).
    pub fn forget_tool_support(&self, plugin: &str) {
        self.support.lock().expect("support lock").remove(plugin);
    }
}

impl Session {
    /// A plugin's request to a modern caller's client that names task `local` of `conn`
    /// (related-task `_meta`): it waits among the task's `inputRequests` for `tasks/update`,
    /// unless the task is not this caller's, or the request that created the task did not
    /// declare what it needs (refused to the plugin as a bridged call's would be).
    pub(super) fn task_input_request(
        &self,
        conn: &Arc<PluginConnection>,
        id: Id,
        method: &str,
        params: Option<&RawValue>,
        local: &str,
    ) {
        let refuse = |code: i64, message: String| {
            tracing::info!(plugin = %conn.name(), session = %self.id, "{method} refused: {message}");
            conn.send_raw(jsonrpc::error_bytes(Some(&id), code, &message));
        };
        let Some(public) = self.tasks.public_id(conn, local) else {
            return refuse(
                code::INVALID_PARAMS,
                format!(
                    "{method}: the task it relates to is not known to the gateway (expired, or not this client's)"
                ),
            );
        };
        let Some(declared) = self.tasks.declared(&public) else {
            return refuse(code::INVALID_PARAMS, format!("{method}: the task is gone"));
        };
        if !mrtr::INPUT_METHODS.iter().any(|(m, _)| *m == method) {
            return refuse(
                code::METHOD_NOT_FOUND,
                format!(
                    "{method} cannot reach this client: a task asks only for sampling, elicitation or roots"
                ),
            );
        }
        if let Some(cap) = mrtr::missing_capability(method, params, declared.as_deref()) {
            let code = if cap.contains('.') {
                code::INVALID_PARAMS
            } else {
                code::METHOD_NOT_FOUND
            };
            return refuse(
                code,
                format!("the client did not declare the `{cap}` capability"),
            );
        }
        let params = params.map(without_related_task);
        let n = self.next_server_request.fetch_add(1, Ordering::Relaxed);
        let input = Input {
            key: n.to_string(),
            n,
            method: method.to_owned(),
            bytes: method.len() + params.as_ref().map_or(0, |p| p.get().len()),
            params,
        };
        self.server_requests
            .lock()
            .expect("requests lock")
            .insert(n, (Arc::downgrade(conn), id.clone()));
        if let Err(why) = self.tasks.add_input(&public, input) {
            self.server_requests
                .lock()
                .expect("requests lock")
                .remove(&n);
            return refuse(code::INTERNAL_ERROR, format!("{method}: {why}"));
        }
        tracing::debug!(plugin = %conn.name(), session = %self.id, task = %public, "{method} waits on the client, as the task's input");
        self.task_changed(public);
    }

    /// The requests task `public` waits on its client for (its `inputRequests`).
    pub fn task_inputs(&self, public: &str) -> Vec<Input> {
        let requests = self.server_requests.lock().expect("requests lock");
        self.tasks.inputs(public, |n| requests.contains_key(&n))
    }

    /// Hands a client's `tasks/update` answers to the requests of task `public` they answer,
    /// each to the plugin as the response it waits for; an answer to anything else (a key
    /// never issued, answered already, or another task's) is ignored.
    pub fn answer_task_inputs(&self, public: &str, responses: HashMap<String, Box<RawValue>>) {
        let taken = self
            .tasks
            .take_inputs(public, |key| responses.contains_key(key));
        let mut responses = responses;
        for input in taken {
            if let Some(answer) = responses.remove(&input.key) {
                self.client_response(&Id::from_u64(input.n), &Outcome::Result(answer));
            }
        }
    }

    /// Forgets what task `public` waits on its client for (it was cancelled or has ended):
    /// nobody will answer it.
    pub fn drop_task_inputs(&self, public: &str) {
        let taken = self.tasks.take_inputs(public, |_| true);
        let mut requests = self.server_requests.lock().expect("requests lock");
        for input in taken {
            requests.remove(&input.n);
        }
    }
}

/// Params without the related-task `_meta` (and without `_meta` left empty by that).
fn without_related_task(params: &RawValue) -> Box<RawValue> {
    let unchanged = || params.to_owned();
    if !params.get().contains(RELATED_TASK) {
        return unchanged();
    }
    let Ok(mut value) = serde_json::from_str::<Value>(params.get()) else {
        return unchanged();
    };
    if let Some(meta) = value.get_mut("_meta").and_then(Value::as_object_mut) {
        meta.remove(RELATED_TASK);
        if meta.is_empty()
            && let Some(object) = value.as_object_mut()
        {
            object.remove("_meta");
        }
    }
    RawValue::from_string(value.to_string()).unwrap_or_else(|_| unchanged())
}

fn purge(entries: &mut HashMap<Arc<str>, Entry>, now: Instant) {
    entries.retain(|_, e| e.expires > now && e.conn.strong_count() > 0);
}

/// The task id in `value._meta[RELATED_TASK]`, to be read or replaced.
pub fn related_task_mut(value: &mut Value) -> Option<&mut Value> {
    value
        .get_mut("_meta")?
        .get_mut(RELATED_TASK)?
        .get_mut("taskId")
}

/// `ttl` of a task object: milliseconds, or `None` (no limit, or none given).
pub fn ttl_of(task: &Value) -> Option<Duration> {
    task.get("ttl")?.as_u64().map(Duration::from_millis)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::stdio::StdioTransport;
    use crate::config::PluginConfig;

    /// A live plugin instance that never answers: `cat`, with no handshake.
    fn instance(name: &str) -> Arc<PluginConnection> {
        let config = PluginConfig::new(name, "cat", vec![]);
        let (transport, inbound) = StdioTransport::spawn(&config, "test", None).unwrap();
        PluginConnection::new(
            Arc::from(name),
            Arc::from("test"),
            Box::new(transport),
            inbound,
            None,
            Duration::from_secs(5),
        )
    }

    #[tokio::test]
    async fn a_task_is_bound_to_its_instance_and_the_ids_never_meet() {
        let (a, b) = (instance("a"), instance("b"));
        let tasks = Tasks::default();
        let pa = tasks.add(&a, "task-1", None, None);
        let pb = tasks.add(&b, "task-1", None, None);
        assert_ne!(pa, pb);
        assert_ne!(&*pa, "task-1");
        assert_eq!(tasks.public_id(&a, "task-1"), Some(pa.clone()));
        assert_eq!(tasks.public_id(&b, "task-1"), Some(pb.clone()));
        assert_eq!(tasks.local_id(&b, &pa), None, "not b's task");
        assert_eq!(tasks.local_id(&a, &pa).as_deref(), Some("task-1"));
        let found = tasks.get(&pb).unwrap();
        assert_eq!((&*found.plugin, &*found.local), ("b", "task-1"));
        assert!(Arc::ptr_eq(&found.conn, &b));
        assert!(tasks.get("task-1").is_none());

        b.shutdown().await;
        assert!(tasks.get(&pb).is_none(), "its instance is gone");
        assert_eq!(tasks.all().len(), 1);
        a.shutdown().await;
    }

    #[tokio::test]
    async fn tasks_expire_and_the_table_is_bounded() {
        let a = instance("a");
        let tasks = Tasks::default();
        let gone = tasks.add(&a, "short", Some(Duration::ZERO), None);
        assert!(tasks.get(&gone).is_none(), "its ttl is over");
        let first = tasks.add(&a, "first", Some(Duration::from_secs(60)), None);
        for i in 1..MAX_TASKS {
            tasks.add(&a, &format!("t{i}"), Some(Duration::from_secs(600)), None);
        }
        assert!(!tasks.has_room());
        let last = tasks.add(&a, "one too many", None, None);
        assert_eq!(tasks.all().len(), MAX_TASKS);
        assert!(
            tasks.get(&first).is_none(),
            "the one expiring first made room"
        );
        assert!(tasks.get(&last).is_some());
        tasks.forget(&last);
        assert!(tasks.has_room());
        a.shutdown().await;
    }
}
