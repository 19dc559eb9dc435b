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

pub trait PluginTransport: Send + Sync + 'static {
    /// Queues one message for the plugin; false when the plugin can no longer take input.
    fn send(&self, message: Bytes) -> bool;

    /// Stops the plugin and waits until it is gone. Idempotent.
    fn shutdown(&self) -> Pin<Box<dyn Future<Output = ()> + Send + '_>>;

    /// How the plugin ended, once it has (for error messages).
    fn exit_reason(&self) -> Option<String>;

    /// Waits briefly for the plugin's end to be known, then describes it.
    fn wait_exit_reason(&self) -> Pin<Box<dyn Future<Output = String> + Send + '_>>;

    /// The last lines the plugin wrote to its error output, for diagnosing a failed start.
    fn stderr_tail(&self) -> Vec<String>;

    /// The operating-system process id, where there is one.
    fn pid(&self) -> Option<u32>;
}
