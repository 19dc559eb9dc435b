//! `mcp-fixture-hostile`: a stdio MCP server (legacy era, newline-delimited JSON-RPC 2.0) that
//! behaves as a plugin gone bad, for the sandbox's tests. Its tools report what the kernel let
//! it do: `whoami` (ids, working directory, the whole environment, capability sets,
//! `NoNewPrivs`, resource limits), `escape` (reads, writes, signals, ptrace, TCP and UDP, binds,
//! abstract unix sockets, forks, memory, file size: each attempt with its outcome, the errno
//! named) and `spawn_sleeper` (a child to be the target of another instance's attempts). It
//! reads no file but those an `escape` names (its capability sets come from `capget` and
//! `prctl`, in /proc/self/status's format, as a sandbox may close /proc), so it runs in a
//! sandbox where only its own binary is readable; it never panics on a refused attempt, it
//! reports it.

// ptrace, fork, getuid and getgroups are raw libc calls (nix's `ptrace` and `user` features are
// not enabled): this test-only binary allows the unsafe code the crate denies.
#![allow(unsafe_code)]

use std::fs::{self, File};
use std::io::{self, BufRead, Read, Write};
use std::net::{TcpListener, TcpStream, ToSocketAddrs, UdpSocket};
use std::os::linux::net::SocketAddrExt;
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::{SocketAddr, UnixStream};
use std::time::{Duration, Instant};

use nix::errno::Errno;
use nix::libc;
use nix::sys::resource::{Resource, getrlimit};
use nix::sys::signal::{SigHandler, Signal, kill, signal};
use nix::sys::wait::waitpid;
use nix::unistd::{ForkResult, Pid, fork};
use serde_json::{Map, Value, json};

const VERSIONS: &[&str] = &["2024-11-05", "2025-03-26", "2025-06-18", "2025-11-25"];
const LATEST: &str = "2025-11-25";

fn main() {
    // A write past RLIMIT_FSIZE then fails with EFBIG instead of killing the process.
    // SAFETY: SIG_IGN installs no handler code; the process has one thread.
    let _ = unsafe { signal(Signal::SIGXFSZ, SigHandler::SigIgn) };
    let mut out = io::stdout().lock();
    for line in io::stdin().lock().lines() {
        let Ok(line) = line else { break };
        let Ok(msg) = serde_json::from_str::<Value>(&line) else {
            continue;
        };
        // Notifications (no id) and responses (no method) need no answer.
        let (Some(id), Some(method)) = (msg.get("id"), msg["method"].as_str()) else {
            continue;
        };
        let reply = match handle(method, &msg["params"]) {
            Ok(result) => json!({"jsonrpc": "2.0", "id": id, "result": result}),
            Err((code, message)) => {
                json!({"jsonrpc": "2.0", "id": id, "error": {"code": code, "message": message}})
            }
        };
        if writeln!(out, "{reply}").and_then(|()| out.flush()).is_err() {
            break;
        }
    }
}

/// The result of a request, or its JSON-RPC error.
fn handle(method: &str, params: &Value) -> Result<Value, (i64, String)> {
    match method {
        "initialize" => {
            let asked = params["protocolVersion"].as_str().unwrap_or_default();
            let version = if VERSIONS.contains(&asked) {
                asked
            } else {
                LATEST
            };
            Ok(json!({
                "protocolVersion": version,
                "capabilities": {"tools": {}},
                "serverInfo": {"name": "hostile", "version": "1"},
            }))
        }
        "ping" => Ok(json!({})),
        "tools/list" => Ok(json!({"tools": tools()})),
        "tools/call" => {
            let args = &params["arguments"];
            let value = match params["name"].as_str().unwrap_or_default() {
                "whoami" => whoami(),
                "escape" => escape(args),
                "spawn_sleeper" => spawn_sleeper(),
                other => return Err((-32602, format!("unknown tool: {other}"))),
            };
            Ok(json!({"content": [{"type": "text", "text": value.to_string()}]}))
        }
        _ => Err((-32601, format!("method not found: {method}"))),
    }
}

fn tools() -> Value {
    let list = |item: &str| json!({"type": "array", "items": {"type": item}});
    json!([
        {"name": "whoami", "description": "Who and where this process is.",
         "inputSchema": {"type": "object", "properties": {}}},
        {"name": "spawn_sleeper", "description": "Forks a child that sleeps 300 s: its pid.",
         "inputSchema": {"type": "object", "properties": {}}},
        {"name": "escape", "description": "Tries to reach what is not its own; what happened.",
         "inputSchema": {"type": "object", "properties": {
            "read": list("string"), "write": list("string"), "kill": list("integer"),
            "ptrace": list("integer"), "connect": list("string"), "udp": list("string"),
            "bind": list("integer"), "abstract_connect": list("string"),
            "renice": list("integer"), "prlimit": list("integer"),
            "unix_connect": list("string"), "setuid_bit": list("string"),
            "fork": {"type": "integer"}, "alloc_mb": {"type": "integer"},
            "write_file": {"type": "object", "properties": {
                "path": {"type": "string"}, "mb": {"type": "integer"}}},
         }}},
    ])
}

fn whoami() -> Value {
    let env: Map<String, Value> = std::env::vars_os()
        .map(|(k, v)| {
            let v = v.to_string_lossy().into_owned();
            (k.to_string_lossy().into_owned(), Value::String(v))
        })
        .collect();
    let mut rlimits = Map::new();
    for (name, resource) in [
        ("NOFILE", Resource::RLIMIT_NOFILE),
        ("NPROC", Resource::RLIMIT_NPROC),
        ("FSIZE", Resource::RLIMIT_FSIZE),
        ("CORE", Resource::RLIMIT_CORE),
        ("AS", Resource::RLIMIT_AS),
        ("DATA", Resource::RLIMIT_DATA),
    ] {
        let limit = getrlimit(resource).map_or(Value::Null, |(soft, hard)| json!([soft, hard]));
        rlimits.insert(name.to_owned(), limit);
    }
    // SAFETY: these calls only read the process's credentials.
    let (uid, gid, euid) = unsafe { (libc::getuid(), libc::getgid(), libc::geteuid()) };
    json!({
        "pid": std::process::id(),
        "ppid": std::os::unix::process::parent_id(),
        "uid": uid,
        "gid": gid,
        "euid": euid,
        "groups": groups(),
        "cwd": std::env::current_dir().map_or_else(|e| describe(&e), |d| d.display().to_string()),
        "env": env,
        "status": status(),
        "rlimits": rlimits,
    })
}

/// The lines of /proc/self/status about privilege, as that file writes them, but from system
/// calls: a sandbox may leave /proc unreadable.
fn status() -> Value {
    #[repr(C)]
    struct CapHeader {
        version: u32,
        pid: i32,
    }
    #[repr(C)]
    #[derive(Clone, Copy, Default)]
    struct CapData {
        effective: u32,
        permitted: u32,
        inheritable: u32,
    }
    const LINUX_CAPABILITY_VERSION_3: u32 = 0x2008_0522;
    let mut header = CapHeader {
        version: LINUX_CAPABILITY_VERSION_3,
        pid: 0,
    };
    let mut data = [CapData::default(); 2];
    // SAFETY: capget writes two CapData (version 3) into `data`; the prctl calls take no
    // pointers.
    let (caps, bounding, no_new_privs) = unsafe {
        let caps = libc::syscall(libc::SYS_capget, &raw mut header, data.as_mut_ptr());
        let mut bounding = 0u64;
        for cap in 0..64u64 {
            match libc::prctl(libc::PR_CAPBSET_READ, cap, 0, 0, 0) {
                1 => bounding |= 1 << cap,
                0 => {}
                _ => break,
            }
        }
        let no_new_privs = libc::prctl(libc::PR_GET_NO_NEW_PRIVS, 0, 0, 0, 0);
        (caps, bounding, no_new_privs)
    };
    let set = |f: fn(&CapData) -> u32| {
        (caps == 0).then(|| {
            format!(
                "{:016x}",
                u64::from(f(&data[1])) << 32 | u64::from(f(&data[0]))
            )
        })
    };
    json!({
        "CapEff": set(|d| d.effective),
        "CapPrm": set(|d| d.permitted),
        "CapBnd": format!("{bounding:016x}"),
        "NoNewPrivs": (no_new_privs >= 0).then(|| no_new_privs.to_string()),
    })
}

/// The supplementary group ids.
fn groups() -> Vec<u32> {
    // SAFETY: the first call only counts; the second writes at most `n` ids into a buffer of n.
    unsafe {
        let n = libc::getgroups(0, std::ptr::null_mut());
        let mut ids = vec![0; usize::try_from(n).unwrap_or(0)];
        let got = libc::getgroups(n.max(0), ids.as_mut_ptr());
        ids.truncate(usize::try_from(got).unwrap_or(0));
        ids
    }
}

/// Every attempt `args` asks for, keyed by kind, each with what the kernel said.
fn escape(args: &Value) -> Value {
    let mut report = Map::new();
    let mut each = |kind: &str, attempt: fn(&str) -> io::Result<String>| {
        if let Some(targets) = args[kind].as_array() {
            let outcomes = targets
                .iter()
                .map(|t| {
                    let target = t.as_str().map_or_else(|| t.to_string(), str::to_owned);
                    let outcome = attempt(&target);
                    let (detail, error) = match outcome {
                        Ok(detail) => (Some(detail), None),
                        Err(e) => (None, Some(e)),
                    };
                    outcome_json(&target, detail, error)
                })
                .collect();
            report.insert(kind.to_owned(), Value::Array(outcomes));
        }
    };
    each("read", read);
    each("write", write);
    each("kill", signal_cont);
    each("ptrace", ptrace);
    each("connect", connect);
    each("udp", udp);
    each("bind", bind);
    each("abstract_connect", abstract_connect);
    each("renice", renice);
    each("prlimit", prlimit);
    each("unix_connect", unix_connect);
    each("setuid_bit", setuid_bit);
    if let Some(n) = args["fork"].as_u64() {
        report.insert("fork".into(), json!([fork_many(n)]));
    }
    if let Some(mb) = args["alloc_mb"].as_u64() {
        let (detail, error) = match alloc(mb) {
            Ok(d) => (Some(d), None),
            Err(e) => (None, Some(e)),
        };
        report.insert(
            "alloc_mb".into(),
            json!([outcome_json(&mb.to_string(), detail, error)]),
        );
    }
    if let Some(path) = args["write_file"]["path"].as_str() {
        let mb = args["write_file"]["mb"].as_u64().unwrap_or(1);
        report.insert("write_file".into(), json!([write_file(path, mb)]));
    }
    Value::Object(report)
}

/// One attempt's report: `ok` when there was no error.
fn outcome_json(target: &str, detail: Option<String>, error: Option<io::Error>) -> Value {
    let mut o = json!({"target": target, "ok": error.is_none()});
    if let Some(e) = error {
        o["error"] = json!(describe(&e));
    }
    if let Some(d) = detail {
        o["detail"] = json!(d.chars().take(200).collect::<String>());
    }
    o
}

/// "EACCES (13): Permission denied" for an OS error; the error's own text otherwise.
fn describe(e: &io::Error) -> String {
    match e.raw_os_error() {
        Some(n) => {
            let errno = Errno::from_raw(n);
            format!("{errno:?} ({n}): {}", errno.desc())
        }
        None => e.to_string(),
    }
}

fn pid_of(target: &str) -> io::Result<Pid> {
    target
        .parse()
        .map(Pid::from_raw)
        .map_err(|_| io::Error::other(format!("not a pid: {target}")))
}

/// Up to 4 KiB of a file, or the names in a directory.
fn read(path: &str) -> io::Result<String> {
    if std::fs::metadata(path)?.is_dir() {
        let names: Vec<String> = std::fs::read_dir(path)?
            .map(|e| e.map(|e| e.file_name().to_string_lossy().into_owned()))
            .collect::<io::Result<_>>()?;
        return Ok(format!("{} entries: {}", names.len(), names.join(", ")));
    }
    let mut bytes = Vec::new();
    File::open(path)?.take(4096).read_to_end(&mut bytes)?;
    Ok(format!(
        "{} bytes: {}",
        bytes.len(),
        String::from_utf8_lossy(&bytes)
    ))
}

fn write(path: &str) -> io::Result<String> {
    File::create(path)?.write_all(b"x")?;
    Ok("wrote 1 byte".into())
}

/// SIGCONT: harmless to a running process, and refused like any other signal.
fn signal_cont(target: &str) -> io::Result<String> {
    kill(pid_of(target)?, Signal::SIGCONT)?;
    Ok("SIGCONT sent".into())
}

/// PTRACE_ATTACH, and if it worked, the attach stop awaited and PTRACE_DETACH.
fn ptrace(target: &str) -> io::Result<String> {
    let pid = pid_of(target)?.as_raw();
    let null = std::ptr::null_mut::<libc::c_void>();
    // SAFETY: attach and detach take no memory of ours; waitpid writes one int we own.
    unsafe {
        if libc::ptrace(libc::PTRACE_ATTACH, pid, null, null) == -1 {
            return Err(io::Error::last_os_error());
        }
        let deadline = Instant::now() + Duration::from_secs(2);
        let stopped = loop {
            let mut status = 0;
            match libc::waitpid(pid, &mut status, libc::__WALL | libc::WNOHANG) {
                w if w == pid => break true,
                0 if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(10)),
                _ => break false,
            }
        };
        let detached = libc::ptrace(libc::PTRACE_DETACH, pid, null, null);
        let detach = if detached == -1 {
            describe(&io::Error::last_os_error())
        } else {
            "ok".into()
        };
        Ok(format!("attached (stopped: {stopped}; detach: {detach})"))
    }
}

fn socket_addr(target: &str) -> io::Result<std::net::SocketAddr> {
    target
        .to_socket_addrs()?
        .next()
        .ok_or_else(|| io::Error::other(format!("no address: {target}")))
}

fn connect(target: &str) -> io::Result<String> {
    let s = TcpStream::connect_timeout(&socket_addr(target)?, Duration::from_secs(2))?;
    Ok(format!("connected from {}", s.local_addr()?))
}

fn udp(target: &str) -> io::Result<String> {
    let n = UdpSocket::bind("0.0.0.0:0")?.send_to(b"x", socket_addr(target)?)?;
    Ok(format!("sent {n} byte"))
}

fn bind(target: &str) -> io::Result<String> {
    let port: u16 = target
        .parse()
        .map_err(|_| io::Error::other(format!("not a port: {target}")))?;
    let l = TcpListener::bind(("127.0.0.1", port))?;
    Ok(format!("listening on {}", l.local_addr()?))
}

fn abstract_connect(name: &str) -> io::Result<String> {
    UnixStream::connect_addr(&SocketAddr::from_abstract_name(name.as_bytes())?)?;
    Ok("connected".into())
}

fn check(r: libc::c_int) -> io::Result<()> {
    if r < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(())
    }
}

/// Sets another process's nice value to 0 (what it has: harmless if it works).
fn renice(target: &str) -> io::Result<String> {
    let pid = pid_of(target)?;
    // SAFETY: plain system call.
    check(unsafe { libc::setpriority(libc::PRIO_PROCESS, pid.as_raw() as libc::id_t, 0) })?;
    Ok("reniced".into())
}

/// Sets another process's core-size limit to what it is (harmless if it works).
fn prlimit(target: &str) -> io::Result<String> {
    let pid = pid_of(target)?;
    let mut old = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: plain system calls on live structs.
    unsafe {
        check(libc::prlimit(
            pid.as_raw(),
            libc::RLIMIT_CORE,
            std::ptr::null(),
            &mut old,
        ))?;
        check(libc::prlimit(
            pid.as_raw(),
            libc::RLIMIT_CORE,
            &old,
            std::ptr::null_mut(),
        ))?;
    }
    Ok("limit set".into())
}

fn unix_connect(path: &str) -> io::Result<String> {
    UnixStream::connect(path)?;
    Ok("connected".into())
}

/// Makes a file at `path` set-user-id.
fn setuid_bit(path: &str) -> io::Result<String> {
    fs::write(path, "#!/bin/sh\n")?;
    fs::set_permissions(path, fs::Permissions::from_mode(0o4755))?;
    Ok("set-user-id".into())
}

/// Forks `n` children that sleep 30 s, stopping at the first failure; then kills and reaps
/// them.
fn fork_many(n: u64) -> Value {
    let mut children = Vec::new();
    let mut error = None;
    for _ in 0..n {
        match sleeper(30) {
            Ok(pid) => children.push(pid),
            Err(e) => {
                error = Some(e);
                break;
            }
        }
    }
    for &child in &children {
        let _ = kill(child, Signal::SIGKILL);
    }
    for &child in &children {
        let _ = waitpid(child, None);
    }
    let detail = format!("started {} of {n}", children.len());
    outcome_json(&n.to_string(), Some(detail), error)
}

/// A child that closes its standard streams (so it holds no pipe to the gateway) and sleeps.
fn sleeper(secs: u32) -> io::Result<Pid> {
    // SAFETY: this process has one thread; the child makes only async-signal-safe calls.
    match unsafe { fork() }? {
        ForkResult::Parent { child } => Ok(child),
        ForkResult::Child => unsafe {
            for fd in 0..3 {
                libc::close(fd);
            }
            libc::sleep(secs);
            libc::_exit(0)
        },
    }
}

fn spawn_sleeper() -> Value {
    match sleeper(300) {
        Ok(pid) => json!({"pid": pid.as_raw()}),
        Err(e) => json!({"error": describe(&e)}),
    }
}

/// Allocates `mb` MiB and touches every page: past a memory bound the kernel kills the
/// process here, or the allocation is refused (an address-space limit).
fn alloc(mb: u64) -> io::Result<String> {
    let bytes = usize::try_from(mb << 20).map_err(io::Error::other)?;
    let mut block: Vec<u8> = Vec::new();
    block.try_reserve_exact(bytes).map_err(io::Error::other)?;
    for page in block.spare_capacity_mut().iter_mut().step_by(4096) {
        page.write(1);
    }
    std::hint::black_box(&block);
    Ok(format!("touched {mb} MiB"))
}

/// Writes `mb` MiB to `path`: the bytes written, and the error that stopped it.
fn write_file(path: &str, mb: u64) -> Value {
    let total = mb << 20;
    let mut written = 0u64;
    let mut error = None;
    match File::create(path) {
        Ok(mut f) => {
            let chunk = vec![b'x'; 1 << 16];
            while written < total {
                let len = chunk
                    .len()
                    .min(usize::try_from(total - written).unwrap_or(usize::MAX));
                match f.write(&chunk[..len]) {
                    Ok(0) => break,
                    Ok(n) => written += n as u64,
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                    Err(e) => {
                        error = Some(e);
                        break;
                    }
                }
            }
        }
        Err(e) => error = Some(e),
    }
    outcome_json(path, Some(format!("{written} bytes written")), error)
}
