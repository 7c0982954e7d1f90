//! Issue 51, acceptance 2: blue/green through the real ingress. The real binary with its
//! Caddy proxy on a real engine: a new release comes up whole and answers at the preview host
//! while the ingress's host serves the old one; under a steady client stream on the main host,
//! `voodu-agent promote` switches every request to the new release with no failed request, and
//! `voodu-agent abort` (within `keep_old`) switches back with no failed request; the new
//! release's replicas are then removed and the release is failed.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use crate::maintenance_docker::{ProxyGuard, cli, free_port, through_proxy};
use crate::sources_docker::{Agent, LogOnFailure, containers, status};
use crate::support::canary::ProxyLoads;
use crate::support::{DockerGuard, TempRepo, TestResult, test_image, unique, wait_until};

const LIMIT: Duration = Duration::from_secs(120);

/// Two httpd replicas answering `version`, rolled out blue/green, and an ingress.
fn shop_files(shop: &str, version: &str) -> String {
    format!(
        r#"deployment "{shop}" "web" {{
  image    = "{image}"
  command  = ["sh", "-c", "echo {version} > /www/index.html && exec httpd -f -p 8080 -h /www"]
  replicas = 2
  blue_green {{
    preview_host = "{shop}-preview.test"
    keep_old     = "10m"
  }}
}}

ingress "{shop}" "web" {{
  host = "{shop}.test"
  port = 8080
}}
"#,
        image = test_image()
    )
}

/// What a steady client saw: (answers with `200` and their body's version, failures with
/// when their request was sent and whether it got a status).
#[derive(Debug, Default)]
struct Seen {
    versions: Vec<String>,
    failures: Vec<Failure>,
}

/// A request that failed.
#[derive(Debug)]
struct Failure {
    sent: std::time::SystemTime,
    /// Its answer's status line; `None` when it got none.
    status: Option<String>,
    /// Without a status: the (empty) answer, or the error.
    why: String,
}

impl Seen {
    /// Without the connections the proxy dropped at its config loads (`ProxyLoads`).
    fn without_drops(self, log: &std::path::Path) -> TestResult<Seen> {
        let failures = ProxyLoads::from_log(log)?.without_drops_by(self.failures, |failure| {
            failure
                .status
                .is_none()
                .then_some((failure.sent, failure.why.as_str()))
        })?;
        Ok(Seen { failures, ..self })
    }
}

/// A client sending one request every 10 ms to `host` through the proxy until stopped.
struct Stream {
    stop: Arc<AtomicBool>,
    thread: std::thread::JoinHandle<Seen>,
}

impl Stream {
    fn start(proxy: u16, host: String) -> Stream {
        let stop = Arc::new(AtomicBool::new(false));
        let flag = Arc::clone(&stop);
        let thread = std::thread::spawn(move || {
            let mut seen = Seen::default();
            while !flag.load(Ordering::Relaxed) {
                let sent = std::time::SystemTime::now();
                match through_proxy(proxy, &host) {
                    Ok(answer) if answer.starts_with("HTTP/1.1 200") => seen
                        .versions
                        .push(answer.lines().last().unwrap_or_default().trim().to_owned()),
                    Ok(answer) if answer.starts_with("HTTP/") => seen.failures.push(Failure {
                        sent,
                        status: answer.lines().next().map(str::to_owned),
                        why: String::new(),
                    }),
                    Ok(why) => seen.failures.push(Failure {
                        sent,
                        status: None,
                        why,
                    }),
                    Err(error) => seen.failures.push(Failure {
                        sent,
                        status: None,
                        why: error.to_string(),
                    }),
                }
                std::thread::sleep(Duration::from_millis(10));
            }
            seen
        });
        Stream { stop, thread }
    }

    fn stop(self) -> TestResult<Seen> {
        self.stop.store(true, Ordering::Relaxed);
        self.thread
            .join()
            .map_err(|_| "the client thread panicked".into())
    }
}

/// Waits until `host` answers `version`.
fn serves(proxy: u16, host: &str, version: &str) -> TestResult<()> {
    wait_until(LIMIT, &format!("{host} serves {version}"), || {
        let answer = through_proxy(proxy, host).ok()?;
        (answer.starts_with("HTTP/1.1 200") && answer.contains(version)).then_some(())
    })
}

#[test]
#[ignore = "needs a Docker engine: scripts/test runs it (cargo test -- --include-ignored)"]
fn i51_blue_green_previews_the_new_release_and_switches_with_no_failed_request() -> TestResult {
    let shop = unique("bg");
    let _guard = DockerGuard::new(&shop);
    let repo = TempRepo::new()?;
    repo.write("shop.hcl", &shop_files(&shop, "shop-v1"))?;
    let sha = repo.commit("v1")?;
    let proxy_port = free_port()?;
    let dir = tempfile::tempdir()?;
    let (data_dir, log) = (dir.path().join("data"), dir.path().join("agent.log"));
    let caddy =
        std::env::var("VOODU_CADDY_IMAGE").unwrap_or_else(|_| "voodu-caddy:latest".to_owned());
    let (url, proxy_arg) = (repo.url(), format!("127.0.0.1:{proxy_port}"));
    let args = [
        "--repo",
        url.as_str(),
        "--ingress-image",
        &caddy,
        "--ingress-http",
        &proxy_arg,
        "--ingress-https",
        "127.0.0.1:0",
    ];
    let _agent = Agent::start_with(&data_dir, &log, &args)?;
    let mut proxy_guard = ProxyGuard(None);
    let mut failed = LogOnFailure(&log, true);
    let (host, preview) = (format!("{shop}.test"), format!("{shop}-preview.test"));
    wait_until(LIMIT, "v1 applied", || {
        (status(&data_dir).ok()?["last_applied"]["sha"] == sha.as_str()).then_some(())
    })?;
    let agent_id =
        voodu_agent::store::Store::open_read_only(&data_dir.join("state.db"))?.agent_id()?;
    proxy_guard.0 = Some(format!("voodu-caddy-{agent_id}"));
    serves(proxy_port, &host, "shop-v1")?;
    let old = wait_until(LIMIT, "two v1 replicas", || {
        let ids = containers(&shop).ok()?;
        (ids.len() == 2).then_some(ids)
    })?;

    // v2: up whole beside v1, at the preview host only.
    repo.write("shop.hcl", &shop_files(&shop, "shop-v2"))?;
    repo.commit("v2")?;
    cli(&data_dir, &["sync"])?;
    serves(proxy_port, &preview, "shop-v2")?;
    wait_until(LIMIT, "the rollout paused for promote", || {
        let shown = status(&data_dir).ok()?;
        let rollout = shown["rollouts"].as_array()?.first()?.clone();
        (rollout["phase"] == "paused").then_some(())
    })?;
    assert_eq!(containers(&shop)?.len(), 4, "both releases run");
    for _ in 0..20 {
        let answer = through_proxy(proxy_port, &host)?;
        assert!(
            answer.contains("shop-v1"),
            "the main host serves v1: {answer}"
        );
        let answer = through_proxy(proxy_port, &preview)?;
        assert!(
            answer.contains("shop-v2"),
            "the preview serves v2: {answer}"
        );
    }

    // promote under a steady stream: every request answered, then all v2.
    let stream = Stream::start(proxy_port, host.clone());
    std::thread::sleep(Duration::from_secs(1));
    let said = cli(&data_dir, &["promote", &format!("{shop}/web")])?;
    assert!(said.contains("promote requested"), "{said}");
    serves(proxy_port, &host, "shop-v2")?;
    std::thread::sleep(Duration::from_secs(3));
    let seen = stream.stop()?.without_drops(&log)?;
    assert!(
        seen.failures.is_empty(),
        "failed requests at promote: {seen:?}"
    );
    let first_v2 = seen
        .versions
        .iter()
        .position(|v| v == "shop-v2")
        .ok_or("the stream never saw v2")?;
    assert!(first_v2 > 0, "the stream saw v1 first: {seen:?}");
    assert!(
        seen.versions[first_v2..].iter().all(|v| v == "shop-v2"),
        "once switched, every request reaches v2: {seen:?}"
    );
    assert_eq!(containers(&shop)?.len(), 4, "the old release is kept");

    // abort within keep_old under a steady stream: back to v1, then v2's replicas go.
    let stream = Stream::start(proxy_port, host.clone());
    std::thread::sleep(Duration::from_secs(1));
    let said = cli(&data_dir, &["abort", &format!("{shop}/web")])?;
    assert!(said.contains("abort requested"), "{said}");
    serves(proxy_port, &host, "shop-v1")?;
    let left = wait_until(LIMIT, "v2's replicas removed", || {
        let ids = containers(&shop).ok()?;
        (ids.len() == 2).then_some(ids)
    })?;
    std::thread::sleep(Duration::from_secs(2));
    let seen = stream.stop()?.without_drops(&log)?;
    assert!(
        seen.failures.is_empty(),
        "failed requests at abort: {seen:?}"
    );
    let first_v1 = seen
        .versions
        .iter()
        .position(|v| v == "shop-v1")
        .ok_or("the stream never saw v1 again")?;
    assert!(
        seen.versions[first_v1..].iter().all(|v| v == "shop-v1"),
        "once switched back, every request reaches v1: {seen:?}"
    );
    assert_eq!(left, old, "the old release's replicas are the ones left");
    let shown = wait_until(LIMIT, "the rollout aborted and the release failed", || {
        let shown = status(&data_dir).ok()?;
        let rollout = shown["rollouts"].as_array()?.first()?.clone();
        (rollout["phase"] == "aborted").then_some(shown)
    })?;
    let releases = cli(&data_dir, &["releases", &format!("deployment/{shop}/web")])?;
    assert!(
        releases.contains("blue/green aborted"),
        "{releases}\n{shown}"
    );
    failed.1 = false;
    Ok(())
}
