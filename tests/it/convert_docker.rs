//! Acceptance of `convert` on a real engine: for real Compose projects of the corpus
//! (docker/awesome-compose), the containers Debian's `docker-compose` (v1.29) creates and the
//! ones the agent creates after `convert` have the same image, command, env, mounts and
//! published ports, service by service.
//!
//! No image can be pulled here, so each project is copied to a temporary directory and its
//! compose file rewritten, and both sides run that one file: each service's `image` (or
//! `build`) becomes a local image (`voodu-postgres:latest` where the image was a postgres,
//! else `voodu-busybox:latest`); published host ports become free ones (two runs on one host
//! must not collide with other tests); `container_name`s get the test's prefix (they are
//! global names); `depends_on` is dropped (a stand-in that exits at once is never Ready, and
//! the start-up order `convert` writes would keep its dependents from being created; the
//! order is not what is compared). Everything else is kept as written. Services whose command busybox cannot
//! run exit at once or never start: the comparison is made on `docker inspect` of the
//! created container (config, mounts, port bindings), which exists either way, on both sides
//! alike.
//!
//! What is compared, per service: the image run (its id: the agent pins the tag it resolved); the command as run (`Config.Entrypoint` then
//! `Config.Cmd`); the env without the image's own variables (identical entries) and the
//! agent's additions (`VOODU_*`: `VOODU_SCOPE`, `VOODU_NAME`, and a statefulset pod's
//! `VOODU_REPLICA_*`); mounts as (type, destination, volume name), named volumes by their
//! Compose name (Compose's `<project>_<name>`, the agent's `<scope>_<name>` or its claim
//! `voodu-<scope>-<service>-<claim>-<n>`), anonymous volumes as such, bind sources not
//! compared (a secret is a bind of the project's file under Compose and of the agent's asset
//! file); published ports as (container port/protocol, host port), without the host address
//! (Compose v1 writes an empty one for "every interface", the agent `0.0.0.0`).

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use serde_json::Value;

use crate::convert::compose_corpus;
use crate::e2e_docker::Agent;
use crate::support::{DockerGuard, TempRepo, TestResult, unique, wait_until};

const LIMIT: Duration = Duration::from_secs(120);

/// What is compared of one container.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Seen {
    image: String,
    command: Vec<String>,
    env: BTreeMap<String, String>,
    mounts: BTreeSet<(String, String, String)>,
    ports: BTreeSet<(String, String)>,
}

fn strings(value: &Value) -> Vec<String> {
    value
        .as_array()
        .map(|items| {
            items
                .iter()
                .filter_map(|i| i.as_str().map(str::to_owned))
                .collect()
        })
        .unwrap_or_default()
}

fn env_of(list: &[String]) -> BTreeMap<String, String> {
    list.iter()
        .map(|entry| match entry.split_once('=') {
            Some((k, v)) => (k.to_owned(), v.to_owned()),
            None => (entry.clone(), String::new()),
        })
        .collect()
}

fn docker(args: &[&str]) -> TestResult<String> {
    let output = Command::new("docker").args(args).output()?;
    if !output.status.success() {
        return Err(format!(
            "docker {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&output.stderr)
        )
        .into());
    }
    Ok(String::from_utf8(output.stdout)?)
}

/// `docker inspect` of `id`, reduced to what is compared; `volume` names a volume as its
/// Compose name.
fn inspect(id: &str, volume: &dyn Fn(&str) -> String) -> TestResult<Seen> {
    let parsed: Value = serde_json::from_str(&docker(&["inspect", id])?)?;
    let c = &parsed[0];
    // The image run, by id: the agent pins the tag it resolved (`Config.Image` is then the
    // id), Compose keeps the tag.
    let image = c["Image"].as_str().unwrap_or_default().to_owned();
    let image_env: Value = serde_json::from_str(&docker(&["image", "inspect", &image])?)?;
    let image_env: BTreeSet<String> = strings(&image_env[0]["Config"]["Env"])
        .into_iter()
        .collect();
    let env: Vec<String> = strings(&c["Config"]["Env"])
        .into_iter()
        .filter(|e| !image_env.contains(e) && !e.starts_with("VOODU_"))
        .collect();
    let mut command = strings(&c["Config"]["Entrypoint"]);
    command.extend(strings(&c["Config"]["Cmd"]));
    let mut mounts = BTreeSet::new();
    for m in c["Mounts"].as_array().cloned().unwrap_or_default() {
        let kind = m["Type"].as_str().unwrap_or_default().to_owned();
        let dest = m["Destination"].as_str().unwrap_or_default().to_owned();
        let name = match m["Name"].as_str() {
            Some(n) if kind == "volume" => {
                if n.len() == 64 && n.chars().all(|c| c.is_ascii_hexdigit()) {
                    "anonymous".to_owned()
                } else {
                    volume(n)
                }
            }
            _ => String::new(),
        };
        mounts.insert((kind, dest, name));
    }
    let mut ports = BTreeSet::new();
    if let Some(bindings) = c["HostConfig"]["PortBindings"].as_object() {
        for (port, list) in bindings {
            for b in list.as_array().cloned().unwrap_or_default() {
                ports.insert((
                    port.clone(),
                    b["HostPort"].as_str().unwrap_or_default().to_owned(),
                ));
            }
        }
    }
    Ok(Seen {
        image,
        command,
        env: env_of(&env),
        mounts,
        ports,
    })
}

fn copy_dir(from: &Path, to: &Path) -> TestResult {
    std::fs::create_dir_all(to)?;
    for entry in std::fs::read_dir(from)? {
        let entry = entry?;
        let target = to.join(entry.file_name());
        if entry.file_type()?.is_dir() {
            copy_dir(&entry.path(), &target)?;
        } else {
            std::fs::copy(entry.path(), &target)?;
        }
    }
    Ok(())
}

fn free_port() -> TestResult<u16> {
    Ok(std::net::TcpListener::bind("0.0.0.0:0")?
        .local_addr()?
        .port())
}

fn indent(line: &str) -> usize {
    line.len() - line.trim_start().len()
}

/// The compose file with local images, free host ports and prefixed container names (see
/// the module docs); the rest as written.
fn rewrite(text: &str, prefix: &str) -> TestResult<String> {
    let mut out = Vec::new();
    let mut skip: Option<usize> = None;
    let mut ports: Option<usize> = None;
    for line in text.lines() {
        let ind = indent(line);
        let trimmed = line.trim();
        if let Some(at) = skip {
            if trimmed.is_empty() || ind > at || (ind == at && trimmed.starts_with("- ")) {
                continue;
            }
            skip = None;
        }
        if let Some(at) = ports {
            if trimmed.starts_with("- ") && ind >= at {
                let item = trimmed[2..].trim().trim_matches(['"', '\'']);
                let (host, container) = item
                    .split_once(':')
                    .ok_or_else(|| format!("a port this test does not rewrite: {line}"))?;
                if host.contains(':') || host.is_empty() {
                    return Err(format!("a port this test does not rewrite: {line}").into());
                }
                out.push(format!(
                    "{}- \"{}:{container}\"",
                    " ".repeat(ind),
                    free_port()?
                ));
                continue;
            }
            if !trimmed.is_empty() {
                ports = None;
            }
        }
        let pad = " ".repeat(ind);
        if ind >= 2 && trimmed.starts_with("image:") {
            let image = if trimmed.contains("postgres") {
                "voodu-postgres:latest"
            } else {
                "voodu-busybox:latest"
            };
            out.push(format!("{pad}image: {image}"));
        } else if ind >= 2 && trimmed.starts_with("build:") {
            out.push(format!("{pad}image: voodu-busybox:latest"));
            if trimmed == "build:" {
                skip = Some(ind);
            }
        } else if ind >= 2 && trimmed.starts_with("depends_on:") {
            // A stand-in busybox exits at once: it is never Ready (nor healthy), so a start-up
            // order on it would keep its dependents from being created at all.
            if trimmed == "depends_on:" {
                skip = Some(ind);
            }
        } else if ind >= 2 && trimmed.starts_with("container_name:") {
            let name = trimmed["container_name:".len()..].trim();
            out.push(format!("{pad}container_name: {prefix}-{name}"));
        } else if ind >= 2 && trimmed == "ports:" {
            ports = Some(ind);
            out.push(line.to_owned());
        } else {
            out.push(line.to_owned());
        }
    }
    Ok(out.join("\n") + "\n")
}

/// Takes the Compose project down (containers, networks, volumes) when dropped.
struct ComposeDown {
    project: String,
    file: PathBuf,
}

impl Drop for ComposeDown {
    fn drop(&mut self) {
        let _ = Command::new("docker-compose")
            .arg("-p")
            .arg(&self.project)
            .arg("-f")
            .arg(&self.file)
            .args(["down", "-v", "--remove-orphans"])
            .output();
    }
}

/// Removes the networks the agent made for the converted file when dropped.
struct NetworksGone(Vec<String>);

impl Drop for NetworksGone {
    fn drop(&mut self) {
        for name in &self.0 {
            let _ = Command::new("docker")
                .args(["network", "rm", name])
                .output();
        }
    }
}

/// The services of a converted set: (kind, name) of each block, and the networks named.
fn converted(dir: &Path) -> TestResult<(Vec<String>, Vec<String>)> {
    let mut services = Vec::new();
    let mut networks = Vec::new();
    for entry in std::fs::read_dir(dir)? {
        let text = std::fs::read_to_string(entry?.path())?;
        for line in text.lines() {
            let words: Vec<&str> = line.split('"').collect();
            if (line.starts_with("deployment ") || line.starts_with("statefulset "))
                && words.len() >= 4
            {
                services.push(words[3].to_owned());
            }
            if line.trim_start().starts_with("networks = [") {
                networks.extend(words.iter().skip(1).step_by(2).map(|w| (*w).to_owned()));
            }
        }
    }
    services.sort();
    Ok((services, networks))
}

fn compare(project: &str) -> TestResult {
    let source = compose_corpus().join("awesome-compose").join(project);
    let temp = tempfile::tempdir()?;
    let dir = temp.path().join(project);
    copy_dir(&source, &dir)?;
    let file = ["compose.yaml", "compose.yml"]
        .iter()
        .map(|n| dir.join(n))
        .find(|p| p.is_file())
        .ok_or("no compose file")?;
    let prefix = unique("cmp");
    std::fs::write(&file, rewrite(&std::fs::read_to_string(&file)?, &prefix)?)?;

    // docker compose's side.
    let compose_project = prefix.clone();
    let down = ComposeDown {
        project: compose_project.clone(),
        file: file.clone(),
    };
    let up = Command::new("docker-compose")
        .arg("-p")
        .arg(&compose_project)
        .arg("-f")
        .arg(&file)
        .args(["up", "-d", "--no-build"])
        .current_dir(&dir)
        .output()?;
    let up_log = String::from_utf8_lossy(&up.stderr).into_owned();
    let ids = docker(&[
        "ps",
        "-aq",
        "--filter",
        &format!("label=com.docker.compose.project={compose_project}"),
    ])?;
    let strip = format!("{compose_project}_");
    let compose_volume = |name: &str| name.strip_prefix(&strip).unwrap_or(name).to_owned();
    let mut theirs = BTreeMap::new();
    for id in ids.split_whitespace() {
        let parsed: Value = serde_json::from_str(&docker(&["inspect", id])?)?;
        let service = parsed[0]["Config"]["Labels"]["com.docker.compose.service"]
            .as_str()
            .unwrap_or_default()
            .to_owned();
        theirs.insert(service, inspect(id, &compose_volume)?);
    }
    drop(down);

    // The agent's side: convert the same file, commit it, run the agent on it.
    let scope = unique("cv");
    // Dropped after the guard has removed the containers attached to them.
    let mut networks_gone = NetworksGone(Vec::new());
    let _guard = DockerGuard::new(&scope);
    let repo = TempRepo::new()?;
    let out = repo.work().join("compose");
    let conversion = Command::new(env!("CARGO_BIN_EXE_voodu-agent"))
        .arg("convert")
        .arg(&file)
        .args(["--scope", &scope, "-o"])
        .arg(&out)
        .output()?;
    let notes = String::from_utf8_lossy(&conversion.stderr).into_owned();
    assert_eq!(
        conversion.status.code(),
        Some(0),
        "{project}: convert: {notes}"
    );
    let (services, networks) = converted(&out)?;
    networks_gone.0.clone_from(&networks);
    assert_eq!(
        services,
        theirs.keys().cloned().collect::<Vec<_>>(),
        "{project}: the services docker-compose created ({up_log}) and the ones converted"
    );
    repo.commit("converted from compose")?;
    let data = temp.path().join("data");
    let log = temp.path().join("agent.log");
    let mut extra: Vec<String> = vec!["--allow-bind-root".into(), dir.display().to_string()];
    for network in &networks {
        extra.push("--allow-network".into());
        extra.push(network.clone());
    }
    let extra: Vec<&str> = extra.iter().map(String::as_str).collect();
    let _agent = Agent::start(&repo, &data, &log, &extra)?;
    let claim_prefix = format!("voodu-{scope}-");
    let scope_prefix = format!("{scope}_");
    let agent_volume = |name: &str| -> String {
        if let Some(rest) = name.strip_prefix(&scope_prefix) {
            return rest.to_owned();
        }
        // voodu-<scope>-<service>-<claim>-<n>: the claim, named as the Compose volume.
        if let Some(rest) = name.strip_prefix(&claim_prefix) {
            let without_ordinal = rest.rsplit_once('-').map_or(rest, |(r, _)| r);
            for service in &services {
                if let Some(claim) = without_ordinal.strip_prefix(&format!("{service}-")) {
                    return claim.to_owned();
                }
            }
        }
        name.to_owned()
    };
    let mut ours = BTreeMap::new();
    for service in &services {
        let seen = wait_until(
            LIMIT,
            &format!("{project}: a container of {service}"),
            || {
                let ids = docker(&[
                    "ps",
                    "-aq",
                    "--filter",
                    &format!("label=voodu.scope={scope}"),
                    "--filter",
                    &format!("label=voodu.name={service}"),
                ])
                .ok()?;
                // A container the agent replaces between the list and the inspect: try again.
                ids.split_whitespace()
                    .find_map(|id| inspect(id, &agent_volume).ok())
            },
        )
        .map_err(|e| {
            format!(
                "{e}\n---- agent log ----\n{}",
                std::fs::read_to_string(&log).unwrap_or_default()
            )
        })?;
        ours.insert(service.clone(), seen);
    }
    for service in &services {
        assert_eq!(
            ours.get(service),
            theirs.get(service),
            "{project}: service {service}: the agent's container (left) and docker-compose's (right) differ\nconvert said:\n{notes}"
        );
    }
    Ok(())
}

macro_rules! projects {
    ($($test:ident => $project:literal),* $(,)?) => {
        $(
            #[test]
            #[ignore = "needs a Docker engine, docker-compose and the Compose corpus: scripts/test runs it (cargo test -- --include-ignored)"]
            fn $test() -> TestResult {
                compare($project)
            }
        )*
    };
}

projects! {
    gitea_postgres_matches_docker_compose => "gitea-postgres",
    nextcloud_redis_mariadb_matches_docker_compose => "nextcloud-redis-mariadb",
    nginx_golang_postgres_matches_docker_compose => "nginx-golang-postgres",
    postgresql_pgadmin_matches_docker_compose => "postgresql-pgadmin",
    prometheus_grafana_matches_docker_compose => "prometheus-grafana",
    wordpress_mysql_matches_docker_compose => "wordpress-mysql",
}
