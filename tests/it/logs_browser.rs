//! Issue 53, acceptance 1 (the logs half): a real browser (headless Chromium through
//! chromedriver, `dashboard_browser::Browser`) on a resource's page of the agent binary
//! running a deployment on Docker: its logs appear and follow live (new lines arrive without
//! a reload); a line holding `<script>` and terminal escapes is shown as inert text (no script
//! runs, no element is made, the escapes are literal); a value of a SOPS env file the
//! container prints is masked, and appears nowhere in the page.

use std::io::BufRead as _;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use serde_json::json;

use crate::dashboard_browser::{Browser, require};
use crate::support::sops::AgeKey;
use crate::support::{DockerGuard, TempRepo, TestResult, test_image, unique};

/// Kills the agent when dropped.
struct Reap(Child);

impl Drop for Reap {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A deployment whose replica prints a hostile line once, then a numbered tick with the
/// sealed `DB_PASSWORD` every second.
fn printer(scope: &str) -> String {
    format!(
        r#"deployment "{scope}" "web" {{
  image    = "{image}"
  command  = ["sh", "-c", "printf '<script>window.__pwned=1</script><img src=x onerror=window.__pwned=2> \\033[31mred\\033[0m\\a\\n'; i=0; while true; do i=$((i+1)); echo \"tick $i secret=$DB_PASSWORD\"; sleep 1; done"]
  env_file = ["secrets.sops.env"]
}}
"#,
        image = test_image()
    )
}

#[test]
#[ignore = "needs a Docker engine, chromium + chromium-driver, sops and age (scripts/test-deps installs them): scripts/test runs it"]
fn i53_a_browser_tails_a_resources_logs_live_inert_and_masked() -> TestResult {
    require("chromium")?;
    require("chromedriver")?;
    if !AgeKey::tools_available() {
        return Err("sops and age-keygen are missing (scripts/test-deps installs them)".into());
    }
    let scope = unique("logui");
    let _guard = DockerGuard::new(&scope);
    let key = AgeKey::new()?;
    // A value that appears nowhere unless it leaks.
    let secret = format!("pw-{}", voodu_agent::model::random_hex(12));
    let repo = TempRepo::new()?;
    key.encrypt_to(
        &repo.work().join("secrets.sops.env"),
        format!("DB_PASSWORD={secret}\n").as_bytes(),
        "dotenv",
    )?;
    repo.write("web.hcl", &printer(&scope))?;
    repo.commit("a printer")?;
    let data = tempfile::tempdir()?;
    let browser = Browser::start()?;
    let identity = key.identity().display().to_string();
    let mut agent = Reap(
        Command::new(env!("CARGO_BIN_EXE_voodu-agent"))
            .args(["--repo", &repo.url(), "--interval", "1h", "--no-ingress"])
            .args(["--listen", "127.0.0.1:0", "--age-identity", &identity])
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
            if let Some(rest) = line
                .contains("http listening")
                .then(|| line.split("address=").nth(1))
                .flatten()
            {
                let _ =
                    address_sender.send(rest.split_whitespace().next().unwrap_or("").to_owned());
            }
        }
    });
    let address = address.recv_timeout(Duration::from_secs(60))?;
    let page = format!("http://{address}/ui/resource/deployment/{scope}/web");
    // The page exists once the deployment has a status.
    let started = std::time::Instant::now();
    loop {
        browser.open(&page)?;
        if browser.run("return document.getElementById('log-lines') !== null;")? == json!(true) {
            break;
        }
        if started.elapsed() > Duration::from_secs(90) {
            return Err("the resource page never showed its log tail".into());
        }
        std::thread::sleep(Duration::from_secs(1));
    }
    browser.run("window.__voodu_marker = 'kept'; return true;")?;
    let ticks = "return Array.prototype.map.call(document.querySelectorAll('#log-lines .log-line'), function (e) { return e.textContent; }).filter(function (t) { return t.indexOf(' | tick ') >= 0; });";
    let first = browser.until(
        "the first tick lines",
        &format!("var t = (function () {{ {ticks} }})(); return t.length >= 2 ? t : null;"),
        Duration::from_secs(90),
    )?;
    let seen = first.as_array().map_or(0, Vec::len);
    println!("ticks shown first: {first}");
    // Live: more lines arrive, without a reload.
    let later = browser.until(
        "more tick lines, live",
        &format!(
            "var t = (function () {{ {ticks} }})(); return t.length >= {} ? t : null;",
            seen + 3
        ),
        Duration::from_secs(60),
    )?;
    assert_eq!(
        browser.run("return window.__voodu_marker || null;")?,
        json!("kept"),
        "the page was reloaded"
    );
    // Masked: the line says the mask, and the secret is nowhere in the page.
    let last = later
        .as_array()
        .and_then(|ticks| ticks.last())
        .and_then(|tick| tick.as_str())
        .ok_or("no tick")?
        .to_owned();
    assert!(last.ends_with("secret=••••••"), "{last}");
    assert_eq!(
        browser.run(&format!(
            "return document.documentElement.outerHTML.indexOf('{secret}');"
        ))?,
        json!(-1),
        "the sealed value reached the page"
    );
    // Inert: the hostile line is text; nothing ran, no element was made from it.
    let hostile = browser.until(
        "the hostile line",
        "var lines = Array.prototype.map.call(document.querySelectorAll('#log-lines .log-line'), function (e) { return e.textContent; }); var found = lines.filter(function (t) { return t.indexOf('<script>') >= 0; }); return found.length ? found[0] : null;",
        Duration::from_secs(30),
    )?;
    let hostile = hostile.as_str().ok_or("not text")?;
    assert!(
        hostile.ends_with(
            " | <script>window.__pwned=1</script><img src=x onerror=window.__pwned=2> \\x1b[31mred\\x1b[0m\\x07"
        ),
        "{hostile}"
    );
    assert_eq!(
        browser.run("return window.__pwned === undefined;")?,
        json!(true),
        "the container's script ran"
    );
    assert_eq!(
        browser
            .run("return document.querySelectorAll('#log-lines script, #log-lines img').length;")?,
        json!(0)
    );
    // One container only: the select lists it, and choosing it restarts the tail.
    browser.run(
        "var s = document.getElementById('log-replica'); s.selectedIndex = 1; s.dispatchEvent(new Event('change')); return true;",
    )?;
    browser.until(
        "the one container's tail",
        &format!("var t = (function () {{ {ticks} }})(); return t.length >= 1 ? t : null;"),
        Duration::from_secs(30),
    )?;
    // SAFETY: kill(2) on the child's pid, which is alive (not reaped) here.
    unsafe { libc::kill(agent.0.id() as i32, libc::SIGTERM) };
    let exit = agent.0.wait()?;
    assert!(exit.success(), "{exit}");
    Ok(())
}
