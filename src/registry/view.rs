//! A [`View`]: an immutable snapshot of the usable plugins (enabled, probed) with their name
//! prefixes. The registry rebuilds it on every change; a request is routed against one view
//! from start to end. A view is never changed once published.

use std::sync::{Arc, OnceLock};

use super::{PluginEntry, PluginInfo};
use crate::config::pattern_matches;

/// A usable plugin, as a view shows it.
#[derive(Debug, Clone)]
pub struct ViewPlugin {
    pub entry: Arc<PluginEntry>,
    pub info: Arc<PluginInfo>,
    /// Prefix of its tool and prompt names, if names are prefixed.
    pub prefix: Option<String>,
    /// Tool name patterns (the plugin's own names) this view's caller may not see or call:
    /// those of the plugin's `tool_access` rules that leave the caller out.
    pub denied_tools: Arc<[String]>,
}

impl ViewPlugin {
    pub fn name(&self) -> &str {
        self.entry.name()
    }

    /// Whether the tool filters, and this view's caller, let `tool` (its own name) through.
    pub fn allows_tool(&self, tool: &str) -> bool {
        self.entry.config.allows_tool(tool)
            && !self.denied_tools.iter().any(|p| pattern_matches(p, tool))
    }

    /// Whether any tool is filtered out, by the config or for this view's caller.
    pub fn filters_tools(&self) -> bool {
        self.entry.config.filters_tools() || !self.denied_tools.is_empty()
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
    /// A plugin of it asks for people's credentials at a session's first request
    /// (`connect = "eager"`).
    pub eager: bool,
}

/// Whether any of `plugins` asks eagerly.
pub(super) fn any_eager(plugins: &[ViewPlugin]) -> bool {
    plugins
        .iter()
        .any(|p| p.entry.config.connect == crate::config::Connect::Eager)
}

impl View {
    pub fn find(&self, name: &str) -> Option<&ViewPlugin> {
        self.plugins.iter().find(|p| p.name() == name)
    }

    /// The same view without the plugins `hide` picks (names keep their prefixes).
    pub fn without(&self, hide: impl Fn(&ViewPlugin) -> bool) -> View {
        self.for_caller(|p| (!hide(p)).then(|| p.denied_tools.clone()))
    }

    /// The same view as one caller sees it: `keep` says, for each plugin, whether the caller
    /// sees it (`None`: not) and which of its tools are denied to the caller.
    pub fn for_caller(&self, keep: impl Fn(&ViewPlugin) -> Option<Arc<[String]>>) -> View {
        let plugins: Vec<ViewPlugin> = self
            .plugins
            .iter()
            .filter_map(|p| {
                let denied_tools = keep(p)?;
                Some(ViewPlugin {
                    denied_tools,
                    ..p.clone()
                })
            })
            .collect();
        View {
            eager: any_eager(&plugins),
            plugins,
            separator: self.separator.clone(),
            initialize: OnceLock::new(),
        }
    }
}
