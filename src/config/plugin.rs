//! Plugins: the validated [`PluginConfig`], its wire form [`PluginSpec`] (a TOML
//! `[plugins.NAME]` table, an admin API body, a stored row), the checks every definition
//! passes, and `${NAME}` expansion of a plugin's environment (what it may refer to of people's
//! credentials is checked in `credentials/`). Nothing here starts a process.

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use clap::ValueEnum;
use serde::{Deserialize, Serialize};

use super::access::{Access, ToolAccess, validate_access};
use super::credentials::{Reference, expand};
use super::remote::{RemoteConfig, RemoteSpec, RemoteTransportKind};
use super::sandbox::{SandboxConfig, SandboxSettings, SandboxSpec};
use super::{Cli, ConfigError, invalid};

/// How a plugin's answers go to the client (`response_mode`, `--response-mode`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum ResponseMode {
    /// An SSE stream: progress, logs and requests related to the call, then the result.
    Sse,
    /// One JSON body with the result; anything the plugin sends meanwhile goes to the GET
    /// stream.
    Json,
}

/// Which era of MCP a plugin speaks (`era`): found by probing, or pinned.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum PluginEra {
    /// Probed legacy first: `initialize`, then `server/discover` if it refuses (or has not
    /// answered within a few seconds); a plugin that speaks both eras is served in the legacy
    /// one, where its requests to the client and its subscriptions work.
    #[default]
    Auto,
    /// `initialize` only: never sent `server/discover` (a legacy server that would mistake
    /// it for something else), even when its answer is slow.
    Legacy,
    /// 2026-07-28 only: never sent `initialize` (a dual-era plugin that does better in the
    /// modern era).
    Modern,
}

/// One MCP server behind the gateway: a stdio process it starts (`command`), or a remote
/// server it reaches over HTTP (`remote`).
#[derive(Debug, Clone, PartialEq)]
pub struct PluginConfig {
    pub name: String,
    /// Empty for a remote plugin.
    pub command: String,
    pub args: Vec<String>,
    pub env: BTreeMap<String, String>,
    pub cwd: Option<PathBuf>,
    /// Prefix of its tool and prompt names; `None` means the plugin's name, and no prefix at
    /// all when it is the only plugin.
    pub prefix: Option<String>,
    pub response_mode: ResponseMode,
    /// How long starting and initializing the child may take.
    pub startup_timeout: Duration,
    /// How long the child gets to exit after its stdin closes, and again after SIGTERM.
    pub shutdown_grace: Duration,
    /// How long a client's request may take; then it gets an error and the plugin is sent
    /// `notifications/cancelled`.
    pub request_timeout: Duration,
    /// Tools shown and callable: only these, when given.
    pub tools_allow: Option<Vec<String>>,
    /// Tools hidden and refused.
    pub tools_deny: Vec<String>,
    /// Most processes of this plugin at once (all sessions).
    pub max_children: Option<usize>,
    /// A session's instance unused this long is stopped (started again on next use).
    pub idle_timeout: Option<Duration>,
    /// How the plugin's processes serve sessions.
    pub process_model: ProcessModel,
    /// `shared`: how many processes share the load.
    pub pool_size: usize,
    /// `per_session`: instances kept started and initialized ahead of demand.
    pub warm: usize,
    /// When a person is asked for a credential this plugin needs and they have not connected.
    pub connect: Connect,
    /// A scope a token needs to see and call this plugin's tools (with `auth.mode`).
    pub scope: Option<String>,
    /// Who may see and use the plugin at all (with `auth.mode`): nobody is left out when it
    /// names no one.
    pub access: Access,
    /// Who may see and call some of its tools, by tool name pattern: a tool is the caller's
    /// only when every rule whose pattern matches its name lets the caller in.
    pub tool_access: Vec<ToolAccess>,
    /// The kernel scheduling policy of the plugin's processes.
    pub scheduling: Scheduling,
    /// Which era it speaks: probed, or pinned.
    pub era: PluginEra,
    /// What its processes may reach; `None`: the sandbox is off (`sandbox = false`).
    pub sandbox: Option<SandboxConfig>,
    /// The gateway-wide part of its sandbox (set by the registry, not by its definition).
    pub host: Arc<SandboxSettings>,
    /// The user id its processes run as, when the gateway may change user (set by the
    /// registry from `sandbox.uid_range`).
    pub uid: Option<u32>,
    /// Where a remote plugin is reached (`url`, `headers`, ...); `None` for a process.
    pub remote: Option<Arc<RemoteConfig>>,
}

/// How the kernel schedules a plugin's processes (Linux; elsewhere it has no effect).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Scheduling {
    /// `SCHED_BATCH`: the same share of the CPU, but a plugin woken by a request does not
    /// preempt the thread that woke it. The gateway's threads finish what they are doing
    /// (answering clients, writing to other plugins) before the plugin runs, instead of
    /// switching to it at every message.
    #[default]
    Batch,
    /// The kernel's default policy (`SCHED_OTHER`).
    Normal,
}

/// When a person is asked to connect a credential a plugin needs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Connect {
    /// At the first call that needs it.
    #[default]
    OnCall,
    /// At the first request of a legacy session (2026-07-28 calls have no session: at the
    /// first call).
    Eager,
}

/// How a plugin's processes serve sessions.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ProcessModel {
    /// One process per session, started on the session's first use (isolation).
    #[default]
    PerSession,
    /// One process (or a pool) for all sessions: for servers safe to share.
    Shared,
    /// One process per person (the token's subject), shared by all their sessions and
    /// 2026-07-28 calls: for servers that hold one person's state or credentials.
    PerSubject,
}

impl PluginConfig {
    /// A plugin with the defaults, for quick mode and tests.
    pub fn new(name: impl Into<String>, command: impl Into<String>, args: Vec<String>) -> Self {
        PluginConfig {
            name: name.into(),
            command: command.into(),
            args,
            env: BTreeMap::new(),
            cwd: None,
            prefix: None,
            response_mode: ResponseMode::Sse,
            startup_timeout: Duration::from_secs(60),
            shutdown_grace: Duration::from_secs(2),
            request_timeout: Duration::from_secs(300),
            tools_allow: None,
            tools_deny: Vec::new(),
            max_children: None,
            idle_timeout: None,
            process_model: ProcessModel::PerSession,
            pool_size: 1,
            warm: 0,
            connect: Connect::OnCall,
            scope: None,
            access: Access::default(),
            tool_access: Vec::new(),
            scheduling: Scheduling::Batch,
            era: PluginEra::Auto,
            sandbox: Some(SandboxConfig::default()),
            host: Arc::default(),
            uid: None,
            remote: None,
        }
    }

    /// A remote plugin with the defaults, reached at `remote`'s URL.
    pub fn remote(name: impl Into<String>, remote: RemoteConfig) -> Self {
        let mut c = PluginConfig::new(name, String::new(), Vec::new());
        c.sandbox = None;
        c.remote = Some(Arc::new(remote));
        c
    }

    /// The values that may refer to the environment and to people's credentials, by key:
    /// `env`, `args` and a remote plugin's `headers`.
    pub fn referring_values(&self) -> impl Iterator<Item = (String, &String)> {
        let headers = self.remote.iter().flat_map(|r| r.headers.iter());
        self.env
            .iter()
            .map(|(k, v)| (format!("env.{k}"), v))
            .chain(
                self.args
                    .iter()
                    .enumerate()
                    .map(|(i, a)| (format!("args[{i}]"), a)),
            )
            .chain(headers.map(|(k, v)| (format!("headers.{k}"), v)))
    }

    /// Whether the tool filters let `tool` through.
    pub fn allows_tool(&self, tool: &str) -> bool {
        self.tools_allow
            .as_ref()
            .is_none_or(|a| a.iter().any(|t| t == tool))
            && !self.tools_deny.iter().any(|t| t == tool)
    }

    /// Whether any tool filter is set.
    pub fn filters_tools(&self) -> bool {
        self.tools_allow.is_some() || !self.tools_deny.is_empty()
    }

    /// Whether it has rules about who may use it or its tools.
    pub fn restricts_callers(&self) -> bool {
        self.access.restricts() || !self.tool_access.is_empty()
    }

    /// The tool name patterns of the `tool_access` rules that leave out the caller `subject`,
    /// a member of `groups`.
    pub fn tools_denied_to(&self, subject: &str, groups: &BTreeSet<String>) -> Vec<String> {
        self.tool_access
            .iter()
            .filter(|r| !r.access().admits(subject, groups))
            .flat_map(|r| r.tools.iter().cloned())
            .collect()
    }

    /// The command line as one string, for logs; a remote plugin's URL.
    pub fn command_line(&self) -> String {
        if let Some(r) = &self.remote {
            return r.display_url();
        }
        std::iter::once(self.command.as_str())
            .chain(self.args.iter().map(String::as_str))
            .collect::<Vec<_>>()
            .join(" ")
    }
}

/// A plugin's definition as written in TOML (`[plugins.NAME]`), sent to the admin API, and
/// stored: everything but the name.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PluginSpec {
    /// A stdio plugin's program; none for a remote one (`url`).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub command: String,
    #[serde(default)]
    pub args: Vec<String>,
    /// Values may reference the gateway's environment (`${GITHUB_TOKEN}`).
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cwd: Option<PathBuf>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prefix: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub response_mode: Option<ResponseMode>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub startup_timeout_secs: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shutdown_grace_secs: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub request_timeout_secs: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tools_allow: Option<Vec<String>>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tools_deny: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_children: Option<usize>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub idle_timeout_secs: Option<u64>,
    #[serde(default)]
    pub process_model: ProcessModel,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pool_size: Option<usize>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub warm: Option<usize>,
    #[serde(default, skip_serializing_if = "is_on_call")]
    pub connect: Connect,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scope: Option<String>,
    /// Who may see and use the plugin (with `auth.mode`); anyone when none is named.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub allow_groups: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub allow_subjects: Vec<String>,
    /// Who may see and call tools whose names match a pattern.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tool_access: Vec<ToolAccess>,
    #[serde(default)]
    pub scheduling: Scheduling,
    #[serde(default, skip_serializing_if = "is_auto")]
    pub era: PluginEra,
    /// `false`, or the sandbox's rules; on with the defaults when left out.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sandbox: Option<SandboxSpec>,
    /// Only meaningful in a config file (the API has enable/disable).
    #[serde(default = "yes", skip_serializing)]
    pub enabled: bool,
    // A remote plugin (config::remote): its upstream's URL, transport, headers and limits.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub url: Option<String>,
    #[serde(default, skip_serializing_if = "is_auto_transport")]
    pub transport: RemoteTransportKind,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub headers: BTreeMap<String, String>,
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub allow_insecure: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub connect_timeout_secs: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub read_timeout_secs: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_message_bytes: Option<usize>,
}

fn is_auto_transport(t: &RemoteTransportKind) -> bool {
    *t == RemoteTransportKind::Auto
}

fn yes() -> bool {
    true
}

fn is_on_call(c: &Connect) -> bool {
    *c == Connect::OnCall
}

fn is_auto(era: &PluginEra) -> bool {
    *era == PluginEra::Auto
}

impl PluginSpec {
    pub fn into_config(self, name: String) -> PluginConfig {
        let mut c = PluginConfig::new(name, self.command, self.args);
        c.env = self.env;
        c.cwd = self.cwd;
        c.prefix = self.prefix;
        if let Some(m) = self.response_mode {
            c.response_mode = m;
        }
        if let Some(s) = self.startup_timeout_secs {
            c.startup_timeout = Duration::from_secs(s);
        }
        if let Some(s) = self.shutdown_grace_secs {
            c.shutdown_grace = Duration::from_secs(s);
        }
        if let Some(s) = self.request_timeout_secs {
            c.request_timeout = Duration::from_secs(s);
        }
        c.tools_allow = self.tools_allow;
        c.tools_deny = self.tools_deny;
        c.max_children = self.max_children;
        c.idle_timeout = self.idle_timeout_secs.map(Duration::from_secs);
        c.process_model = self.process_model;
        c.pool_size = self.pool_size.unwrap_or(1);
        c.warm = self.warm.unwrap_or(0);
        c.connect = self.connect;
        c.scope = self.scope;
        c.access = Access {
            allow_groups: self.allow_groups,
            allow_subjects: self.allow_subjects,
        };
        c.tool_access = self.tool_access;
        c.scheduling = self.scheduling;
        c.era = self.era;
        if let Some(s) = self.sandbox {
            c.sandbox = s.into_config();
        }
        let remote = RemoteSpec {
            url: self.url,
            transport: self.transport,
            headers: self.headers,
            allow_insecure: self.allow_insecure,
            connect_timeout_secs: self.connect_timeout_secs,
            read_timeout_secs: self.read_timeout_secs,
            max_message_bytes: self.max_message_bytes,
        };
        if let Some(r) = remote.into_config() {
            // Nothing runs here to be sandboxed.
            c.sandbox = None;
            c.remote = Some(Arc::new(r));
        }
        c
    }

    pub fn from_config(c: &PluginConfig) -> PluginSpec {
        let remote = RemoteSpec::from_config(c.remote.as_deref());
        PluginSpec {
            command: c.command.clone(),
            args: c.args.clone(),
            env: c.env.clone(),
            cwd: c.cwd.clone(),
            prefix: c.prefix.clone(),
            response_mode: Some(c.response_mode),
            startup_timeout_secs: Some(c.startup_timeout.as_secs()),
            shutdown_grace_secs: Some(c.shutdown_grace.as_secs()),
            request_timeout_secs: Some(c.request_timeout.as_secs()),
            tools_allow: c.tools_allow.clone(),
            tools_deny: c.tools_deny.clone(),
            max_children: c.max_children,
            idle_timeout_secs: c.idle_timeout.map(|d| d.as_secs()),
            process_model: c.process_model,
            pool_size: Some(c.pool_size),
            warm: Some(c.warm),
            connect: c.connect,
            scope: c.scope.clone(),
            allow_groups: c.access.allow_groups.clone(),
            allow_subjects: c.access.allow_subjects.clone(),
            tool_access: c.tool_access.clone(),
            scheduling: c.scheduling,
            era: c.era,
            sandbox: (c.remote.is_none() && c.sandbox != Some(SandboxConfig::default()))
                .then(|| SandboxSpec::from_config(&c.sandbox)),
            enabled: true,
            url: remote.url,
            transport: remote.transport,
            headers: remote.headers,
            allow_insecure: remote.allow_insecure,
            connect_timeout_secs: remote.connect_timeout_secs,
            read_timeout_secs: remote.read_timeout_secs,
            max_message_bytes: remote.max_message_bytes,
        }
    }
}

/// The gateway's own environment variables that hold a secret: a plugin may not name them
/// in its `env`, and does not inherit them. The Redis URL is one (its password, and a plugin
/// with it could read every session's record and events), and so is the cluster secret (a
/// plugin with it could speak to a replica as another replica), and so is the upstream
/// OpenID provider's client secret.
pub const SECRET_ENV_VARS: &[&str] = &[
    "MCP_GATEWAY_ADMIN_TOKEN",
    "MCP_GATEWAY_DATABASE_URL",
    "MCP_GATEWAY_REDIS_URL",
    "MCP_GATEWAY_CLUSTER_SECRET",
    super::upstream::UPSTREAM_SECRET_ENV,
    super::external::INTROSPECTION_SECRET_ENV,
    super::credentials::CREDENTIALS_KEY_ENV,
];

/// Replaces each `${NAME}` in `value` with the gateway's environment variable NAME. Secrets
/// stay out of config files and the database this way. A credential's reference
/// (`${credential:NAME}`) is refused: only a caller's own instance has one.
pub fn expand_env(value: &str, lookup: impl Fn(&str) -> Option<String>) -> Result<String, String> {
    expand(value, |r| match r {
        Reference::Env(name) => lookup(name)
            .ok_or_else(|| format!("`${{{name}}}` is not set in the gateway's environment")),
        Reference::Credential(n) | Reference::CredentialFile(n) => Err(format!(
            "`{n}` is a person's credential, and this process serves no one person"
        )),
    })
}

/// The longest tool name the spec allows (2025-11-25, "Tool names"); the gateway holds prompt
/// names to it too.
pub const MAX_TOOL_NAME_LEN: usize = 128;

/// The longest prefix with its separator: the rest of [`MAX_TOOL_NAME_LEN`] is left to the
/// plugin's own names.
pub const MAX_PREFIX_LEN: usize = 64;

/// Whether a character may be part of a tool name: ASCII letters and digits, `_`, `-`, `.`.
pub fn tool_name_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.')
}

/// Checks one plugin's definition (name, command, prefix, env, the credentials it uses among
/// those defined, `credentials`).
pub fn validate_plugin(
    p: &PluginConfig,
    separator: &str,
    credentials: &[String],
) -> Result<(), ConfigError> {
    let key = |k: &str| format!("plugins.{}.{k}", p.name);
    if p.name.is_empty()
        || !p
            .name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
    {
        return Err(invalid(
            format!("plugins.{}", p.name),
            "a plugin name is letters, digits, '-' and '_'",
        ));
    }
    if let Some(r) = &p.remote {
        if !p.command.is_empty() || !p.args.is_empty() || !p.env.is_empty() || p.cwd.is_some() {
            return Err(invalid(
                key("url"),
                "a remote plugin has no command, args, env or cwd: it is not started, it is reached",
            ));
        }
        r.validate(&p.name)?;
    } else if p.command.trim().is_empty() {
        return Err(invalid(
            key("command"),
            "must not be empty (or give `url` for a remote plugin)",
        ));
    }
    if p.pool_size == 0 {
        return Err(invalid(key("pool_size"), "must be at least 1"));
    }
    if p.process_model != ProcessModel::PerSession && p.warm > 0 {
        return Err(invalid(
            key("warm"),
            "a warm pool is for per_session plugins; a shared or per_subject one is started on use",
        ));
    }
    if p.prefix.as_deref().is_some_and(|x| x.trim().is_empty()) {
        return Err(invalid(
            key("prefix"),
            "must not be empty (names would start with the separator); leave it out to use the plugin's name",
        ));
    }
    for (var, value) in &p.env {
        let named = std::cell::RefCell::new(None);
        let _ = expand_env(value, |n| {
            if super::secrets::is_secret_env(n) {
                named.borrow_mut().get_or_insert_with(|| n.to_owned());
            }
            Some(String::new())
        });
        if let Some(secret) = named.into_inner() {
            return Err(invalid(
                key(&format!("env.{var}")),
                format!(
                    "refers to `${{{secret}}}`, a secret of the gateway's own; a plugin may not be given it"
                ),
            ));
        }
    }
    super::credentials::check_plugin(p, credentials)?;
    validate_access(p)?;
    if let Some(s) = &p.sandbox {
        super::sandbox::validate(&p.name, s)?;
    }
    let prefix = p.prefix.as_deref().unwrap_or(&p.name);
    if prefix.contains(separator) {
        return Err(invalid(
            key("prefix"),
            format!(
                "`{prefix}` contains the separator `{separator}`, so names could not be split back"
            ),
        ));
    }
    // With several plugins the prefix (the plugin's name, unless set) begins every tool and
    // prompt name of the plugin: it must be made of what a tool name may hold, and leave room.
    if !prefix.chars().all(tool_name_char) {
        return Err(invalid(
            key("prefix"),
            format!(
                "`{prefix}` would begin this plugin's tool names, which may hold only ASCII letters, digits, '_', '-' and '.'"
            ),
        ));
    }
    let long = prefix.chars().count() + separator.chars().count();
    if long > MAX_PREFIX_LEN {
        return Err(invalid(
            key("prefix"),
            format!(
                "`{prefix}` and the separator `{separator}` are {long} characters; at most {MAX_PREFIX_LEN} are allowed, so this plugin's tool names stay within {MAX_TOOL_NAME_LEN}"
            ),
        ));
    }
    Ok(())
}

/// The plugins section: the file's plugins and the quick-mode one, each checked, their
/// prefixes distinct.
pub(super) fn plugins(
    cli: &Cli,
    mut plugins: Vec<PluginConfig>,
    separator: &str,
    credentials: &[String],
) -> Result<Vec<PluginConfig>, ConfigError> {
    if let Some((command, args)) = cli.command_line.split_first() {
        let name = cli.plugin_name.clone().unwrap_or_else(|| "stdio".into());
        if plugins.iter().any(|p| p.name == name) {
            return Err(invalid(
                "plugin_name",
                format!(
                    "the quick-mode plugin's name `{name}` is taken by the config file; pick another with --plugin-name"
                ),
            ));
        }
        let mut p = PluginConfig::new(name, command.clone(), args.to_vec());
        if let Some(mode) = cli.response_mode {
            p.response_mode = mode;
        }
        plugins.push(p);
    }
    if plugins.is_empty() {
        return Err(ConfigError::NoPlugins);
    }
    for p in &plugins {
        validate_plugin(p, separator, credentials)?;
    }
    let mut prefixes = std::collections::HashMap::new();
    for p in &plugins {
        let prefix = p.prefix.as_deref().unwrap_or(&p.name);
        if let Some(other) = prefixes.insert(prefix, &p.name) {
            return Err(invalid(
                format!("plugins.{}.prefix", p.name),
                format!(
                    "`{prefix}` is also the prefix of plugin `{other}`; each plugin needs its own"
                ),
            ));
        }
    }
    Ok(plugins)
}

#[cfg(test)]
#[path = "plugin_tests.rs"]
mod tests;
