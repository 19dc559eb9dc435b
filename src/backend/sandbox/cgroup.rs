//! A cgroup per plugin instance, where a writable hierarchy is there (v1 controllers, or v2
//! with the controllers delegated): its memory (killed over it, by the kernel's OOM killer of
//! that cgroup alone), its process count and its CPU share. The child joins it before `exec`
//! through a file the gateway opened for it. When the instance ends, what it hit is read back
//! and the cgroup is removed.

use std::fs;
use std::io::Write;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::path::{Path, PathBuf};

use crate::config::SandboxConfig;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Version {
    V1,
    V2,
}

/// The gateway's own cgroup directories, one per controller (the same one thrice in v2).
#[derive(Debug)]
pub struct Cgroups {
    version: Version,
    memory: PathBuf,
    pids: PathBuf,
    cpu: Option<PathBuf>,
}

/// One instance's cgroup.
#[derive(Debug)]
pub struct InstanceCgroup {
    version: Version,
    dirs: Vec<PathBuf>,
    memory: PathBuf,
    pids: PathBuf,
    /// `cgroup.procs` of each directory, open for the child to write itself into.
    procs: Vec<OwnedFd>,
}

impl Cgroups {
    /// The hierarchies this process may make children in, if any: v1's `memory` and `pids`
    /// (and `cpu`), else v2 with those controllers. Each gets a directory of this gateway's.
    pub fn find() -> Option<Cgroups> {
        let mounts = fs::read_to_string("/proc/self/mountinfo").ok()?;
        let own = fs::read_to_string("/proc/self/cgroup").ok()?;
        Self::v1(&mounts, &own).or_else(|| Self::v2(&mounts, &own))
    }

    pub fn describe(&self) -> String {
        match self.version {
            Version::V1 => format!(
                "v1 (memory, pids{}) under {}",
                if self.cpu.is_some() { ", cpu" } else { "" },
                self.memory.display()
            ),
            Version::V2 => format!("v2 under {}", self.memory.display()),
        }
    }

    pub fn has_cpu(&self) -> bool {
        self.cpu.is_some()
    }

    fn v1(mounts: &str, own: &str) -> Option<Cgroups> {
        let dir = |controller: &str| -> Option<PathBuf> {
            let (root, point) = mounts.lines().find_map(|l| {
                let (left, right) = l.split_once(" - ")?;
                let mut r = right.split(' ');
                let (fstype, _, options) = (r.next()?, r.next()?, r.next()?);
                let f: Vec<&str> = left.split(' ').collect();
                (fstype == "cgroup" && options.split(',').any(|o| o == controller))
                    .then(|| (f.get(3).copied(), f.get(4).copied()))
            })?;
            let path = own.lines().find_map(|l| {
                let mut p = l.splitn(3, ':');
                let (_, controllers, path) = (p.next()?, p.next()?, p.next()?);
                controllers
                    .split(',')
                    .any(|c| c == controller)
                    .then_some(path)
            })?;
            let relative = path.strip_prefix(root?).unwrap_or(path);
            base(Path::new(point?), relative)
        };
        Some(Cgroups {
            version: Version::V1,
            memory: dir("memory")?,
            pids: dir("pids")?,
            cpu: dir("cpu"),
        })
    }

    fn v2(mounts: &str, own: &str) -> Option<Cgroups> {
        let (root, point) = mounts.lines().find_map(|l| {
            let (left, right) = l.split_once(" - ")?;
            let f: Vec<&str> = left.split(' ').collect();
            right
                .starts_with("cgroup2 ")
                .then(|| (f.get(3).copied(), f.get(4).copied()))
        })?;
        let path = own.lines().find_map(|l| l.strip_prefix("0::"))?;
        let relative = path.strip_prefix(root?).unwrap_or(path);
        let mine = Path::new(point?).join(relative.trim_start_matches('/'));
        let controllers = fs::read_to_string(mine.join("cgroup.controllers")).ok()?;
        let has = |c: &str| controllers.split_whitespace().any(|x| x == c);
        if !has("memory") || !has("pids") {
            return None;
        }
        let wanted = if has("cpu") {
            "+memory +pids +cpu"
        } else {
            "+memory +pids"
        };
        // A cgroup with processes cannot give its children controllers: the gateway moves
        // into a leaf of its own first.
        if write(&mine.join("cgroup.subtree_control"), wanted).is_err() {
            let leaf = mine.join("gateway");
            let _ = fs::create_dir(&leaf);
            write(&leaf.join("cgroup.procs"), &std::process::id().to_string()).ok()?;
            write(&mine.join("cgroup.subtree_control"), wanted).ok()?;
        }
        let dir = base(&mine, "")?;
        write(&dir.join("cgroup.subtree_control"), wanted).ok()?;
        Some(Cgroups {
            version: Version::V2,
            memory: dir.clone(),
            pids: dir.clone(),
            cpu: has("cpu").then_some(dir),
        })
    }

    /// Makes an instance's cgroup with the sandbox's bounds.
    pub fn create(&self, name: &str, s: &SandboxConfig) -> std::io::Result<InstanceCgroup> {
        let mut dirs: Vec<PathBuf> = Vec::new();
        // The CPU controller only when a share is asked for.
        let cpu = self.cpu.as_ref().filter(|_| s.cpu_percent.is_some());
        for d in [Some(&self.memory), Some(&self.pids), cpu]
            .into_iter()
            .flatten()
        {
            let d = d.join(name);
            if !dirs.contains(&d) {
                fs::create_dir(&d)?;
                dirs.push(d);
            }
        }
        let made = InstanceCgroup {
            version: self.version,
            memory: self.memory.join(name),
            pids: self.pids.join(name),
            procs: Vec::new(),
            dirs,
        };
        made.limit(s, cpu.map(|c| c.join(name)))
    }
}

impl InstanceCgroup {
    fn limit(mut self, s: &SandboxConfig, cpu: Option<PathBuf>) -> std::io::Result<Self> {
        let bytes = (s.memory_mb * 1024 * 1024).to_string();
        let period = 100_000u64;
        let quota = u64::from(s.cpu_percent.unwrap_or(100)) * period / 100;
        match self.version {
            Version::V1 => {
                write(&self.memory.join("memory.limit_in_bytes"), &bytes)?;
                // With swap accounting, swap counts too (else memory goes to swap instead).
                let _ = write(&self.memory.join("memory.memsw.limit_in_bytes"), &bytes);
                write(&self.pids.join("pids.max"), &s.max_processes.to_string())?;
                if let Some(cpu) = &cpu {
                    write(&cpu.join("cpu.cfs_period_us"), &period.to_string())?;
                    write(&cpu.join("cpu.cfs_quota_us"), &quota.to_string())?;
                }
            }
            Version::V2 => {
                write(&self.memory.join("memory.max"), &bytes)?;
                let _ = write(&self.memory.join("memory.swap.max"), "0");
                write(&self.pids.join("pids.max"), &s.max_processes.to_string())?;
                if let Some(cpu) = &cpu {
                    write(&cpu.join("cpu.max"), &format!("{quota} {period}"))?;
                }
            }
        }
        for d in &self.dirs {
            let f = fs::OpenOptions::new()
                .write(true)
                .open(d.join("cgroup.procs"))?;
            self.procs.push(f.into());
        }
        Ok(self)
    }

    /// The files the child writes `0` to, joining each cgroup.
    pub fn procs_fds(&self) -> Vec<RawFd> {
        self.procs.iter().map(AsRawFd::as_raw_fd).collect()
    }

    /// Closes the files of [`Self::procs_fds`] (its child has joined).
    pub fn joined(&mut self) {
        self.procs.clear();
    }

    /// The bounds the kernel enforced on it: `memory` when its OOM killer killed a process,
    /// `processes` when a fork was refused.
    pub fn bounds_hit(&self) -> (bool, bool) {
        let count = |file: PathBuf, key: &str| {
            fs::read_to_string(file)
                .ok()
                .and_then(|t| {
                    t.lines().find_map(|l| {
                        let (k, v) = l.split_once(' ')?;
                        (k == key).then(|| v.trim().parse::<u64>().ok())?
                    })
                })
                .unwrap_or(0)
        };
        let oom = match self.version {
            Version::V1 => count(self.memory.join("memory.oom_control"), "oom_kill"),
            Version::V2 => count(self.memory.join("memory.events"), "oom_kill"),
        };
        (oom > 0, count(self.pids.join("pids.events"), "max") > 0)
    }

    /// Kills whatever is still in it (a process that left the instance's process group).
    pub fn kill_all(&self) {
        let Ok(pids) = fs::read_to_string(self.pids.join("cgroup.procs")) else {
            return;
        };
        for pid in pids.lines().filter_map(|p| p.trim().parse::<i32>().ok()) {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(pid),
                nix::sys::signal::Signal::SIGKILL,
            );
        }
    }

    /// Removes it once empty (blocking): the kernel refuses while a process is still dying,
    /// so this tries for a few seconds.
    pub fn remove(self) {
        for _ in 0..50 {
            self.kill_all();
            if self
                .dirs
                .iter()
                .all(|d| fs::remove_dir(d).is_ok() || !d.exists())
            {
                return;
            }
            std::thread::sleep(std::time::Duration::from_millis(100));
        }
        tracing::warn!(cgroup = %self.pids.display(), "a plugin instance's cgroup could not be removed");
    }
}

/// This gateway's own directory under `dir/relative`, made (and its leftovers from gateways
/// gone removed); `None` when it cannot be made.
fn base(dir: &Path, relative: &str) -> Option<PathBuf> {
    let parent = dir.join(relative.trim_start_matches('/'));
    if let Ok(entries) = fs::read_dir(&parent) {
        for e in entries.flatten() {
            let name = e.file_name();
            let Some(pid) = name
                .to_str()
                .and_then(|n| n.strip_prefix("mcp-gateway-"))
                .and_then(|p| p.parse::<u32>().ok())
            else {
                continue;
            };
            if !Path::new(&format!("/proc/{pid}")).exists() {
                if let Ok(inner) = fs::read_dir(e.path()) {
                    for i in inner.flatten().filter(|i| i.path().is_dir()) {
                        let _ = fs::remove_dir(i.path());
                    }
                }
                let _ = fs::remove_dir(e.path());
            }
        }
    }
    let mine = parent.join(format!("mcp-gateway-{}", std::process::id()));
    match fs::create_dir(&mine) {
        Ok(()) => Some(mine),
        // A gateway of the same pid was here before (a container's restart): its instances'
        // cgroups are not this run's.
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
            if let Ok(inner) = fs::read_dir(&mine) {
                for i in inner.flatten() {
                    if i.file_name().to_str().is_some_and(super::left_behind) {
                        let _ = fs::remove_dir(i.path());
                    }
                }
            }
            Some(mine)
        }
        Err(_) => None,
    }
}

fn write(path: &Path, value: &str) -> std::io::Result<()> {
    fs::OpenOptions::new()
        .write(true)
        .open(path)?
        .write_all(value.as_bytes())
}
