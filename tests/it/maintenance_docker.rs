//! Issue 52, acceptance 4: maintenance mode through the real ingress. The real binary with
//! its Caddy proxy on a real engine: a deployment behind an ingress host answers 200;
//! `maintenance on` makes the proxy answer 503 with the page (the message escaped) and
//! `Retry-After`, while `docker ps` shows the same replica containers running; the agent is
//! killed with SIGKILL and its proxy removed, and the restarted agent on the same data dir
//! serves the page again (the mode is store state); `maintenance off` routes to the same
//! containers again.

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use crate::e2e_docker::AGENT;
use crate::sources_docker::{Agent, LogOnFailure, containers, status};
use crate::support::{
    DockerGuard, TempRepo, TestResult, state_with_one_deployment, test_image, unique, wait_until,
};

const LIMIT: Duration = Duration::from_secs(120);

/// A free loopback port (bound, then released for the agent's proxy to take).
pub(crate) fn free_port() -> TestResult<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port())
}

/// The whole answer (status line, headers, body) to `GET http://host/` through the proxy
/// listening on `proxy`.
pub(crate) fn through_proxy(proxy: u16, host: &str) -> TestResult<String> {
    use std::io::{Read as _, Write as _};
    let mut stream = std::net::TcpStream::connect(("127.0.0.1", proxy))?;
    stream.set_read_timeout(Some(Duration::from_secs(10)))?;
    write!(
        stream,
        "GET / HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n"
    )?;
    let mut answer = String::new();
    stream.read_to_string(&mut answer)?;
    Ok(answer)
}

/// A deployment of two httpd replicas and an ingress for its host.
fn shop_files(shop: &str) -> String {
    format!(
        r#"deployment "{shop}" "web" {{
  image    = "{image}"
  command  = ["sh", "-c", "echo shop-v1 > /www/index.html && exec httpd -f -p 8080 -h /www"]
  replicas = 2
}}

ingress "{shop}" "web" {{
  host = "{shop}.test"
  port = 8080
}}
"#,
        image = test_image()
    )
}

/// Runs `voodu-agent ARGS --data-dir DATA`; its stdout, or an error with its stderr.
pub(crate) fn cli(data_dir: &Path, args: &[&str]) -> TestResult<String> {
    let output = Command::new(AGENT)
        .args(args)
        .arg("--data-dir")
        .arg(data_dir)
        .output()?;
    if !output.status.success() {
        return Err(format!(
            "voodu-agent {args:?}: {}",
            String::from_utf8_lossy(&output.stderr)
        )
        .into());
    }
    Ok(String::from_utf8(output.stdout)?)
}

/// The ids of `scope`'s running containers, sorted.
fn running_ids(scope: &str) -> TestResult<Vec<String>> {
    Ok(containers(scope)?.into_iter().map(|(id, _)| id).collect())
}

/// Waits until the proxy answers `host` with a status line starting `line`; the answer.
fn answers(proxy: u16, host: &str, line: &str) -> TestResult<String> {
    wait_until(LIMIT, &format!("{host} answers {line}"), || {
        let answer = through_proxy(proxy, host).ok()?;
        answer.starts_with(line).then_some(answer)
    })
}

/// Removes the agent's proxy container on drop (it outlives the agent by design).
pub(crate) struct ProxyGuard(pub(crate) Option<String>);

impl Drop for ProxyGuard {
    fn drop(&mut self) {
        if let Some(name) = &self.0 {
            let _ = Command::new("docker").args(["rm", "-f", name]).output();
        }
    }
}

#[test]
#[ignore = "needs a Docker engine: scripts/test runs it (cargo test -- --include-ignored)"]
fn i52_maintenance_serves_a_503_page_while_the_replicas_run_and_survives_kill_9() -> TestResult {
    let shop = unique("maint");
    let _guard = DockerGuard::new(&shop);
    let repo = TempRepo::new()?;
    repo.write("shop.hcl", &shop_files(&shop))?;
    let sha = repo.commit("shop")?;
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
    let agent = Agent::start_with(&data_dir, &log, &args)?;
    let mut proxy_guard = ProxyGuard(None);
    let mut failed = LogOnFailure(&log, true);
    let host = format!("{shop}.test");
    wait_until(LIMIT, "the commit applied", || {
        (status(&data_dir).ok()?["last_applied"]["sha"] == sha.as_str()).then_some(())
    })?;
    let agent_id =
        voodu_agent::store::Store::open_read_only(&data_dir.join("state.db"))?.agent_id()?;
    let proxy_name = format!("voodu-caddy-{agent_id}");
    proxy_guard.0 = Some(proxy_name.clone());

    // Served by the replicas.
    let served = wait_until(LIMIT, "shop served through the ingress", || {
        let answer = through_proxy(proxy_port, &host).ok()?;
        answer.contains("shop-v1").then_some(answer)
    })?;
    assert!(served.starts_with("HTTP/1.1 200"), "{served}");
    let replicas = wait_until(LIMIT, "both replicas running", || {
        let ids = running_ids(&shop).ok()?;
        (ids.len() == 2).then_some(ids)
    })?;

    // On: the page, escaped, with Retry-After; the agent was told at once.
    let said = cli(
        &data_dir,
        &[
            "maintenance",
            "on",
            &format!("{shop}/web"),
            "--message",
            "Back <b>soon</b> & {http.request.uri}",
            "--retry-after",
            "2m",
        ],
    )?;
    assert!(
        said.contains(&format!("deployment/{shop}/web: in maintenance"))
            && said.contains("the agent is applying it now"),
        "{said}"
    );
    let page = answers(proxy_port, &host, "HTTP/1.1 503")?;
    let lower = page.to_lowercase();
    assert!(lower.contains("\r\nretry-after: 120\r\n"), "{page}");
    assert!(
        lower.contains("\r\ncontent-type: text/html; charset=utf-8\r\n"),
        "{page}"
    );
    assert!(
        page.contains("<h1>Down for maintenance</h1>")
            && page
                .contains("<p>Back &lt;b&gt;soon&lt;/b&gt; &amp; &#123;http.request.uri&#125;</p>")
            && !page.contains("shop-v1"),
        "{page}"
    );
    assert_eq!(running_ids(&shop)?, replicas, "the replicas are untouched");
    let shown = status(&data_dir)?;
    assert_eq!(shown["maintenance"][0]["name"], "web", "{shown}");
    assert_eq!(shown["maintenance"][0]["retry_after"], 120, "{shown}");
    // The ingress's own status says so.
    wait_until(LIMIT, "the ingress's status says maintenance", || {
        let shown = status(&data_dir).ok()?;
        shown["resources"].as_array()?.iter().find(|resource| {
            resource["kind"] == "ingress"
                && resource["message"]
                    .as_str()
                    .is_some_and(|message| message.starts_with("in maintenance"))
        })?;
        Some(())
    })?;
    let listed = cli(&data_dir, &["maintenance", "list"])?;
    assert!(listed.contains(&format!("{shop}/web")), "{listed}");

    // kill -9 (dropping the child is SIGKILL and a wait), and the proxy gone with its
    // config: only the store can tell the restarted agent about maintenance.
    drop(agent);
    let removed = Command::new("docker")
        .args(["rm", "-f", &proxy_name])
        .output()?;
    assert!(removed.status.success(), "{removed:?}");
    let agent = Agent::start_with(&data_dir, &log, &args)?;
    let page = answers(proxy_port, &host, "HTTP/1.1 503")?;
    assert!(
        page.contains("<p>Back &lt;b&gt;soon&lt;/b&gt; &amp; &#123;http.request.uri&#125;</p>")
            && page.to_lowercase().contains("\r\nretry-after: 120\r\n"),
        "{page}"
    );
    assert_eq!(
        running_ids(&shop)?,
        replicas,
        "the replicas survive the restart untouched"
    );

    // Off: the same containers answer again.
    let said = cli(&data_dir, &["maintenance", "off", &format!("{shop}/web")])?;
    assert!(said.contains("out of maintenance"), "{said}");
    let served = answers(proxy_port, &host, "HTTP/1.1 200")?;
    assert!(served.contains("shop-v1"), "{served}");
    assert_eq!(running_ids(&shop)?, replicas);
    let shown = status(&data_dir)?;
    assert!(shown.get("maintenance").is_none(), "{shown}");
    let activity = cli(&data_dir, &["activity", "--json"])?;
    assert!(
        activity.contains("maintenance.on") && activity.contains("maintenance.off"),
        "{activity}"
    );
    agent.stop()?;
    failed.1 = false;
    Ok(())
}

/// `voodu-agent ARGS --data-dir DATA` → exit code, stdout, stderr.
fn run_in(data_dir: &Path, args: &[&str]) -> TestResult<(Option<i32>, String, String)> {
    let output = Command::new(AGENT)
        .args(args)
        .arg("--data-dir")
        .arg(data_dir)
        .output()?;
    Ok((
        output.status.code(),
        String::from_utf8(output.stdout)?,
        String::from_utf8(output.stderr)?,
    ))
}

#[test]
fn maintenance_refuses_unknown_names_and_unbounded_input_and_prints_escaped() -> TestResult {
    let dir = tempfile::tempdir()?;
    state_with_one_deployment(dir.path(), "d")?;
    // Port 1: no agent there, so the nudge fails (a warning, not an error).
    let nowhere = ["--agent", "127.0.0.1:1"];
    let on = |args: &[&str]| {
        let mut all = vec!["maintenance", "on"];
        all.extend(args);
        all.extend(nowhere);
        run_in(dir.path(), &all)
    };
    let (code, _, stderr) = on(&["s/nope"])?;
    assert_eq!(code, Some(1));
    assert!(
        stderr.contains("s/nope: no deployment or ingress by that name is declared"),
        "{stderr}"
    );
    let long = "x".repeat(1025);
    let (code, _, stderr) = on(&["s/web", "--message", &long])?;
    assert_eq!(code, Some(1));
    assert!(stderr.contains("at most 1024"), "{stderr}");
    let (code, _, stderr) = on(&["s/web", "--retry-after", "2days"])?;
    assert_eq!(code, Some(1));
    assert!(stderr.contains("give from 1s to 24h"), "{stderr}");
    let (_, listed, _) = run_in(dir.path(), &["maintenance"])?;
    assert_eq!(
        listed, "nothing is in maintenance\n",
        "refusals change nothing"
    );

    let (code, stdout, stderr) = on(&["s/web", "--message", "\u{1b}[2Jgone"])?;
    assert_eq!(code, Some(0), "{stderr}");
    assert!(
        stdout.contains("deployment/s/web: in maintenance") && stdout.contains("\\x1b[2Jgone"),
        "{stdout}"
    );
    assert!(
        stderr.contains("no ingress routes to deployment/s/web")
            && stderr.contains("cannot reach the agent"),
        "{stderr}"
    );
    let (_, status, _) = run_in(dir.path(), &["status"])?;
    assert!(
        status.contains("deployment/s/web since") && !status.contains('\u{1b}'),
        "{status}"
    );
    let (_, json, _) = run_in(dir.path(), &["status", "--json"])?;
    let json: serde_json::Value = serde_json::from_str(&json)?;
    assert_eq!(json["maintenance"][0]["message"], "\u{1b}[2Jgone");
    assert_eq!(json["maintenance"][0]["retry_after"], 300);

    let off = ["maintenance", "off", "s/web", "--agent", "127.0.0.1:1"];
    let (code, stdout, _) = run_in(dir.path(), &off)?;
    assert_eq!(code, Some(0));
    assert!(stdout.contains("out of maintenance"), "{stdout}");
    let (code, stdout, _) = run_in(dir.path(), &off)?;
    assert_eq!(code, Some(0));
    assert!(
        stdout.contains("not in maintenance; nothing changed"),
        "{stdout}"
    );
    Ok(())
}
