//! Issue 47, acceptance 1: two sources on one agent, the real binary with its ingress proxy on
//! a real engine, and a hostile pusher to source `blog` trying every way the read-through of
//! the issue found to reach source `shop` through what a resource points at: asset files,
//! `on_deploy` templates and addresses, config buckets, claim and named volumes, ingress hosts
//! (as written, in upper case, a longer path under it), the proxy-wide TLS `ask`, published
//! ports, and shop's unexposed service over the network. Each commit is rejected at its
//! `path:line:col` naming the owner (the network case is isolated instead), and shop's
//! containers, volumes, asset bytes and traffic through the ingress stay as they were.

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use serde_json::Value;

use crate::sources_docker::{Agent, LogOnFailure, containers, http_address, post_hook, recorded};
use crate::support::{DockerGuard, TempRepo, TestResult, test_image, unique, wait_until};

const LIMIT: Duration = Duration::from_secs(120);

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

/// A free loopback port (bound, then released for the agent's proxy to take).
fn free_port() -> TestResult<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port())
}

/// The body of `GET http://host/` through the proxy listening on `proxy`.
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

/// Shop: an asset, a web deployment publishing a host port and mounting the asset and a
/// named volume, a statefulset with a claim, and an ingress for its host.
fn shop_files(shop: &str, port: u16, volume: &str) -> String {
    format!(
        r#"asset "{shop}" "cfg" {{
  secret = "shop-secret-bytes"
  json   = "{{\"token\": \"shop\"}}"
}}

deployment "{shop}" "web" {{
  image    = "{image}"
  command  = ["sh", "-c", "echo shop-v1 > /www/index.html && exec httpd -f -p 8080 -h /www"]
  replicas = 1
  ports    = ["127.0.0.1:{port}:8080"]
  volumes  = ["${{asset.{shop}.cfg.secret}}:/etc/secret:ro", "{volume}:/data"]
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

/// Blog's own resources: an asset and a web deployment (httpd, and `wget` to try the network).
fn blog_base(blog: &str) -> String {
    format!(
        r#"asset "{blog}" "a" {{
  k = "blog"
}}

deployment "{blog}" "web" {{
  image    = "{image}"
  command  = ["sh", "-c", "echo blog > /www/index.html && exec httpd -f -p 8080 -h /www"]
  replicas = 1
}}
"#,
        image = test_image()
    )
}

/// A blog deployment `name` with `body` added to its block.
fn blog_extra(blog: &str, name: &str, body: &str) -> String {
    format!(
        "\ndeployment \"{blog}\" \"{name}\" {{\n  image   = \"{}\"\n  command = [\"sleep\", \"3600\"]\n{body}}}\n",
        test_image()
    )
}

/// Pushes `text` as blog's `blog.hcl` and asks the agent to sync blog; the answer.
fn push_blog(repo: &TempRepo, address: &str, text: &str, what: &str) -> TestResult<(u16, Value)> {
    repo.write("blog.hcl", text)?;
    let sha = repo.commit(what)?;
    let body =
        serde_json::json!({ "ref": "refs/heads/main", "after": sha, "repository": repo.url() })
            .to_string();
    post_hook(address, "/hooks/git?wait=true", &[], body.as_bytes())
}

/// Shop's running containers (id, `V`), its volumes with their labels, its asset file's bytes.
type ShopState = (Vec<(String, String)>, String, String);

/// The engine-side facts of shop that no blog commit may change: container ids, volumes
/// (names and labels), and the bytes of its asset file.
fn shop_state(shop: &str, data_dir: &Path) -> TestResult<ShopState> {
    let volumes = docker(&[
        "volume",
        "ls",
        "--filter",
        &format!("label=voodu.scope={shop}"),
        "--format",
        "{{.Name}} {{.Labels}}",
    ])?;
    // The engine prints labels in no fixed order.
    let mut volumes: Vec<String> = volumes
        .lines()
        .map(|line| {
            let (name, labels) = line.split_once(' ').unwrap_or((line, ""));
            let mut labels: Vec<&str> = labels.split(',').collect();
            labels.sort_unstable();
            format!("{name} {}", labels.join(","))
        })
        .collect();
    volumes.sort();
    let secret = std::fs::read_to_string(data_dir.join(format!("assets/{shop}/cfg/secret")))?;
    Ok((containers(shop)?, volumes.join("\n"), secret))
}

#[test]
#[ignore = "needs a Docker engine: scripts/test runs it (cargo test -- --include-ignored)"]
fn i47_a_hostile_source_reaches_nothing_of_another() -> TestResult {
    let (shop, blog) = (unique("shop"), unique("blog"));
    let _guards = [DockerGuard::new(&shop), DockerGuard::new(&blog)];
    let volume = format!("{shop}-vol");
    let (shop_repo, blog_repo) = (TempRepo::new()?, TempRepo::new()?);
    let (shop_port, proxy_port) = (free_port()?, free_port()?);
    shop_repo.write("shop.hcl", &shop_files(&shop, shop_port, &volume))?;
    let shop_1 = shop_repo.commit("shop")?;
    blog_repo.write("blog.hcl", &blog_base(&blog))?;
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
    let caddy =
        std::env::var("VOODU_CADDY_IMAGE").unwrap_or_else(|_| "voodu-caddy:latest".to_owned());
    let (sources_arg, proxy_arg) = (
        sources_file.display().to_string(),
        format!("127.0.0.1:{proxy_port}"),
    );
    let agent = Agent::start_with(
        &data_dir,
        &log,
        &[
            "--sources",
            &sources_arg,
            "--ingress-image",
            &caddy,
            "--ingress-http",
            &proxy_arg,
            "--ingress-https",
            "127.0.0.1:0",
        ],
    )?;
    let _volume_guard = VolumeGuard(vec![volume.clone(), format!("voodu-{shop}-db-data-0")]);
    let mut proxy_guard = ProxyGuard(None);
    let mut scenario = || -> TestResult {
        recorded(&data_dir, "shop", "last_applied", &shop_1)?;
        let agent_id =
            voodu_agent::store::Store::open_read_only(&data_dir.join("state.db"))?.agent_id()?;
        proxy_guard.0 = Some(format!("voodu-caddy-{agent_id}"));
        recorded(&data_dir, "blog", "last_applied", &blog_1)?;
        let host = format!("{shop}.test");
        let served = wait_until(LIMIT, "shop served through the ingress", || {
            let answer = through_proxy(proxy_port, &host).ok()?;
            answer.contains("shop-v1").then_some(answer)
        })?;
        assert!(served.starts_with("HTTP/1.1 200"), "{served}");
        // Every replica of both is up (shop's web, its pod, blog's web).
        wait_until(LIMIT, "shop's two containers and blog's one", || {
            (containers(&shop).ok()?.len() == 2 && containers(&blog).ok()?.len() == 1).then_some(())
        })?;
        let before = shop_state(&shop, &data_dir)?;
        assert!(
            before.1.contains(&volume) && before.1.contains(&format!("voodu-{shop}-db-data-0")),
            "shop's volumes carry its scope: {}",
            before.1
        );
        let address = http_address(&data_dir)?;
        let data = data_dir.display().to_string();
        let base = blog_base(&blog);
        // (attempt, the text of the rejection each must contain)
        let attempts: Vec<(String, &str, String)> = vec![
            (
                blog_extra(
                    &blog,
                    "hook",
                    &format!(
                        "  on_deploy {{\n    success {{\n      url  = \"http://blog.example/\"\n      file = \"$${{asset.{shop}.cfg.json}}\"\n    }}\n  }}\n"
                    ),
                ),
                "an escaped on_deploy file",
                "must be exactly one asset reference".to_owned(),
            ),
            (
                blog_extra(
                    &blog,
                    "hook",
                    "  on_deploy {\n    success {\n      url  = \"http://blog.example/\"\n      file = \"$${asset.a.b./etc/shadow}\"\n    }\n  }\n",
                ),
                "an on_deploy file naming a host path",
                "must be exactly one asset reference".to_owned(),
            ),
            (
                blog_extra(
                    &blog,
                    "hook",
                    &format!(
                        "  on_deploy {{\n    success {{\n      url  = \"http://blog.example/\"\n      file = \"${{asset.{shop}.cfg.json}}\"\n    }}\n  }}\n"
                    ),
                ),
                "an on_deploy file of shop's asset",
                "belongs to source `shop`".to_owned(),
            ),
            (
                blog_extra(
                    &blog,
                    "hook",
                    "  on_deploy {\n    success {\n      url    = \"http://127.0.0.1:9/admin\"\n      method = \"DELETE\"\n    }\n  }\n",
                ),
                "an on_deploy url on loopback",
                "127.0.0.1 is a loopback address".to_owned(),
            ),
            (
                blog_extra(&blog, "env", &format!("  env_from = [\"{shop}/web\"]\n")),
                "shop's config bucket",
                "belongs to source `shop`".to_owned(),
            ),
            (
                blog_extra(
                    &blog,
                    "bind",
                    &format!("  volumes = [\"{data}/assets/{shop}/cfg/secret:/x\"]\n"),
                ),
                "shop's asset file by path",
                "belongs to source `shop`".to_owned(),
            ),
            (
                blog_extra(
                    &blog,
                    "bind",
                    &format!(
                        "  volumes = [\"${{asset.{blog}.a.k}}/../../../{shop}/cfg/secret:/x\"]\n"
                    ),
                ),
                "shop's asset file through a walk out of blog's",
                "belongs to source `shop`".to_owned(),
            ),
            (
                blog_extra(
                    &blog,
                    "claim",
                    &format!("  volumes = [\"voodu-{shop}-db-data-0:/x\"]\n"),
                ),
                "shop's statefulset claim",
                "belongs to source `shop`".to_owned(),
            ),
            (
                blog_extra(
                    &blog,
                    "squat",
                    &format!("  volumes = [\"voodu-{shop}-cache-data-0:/x\"]\n"),
                ),
                "a claim shop has not declared yet",
                "belongs to source `shop`".to_owned(),
            ),
            (
                blog_extra(&blog, "vol", &format!("  volumes = [\"{volume}:/x\"]\n")),
                "shop's named volume",
                "is held by source `shop`".to_owned(),
            ),
            (
                blog_extra(
                    &blog,
                    "port",
                    &format!("  ports = [\"127.0.0.1:{shop_port}:80\"]\n"),
                ),
                "shop's published port",
                "is held by source `shop`".to_owned(),
            ),
            (
                format!(
                    "\ningress \"{blog}\" \"steal\" {{\n  host    = \"{host}\"\n  service = \"web\"\n  port    = 8080\n}}\n"
                ),
                "shop's ingress host",
                "is held by source `shop`".to_owned(),
            ),
            (
                format!(
                    "\ningress \"{blog}\" \"steal\" {{\n  host    = \"{}\"\n  service = \"web\"\n  port    = 8080\n}}\n",
                    host.to_uppercase()
                ),
                "shop's ingress host in upper case",
                "is held by source `shop`".to_owned(),
            ),
            (
                format!(
                    "\ningress \"{blog}\" \"steal\" {{\n  host    = \"{host}\"\n  service = \"web\"\n  port    = 8080\n  location {{\n    path = \"/admin\"\n  }}\n}}\n"
                ),
                "a longer path under shop's host",
                "is held by source `shop`".to_owned(),
            ),
            (
                format!(
                    "\ningress \"{blog}\" \"ask\" {{\n  host    = \"{blog}.test\"\n  service = \"web\"\n  port    = 8080\n  tls {{\n    on_demand = true\n    ask       = \"http://blog.example/ask\"\n  }}\n}}\n"
                ),
                "the proxy-wide TLS ask",
                "on-demand TLS `ask` endpoint belongs to no source".to_owned(),
            ),
            (
                format!(
                    "\ndeployment \"{shop}\" \"evil\" {{\n  image = \"{}\"\n}}\n",
                    test_image()
                ),
                "a resource in shop's scope (held before)",
                "belongs to source `shop`".to_owned(),
            ),
            (
                format!(
                    "\ndeployment \"{}\" \"evil\" {{\n  image = \"{}\"\n}}\n",
                    shop.to_uppercase(),
                    test_image()
                ),
                "shop's scope in upper case (held before)",
                "source".to_owned(),
            ),
        ];
        for (index, (extra, what, expected)) in attempts.iter().enumerate() {
            let text = format!("{base}{extra}");
            let (code, answer) = push_blog(&blog_repo, &address, &text, what)?;
            assert_eq!(
                (code, answer["result"].as_str()),
                (422, Some("rejected")),
                "attempt {index} ({what}) was not rejected: {answer:#}"
            );
            let errors: Vec<String> = answer["errors"]
                .as_array()
                .into_iter()
                .flatten()
                .map(|error| error.as_str().unwrap_or_default().to_owned())
                .collect();
            assert!(
                errors.iter().any(|error| {
                    error.starts_with("blog.hcl:")
                        && error
                            .split(':')
                            .nth(1)
                            .is_some_and(|line| line.parse::<usize>().is_ok_and(|line| line > 0))
                        && error.contains(expected.as_str())
                }),
                "attempt {index} ({what}): no `blog.hcl:line:col: …{expected}…` in {errors:#?}"
            );
            assert_eq!(
                shop_state(&shop, &data_dir)?,
                before,
                "attempt {index} ({what}) changed shop"
            );
        }
        // The one left to the network: blog's container does not reach shop's unexposed
        // httpd, which a container of shop's own does reach.
        let blog_web = containers(&blog)?
            .first()
            .map(|(id, _)| id.clone())
            .ok_or("blog's container")?;
        let shop_web = docker(&[
            "ps",
            "-q",
            "--filter",
            &format!("label=voodu.scope={shop}"),
            "--filter",
            "label=voodu.name=web",
        ])?;
        let shop_web = shop_web.trim();
        // busybox's `nc` (its static `wget` cannot resolve names).
        let get = |container: &str, host: &str| -> TestResult<String> {
            let output = Command::new("docker")
                .args([
                    "exec",
                    container,
                    "sh",
                    "-c",
                    &format!("printf 'GET / HTTP/1.0\\r\\n\\r\\n' | nc -w 5 {host} 8080"),
                ])
                .output()?;
            Ok(String::from_utf8_lossy(&output.stdout).into_owned())
        };
        let by_name = format!("web.{shop}");
        assert!(
            get(shop_web, &by_name)?.contains("shop-v1"),
            "shop reaches its own service by name"
        );
        let shop_address = docker(&[
            "inspect",
            "--format",
            "{{range .NetworkSettings.Networks}}{{.IPAddress}}{{end}}",
            shop_web,
        ])?;
        let shop_address = shop_address.trim();
        for host in [by_name.as_str(), shop_address] {
            let answer = get(&blog_web, host)?;
            assert!(
                !answer.contains("shop-v1"),
                "blog reached shop's service at {host}: {answer}"
            );
        }
        let networks = docker(&[
            "inspect",
            "--format",
            "{{range $name, $_ := .NetworkSettings.Networks}}{{$name}} {{end}}",
            &blog_web,
        ])?;
        assert_eq!(
            networks.trim(),
            "voodu0-blog",
            "blog's container is on its own network only"
        );
        // Traffic through the ingress is shop's, as before.
        let after = through_proxy(proxy_port, &host)?;
        assert!(
            after.starts_with("HTTP/1.1 200") && after.contains("shop-v1"),
            "{after}"
        );
        assert_eq!(shop_state(&shop, &data_dir)?, before);
        Ok(())
    };
    let mut log_on_failure = LogOnFailure(&log, false);
    let result = scenario();
    log_on_failure.1 = result.is_err();
    agent.stop()?;
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

/// Removes the named volumes on drop (the containers' guards leave volumes).
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
