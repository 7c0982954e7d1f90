//! Private-registry pulls (spec §2.8, §6.5) accepted on a real engine with the real binary:
//! a deployment whose image is missing on the host and lives in a private registry fails,
//! with the hint to declare a `registry` for that host, while the registry refuses the
//! engine's credential-less attempt; committing `registry "local" { url username token }`
//! makes the agent pull the image with exactly those credentials (the registry sees an
//! authorised manifest GET and blob GETs) and the replica runs. The token appears neither in
//! `status --json` nor in the agent log.
//!
//! The registry is `support::registry`: a minimal v2 API server on loopback serving the test
//! image (from `docker save`) plus a per-run nonce layer, so the engine must fetch blobs,
//! behind HTTP Basic auth. Limits in `wait_until` are liveness
//! bounds, not timing assertions.

use std::process::Command;
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::e2e_docker::{Env, Row};
use crate::support::registry::{Auth, Image, Registry, Seen, base64, probe};
use crate::support::{TestResult, test_image, wait_until};

const LIMIT: Duration = Duration::from_secs(90);
const USERNAME: &str = "deploy-bot";
const REPOSITORY: &str = "acme/web";
const TAG: &str = "1";

/// Removes the image reference from the host when created and when dropped (also when the
/// test fails, after `Env` removed the scope's containers). The pulled image has its own id
/// (the nonce layer), so `docker rmi -f <reference>` removes it and leaves the test image.
struct Untag(String);

impl Untag {
    fn new(reference: &str) -> Untag {
        let untag = Untag(reference.to_owned());
        untag.remove();
        untag
    }

    fn remove(&self) {
        let _ = Command::new("docker").args(["rmi", "-f", &self.0]).output();
    }
}

impl Drop for Untag {
    fn drop(&mut self) {
        self.remove();
    }
}

fn image_present(reference: &str) -> TestResult<bool> {
    Ok(Command::new("docker")
        .args(["image", "inspect", "--format", "{{.Id}}", reference])
        .output()?
        .status
        .success())
}

fn docker(args: &[&str]) -> TestResult<String> {
    let output = Command::new("docker").args(args).output()?;
    if !output.status.success() {
        return Err(format!(
            "docker {} failed: {}",
            args.join(" "),
            String::from_utf8_lossy(&output.stderr)
        )
        .into());
    }
    Ok(String::from_utf8(output.stdout)?.trim().to_owned())
}

fn deployment(scope: &str, image: &str) -> String {
    deployment_of(scope, image, 1)
}

fn deployment_of(scope: &str, image: &str, replicas: u32) -> String {
    format!(
        r#"deployment "{scope}" "web" {{
  image    = "{image}"
  command  = ["sleep", "3600"]
  replicas = {replicas}
}}
"#
    )
}

/// Waits for `n` running replicas of web, Ready, that all run the registry's image.
fn converged_on(env: &Env, n: usize, what: &str) -> TestResult<Vec<Row>> {
    wait_until(LIMIT, what, || {
        let resource = env.resource().ok()??;
        let rows = running(env).ok()?;
        (rows.len() == n && resource["phase"] == "Ready" && resource["running_replicas"] == n)
            .then_some(rows)
    })
}

fn registry_block(host: &str, token: &str) -> String {
    format!(
        r#"registry "local" {{
  url      = "{host}"
  username = "{USERNAME}"
  token    = "{token}"
}}
"#
    )
}

/// The running `web` replicas of the scope.
fn running(env: &Env) -> TestResult<Vec<Row>> {
    let marker = format!("{}-web.", env.scope());
    Ok(env
        .containers()?
        .into_iter()
        .filter(|row| row.name.starts_with(&marker) && row.state == "running")
        .collect())
}

fn served(seen: &[Seen], method: &str, path: &str) -> bool {
    seen.iter().any(|request| {
        request.method == method
            && request.path == path
            && request.auth == Auth::Valid
            && request.status == 200
    })
}

#[test]
#[ignore = "needs a Docker engine: scripts/test runs it (cargo test -- --include-ignored)"]
fn a_missing_image_is_pulled_from_a_private_registry_with_its_credentials() -> TestResult {
    let nonce = voodu_agent::model::random_hex(8);
    let image = Image::from_local(&test_image(), &nonce)?;
    let token = format!("s3cret-{}", voodu_agent::model::random_hex(8));
    let registry = Registry::start(REPOSITORY, TAG, image.clone(), USERNAME, &token)?;
    let host = registry.host();
    let reference = format!("{host}/{REPOSITORY}:{TAG}");
    let _untag = Untag::new(&reference);
    assert!(
        !image_present(&reference)?,
        "{reference} must be missing on the host before the test"
    );

    // The server itself: no or wrong credentials are refused with a Basic challenge.
    let manifest_path = format!("/v2/{REPOSITORY}/manifests/{TAG}");
    let wrong = format!("Basic {}", base64(format!("{USERNAME}:wrong").as_bytes()));
    for authorization in [None, Some(wrong.as_str())] {
        let (status, challenge) = probe(registry.address, &manifest_path, authorization)?;
        assert_eq!(
            (status, challenge.as_str()),
            (401, r#"Basic realm="voodu-test""#),
            "{authorization:?}"
        );
    }
    let probes = registry.seen().len();

    Env::new()?.run(|env| {
        let scope = env.scope().to_owned();

        // 1. No registry block: the pull is refused and the resource fails with the hint.
        env.repo
            .write("app/web.hcl", &deployment(&scope, &reference))?;
        env.repo.commit("web from a private registry")?;
        env.start_agent_with(&["--ready-settle", "1s"])?;
        let hint = format!("declare a `registry` for {host}");
        let failed = wait_until(LIMIT, "web to fail for want of a registry", || {
            let resource = env.resource().ok()??;
            let message = resource["message"].as_str()?.to_owned();
            (resource["phase"] == "Failed" && message.contains(&hint)).then_some(message)
        })?;
        assert!(failed.contains(&reference), "{failed}");
        let refused: Vec<Seen> = registry.seen().split_off(probes);
        assert!(
            !refused.is_empty()
                && refused
                    .iter()
                    .all(|request| request.auth != Auth::Valid && request.status == 401),
            "the engine's attempt without credentials is refused: {refused:?}"
        );
        assert!(!image_present(&reference)?);
        eprintln!("without a registry: {failed}");

        // 2. A registry block for the host: the pull succeeds with its credentials.
        let before = registry.seen().len();
        env.repo
            .write("app/registry.hcl", &registry_block(&host, &token))?;
        env.repo.commit("registry for the private image")?;
        let committed = Instant::now();
        let replica = wait_until(LIMIT, "one running replica of web, Ready", || {
            let resource = env.resource().ok()??;
            let mut rows = running(env).ok()?;
            let ready = rows.len() == 1
                && resource["phase"] == "Ready"
                && resource["running_replicas"] == 1;
            ready.then(|| rows.remove(0))
        })?;
        let ready_after = committed.elapsed();
        let pull: Vec<Seen> = registry.seen().split_off(before);
        let by_digest = format!("/v2/{REPOSITORY}/manifests/{}", image.manifest_digest);
        assert!(
            served(&pull, "GET", &manifest_path) || served(&pull, "GET", &by_digest),
            "an authorised manifest GET: {pull:?}"
        );
        // The config and the nonce layer are new to the engine; the test image's layers it may
        // know by digest from an earlier run, and then skips.
        for digest in [image.config_digest.as_str(), image.own_layer().ok_or("layers")?] {
            let path = format!("/v2/{REPOSITORY}/blobs/{digest}");
            assert!(
                served(&pull, "GET", &path),
                "an authorised GET of {path}: {pull:?}"
            );
        }
        assert!(
            pull.iter()
                .all(|request| request.auth == Auth::Valid || request.status == 401),
            "nothing is served without the credentials: {pull:?}"
        );
        assert_eq!(
            docker(&["image", "inspect", "--format", "{{.Id}}", &reference])?,
            image.config_digest,
            "{reference} is on the host now, the image the registry served"
        );
        assert_eq!(
            docker(&["inspect", "--format", "{{.Image}}", &replica.id])?,
            image.config_digest,
            "the replica runs the pulled image"
        );
        assert_eq!(
            docker(&["exec", &replica.id, "cat", "/voodu-registry-nonce"])?,
            nonce,
            "the replica's filesystem has the registry's own layer"
        );

        // 3. The token is nowhere an operator reads.
        let status: Value = env.status()?;
        assert!(
            !status.to_string().contains(&token),
            "the token is in status --json"
        );
        let log = std::fs::read_to_string(env.log())?;
        assert!(!log.contains(&token), "the token is in the agent log");

        // 4. Issue 24 item 2: the host loses the image (`docker rmi`, a prune, a rebuilt
        // host). Every path that creates a replica pulls it again with the registry's
        // credentials: a scale-up, a replica removed by hand, an agent restart.
        // The release runs the digest it pinned: the host loses the image's names, its tag
        // and its digest (a running replica keeps its layers; the engine lets the names go).
        let pinned = format!(
            "{}@{}",
            reference.rsplit_once(':').map_or(reference.as_str(), |(name, _)| name),
            image.manifest_digest
        );
        let lose = || -> TestResult {
            for name in [&reference, &pinned] {
                let _ = docker(&["rmi", "-f", name]);
            }
            Ok(())
        };
        // Each path asks the engine to pull the pinned digest (with the registry's
        // credentials); the engine may answer a pull by digest from the content it still
        // holds after a ping of the registry, so the agent's own record says what it did.
        let log_path = env.log();
        let pulls_of_pinned = || -> TestResult<usize> {
            Ok(std::fs::read_to_string(&log_path)?
                .lines()
                .filter(|line| line.contains("pulling a missing image") && line.contains(&pinned))
                .count())
        };
        let tag_requests = |registry: &Registry| {
            registry
                .seen()
                .iter()
                .filter(|request| request.path.ends_with("/manifests/1"))
                .count()
        };
        let tag_requests_before = tag_requests(&registry);
        lose()?;
        env.repo.write(
            "app/web.hcl",
            &deployment_of(&scope, &reference, 2),
        )?;
        env.repo.commit("two replicas")?;
        converged_on(env, 2, "the scale-up to pull and run two replicas")?;
        assert_eq!(pulls_of_pinned()?, 1, "the scale-up pulled the digest");
        lose()?;
        let rows = running(env)?;
        docker(&["rm", "-f", &rows[0].id])?;
        converged_on(env, 2, "the removed replica to be re-created from a pulled image")?;
        assert_eq!(pulls_of_pinned()?, 2, "the drift repair pulled the digest");
        env.agent = None;
        lose()?;
        let rows = running(env)?;
        docker(&["rm", "-f", &rows[0].id])?;
        env.start_agent_with(&["--ready-settle", "1s"])?;
        converged_on(env, 2, "the restarted agent to pull and re-create the replica")?;
        assert_eq!(pulls_of_pinned()?, 3, "the restart pulled the digest");
        assert_eq!(
            tag_requests(&registry),
            tag_requests_before,
            "no repair asked the registry for the tag"
        );
        // Pulled by the digest the release pinned, never the tag.
        assert!(image_present(&pinned)?);
        let rows = running(env)?;
        let runs = docker(&["inspect", "--format", "{{.Config.Image}}", &rows[0].id])?;
        assert_eq!(runs, pinned);

        let valid: Vec<&Seen> = pull
            .iter()
            .filter(|request| request.auth == Auth::Valid)
            .collect();
        let bytes: u64 = valid.iter().map(|request| request.bytes).sum();
        let took = match (valid.first(), valid.last()) {
            (Some(first), Some(last)) => last.at.duration_since(first.at),
            _ => Duration::ZERO,
        };
        eprintln!(
            "registry_docker: {} requests during the pull ({} authorised, {} refused), {bytes} bytes served, pull took {took:?} (first to last authorised request), Ready {ready_after:?} after the registry commit; {} requests refused before the registry block",
            pull.len(),
            valid.len(),
            pull.len() - valid.len(),
            refused.len(),
        );
        Ok(())
    })
}
