//! The tools this session's plugins list, by plugin and local tool name, with their
//! header-mapped parameters (`x-mcp-header`, 2026-07-28): the router reads a plugin's
//! `tools/list` the first time a `tools/call` to it needs them (only a listed tool is
//! called), and the HTTP layer checks a modern call's `Mcp-Param-*` headers against them. What a plugin listed is forgotten when it says its
//! tools changed, when its instance exits, and when the registry holds another probe of it.
//!
//! It only remembers; it never lists anything itself.

use std::collections::HashMap;
use std::sync::Arc;

use crate::protocol::param_headers::HeaderParam;
use crate::registry::PluginInfo;

/// One plugin's tools, by local name, each with its header-mapped parameters (often none).
pub type ToolParams = HashMap<String, Arc<[HeaderParam]>>;

/// What this session learned of its plugins' tools, by plugin name.
#[derive(Debug, Default)]
pub struct ToolHeaders {
    plugins: HashMap<String, Learned>,
}

#[derive(Debug)]
struct Learned {
    /// The probe of the plugin the list was read under: another one may list other tools.
    info: Arc<PluginInfo>,
    tools: Arc<ToolParams>,
}

impl ToolHeaders {
    /// What `plugin` (as `info` describes it) listed, if it was read since its tools last
    /// changed.
    pub fn get(&self, plugin: &str, info: &Arc<PluginInfo>) -> Option<Arc<ToolParams>> {
        self.plugins
            .get(plugin)
            .filter(|l| Arc::ptr_eq(&l.info, info))
            .map(|l| l.tools.clone())
    }

    pub fn learn(&mut self, plugin: &str, info: Arc<PluginInfo>, tools: Arc<ToolParams>) {
        self.plugins
            .insert(plugin.to_owned(), Learned { info, tools });
    }

    /// `plugin`'s tools changed, or its instance is gone.
    pub fn forget(&mut self, plugin: &str) {
        self.plugins.remove(plugin);
    }
}
