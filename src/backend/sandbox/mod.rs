//! The plugin sandbox: each plugin instance runs behind walls the kernel keeps, with only
//! what an unprivileged process can ask for (and more where the gateway has the privilege).
//!
//! The parent prepares everything before the fork ([`prepare`]): the instance's private home
//! and temp directory, its plugin's package cache, the Landlock ruleset (filesystem, TCP
//! ports, signals, abstract sockets; ptrace and `/proc/PID` follow from the domain), a cgroup
//! (memory, process count, CPU), rlimits, and the user it becomes. The child applies it
//! ([`child`]) between `fork` and `exec`. What this machine cannot enforce is found once by
//! [`probe`] and said per plugin ([`isolation`]); with `sandbox.required` a plugin missing
//! any rule does not start. When the instance ends, [`Prepared::finish`] says which bound
//! the kernel enforced on it and removes what was made for it.

mod cgroup;
mod child;
mod files;
mod paths;
pub mod probe;
mod seccomp;

pub use files::CredentialFiles;

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

use landlock::{
    ABI, Access, AccessFs, AccessNet, NetPort, Ruleset, RulesetAttr, RulesetCreated,
    RulesetCreatedAttr, Scope, path_beneath_rules,
};
use nix::fcntl::{Flock, FlockArg};
use nix::libc;
use serde::Serialize;

use crate::config::{Network, PluginConfig, SandboxConfig};
use cgroup::InstanceCgroup;
use child::ChildPlan;

/// One rule of a plugin's sandbox and whether this machine enforces it.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct Rule {
    pub rule: &'static str,
    pub enforced: bool,
    /// How, or why not.
    pub how: String,
}

/// A plugin's effective isolation: every rule its sandbox asks for.
#[derive(Debug, Clone, Serialize, PartialEq, Eq, Default)]
pub struct Isolation {
    pub sandboxed: bool,
    pub rules: Vec<Rule>,
}

impl Isolation {
    /// The rules that could not be applied, named for `last_error` and warnings.
    pub fn missing(&self) -> Vec<String> {
        self.rules
            .iter()
            .filter(|r| !r.enforced)
            .map(|r| format!("{} ({})", r.rule, r.how))
            .collect()
    }
}

/// What `config`'s sandbox gets on this machine.
pub fn isolation(config: &PluginConfig) -> Isolation {
    let Some(s) = &config.sandbox else {
        return Isolation::default();
    };
    let p = probe::get();
    let ll = p.landlock;
    let mut rules = Vec::new();
    let mut rule = |rule: &'static str, enforced: bool, how: String| {
        rules.push(Rule {
            rule,
            enforced,
            how,
        })
    };
    let landlock = |min: i32| {
        if ll >= min {
            format!("Landlock ABI {ll}")
        } else if ll == 0 {
            "the kernel has no Landlock".to_owned()
        } else {
            format!("needs Landlock ABI {min}, the kernel has {ll}")
        }
    };
    // Before ABI 3 Landlock did not cover truncate(2): the gateway's files could be emptied.
    rule("filesystem", ll >= 3, landlock(3));
    rule("ptrace_and_proc", ll >= 1, landlock(1));
    rule("signals", ll >= 6, landlock(6));
    rule("abstract_sockets", ll >= 6, landlock(6));
    rule("bind_ports", ll >= 4, landlock(4));
    match s.network {
        Network::None => {
            rule("network_tcp", ll >= 4, landlock(4));
            let netns = p.netns != probe::NetNs::Unavailable;
            rule(
                "network_namespace",
                netns,
                if netns {
                    "a network namespace of its own".into()
                } else {
                    "no network namespace can be made here (UDP stays open)".into()
                },
            );
        }
        Network::All if s.connect_ports.is_some() => rule("connect_ports", ll >= 4, landlock(4)),
        Network::All => {}
    }
    let cg = p.cgroups.as_ref();
    let cgroup_how = |what: &str| match cg {
        Some(c) => format!("cgroup {}", c.describe()),
        None => format!("no writable cgroup hierarchy: {what}"),
    };
    rule(
        "memory",
        cg.is_some(),
        cgroup_how("allocations past it fail (RLIMIT_DATA) instead of the instance being killed"),
    );
    let separate = uid_possible(config);
    rule(
        "processes",
        cg.is_some(),
        cgroup_how(if separate {
            "counted per plugin user (RLIMIT_NPROC)"
        } else {
            "not bounded"
        }),
    );
    if s.cpu_percent.is_some() {
        rule(
            "cpu",
            cg.is_some_and(|c| c.has_cpu()),
            cgroup_how("not bounded"),
        );
    }
    rule(
        "limits",
        true,
        "rlimits: open files, file size, no core dumps".into(),
    );
    rule("capabilities", true, "none held, no_new_privs set".into());
    let seccomp = p.seccomp;
    let filter = |what: &str| {
        if seccomp {
            format!("seccomp: {what}")
        } else {
            "the kernel takes no seccomp filter".to_owned()
        }
    };
    rule(
        "process_controls",
        seccomp,
        filter("no prlimit, setpriority or sched_set* on another process, no set-id bits"),
    );
    if !s.unix_sockets {
        rule(
            "unix_sockets",
            seccomp,
            filter("no Unix socket can be made"),
        );
    }
    let root = nix::unistd::geteuid().is_root();
    match config.host.uid_range {
        Some((first, last)) => rule(
            "user",
            separate,
            if separate {
                format!("a user id of its own from {first}-{last}")
            } else if config.uid.is_none() {
                format!("no id left for it in sandbox.uid_range {first}-{last}")
            } else {
                "changing user needs root or CAP_SETUID and CAP_SETGID, which the gateway lacks"
                    .into()
            },
        ),
        // Root's uid without capabilities still owns root's files (chmod is not Landlock's).
        None if root => rule(
            "user",
            false,
            "runs as uid 0 without capabilities, owner of root's files: set sandbox.uid_range"
                .into(),
        ),
        None => {}
    }
    Isolation {
        sandboxed: true,
        rules,
    }
}

fn uid_possible(config: &PluginConfig) -> bool {
    config.uid.is_some() && probe::get().may_change_user
}

/// Why a sandbox could not be made.
#[derive(Debug, thiserror::Error)]
pub enum SandboxError {
    #[error("sandbox.required is set, and this machine cannot enforce: {0}")]
    Required(String),
    #[error("sandbox: {0}")]
    Setup(String),
}

/// An instance's sandbox, made and ready to be applied by its child.
pub struct Prepared {
    /// Variables its processes get besides PATH, LANG, TZ and the plugin's own.
    pub env: Vec<(&'static str, PathBuf)>,
    plan: Option<ChildPlan>,
    cgroup: Option<InstanceCgroup>,
    dir: Option<PathBuf>,
    memory_mb: u64,
    max_processes: u32,
    plugin: String,
    /// Its home, where the files of `${credential_file:NAME}` go.
    home: PathBuf,
    /// The user and group it runs as, when the gateway may change user.
    user: Option<(u32, u32)>,
}

/// Makes instance `instance`'s sandbox (`None` when its plugin has none).
pub fn prepare(config: &PluginConfig, instance: &str) -> Result<Option<Prepared>, SandboxError> {
    let Some(s) = &config.sandbox else {
        return Ok(None);
    };
    let iso = isolation(config);
    let missing = iso.missing();
    if s.required && !missing.is_empty() {
        return Err(SandboxError::Required(missing.join("; ")));
    }
    if !missing.is_empty() {
        static WARNED: std::sync::LazyLock<std::sync::Mutex<std::collections::HashSet<String>>> =
            std::sync::LazyLock::new(Default::default);
        if WARNED
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(config.name.clone())
        {
            tracing::warn!(plugin = %config.name, "plugin sandbox: starting with what this machine can enforce; not applied: {}", missing.join("; "));
        }
    }
    let p = probe::get();
    let setup = |what: &str, e: &dyn std::fmt::Display| SandboxError::Setup(format!("{what}: {e}"));
    let user = uid_possible(config).then(|| {
        let uid = config.uid.expect("uid_possible");
        (uid, uid)
    });
    // Its directories: the instance's home and temp, its plugin's package cache.
    let root = &config.host.dir;
    owned_dir(root, 0o711).map_err(|e| setup("its directory", &e))?;
    let instances = root.join("instances");
    owned_dir(&instances, 0o711).map_err(|e| setup("its directory", &e))?;
    static SWEPT: std::sync::Once = std::sync::Once::new();
    SWEPT.call_once(|| {
        if let Err(e) = hold_run_lock(&instances) {
            tracing::warn!(
                "plugin sandbox: no lock of this run in {}: {e}",
                instances.display()
            );
        }
        sweep(&instances);
    });
    let name = format!("{}{instance}", run_prefix());
    let dir = instances.join(&name);
    let (home, tmp) = (dir.join("home"), dir.join("tmp"));
    let plugins = root.join("plugins");
    owned_dir(&plugins, 0o711).map_err(|e| setup("its directory", &e))?;
    let cache = plugins.join(&config.name);
    let made = (|| {
        std::fs::create_dir(&dir)?;
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700))?;
        std::fs::create_dir(&home)?;
        std::fs::create_dir(&tmp)?;
        // Another instance (or another gateway on this machine) may make it at the same time.
        match std::fs::create_dir(&cache) {
            Ok(()) => {
                std::fs::set_permissions(&cache, std::fs::Permissions::from_mode(0o700))?;
                if let Some((uid, gid)) = user {
                    std::os::unix::fs::lchown(&cache, Some(uid), Some(gid))?;
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
            Err(e) => return Err(e),
        }
        if let Some((uid, gid)) = user {
            for d in [&dir, &home, &tmp] {
                std::os::unix::fs::lchown(d, Some(uid), Some(gid))?;
            }
            if std::fs::symlink_metadata(&cache)?.uid() != uid {
                // Made by another user id (the plugins' ids moved): not chowned in place,
                // where its old owner could swap a directory for a link under the walk; set
                // aside and removed, and the plugin starts with an empty cache.
                let old = plugins.join(format!(
                    ".old-{}-{:08x}",
                    config.name,
                    rand::random::<u32>()
                ));
                std::fs::rename(&cache, &old)?;
                std::thread::spawn(move || std::fs::remove_dir_all(old));
                std::fs::create_dir(&cache)?;
                std::fs::set_permissions(&cache, std::fs::Permissions::from_mode(0o700))?;
                std::os::unix::fs::lchown(&cache, Some(uid), Some(gid))?;
            }
        }
        Ok::<_, std::io::Error>(())
    })();
    let mut prepared = Prepared {
        env: vec![
            ("HOME", home.clone()),
            ("TMPDIR", tmp.clone()),
            ("npm_config_cache", cache.join("npm")),
            ("XDG_CACHE_HOME", cache.join("xdg")),
            ("UV_CACHE_DIR", cache.join("uv")),
            ("UV_TOOL_DIR", cache.join("uv-tools")),
            ("UV_PYTHON_INSTALL_DIR", cache.join("uv-python")),
            ("PIP_CACHE_DIR", cache.join("pip")),
        ],
        plan: None,
        cgroup: None,
        dir: Some(dir.clone()),
        memory_mb: s.memory_mb,
        max_processes: s.max_processes,
        plugin: config.name.clone(),
        home: home.clone(),
        user,
    };
    made.map_err(|e| setup(&format!("making {}", dir.display()), &e))?;
    if let Some(c) = &p.cgroups {
        prepared.cgroup = Some(c.create(&name, s).map_err(|e| setup("its cgroup", &e))?);
    }
    let path_env = std::env::var("PATH").unwrap_or_default();
    let grants = paths::grants(config, &[&home, &tmp, &cache], &path_env);
    let ruleset = (p.landlock >= 1)
        .then(|| landlock_rules(p.landlock, &grants, s))
        .transpose()
        .map_err(|e| setup("its Landlock rules", &e))?;
    let mut rlimits = vec![
        (libc::RLIMIT_CORE, 0),
        (libc::RLIMIT_NOFILE, s.max_open_files),
        (libc::RLIMIT_FSIZE, s.max_file_mb * 1024 * 1024),
    ];
    if p.cgroups.is_none() {
        rlimits.push((libc::RLIMIT_DATA, s.memory_mb * 1024 * 1024));
        if user.is_some() {
            rlimits.push((libc::RLIMIT_NPROC, u64::from(s.max_processes)));
        }
    }
    // A value past this process's own hard limit is refused unless it may raise limits.
    if !nix::unistd::geteuid().is_root() {
        for (resource, value) in &mut rlimits {
            let mut hard = libc::rlimit {
                rlim_cur: 0,
                rlim_max: 0,
            };
            // SAFETY: reads this process's limit into a live struct.
            #[allow(unsafe_code)]
            if unsafe { libc::getrlimit(*resource, &mut hard) } == 0 {
                *value = (*value).min(hard.rlim_max);
            }
        }
    }
    let seccomp = p
        .seccomp
        .then(|| seccomp::program(s))
        .transpose()
        .map_err(|e| setup("its seccomp filter", &e))?;
    // A user namespace's maps hold only the gateway's own ids: no other user inside it.
    let netns = match p.netns {
        probe::NetNs::InUserNs if user.is_some() => probe::NetNs::Unavailable,
        n => n,
    };
    let (uid, gid) = (nix::unistd::geteuid(), nix::unistd::getegid());
    prepared.plan = Some(ChildPlan {
        seccomp,
        netns: (s.network == Network::None).then_some(netns),
        id_maps: (format!("{uid} {uid} 1\n"), format!("{gid} {gid} 1\n")),
        cgroup_procs: prepared
            .cgroup
            .as_ref()
            .map(InstanceCgroup::procs_fds)
            .unwrap_or_default(),
        rlimits,
        user,
        drop_bounding: p.may_drop_bounding,
        ruleset,
    });
    Ok(Some(prepared))
}

fn landlock_rules(
    n: i32,
    grants: &paths::Grants,
    s: &SandboxConfig,
) -> Result<RulesetCreated, landlock::RulesetError> {
    let abi = ABI::from(n);
    let all = AccessFs::from_all(abi);
    let mut r = Ruleset::default().handle_access(all)?;
    if n >= 4 {
        r = if s.network == Network::None || s.connect_ports.is_some() {
            r.handle_access(AccessNet::BindTcp | AccessNet::ConnectTcp)?
        } else {
            r.handle_access(AccessNet::BindTcp)?
        };
    }
    if n >= 6 {
        r = r.scope(Scope::from_all(abi))?;
    }
    let mut c = r
        .create()?
        .add_rules(path_beneath_rules(&grants.read, AccessFs::from_read(abi)))?
        .add_rules(path_beneath_rules(&grants.write, all))?;
    if n >= 4 && s.network == Network::All {
        for port in s.connect_ports.iter().flatten() {
            c = c.add_rule(NetPort::new(*port, AccessNet::ConnectTcp))?;
        }
        for port in &s.bind_ports {
            c = c.add_rule(NetPort::new(*port, AccessNet::BindTcp))?;
        }
    }
    Ok(c.no_new_privs(true))
}

impl Prepared {
    /// Where its credential files are, to write them again while it runs.
    pub fn credential_files(&self) -> Option<CredentialFiles> {
        Some(CredentialFiles {
            instance: self.dir.clone()?,
            user: self.user,
        })
    }

    /// Writes `value` into a file of the instance's own (`$HOME/.credentials/NAME`, mode
    /// 0600, its user's), for `${credential_file:NAME}`: its path. Only this instance's
    /// processes reach it (its home is theirs alone), and it goes with the instance.
    pub fn credential_file(&self, name: &str, value: &str) -> std::io::Result<PathBuf> {
        use std::io::Write as _;
        use std::os::unix::fs::OpenOptionsExt as _;
        let dir = self.home.join(".credentials");
        match std::fs::create_dir(&dir) {
            Ok(()) => {
                std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700))?;
                if let Some((uid, gid)) = self.user {
                    std::os::unix::fs::lchown(&dir, Some(uid), Some(gid))?;
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
            Err(e) => return Err(e),
        }
        let path = dir.join(name);
        let mut file = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .custom_flags(libc::O_NOFOLLOW)
            .open(&path)?;
        file.write_all(value.as_bytes())?;
        if let Some((uid, gid)) = self.user {
            std::os::unix::fs::fchown(&file, Some(uid), Some(gid))?;
        }
        Ok(path)
    }

    /// Makes `cmd`'s child apply the sandbox before `exec`.
    pub fn install(&mut self, cmd: &mut tokio::process::Command) {
        if let Some(mut plan) = self.plan.take() {
            // SAFETY: `apply` makes only async-signal-safe system calls on values prepared
            // here, as a child of a multi-threaded process must (child.rs).
            #[allow(unsafe_code)]
            unsafe {
                cmd.pre_exec(move || plan.apply());
            }
        }
    }

    /// Once its child `pid` is started: the files it joined its cgroups through are closed, and
    /// it is the one the kernel kills first when the machine runs out of memory (written from
    /// here: the child, a copy of the non-dumpable gateway until its exec, may not).
    pub fn spawned(&mut self, pid: u32) {
        if let Some(c) = &mut self.cgroup {
            c.joined();
        }
        if let Err(e) = std::fs::write(format!("/proc/{pid}/oom_score_adj"), "1000") {
            tracing::debug!(plugin = %self.plugin, "oom_score_adj not set: {e}");
        }
    }

    /// Once the instance's first process has ended: which bound the kernel held it to, if it
    /// hit one, said for `last_error` (and counted); then its leftovers are killed and its directories and
    /// cgroup removed (in the background).
    pub fn finish(self) -> Option<String> {
        let hit = self.cgroup.as_ref().map(InstanceCgroup::bounds_hit);
        let note = match hit {
            Some((true, _)) => Some(format!(
                "killed by the kernel over its memory bound (sandbox.memory_mb = {})",
                self.memory_mb
            )),
            Some((false, true)) => Some(format!(
                "it reached its process bound (sandbox.max_processes = {})",
                self.max_processes
            )),
            _ => None,
        };
        if let Some((memory, processes)) = hit {
            let m = &crate::metrics::get().plugin_bounds_hit;
            if memory {
                m.with_label_values(&[self.plugin.as_str(), "memory"]).inc();
            }
            if processes {
                m.with_label_values(&[self.plugin.as_str(), "processes"])
                    .inc();
            }
        }
        // Its first process is gone, so the instance is over: dropping it removes the rest.
        note
    }
}

impl Drop for Prepared {
    /// What was made for the instance goes with it, on every path (a spawn that failed
    /// included): what it left running is killed, its directories and cgroup removed.
    fn drop(&mut self) {
        if let Some(c) = &self.cgroup {
            c.kill_all();
        }
        let (dir, cgroup) = (self.dir.take(), self.cgroup.take());
        // Removing a big home, or a cgroup (the kernel waits out a grace period), takes a
        // while: never on a runtime thread.
        let cleanup = move || {
            if let Some(d) = dir {
                let _ = std::fs::remove_dir_all(d);
            }
            if let Some(c) = cgroup {
                c.remove();
            }
        };
        match tokio::runtime::Handle::try_current() {
            Ok(rt) => {
                rt.spawn_blocking(cleanup);
            }
            Err(_) => cleanup(),
        }
    }
}

/// What begins the name of every instance directory and cgroup of this run of the gateway:
/// its pid and a random word (a gateway restarted in a container often has the pid of the
/// one killed before it, whose leftovers are then not its own).
pub(crate) fn run_prefix() -> &'static str {
    static PREFIX: std::sync::LazyLock<String> = std::sync::LazyLock::new(|| {
        format!("{}-{:08x}-", std::process::id(), rand::random::<u32>())
    });
    &PREFIX
}

/// Whether an instance directory or cgroup named `name` was left by a gateway that is gone
/// (killed before it could remove it): its pid is gone, or it is this pid of another run.
pub(crate) fn left_behind(name: &str) -> bool {
    let Some(pid) = name.split('-').next().and_then(|p| p.parse::<u32>().ok()) else {
        return false;
    };
    if pid == std::process::id() {
        !name.starts_with(run_prefix())
    } else {
        !Path::new(&format!("/proc/{pid}")).exists()
    }
}

/// This run's lock in `instances/`, held while the gateway lives: another gateway sharing the
/// directory (another pid namespace: pids tell nothing there) removes only the directories of
/// a run whose lock it can take.
fn hold_run_lock(instances: &Path) -> std::io::Result<()> {
    static HELD: std::sync::OnceLock<Flock<std::fs::File>> = std::sync::OnceLock::new();
    let file = std::fs::File::create(instances.join(format!("{}lock", run_prefix())))?;
    let held = Flock::lock(file, FlockArg::LockExclusiveNonblock).map_err(|(_, e)| e)?;
    let _ = HELD.set(held);
    Ok(())
}

/// Removes the directories of instances whose gateway is gone: a run whose lock is free, or
/// without a lock file, one [`left_behind`] says is gone.
fn sweep(instances: &Path) {
    let Ok(entries) = std::fs::read_dir(instances) else {
        return;
    };
    let mut free: std::collections::HashMap<String, bool> = Default::default();
    for e in entries.flatten() {
        let Some(name) = e.file_name().to_str().map(str::to_owned) else {
            continue;
        };
        let mut parts = name.splitn(3, '-');
        let (Some(pid), Some(word), Some(_)) = (parts.next(), parts.next(), parts.next()) else {
            continue;
        };
        let run = format!("{pid}-{word}-");
        if run == run_prefix() {
            continue;
        }
        let gone = *free.entry(run.clone()).or_insert_with(|| {
            match std::fs::File::open(instances.join(format!("{run}lock"))) {
                Ok(lock) => Flock::lock(lock, FlockArg::LockExclusiveNonblock).is_ok(),
                Err(_) => left_behind(&name),
            }
        });
        if gone {
            let path = e.path();
            let _ = if path.is_dir() {
                std::fs::remove_dir_all(path)
            } else {
                std::fs::remove_file(path)
            };
        }
    }
}

/// Makes `dir` (and its parents) if missing, and checks it is this process's own, a real
/// directory, and writable by no one else: nothing planted by another user is trusted.
fn owned_dir(dir: &Path, mode: u32) -> std::io::Result<()> {
    if !dir.exists() {
        std::fs::create_dir_all(dir)?;
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(mode))?;
    }
    let m = std::fs::symlink_metadata(dir)?;
    let me = nix::unistd::geteuid().as_raw();
    // Its own, with a mode changed (a plugin of the same user may chmod it): put back.
    if m.is_dir() && m.uid() == me && m.mode() & 0o7777 != mode {
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(mode))?;
    }
    let m = std::fs::symlink_metadata(dir)?;
    if !m.is_dir() || m.uid() != me || m.mode() & 0o022 != 0 {
        return Err(std::io::Error::other(format!(
            "{} must be a directory of the gateway's own user, writable by no one else",
            dir.display()
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn leftovers_are_told_by_pid_and_run() {
        let me = std::process::id();
        assert!(
            !left_behind(&format!("{}7", run_prefix())),
            "this run's own"
        );
        assert!(left_behind(&format!("{me}-0badf00d-7")) || run_prefix().contains("0badf00d"));
        // A pid no process has (above the kernel's pid_max).
        assert!(left_behind("4194305-00000000-1"));
        assert!(!left_behind("not-an-instance"));
    }

    #[test]
    fn a_plugin_without_a_sandbox_is_said_to_have_none() {
        let mut c = PluginConfig::new("p", "x", vec![]);
        c.sandbox = None;
        assert_eq!(isolation(&c), Isolation::default());
        c.sandbox = Some(SandboxConfig::default());
        let iso = isolation(&c);
        assert!(iso.sandboxed);
        assert!(iso.rules.iter().any(|r| r.rule == "filesystem"));
        // No uid range asked for: as root, plugins keep root's uid, which is said; else
        // there is no `user` rule to miss.
        let user = iso.rules.iter().find(|r| r.rule == "user");
        if nix::unistd::geteuid().is_root() {
            assert!(user.is_some_and(|r| !r.enforced), "{iso:?}");
        } else {
            assert!(user.is_none(), "{iso:?}");
        }
    }
}
