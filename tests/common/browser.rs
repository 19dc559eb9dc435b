//! A real browser for the tests: Debian's chromium driven through chromedriver's WebDriver
//! HTTP API (open a page, type, click), and every process of it killed when it is dropped,
//! even when the test fails. It never reuses a profile: each browser has a directory of its own.

use serde_json::{Value, json};

use super::{alive, descendants, free_port};

/// A WebDriver session on Debian's chromium, through chromedriver's HTTP API.
pub struct Browserdriver {
    driver: std::process::Child,
    base: String,
    session: String,
    http: reqwest::Client,
    _profile: tempfile::TempDir,
}

impl Browserdriver {
    pub async fn start() -> Browserdriver {
        let port = free_port();
        let driver = std::process::Command::new("/usr/bin/chromedriver")
            .arg(format!("--port={port}"))
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .expect(
                "chromedriver (Debian's chromium-driver, installed by scripts/install-test-deps)",
            );
        let base = format!("http://127.0.0.1:{port}");
        let http = reqwest::Client::new();
        let ready = || async {
            let r = http.get(format!("{base}/status")).send().await.ok()?;
            let v: Value = r.json().await.ok()?;
            v["value"]["ready"].as_bool()
        };
        for _ in 0..500 {
            if ready().await == Some(true) {
                break;
            }
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        }
        let profile = tempfile::tempdir().unwrap();
        let caps = json!({"capabilities": {"alwaysMatch": {"browserName": "chrome", "goog:chromeOptions": {
            "binary": "/usr/bin/chromium",
            "args": ["--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                     "--disable-quic", "--no-first-run", "--disable-background-networking",
                     "--disable-component-update", "--disable-sync",
                     format!("--user-data-dir={}", profile.path().display())]}}}});
        let r: Value = http
            .post(format!("{base}/session"))
            .json(&caps)
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        let session = r["value"]["sessionId"]
            .as_str()
            .unwrap_or_else(|| panic!("no WebDriver session: {r}"))
            .to_owned();
        Browserdriver {
            driver,
            base,
            session,
            http,
            _profile: profile,
        }
    }

    pub async fn cmd(&self, path: &str, body: Value) -> Value {
        let r: Value = self
            .http
            .post(format!("{}/session/{}{path}", self.base, self.session))
            .json(&body)
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        r["value"].clone()
    }

    pub async fn goto(&self, url: &str) {
        self.cmd("/url", json!({"url": url})).await;
    }

    /// The element matching `css`, waiting for the page that has it.
    pub async fn find(&self, css: &str) -> String {
        for _ in 0..500 {
            let v = self
                .cmd("/element", json!({"using": "css selector", "value": css}))
                .await;
            if let Some(id) = v["element-6066-11e4-a52e-4f735466cecf"].as_str() {
                return id.to_owned();
            }
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        }
        let source = self
            .http
            .get(format!("{}/session/{}/source", self.base, self.session))
            .send()
            .await
            .unwrap()
            .text()
            .await
            .unwrap();
        panic!("no element {css} on the page: {source}");
    }

    pub async fn type_into(&self, css: &str, text: &str) {
        let e = self.find(css).await;
        self.cmd(&format!("/element/{e}/value"), json!({"text": text}))
            .await;
    }

    pub async fn click(&self, css: &str) {
        let e = self.find(css).await;
        self.cmd(&format!("/element/{e}/click"), json!({})).await;
    }
}

impl Browserdriver {
    /// Runs `script` (a function body; `return` gives its value) in the page.
    pub async fn eval(&self, script: &str) -> Value {
        self.cmd("/execute/sync", json!({"script": script, "args": []}))
            .await
    }

    /// Waits until `condition` (a JavaScript expression) holds in the page; panics with the
    /// page's text after `secs` seconds.
    pub async fn wait_js(&self, condition: &str, secs: u64) {
        let script = format!("try {{ return !!({condition}); }} catch (e) {{ return false; }}");
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(secs);
        while std::time::Instant::now() < deadline {
            if self.eval(&script).await == Value::Bool(true) {
                return;
            }
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        }
        let text = self.eval("return document.body.innerText").await;
        panic!("waited {secs} s for `{condition}`; the page says:\n{text}");
    }

    /// Sizes the window (and so the screenshots).
    pub async fn window(&self, width: u32, height: u32) {
        self.cmd("/window/rect", json!({"width": width, "height": height}))
            .await;
    }

    /// A PNG of the visible page.
    pub async fn screenshot(&self) -> Vec<u8> {
        use base64::Engine;
        let r: Value = self
            .http
            .get(format!("{}/session/{}/screenshot", self.base, self.session))
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        base64::engine::general_purpose::STANDARD
            .decode(r["value"].as_str().expect("a screenshot"))
            .unwrap()
    }
}

impl Browserdriver {
    /// Every process of this browser: chromedriver's descendants (chromium and its helpers),
    /// and whatever names the browser's own profile directory, should one have left the tree.
    pub fn processes(&self) -> Vec<u32> {
        let mut pids = descendants(self.driver.id());
        let profile = self._profile.path().to_string_lossy().into_owned();
        for entry in std::fs::read_dir("/proc").unwrap().flatten() {
            let Ok(pid) = entry.file_name().to_string_lossy().parse::<u32>() else {
                continue;
            };
            let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
            if String::from_utf8_lossy(&cmdline).contains(&profile) && !pids.contains(&pid) {
                pids.push(pid);
            }
        }
        pids.retain(|p| alive(*p));
        pids
    }
}

impl Drop for Browserdriver {
    /// Kills chromium and every helper of it as well as chromedriver, which alone would leave
    /// them running after the suite; this runs when a test fails too.
    fn drop(&mut self) {
        use nix::sys::signal::{Signal, kill};
        use nix::unistd::Pid;
        let browser = self.processes();
        for pid in &browser {
            let _ = kill(Pid::from_raw(*pid as i32), Signal::SIGKILL);
        }
        let _ = self.driver.kill();
        let _ = self.driver.wait();
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while browser.iter().any(|p| alive(*p)) && std::time::Instant::now() < deadline {
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
    }
}
