//! What the child does to itself between `fork` and `exec`: a network namespace, its cgroups,
//! rlimits, a user of its own, no capabilities, `no_new_privs`, and the Landlock domain.
//!
//! This runs in the forked child of a multi-threaded process, so it only makes system calls
//! with values prepared before the fork: no allocation, no lock, no logging. Any failure
//! fails the spawn (the parent sees the error), so a child never runs with half a sandbox.
#![allow(unsafe_code)]

use std::io;
use std::os::fd::RawFd;

use landlock::RulesetCreated;
use nix::libc;

/// Everything the child applies, prepared by the parent.
pub struct ChildPlan {
    pub netns: Option<super::probe::NetNs>,
    /// For a user namespace: `uid_map` and `gid_map` lines mapping the child's own ids.
    pub id_maps: (String, String),
    pub cgroup_procs: Vec<RawFd>,
    pub rlimits: Vec<(libc::__rlimit_resource_t, u64)>,
    /// `(uid, gid)` to become.
    pub user: Option<(u32, u32)>,
    pub drop_bounding: bool,
    pub ruleset: Option<RulesetCreated>,
    /// Applied last, after Landlock.
    pub seccomp: Option<seccompiler::BpfProgram>,
}

fn check(r: libc::c_int) -> io::Result<()> {
    if r < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(())
    }
}

/// Writes `text` to `path` (a NUL-terminated literal), for the user namespace's maps.
fn write_file(path: &std::ffi::CStr, text: &[u8]) -> io::Result<()> {
    // SAFETY: open/write/close on a valid C string and a live buffer.
    unsafe {
        let fd = libc::open(path.as_ptr(), libc::O_WRONLY | libc::O_CLOEXEC);
        check(fd)?;
        let n = libc::write(fd, text.as_ptr().cast(), text.len());
        libc::close(fd);
        if n < 0 {
            return Err(io::Error::last_os_error());
        }
    }
    Ok(())
}

impl ChildPlan {
    /// Applies the plan to the calling (child) process.
    pub fn apply(&mut self) -> io::Result<()> {
        use super::probe::NetNs;
        // SAFETY (this whole block): plain system calls on integers and buffers prepared
        // before the fork; see the module's comment.
        unsafe {
            // Whatever a library of the gateway opened without close-on-exec stays here.
            const CLOSE_RANGE_CLOEXEC: libc::c_uint = 1 << 2;
            libc::syscall(libc::SYS_close_range, 3u32, u32::MAX, CLOSE_RANGE_CLOEXEC);
            match self.netns {
                Some(NetNs::Direct) => check(libc::unshare(libc::CLONE_NEWNET))?,
                Some(NetNs::InUserNs) => {
                    check(libc::unshare(libc::CLONE_NEWUSER | libc::CLONE_NEWNET))?;
                    // The gateway is non-dumpable, and so this copy of it: its /proc/self is
                    // root's, and the maps below could not be written. Dumpable again until
                    // the exec a few calls later (which replaces this memory).
                    check(libc::prctl(libc::PR_SET_DUMPABLE, 1, 0, 0, 0))?;
                    write_file(c"/proc/self/setgroups", b"deny")?;
                    write_file(c"/proc/self/uid_map", self.id_maps.0.as_bytes())?;
                    write_file(c"/proc/self/gid_map", self.id_maps.1.as_bytes())?;
                }
                Some(NetNs::Unavailable) | None => {}
            }
            for fd in &self.cgroup_procs {
                let n = libc::write(*fd, b"0".as_ptr().cast(), 1);
                if n < 0 {
                    return Err(io::Error::last_os_error());
                }
            }
            for (resource, value) in &self.rlimits {
                let limit = libc::rlimit {
                    rlim_cur: *value,
                    rlim_max: *value,
                };
                check(libc::setrlimit(*resource, &limit))?;
            }
            if let Some((_, gid)) = self.user {
                check(libc::setgroups(0, std::ptr::null()))?;
                check(libc::setresgid(gid, gid, gid))?;
            }
            if self.drop_bounding {
                for cap in 0..64 {
                    // Past the last capability the kernel knows, EINVAL: done.
                    if libc::prctl(libc::PR_CAPBSET_DROP, cap, 0, 0, 0) < 0 {
                        break;
                    }
                }
            }
            if let Some((uid, _)) = self.user {
                check(libc::setresuid(uid, uid, uid))?;
            }
            // Whatever user it is now, it holds no capability: none kept, none inherited.
            check(libc::prctl(
                libc::PR_CAP_AMBIENT,
                libc::PR_CAP_AMBIENT_CLEAR_ALL,
                0,
                0,
                0,
            ))?;
            clear_capabilities()?;
            check(libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0))?;
        }
        if let Some(ruleset) = self.ruleset.take() {
            ruleset
                .restrict_self()
                .map_err(|e| io::Error::other(e.to_string()))?;
        }
        if let Some(program) = &self.seccomp {
            seccompiler::apply_filter(program).map_err(|e| io::Error::other(e.to_string()))?;
        }
        Ok(())
    }
}

/// Empties the permitted, effective and inheritable capability sets (`capset(2)`, version 3).
fn clear_capabilities() -> io::Result<()> {
    #[repr(C)]
    struct Header {
        version: u32,
        pid: libc::c_int,
    }
    #[repr(C)]
    #[derive(Clone, Copy)]
    struct Data {
        effective: u32,
        permitted: u32,
        inheritable: u32,
    }
    const VERSION_3: u32 = 0x2008_0522;
    let header = Header {
        version: VERSION_3,
        pid: 0,
    };
    let data = [Data {
        effective: 0,
        permitted: 0,
        inheritable: 0,
    }; 2];
    // SAFETY: the kernel reads one header and two data structs, all live.
    check(unsafe { libc::syscall(libc::SYS_capset, &header, data.as_ptr()) as libc::c_int })
}

/// Whether a child can get a network namespace of its own: `in_user_ns` in a new user
/// namespace. Tried in a forked child that exits at once.
pub fn try_unshare_net(in_user_ns: bool) -> bool {
    let flags = if in_user_ns {
        libc::CLONE_NEWUSER | libc::CLONE_NEWNET
    } else {
        libc::CLONE_NEWNET
    };
    // SAFETY: the child makes one system call and exits without running anything of the
    // parent's (no allocation, no destructors).
    unsafe {
        let pid = libc::fork();
        if pid == 0 {
            libc::_exit(if libc::unshare(flags) == 0 { 0 } else { 1 });
        }
        if pid < 0 {
            return false;
        }
        let mut status = 0;
        if libc::waitpid(pid, &mut status, 0) != pid {
            return false;
        }
        libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0
    }
}
