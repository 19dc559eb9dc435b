//! Cluster mode: several replicas behind a load balancer with no stickiness, sharing one Redis.
//!
//! A session belongs to the replica that created it: its plugin processes run there. The
//! session's record ([`RedisSessionStore`]) names that replica; a replica's liveness is a
//! heartbeat key with a short expiry, which also holds the address the others reach it at
//! ([`Cluster::owner_of`]). A request for a session another live replica owns is forwarded
//! to it ([`forward`]), with the cluster's secret, and the owner's answer (JSON or an SSE
//! stream) flows straight back.
//!
//! Beside the sessions, the replicas share through Redis what must hold wherever a request
//! lands: access-token revocations and key rotations ([`tokens`]), the registration limit
//! ([`throttle`]), the rate limits' buckets ([`ratelimit`]) and the admin API's registry changes
//! ([`registry`]), the first and last as
//! messages on pub/sub channels ([`bus`]) that each replica hears on a connection of its own.
//!
//! This module owns the connection to Redis (every call under a timeout), the replica's
//! identity and heartbeat, and the session records. Redis may be down at the start or go
//! away later: the connections are made on first use and made again after they break, and
//! until Redis answers every call fails within the timeout (readiness fails, `/mcp` answers
//! what needs Redis with 503), never the process. It never holds a session's live state:
//! that stays in [`crate::session`] on the owner. What it reads back from Redis is checked
//! like any other input: a record that does not parse is treated as missing, and what decides
//! where a request is forwarded (a record's owner, a heartbeat) is signed with the cluster's
//! secret and ignored when it does not verify ([`signing`]).

mod bus;
pub mod forward;
mod liveness;
pub mod owners;
pub mod ratelimit;
pub mod registry;
mod sessions;
pub mod signing;
#[cfg(test)]
mod tests;
pub mod throttle;
pub mod tokens;

use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::time::Duration;

use rand::RngCore;
use redis::AsyncCommands;
use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use tokio_util::sync::CancellationToken;

use crate::auth::keys::KeyRing;
use crate::auth::shared::Shared;
use crate::config::{ClusterConfig, redact_url};
use crate::metrics::RedisOp;
use crate::registry::Registry;
use crate::registry::store::ChangeFeed;
use crate::stream::SessionNames;
pub use sessions::RedisSessionStore;
use signing::{Signed, Signing};

/// How long a Redis call may take before it counts as failed.
pub const REDIS_TIMEOUT: Duration = Duration::from_secs(2);
/// How often a replica says it is alive.
const HEARTBEAT_EVERY: Duration = Duration::from_secs(1);
/// How long a heartbeat lasts: a replica silent this long is gone.
const HEARTBEAT_TTL: Duration = Duration::from_secs(5);
/// How far apart the replicas' clocks may be when a heartbeat's signed expiry is read.
const CLOCK_SKEW: Duration = Duration::from_secs(5);
/// The longest advertise URL read back from Redis.
const MAX_URL_LEN: usize = 512;

/// Why cluster mode could not start or a call failed.
#[derive(Debug, thiserror::Error)]
pub enum ClusterError {
    /// The URL is not one the Redis client accepts (its password never shown).
    #[error("redis_url `{0}` is not usable: {1}")]
    Url(String, String),
    /// Redis did not answer, or refused.
    #[error("Redis at {0} is unreachable: {1}")]
    Unreachable(String, String),
}

/// This replica's part in the cluster.
pub struct Cluster {
    /// Opens the subscribed connection (again, after a loss).
    client: redis::Client,
    /// Whether the subscription to the other replicas' messages is up ([`Cluster::hears`]).
    subscribed: AtomicBool,
    conn: ConnectionManager,
    /// For the event store's writer and reads (see [`Cluster::events_connection`]).
    events_conn: ConnectionManager,
    prefix: String,
    /// Random per process: a restarted replica is a new one.
    replica: Arc<str>,
    /// Where the others reach this replica.
    advertise_url: String,
    /// Shown in errors instead of the URL (no password).
    redis_shown: String,
    secret: String,
    /// Signs and checks what decides a forward (see [`signing`]).
    signing: Signing,
    /// What a session is called in key names (never its id).
    names: SessionNames,
    /// The connections to other replicas (kept alive, pooled per replica).
    http: forward::Http,
    /// Set when the drain starts: the heartbeat says so from then on.
    draining: std::sync::atomic::AtomicBool,
    /// Since when every heartbeat reached Redis (`None` after one failed).
    connected_since: std::sync::Mutex<Option<std::time::Instant>>,
    /// See [`Cluster::lapsed`].
    lapsed: Arc<tokio::sync::Notify>,
    /// A heartbeat has reached Redis once.
    beaten: std::sync::atomic::AtomicBool,
    /// The replicas forwarded to, watched (see [`liveness`]).
    liveness: liveness::Liveness,
    /// The sessions' owners, remembered for a moment (see [`owners`]).
    owners: owners::Owners,
    /// Where requests to each owner go, parsed once (see [`forward`]).
    targets: forward::Targets,
}

/// What a replica's heartbeat key says. Its value is the signature ([`signing`]), a space,
/// the time it expires (milliseconds since the epoch, signed with the rest), a space, and
/// what it says: the URL, [`DRAINING`] and the URL, or [`HANDED_OVER`].
enum Heartbeat {
    /// Alive, at this URL.
    Alive(String),
    Draining,
    /// It stopped and handed its sessions over.
    HandedOver,
    /// No heartbeat (or one this gateway did not write, or not signed with the cluster's
    /// secret): the replica died, or Redis lost the key or was out for longer than the key
    /// lasts.
    Lapsed,
}

/// The replica that owns a session, as Redis tells it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Owner {
    /// This replica.
    Me,
    /// Another replica, alive, at this URL.
    Alive { replica: String, url: String },
    /// Another replica, alive but draining: it finishes what it has, then hands its sessions
    /// over; until then a request for them is to be retried.
    Draining,
    /// Another replica whose heartbeat lapsed while this one cannot yet tell whether it
    /// died or Redis was out (see [`Cluster::may_judge_liveness`]): to be retried.
    Unsure,
    /// A replica, by id, whose heartbeat has lapsed (or that said it is gone).
    Gone(String),
}

/// What a draining replica's heartbeat says before its URL.
const DRAINING: &str = "draining ";
/// What a replica's heartbeat says once it stopped and handed its sessions over.
const HANDED_OVER: &str = "gone";
/// How long that is kept.
const HANDED_OVER_TTL: Duration = Duration::from_secs(60);

impl Cluster {
    /// Sets up this replica's connections to Redis, which are made on first use and made
    /// again whenever they break: a Redis that does not answer yet does not fail the start
    /// (readiness says so, and the calls that need it fail within [`REDIS_TIMEOUT`] until it
    /// answers). Fails only on a URL the client does not accept. The others will reach this
    /// replica at `advertise_url`.
    pub async fn connect(
        config: &ClusterConfig,
        advertise_url: String,
    ) -> Result<Arc<Cluster>, ClusterError> {
        let shown = redact_url(&config.redis_url);
        let client = redis::Client::open(config.redis_url.as_str())
            .map_err(|e| ClusterError::Url(shown.clone(), e.to_string()))?;
        // A few quick tries per (re)connection, then the call fails; the next call (the
        // heartbeat's, within a second) starts another round.
        let settings = ConnectionManagerConfig::new()
            .set_connection_timeout(Some(REDIS_TIMEOUT))
            .set_response_timeout(Some(REDIS_TIMEOUT))
            .set_number_of_retries(2)
            .set_max_delay(Duration::from_secs(1));
        let open = |client: redis::Client| {
            ConnectionManager::new_lazy_with_config(client, settings.clone())
                .map_err(|e| ClusterError::Url(shown.clone(), e.to_string()))
        };
        let conn = open(client.clone())?;
        // The replay events' bulk writes get a connection of their own: heartbeats and
        // lookups must not queue behind a batch of them.
        let events_conn = open(client.clone())?;
        Signing::register_metrics();
        let mut id = [0u8; 8];
        rand::rng().fill_bytes(&mut id);
        let replica: String = id.iter().map(|b| format!("{b:02x}")).collect();
        let http = forward::client();
        let cluster = Arc::new(Cluster {
            client,
            subscribed: AtomicBool::new(false),
            conn,
            events_conn,
            prefix: config.key_prefix.clone(),
            replica: replica.into(),
            advertise_url,
            redis_shown: shown,
            secret: config.secret.clone(),
            signing: Signing::new(&config.secret),
            names: signing::session_names(&config.secret),
            http,
            draining: Default::default(),
            connected_since: Default::default(),
            lapsed: Default::default(),
            beaten: Default::default(),
            liveness: Default::default(),
            owners: Default::default(),
            targets: Default::default(),
        });
        // Said before the replica serves, when Redis answers; when it does not, the
        // heartbeat goes on trying every second.
        if let Err(e) = cluster.beat().await {
            tracing::warn!(
                "cluster mode: {e}; serving without it until it answers (readiness fails meanwhile)"
            );
        }
        Ok(cluster)
    }

    /// A connection to the cluster's Redis for the replay events, apart from the one the
    /// heartbeat and the session lookups use.
    pub fn events_connection(&self) -> ConnectionManager {
        self.events_conn.clone()
    }

    /// What authorization shares with the other replicas: revocations and key rotations
    /// announced on, and heard from, the cluster's channel (heard once [`Cluster::listen`]
    /// runs), and the registration limit counted in Redis.
    pub fn auth_shared(self: &Arc<Self>) -> Shared {
        Shared {
            feed: Some(Arc::new(tokens::RedisAuthFeed::new(self.clone()))),
            throttle: Some(Arc::new(throttle::RedisThrottle::new(self.clone()))),
        }
    }

    /// The rate limits' buckets, shared by every replica.
    pub fn rate_buckets(self: &Arc<Self>) -> Arc<dyn crate::limits::SharedBuckets> {
        Arc::new(ratelimit::RedisBuckets::new(self.clone()))
    }

    /// What tells the other replicas of the admin API's registry changes.
    pub fn registry_feed(self: &Arc<Self>) -> Arc<dyn ChangeFeed> {
        Arc::new(registry::RedisRegistryFeed::new(self.clone()))
    }

    /// Hears the other replicas until `stop`, in a task of its own: their revocations and
    /// rotations go to `keys` (the built-in authorization server's, if any), and their registry changes make
    /// `registry` re-read its overlay.
    pub fn listen(
        self: &Arc<Self>,
        keys: Option<Arc<KeyRing>>,
        registry: &Arc<Registry>,
        stop: CancellationToken,
    ) -> tokio::task::JoinHandle<()> {
        let mut listeners: Vec<(String, Arc<dyn bus::Listener>)> = vec![(
            self.channel(registry::CHANNEL),
            Arc::new(registry::Heard::start(self, registry, stop.clone())),
        )];
        if let Some(keys) = keys {
            listeners.push((
                self.channel(tokens::CHANNEL),
                Arc::new(tokens::Heard { keys }),
            ));
        }
        tokio::spawn(self.clone().listen_on(listeners, stop))
    }

    /// What every key of this cluster starts with.
    pub fn key_prefix(&self) -> &str {
        &self.prefix
    }

    /// This replica's id.
    pub fn replica(&self) -> &Arc<str> {
        &self.replica
    }

    /// The store of session records the replicas share; a record untouched for `ttl` (the
    /// session idle timeout) expires.
    pub fn session_store(self: &Arc<Self>, ttl: Duration) -> RedisSessionStore {
        RedisSessionStore::new(self.clone(), ttl)
    }

    /// What the cluster's sessions are called in key names (its event store's keys too): a
    /// keyed hash of their ids, never the ids.
    pub fn session_names(&self) -> SessionNames {
        self.names.clone()
    }

    /// The key of session `id`'s record.
    fn session_key(&self, id: &str) -> String {
        self.key(&["session", &self.names.of(id)])
    }

    fn key(&self, parts: &[&str]) -> String {
        let mut k = self.prefix.clone();
        for (i, p) in parts.iter().enumerate() {
            if i > 0 {
                k.push(':');
            }
            k.push_str(p);
        }
        k
    }

    fn unreachable(&self, e: impl std::fmt::Display) -> ClusterError {
        ClusterError::Unreachable(self.redis_shown.clone(), e.to_string())
    }

    /// Runs one Redis call under [`REDIS_TIMEOUT`], timing it.
    async fn call<T>(
        &self,
        op: RedisOp,
        f: impl std::future::Future<Output = redis::RedisResult<T>>,
    ) -> Result<T, ClusterError> {
        let started = std::time::Instant::now();
        let r = match tokio::time::timeout(REDIS_TIMEOUT, f).await {
            Ok(Ok(v)) => Ok(v),
            Ok(Err(e)) => Err(self.unreachable(e)),
            Err(_) => Err(self.unreachable("timed out")),
        };
        crate::metrics::record_redis(op, started.elapsed(), r.is_ok());
        r
    }

    /// Says this replica is alive, for [`HEARTBEAT_TTL`].
    async fn beat(&self) -> Result<(), ClusterError> {
        let key = self.key(&["replica", &self.replica]);
        let mut c = self.conn.clone();
        let ttl = HEARTBEAT_TTL.as_millis() as u64;
        let value = if self.draining.load(std::sync::atomic::Ordering::Relaxed) {
            self.heartbeat_value(
                &key,
                &format!("{DRAINING}{}", self.advertise_url),
                HEARTBEAT_TTL,
            )
        } else {
            self.heartbeat_value(&key, &self.advertise_url, HEARTBEAT_TTL)
        };
        let beat = self
            .call(RedisOp::Heartbeat, async move {
                redis::cmd("SET")
                    .arg(key)
                    .arg(value)
                    .arg("PX")
                    .arg(ttl)
                    .arg("GET")
                    .query_async::<Option<Vec<u8>>>(&mut c)
                    .await
            })
            .await;
        let mut since = self.connected_since.lock().expect("liveness lock");
        match beat {
            Ok(previous) => {
                let first = !self.beaten.swap(true, std::sync::atomic::Ordering::Relaxed);
                since.get_or_insert_with(std::time::Instant::now);
                if previous.is_none() && !first {
                    // Our own heartbeat was gone: Redis restarted (perhaps empty) or could
                    // not be reached for longer than its expiry.
                    self.lapsed.notify_one();
                }
                Ok(())
            }
            Err(e) => {
                *since = None;
                Err(e)
            }
        }
    }

    /// Wakes when this replica finds its own heartbeat had lapsed in Redis (see
    /// [`Cluster::beat`]): the session records should be checked at once.
    pub fn lapsed(&self) -> Arc<tokio::sync::Notify> {
        self.lapsed.clone()
    }

    /// Whether a lapsed heartbeat of another replica means it is gone: only once this
    /// replica has beaten without a break for longer than a heartbeat lasts. Right after an
    /// outage of Redis every heartbeat may have lapsed while their replicas live; they beat
    /// again within a second.
    fn may_judge_liveness(&self) -> bool {
        self.connected_since
            .lock()
            .expect("liveness lock")
            .is_some_and(|t| t.elapsed() >= HEARTBEAT_TTL)
    }

    /// Says this replica is draining: the others retry requests for its sessions rather
    /// than take them over, until it hands them over. Returns once the others have stopped
    /// forwarding to it ([`owners::DRAIN_NOTICE`]): until then it serves as before.
    pub async fn drain(&self) {
        self.draining
            .store(true, std::sync::atomic::Ordering::Relaxed);
        match self.beat().await {
            Ok(()) => tokio::time::sleep(owners::DRAIN_NOTICE).await,
            Err(e) => tracing::warn!("cluster heartbeat: {e}"),
        }
    }

    /// Beats until `shutdown`, then says it is gone, so its sessions can be taken over at
    /// once.
    pub async fn heartbeat(self: Arc<Self>, shutdown: CancellationToken) {
        let mut tick = tokio::time::interval(HEARTBEAT_EVERY);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        // An outage is logged when it begins and when it ends, not at every beat.
        let mut failing = false;
        loop {
            tokio::select! {
                _ = tick.tick() => match self.beat().await {
                    Ok(()) => {
                        if failing {
                            failing = false;
                            tracing::info!("cluster heartbeat: Redis answers again");
                        }
                        if let Err(e) = self.check_watched().await {
                            tracing::debug!("checking the replicas forwarded to: {e}");
                        }
                    }
                    Err(e) if failing => tracing::debug!("cluster heartbeat: {e}"),
                    Err(e) => {
                        failing = true;
                        tracing::warn!("cluster heartbeat: {e}; trying again every second");
                    }
                },
                () = shutdown.cancelled() => break,
            }
        }
        // "Gone" for a while, rather than no heartbeat: its sessions were handed over and
        // may be taken over at once, by a replica that just started too.
        let key = self.key(&["replica", &self.replica]);
        let value = self.heartbeat_value(&key, HANDED_OVER, HANDED_OVER_TTL);
        let mut c = self.conn.clone();
        let _ = self
            .call(RedisOp::Heartbeat, async move {
                c.pset_ex::<_, _, ()>(key, value, HANDED_OVER_TTL.as_millis() as u64)
                    .await
            })
            .await;
    }

    /// Whether Redis answers (readiness).
    pub async fn ping(&self) -> Result<(), ClusterError> {
        let mut c = self.conn.clone();
        self.call(RedisOp::Ping, async move {
            redis::cmd("PING").query_async::<String>(&mut c).await
        })
        .await
        .map(|_| ())
    }

    /// The value of a heartbeat under `key` that says `says` for `lasts`, signed with the
    /// time it expires (milliseconds since the epoch), so that a heartbeat written once
    /// cannot be put back after its replica is gone (its address may be another's by then).
    fn heartbeat_value(&self, key: &str, says: &str, lasts: Duration) -> String {
        let expires = crate::audit::now_ms() + lasts.as_millis() as i64;
        let signed = format!("{expires} {says}");
        let signature = self.signing.sign(Signed::Heartbeat, key, &signed);
        format!("{signature} {signed}")
    }

    /// What a replica's heartbeat says (see [`Heartbeat`]).
    async fn heartbeat_of(&self, replica: &str) -> Result<Heartbeat, ClusterError> {
        let key = self.key(&["replica", replica]);
        let mut c = self.conn.clone();
        let k = key.clone();
        let value: Option<Vec<u8>> = self
            .call(RedisOp::Owner, async move { c.get(k).await })
            .await?;
        Ok(self.read_heartbeat(&key, value.as_deref()))
    }

    /// What the heartbeat `value` read under `key` says: lapsed when there is none, and when
    /// it is not one a replica of this cluster wrote there (its signature does not verify).
    fn read_heartbeat(&self, key: &str, value: Option<&[u8]>) -> Heartbeat {
        let Some(value) = value else {
            return Heartbeat::Lapsed;
        };
        let verified = std::str::from_utf8(value)
            .ok()
            .filter(|v| v.len() <= MAX_URL_LEN + 100)
            .and_then(|v| v.split_once(' '))
            .filter(|(signature, signed)| {
                self.signing
                    .verify(Signed::Heartbeat, key, signed, signature)
            })
            .and_then(|(_, signed)| signed.split_once(' '));
        let Some((expires, says)) = verified else {
            self.signing.unverified(Signed::Heartbeat, key);
            return Heartbeat::Lapsed;
        };
        // Past its time (with the replicas' clocks a few seconds apart at most): a heartbeat
        // put back after it lapsed, never to be believed.
        let now = crate::audit::now_ms();
        if !expires
            .parse::<i64>()
            .is_ok_and(|e| e + CLOCK_SKEW.as_millis() as i64 >= now)
        {
            return Heartbeat::Lapsed;
        }
        if says == HANDED_OVER {
            return Heartbeat::HandedOver;
        }
        let (url, draining) = match says.strip_prefix(DRAINING) {
            Some(url) => (url, true),
            None => (says, false),
        };
        // Signed, yet not what this gateway writes: none of its replicas wrote it.
        if url.len() > MAX_URL_LEN || !(url.starts_with("http://") || url.starts_with("https://")) {
            return Heartbeat::Lapsed;
        }
        if draining {
            Heartbeat::Draining
        } else {
            Heartbeat::Alive(url.to_owned())
        }
    }

    /// Who owns a session, as [`Cluster::owner_of`] says; a live owner named within the last
    /// [`owners::OWNER_TTL`] is taken from memory (the `bool` says so), and whoever uses it
    /// calls [`Cluster::forget_owner`] when the owner turns out not to serve the session.
    /// With `fresh`, Redis is asked whatever is remembered.
    pub async fn owner_of_cached(
        &self,
        session: &str,
        fresh: bool,
    ) -> Result<(Option<Owner>, bool), ClusterError> {
        if let Some(r) = self.owners.get(session).filter(|_| !fresh) {
            let (replica, url) = (r.replica.to_string(), r.url.to_string());
            return Ok((Some(Owner::Alive { replica, url }), true));
        }
        let owner = self.owner_of(session).await?;
        if let Some(Owner::Alive { replica, url }) = &owner {
            self.owners.remember(session, replica, url);
        }
        Ok((owner, false))
    }

    /// Forgets the owner remembered for `session`.
    pub fn forget_owner(&self, session: &str) {
        self.owners.forget(session);
    }

    /// Who owns a session: `None` when no replica has it (it ended, expired, or never was).
    pub async fn owner_of(&self, session: &str) -> Result<Option<Owner>, ClusterError> {
        let Some(replica) = sessions::owner(self, session).await? else {
            return Ok(None);
        };
        if *replica == *self.replica {
            return Ok(Some(Owner::Me));
        }
        Ok(Some(match self.heartbeat_of(&replica).await? {
            Heartbeat::Alive(url) => Owner::Alive { replica, url },
            Heartbeat::Draining => Owner::Draining,
            Heartbeat::HandedOver => Owner::Gone(replica),
            Heartbeat::Lapsed if self.may_judge_liveness() => Owner::Gone(replica),
            Heartbeat::Lapsed => Owner::Unsure,
        }))
    }
}
