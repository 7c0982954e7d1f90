//! Upgrades on a real engine: a data dir made by the previous release's agent (built by
//! `scripts/previous-release`, its path in `VOODU_PREVIOUS_AGENT`), then this checkout's agent
//! on it.
//!
//! Issue 47, acceptance 5: two sources made by the previous release keep their containers,
//! their route and their volumes; a named volume the engine made without labels (the previous
//! release never labelled one) is adopted by the scope that declared it, so that scope keeps
//! mounting it on its next rollout while the other source is refused it.
//!
//! Issue 48, acceptance 4: the releases the previous release recorded show "digest unknown",
//! their containers are kept, and the next rollout resolves its image.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use crate::sources_docker::{Agent, LogOnFailure, containers, http_address, post_hook};
use crate::support::{DockerGuard, TempRepo, TestResult, test_image, unique, wait_until};

const LIMIT: Duration = Duration::from_secs(120);

/// The previous release's binary; an error (never a pass) when it is not there.
pub(crate) fn previous_agent() -> TestResult<PathBuf> {
    let path = std::env::var_os("VOODU_PREVIOUS_AGENT").map(PathBuf::from).ok_or(
        "VOODU_PREVIOUS_AGENT is not set: run scripts/previous-release (scripts/test does) and set it to the path it prints",
    )?;
    if !path.is_file() {
        return Err(format!("VOODU_PREVIOUS_AGENT {} is not a file", path.display()).into());
    }
    Ok(path)
}

/// An agent process of `binary`, on an address of its own choosing.
fn start_agent(binary: &Path, data_dir: &Path, log: &Path, args: &[&str]) -> TestResult<Agent> {
    let mut args = args.to_vec();
    args.extend(["--listen", "127.0.0.1:0"]);
    Agent::spawn(binary, data_dir, log, &args)
}

fn docker(args: &[&str]) -> TestResult<String> {
    let output = Command::new("docker").args(args).output()?;
    if !output.status.success() {
        return Err(format!(
            "docker {args:?}: {}",
            String::from_utf8_lossy(&output.stderr)
        )
        .into());
    }
    Ok(String::from_utf8(output.stdout)?)
}

fn free_port() -> TestResult<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port())
}

fn through_proxy(proxy: u16, host: &str) -> TestResult<String> {
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

fn shop_files(shop: &str, volume: &str, v: &str) -> String {
    format!(
        r#"deployment "{shop}" "web" {{
  image    = "{image}"
  command  = ["sh", "-c", "echo shop-{v} > /www/index.html && exec httpd -f -p 8080 -h /www"]
  replicas = 1
  volumes  = ["{volume}:/data"]
}}

statefulset "{shop}" "db" {{
  image    = "{image}"
  command  = ["sleep", "3600"]
  replicas = 1
  volume_claim "data" {{
    mount_path = "/data"
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

fn blog_files(blog: &str, extra: &str) -> String {
    format!(
        "deployment \"{blog}\" \"web\" {{\n  image    = \"{}\"\n  command  = [\"sleep\", \"3600\"]\n  replicas = 1\n{extra}}}\n",
        test_image()
    )
}

/// The running containers of `scope`, sorted ids.
fn ids(scope: &str) -> TestResult<Vec<String>> {
    Ok(containers(scope)?.into_iter().map(|(id, _)| id).collect())
}

#[test]
#[ignore = "needs a Docker engine and the previous release's agent (scripts/previous-release): scripts/test runs it"]
fn i47_two_sources_made_by_the_previous_release_keep_their_containers_routes_and_volumes()
-> TestResult {
    let previous = previous_agent()?;
    let (shop, blog) = (unique("shop"), unique("blog"));
    let _guards = [DockerGuard::new(&shop), DockerGuard::new(&blog)];
    let volume = format!("{shop}-vol");
    let claim = format!("voodu-{shop}-db-data-0");
    let _volumes = VolumeGuard(vec![volume.clone(), claim.clone()]);
    let (shop_repo, blog_repo) = (TempRepo::new()?, TempRepo::new()?);
    shop_repo.write("shop.hcl", &shop_files(&shop, &volume, "v1"))?;
    let shop_1 = shop_repo.commit("shop")?;
    blog_repo.write("blog.hcl", &blog_files(&blog, ""))?;
    let blog_1 = blog_repo.commit("blog")?;
    let dir = tempfile::tempdir()?;
    let (data_dir, log) = (dir.path().join("data"), dir.path().join("agent.log"));
    let sources_file = dir.path().join("sources.hcl");
    std::fs::write(
        &sources_file,
        format!(
            "source \"shop\" {{\n  url = \"{}\"\n  scopes = [\"{shop}\"]\n}}\n\
             source \"blog\" {{\n  url = \"{}\"\n  scopes = [\"{blog}\"]\n}}\n",
            shop_repo.url(),
            blog_repo.url(),
        ),
    )?;
    let proxy_port = free_port()?;
    let caddy =
        std::env::var("VOODU_CADDY_IMAGE").unwrap_or_else(|_| "voodu-caddy:latest".to_owned());
    let (sources_arg, proxy_arg) = (
        sources_file.display().to_string(),
        format!("127.0.0.1:{proxy_port}"),
    );
    let args = [
        "--sources",
        &sources_arg,
        "--ingress-image",
        &caddy,
        "--ingress-http",
        &proxy_arg,
        "--ingress-https",
        "127.0.0.1:0",
    ];
    let mut proxy_guard = ProxyGuard(None);
    let host = format!("{shop}.test");
    let mut scenario = || -> TestResult {
        // 1. The previous release deploys both sources.
        let old = start_agent(&previous, &data_dir, &log, &args)?;
        // Read as the previous release reads its own data dir (this one would migrate it).
        for (name, sha) in [("shop", &shop_1), ("blog", &blog_1)] {
            wait_until(
                LIMIT,
                &format!("{name} applied by the previous release"),
                || {
                    let output = Command::new(&previous)
                        .args(["status", "--json", "--data-dir"])
                        .arg(&data_dir)
                        .output()
                        .ok()?;
                    let status: serde_json::Value = serde_json::from_slice(&output.stdout).ok()?;
                    status["sources"]
                        .as_array()?
                        .iter()
                        .any(|source| {
                            source["name"] == name && source["last_applied"]["sha"] == sha.as_str()
                        })
                        .then_some(())
                },
            )?;
        }
        wait_until(LIMIT, "shop served by the previous release", || {
            through_proxy(proxy_port, &host)
                .ok()
                .filter(|answer| answer.contains("shop-v1"))
        })?;
        wait_until(LIMIT, "both sources' containers", || {
            (ids(&shop).ok()?.len() == 2 && ids(&blog).ok()?.len() == 1).then_some(())
        })?;
        old.stop()?;
        let agent_id =
            voodu_agent::store::Store::open_read_only(&data_dir.join("state.db"))?.agent_id()?;
        proxy_guard.0 = Some(format!("voodu-caddy-{agent_id}"));
        let (shop_before, blog_before) = (ids(&shop)?, ids(&blog)?);
        // The previous release let the engine make the named volume: no labels.
        let labels = docker(&["volume", "inspect", "--format", "{{json .Labels}}", &volume])?;
        assert!(!labels.contains("voodu.scope"), "{labels}");

        // 2. This checkout's agent on the same data dir: nothing replaced, the route serves.
        let new = start_agent(
            Path::new(env!("CARGO_BIN_EXE_voodu-agent")),
            &data_dir,
            &log,
            &args,
        )?;
        let address = http_address(&data_dir)?;
        wait_until(LIMIT, "shop served after the upgrade", || {
            through_proxy(proxy_port, &host)
                .ok()
                .filter(|answer| answer.contains("shop-v1"))
        })?;
        // Resyncs and the first passes are done once both sources answered a sync.
        for (repo, sha, name) in [(&shop_repo, &shop_1, "shop"), (&blog_repo, &blog_1, "blog")] {
            let body =
                serde_json::json!({ "ref": "refs/heads/main", "after": sha, "repository": repo.url() })
                    .to_string();
            let (code, answer) = post_hook(&address, "/hooks/git?wait=true", &[], body.as_bytes())?;
            assert_eq!(code, 200, "{name}: {answer:#}");
        }
        assert_eq!(ids(&shop)?, shop_before, "shop's containers are kept");
        assert_eq!(ids(&blog)?, blog_before, "blog's containers are kept");
        // Issue 48: the previous release recorded no digests: "digest unknown" until the
        // resource's next rollout, its containers left as they are.
        let releases = Command::new(env!("CARGO_BIN_EXE_voodu-agent"))
            .args(["releases", &format!("deployment/{shop}/web"), "--data-dir"])
            .arg(&data_dir)
            .output()?;
        let text = String::from_utf8(releases.stdout)?;
        assert!(
            text.contains("digest unknown"),
            "{text}{}",
            String::from_utf8_lossy(&releases.stderr)
        );
        let volumes = docker(&["volume", "ls", "-q", "--filter", &format!("name={shop}")])?;
        assert!(
            volumes.contains(&volume) && volumes.contains(&claim),
            "{volumes}"
        );

        // 3. The unlabelled volume is shop's: blog is refused it, naming shop...
        blog_repo.write(
            "blog.hcl",
            &blog_files(&blog, &format!("  volumes = [\"{volume}:/x\"]\n")),
        )?;
        let blog_2 = blog_repo.commit("blog takes shop's volume")?;
        let body = serde_json::json!({ "ref": "refs/heads/main", "after": blog_2, "repository": blog_repo.url() }).to_string();
        let (code, answer) = post_hook(&address, "/hooks/git?wait=true", &[], body.as_bytes())?;
        assert_eq!(
            (code, answer["result"].as_str()),
            (422, Some("rejected")),
            "{answer:#}"
        );
        assert!(
            answer["errors"]
                .to_string()
                .contains("is held by source `shop`"),
            "{answer:#}"
        );
        // ...and shop's next rollout mounts it, adopted, with its data.
        let web = |label: &str| -> TestResult<String> {
            Ok(docker(&[
                "ps",
                "-q",
                "--filter",
                &format!("label=voodu.scope={shop}"),
                "--filter",
                &format!("label=voodu.name={label}"),
            ])?
            .trim()
            .to_owned())
        };
        docker(&["exec", &web("web")?, "sh", "-c", "echo kept > /data/mark"])?;
        shop_repo.write("shop.hcl", &shop_files(&shop, &volume, "v2"))?;
        let shop_2 = shop_repo.commit("shop v2")?;
        let body = serde_json::json!({ "ref": "refs/heads/main", "after": shop_2, "repository": shop_repo.url() }).to_string();
        let (code, answer) = post_hook(&address, "/hooks/git?wait=true", &[], body.as_bytes())?;
        assert_eq!(code, 200, "{answer:#}");
        wait_until(LIMIT, "shop v2 served", || {
            through_proxy(proxy_port, &host)
                .ok()
                .filter(|answer| answer.contains("shop-v2"))
        })?;
        // The surge's old replica retires once the new one is ready.
        let replaced = wait_until(LIMIT, "one web replica, the new one", || {
            let id = web("web").ok()?;
            (!id.contains('\n') && !id.is_empty()).then_some(id)
        })?;
        let mark = docker(&["exec", &replaced, "cat", "/data/mark"])?;
        assert_eq!(mark.trim(), "kept");
        // The rollout resolved its image: the replica runs the image's id (local-only).
        let runs = docker(&["inspect", "--format", "{{.Config.Image}}", &replaced])?;
        assert!(runs.trim().starts_with("sha256:"), "{runs}");
        let releases = Command::new(env!("CARGO_BIN_EXE_voodu-agent"))
            .args([
                "releases",
                &format!("deployment/{shop}/web"),
                "--json",
                "--data-dir",
            ])
            .arg(&data_dir)
            .output()?;
        let releases: serde_json::Value = serde_json::from_slice(&releases.stdout)?;
        assert_eq!(
            releases["releases"][0]["images"]["resolved"], true,
            "{releases:#}"
        );
        assert_eq!(
            releases["releases"]
                .as_array()
                .and_then(|all| all.last())
                .map(|oldest| oldest["images"]["resolved"].clone()),
            Some(serde_json::Value::Bool(false)),
            "{releases:#}"
        );
        new.stop()?;
        Ok(())
    };
    let mut log_on_failure = LogOnFailure(&log, false);
    let result = scenario();
    log_on_failure.1 = result.is_err();
    result
}

/// Removes the agent's proxy container on drop (it outlives the agent by design).
struct ProxyGuard(Option<String>);

impl Drop for ProxyGuard {
    fn drop(&mut self) {
        if let Some(name) = &self.0 {
            let _ = Command::new("docker").args(["rm", "-f", name]).output();
        }
    }
}

/// Removes the named volumes on drop.
struct VolumeGuard(Vec<String>);

impl Drop for VolumeGuard {
    fn drop(&mut self) {
        for name in &self.0 {
            let _ = Command::new("docker")
                .args(["volume", "rm", "-f", name])
                .output();
        }
    }
}
