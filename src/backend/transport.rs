//! The seam between a plugin connection and however the plugin's bytes travel.
//!
//! A transport carries newline-delimited JSON-RPC: [`PluginTransport::send`] takes one message
//! (without its newline) and the inbound side is a stream of lines that ends when the plugin
//! is gone. Stdio child processes implement it today; another process model or a remote
//! plugin implements the same two halves.

use std::future::Future;
use std::pin::Pin;

use bytes::Bytes;

/// The receiving half of a transport: one item per line the plugin wrote; it ends when the
/// plugin is gone. The connection's task polls it directly, with no task in between.
pub type Inbound = Pin<Box<dyn futures_util::Stream<Item = Bytes> + Send>>;

/// Why a message could not be queued for a plugin.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum SendError {
    #[error("it can no longer take input")]
    Closed,
    /// The plugin is not reading: its queue holds its limit.
    #[error("it is not reading its input ({messages} messages, {bytes} bytes wait for it)")]
    Full { messages: usize, bytes: usize },
}

pub trait PluginTransport: Send + Sync + 'static {
    /// Queues one message for the plugin. A `tag` (a request's id) lets a message still
    /// queued whole be [withdrawn](Self::withdraw).
    fn send(&self, message: Bytes, tag: Option<u64>) -> Result<(), SendError>;

    /// Takes a tagged message out of the queue if none of it went to the plugin yet; true if
    /// it did (the plugin never sees it).
    fn withdraw(&self, tag: u64) -> bool;

    /// Stops the plugin and waits until it is gone. Idempotent.
    fn shutdown(&self) -> Pin<Box<dyn Future<Output = ()> + Send + '_>>;

    /// How the plugin ended, once it has (for error messages).
    fn exit_reason(&self) -> Option<String>;

    /// Waits briefly for the plugin's end to be known, then describes it.
    fn wait_exit_reason(&self) -> Pin<Box<dyn Future<Output = String> + Send + '_>>;

    /// The last lines the plugin wrote to its error output, for diagnosing a failed start.
    fn stderr_tail(&self) -> Vec<String>;

    /// True once the plugin has written all it will without being asked again: everything
    /// it wrote has been read and handed on, and it is waiting. `None` where that cannot be
    /// told (then whoever asks waits a while instead).
    fn settled(&self) -> Option<bool> {
        None
    }

    /// Whether a plugin of unknown era is asked `server/discover` before `initialize`: true
    /// where each request's era is its own (HTTP, as the 2026-07-28 Streamable HTTP
    /// transport's backward compatibility has clients do), false where the first request
    /// decides a process's era (stdio; see `connection::era`).
    fn modern_first(&self) -> bool {
        false
    }

    /// The operating-system process id, where there is one.
    fn pid(&self) -> Option<u32>;

    /// Writes the file of `${credential_file:NAME}` again with `value`, in place, if the
    /// instance has one; whether it did.
    fn rewrite_credential_file(&self, _name: &str, _value: &str) -> bool {
        false
    }
}
