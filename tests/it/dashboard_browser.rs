//! Issue 14 acceptance 2: a real browser on the dashboard of a running agent. Debian's
//! headless Chromium, driven through chromedriver's WebDriver protocol (plain HTTP + JSON),
//! loads `/ui` of the agent binary running two deployments on Docker, and the DOM shows a
//! rollout's ready count change without a reload, then a rejected commit's `path:line:col`;
//! screenshots of the overview and of a resource page are written under
//! `target/dashboard-screenshots/` (paths printed, kept by CI as artefacts).
//!
//! Issue 53: the Images table changes without a reload when a scan finds a newer tag (a
//! registry served here, on loopback).
//!
//! Needs a Docker engine, `chromium` and `chromium-driver` (scripts/test-deps installs them);
//! nothing is downloaded at test time.

use std::io::{BufRead as _, Write as _};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::support::{DockerGuard, TempRepo, TestResult, test_image, unique};

/// Kills the process when dropped.
struct Reap(Child);

impl Drop for Reap {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A WebDriver session on chromedriver (also `logs_browser.rs`'s).
pub(crate) struct Browser {
    http: reqwest::blocking::Client,
    base: String,
    session: String,
    _driver: Reap,
    _profile: tempfile::TempDir,
}

impl Browser {
    pub(crate) fn start() -> TestResult<Browser> {
        let port = free_port()?;
        let driver = Reap(
            Command::new("chromedriver")
                .arg(format!("--port={port}"))
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()?,
        );
        let http = reqwest::blocking::Client::builder()
            .tls_backend_preconfigured(voodu_agent::model::tls::client_config()?)
            .timeout(Duration::from_secs(120))
            .build()?;
        let base = format!("http://127.0.0.1:{port}");
        let started = Instant::now();
        while http.get(format!("{base}/status")).send().is_err() {
            if started.elapsed() > Duration::from_secs(30) {
                return Err("chromedriver did not answer".into());
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        let profile = tempfile::tempdir()?;
        let args = [
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-quic",
            "--no-first-run",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--window-size=1280,1100",
            &format!("--user-data-dir={}", profile.path().display()),
        ];
        let capabilities = json!({"capabilities": {"alwaysMatch": {
            "browserName": "chrome",
            "goog:chromeOptions": {"binary": "/usr/bin/chromium", "args": args}
        }}});
        let answer = post(&http, &format!("{base}/session"), &capabilities)?;
        let session = answer["sessionId"]
            .as_str()
            .ok_or_else(|| format!("no session: {answer}"))?
            .to_owned();
        Ok(Browser {
            http,
            base,
            session,
            _driver: driver,
            _profile: profile,
        })
    }

    fn url(&self, path: &str) -> String {
        format!("{}/session/{}{path}", self.base, self.session)
    }

    pub(crate) fn open(&self, url: &str) -> TestResult {
        post(&self.http, &self.url("/url"), &json!({ "url": url }))?;
        Ok(())
    }

    /// Runs `script` (a function body) in the page and returns its value.
    pub(crate) fn run(&self, script: &str) -> TestResult<Value> {
        post(
            &self.http,
            &self.url("/execute/sync"),
            &json!({"script": script, "args": []}),
        )
    }

    /// Waits (liveness bound) until `script` returns something other than null or false.
    pub(crate) fn until(&self, what: &str, script: &str, limit: Duration) -> TestResult<Value> {
        let started = Instant::now();
        loop {
            let value = self.run(script)?;
            if !value.is_null() && value != Value::Bool(false) {
                return Ok(value);
            }
            if started.elapsed() > limit {
                return Err(format!("timed out after {limit:?} waiting for {what}").into());
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    fn screenshot(&self, path: &Path) -> TestResult {
        let answer = self
            .http
            .get(self.url("/screenshot"))
            .send()?
            .error_for_status()?;
        let value: Value = serde_json::from_slice(&answer.bytes()?)?;
        let encoded = value["value"].as_str().ok_or("no screenshot")?;
        std::fs::write(path, base64_decode(encoded)?)?;
        println!("screenshot: {}", path.display());
        Ok(())
    }
}

impl Drop for Browser {
    fn drop(&mut self) {
        let _ = self.http.delete(self.url("")).send();
    }
}

fn post(http: &reqwest::blocking::Client, url: &str, body: &Value) -> TestResult<Value> {
    let response = http
        .post(url)
        .header("content-type", "application/json")
        .body(serde_json::to_vec(body)?)
        .send()?;
    let status = response.status();
    let value: Value = serde_json::from_slice(&response.bytes()?)?;
    if !status.is_success() {
        return Err(format!("webdriver {url}: {status}: {value}").into());
    }
    Ok(value["value"].clone())
}

fn free_port() -> TestResult<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port())
}

fn base64_decode(text: &str) -> TestResult<Vec<u8>> {
    use base64::Engine as _;
    let compact: String = text.split_whitespace().collect();
    Ok(base64::engine::general_purpose::STANDARD.decode(compact)?)
}

pub(crate) fn require(tool: &str) -> TestResult {
    let found = Command::new("sh")
        .args(["-c", &format!("command -v {tool}")])
        .stdout(Stdio::null())
        .status()
        .is_ok_and(|status| status.success());
    if found {
        Ok(())
    } else {
        Err(format!("{tool} is missing (scripts/test-deps installs it)").into())
    }
}

fn deployment(scope: &str, name: &str, replicas: u32) -> String {
    format!(
        r#"deployment "{scope}" "{name}" {{
  image = "{}"
  command = ["sleep", "3600"]
  replicas = {replicas}
}}
"#,
        test_image()
    )
}

/// The `status --json` document of `data_dir`.
fn status(data_dir: &Path) -> Option<Value> {
    let output = Command::new(env!("CARGO_BIN_EXE_voodu-agent"))
        .args(["status", "--json", "--data-dir"])
        .arg(data_dir)
        .output()
        .ok()?;
    serde_json::from_slice(&output.stdout).ok()
}

fn screenshots_dir() -> TestResult<PathBuf> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("target/dashboard-screenshots");
    std::fs::create_dir_all(&dir)?;
    Ok(dir)
}

/// Starts the agent binary with `args` and returns it with its HTTP address (from its log).
fn start_agent(args: &[&str], data_dir: &Path) -> TestResult<(Reap, String)> {
    let mut agent = Reap(
        Command::new(env!("CARGO_BIN_EXE_voodu-agent"))
            .args(args)
            .arg("--data-dir")
            .arg(data_dir)
            .stderr(Stdio::piped())
            .spawn()?,
    );
    let stderr = agent.0.stderr.take().ok_or("piped stderr")?;
    let (address_sender, address) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in std::io::BufReader::new(stderr)
            .lines()
            .map_while(Result::ok)
        {
            if !line.contains("http listening") {
                continue;
            }
            if let Some(rest) = line.split("address=").nth(1) {
                let _ =
                    address_sender.send(rest.split_whitespace().next().unwrap_or("").to_owned());
            }
        }
    });
    let address = address.recv_timeout(Duration::from_secs(60))?;
    Ok((agent, address))
}

/// A registry's tag list on loopback: `GET /v2/app/tags/list` answers the tags `tags` holds
/// now; anything else (a manifest, a pull) 404.
fn tag_registry(tags: Arc<Mutex<Vec<String>>>) -> TestResult<std::net::SocketAddr> {
    let listener = std::net::TcpListener::bind("127.0.0.1:0")?;
    let address = listener.local_addr()?;
    std::thread::spawn(move || {
        for mut stream in listener.incoming().flatten() {
            let tags = tags.clone();
            std::thread::spawn(move || -> TestResult {
                let mut reader = std::io::BufReader::new(stream.try_clone()?);
                let head =
                    crate::support::http::read_request_head(&mut reader)?.ok_or("no request")?;
                if head.target.starts_with("/v2/app/tags/list") {
                    let listed = tags.lock().map(|tags| tags.clone()).unwrap_or_default();
                    let body = json!({ "name": "app", "tags": listed }).to_string();
                    write!(
                        stream,
                        "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                        body.len()
                    )?;
                } else {
                    stream.write_all(
                        b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\nConnection: close\r\n\r\n",
                    )?;
                }
                Ok(())
            });
        }
    });
    Ok(address)
}

/// Issue 53 acceptance 1 (its Images part): the overview is loaded while the followed
/// repository has no newer tag; the registry gets one, the next scan finds it, and the Images
/// table's "Newer tag" and "Last scan" cells change without a reload.
#[test]
#[ignore = "needs a Docker engine and chromium + chromium-driver (scripts/test-deps installs them): scripts/test runs it"]
fn a_browser_sees_the_images_table_change_when_a_scan_finds_a_tag() -> TestResult {
    require("chromium")?;
    require("chromedriver")?;
    let scope = unique("dashimg");
    let _guard = DockerGuard::new(&scope);
    let tags = Arc::new(Mutex::new(vec!["1.0.0".to_owned()]));
    let registry = tag_registry(tags.clone())?;
    let repo = TempRepo::new()?;
    // A cronjob that never fires in the test: followed, never pulled.
    repo.write(
        "app.hcl",
        &format!(
            "cronjob \"{scope}\" \"app\" {{\n  schedule = \"0 0 1 1 *\"\n  image = \"{registry}/app:1.0.0\"\n  command = [\"true\"]\n  image_update {{\n    mode = \"report\"\n    interval = \"10s\"\n  }}\n}}\n"
        ),
    )?;
    repo.commit("a followed image")?;
    let data = tempfile::tempdir()?;
    let browser = Browser::start()?;
    let (mut agent, address) = start_agent(
        &[
            "--repo",
            &repo.url(),
            "--interval",
            "1s",
            "--no-ingress",
            "--listen",
            "127.0.0.1:0",
            "--allow-url-host",
            "127.0.0.1",
        ],
        data.path(),
    )?;
    let dashboard = format!("http://{address}/ui");
    let row = format!("cronjob/{scope}/app");
    let cell = |field: &str| {
        format!(
            "var cell = document.querySelector('tr[data-image=\"{row}\"] [data-field={field}]'); if (!cell) return null;"
        )
    };
    // Loaded once the first scan is recorded (the row is there, no newer tag yet).
    let started = Instant::now();
    loop {
        browser.open(&dashboard)?;
        let scanned = browser.run(&format!(
            "{} return cell.textContent.indexOf('ok at') === 0 ? cell.textContent : null;",
            cell("scan")
        ))?;
        if !scanned.is_null() {
            println!("first scan in the page: {scanned}");
            break;
        }
        if started.elapsed() > Duration::from_secs(90) {
            return Err(format!("the Images table never showed a scan of {row}").into());
        }
        std::thread::sleep(Duration::from_millis(500));
    }
    browser.run("window.__voodu_marker = 'kept'; return true;")?;
    assert_eq!(
        browser.run(&format!("{} return cell.textContent;", cell("latest")))?,
        json!("-")
    );
    // The registry gets a newer tag; the next scan (within its 10 s interval) finds it.
    tags.lock()
        .map_err(|_| "poisoned")?
        .push("1.0.1".to_owned());
    let newer = browser.until(
        "the Images table's newer tag to change live",
        &format!(
            "{} return cell.textContent === '1.0.1' ? cell.textContent : null;",
            cell("latest")
        ),
        Duration::from_secs(60),
    )?;
    println!("newer tag in the page: {newer}");
    assert_eq!(
        browser.run("return window.__voodu_marker || null;")?,
        json!("kept"),
        "the page was reloaded"
    );
    // SAFETY: kill(2) on the child's pid, which is alive (not reaped) here.
    unsafe { libc::kill(agent.0.id() as i32, libc::SIGTERM) };
    let exit = agent.0.wait()?;
    assert!(exit.success(), "{exit}");
    Ok(())
}

#[test]
#[ignore = "needs a Docker engine and chromium + chromium-driver (scripts/test-deps installs them): scripts/test runs it"]
fn a_browser_sees_a_rollout_progress_live_and_a_rejected_commits_locations() -> TestResult {
    require("chromium")?;
    require("chromedriver")?;
    let scope = unique("dash");
    let _guard = DockerGuard::new(&scope);
    let repo = TempRepo::new()?;
    repo.write("README.md", "deployments arrive in the next commit\n")?;
    repo.commit("empty")?;
    let data = tempfile::tempdir()?;
    // The browser first: the rollout below must not finish while it starts.
    let browser = Browser::start()?;
    let mut agent = Reap(
        Command::new(env!("CARGO_BIN_EXE_voodu-agent"))
            .args(["--repo", &repo.url(), "--interval", "1s", "--no-ingress"])
            .args(["--listen", "127.0.0.1:0", "--ready-settle", "8s"])
            .arg("--data-dir")
            .arg(data.path())
            .stderr(Stdio::piped())
            .spawn()?,
    );
    // The agent's address, from its log line.
    let stderr = agent.0.stderr.take().ok_or("piped stderr")?;
    let (address_sender, address) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in std::io::BufReader::new(stderr)
            .lines()
            .map_while(Result::ok)
        {
            if !line.contains("http listening") {
                continue;
            }
            if let Some(rest) = line.split("address=").nth(1) {
                let _ =
                    address_sender.send(rest.split_whitespace().next().unwrap_or("").to_owned());
            }
        }
    });
    let address = address.recv_timeout(Duration::from_secs(60))?;
    let dashboard = format!("http://{address}/ui");
    browser.open(&dashboard)?;
    // A marker that only survives if the page is never reloaded.
    browser.run("window.__voodu_marker = 'kept'; return true;")?;
    repo.write("web.hcl", &deployment(&scope, "web", 2))?;
    repo.write("api.hcl", &deployment(&scope, "api", 3))?;
    repo.commit("web and api")?;
    // The new rows need a reload (the page says so); the live part is what comes after.
    let started = Instant::now();
    let progressing = loop {
        if let Some(status) = status(data.path()) {
            let api = status["resources"]
                .as_array()
                .into_iter()
                .flatten()
                .find(|resource| resource["name"] == "api")
                .cloned();
            if let Some(api) = api
                && api["detail"]["ready_replicas"].as_u64().unwrap_or(0) < 3
                && api["desired_replicas"] == 3
            {
                break api;
            }
        }
        if started.elapsed() > Duration::from_secs(60) {
            return Err("api never showed up progressing".into());
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    println!("api progressing: {}", progressing["message"]);
    browser.open(&dashboard)?;
    browser.run("window.__voodu_marker = 'kept'; return true;")?;
    let ready_cell = format!(
        "var cell = document.querySelector('tr[data-key=\"deployment/{scope}/api\"] [data-field=ready]'); if (!cell) return null;"
    );
    let before = browser.run(&format!("{ready_cell} return cell.textContent;"))?;
    println!("api ready count when loaded: {before}");
    let before_text = before.as_str().ok_or("no api row")?.to_owned();
    assert_ne!(before_text, "3/3", "loaded after the rollout ended");
    let changed = browser.until(
        "api's ready count to reach 3/3 live",
        &format!("{ready_cell} return cell.textContent === '3/3' ? cell.textContent : null;"),
        Duration::from_secs(90),
    )?;
    println!("api ready count now: {changed}");
    assert_eq!(
        browser.run("return window.__voodu_marker || null;")?,
        json!("kept"),
        "the page was reloaded"
    );
    assert_eq!(
        browser.run("return document.getElementById('live').hidden;")?,
        json!(false)
    );
    // A rejected commit shows up, with its locations, still without a reload.
    repo.write("broken.hcl", "deployment \"s\" \"x\" {\n  image = \n}\n")?;
    repo.write(
        "api.hcl",
        &deployment(&scope, "api", 3).replace("replicas = 3", "replicas = \"three\""),
    )?;
    let broken = repo.commit("broken")?;
    let locations = browser.until(
        "the rejected commit's locations",
        &format!(
            "var section = document.getElementById('rejected'); if (!section || section.hidden) return null; if (document.getElementById('rejected-sha').textContent !== '{}') return null; return Array.prototype.map.call(document.querySelectorAll('#rejected-problems .loc'), function (e) {{ return e.textContent; }});",
            &broken[..12]
        ),
        Duration::from_secs(60),
    )?;
    println!("rejected locations in the page: {locations}");
    let expected: Vec<String> = status(data.path())
        .and_then(|status| status["last_rejected"]["diagnostics"].as_array().cloned())
        .unwrap_or_default()
        .iter()
        .map(|d| {
            format!(
                "{}:{}:{}",
                d["path"].as_str().unwrap_or(""),
                d["line"],
                d["col"]
            )
        })
        .collect();
    assert!(!expected.is_empty());
    assert_eq!(locations, json!(expected));
    assert!(
        expected
            .iter()
            .any(|location| location.starts_with("broken.hcl:"))
            && expected
                .iter()
                .any(|location| location.starts_with("api.hcl:")),
        "{expected:?}"
    );
    assert_eq!(
        browser.run("return window.__voodu_marker || null;")?,
        json!("kept"),
        "the page was reloaded"
    );
    // Both resources end Ready, and the counts follow live (the last readiness flip's pass
    // may land after api's ready count reached 3/3: each pass writes its own status).
    let counts = "return document.getElementById('phase-counts').textContent.trim();";
    println!("phase counts now: {}", browser.run(counts)?);
    browser.until(
        "the phase counts to follow live to Ready 2",
        &format!("var counts = (function () {{ {counts} }})(); return counts === 'Ready 2' ? counts : null;"),
        Duration::from_secs(60),
    )?;
    let dir = screenshots_dir()?;
    // After the changed cells' highlight faded.
    browser.until(
        "the highlights to fade",
        "return document.getAnimations().length === 0;",
        Duration::from_secs(10),
    )?;
    browser.screenshot(&dir.join("overview.png"))?;
    browser.open(&format!(
        "http://{address}/ui/resource/deployment/{scope}/api"
    ))?;
    browser.until(
        "the plot",
        "return document.getElementById('ready-line') ? true : null;",
        Duration::from_secs(20),
    )?;
    browser.screenshot(&dir.join("resource.png"))?;
    // SIGTERM: the agent stops cleanly.
    // SAFETY: kill(2) on the child's pid, which is alive (not reaped) here.
    unsafe { libc::kill(agent.0.id() as i32, libc::SIGTERM) };
    let exit = agent.0.wait()?;
    assert!(exit.success(), "{exit}");
    Ok(())
}

/// Issue 51 (the dashboard part): a deployment's canary, paused at 50 % until promoted, shows
/// on its page as a Rollout block (step 1/2, the share, the phase); `POST
/// /api/rollouts/…/promote` moves it on and the block follows without a reload: phase
/// promoted at 100 %, the promote in the history with who asked.
#[test]
#[ignore = "needs a Docker engine and chromium + chromium-driver (scripts/test-deps installs them): scripts/test runs it"]
fn a_browser_sees_a_canary_rollout_and_its_promote_live() -> TestResult {
    require("chromium")?;
    require("chromedriver")?;
    let scope = unique("canary-ui");
    let _guard = DockerGuard::new(&scope);
    let web = |version: &str| {
        format!(
            r#"deployment "{scope}" "web" {{
  image    = "{}"
  command  = ["sleep", "3600"]
  replicas = 2
  env      = {{ V = "{version}" }}
  canary {{
    step {{
      weight = 50
      pause  = "until_promoted"
    }}
    step {{ weight = 100 }}
  }}
}}
"#,
            test_image()
        )
    };
    let repo = TempRepo::new()?;
    repo.write("web.hcl", &web("1"))?;
    repo.commit("web 1")?;
    let data = tempfile::tempdir()?;
    let browser = Browser::start()?;
    let (mut agent, address) = start_agent(
        &[
            "--repo",
            &repo.url(),
            "--interval",
            "1s",
            "--no-ingress",
            "--listen",
            "127.0.0.1:0",
        ],
        data.path(),
    )?;
    let wait_status = |what: &str, check: &dyn Fn(&Value) -> bool| -> TestResult<Value> {
        let started = Instant::now();
        loop {
            if let Some(status) = status(data.path())
                && check(&status)
            {
                return Ok(status);
            }
            if started.elapsed() > Duration::from_secs(120) {
                return Err(format!("never: {what}: {:?}", status(data.path())).into());
            }
            std::thread::sleep(Duration::from_millis(200));
        }
    };
    wait_status("web Ready", &|status| {
        status["resources"]
            .as_array()
            .into_iter()
            .flatten()
            .any(|resource| resource["name"] == "web" && resource["phase"] == "Ready")
    })?;
    repo.write("web.hcl", &web("2"))?;
    repo.commit("web 2")?;
    wait_status("the canary paused", &|status| {
        status["rollouts"][0]["phase"] == "paused"
    })?;
    let page = format!("http://{address}/ui/resource/deployment/{scope}/web");
    browser.open(&page)?;
    browser.run("window.__voodu_marker = 'kept'; return true;")?;
    let text = |id: &str| {
        format!("var e = document.getElementById('{id}'); return e ? e.textContent : null;")
    };
    assert_eq!(browser.run(&text("rollout-step-text"))?, json!("step 1/2"));
    assert_eq!(
        browser.run(&text("rollout-share"))?,
        json!("50 % of the traffic to the new release (1 canary replica(s))")
    );
    assert_eq!(browser.run(&text("rollout-phase"))?, json!("paused"));
    assert_eq!(
        browser.run("return document.querySelector('#rollout .share.current').textContent;")?,
        json!("50 %")
    );

    let answer = reqwest::blocking::Client::builder()
        .tls_backend_preconfigured(voodu_agent::model::tls::client_config()?)
        .build()?
        .post(format!("http://{address}/api/rollouts/{scope}/web/promote"))
        .header("x-voodu-actor", "browser-test")
        .send()?;
    assert_eq!(answer.status().as_u16(), 202, "{:?}", answer.text());
    let phase = browser.until(
        "the Rollout block to say promoted live",
        "var e = document.getElementById('rollout-phase'); return e && e.textContent === 'promoted' ? e.textContent : null;",
        Duration::from_secs(120),
    )?;
    println!("rollout phase now: {phase}");
    assert_eq!(browser.run(&text("rollout-step-text"))?, json!("step 2/2"));
    let history = browser.until(
        "the requested promote in the history",
        "var rows = document.querySelectorAll('#rollout-history tr'); var found = Array.prototype.find.call(rows, function (tr) { return tr.textContent.indexOf('rollout.promote') >= 0 && tr.textContent.indexOf('browser-test') >= 0; }); return found ? found.textContent : null;",
        Duration::from_secs(30),
    )?;
    let history = history.as_str().unwrap_or_default();
    assert!(
        history.contains("step 1, 50 %") && history.contains("http (browser-test)"),
        "{history}"
    );
    assert_eq!(
        browser.run("return window.__voodu_marker || null;")?,
        json!("kept"),
        "the page was reloaded"
    );
    browser.run("document.getElementById('rollout').scrollIntoView(); return true;")?;
    browser.screenshot(&screenshots_dir()?.join("rollout.png"))?;
    // SAFETY: kill(2) on the child's pid, which is alive (not reaped) here.
    unsafe { libc::kill(agent.0.id() as i32, libc::SIGTERM) };
    let exit = agent.0.wait()?;
    assert!(exit.success(), "{exit}");
    Ok(())
}
