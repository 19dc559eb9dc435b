//! A plugin run as a child process speaking newline-delimited JSON-RPC on stdin/stdout.
//!
//! The child leads its own process group, so stopping it takes everything it started (`npx`
//! runs a shell that runs node); what left the group is found by [`super::orphans`]. Stopping follows the MCP stdio transport: close stdin, wait,
//! SIGTERM, wait, SIGKILL. Dropping a [`StdioTransport`] that was not stopped kills the group
//! at once, so no path leaves an orphan; the exit watcher reaps the child, so none leaves a
//! zombie. Stderr is logged by [`super::stderr`].

use std::future::Future;
use std::pin::Pin;
use std::process::Stdio;
use std::sync::Arc;
use std::time::Duration;

use bytes::{Buf, Bytes, BytesMut};
use futures_util::StreamExt;
use nix::sys::signal::{Signal, killpg};
use nix::unistd::Pid;
use tokio::net::unix::pipe;
use tokio::process::Command;
use tokio::sync::watch;
use tokio_util::codec::{Decoder, FramedRead};
use tokio_util::sync::CancellationToken;

use super::BackendError;
use super::orphans::{self, Instance};
use super::pipe_writer::PipeWriter;
use super::transport::{Inbound, PluginTransport, SendError};
use crate::config::{PluginConfig, Reference, Scheduling};

/// Largest line accepted from a plugin; a longer one is dropped whole (and logged).
pub const MAX_LINE: usize = 64 * 1024 * 1024;

pub struct StdioTransport {
    plugin: String,
    session: String,
    pid: Pid,
    to_child: Arc<PipeWriter>,
    close_stdin: CancellationToken,
    exit: watch::Receiver<Option<String>>,
    stderr: super::stderr::Tail,
    /// Cancelled once stderr is read to its end.
    stderr_done: CancellationToken,
    grace: Duration,
    stopped: tokio::sync::OnceCell<()>,
    /// Its processes, wherever they went.
    instance: Instance,
    /// Whether it has written all it will for now (see [`super::settle`]).
    settle: Option<Arc<super::settle::Settle>>,
    /// Where its `${credential_file:NAME}` files are, when it has a sandbox.
    files: Option<super::sandbox::CredentialFiles>,
}

impl StdioTransport {
    /// Starts the child, with `personal` standing for `${credential:NAME}` in its `env` and
    /// `args`. `session` only labels log lines.
    pub fn spawn(
        config: &PluginConfig,
        session: &str,
        personal: Option<&super::Personal>,
    ) -> Result<(StdioTransport, Inbound), BackendError> {
        if let Some(cwd) = config.cwd.as_deref().filter(|d| !d.is_dir()) {
            return Err(BackendError::Spawn {
                plugin: config.name.clone(),
                command: config.command_line(),
                reason: format!(
                    "its working directory (cwd) `{}` does not exist or is not a directory",
                    cwd.display()
                ),
            });
        }
        // Marks every process it starts, so what leaves its group is found when it stops.
        let instance = Instance::new();
        let (mark, id) = instance.mark();
        let spawn_error = |reason: String| BackendError::Spawn {
            plugin: config.name.clone(),
            command: config.command_line(),
            reason,
        };
        let mut sandbox =
            super::sandbox::prepare(config, &id).map_err(|e| spawn_error(e.to_string()))?;
        let (env, args) = match expand_all(config, personal, sandbox.as_ref()) {
            Ok(expanded) => expanded,
            Err(e) => {
                if let Some(s) = sandbox {
                    s.finish();
                }
                return Err(e);
            }
        };
        let mut cmd = Command::new(&config.command);
        // A clean environment: nothing of the gateway's but these, then the sandbox's own
        // directories, then what the plugin's definition names.
        cmd.env_clear();
        for var in ["PATH", "LANG", "TZ"] {
            if let Some(v) = std::env::var_os(var) {
                cmd.env(var, v);
            }
        }
        match &sandbox {
            Some(s) => {
                cmd.envs(s.env.iter().map(|(k, v)| (k, v)));
            }
            None => {
                if let Some(home) = std::env::var_os("HOME") {
                    cmd.env("HOME", home);
                }
            }
        }
        cmd.args(&args)
            .envs(env)
            .env(mark, id)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .process_group(0)
            .kill_on_drop(false);
        if let Some(cwd) = &config.cwd {
            cmd.current_dir(cwd);
        }
        if let Some(s) = &mut sandbox {
            s.install(&mut cmd);
        }
        let spawned = instance.spawn(|| cmd.spawn(), |c| c.id());
        drop(cmd);
        let mut child = match spawned {
            Ok(c) => {
                if let (Some(s), Some(pid)) = (&mut sandbox, c.id()) {
                    s.spawned(pid);
                }
                c
            }
            Err(e) => {
                if let Some(s) = sandbox {
                    s.finish();
                }
                return Err(spawn_error(e.to_string()));
            }
        };
        let pid = Pid::from_raw(child.id().expect("a just-spawned child has a pid") as i32);
        if config.scheduling == Scheduling::Batch
            && let Err(e) = set_batch_policy(pid)
        {
            tracing::debug!(plugin = %config.name, session, "plugin keeps the normal scheduling policy: {e}");
        }
        let stdin = child.stdin.take().expect("stdin is piped");
        let stdout = child.stdout.take().expect("stdout is piped");
        let stderr = child.stderr.take().expect("stderr is piped");

        // Stdin: written from the sender's task; closing stdin is cancelling `close_stdin`.
        let close_stdin = CancellationToken::new();
        let stdin = stdin
            .into_owned_fd()
            .and_then(pipe::Sender::from_owned_fd)
            .map_err(|e| {
                // Started but unusable: take it down rather than leave it orphaned.
                let _ = killpg(pid, Signal::SIGKILL);
                BackendError::Spawn {
                    plugin: config.name.clone(),
                    command: config.command_line(),
                    reason: format!("stdin: {e}"),
                }
            })?;
        let to_child = PipeWriter::start(stdin, close_stdin.clone());

        // Stdout: read by the connection's own task, line by line; it ends at EOF.
        let label = (config.name.clone(), session.to_owned());
        let failed = label.clone();
        let settle = super::settle::Settle::new(pid.as_raw() as u32, &stdout).map(Arc::new);
        let framed = FramedRead::new(stdout, LineCodec::default());
        let framed: Pin<Box<dyn futures_util::Stream<Item = std::io::Result<Line>> + Send>> =
            match &settle {
                Some(settle) => Box::pin(super::settle::Watched::new(framed, settle.clone())),
                None => Box::pin(framed),
            };
        let lines = framed
            .take_while(move |frame| {
                if let Err(e) = frame {
                    tracing::debug!(plugin = %failed.0, session = %failed.1, "plugin stdout: {e}");
                }
                std::future::ready(frame.is_ok())
            })
            .filter_map(move |frame| {
                std::future::ready(match frame {
                    Ok(Line::Data(line)) if !line.iter().all(u8::is_ascii_whitespace) => Some(line),
                    Ok(Line::TooLong) => {
                        tracing::warn!(
                            plugin = %label.0, session = %label.1,
                            "dropped a line longer than {MAX_LINE} bytes from the plugin"
                        );
                        None
                    }
                    _ => None,
                })
            });

        // Stderr: logged line by line, each line capped, the tail kept.
        let (tail, stderr_done) =
            super::stderr::spawn(stderr, config.name.clone(), session.to_owned());

        let files = sandbox
            .as_ref()
            .and_then(super::sandbox::Prepared::credential_files);
        // Exit watcher: owns the child, reaps it, publishes how it ended.
        let (exit_tx, exit) = watch::channel(None);
        tokio::spawn(async move {
            let mut reason = match child.wait().await {
                Ok(status) => status.to_string(),
                Err(e) => format!("wait failed: {e}"),
            };
            if let Some(bound) = sandbox.and_then(super::sandbox::Prepared::finish) {
                reason = format!("{reason}: {bound}");
            }
            orphans::reaped(pid.as_raw() as u32);
            let _ = exit_tx.send(Some(reason));
        });

        tracing::info!(plugin = %config.name, session, pid = pid.as_raw(), command = %config.command_line(), "plugin started");
        Ok((
            StdioTransport {
                plugin: config.name.clone(),
                session: session.to_owned(),
                pid,
                to_child,
                close_stdin,
                exit,
                stderr: tail,
                stderr_done,
                grace: config.shutdown_grace,
                stopped: tokio::sync::OnceCell::new(),
                instance,
                settle,
                files,
            },
            Box::pin(lines),
        ))
    }

    fn exited(&self) -> bool {
        self.exit.borrow().is_some()
    }

    async fn wait_exit(&self, within: Duration) -> bool {
        let mut exit = self.exit.clone();
        tokio::time::timeout(within, exit.wait_for(Option::is_some))
            .await
            .is_ok()
    }

    fn group_alive(&self) -> bool {
        killpg(self.pid, None).is_ok()
    }

    /// close stdin, wait, SIGTERM, wait, SIGKILL; then the same for anything left in the group.
    async fn stop(&self) {
        self.close_stdin.cancel();
        if !self.wait_exit(self.grace).await {
            tracing::debug!(plugin = %self.plugin, session = %self.session, "plugin ignored stdin close; SIGTERM");
            let _ = killpg(self.pid, Signal::SIGTERM);
            if !self.wait_exit(self.grace).await {
                tracing::warn!(plugin = %self.plugin, session = %self.session, "plugin ignored SIGTERM; SIGKILL");
                let _ = killpg(self.pid, Signal::SIGKILL);
                self.wait_exit(Duration::from_secs(5)).await;
            }
        }
        // The leader is gone; members it left behind get the same sequence.
        if self.group_alive() {
            let _ = killpg(self.pid, Signal::SIGTERM);
            let deadline = tokio::time::Instant::now() + self.grace;
            while self.group_alive() && tokio::time::Instant::now() < deadline {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            let _ = killpg(self.pid, Signal::SIGKILL);
        }
        // What left the group (`setsid`) and was adopted by the gateway goes now.
        self.instance.finish().await;
        tracing::info!(plugin = %self.plugin, session = %self.session, pid = self.pid.as_raw(), "plugin stopped");
    }
}

/// Puts the child under `SCHED_BATCH` (see [`Scheduling::Batch`]). What it forks from then on
/// inherits the policy; set from here rather than between fork and exec, so that spawning
/// keeps the cheap `posix_spawn` path (a `pre_exec` hook forces a full fork of the gateway).
/// The gateway's one `unsafe` block (the crate denies them elsewhere): neither `nix` nor
/// `rustix` wraps `sched_setscheduler`.
#[cfg(target_os = "linux")]
#[allow(unsafe_code)]
fn set_batch_policy(pid: Pid) -> std::io::Result<()> {
    use nix::libc;
    let param = libc::sched_param { sched_priority: 0 };
    // SAFETY: a plain system call; `param` outlives it and priority 0 is what SCHED_BATCH takes.
    if unsafe { libc::sched_setscheduler(pid.as_raw(), libc::SCHED_BATCH, &param) } == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

#[cfg(not(target_os = "linux"))]
fn set_batch_policy(_pid: Pid) -> std::io::Result<()> {
    Ok(())
}

impl PluginTransport for StdioTransport {
    fn rewrite_credential_file(&self, name: &str, value: &str) -> bool {
        let Some(files) = &self.files else {
            return false;
        };
        if self.exited() {
            return false;
        }
        match files.rewrite(name, value) {
            Ok(done) => done,
            Err(e) => {
                tracing::warn!(plugin = %self.plugin, session = %self.session, credential = name, "the credential's file was not written again: {e}");
                false
            }
        }
    }

    fn send(&self, message: Bytes, tag: Option<u64>) -> Result<(), SendError> {
        if self.exited() {
            return Err(SendError::Closed);
        }
        self.to_child.send(message, tag)
    }

    fn withdraw(&self, tag: u64) -> bool {
        self.to_child.withdraw(tag)
    }

    fn shutdown(&self) -> Pin<Box<dyn Future<Output = ()> + Send + '_>> {
        Box::pin(async move {
            self.stopped.get_or_init(|| self.stop()).await;
        })
    }

    fn exit_reason(&self) -> Option<String> {
        self.exit.borrow().clone()
    }

    fn wait_exit_reason(&self) -> Pin<Box<dyn Future<Output = String> + Send + '_>> {
        Box::pin(async move {
            self.wait_exit(Duration::from_millis(500)).await;
            // Its last stderr lines explain the exit: read them first (briefly: a grandchild
            // may hold stderr open).
            let _ = tokio::time::timeout(Duration::from_millis(200), self.stderr_done.cancelled())
                .await;
            self.exit_reason()
                .unwrap_or_else(|| "closed its output".into())
        })
    }

    fn stderr_tail(&self) -> Vec<String> {
        self.stderr
            .lock()
            .expect("stderr tail lock")
            .iter()
            .cloned()
            .collect()
    }

    fn settled(&self) -> Option<bool> {
        self.settle.as_ref()?.settled()
    }

    fn pid(&self) -> Option<u32> {
        Some(self.pid.as_raw() as u32)
    }
}

impl Drop for StdioTransport {
    fn drop(&mut self) {
        // Not stopped gracefully (a panic, a task dropped mid-way): take the whole group now.
        if self.stopped.get().is_none() && self.group_alive() {
            let _ = killpg(self.pid, Signal::SIGKILL);
        }
    }
}

/// One frame of a plugin's stdout.
#[derive(Debug, PartialEq, Eq)]
pub enum Line {
    /// A line, without its `\n` (or `\r\n`).
    Data(Bytes),
    /// A line longer than the cap, skipped.
    TooLong,
}

/// Splits stdout into lines without ever failing on content: a line over [`MAX_LINE`] is
/// skipped to its end and reported once. Never buffers more than the cap plus one read.
pub struct LineCodec {
    max_line: usize,
    discarding: bool,
    scanned: usize,
}

impl Default for LineCodec {
    fn default() -> LineCodec {
        LineCodec::with_max_line(MAX_LINE)
    }
}

impl LineCodec {
    /// A codec with another cap than [`MAX_LINE`] (the fuzz target uses a small one).
    pub fn with_max_line(max_line: usize) -> LineCodec {
        LineCodec {
            max_line,
            discarding: false,
            scanned: 0,
        }
    }
}

impl Decoder for LineCodec {
    type Item = Line;
    type Error = std::io::Error;

    fn decode(&mut self, buf: &mut BytesMut) -> Result<Option<Line>, std::io::Error> {
        loop {
            match buf[self.scanned..].iter().position(|b| *b == b'\n') {
                Some(pos) => {
                    let end = self.scanned + pos;
                    self.scanned = 0;
                    // Over the cap, whether or not its end came in the same read.
                    if std::mem::take(&mut self.discarding) || end > self.max_line {
                        buf.advance(end + 1);
                        return Ok(Some(Line::TooLong));
                    }
                    let mut line = buf.split_to(end + 1);
                    line.truncate(end);
                    if line.last() == Some(&b'\r') {
                        line.truncate(end - 1);
                    }
                    return Ok(Some(Line::Data(line.freeze())));
                }
                None if buf.len() > self.max_line => {
                    buf.clear();
                    self.scanned = 0;
                    self.discarding = true;
                }
                None => {
                    self.scanned = buf.len();
                    return Ok(None);
                }
            }
        }
    }

    fn decode_eof(&mut self, buf: &mut BytesMut) -> Result<Option<Line>, std::io::Error> {
        if let Some(line) = self.decode(buf)? {
            return Ok(Some(line));
        }
        self.scanned = 0;
        if buf.is_empty() || self.discarding {
            buf.clear();
            return Ok(None);
        }
        Ok(Some(Line::Data(buf.split().freeze())))
    }
}

/// A plugin's `env`, each variable with its value expanded.
type Expanded<'c> = Vec<(&'c String, String)>;

/// A plugin's `env` and `args` with their references expanded: `${NAME}` from the gateway's
/// environment (in `env` only), `${credential:NAME}` from `personal`, and
/// `${credential_file:NAME}` as the path of a file of the instance's own holding it (which
/// needs its sandbox, where the file is made).
fn expand_all<'c>(
    config: &'c PluginConfig,
    personal: Option<&super::Personal>,
    sandbox: Option<&super::sandbox::Prepared>,
) -> Result<(Expanded<'c>, Vec<String>), BackendError> {
    let unexpanded = |what: String, reason: String| BackendError::Spawn {
        plugin: config.name.clone(),
        command: config.command_line(),
        reason: format!("{what}: {reason}"),
    };
    let mut files: std::collections::HashMap<String, String> = std::collections::HashMap::new();
    let mut lookup = |r: Reference<'_>| match r {
        Reference::Env(name) => crate::config::env_var(name)
            .ok_or_else(|| format!("`${{{name}}}` is not set in the gateway's environment")),
        Reference::Credential(name) => personal
            .and_then(|p| p.values.get(name).cloned())
            .ok_or_else(|| format!("the caller's credential `{name}` was not given")),
        Reference::CredentialFile(name) => {
            if let Some(path) = files.get(name) {
                return Ok(path.clone());
            }
            let value = personal
                .and_then(|p| p.values.get(name))
                .ok_or_else(|| format!("the caller's credential `{name}` was not given"))?;
            let sandbox = sandbox.ok_or_else(|| {
                format!(
                    "`${{credential_file:{name}}}` needs the plugin sandbox, which makes the file"
                )
            })?;
            let path = sandbox
                .credential_file(name, value)
                .map_err(|e| format!("the file of credential `{name}`: {e}"))?
                .display()
                .to_string();
            files.insert(name.to_owned(), path.clone());
            Ok(path)
        }
    };
    let mut env = Vec::with_capacity(config.env.len());
    for (key, value) in &config.env {
        let value = crate::config::expand(value, &mut lookup)
            .map_err(|reason| unexpanded(format!("env {key}"), reason))?;
        env.push((key, value));
    }
    // Arguments are taken as written but for a credential's reference.
    let mut args = Vec::with_capacity(config.args.len());
    for (i, arg) in config.args.iter().enumerate() {
        let personal = crate::config::references(arg)
            .is_ok_and(|refs| refs.iter().any(|r| r.credential().is_some()));
        args.push(if personal {
            crate::config::expand(arg, &mut lookup)
                .map_err(|reason| unexpanded(format!("args[{i}]"), reason))?
        } else {
            arg.clone()
        });
    }
    Ok((env, args))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn decode_all(input: &[u8]) -> Vec<String> {
        let mut codec = LineCodec::default();
        let mut buf = BytesMut::from(input);
        let mut out = Vec::new();
        while let Some(line) = codec.decode(&mut buf).unwrap() {
            out.push(match line {
                Line::Data(b) => String::from_utf8_lossy(&b).into_owned(),
                Line::TooLong => "<too long>".into(),
            });
        }
        if let Some(Line::Data(b)) = codec.decode_eof(&mut buf).unwrap() {
            out.push(String::from_utf8_lossy(&b).into_owned());
        }
        out
    }

    #[test]
    fn splits_lines() {
        assert_eq!(decode_all(b"a\nb\r\nc"), ["a", "b", "c"]);
        assert_eq!(decode_all(b"\xff\xfe\n{}\n"), ["\u{fffd}\u{fffd}", "{}"]);
    }

    /// Found by the plugin_stdout fuzz target: a line past the cap whose end came in the same
    /// read was delivered whole.
    #[test]
    fn a_line_past_the_cap_is_dropped_even_when_it_arrives_whole() {
        let mut codec = LineCodec::with_max_line(8);
        let mut buf = BytesMut::from(&b"123456789\n12345678\n"[..]);
        assert_eq!(codec.decode(&mut buf).unwrap(), Some(Line::TooLong));
        assert_eq!(
            codec.decode(&mut buf).unwrap(),
            Some(Line::Data(Bytes::from_static(b"12345678")))
        );
        assert_eq!(codec.decode(&mut buf).unwrap(), None);
    }
}
