//! The system calls Landlock does not cover, refused by a seccomp filter (EPERM): changing
//! another process's limits, priority or scheduling (`prlimit`, `setpriority`, `sched_set*`,
//! `ioprio_set` aimed elsewhere: a process of the gateway's user could otherwise set the
//! gateway's CPU limit to a second and have it killed), setting the set-user-id or
//! set-group-id bit (a plugin that runs as root's uid could make any root program one), Unix
//! sockets (Landlock before ABI 8 does not stop `connect` to a named one: the Docker or D-Bus
//! socket), and with `network = "none"` Internet sockets (UDP too, where no network
//! namespace can be made). Everything else is allowed.

use std::collections::BTreeMap;

use nix::libc;
use seccompiler::{
    BpfProgram, SeccompAction, SeccompCmpArgLen as Len, SeccompCmpOp as Op, SeccompCondition,
    SeccompFilter, SeccompRule,
};

use crate::config::{Network, SandboxConfig};

/// The filter for a plugin with sandbox `s`, compiled for this machine (once for each kind).
pub fn program(s: &SandboxConfig) -> Result<BpfProgram, seccompiler::BackendError> {
    type Compiled = BTreeMap<(bool, bool), BpfProgram>;
    static COMPILED: std::sync::Mutex<Compiled> = std::sync::Mutex::new(BTreeMap::new());
    let key = (s.unix_sockets, s.network == Network::None);
    if let Some(p) = COMPILED.lock().unwrap_or_else(|e| e.into_inner()).get(&key) {
        return Ok(p.clone());
    }
    let p = compile(s)?;
    COMPILED
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .insert(key, p.clone());
    Ok(p)
}

fn compile(s: &SandboxConfig) -> Result<BpfProgram, seccompiler::BackendError> {
    let arch = std::env::consts::ARCH
        .try_into()
        .map_err(|_| seccompiler::BackendError::InvalidTargetArch(std::env::consts::ARCH.into()))?;
    let cond = |arg: u8, op: Op, value: u64| SeccompCondition::new(arg, Len::Qword, op, value);
    let dword = |arg: u8, op: Op, value: u64| SeccompCondition::new(arg, Len::Dword, op, value);
    let rule = |c: Vec<SeccompCondition>| SeccompRule::new(c);
    let mut rules: BTreeMap<i64, Vec<SeccompRule>> = BTreeMap::new();
    // Another process's limits: only its own (pid 0) may be set; reading any is fine.
    rules.insert(
        libc::SYS_prlimit64,
        vec![rule(vec![cond(0, Op::Ne, 0)?, cond(2, Op::Ne, 0)?])?],
    );
    // Priority of another process, of a process group, or of every process of the user.
    const PRIO_USER: u64 = 2;
    rules.insert(
        libc::SYS_setpriority,
        vec![
            rule(vec![dword(1, Op::Ne, 0)?])?,
            rule(vec![dword(0, Op::Eq, PRIO_USER)?])?,
        ],
    );
    const IOPRIO_WHO_USER: u64 = 3;
    rules.insert(
        libc::SYS_ioprio_set,
        vec![
            rule(vec![dword(1, Op::Ne, 0)?])?,
            rule(vec![dword(0, Op::Eq, IOPRIO_WHO_USER)?])?,
        ],
    );
    for call in [
        libc::SYS_sched_setscheduler,
        libc::SYS_sched_setparam,
        libc::SYS_sched_setaffinity,
        libc::SYS_sched_setattr,
    ] {
        rules.insert(call, vec![rule(vec![dword(0, Op::Ne, 0)?])?]);
    }
    // The set-user-id and set-group-id bits, by each call that sets a mode.
    let setid = |arg: u8| -> Result<Vec<SeccompRule>, seccompiler::BackendError> {
        Ok(vec![
            rule(vec![dword(arg, Op::MaskedEq(0o4000), 0o4000)?])?,
            rule(vec![dword(arg, Op::MaskedEq(0o2000), 0o2000)?])?,
        ])
    };
    rules.insert(libc::SYS_chmod, setid(1)?);
    rules.insert(libc::SYS_fchmod, setid(1)?);
    rules.insert(libc::SYS_fchmodat, setid(2)?);
    const SYS_FCHMODAT2: i64 = 452;
    rules.insert(SYS_FCHMODAT2, setid(2)?);
    // Sockets by family.
    let mut families = Vec::new();
    if !s.unix_sockets {
        families.push(libc::AF_UNIX as u64);
    }
    if s.network == Network::None {
        families.extend([libc::AF_INET as u64, libc::AF_INET6 as u64]);
    }
    if !families.is_empty() {
        let r = families
            .into_iter()
            .map(|f| rule(vec![dword(0, Op::Eq, f)?]))
            .collect::<Result<Vec<_>, _>>()?;
        rules.insert(libc::SYS_socket, r);
    }
    let filter = SeccompFilter::new(
        rules,
        SeccompAction::Allow,
        SeccompAction::Errno(libc::EPERM as u32),
        arch,
    )?;
    filter.try_into()
}

/// Whether this kernel takes seccomp filters.
pub fn available() -> bool {
    // SAFETY: a query of the calling thread's own mode.
    #[allow(unsafe_code)]
    let mode = unsafe { libc::prctl(libc::PR_GET_SECCOMP, 0, 0, 0, 0) };
    mode >= 0
}
