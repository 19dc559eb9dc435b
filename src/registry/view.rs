//! A [`View`]: an immutable snapshot of the usable plugins (enabled, probed) with their name
//! prefixes. The registry rebuilds it on every change; a request is routed against one view
//! from start to end. A view is never changed once published.

use std::sync::{Arc, OnceLock};

use super::{PluginEntry, PluginInfo};

/// A usable plugin, as a view shows it.
#[derive(Debug, Clone)]
pub struct ViewPlugin {
    pub entry: Arc<PluginEntry>,
    pub info: Arc<PluginInfo>,
    /// Prefix of its tool and prompt names, if names are prefixed.
    pub prefix: Option<String>,
}

impl ViewPlugin {
    pub fn name(&self) -> &str {
        self.entry.name()
    }

    pub fn has_capability(&self, name: &str) -> bool {
        self.info
            .capabilities
            .get(name)
            .is_some_and(|c| !c.is_null())
    }
}

/// The usable plugins at one moment.
#[derive(Debug)]
pub struct View {
    pub plugins: Vec<ViewPlugin>,
    pub separator: Arc<str>,
    /// What `initialize` answers with this view, all but the protocol version: the router
    /// makes it on first use, and every later session of the view takes it as it is.
    pub initialize: OnceLock<Box<str>>,
}

impl View {
    pub fn find(&self, name: &str) -> Option<&ViewPlugin> {
        self.plugins.iter().find(|p| p.name() == name)
    }

    /// The same view without the plugins `hide` picks (names keep their prefixes).
    pub fn without(&self, hide: impl Fn(&ViewPlugin) -> bool) -> View {
        View {
            plugins: self.plugins.iter().filter(|p| !hide(p)).cloned().collect(),
            separator: self.separator.clone(),
            initialize: OnceLock::new(),
        }
    }
}
