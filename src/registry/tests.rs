//! Two registries over one store, as two replicas over one database: what the admin API
//! changes on one is announced, and the other's [`Registry::refresh`] applies it (telling its
//! listener only when something changed).

use std::sync::atomic::AtomicUsize;

use super::*;
use crate::registry::store::MemoryPluginStore;

/// Counts announcements.
#[derive(Default)]
struct Announced(AtomicUsize);

impl ChangeFeed for Announced {
    fn announce(&self) -> std::pin::Pin<Box<dyn Future<Output = ()> + Send + '_>> {
        self.0.fetch_add(1, Ordering::Relaxed);
        Box::pin(std::future::ready(()))
    }
}

/// A plugin that is never started (disabled: no probe).
fn plugin(name: &str) -> PluginConfig {
    PluginConfig::new(name, "true", Vec::new())
}

fn names(r: &Registry) -> Vec<String> {
    let mut n: Vec<String> = r.entries().iter().map(|e| e.name().to_owned()).collect();
    n.sort();
    n
}

#[tokio::test]
async fn a_change_on_one_replica_is_announced_and_applied_by_the_others_refresh() {
    let store: Arc<dyn PluginStore> = Arc::new(MemoryPluginStore::default());
    let config = Config::with_plugins(Vec::new());
    let one = Registry::with_overlay(&config, store.clone(), &BTreeMap::new());
    let two = Registry::with_overlay(&config, store.clone(), &BTreeMap::new());
    let feed = Arc::new(Announced::default());
    one.set_feed(feed.clone());
    let told = Arc::new(AtomicUsize::new(0));
    let t = told.clone();
    two.on_change(move |_| {
        t.fetch_add(1, Ordering::Relaxed);
    });

    one.add(plugin("api"), false).await.unwrap();
    assert_eq!(feed.0.load(Ordering::Relaxed), 1, "the add was announced");
    assert!(two.get("api").is_none(), "not until it refreshes");
    assert!(two.refresh().await.unwrap());
    assert_eq!(names(&two), ["api"]);
    assert_eq!(told.load(Ordering::Relaxed), 1, "its sessions are told");
    assert!(!two.refresh().await.unwrap(), "nothing new");
    assert_eq!(told.load(Ordering::Relaxed), 1, "no news, no notification");

    one.set_enabled("api", false).await.unwrap();
    one.remove("api").await.unwrap();
    assert_eq!(feed.0.load(Ordering::Relaxed), 3);
    assert!(two.refresh().await.unwrap());
    assert!(names(&two).is_empty());
    // The announcing replica's own refresh finds what it has.
    assert!(!one.refresh().await.unwrap());
}

#[tokio::test]
async fn an_overlay_that_conflicts_with_this_replicas_config_file_is_refused_whole() {
    let store: Arc<dyn PluginStore> = Arc::new(MemoryPluginStore::default());
    let one = Registry::with_overlay(
        &Config::with_plugins(Vec::new()),
        store.clone(),
        &BTreeMap::new(),
    );
    // The other replica's config file has a plugin whose prefix the API's would take.
    let mut own = plugin("local");
    own.prefix = Some("api".into());
    let config = Config::with_plugins(vec![own]);
    let two = Registry::with_overlay(&config, store.clone(), &BTreeMap::new());
    one.add(plugin("api"), false).await.unwrap();
    assert!(matches!(
        two.refresh().await,
        Err(RegistryError::Invalid(_))
    ));
    assert_eq!(names(&two), ["local"], "unchanged");
}
