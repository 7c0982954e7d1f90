//! Several repositories on one host, end to end (issue 26, acceptance 1 and 2): the real
//! `voodu-agent` binary with `--sources`, three real repositories (a platform one and two
//! applications) and a real Docker engine. Each deploys its own scopes; a commit of one
//! application declaring the other's scope is rejected with the location and the owner and
//! nothing changes; a revert rolls back only its source; a webhook for one syncs only it; a
//! source whose remote is unreachable shows its fetch error while the others deploy; and a
//! data dir made with `--repo` is adopted by the source of that repository with the same
//! containers. State is read as an operator would: `status --json` and `docker ps`.

use std::fs::File;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use serde_json::Value;
use voodu_agent::http::WebhookSecret;

use crate::e2e_docker::AGENT;
use crate::support::http::get_blocking;
use crate::support::{DockerGuard, TempRepo, TestResult, test_image, unique, wait_until};

const LIMIT: Duration = Duration::from_secs(90);

/// The agent child process; killed and reaped on drop.
pub(crate) struct Agent(Child);

impl Agent {
    pub(crate) fn start(data_dir: &Path, log: &Path, source_args: &[&str]) -> TestResult<Agent> {
        let mut args = source_args.to_vec();
        args.push("--no-ingress");
        Agent::start_with(data_dir, log, &args)
    }

    /// The agent with `args` (its sources, and anything else) beside the scenario's own.
    pub(crate) fn start_with(data_dir: &Path, log: &Path, args: &[&str]) -> TestResult<Agent> {
        let mut args = args.to_vec();
        args.extend(["--listen", "127.0.0.1:0"]);
        Agent::spawn(Path::new(AGENT), data_dir, log, &args)
    }

    /// `binary` (this build, or an earlier release's) with `args`, logging to `log`. No
    /// polling and no local ref watch: each sync of a scenario is one the test asks for.
    pub(crate) fn spawn(
        binary: &Path,
        data_dir: &Path,
        log: &Path,
        args: &[&str],
    ) -> TestResult<Agent> {
        let stderr = File::options().create(true).append(true).open(log)?;
        let child = Command::new(binary)
            .args(args)
            .args(["--interval", "1h", "--no-watch"])
            .arg("--data-dir")
            .arg(data_dir)
            .env("RUST_LOG", "info")
            .env("NO_COLOR", "1")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(stderr)
            .spawn()?;
        Ok(Agent(child))
    }

    /// The agent's process id.
    pub(crate) fn pid(&self) -> u32 {
        self.0.id()
    }

    /// SIGTERM, then waits for it to exit.
    pub(crate) fn stop(mut self) -> TestResult {
        Command::new("kill")
            .args(["-TERM", &self.0.id().to_string()])
            .status()?;
        self.0.wait()?;
        Ok(())
    }
}

impl Drop for Agent {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Prints the agent log when the test fails (an error or a failed assertion).
pub(crate) struct LogOnFailure<'a>(pub(crate) &'a Path, pub(crate) bool);

impl Drop for LogOnFailure<'_> {
    fn drop(&mut self) {
        if self.1 || std::thread::panicking() {
            eprintln!(
                "---- agent log ----\n{}",
                std::fs::read_to_string(self.0).unwrap_or_default()
            );
        }
    }
}

fn web(scope: &str, v: &str) -> String {
    format!(
        "deployment \"{scope}\" \"web\" {{\n  image    = \"{}\"\n  command  = [\"sleep\", \"3600\"]\n  replicas = 1\n  env      = {{ V = \"{v}\" }}\n}}\n",
        test_image()
    )
}

pub(crate) fn status(data_dir: &Path) -> TestResult<Value> {
    let output = Command::new(AGENT)
        .args(["status", "--json", "--data-dir"])
        .arg(data_dir)
        .output()?;
    if !output.status.success() {
        return Err(format!("status: {}", String::from_utf8_lossy(&output.stderr)).into());
    }
    Ok(serde_json::from_slice(&output.stdout)?)
}

pub(crate) fn source<'a>(status: &'a Value, name: &str) -> &'a Value {
    status["sources"]
        .as_array()
        .and_then(|sources| sources.iter().find(|source| source["name"] == name))
        .unwrap_or(&Value::Null)
}

/// The running containers of `scope` as (id, env V), sorted.
pub(crate) fn containers(scope: &str) -> TestResult<Vec<(String, String)>> {
    let output = Command::new("docker")
        .args(["ps", "-q", "--no-trunc", "--filter"])
        .arg(format!("label=voodu.scope={scope}"))
        .output()?;
    let mut rows = Vec::new();
    for id in String::from_utf8(output.stdout)?.split_whitespace() {
        let env = Command::new("docker")
            .args([
                "inspect",
                "--format",
                "{{range .Config.Env}}{{println .}}{{end}}",
                id,
            ])
            .output()?;
        let v = String::from_utf8(env.stdout)?
            .lines()
            .find_map(|line| line.strip_prefix("V=").map(ToOwned::to_owned))
            .unwrap_or_default();
        rows.push((id.to_owned(), v));
    }
    rows.sort();
    Ok(rows)
}

/// Waits until `scope` runs exactly one container with `V=v`; returns its id.
fn runs(scope: &str, v: &str) -> TestResult<String> {
    wait_until(LIMIT, &format!("{scope} runs V={v}"), || {
        let rows = containers(scope).ok()?;
        match rows.as_slice() {
            [(id, found)] if found == v => Some(id.clone()),
            _ => None,
        }
    })
}

/// Waits until source `name` recorded `sha` as its last applied (or, `rejected`, its last
/// rejected) commit.
pub(crate) fn recorded(data_dir: &Path, name: &str, field: &str, sha: &str) -> TestResult<Value> {
    wait_until(LIMIT, &format!("{name} {field} {sha}"), || {
        let status = status(data_dir).ok()?;
        (source(&status, name)[field]["sha"] == sha).then_some(status)
    })
}

pub(crate) fn post_hook(
    address: &str,
    path: &str,
    headers: &[(&str, String)],
    body: &[u8],
) -> TestResult<(u16, Value)> {
    use std::io::{Read as _, Write as _};
    let mut stream = std::net::TcpStream::connect(address)?;
    stream.set_read_timeout(Some(LIMIT))?;
    let mut head = format!(
        "POST {path} HTTP/1.1\r\nHost: {address}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n",
        body.len()
    );
    for (name, value) in headers {
        head.push_str(&format!("{name}: {value}\r\n"));
    }
    head.push_str("\r\n");
    stream.write_all(head.as_bytes())?;
    stream.write_all(body)?;
    let mut answer = String::new();
    stream.read_to_string(&mut answer)?;
    let code = answer
        .split_whitespace()
        .nth(1)
        .and_then(|code| code.parse().ok())
        .ok_or("no status line")?;
    let body = answer
        .split_once("\r\n\r\n")
        .map(|(_, body)| body)
        .unwrap_or_default();
    // A chunked body: the JSON object is between the first `{` and the last `}`.
    let json = body
        .find('{')
        .zip(body.rfind('}'))
        .map(|(start, end)| &body[start..=end])
        .unwrap_or("null");
    Ok((code, serde_json::from_str(json)?))
}

pub(crate) fn http_address(data_dir: &Path) -> TestResult<String> {
    wait_until(LIMIT, "the agent's HTTP address", || {
        let store = voodu_agent::store::Store::open_read_only(&data_dir.join("state.db")).ok()?;
        store.meta(voodu_agent::agent::META_HTTP_ADDR).ok()?
    })
}

#[test]
#[ignore = "needs a Docker engine: scripts/test runs it (cargo test -- --include-ignored)"]
fn three_repositories_each_deploy_their_own_scopes_on_one_engine() -> TestResult {
    let (plat, shop, blog) = (unique("plat"), unique("shop"), unique("blog"));
    let _guards = [
        DockerGuard::new(&plat),
        DockerGuard::new(&shop),
        DockerGuard::new(&blog),
    ];
    let (platform_repo, shop_repo, blog_repo) =
        (TempRepo::new()?, TempRepo::new()?, TempRepo::new()?);
    platform_repo.write("edge.hcl", &web(&plat, "p1"))?;
    let platform_1 = platform_repo.commit("platform")?;
    shop_repo.write("shop.hcl", &web(&shop, "s1"))?;
    let shop_1 = shop_repo.commit("shop")?;
    blog_repo.write("blog.hcl", &web(&blog, "b1"))?;
    let blog_1 = blog_repo.commit("blog")?;
    let dir = tempfile::tempdir()?;
    let (data_dir, log) = (dir.path().join("data"), dir.path().join("agent.log"));
    let secret_file = dir.path().join("shop-hook");
    std::fs::write(&secret_file, "shop-secret\n")?;
    let sources_file = dir.path().join("sources.hcl");
    std::fs::write(
        &sources_file,
        format!(
            "source \"platform\" {{\n  url = \"{}\"\n  scopes = [\"{plat}\", \"\"]\n}}\n\
             source \"shop\" {{\n  url = \"{}\"\n  scopes = [\"{shop}\"]\n  webhook_secret_file = \"{}\"\n}}\n\
             source \"blog\" {{\n  url = \"{}\"\n  scopes = [\"{blog}\"]\n}}\n\
             source \"gone\" {{\n  url = \"file:///nonexistent/voodu/gone.git\"\n  scopes = [\"{}\"]\n}}\n",
            platform_repo.url(),
            shop_repo.url(),
            secret_file.display(),
            blog_repo.url(),
            unique("gone"),
        ),
    )?;
    let sources_arg = sources_file.display().to_string();
    let agent = Agent::start(&data_dir, &log, &["--sources", &sources_arg])?;
    let scenario = || -> TestResult {
        recorded(&data_dir, "platform", "last_applied", &platform_1)?;
        recorded(&data_dir, "shop", "last_applied", &shop_1)?;
        let first = recorded(&data_dir, "blog", "last_applied", &blog_1)?;
        let plat_id = runs(&plat, "p1")?;
        let shop_id = runs(&shop, "s1")?;
        let blog_id = runs(&blog, "b1")?;
        // The unreachable source: its fetch error, while the others deployed.
        let gone = source(&first, "gone");
        assert_eq!(gone["fetch"]["state"], "failing", "{first:#}");
        assert!(
            gone["fetch"]["error"]
                .as_str()
                .is_some_and(|error| error.contains("nonexistent")),
            "{first:#}"
        );
        let address = http_address(&data_dir)?;
        let (_, text) = get_blocking(&address, "/metrics")?;
        assert!(
            text.contains("voodu_source_fetch_failing{source=\"gone\"} 1"),
            "{text}"
        );
        assert!(
            text.contains("voodu_source_fetch_failing{source=\"shop\"} 0"),
            "{text}"
        );

        // Blog declares a resource in shop's scope: rejected at the block, naming the
        // owner; nothing of the commit reaches the engine.
        blog_repo.write(
            "blog.hcl",
            &format!(
                "{}{}",
                web(&blog, "b2"),
                web(&shop, "evil").replace("\"web\"", "\"evil\"")
            ),
        )?;
        let blog_bad = blog_repo.commit("blog reaches into shop")?;
        let body = serde_json::json!({ "ref": "refs/heads/main", "after": blog_bad, "repository": blog_repo.url() }).to_string();
        let (code, answer) = post_hook(&address, "/hooks/git?wait=true", &[], body.as_bytes())?;
        assert_eq!(
            (code, answer["result"].as_str()),
            (422, Some("rejected")),
            "{answer:#}"
        );
        let errors = answer["errors"].to_string();
        assert!(
            errors.contains("blog.hcl:7:1:")
                && errors.contains(&format!("deployment/{shop}/evil"))
                && errors.contains("belongs to source `shop`"),
            "{errors}"
        );
        let cli = Command::new(AGENT)
            .args(["status", "--data-dir"])
            .arg(&data_dir)
            .output()?;
        let text = String::from_utf8(cli.stdout)?;
        assert!(
            text.contains("source blog: the latest commit was rejected"),
            "{text}"
        );
        assert_eq!(
            runs(&blog, "b1")?,
            blog_id,
            "blog keeps its last good commit"
        );
        assert_eq!(
            containers(&shop)?.len(),
            1,
            "no `evil` container in shop's scope"
        );

        // A push to shop, signed with shop's secret and naming shop's repository, syncs shop
        // only: blog's new good commit waits for its own trigger.
        blog_repo.write("blog.hcl", &web(&blog, "b3"))?;
        let blog_3 = blog_repo.commit("blog 3")?;
        shop_repo.write("shop.hcl", &web(&shop, "s2"))?;
        let shop_2 = shop_repo.commit("shop 2")?;
        let body = serde_json::json!({ "ref": "refs/heads/main", "after": shop_2, "repository": { "clone_url": shop_repo.url() } }).to_string();
        let unsigned = post_hook(
            &address,
            "/hooks/git?wait=true",
            &[("X-GitHub-Event", "push".to_owned())],
            body.as_bytes(),
        )?;
        assert_eq!(unsigned.0, 401, "{:#}", unsigned.1);
        let signature = WebhookSecret::new("shop-secret").sign(body.as_bytes());
        let (code, answer) = post_hook(
            &address,
            "/hooks/git?wait=true",
            &[
                ("X-GitHub-Event", "push".to_owned()),
                ("X-Hub-Signature-256", signature),
            ],
            body.as_bytes(),
        )?;
        assert_eq!(
            (code, answer["result"].as_str(), answer["source"].as_str()),
            (200, Some("applied"), Some("shop")),
            "{answer:#}"
        );
        let shop_2_id = runs(&shop, "s2")?;
        assert_ne!(shop_2_id, shop_id);
        let status = status(&data_dir)?;
        assert_eq!(
            source(&status, "blog")["last_seen"]["sha"],
            blog_bad.as_str(),
            "blog not synced by shop's push"
        );

        // `git revert` in shop: shop rolls back; the platform and blog keep their containers.
        let shop_3 = shop_repo.revert(&shop_2)?;
        let body = serde_json::json!({ "ref": "refs/heads/main", "after": shop_3 }).to_string();
        let signature = WebhookSecret::new("shop-secret").sign(body.as_bytes());
        let (code, answer) = post_hook(
            &address,
            "/hooks/git?wait=true&source=shop",
            &[("X-Voodu-Signature", signature)],
            body.as_bytes(),
        )?;
        assert_eq!(
            (code, answer["result"].as_str()),
            (200, Some("applied")),
            "{answer:#}"
        );
        runs(&shop, "s1")?;
        assert_eq!(runs(&plat, "p1")?, plat_id);
        assert_eq!(runs(&blog, "b1")?, blog_id);
        let releases = Command::new(AGENT)
            .args([
                "releases",
                &format!("deployment/{shop}/web"),
                "--json",
                "--data-dir",
            ])
            .arg(&data_dir)
            .output()?;
        let releases: Value = serde_json::from_slice(&releases.stdout)?;
        let commits: Vec<&str> = releases["releases"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|release| release["commit"].as_str())
            .collect();
        assert!(
            commits.contains(&shop_3.as_str()) && commits.contains(&shop_2.as_str()),
            "{releases:#}"
        );
        assert_ne!(blog_3, blog_1);
        Ok(())
    };
    let mut log_on_failure = LogOnFailure(&log, false);
    let result = scenario();
    log_on_failure.1 = result.is_err();
    agent.stop()?;
    result
}

/// Acceptance 2 on the engine: a data dir made with `--repo`, started with `--sources`,
/// keeps the same container.
#[test]
#[ignore = "needs a Docker engine: scripts/test runs it (cargo test -- --include-ignored)"]
fn a_repo_data_dir_switched_to_sources_keeps_its_containers() -> TestResult {
    let (shop, blog) = (unique("shop"), unique("blog"));
    let _guards = [DockerGuard::new(&shop), DockerGuard::new(&blog)];
    let (shop_repo, blog_repo) = (TempRepo::new()?, TempRepo::new()?);
    shop_repo.write("shop.hcl", &web(&shop, "s1"))?;
    let shop_1 = shop_repo.commit("shop")?;
    blog_repo.write("blog.hcl", &web(&blog, "b1"))?;
    let blog_1 = blog_repo.commit("blog")?;
    let dir = tempfile::tempdir()?;
    let (data_dir, log) = (dir.path().join("data"), dir.path().join("agent.log"));
    let single = Agent::start(&data_dir, &log, &["--repo", &shop_repo.url()])?;
    let before = runs(&shop, "s1")?;
    single.stop()?;
    let sources_file = dir.path().join("sources.hcl");
    std::fs::write(
        &sources_file,
        format!(
            "source \"blog\" {{\n  url = \"{}\"\n  scopes = [\"{blog}\"]\n}}\nsource \"shop\" {{\n  url = \"{}\"\n  scopes = [\"{shop}\"]\n}}\n",
            blog_repo.url(),
            shop_repo.url()
        ),
    )?;
    let sources_arg = sources_file.display().to_string();
    let agent = Agent::start(&data_dir, &log, &["--sources", &sources_arg])?;
    let mut log_on_failure = LogOnFailure(&log, false);
    let result = (|| -> TestResult {
        recorded(&data_dir, "blog", "last_applied", &blog_1)?;
        let status = recorded(&data_dir, "shop", "last_applied", &shop_1)?;
        runs(&blog, "b1")?;
        assert_eq!(
            runs(&shop, "s1")?,
            before,
            "the same container after the switch"
        );
        let resource = status["resources"]
            .as_array()
            .and_then(|resources| {
                resources
                    .iter()
                    .find(|resource| resource["scope"] == shop.as_str())
            })
            .cloned()
            .unwrap_or_default();
        assert_eq!(resource["source"], "shop", "{status:#}");
        Ok(())
    })();
    log_on_failure.1 = result.is_err();
    agent.stop()?;
    result
}
