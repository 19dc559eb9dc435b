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

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::backend::{PluginConnection, RELATED_TASK};

/// Tasks one session may have at once.
pub const MAX_TASKS: usize = 256;
/// Longest a task is remembered, whatever `ttl` its plugin gave (also for `ttl: null`).
pub const MAX_TTL: Duration = Duration::from_secs(24 * 3600);

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
}

impl Tasks {
    /// Whether another task may be created now (expired tasks are forgotten first).
    pub fn has_room(&self) -> bool {
        let mut entries = self.entries.lock().expect("tasks lock");
        purge(&mut entries, Instant::now());
        entries.len() < MAX_TASKS
    }

    /// Records a task `conn` created under `local`, kept for `ttl` (capped), and returns the
    /// id the client is given. Should the table be full (requests raced past
    /// [`has_room`](Self::has_room)), the task that would expire first is forgotten.
    pub fn add(
        &self,
        conn: &Arc<PluginConnection>,
        local: &str,
        ttl: Option<Duration>,
    ) -> Arc<str> {
        let public: Arc<str> = Arc::from(format!("{:032x}", rand::random::<u128>()));
        let now = Instant::now();
        let entry = Entry {
            plugin: Arc::from(conn.name()),
            conn: Arc::downgrade(conn),
            local: Arc::from(local),
            expires: now + ttl.map_or(MAX_TTL, |t| t.min(MAX_TTL)),
            seq: self.next_seq.fetch_add(1, Ordering::Relaxed),
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
        let (transport, inbound) = StdioTransport::spawn(&config, "test").unwrap();
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
        let pa = tasks.add(&a, "task-1", None);
        let pb = tasks.add(&b, "task-1", None);
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
        let gone = tasks.add(&a, "short", Some(Duration::ZERO));
        assert!(tasks.get(&gone).is_none(), "its ttl is over");
        let first = tasks.add(&a, "first", Some(Duration::from_secs(60)));
        for i in 1..MAX_TASKS {
            tasks.add(&a, &format!("t{i}"), Some(Duration::from_secs(600)));
        }
        assert!(!tasks.has_room());
        let last = tasks.add(&a, "one too many", None);
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
