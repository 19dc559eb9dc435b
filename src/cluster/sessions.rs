//! Session records in Redis: `<prefix>session:<name>`, one hash each (the name a keyed hash of
//! the session's id, [`Cluster::session_names`]: no key name holds a session id), with the
//! replica that owns the session and an expiry of the session's idle timeout, refreshed while
//! it lives.
//!
//! Fields: `replica` (the owner), `sig` (its signature, see [`super::signing`]: a record whose
//! `replica` it does not sign names no owner), `version`, `init` (the `initialize` params plugins get),
//! `owner` (the token subject, absent without one), `created` (ms since the epoch), `tag` (of
//! its event ids), `gen` (times it was taken over), and the client's state since: `state_seq`,
//! `log_level` (absent when none was set) and `subs` (a JSON array of `[plugin, uri]`).
//!
//! Every change that depends on who owns the session is one Lua script, so it is atomic: a
//! refresh, a state save or a removal applies only while the record names this replica (a
//! replica that was taken for dead and comes back never overwrites its successor), and a
//! takeover ([`Cluster::claim`]) only while it still names the replica found gone, so of two
//! replicas racing to adopt a session one wins.
//!
//! A record read back is checked: bounded in size, every field parsed, its version one this
//! gateway speaks; anything else is treated as no record.

use std::collections::HashMap;
use std::sync::{Arc, LazyLock};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use redis::{AsyncCommands, Script};
use serde_json::value::RawValue;

use super::signing::Signed;
use super::{Cluster, ClusterError};
use crate::metrics::RedisOp;
use crate::protocol;
use crate::session::store::StoreFuture;
use crate::session::{SessionRecord, SessionState, SessionStore, SessionStoreError, Touched};

/// The largest record read back: `initialize` params beyond this are not a client's.
const MAX_RECORD_BYTES: usize = 256 * 1024;

/// Most subscriptions kept with a record.
const MAX_SUBSCRIPTIONS: usize = 10_000;

/// Refreshes the record while it names this replica: 1 kept, 0 missing, 2 another's.
static TOUCH: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r"local r = redis.call('HGET', KEYS[1], 'replica')
if not r then return 0 end
if r ~= ARGV[1] then return 2 end
redis.call('PEXPIRE', KEYS[1], ARGV[2])
return 1",
    )
});

/// Saves the client's state while the record names this replica and holds an older one.
static SAVE_STATE: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r"if redis.call('HGET', KEYS[1], 'replica') ~= ARGV[1] then return 0 end
local seq = tonumber(redis.call('HGET', KEYS[1], 'state_seq') or '0')
if seq >= tonumber(ARGV[2]) then return 0 end
redis.call('HSET', KEYS[1], 'state_seq', ARGV[2], 'subs', ARGV[3])
if ARGV[4] == '' then redis.call('HDEL', KEYS[1], 'log_level')
else redis.call('HSET', KEYS[1], 'log_level', ARGV[4]) end
return 1",
    )
});

/// Deletes the record while it names this replica.
static REMOVE: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r"if redis.call('HGET', KEYS[1], 'replica') ~= ARGV[1] then return 0 end
return redis.call('DEL', KEYS[1])",
    )
});

/// Takes the session over while its record names the replica found gone (ARGV[1]): this
/// replica (ARGV[2], signed by ARGV[4]) becomes the owner, the generation goes up, and the
/// record comes back.
static CLAIM: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r"if redis.call('HGET', KEYS[1], 'replica') ~= ARGV[1] then return {} end
redis.call('HSET', KEYS[1], 'replica', ARGV[2], 'sig', ARGV[4])
redis.call('HINCRBY', KEYS[1], 'gen', 1)
redis.call('PEXPIRE', KEYS[1], ARGV[3])
return redis.call('HGETALL', KEYS[1])",
    )
});

fn millis(t: SystemTime) -> u64 {
    t.duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

/// The records of the cluster's sessions (see the module's doc).
pub struct RedisSessionStore {
    cluster: Arc<Cluster>,
    /// How long a record lives without being touched, in milliseconds: the session idle
    /// timeout, so a record outlives its session only when its owner died with it.
    ttl_ms: u64,
}

impl RedisSessionStore {
    pub(super) fn new(cluster: Arc<Cluster>, ttl: Duration) -> RedisSessionStore {
        RedisSessionStore {
            cluster,
            ttl_ms: ttl_ms(ttl),
        }
    }
}

fn ttl_ms(ttl: Duration) -> u64 {
    ttl.as_millis().clamp(1000, u64::MAX as u128) as u64
}

fn store_error(e: ClusterError) -> SessionStoreError {
    SessionStoreError::Unavailable(e.to_string())
}

/// The subscriptions as kept: a JSON array of `[plugin, uri]`.
fn subscriptions_json(subs: &[(String, String)]) -> String {
    serde_json::to_string(subs).expect("strings serialize")
}

/// A record's fields, as `HGETALL` gave them, checked (see the module's doc).
fn parse(id: &str, fields: HashMap<String, Vec<u8>>) -> Option<SessionRecord> {
    if fields.values().map(Vec::len).sum::<usize>() > MAX_RECORD_BYTES {
        return None;
    }
    let text = |name: &str| fields.get(name).and_then(|v| std::str::from_utf8(v).ok());
    let number = |name: &str| text(name).and_then(|v| v.parse::<u64>().ok());
    let version = text("version")?;
    let version = protocol::CLIENT_VERSIONS.iter().find(|v| **v == version)?;
    let init_params = RawValue::from_string(text("init")?.to_owned()).ok()?;
    let subscriptions: Vec<(String, String)> = match text("subs") {
        None => Vec::new(),
        Some(s) => serde_json::from_str(s).ok()?,
    };
    if subscriptions.len() > MAX_SUBSCRIPTIONS {
        return None;
    }
    let log_level = match text("log_level") {
        None => None,
        Some(l) => Some(RawValue::from_string(l.to_owned()).ok()?.get().to_owned()),
    };
    let created = UNIX_EPOCH + Duration::from_millis(number("created")?);
    Some(SessionRecord {
        id: Arc::from(id),
        version,
        init_params: Arc::from(init_params),
        owner: match fields.get("owner") {
            None => None,
            Some(o) => Some(String::from_utf8(o.clone()).ok()?),
        },
        created,
        last_used: created,
        tag: u32::try_from(number("tag")?).ok()?,
        generation: u32::try_from(number("gen")?).ok()?,
        state: SessionState {
            seq: number("state_seq").unwrap_or(0),
            log_level,
            subscriptions,
        },
    })
}

/// The replica a session's record names, if there is a record and its signature says a
/// replica of this cluster wrote that name there.
pub(super) async fn owner(cluster: &Cluster, id: &str) -> Result<Option<String>, ClusterError> {
    let key = cluster.session_key(id);
    let mut c = cluster.conn.clone();
    let k = key.clone();
    let (replica, signature): (Option<String>, Option<String>) = cluster
        .call(RedisOp::Owner, async move {
            redis::cmd("HMGET")
                .arg(k)
                .arg("replica")
                .arg("sig")
                .query_async(&mut c)
                .await
        })
        .await?;
    let Some(replica) = replica else {
        return Ok(None);
    };
    let signed = signature.is_some_and(|s| {
        replica.len() <= 64 && cluster.signing.verify(Signed::Owner, &key, &replica, &s)
    });
    if !signed {
        cluster.signing.unverified(Signed::Owner, &key);
        return Ok(None);
    }
    Ok(Some(replica))
}

impl Cluster {
    /// Takes over a session whose record still names `gone` (a replica found dead): the
    /// record now names this replica, its generation one higher. `None` when the record is
    /// gone or names another replica (one that took it over first).
    pub async fn claim(
        &self,
        id: &str,
        gone: &str,
        ttl: Duration,
    ) -> Result<Option<SessionRecord>, ClusterError> {
        let key = self.session_key(id);
        let signature = self.signing.sign(Signed::Owner, &key, &self.replica);
        let mut c = self.conn.clone();
        let fields: HashMap<String, Vec<u8>> = self
            .call(RedisOp::SessionWrite, async move {
                CLAIM
                    .key(key)
                    .arg(gone)
                    .arg(&*self.replica)
                    .arg(ttl_ms(ttl))
                    .arg(signature)
                    .invoke_async(&mut c)
                    .await
            })
            .await?;
        if fields.is_empty() {
            return Ok(None);
        }
        let record = parse(id, fields);
        if record.is_none() {
            tracing::warn!(session = %id, "a session record in Redis does not parse; not adopted");
        }
        Ok(record)
    }
}

impl SessionStore for RedisSessionStore {
    fn put(&self, record: SessionRecord) -> StoreFuture<'_, ()> {
        Box::pin(async move {
            let key = self.cluster.session_key(&record.id);
            let replica = &self.cluster.replica;
            let mut fields: Vec<(&str, String)> = vec![
                ("replica", replica.to_string()),
                (
                    "sig",
                    self.cluster.signing.sign(Signed::Owner, &key, replica),
                ),
                ("version", record.version.to_owned()),
                ("init", record.init_params.get().to_owned()),
                ("created", millis(record.created).to_string()),
                ("tag", record.tag.to_string()),
                ("gen", record.generation.to_string()),
                ("state_seq", record.state.seq.to_string()),
                ("subs", subscriptions_json(&record.state.subscriptions)),
            ];
            if let Some(owner) = &record.owner {
                fields.push(("owner", owner.clone()));
            }
            if let Some(level) = &record.state.log_level {
                fields.push(("log_level", level.clone()));
            }
            let mut pipe = redis::pipe();
            pipe.atomic()
                .del(&key)
                .ignore()
                .hset_multiple(&key, &fields)
                .ignore()
                .pexpire(&key, self.ttl_ms as i64)
                .ignore();
            let mut c = self.cluster.conn.clone();
            self.cluster
                .call(RedisOp::SessionWrite, async move {
                    pipe.query_async::<()>(&mut c).await
                })
                .await
                .map_err(store_error)
        })
    }

    fn get<'a>(&'a self, id: &'a str) -> StoreFuture<'a, Option<SessionRecord>> {
        Box::pin(async move {
            let key = self.cluster.session_key(id);
            let mut c = self.cluster.conn.clone();
            let fields: HashMap<String, Vec<u8>> = self
                .cluster
                .call(RedisOp::SessionRead, async move { c.hgetall(key).await })
                .await
                .map_err(store_error)?;
            if fields.is_empty() {
                return Ok(None);
            }
            let record = parse(id, fields);
            if record.is_none() {
                tracing::warn!(session = %id, "a session record in Redis does not parse; ignored");
            }
            Ok(record)
        })
    }

    fn touch<'a>(&'a self, id: &'a str, _at: SystemTime) -> StoreFuture<'a, Touched> {
        Box::pin(async move {
            let key = self.cluster.session_key(id);
            let mut c = self.cluster.conn.clone();
            let found: i64 = self
                .cluster
                .call(RedisOp::SessionWrite, async move {
                    TOUCH
                        .key(key)
                        .arg(&*self.cluster.replica)
                        .arg(self.ttl_ms)
                        .invoke_async(&mut c)
                        .await
                })
                .await
                .map_err(store_error)?;
            Ok(match found {
                1 => Touched::Kept,
                2 => Touched::Taken,
                _ => Touched::Missing,
            })
        })
    }

    fn save_state<'a>(&'a self, id: &'a str, state: SessionState) -> StoreFuture<'a, ()> {
        Box::pin(async move {
            let key = self.cluster.session_key(id);
            let mut c = self.cluster.conn.clone();
            self.cluster
                .call(RedisOp::SessionWrite, async move {
                    SAVE_STATE
                        .key(key)
                        .arg(&*self.cluster.replica)
                        .arg(state.seq)
                        .arg(subscriptions_json(&state.subscriptions))
                        .arg(state.log_level.as_deref().unwrap_or(""))
                        .invoke_async::<i64>(&mut c)
                        .await
                })
                .await
                .map(|_| ())
                .map_err(store_error)
        })
    }

    fn remove<'a>(&'a self, id: &'a str) -> StoreFuture<'a, ()> {
        Box::pin(async move {
            let key = self.cluster.session_key(id);
            let mut c = self.cluster.conn.clone();
            self.cluster
                .call(RedisOp::SessionWrite, async move {
                    REMOVE
                        .key(key)
                        .arg(&*self.cluster.replica)
                        .invoke_async::<i64>(&mut c)
                        .await
                })
                .await
                .map(|_| ())
                .map_err(store_error)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fields(pairs: &[(&str, &str)]) -> HashMap<String, Vec<u8>> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.as_bytes().to_vec()))
            .collect()
    }

    const GOOD: &[(&str, &str)] = &[
        ("replica", "r1"),
        ("version", "2025-11-25"),
        ("init", r#"{"a":1}"#),
        ("created", "5"),
        ("tag", "77"),
        ("gen", "2"),
        ("state_seq", "3"),
        ("subs", r#"[["p","file:///x"]]"#),
        ("owner", "DOMAIN\\user \"x\""),
        ("log_level", r#"{"level":"info"}"#),
    ];

    #[test]
    fn a_record_parses_back_with_its_state() {
        let r = parse("s", fields(GOOD)).expect("parses");
        assert_eq!(r.owner.as_deref(), Some("DOMAIN\\user \"x\""));
        assert_eq!((r.tag, r.generation), (77, 2));
        assert_eq!(r.state.seq, 3);
        assert_eq!(r.state.log_level.as_deref(), Some(r#"{"level":"info"}"#));
        assert_eq!(
            r.state.subscriptions,
            vec![("p".to_string(), "file:///x".to_string())]
        );
    }

    #[test]
    fn a_record_with_a_bad_field_is_no_record() {
        for (name, bad) in [
            ("version", "1999-01-01"),
            ("init", "{"),
            ("tag", "4294967296"),
            ("gen", "-1"),
            ("created", "soon"),
            ("subs", r#"[["only one"]]"#),
            ("log_level", "not json"),
        ] {
            let mut f = fields(GOOD);
            f.insert(name.into(), bad.as_bytes().to_vec());
            assert!(parse("s", f).is_none(), "{name} = {bad}");
        }
        let mut f = fields(GOOD);
        f.remove("tag");
        assert!(parse("s", f).is_none(), "a record without its tag");
        let mut f = fields(GOOD);
        f.insert("init".into(), vec![b' '; MAX_RECORD_BYTES + 1]);
        assert!(parse("s", f).is_none(), "past the size bound");
    }
}
