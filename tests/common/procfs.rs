//! Process checks read from /proc: whether a process lives, its descendants, its `stat`
//! fields (state, parent, group, scheduling policy) and its resident memory. Read-only: it
//! never signals a process.

/// `/proc/PID/stat` fields after the command name (field 3 on): state, ppid, pgrp, session,
/// ...; `None` when the process is gone.
pub fn stat_fields(pid: u32) -> Option<Vec<String>> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let (_, rest) = stat.rsplit_once(')')?;
    Some(rest.split_whitespace().map(str::to_owned).collect())
}

/// Whether a process exists and is not a zombie.
pub fn alive(pid: u32) -> bool {
    stat_fields(pid)
        .and_then(|fields| fields.into_iter().next())
        .is_some_and(|state| state != "Z" && state != "X")
}

/// Every live descendant of `pid`, found through /proc parent links.
pub fn descendants(pid: u32) -> Vec<u32> {
    let mut parents = Vec::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(p) = entry.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        let Some(fields) = stat_fields(p) else {
            continue;
        };
        if fields.len() > 2 && fields[0] != "Z" {
            parents.push((p, fields[1].parse::<u32>().unwrap_or(0)));
        }
    }
    let mut out = Vec::new();
    let mut frontier = vec![pid];
    while let Some(parent) = frontier.pop() {
        for (p, pp) in &parents {
            if *pp == parent {
                out.push(*p);
                frontier.push(*p);
            }
        }
    }
    out
}

/// The kernel scheduling policy of a process (`/proc/PID/stat` field 41): 0 normal, 3 batch.
pub fn sched_policy(pid: u32) -> u32 {
    // Fields after the command start at field 3.
    stat_fields(pid).unwrap()[41 - 3].parse().unwrap()
}

/// The resident memory of a process, in KiB.
pub fn rss_kib(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap()
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("VmRSS in /proc/PID/status")
}
