//! Messages between the replicas: Redis pub/sub, on channels named `<prefix><name>`
//! (`auth`, `registry`). A replica publishes on the connection its other calls use;
//! it hears the others on a connection of its own (a subscribed connection can do nothing
//! else), kept by [`Cluster::listen`]: subscribed at start, checked by a ping every few
//! seconds (a peer that vanished without closing the connection is found that way), and
//! opened again with backoff when it drops.
//!
//! Pub/sub delivers only to who is subscribed at the moment: a message published while a
//! replica is not listening is lost to it. So each [`Listener`] is told every time the
//! subscription is (re)made, and catches up from the record the message was about (the
//! database); until then, [`Cluster::hears`] is false. Messages are handled without waiting
//! on anything (a listener that has work to do hands it to a task of its own), so one slow
//! listener never holds up another's messages. A message longer than [`MAX_MESSAGE`] is
//! dropped: no replica sends one.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use futures_util::StreamExt;
use tokio_util::sync::CancellationToken;

use super::{Cluster, ClusterError};
use crate::metrics::RedisOp;

/// How often the subscribed connection is pinged.
const PING_EVERY: Duration = Duration::from_secs(5);
/// The first wait before subscribing again; it doubles up to [`MAX_BACKOFF`].
const FIRST_BACKOFF: Duration = Duration::from_millis(100);
const MAX_BACKOFF: Duration = Duration::from_secs(5);
/// The longest message handled.
pub(super) const MAX_MESSAGE: usize = 64 * 1024;

/// What a replica does with one channel's messages.
pub(super) trait Listener: Send + Sync + 'static {
    /// A message another replica (or this one) published. Must not block.
    fn message(&self, payload: &[u8]);
    /// The subscription was made (at start) or made again (after a loss): whatever was
    /// published meanwhile went unheard. Must not block.
    fn resubscribed(&self);
}

impl Cluster {
    /// The channel named `name`, under this cluster's prefix.
    pub(super) fn channel(&self, name: &str) -> String {
        self.key(&[name])
    }

    /// Publishes `payload` on `channel` (a full name, [`Cluster::channel`]).
    pub(super) async fn publish(&self, channel: &str, payload: &str) -> Result<(), ClusterError> {
        let mut c = self.conn.clone();
        let cmd = redis::cmd("PUBLISH").arg(channel).arg(payload).clone();
        self.call(RedisOp::Publish, async move {
            cmd.query_async::<i64>(&mut c).await
        })
        .await
        .map(|_| ())
    }

    /// Whether this replica hears the others' messages now (its subscription is up).
    pub fn hears(&self) -> bool {
        self.subscribed.load(Ordering::Acquire)
    }

    /// Hears the channels of `listeners` until `stop`, subscribing again (with backoff)
    /// whenever the subscription is lost.
    pub(super) async fn listen_on(
        self: Arc<Self>,
        listeners: Vec<(String, Arc<dyn Listener>)>,
        stop: CancellationToken,
    ) {
        let mut backoff = FIRST_BACKOFF;
        let mut lost_before = false;
        loop {
            let outcome = tokio::select! {
                r = self.subscribed_session(&listeners, lost_before) => r,
                () = stop.cancelled() => break,
            };
            self.subscribed.store(false, Ordering::Release);
            match outcome {
                // It was up a while: start the backoff afresh.
                Ok(()) => backoff = FIRST_BACKOFF,
                Err(e) => {
                    if !lost_before {
                        tracing::warn!("cluster messages: not subscribed ({e}); trying again");
                    }
                }
            }
            lost_before = true;
            tokio::select! {
                () = tokio::time::sleep(backoff) => {}
                () = stop.cancelled() => break,
            }
            backoff = (backoff * 2).min(MAX_BACKOFF);
        }
        self.subscribed.store(false, Ordering::Release);
    }

    /// One subscription, from connecting until it is lost: `Ok` when it was made and later
    /// lost (a warning is logged), `Err` when it could not be made.
    async fn subscribed_session(
        &self,
        listeners: &[(String, Arc<dyn Listener>)],
        lost_before: bool,
    ) -> Result<(), ClusterError> {
        let client = self.client.clone();
        let pubsub = self
            .call(RedisOp::Subscribe, async move {
                client.get_async_pubsub().await
            })
            .await?;
        let (mut sink, mut stream) = pubsub.split();
        let names: Vec<&str> = listeners.iter().map(|(n, _)| n.as_str()).collect();
        self.call(RedisOp::Subscribe, sink.subscribe(&names))
            .await?;
        self.subscribed.store(true, Ordering::Release);
        if lost_before {
            tracing::info!("cluster messages: subscribed again");
        }
        for (_, l) in listeners {
            l.resubscribed();
        }
        let mut ping =
            tokio::time::interval_at(tokio::time::Instant::now() + PING_EVERY, PING_EVERY);
        ping.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let why = loop {
            tokio::select! {
                msg = stream.next() => {
                    let Some(msg) = msg else { break "the connection closed".to_owned() };
                    let payload = msg.get_payload_bytes();
                    if payload.len() > MAX_MESSAGE {
                        tracing::warn!(channel = msg.get_channel_name(), bytes = payload.len(), "cluster messages: a message too long was dropped");
                        continue;
                    }
                    if let Some((_, l)) = listeners.iter().find(|(n, _)| n == msg.get_channel_name()) {
                        l.message(payload);
                    }
                }
                _ = ping.tick() => {
                    if let Err(e) = self.call(RedisOp::Subscribe, sink.ping::<redis::Value>()).await {
                        break e.to_string();
                    }
                }
            }
        };
        tracing::warn!("cluster messages: subscription lost ({why}); subscribing again");
        Ok(())
    }
}
