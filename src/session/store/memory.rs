//! The default [`SessionStore`]: records in this process's memory, gone when it stops (as
//! the sessions themselves are). Each call does its work before it returns; the future it
//! gives back is already complete.

use std::future::ready;
use std::time::SystemTime;

use dashmap::DashMap;

use super::{SessionRecord, SessionState, SessionStore, StoreFuture, Touched};

/// Session records in memory, by id.
#[derive(Debug, Default)]
pub struct MemorySessionStore {
    /// Hashed with foldhash like the live sessions' map: keys are ids this gateway made.
    records: DashMap<std::sync::Arc<str>, SessionRecord, foldhash::fast::RandomState>,
}

impl MemorySessionStore {
    /// Records kept now.
    pub fn len(&self) -> usize {
        self.records.len()
    }

    pub fn is_empty(&self) -> bool {
        self.records.is_empty()
    }
}

impl SessionStore for MemorySessionStore {
    fn put(&self, record: SessionRecord) -> StoreFuture<'_, ()> {
        self.records.insert(record.id.clone(), record);
        Box::pin(ready(Ok(())))
    }

    fn get<'a>(&'a self, id: &'a str) -> StoreFuture<'a, Option<SessionRecord>> {
        let record = self.records.get(id).map(|r| r.clone());
        Box::pin(ready(Ok(record)))
    }

    fn touch<'a>(&'a self, id: &'a str, at: SystemTime) -> StoreFuture<'a, Touched> {
        let touched = match self.records.get_mut(id) {
            Some(mut r) => {
                r.last_used = at;
                Touched::Kept
            }
            None => Touched::Missing,
        };
        Box::pin(ready(Ok(touched)))
    }

    fn save_state<'a>(&'a self, id: &'a str, state: SessionState) -> StoreFuture<'a, ()> {
        if let Some(mut r) = self.records.get_mut(id)
            && r.state.seq < state.seq
        {
            r.state = state;
        }
        Box::pin(ready(Ok(())))
    }

    fn remove<'a>(&'a self, id: &'a str) -> StoreFuture<'a, ()> {
        self.records.remove(id);
        Box::pin(ready(Ok(())))
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::time::Duration;

    use futures_util::FutureExt;
    use serde_json::value::RawValue;

    use super::*;

    fn record(id: &str, owner: Option<&str>) -> SessionRecord {
        let now = SystemTime::now();
        SessionRecord {
            id: Arc::from(id),
            version: "2025-11-25",
            init_params: RawValue::from_string(
                r#"{"protocolVersion":"2025-11-25","capabilities":{"sampling":{}},
"clientInfo":{"name":"c","version":"1"}}"#
                    .into(),
            )
            .unwrap()
            .into(),
            owner: owner.map(str::to_owned),
            created: now,
            last_used: now,
            tag: 7,
            generation: 0,
            state: Default::default(),
        }
    }

    #[tokio::test]
    async fn put_get_touch_remove() {
        let store = MemorySessionStore::default();
        assert!(store.get("a").await.unwrap().is_none());
        store.put(record("a", Some("alice"))).await.unwrap();
        store.put(record("b", None)).await.unwrap();
        assert_eq!(store.len(), 2);

        let a = store.get("a").await.unwrap().expect("kept");
        assert_eq!(&*a.id, "a");
        assert_eq!(a.version, "2025-11-25");
        assert_eq!(a.owner.as_deref(), Some("alice"));
        // The client's params come back byte for byte, line break and all.
        assert_eq!(a.init_params.get(), record("x", None).init_params.get());

        let later = a.created + Duration::from_secs(90);
        assert_eq!(store.touch("a", later).await.unwrap(), Touched::Kept);
        let a = store.get("a").await.unwrap().unwrap();
        assert_eq!(a.last_used, later);
        assert_eq!(a.created + Duration::from_secs(90), a.last_used);

        store.remove("a").await.unwrap();
        assert!(store.get("a").await.unwrap().is_none());
        assert!(store.get("b").await.unwrap().is_some());
        assert_eq!(store.len(), 1);
    }

    #[test]
    fn unknown_ids_are_no_error() {
        let store = MemorySessionStore::default();
        let done = |f: StoreFuture<'_, ()>| f.now_or_never().expect("complete at once");
        let touched = store.touch("nobody", SystemTime::now()).now_or_never();
        assert_eq!(touched.unwrap().unwrap(), Touched::Missing);
        done(store.remove("nobody")).unwrap();
        done(store.save_state("nobody", SessionState::default())).unwrap();
        assert!(store.is_empty(), "a touch does not create a record");
    }

    #[test]
    fn a_put_replaces_and_every_call_is_complete_when_it_returns() {
        let store = MemorySessionStore::default();
        let put = store.put(record("a", None));
        // Done before the future is polled: the manager relies on the order of its calls.
        assert_eq!(store.len(), 1);
        put.now_or_never().expect("complete at once").unwrap();
        store
            .put(record("a", Some("bob")))
            .now_or_never()
            .unwrap()
            .unwrap();
        assert_eq!(store.len(), 1);
        let a = store.get("a").now_or_never().unwrap().unwrap().unwrap();
        assert_eq!(a.owner.as_deref(), Some("bob"));
    }

    #[tokio::test]
    async fn a_state_is_kept_only_over_an_older_one() {
        let store = MemorySessionStore::default();
        store.put(record("a", None)).await.unwrap();
        let state = |seq: u64, uri: &str| SessionState {
            seq,
            log_level: None,
            subscriptions: vec![("p".into(), uri.into())],
        };
        store.save_state("a", state(2, "two")).await.unwrap();
        store.save_state("a", state(1, "one")).await.unwrap();
        let a = store.get("a").await.unwrap().unwrap();
        assert_eq!(
            a.state,
            state(2, "two"),
            "the later save of an older state lost"
        );
    }
}
