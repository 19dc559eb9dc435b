//! What the bench reads of processes and of the machine: CPU time and descendants from
//! `/proc/PID/stat`, the memory of a process tree, the load average; and this process's limit
//! on open descriptors, raised for the many connections of a run. A leaf: it imports no other
//! module.

use std::time::{Duration, Instant};

/// CPU time, user and system, that process `pid` has used so far, in seconds.
pub(crate) fn cpu_seconds(pid: u32) -> f64 {
    stat_seconds(pid, 11)
}

/// CPU time, user and system, of the children process `pid` has waited for, in seconds.
pub(crate) fn children_cpu_seconds(pid: u32) -> f64 {
    stat_seconds(pid, 13)
}

/// The sum of the two tick counts of `/proc/PID/stat` that come `skip` fields after the
/// state (the first field after the command's closing parenthesis: utime and stime at 11,
/// cutime and cstime at 13), in seconds.
fn stat_seconds(pid: u32, skip: usize) -> f64 {
    let ticks_per_sec = nix::unistd::sysconf(nix::unistd::SysconfVar::CLK_TCK)
        .ok()
        .flatten()
        .unwrap_or(100) as f64;
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    let ticks: u64 = stat
        .rsplit_once(')')
        .map(|(_, rest)| {
            rest.split_whitespace()
                .skip(skip)
                .take(2)
                .filter_map(|t| t.parse::<u64>().ok())
                .sum()
        })
        .unwrap_or(0);
    ticks as f64 / ticks_per_sec
}

/// Proportional set size (MB) of a process and its descendants, and how many there are.
pub(crate) fn tree_memory(root: u32) -> (f64, usize) {
    let tree = descendants(root)
        .into_iter()
        .chain([root])
        .collect::<Vec<_>>();
    let kb: u64 = tree
        .iter()
        .filter_map(|p| std::fs::read_to_string(format!("/proc/{p}/smaps_rollup")).ok())
        .filter_map(|s| {
            s.lines()
                .find(|l| l.starts_with("Pss:"))
                .and_then(|l| l.split_whitespace().nth(1)?.parse::<u64>().ok())
        })
        .sum();
    (kb as f64 / 1024.0, tree.len())
}

/// The pids of every descendant of process `root`, from the parents `/proc` gives.
pub(crate) fn descendants(root: u32) -> Vec<u32> {
    let mut parents = Vec::new();
    for entry in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
            continue;
        };
        let Some((_, rest)) = stat.rsplit_once(')') else {
            continue;
        };
        if let Some(ppid) = rest
            .split_whitespace()
            .nth(1)
            .and_then(|p| p.parse::<u32>().ok())
        {
            parents.push((pid, ppid));
        }
    }
    let mut out = Vec::new();
    let mut frontier = vec![root];
    while let Some(p) = frontier.pop() {
        for (child, parent) in &parents {
            if *parent == p {
                out.push(*child);
                frontier.push(*child);
            }
        }
    }
    out
}

/// Waits (at most 60 s) until process `root` has at least `n` descendants.
pub(crate) async fn wait_for_processes(root: u32, n: usize) {
    let deadline = Instant::now() + Duration::from_secs(60);
    while descendants(root).len() < n && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Raises this process's limit on open descriptors to its hard limit (at most 200,000).
pub(crate) fn raise_fd_limit() {
    use nix::sys::resource::{Resource, getrlimit, setrlimit};
    if let Ok((_, hard)) = getrlimit(Resource::RLIMIT_NOFILE) {
        let _ = setrlimit(Resource::RLIMIT_NOFILE, hard.min(200_000), hard);
    }
}

/// The load averages over 1, 5 and 15 minutes, from `/proc/loadavg`.
pub(crate) fn loadavg() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|s| s.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_default()
}
