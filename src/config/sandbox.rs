//! The plugin sandbox's settings: `[plugins.NAME.sandbox]` (a plugin's own walls, on unless
//! `sandbox = false`) and `[sandbox]` (where instances' private directories and plugins'
//! package caches live, and the user ids plugins may be given). What the kernel can enforce
//! is found at start (`backend::sandbox`); this is only what was asked.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::{ConfigError, invalid};

/// What a plugin's processes may reach (`[plugins.NAME.sandbox]`).
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct SandboxConfig {
    /// Refuse to start the plugin when a rule asked for cannot be enforced here.
    pub required: bool,
    /// Paths its processes may read (and execute), besides the system's and its own.
    pub read: Vec<PathBuf>,
    /// Paths its processes may read and write.
    pub write: Vec<PathBuf>,
    pub network: Network,
    /// With `network = "all"`: TCP connections only to these ports, when given.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub connect_ports: Option<Vec<u16>>,
    /// TCP ports it may listen on (none by default).
    pub bind_ports: Vec<u16>,
    /// Whether it may make Unix sockets (to reach a named one: a Docker or D-Bus socket).
    pub unix_sockets: bool,
    /// Most processes and threads of one instance at once.
    pub max_processes: u32,
    /// Most memory of one instance; over it the instance is killed.
    pub memory_mb: u64,
    /// Its share of the CPU, in percent of one core; unbounded when not given (an instance
    /// in a CPU cgroup of its own costs every call a little: BENCHMARKS.md, Isolation).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cpu_percent: Option<u32>,
    /// Most open files of each of its processes.
    pub max_open_files: u64,
    /// Largest file it may write.
    pub max_file_mb: u64,
}

impl Default for SandboxConfig {
    fn default() -> Self {
        SandboxConfig {
            required: false,
            read: Vec::new(),
            write: Vec::new(),
            network: Network::All,
            connect_ports: None,
            bind_ports: Vec::new(),
            unix_sockets: false,
            max_processes: 256,
            memory_mb: 2048,
            cpu_percent: None,
            max_open_files: 4096,
            max_file_mb: 1024,
        }
    }
}

/// Whether a plugin may use the network at all.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Network {
    #[default]
    All,
    /// No TCP connect or bind (loopback included), and no network at all where a network
    /// namespace can be made.
    None,
}

/// `sandbox = false`, or a table (`sandbox = true` is the defaults).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum SandboxSpec {
    Switch(bool),
    Rules(Box<SandboxConfig>),
}

impl SandboxSpec {
    pub fn into_config(self) -> Option<SandboxConfig> {
        match self {
            SandboxSpec::Switch(false) => None,
            SandboxSpec::Switch(true) => Some(SandboxConfig::default()),
            SandboxSpec::Rules(r) => Some(*r),
        }
    }

    pub fn from_config(c: &Option<SandboxConfig>) -> SandboxSpec {
        match c {
            None => SandboxSpec::Switch(false),
            Some(r) => SandboxSpec::Rules(Box::new(r.clone())),
        }
    }
}

/// `[sandbox]`: what every plugin's sandbox shares.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SandboxSection {
    pub dir: Option<PathBuf>,
    pub uid_range: Option<[u32; 2]>,
    pub remote_networks: Option<Vec<String>>,
}

/// The gateway-wide part of every sandbox.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SandboxSettings {
    /// Instances' private homes and temp directories (`instances/`), and each plugin's
    /// package cache (`plugins/NAME/`).
    pub dir: PathBuf,
    /// User ids plugins are given, one each, when the gateway may change user.
    pub uid_range: Option<(u32, u32)>,
    /// The gateway's own files: its database and the directory it is in, its config file.
    /// Never readable by a plugin, whatever else is granted.
    pub hidden: Vec<PathBuf>,
    /// Networks a remote plugin defined through the admin API may be reached in besides
    /// global unicast addresses (`remote_networks`).
    pub remote_networks: Vec<ipnet::IpNet>,
}

impl Default for SandboxSettings {
    fn default() -> Self {
        SandboxSettings {
            // One per user: a directory another user made first is refused, not shared.
            dir: std::env::temp_dir()
                .join(format!("mcp-gateway-sandbox-{}", nix::unistd::geteuid())),
            uid_range: None,
            hidden: Vec::new(),
            remote_networks: Vec::new(),
        }
    }
}

/// The settings from `[sandbox]`, the database URL, the config file's path and the files
/// secrets are read from (`secret_files`).
pub(super) fn settings(
    section: SandboxSection,
    database_url: &str,
    config_path: Option<&Path>,
    secret_files: &[&Path],
) -> Result<SandboxSettings, ConfigError> {
    let mut s = SandboxSettings::default();
    if let Some(dir) = section.dir {
        if !dir.is_absolute() {
            return Err(invalid("sandbox.dir", "must be an absolute path"));
        }
        s.dir = dir;
    }
    if let Some([first, last]) = section.uid_range {
        if first == 0 || last < first {
            return Err(invalid(
                "sandbox.uid_range",
                "is [first, last], with 0 < first <= last (uid 0 is root)",
            ));
        }
        let (uid, gid) = (
            nix::unistd::geteuid().as_raw(),
            nix::unistd::getegid().as_raw(),
        );
        if (first..=last).contains(&uid) || (first..=last).contains(&gid) {
            return Err(invalid(
                "sandbox.uid_range",
                "holds the gateway's own user or group id: plugins would be the gateway",
            ));
        }
        s.uid_range = Some((first, last));
    }
    for n in section.remote_networks.unwrap_or_default() {
        let net = n
            .parse::<ipnet::IpNet>()
            .or_else(|_| n.parse::<std::net::IpAddr>().map(ipnet::IpNet::from))
            .map_err(|_| {
                invalid(
                    "sandbox.remote_networks",
                    format!("`{n}` is not a network like 10.1.0.0/16 or an address"),
                )
            })?;
        s.remote_networks.push(net);
    }
    let mut hidden: Vec<PathBuf> = Vec::new();
    // Every instance's home and every plugin's cache: a plugin's own are granted by name.
    hidden.push(s.dir.clone());
    if let Some(file) = sqlite_file(database_url) {
        let file = absolute(&file);
        for suffix in ["", "-wal", "-shm", "-journal"] {
            let mut f = file.clone().into_os_string();
            f.push(suffix);
            hidden.push(f.into());
        }
        // Its directory is the gateway's data, unless it is where the gateway was started
        // (a database left at its default, next to what it runs) or the root.
        let cwd = std::env::current_dir().ok();
        if let Some(dir) = file.parent()
            && dir.parent().is_some()
            && Some(dir) != cwd.as_deref()
        {
            hidden.push(dir.to_owned());
        }
    }
    hidden.extend(config_path.map(absolute));
    hidden.extend(secret_files.iter().map(|p| absolute(p)));
    // Compared with grants where they lead, and as written.
    for h in hidden {
        if let Ok(real) = std::fs::canonicalize(&h)
            && real != h
        {
            s.hidden.push(real);
        }
        s.hidden.push(h);
    }
    Ok(s)
}

/// `p` made absolute against the working directory, `..` resolved by name.
fn absolute(p: &Path) -> PathBuf {
    let abs = std::path::absolute(p).unwrap_or_else(|_| p.to_owned());
    let mut out = PathBuf::new();
    for c in abs.components() {
        match c {
            std::path::Component::ParentDir => {
                out.pop();
            }
            std::path::Component::CurDir => {}
            c => out.push(c),
        }
    }
    out
}

/// The file of a SQLite database URL, if it names one.
fn sqlite_file(url: &str) -> Option<PathBuf> {
    let rest = url.strip_prefix("sqlite:")?;
    let rest = rest.strip_prefix("//").unwrap_or(rest);
    let path = rest.split('?').next().unwrap_or_default();
    (!path.is_empty() && !path.starts_with(":memory:")).then(|| PathBuf::from(path))
}

/// Checks a plugin's sandbox table.
pub(super) fn validate(name: &str, s: &SandboxConfig) -> Result<(), ConfigError> {
    let key = |k: &str| format!("plugins.{name}.sandbox.{k}");
    for (k, paths) in [("read", &s.read), ("write", &s.write)] {
        if let Some(p) = paths.iter().find(|p| !p.is_absolute()) {
            return Err(invalid(
                key(k),
                format!("`{}` is not an absolute path", p.display()),
            ));
        }
    }
    if s.network == Network::None && s.connect_ports.is_some() {
        return Err(invalid(
            key("connect_ports"),
            "means nothing with network = \"none\"",
        ));
    }
    for (k, v) in [
        ("max_processes", u64::from(s.max_processes)),
        ("memory_mb", s.memory_mb),
        ("cpu_percent", u64::from(s.cpu_percent.unwrap_or(1))),
        ("max_open_files", s.max_open_files),
        ("max_file_mb", s.max_file_mb),
    ] {
        if v == 0 {
            return Err(invalid(key(k), "must be at least 1"));
        }
    }
    if s.max_open_files < 16 {
        return Err(invalid(key("max_open_files"), "must be at least 16"));
    }
    // Sizes in MiB become bytes: kept where that cannot overflow.
    for (k, v) in [("memory_mb", s.memory_mb), ("max_file_mb", s.max_file_mb)] {
        if v > 1 << 30 {
            return Err(invalid(key(k), "must be at most 1073741824 (1 PiB)"));
        }
    }
    if s.max_open_files > 1 << 20 {
        return Err(invalid(key("max_open_files"), "must be at most 1048576"));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sqlite_files_are_found_in_urls() {
        assert_eq!(
            sqlite_file("sqlite://mcp-gateway.db?mode=rwc"),
            Some("mcp-gateway.db".into())
        );
        assert_eq!(sqlite_file("sqlite:/var/x.db"), Some("/var/x.db".into()));
        assert_eq!(sqlite_file("sqlite::memory:"), None);
        assert_eq!(sqlite_file("postgres://h/db"), None);
    }

    #[test]
    fn a_sandbox_is_a_switch_or_a_table() {
        #[derive(Deserialize)]
        struct P {
            sandbox: SandboxSpec,
        }
        let p: P = toml::from_str("sandbox = false").unwrap();
        assert_eq!(p.sandbox.into_config(), None);
        let p: P = toml::from_str("[sandbox]\nnetwork = \"none\"\nmemory_mb = 64").unwrap();
        let c = p.sandbox.into_config().unwrap();
        assert_eq!(
            (c.network, c.memory_mb, c.max_processes),
            (Network::None, 64, 256)
        );
        assert!(toml::from_str::<P>("[sandbox]\nnetwrk = \"none\"").is_err());
        let mut bad = SandboxConfig {
            read: vec!["rel".into()],
            ..SandboxConfig::default()
        };
        assert!(
            validate("p", &bad)
                .unwrap_err()
                .to_string()
                .contains("sandbox.read")
        );
        bad.read.clear();
        bad.memory_mb = 0;
        assert!(
            validate("p", &bad)
                .unwrap_err()
                .to_string()
                .contains("memory_mb")
        );
    }
}
