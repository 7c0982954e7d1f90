//! Issue 52, acceptance 1: branch previews with the real binary, its real Caddy ingress and a
//! real engine. A source `shop` owning `{shop}` and `{shop}-pr-*` previews `preview/*` at
//! `{slug}.preview.test`: a push to `preview/feat-x` makes its preview answer at its host; a
//! second push updates it; the preview runs on its own network (it cannot reach a base
//! replica by alias or address, the ingress still serves it) that goes with it; a preview
//! reaching the base scope's claim is rejected with its
//! location; a third preview past `max = 2` is refused with a status line; deleting the
//! branch removes its containers, route, asset files and volume and nothing of the base; a
//! short `ttl` removes the rest.

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use crate::sources_docker::{Agent, LogOnFailure, containers, http_address};
use crate::support::http::get_blocking;
use crate::support::repo::git;
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

fn free_port() -> TestResult<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port())
}

/// The answer to `GET http://host/` through the proxy on `proxy`.
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

/// Shop's files serving `text`: an asset, a web deployment, a statefulset with a claim, an
/// ingress; `extra` appended.
fn shop_files(shop: &str, text: &str, extra: &str) -> String {
    format!(
        r#"asset "{shop}" "cfg" {{
  k = "{text}"
}}

deployment "{shop}" "web" {{
  image    = "{image}"
  command  = ["sh", "-c", "echo {text} > /www/index.html && exec httpd -f -p 8080 -h /www"]
  replicas = 1
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
{extra}"#,
        image = test_image()
    )
}

/// Points branch `branch` of the remote at a commit of `text` on top of `base` (main is not
/// moved: the work tree's file is put back).
pub(crate) fn push_branch(
    repo: &TempRepo,
    base: &str,
    branch: &str,
    text: &str,
) -> TestResult<String> {
    let before = std::fs::read_to_string(repo.work().join("shop.hcl"))?;
    repo.write("shop.hcl", text)?;
    repo.git(&["add", "-A"])?;
    let tree = repo.git(&["write-tree"])?;
    let sha = repo.git(&["commit-tree", tree.trim(), "-p", base, "-m", branch])?;
    let sha = sha.trim().to_owned();
    git(
        &repo.remote_path(),
        &["update-ref", &format!("refs/heads/{branch}"), &sha],
    )?;
    repo.write("shop.hcl", &before)?;
    repo.git(&["add", "-A"])?;
    Ok(sha)
}

pub(crate) fn delete_branch(repo: &TempRepo, branch: &str) -> TestResult {
    git(
        &repo.remote_path(),
        &["update-ref", "-d", &format!("refs/heads/{branch}")],
    )?;
    Ok(())
}

/// The previews the agent recorded, as (slug, state, message).
fn previews(data_dir: &Path) -> TestResult<Vec<(String, String, String)>> {
    let store = voodu_agent::store::Store::open_read_only(&data_dir.join("state.db"))?;
    Ok(store
        .previews(None)?
        .into_iter()
        .map(|row| (row.slug, row.state, row.message))
        .collect())
}

fn volumes(scope: &str) -> TestResult<String> {
    docker(&[
        "volume",
        "ls",
        "-q",
        "--filter",
        &format!("label=voodu.scope={scope}"),
    ])
}

/// The id of the running web replica of `scope`.
fn web_of(scope: &str) -> TestResult<String> {
    let ids = docker(&[
        "ps",
        "-q",
        "--filter",
        &format!("label=voodu.scope={scope}"),
        "--filter",
        "label=voodu.name=web",
    ])?;
    Ok(ids
        .split_whitespace()
        .next()
        .ok_or("no web replica")?
        .to_owned())
}

/// The networks container `id` is on, with its address on each.
fn networks_of(id: &str) -> TestResult<serde_json::Map<String, serde_json::Value>> {
    let text = docker(&["inspect", "-f", "{{json .NetworkSettings.Networks}}", id])?;
    match serde_json::from_str(text.trim())? {
        serde_json::Value::Object(map) => Ok(map),
        other => Err(format!("networks of {id}: {other}").into()),
    }
}

/// Whether `GET /` of `http://target:8080` answers 200 from inside container `from`.
fn reaches(from: &str, target: &str) -> TestResult<bool> {
    let output = Command::new("docker")
        .args(["exec", from, "sh", "-c"])
        .arg(format!(
            "printf 'GET / HTTP/1.0\\r\\n\\r\\n' | nc -w 2 {target} 8080"
        ))
        .output()?;
    Ok(output.status.success() && String::from_utf8_lossy(&output.stdout).contains(" 200 "))
}

fn network_exists(name: &str) -> TestResult<bool> {
    Ok(docker(&["network", "ls", "--format", "{{.Name}}"])?
        .lines()
        .any(|line| line == name))
}

fn sources_file(path: &Path, url: &str, shop: &str, ttl: &str) -> TestResult {
    std::fs::write(
        path,
        format!(
            "source \"shop\" {{\n  url = \"{url}\"\n  scopes = [\"{shop}\", \"{shop}-pr-*\"]\n  poll = \"1s\"\n  previews {{\n    branches = \"preview/*\"\n    host = \"{{slug}}.preview.test\"\n    ttl = \"{ttl}\"\n    max = 2\n  }}\n}}\n"
        ),
    )?;
    Ok(())
}

struct ProxyGuard(Option<String>);

impl Drop for ProxyGuard {
    fn drop(&mut self) {
        if let Some(name) = &self.0 {
            let _ = Command::new("docker").args(["rm", "-f", name]).output();
        }
    }
}

#[test]
#[ignore = "needs a Docker engine: scripts/test runs it (cargo test -- --include-ignored)"]
fn a_branch_gets_its_own_preview_until_it_goes() -> TestResult {
    let shop = unique("pv");
    let (feat, bad, third) = (
        format!("{shop}-pr-feat-x"),
        format!("{shop}-pr-bad"),
        format!("{shop}-pr-third"),
    );
    let _guards = [&shop, &feat, &bad, &third].map(|scope| DockerGuard::new(scope));
    let repo = TempRepo::new()?;
    repo.write("shop.hcl", &shop_files(&shop, "base-v1", ""))?;
    let main = repo.commit("shop")?;
    let dir = tempfile::tempdir()?;
    let (data_dir, log) = (dir.path().join("data"), dir.path().join("agent.log"));
    let sources = dir.path().join("sources.hcl");
    sources_file(&sources, &repo.url(), &shop, "1h")?;
    let proxy_port = free_port()?;
    let caddy =
        std::env::var("VOODU_CADDY_IMAGE").unwrap_or_else(|_| "voodu-caddy:latest".to_owned());
    let (sources_arg, proxy_arg) = (
        sources.display().to_string(),
        format!("127.0.0.1:{proxy_port}"),
    );
    let args = [
        "--sources",
        sources_arg.as_str(),
        "--ingress-image",
        &caddy,
        "--ingress-http",
        &proxy_arg,
        "--ingress-https",
        "127.0.0.1:0",
    ];
    let agent = Agent::start_with(&data_dir, &log, &args)?;
    let mut proxy_guard = ProxyGuard(None);
    let mut log_guard = LogOnFailure(&log, false);
    let answer = |host: &str, text: &str| {
        let host = host.to_owned();
        let text = text.to_owned();
        move || {
            let answer = through_proxy(proxy_port, &host).ok()?;
            answer.contains(&text).then_some(answer)
        }
    };
    let scenario = || -> TestResult {
        wait_until(
            LIMIT,
            "the base served",
            answer(&format!("{shop}.test"), "base-v1"),
        )?;
        let agent_id =
            voodu_agent::store::Store::open_read_only(&data_dir.join("state.db"))?.agent_id()?;
        proxy_guard.0 = Some(format!("voodu-caddy-{agent_id}"));
        let base_volume = format!("voodu-{shop}-db-data-0");
        wait_until(LIMIT, "the base's volume", || {
            volumes(&shop).ok()?.contains(&base_volume).then_some(())
        })?;

        // The base web's bucket, which a new preview gets a copy of.
        let output = Command::new(crate::e2e_docker::AGENT)
            .args(["config", "set", &format!("{shop}/web"), "GREETING=hello"])
            .arg("--data-dir")
            .arg(&data_dir)
            .output()?;
        assert!(output.status.success(), "{output:?}");
        // A push to preview/feat-x: its preview answers at its host, in its own scopes.
        push_branch(
            &repo,
            &main,
            "preview/feat-x",
            &shop_files(&shop, "feat-x-v1-${GREETING}", ""),
        )?;
        wait_until(
            LIMIT,
            "the preview served",
            answer("feat-x.preview.test", "feat-x-v1-hello"),
        )?;
        let feat_volume = format!("voodu-{feat}-db-data-0");
        wait_until(LIMIT, "the preview's containers and volume", || {
            (containers(&feat).ok()?.len() == 2 && volumes(&feat).ok()?.contains(&feat_volume))
                .then_some(())
        })?;
        assert!(data_dir.join(format!("assets/{feat}/cfg")).exists());
        // The preview runs on its own network, not on the base's: it cannot reach a base
        // replica by its alias or its address, while a base replica can (and the ingress
        // serves the preview, above).
        // (The one source of the sources file owns every network it uses: its base is on
        // `voodu0`.)
        let feat_network = "voodu0-shop.pr.feat-x";
        let (base_web, feat_web) = (web_of(&shop)?, web_of(&feat)?);
        let (base_networks, feat_networks) = (networks_of(&base_web)?, networks_of(&feat_web)?);
        assert_eq!(
            feat_networks.keys().collect::<Vec<_>>(),
            [feat_network],
            "the preview's networks"
        );
        assert!(
            !base_networks.contains_key(feat_network),
            "the base's networks: {base_networks:?}"
        );
        let (base_network, base_address) = base_networks
            .iter()
            .find_map(|(name, network)| {
                Some((name.clone(), network["IPAddress"].as_str()?.to_owned()))
            })
            .ok_or("the base's address")?;
        let base_alias = format!("web.{shop}");
        assert!(reaches(&base_web, &base_alias)? && reaches(&base_web, &base_address)?);
        assert!(
            !reaches(&feat_web, &base_alias)?,
            "the preview reached {base_alias}"
        );
        assert!(
            !reaches(&feat_web, &base_address)?,
            "the preview reached {base_address}"
        );
        assert!(reaches(&feat_web, &format!("web.{feat}"))?);
        // A second push updates it.
        push_branch(
            &repo,
            &main,
            "preview/feat-x",
            &shop_files(&shop, "feat-x-v2", ""),
        )?;
        wait_until(
            LIMIT,
            "the preview updated",
            answer("feat-x.preview.test", "feat-x-v2"),
        )?;

        // A preview mounting the base scope's claim is rejected at the line that asks.
        let reaching = format!(
            "\ndeployment \"{shop}\" \"thief\" {{\n  image   = \"{}\"\n  command = [\"sleep\", \"3600\"]\n  volumes = [\"{base_volume}:/data\"]\n}}\n",
            test_image()
        );
        push_branch(
            &repo,
            &main,
            "preview/bad",
            &shop_files(&shop, "bad", &reaching),
        )?;
        let rejected = wait_until(LIMIT, "the reaching preview rejected", || {
            previews(&data_dir)
                .ok()?
                .into_iter()
                .find_map(|(slug, _, message)| {
                    (slug == "bad" && message.starts_with("rejected")).then_some(message)
                })
        })?;
        assert!(
            rejected.contains("shop.hcl:28:") && rejected.contains(&base_volume),
            "{rejected}"
        );
        assert!(containers(&bad)?.is_empty());

        // A third preview past max = 2 is refused with a status line.
        push_branch(
            &repo,
            &main,
            "preview/third",
            &shop_files(&shop, "third", ""),
        )?;
        let refused = wait_until(LIMIT, "the third preview refused", || {
            previews(&data_dir)
                .ok()?
                .into_iter()
                .find_map(|(slug, state, message)| {
                    (slug == "third" && state == "refused").then_some(message)
                })
        })?;
        assert!(refused.contains("max = 2"), "{refused}");
        // `status` lists the previews: the refused one with its line, the live one's host.
        let output = Command::new(crate::e2e_docker::AGENT)
            .args(["status", "--data-dir"])
            .arg(&data_dir)
            .output()?;
        let shown = String::from_utf8(output.stdout)?;
        assert!(
            shown.contains("PREVIEW")
                && shown.contains("shop#third")
                && shown.contains("(max = 2)")
                && shown.contains("feat-x.preview.test")
                && shown.contains(&feat),
            "{shown}"
        );
        // So do `/status` and the dashboard.
        let address = http_address(&data_dir)?;
        let (code, body) = get_blocking(&address, "/status")?;
        let listed: serde_json::Value = serde_json::from_str(&body)?;
        assert_eq!(code, 200);
        assert!(
            listed["previews"]
                .as_array()
                .is_some_and(|previews| previews
                    .iter()
                    .any(|preview| preview["slug"] == "third" && preview["state"] == "refused")),
            "{body}"
        );
        let (_, page) = get_blocking(&address, "/ui")?;
        assert!(
            page.contains("<h2>Previews</h2>") && page.contains("feat-x.preview.test"),
            "{page}"
        );
        assert!(containers(&third)?.is_empty());

        // Deleting the branch removes everything of its preview, nothing of the base.
        delete_branch(&repo, "preview/feat-x")?;
        wait_until(LIMIT, "the preview's containers and volume gone", || {
            (containers(&feat).ok()?.is_empty() && !volumes(&feat).ok()?.contains(&feat_volume))
                .then_some(())
        })?;
        wait_until(LIMIT, "the preview's route gone", || {
            let answer = through_proxy(proxy_port, "feat-x.preview.test").ok()?;
            (!answer.contains("feat-x-v2")).then_some(())
        })?;
        wait_until(LIMIT, "the preview forgotten", || {
            previews(&data_dir)
                .ok()?
                .iter()
                .all(|(slug, _, _)| slug != "feat-x")
                .then_some(())
        })?;
        assert!(!data_dir.join(format!("assets/{feat}")).exists());
        wait_until(LIMIT, "the preview's network gone", || {
            (!network_exists(feat_network).ok()?).then_some(())
        })?;
        assert!(network_exists(&base_network)?);
        let buckets =
            voodu_agent::store::Store::open_read_only(&data_dir.join("state.db"))?.buckets()?;
        assert!(
            buckets.keys().all(|(scope, _)| *scope != feat)
                && buckets.contains_key(&(shop.clone(), "web".to_owned())),
            "the preview's bucket goes, the base's stays: {:?}",
            buckets.keys().collect::<Vec<_>>()
        );
        assert!(through_proxy(proxy_port, &format!("{shop}.test"))?.contains("base-v1"));
        assert!(volumes(&shop)?.contains(&base_volume));
        assert_eq!(containers(&shop)?.len(), 2);
        // Its place freed, the refused preview is taken.
        wait_until(
            LIMIT,
            "the third preview served",
            answer("third.preview.test", "third"),
        )?;

        // A short ttl removes the previews without a push.
        agent.stop()?;
        sources_file(&sources, &repo.url(), &shop, "5s")?;
        let _agent = Agent::start_with(&data_dir, &log, &args)?;
        wait_until(LIMIT, "the third preview expired", || {
            let third_gone =
                containers(&third).ok()?.is_empty() && volumes(&third).ok()?.trim().is_empty();
            let expired = previews(&data_dir)
                .ok()?
                .iter()
                .any(|(slug, state, _)| slug == "third" && state == "expired");
            let network_gone = !network_exists("voodu0-shop.pr.third").ok()?;
            (third_gone && expired && network_gone).then_some(())
        })?;
        assert!(volumes(&shop)?.contains(&base_volume));
        wait_until(
            LIMIT,
            "the base still served",
            answer(&format!("{shop}.test"), "base-v1"),
        )?;
        Ok(())
    };
    let result = scenario();
    log_guard.1 = result.is_err();
    result
}
