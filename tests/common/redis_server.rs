//! A Redis of a test's own: `redis-server` on a port of its own on 127.0.0.1, keeping nothing
//! on disk (`--save ''`, `--appendonly no`), so a restart brings it back empty. The test
//! chooses the port before the server first runs (a cluster can be pointed at a Redis that is
//! not there yet), kills it, freezes it (SIGSTOP: a Redis that hangs) and starts it again on
//! the same port. On drop it kills the server; it never touches a process it did not start.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use super::{free_port, send_signal};

/// A `redis-server` process, running or not, on a port fixed for its life.
pub struct RedisServer {
    port: u16,
    child: Option<Child>,
    /// Its working directory (nothing is written there with persistence off).
    dir: tempfile::TempDir,
}

impl RedisServer {
    /// A server on a port free a moment ago, not started yet.
    pub fn reserve() -> RedisServer {
        RedisServer {
            port: free_port(),
            child: None,
            dir: tempfile::tempdir().unwrap(),
        }
    }

    /// A server started on a port free a moment ago.
    pub fn start() -> RedisServer {
        let mut r = RedisServer::reserve();
        r.run();
        r
    }

    /// `redis://127.0.0.1:<port>`.
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    /// Starts the server (empty) on its port; returns once it answers PING.
    pub fn run(&mut self) {
        assert!(self.child.is_none(), "redis-server already runs");
        let mut child = Command::new("redis-server")
            .args(["--port", &self.port.to_string()])
            .args(["--bind", "127.0.0.1"])
            .args(["--save", ""])
            .args(["--appendonly", "no"])
            .arg("--dir")
            .arg(self.dir.path())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| panic!("start redis-server: {e} (run scripts/install-test-deps)"));
        let deadline = Instant::now() + Duration::from_secs(10);
        while !self.answers() {
            if let Some(status) = child.try_wait().unwrap() {
                panic!("redis-server on port {} exited: {status}", self.port);
            }
            assert!(
                Instant::now() < deadline,
                "redis-server on port {} did not answer",
                self.port
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        self.child = Some(child);
    }

    /// Whether it answers PING within a second.
    pub fn answers(&self) -> bool {
        let ping = || -> std::io::Result<bool> {
            let addr = ([127, 0, 0, 1], self.port).into();
            let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(1))?;
            s.set_read_timeout(Some(Duration::from_secs(1)))?;
            s.write_all(b"PING\r\n")?;
            let mut got = [0u8; 7];
            s.read_exact(&mut got)?;
            Ok(&got == b"+PONG\r\n")
        };
        ping().unwrap_or(false)
    }

    /// SIGKILL (a crash: everything it held is lost) and reap it.
    pub fn kill(&mut self) {
        let mut child = self.child.take().expect("redis-server runs");
        child.kill().expect("SIGKILL redis-server");
        child.wait().expect("reap redis-server");
    }

    /// SIGSTOP: it keeps its connections but answers nothing, until [`RedisServer::resume`].
    pub fn freeze(&self) {
        let child = self.child.as_ref().expect("redis-server runs");
        assert!(send_signal(child.id(), "-STOP"), "SIGSTOP redis-server");
    }

    /// SIGCONT after [`RedisServer::freeze`].
    pub fn resume(&self) {
        let child = self.child.as_ref().expect("redis-server runs");
        assert!(send_signal(child.id(), "-CONT"), "SIGCONT redis-server");
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            // A frozen server dies of SIGKILL too.
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}
