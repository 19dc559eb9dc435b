//! The gateway as the subreaper of its plugins' processes.
//!
//! Stopping a plugin takes its process group, but a descendant that called `setsid` (a
//! daemon, a detached helper) has left that group. So the gateway makes itself a child
//! subreaper (`PR_SET_CHILD_SUBREAPER`): such a process, once its parent is gone, becomes the
//! gateway's child instead of init's. Every plugin process is started with its instance's
//! mark in its environment ([`MARK`]), which whatever it starts inherits. A sweep looks at
//! the children the gateway adopted (not the plugins it started itself): one marked by an
//! instance that has stopped is killed, with its own process group; an unmarked one is
//! killed when the gateway stops; and a zombie is reaped, so none lingers. Sweeps run when an
//! instance stops, on every `SIGCHLD`, and every few seconds.
//!
//! It never waits on a process the gateway started itself (tokio reaps those: a spawn and
//! its registration happen under the lock sweeps take), and never signals a process that is
//! not the gateway's own child.

use std::collections::HashSet;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{LazyLock, Mutex, MutexGuard, Once};
use std::time::Duration;

use nix::sys::signal::{Signal, kill, killpg};
use nix::sys::wait::{WaitPidFlag, waitpid};
use nix::unistd::Pid;

/// The environment variable that marks a plugin instance's processes.
pub const MARK: &str = "MCP_GATEWAY_PLUGIN_INSTANCE";
/// How often adopted processes are looked at when no `SIGCHLD` comes.
const SWEEP_EVERY: Duration = Duration::from_secs(5);

#[derive(Default)]
struct State {
    /// Processes the gateway started itself (tokio waits on them), until reaped.
    leaders: HashSet<i32>,
    /// Instances whose processes may run.
    live: HashSet<u64>,
}

static STATE: LazyLock<Mutex<State>> = LazyLock::new(Mutex::default);
static NEXT: AtomicU64 = AtomicU64::new(1);
static START: Once = Once::new();

fn state() -> MutexGuard<'static, State> {
    STATE.lock().unwrap_or_else(|e| e.into_inner())
}

/// One plugin instance's processes: created before its process starts, finished once its
/// process group is gone.
pub struct Instance {
    id: u64,
}

impl Instance {
    /// A new instance; the first also makes the gateway a subreaper and starts the sweeps.
    pub fn new() -> Instance {
        START.call_once(start);
        let id = NEXT.fetch_add(1, Ordering::Relaxed);
        state().live.insert(id);
        Instance { id }
    }

    /// The environment variable that marks this instance's processes.
    pub fn mark(&self) -> (&'static str, String) {
        (MARK, self.id.to_string())
    }

    /// Starts the instance's process with `spawn`, registered as the gateway's own before
    /// any sweep can see it.
    pub fn spawn<T>(
        &self,
        spawn: impl FnOnce() -> std::io::Result<T>,
        pid: impl Fn(&T) -> Option<u32>,
    ) -> std::io::Result<T> {
        let mut st = state();
        let child = spawn()?;
        if let Some(p) = pid(&child) {
            st.leaders.insert(p as i32);
        }
        Ok(child)
    }

    /// Its process group is gone: what it left behind outside the group is killed now.
    pub async fn finish(&self) {
        state().live.remove(&self.id);
        let _ = tokio::task::spawn_blocking(|| sweep(false)).await;
    }
}

impl Drop for Instance {
    fn drop(&mut self) {
        // Not finished (dropped without a graceful stop): the next sweep takes its leftovers.
        state().live.remove(&self.id);
    }
}

/// A process the gateway started has been reaped (by tokio): its pid is no longer its own.
pub fn reaped(pid: u32) {
    state().leaders.remove(&(pid as i32));
}

/// The gateway stops: every adopted process is killed, marked or not.
pub async fn stop_all() {
    if START.is_completed() {
        let _ = tokio::task::spawn_blocking(|| sweep(true)).await;
    }
}

fn start() {
    #[cfg(target_os = "linux")]
    if let Err(e) = nix::sys::prctl::set_child_subreaper(true) {
        tracing::warn!(
            "cannot become the subreaper of plugin processes ({e}): a plugin's process that leaves its group may outlive it"
        );
    }
    let Ok(handle) = tokio::runtime::Handle::try_current() else {
        return;
    };
    handle.spawn(async {
        let mut sigchld =
            tokio::signal::unix::signal(tokio::signal::unix::SignalKind::child()).ok();
        loop {
            match sigchld.as_mut() {
                Some(s) => {
                    let _ = tokio::time::timeout(SWEEP_EVERY, s.recv()).await;
                }
                None => tokio::time::sleep(SWEEP_EVERY).await,
            }
            let _ = tokio::task::spawn_blocking(|| sweep(false)).await;
        }
    });
}

/// Reaps adopted zombies and kills adopted processes of finished instances (of every
/// instance, and unmarked ones too, when `all`).
fn sweep(all: bool) {
    let me = std::process::id();
    let st = state();
    for pid in children(me) {
        if st.leaders.contains(&(pid as i32)) {
            continue;
        }
        let target = Pid::from_raw(pid as i32);
        if is_zombie(pid) {
            let _ = waitpid(target, Some(WaitPidFlag::WNOHANG));
            continue;
        }
        let kill_it = match instance_of(pid) {
            Some(id) => all || !st.live.contains(&id),
            None => all,
        };
        if kill_it {
            tracing::info!(
                pid,
                "killing a process a plugin left behind outside its process group"
            );
            // After `setsid` it leads a group of its own: that goes too.
            if pgid(pid) == Some(pid) {
                let _ = killpg(target, Signal::SIGKILL);
            }
            let _ = kill(target, Signal::SIGKILL);
        }
    }
}

/// The gateway's children, from each of its threads' `children` list (or, without it, from
/// every process's parent).
fn children(me: u32) -> Vec<u32> {
    let mut out = Vec::new();
    match std::fs::read_dir(format!("/proc/{me}/task")) {
        Ok(tasks) => {
            for task in tasks.flatten() {
                match std::fs::read_to_string(task.path().join("children")) {
                    Ok(list) => out.extend(
                        list.split_whitespace()
                            .filter_map(|p| p.parse::<u32>().ok()),
                    ),
                    Err(_) => return children_by_scan(me),
                }
            }
        }
        Err(_) => return children_by_scan(me),
    }
    out
}

fn children_by_scan(me: u32) -> Vec<u32> {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    dir.flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter(|p| stat(*p).is_some_and(|f| f.get(1).and_then(|pp| pp.parse().ok()) == Some(me)))
        .collect()
}

/// `/proc/PID/stat` after the command name: state, ppid, pgrp, ...
fn stat(pid: u32) -> Option<Vec<String>> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let (_, rest) = text.rsplit_once(')')?;
    Some(rest.split_whitespace().take(3).map(str::to_owned).collect())
}

fn is_zombie(pid: u32) -> bool {
    stat(pid).is_some_and(|f| f.first().is_some_and(|s| s == "Z"))
}

fn pgid(pid: u32) -> Option<u32> {
    stat(pid)?.get(2)?.parse().ok()
}

/// The instance mark in a process's environment.
fn instance_of(pid: u32) -> Option<u64> {
    let environ = std::fs::read(format!("/proc/{pid}/environ")).ok()?;
    let prefix = format!("{MARK}=");
    environ
        .split(|b| *b == 0)
        .find_map(|var| var.strip_prefix(prefix.as_bytes()))
        .and_then(|v| std::str::from_utf8(v).ok()?.parse().ok())
}
