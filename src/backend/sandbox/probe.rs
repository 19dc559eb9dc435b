//! What this machine lets the gateway enforce, found once at start by trying each feature
//! (never assumed from a kernel version): the Landlock ABI, writable cgroup hierarchies,
//! network and user namespaces, and the privilege to change user and drop capabilities.

use std::sync::OnceLock;

use landlock::{
    ABI, Access, AccessFs, AccessNet, CompatLevel, Compatible, Ruleset, RulesetAttr, Scope,
};

use super::cgroup::Cgroups;

/// The machine's answer, for every sandbox of this process.
#[derive(Debug)]
pub struct Probe {
    /// The Landlock ABI, 0 without Landlock.
    pub landlock: i32,
    /// Writable hierarchies for instances' cgroups.
    pub cgroups: Option<Cgroups>,
    /// Running as root, or with `CAP_SETUID` and `CAP_SETGID`.
    pub may_change_user: bool,
    /// `CAP_SETPCAP`: the capability bounding set can be emptied.
    pub may_drop_bounding: bool,
    /// A network namespace can be made for a child (by privilege, or in a user namespace).
    pub netns: NetNs,
    /// The kernel takes seccomp filters.
    pub seccomp: bool,
}

/// How a child gets a network namespace of its own.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NetNs {
    /// `CAP_SYS_ADMIN`: `unshare(CLONE_NEWNET)`.
    Direct,
    /// An unprivileged user namespace first.
    InUserNs,
    Unavailable,
}

static PROBE: OnceLock<Probe> = OnceLock::new();

/// The probe, run (and logged) on first use.
pub fn get() -> &'static Probe {
    PROBE.get_or_init(|| {
        let p = run();
        tracing::info!(
            landlock_abi = p.landlock,
            cgroups = %p.cgroups.as_ref().map_or_else(|| "none writable".to_owned(), |c| c.describe()),
            may_change_user = p.may_change_user,
            network_namespace = ?p.netns,
            seccomp = p.seccomp,
            "plugin sandbox: what this machine offers"
        );
        if p.landlock == 0 {
            tracing::warn!(
                "plugin sandbox: the kernel has no Landlock, so plugins' filesystem, network and process walls cannot be enforced"
            );
        }
        p
    })
}

fn run() -> Probe {
    let caps = effective_caps();
    let has = |cap: u32| caps & (1u64 << cap) != 0;
    // Capability numbers (linux/capability.h).
    const SETGID: u32 = 6;
    const SETUID: u32 = 7;
    const SETPCAP: u32 = 8;
    const SYS_ADMIN: u32 = 21;
    let netns = if has(SYS_ADMIN) && super::child::try_unshare_net(false) {
        NetNs::Direct
    } else if super::child::try_unshare_net(true) {
        NetNs::InUserNs
    } else {
        NetNs::Unavailable
    };
    Probe {
        landlock: landlock_abi(),
        cgroups: Cgroups::find(),
        may_change_user: has(SETUID) && has(SETGID),
        may_drop_bounding: has(SETPCAP),
        netns,
        seccomp: super::seccomp::available(),
    }
}

/// The newest ABI a ruleset can be made for, handling everything that ABI knows.
fn landlock_abi() -> i32 {
    for (n, abi) in [
        (7, ABI::V7),
        (6, ABI::V6),
        (5, ABI::V5),
        (4, ABI::V4),
        (3, ABI::V3),
        (2, ABI::V2),
        (1, ABI::V1),
    ] {
        let made = (|| {
            let mut r = Ruleset::default()
                .set_compatibility(CompatLevel::HardRequirement)
                .handle_access(AccessFs::from_all(abi))?;
            if n >= 4 {
                r = r.handle_access(AccessNet::from_all(abi))?;
            }
            if n >= 6 {
                r = r.scope(Scope::from_all(abi))?;
            }
            r.create()
        })();
        if made.is_ok() {
            return n;
        }
    }
    0
}

/// The effective capability set of this process.
fn effective_caps() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("CapEff:"))
                .and_then(|v| u64::from_str_radix(v.trim(), 16).ok())
        })
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_probe_answers_without_failing() {
        let p = super::get();
        // Whatever the machine, a second call is the same answer.
        assert_eq!(p.landlock, super::get().landlock);
    }
}
