//! Which paths a plugin's processes may read and write: the system's directories, its
//! command's installation (an interpreter's prefix, a venv and the Python it was made from, a
//! `node_modules` tree, a script's interpreter), what its arguments name, its `read` and
//! `write` lists, and its own directories; never the gateway's own files, which are carved
//! out of any directory that holds them.

use std::collections::HashMap;
use std::io::Read;
use std::path::{Component, Path, PathBuf};

use crate::config::PluginConfig;

/// Read and execute: the system's programs, libraries and settings.
const SYSTEM: &[&str] = &[
    "/usr", "/lib", "/lib32", "/lib64", "/libx32", "/bin", "/sbin", "/etc",
];
/// Read only: what runtimes ask of the kernel about the machine (never another process's
/// `/proc/PID`).
const MACHINE: &[&str] = &[
    "/proc/cpuinfo",
    "/proc/meminfo",
    "/proc/stat",
    "/proc/uptime",
    "/proc/loadavg",
    "/proc/version",
    "/proc/filesystems",
    "/proc/sys/kernel",
    "/proc/sys/vm/overcommit_memory",
    "/sys/devices/system/cpu",
    "/dev/urandom",
    "/dev/random",
];
/// Read and write: the devices every program may use.
const DEVICES: &[&str] = &["/dev/null", "/dev/zero", "/dev/full"];

/// The paths granted, after carving out the hidden ones.
#[derive(Debug, Default, PartialEq)]
pub struct Grants {
    pub read: Vec<PathBuf>,
    pub write: Vec<PathBuf>,
}

/// The grants of one instance whose own directories are `own` (home, temp, package cache).
/// All but `own` is the same for every instance of a definition: found once, and again after
/// [`REFIND_AFTER`] (the files they were found from may change).
pub fn grants(config: &PluginConfig, own: &[&Path], path_env: &str) -> Grants {
    use std::hash::{Hash, Hasher};
    type Found = (std::time::Instant, std::sync::Arc<Grants>);
    static FOUND: std::sync::LazyLock<std::sync::Mutex<HashMap<u64, Found>>> =
        std::sync::LazyLock::new(Default::default);
    let mut h = std::collections::hash_map::DefaultHasher::new();
    (&config.command, &config.args, &config.cwd, &config.sandbox).hash(&mut h);
    (&config.host.hidden, path_env, config.uid).hash(&mut h);
    let key = h.finish();
    let cached = {
        let found = FOUND.lock().unwrap_or_else(|e| e.into_inner());
        found
            .get(&key)
            .filter(|(at, _)| at.elapsed() < REFIND_AFTER)
            .map(|(_, g)| g.clone())
    };
    let shared = cached.unwrap_or_else(|| {
        let g = std::sync::Arc::new(find(config, path_env));
        let mut found = FOUND.lock().unwrap_or_else(|e| e.into_inner());
        if found.len() >= 1024 {
            found.clear();
        }
        found.insert(key, (std::time::Instant::now(), g.clone()));
        g
    });
    let mut write = shared.write.clone();
    // Its own directories are the gateway's making, wherever they are.
    write.extend(own.iter().map(|p| p.to_path_buf()));
    Grants {
        read: shared.read.clone(),
        write,
    }
}

/// How long found grants are reused.
const REFIND_AFTER: std::time::Duration = std::time::Duration::from_secs(30);

/// Secrets of the machine's own under `/etc`, hidden from a plugin that keeps root's uid
/// (without capabilities it still owns them); a plugin of another user id is kept from them
/// by their modes, and is spared carving `/etc` into its entries at every start.
const MACHINE_SECRETS: &[&str] = &[
    "/etc/shadow",
    "/etc/gshadow",
    "/etc/shadow-",
    "/etc/gshadow-",
    "/etc/ssh",
    "/etc/ssl/private",
    "/etc/security/opasswd",
];

/// What a definition's instances are granted, but their own directories.
fn find(config: &PluginConfig, path_env: &str) -> Grants {
    let keeps_root = nix::unistd::geteuid().is_root()
        && !(config.uid.is_some() && super::probe::get().may_change_user);
    let mut hidden = config.host.hidden.clone();
    if keeps_root {
        hidden.extend(MACHINE_SECRETS.iter().map(PathBuf::from));
    }
    let hidden = &hidden;
    let sandbox = config.sandbox.as_ref();
    let cwd = config
        .cwd
        .clone()
        .or_else(|| std::env::current_dir().ok())
        .unwrap_or_else(|| PathBuf::from("/"));
    let mut read = Vec::new();
    read.extend(SYSTEM.iter().chain(MACHINE).map(PathBuf::from));
    read.extend(etc_links().iter().cloned());
    let mut found = Vec::new();
    if let Some(cmd) = resolve(&config.command, &cwd, path_env) {
        installation(&cmd, path_env, &mut found, 0, true);
    }
    for arg in &config.args {
        let value = arg.split_once('=').map_or(arg.as_str(), |(_, v)| v);
        // A shell script's words too (`sh -c "exec /opt/srv/run --x"`): absolute paths only.
        let words = arg
            .split(|c: char| {
                c.is_whitespace() || matches!(c, ';' | '&' | '|' | '\'' | '"' | '(' | ')' | '=')
            })
            .filter(|w| w.starts_with('/'));
        for candidate in [arg.as_str(), value].into_iter().chain(words) {
            let p = cwd.join(candidate);
            if candidate.is_empty() || !p.exists() {
                continue;
            }
            if p.is_file() {
                // An argument's file is the package's own text: its `#!` line (which `node
                // file` or `python file` ignore) must not choose what else is granted.
                installation(&p, path_env, &mut found, 0, false);
                if let Some(dir) = p.parent() {
                    found.push(dir.to_owned());
                }
            } else {
                found.push(p);
            }
        }
    }
    if config.cwd.is_some() {
        found.push(cwd);
    }
    read.extend(found);
    read.extend(sandbox.map(|s| s.read.clone()).unwrap_or_default());
    let mut write: Vec<PathBuf> = DEVICES.iter().map(PathBuf::from).collect();
    write.extend(sandbox.map(|s| s.write.clone()).unwrap_or_default());
    Grants {
        read: carve_all(read, hidden),
        write: carve_all(write, hidden),
    }
}

/// Where the links at the top of `/etc` lead outside the system's directories
/// (`/etc/resolv.conf` into `/run/systemd/resolve`): Landlock checks the file a link leads
/// to, so each target file is granted too. Read once.
fn etc_links() -> &'static [PathBuf] {
    static LINKS: std::sync::LazyLock<Vec<PathBuf>> = std::sync::LazyLock::new(|| {
        let Ok(entries) = std::fs::read_dir("/etc") else {
            return Vec::new();
        };
        entries
            .flatten()
            .filter(|e| e.file_type().is_ok_and(|t| t.is_symlink()))
            .filter_map(|e| std::fs::canonicalize(e.path()).ok())
            .filter(|t| {
                t.is_file() && !t.starts_with("/proc") && !SYSTEM.iter().any(|s| t.starts_with(s))
            })
            .collect()
    });
    &LINKS
}

/// `command` as `exec` finds it.
fn resolve(command: &str, cwd: &Path, path_env: &str) -> Option<PathBuf> {
    if command.contains('/') {
        let p = cwd.join(command);
        return p.exists().then_some(p);
    }
    std::env::split_paths(path_env)
        .map(|d| d.join(command))
        .find(|p| p.is_file())
}

/// What running `file` needs besides the system: the prefix it is installed in (`PREFIX/bin/x`),
/// a venv's base Python, the `node_modules` tree it is part of, and a script's interpreter.
fn installation(file: &Path, path_env: &str, out: &mut Vec<PathBuf>, depth: u8, shebang_too: bool) {
    let real = std::fs::canonicalize(file).unwrap_or_else(|_| file.to_owned());
    for p in [file, real.as_path()] {
        out.push(p.to_owned());
        let parent = p.parent();
        if let Some(prefix) = parent
            .filter(|d| matches!(d.file_name().and_then(|n| n.to_str()), Some("bin" | "sbin")))
            .and_then(Path::parent)
        {
            grant_prefix(prefix, out);
            // A venv: the Python it was made from (`home = .../bin`).
            if let Ok(cfg) = std::fs::read_to_string(prefix.join("pyvenv.cfg"))
                && let Some(home) = cfg.lines().find_map(|l| {
                    let (k, v) = l.split_once('=')?;
                    (k.trim() == "home").then(|| PathBuf::from(v.trim()))
                })
                && let Some(base) = home.parent()
            {
                grant_prefix(base, out);
            }
        }
        if let Some(modules) = p
            .ancestors()
            .filter(|a| a.file_name().is_some_and(|n| n == "node_modules"))
            .last()
        {
            out.push(modules.to_owned());
        }
    }
    // A script run as the command: its interpreter (`#!/usr/bin/env node` finds node on
    // PATH), which must exist (else the kernel would not run the script either).
    if shebang_too
        && depth < 2
        && let Some(line) = shebang(&real)
    {
        let mut words = line.split_whitespace();
        if let Some(interp) = words.next() {
            let target = if interp.ends_with("/env") {
                words
                    .find(|w| !w.starts_with('-'))
                    .and_then(|w| resolve(w, Path::new("/"), path_env))
            } else {
                Some(PathBuf::from(interp)).filter(|p| p.is_file())
            };
            if let Some(t) = target {
                installation(&t, path_env, out, depth + 1, true);
            }
        }
    }
}

/// An installation prefix's programs and libraries (`PREFIX/bin`, `PREFIX/lib`, ...; a venv's
/// `pyvenv.cfg`), not the rest of it (a prefix may be a home directory: `~/.local`), and
/// never a prefix that is a directory of the system's or anyone's home.
fn grant_prefix(prefix: &Path, out: &mut Vec<PathBuf>) {
    const NEVER: &[&str] = &[
        "/", "/proc", "/sys", "/dev", "/run", "/var", "/tmp", "/home", "/root", "/etc", "/boot",
        "/mnt", "/media", "/srv", "/opt",
    ];
    let home = std::env::var_os("HOME").map(PathBuf::from);
    if NEVER.iter().any(|n| prefix == Path::new(n))
        || prefix.starts_with("/proc")
        || prefix.starts_with("/sys")
        || prefix.starts_with("/dev")
        || home.as_deref() == Some(prefix)
        || prefix.parent() == Some(Path::new("/home"))
    {
        return;
    }
    for sub in [
        "bin",
        "sbin",
        "lib",
        "lib64",
        "lib32",
        "libexec",
        "include",
        "pyvenv.cfg",
    ] {
        out.push(prefix.join(sub));
    }
}

fn shebang(file: &Path) -> Option<String> {
    let mut head = [0u8; 256];
    let n = std::fs::File::open(file).ok()?.read(&mut head).ok()?;
    let text = head[..n].strip_prefix(b"#!")?;
    let line = text.split(|b| *b == b'\n').next()?;
    Some(String::from_utf8_lossy(line).trim().to_owned())
}

/// `paths` without the hidden ones: one inside a hidden path is dropped, and a directory
/// holding one is granted as its entries, less that one (down to the hidden path).
fn carve_all(paths: Vec<PathBuf>, hidden: &[PathBuf]) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for p in paths {
        // Landlock holds the inode a path leads to: compared where it leads.
        let p = std::fs::canonicalize(&p).unwrap_or_else(|_| normal(&p));
        carve(&p, hidden, &mut out, 0);
    }
    out.sort();
    out.dedup();
    out
}

fn carve(path: &Path, hidden: &[PathBuf], out: &mut Vec<PathBuf>, depth: u8) {
    if hidden.iter().any(|h| path.starts_with(h)) {
        return;
    }
    let holds = hidden.iter().any(|h| h.starts_with(path));
    if !holds {
        out.push(path.to_owned());
        return;
    }
    let Ok(entries) = std::fs::read_dir(path) else {
        return;
    };
    if depth > 16 {
        return;
    }
    for e in entries.flatten() {
        // A link in a directory holding a hidden path would grant where it leads: left out.
        if e.file_type().is_ok_and(|t| t.is_symlink()) {
            continue;
        }
        carve(&e.path(), hidden, out, depth + 1);
    }
}

/// `p` without `.` and `..` (and absolute), as the hidden paths are written.
fn normal(p: &Path) -> PathBuf {
    let mut out = PathBuf::new();
    for c in p.components() {
        match c {
            Component::ParentDir => {
                out.pop();
            }
            Component::CurDir => {}
            c => out.push(c),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hidden_paths_are_carved_out_of_what_holds_them() {
        let dir = tempfile::tempdir().unwrap();
        let data = dir.path().join("data");
        std::fs::create_dir_all(data.join("deep")).unwrap();
        std::fs::write(data.join("gateway.db"), "").unwrap();
        std::fs::write(data.join("notes"), "").unwrap();
        std::fs::write(dir.path().join("server.py"), "").unwrap();
        let hidden = vec![data.join("gateway.db")];
        let got = carve_all(vec![dir.path().to_owned()], &hidden);
        assert!(got.contains(&data.join("notes")), "{got:?}");
        assert!(got.contains(&data.join("deep")), "{got:?}");
        assert!(got.contains(&dir.path().join("server.py")), "{got:?}");
        assert!(!got.iter().any(|p| hidden[0].starts_with(p)), "{got:?}");
        // Inside a hidden directory: nothing.
        let got = carve_all(vec![data.join("deep")], std::slice::from_ref(&data));
        assert!(got.is_empty(), "{got:?}");
    }

    #[test]
    fn a_venv_command_brings_its_base_python_and_script_args_their_directory() {
        let dir = tempfile::tempdir().unwrap();
        let venv = dir.path().join("venv");
        std::fs::create_dir_all(venv.join("bin")).unwrap();
        let base = dir.path().join("base");
        std::fs::create_dir_all(base.join("bin")).unwrap();
        std::fs::write(
            venv.join("pyvenv.cfg"),
            format!("home = {}\n", base.join("bin").display()),
        )
        .unwrap();
        std::fs::write(venv.join("bin/python"), "").unwrap();
        let scripts = dir.path().join("srv");
        std::fs::create_dir_all(&scripts).unwrap();
        std::fs::write(scripts.join("server.py"), "").unwrap();
        let mut c = PluginConfig::new(
            "p",
            venv.join("bin/python").display().to_string(),
            vec![scripts.join("server.py").display().to_string()],
        );
        c.cwd = None;
        let g = grants(&c, &[], "/usr/bin");
        for p in [
            venv.join("bin"),
            venv.join("pyvenv.cfg"),
            base.join("bin"),
            scripts,
        ] {
            assert!(g.read.contains(&p), "{p:?} in {:?}", g.read);
        }
        // The prefixes' programs and libraries, not all of them.
        assert!(
            !g.read.contains(&venv) && !g.read.contains(&base),
            "{:?}",
            g.read
        );
    }
}
