//! Issue 48 on a real engine against the real distribution registry (Debian's
//! `docker-registry`, htpasswd auth): a release is exact bytes.
//!
//! 1. `:stable` names digest A when the release starts; the tag is then moved to B (the
//!    registry tells the agent, `POST /hooks/registry`, and `status` says the tag moved) and
//!    the host loses its copy: a scale-up, a `docker rm -f` of a replica and an agent restart
//!    after `docker rmi` all run A; a spec change runs B; `rollback --release 1` runs A;
//!    `git revert` to the first spec runs A. The registry's requests per rollout do not grow
//!    with the replicas.
//! 2. With `--require-signature`: a digest signed by the trusted key runs; unsigned, another
//!    key's, a signature copied from another digest and a tampered payload are each refused
//!    with their reason, and the running replicas stay.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use serde_json::Value;

use crate::sources_docker::Agent;
use crate::support::cosign::{self, Signer};
use crate::support::distribution::Distribution;
use crate::support::{DockerGuard, TempRepo, TestResult, test_image, unique, wait_until};

const LIMIT: Duration = Duration::from_secs(120);
const AGENT: &str = env!("CARGO_BIN_EXE_voodu-agent");

/// The agent of this build, its ingress off and a replica ready after a second.
fn start_agent(data_dir: &Path, log: &Path, args: &[&str]) -> TestResult<Agent> {
    let mut args = args.to_vec();
    args.extend(["--no-ingress", "--ready-settle", "1s"]);
    Agent::spawn(Path::new(AGENT), data_dir, log, &args)
}

/// Prints the agent's log and the registry's when the test fails.
struct Logs<'a>(&'a Path, PathBuf, bool);

impl Drop for Logs<'_> {
    fn drop(&mut self) {
        if self.2 || std::thread::panicking() {
            eprintln!(
                "---- agent log ----\n{}\n---- registry log (tail) ----\n{}",
                std::fs::read_to_string(self.0).unwrap_or_default(),
                std::fs::read_to_string(&self.1)
                    .unwrap_or_default()
                    .lines()
                    .rev()
                    .take(40)
                    .collect::<Vec<_>>()
                    .join("\n")
            );
        }
    }
}

fn free_port() -> TestResult<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port())
}

fn cli(data_dir: &Path, args: &[&str]) -> TestResult<String> {
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

fn status(data_dir: &Path) -> TestResult<Value> {
    Ok(serde_json::from_str(&cli(
        data_dir,
        &["status", "--json"],
    )?)?)
}

fn resource<'a>(status: &'a Value, name: &str) -> &'a Value {
    status["resources"]
        .as_array()
        .and_then(|resources| resources.iter().find(|resource| resource["name"] == name))
        .unwrap_or(&Value::Null)
}

/// Builds `image` (a `host/repo:tag`) from the test image with `/version` holding `content`,
/// pushes it, removes it from the host; the manifest digest the registry took.
fn push(registry: &Distribution, image: &str, content: &str) -> TestResult<String> {
    let context = tempfile::tempdir()?;
    std::fs::write(context.path().join("version"), content)?;
    std::fs::write(
        context.path().join("Dockerfile"),
        format!("FROM {}\nCOPY version /version\n", test_image()),
    )?;
    let context_path = context.path().display().to_string();
    registry.docker(&["build", "-q", "-t", image, &context_path], None)?;
    registry.docker(&["push", "-q", image], None)?;
    let digests = registry.docker(
        &[
            "image",
            "inspect",
            "--format",
            "{{json .RepoDigests}}",
            image,
        ],
        None,
    )?;
    let digests: Vec<String> = serde_json::from_str(&digests)?;
    let digest = digests
        .iter()
        .find_map(|reference| {
            reference
                .split_once('@')
                .map(|(_, digest)| digest.to_owned())
        })
        .ok_or("the push recorded no digest")?;
    forget(registry, image)?;
    Ok(digest)
}

/// Removes every local copy of `image`'s repository (tags and digests): the host lost it.
fn forget(registry: &Distribution, image: &str) -> TestResult {
    let repository = image
        .rsplit_once(':')
        .map_or(image, |(repository, _)| repository);
    let ids = registry.docker(
        &[
            "images",
            "-q",
            "--no-trunc",
            "--filter",
            &format!("reference={repository}*"),
        ],
        None,
    )?;
    let ids: Vec<&str> = ids.split_whitespace().collect();
    if !ids.is_empty() {
        let mut args = vec!["rmi", "-f"];
        args.extend(ids);
        // An image a container still uses keeps its layers; its names go all the same.
        let _ = registry.docker(&args, None);
    }
    Ok(())
}

/// The images the running replicas of `scope/web` were created from, sorted.
fn running_images(scope: &str) -> TestResult<Vec<String>> {
    let output = Command::new("docker")
        .args([
            "ps",
            "--filter",
            &format!("label=voodu.scope={scope}"),
            "--filter",
            "label=voodu.role=deployment",
            "--format",
            "{{.ID}}",
        ])
        .output()?;
    let mut images = Vec::new();
    for id in String::from_utf8(output.stdout)?.split_whitespace() {
        let image = Command::new("docker")
            .args(["inspect", "--format", "{{.Config.Image}}", id])
            .output()?;
        images.push(String::from_utf8(image.stdout)?.trim().to_owned());
    }
    images.sort();
    Ok(images)
}

/// Waits until exactly `n` replicas run, every one from `image`.
fn runs(scope: &str, n: usize, image: &str) -> TestResult<Vec<String>> {
    wait_until(LIMIT, &format!("{n} replicas of {image}"), || {
        let images = running_images(scope).ok()?;
        (images.len() == n && images.iter().all(|found| found == image)).then_some(images)
    })
}

fn manifest_requests(registry: &Distribution) -> TestResult<usize> {
    Ok(std::fs::read_to_string(registry.log())?
        .lines()
        .filter(|line| {
            line.contains("/manifests/") && line.contains("\"HEAD ")
                || line.contains("/manifests/") && line.contains("\"GET ")
        })
        .count())
}

fn app(scope: &str, image: &str, replicas: u32, v: &str) -> String {
    format!(
        "deployment \"{scope}\" \"web\" {{\n  image    = \"{image}\"\n  command  = [\"sleep\", \"3600\"]\n  replicas = {replicas}\n  env      = {{ V = \"{v}\" }}\n}}\n"
    )
}

fn registry_block(host: &str) -> String {
    format!(
        "registry \"test\" {{\n  url      = \"{host}\"\n  username = \"bot\"\n  token    = \"s3cret-pw\"\n}}\n"
    )
}

#[test]
#[ignore = "needs a Docker engine and Debian's docker-registry: scripts/test runs it"]
fn i48_every_replica_of_a_release_runs_the_digest_it_resolved() -> TestResult {
    let scope = unique("dg");
    let _guard = DockerGuard::new(&scope);
    let agent_port = free_port()?;
    let hook = format!("http://127.0.0.1:{agent_port}/hooks/registry");
    let registry = Distribution::start_notifying("bot", "s3cret-pw", Some((&hook, "unused")))?;
    let host = registry.host();
    let image = format!("{host}/{scope}/app:stable");
    let pinned = |digest: &str| format!("{host}/{scope}/app@{digest}");
    let digest_a = push(&registry, &image, "A")?;
    let repo = TempRepo::new()?;
    repo.write("registry.hcl", &registry_block(&host))?;
    repo.write("app.hcl", &app(&scope, &image, 2, "1"))?;
    let first = repo.commit("app on :stable")?;
    let dir = tempfile::tempdir()?;
    let (data_dir, log) = (dir.path().join("data"), dir.path().join("agent.log"));
    let listen = format!("127.0.0.1:{agent_port}");
    let args = [
        "--repo",
        &repo.url(),
        "--listen",
        &listen,
        "--allow-url-host",
        "127.0.0.1",
    ];
    let mut logs = Logs(&log, registry.log(), false);
    let mut agent = Some(start_agent(&data_dir, &log, &args)?);
    let sync = |repo: &TempRepo, sha: &str| -> TestResult {
        let body = serde_json::json!({ "ref": "refs/heads/main", "after": sha }).to_string();
        let (code, answer) = crate::sources_docker::post_hook(
            &listen,
            "/hooks/git?wait=true",
            &[],
            body.as_bytes(),
        )?;
        if code != 200 {
            return Err(format!("sync of {sha}: {code} {answer:#}").into());
        }
        let _ = repo;
        Ok(())
    };
    let ready = || {
        wait_until(LIMIT, "the release to succeed", || {
            let status = status(&data_dir).ok()?;
            let web = resource(&status, "web");
            (web["phase"] == "Ready" && web["release"]["phase"] == "succeeded").then_some(())
        })
    };
    let mut scenario = || -> TestResult {
        runs(&scope, 2, &pinned(&digest_a))?;
        ready()?;
        let status_1 = status(&data_dir)?;
        let release_1 = resource(&status_1, "web")["release"]["id"]
            .as_i64()
            .ok_or("a release")?;
        let releases = cli(&data_dir, &["releases", &format!("{scope}/web")])?;
        assert!(
            releases.contains(&digest_a["sha256:".len()..][..12]),
            "{releases}"
        );

        // The tag moves; the registry tells the agent, which looks at the tag at once.
        let digest_b = push(&registry, &image, "B")?;
        assert_ne!(digest_a, digest_b);
        let moved = wait_until(LIMIT, "status to say the tag moved", || {
            let status = status(&data_dir).ok()?;
            let moved = resource(&status, "web")["release"]["images"]["moved"]
                .as_array()?
                .first()?
                .clone();
            Some(moved)
        })?;
        assert_eq!(moved["current"], digest_b.as_str(), "{moved:#}");
        assert_eq!(moved["recorded"], digest_a.as_str(), "{moved:#}");
        let text = cli(&data_dir, &["status"])?;
        assert!(text.contains("tag") && text.contains("moved"), "{text}");
        forget(&registry, &image)?;

        // 1. A scale-up: A.
        repo.write("app.hcl", &app(&scope, &image, 3, "1"))?;
        let scaled = repo.commit("three replicas")?;
        sync(&repo, &scaled)?;
        runs(&scope, 3, &pinned(&digest_a))?;
        // 2. A replica removed by hand, after the host lost the image again: A.
        forget(&registry, &image)?;
        let ids = Command::new("docker")
            .args([
                "ps",
                "-q",
                "--filter",
                &format!("label=voodu.scope={scope}"),
            ])
            .output()?;
        let first_id = String::from_utf8(ids.stdout)?
            .split_whitespace()
            .next()
            .ok_or("a replica")?
            .to_owned();
        Command::new("docker")
            .args(["rm", "-f", &first_id])
            .output()?;
        runs(&scope, 3, &pinned(&digest_a))?;
        // 3. An agent restart after `docker rmi`, a replica gone meanwhile: A.
        agent.take().ok_or("the agent")?.stop()?;
        forget(&registry, &image)?;
        let ids = Command::new("docker")
            .args([
                "ps",
                "-q",
                "--filter",
                &format!("label=voodu.scope={scope}"),
            ])
            .output()?;
        let one = String::from_utf8(ids.stdout)?
            .split_whitespace()
            .next()
            .ok_or("a replica")?
            .to_owned();
        Command::new("docker").args(["rm", "-f", &one]).output()?;
        agent = Some(start_agent(&data_dir, &log, &args)?);
        runs(&scope, 3, &pinned(&digest_a))?;
        ready()?;

        // A spec change resolves anew: B. The registry's requests for the rollout.
        let before = manifest_requests(&registry)?;
        repo.write("app.hcl", &app(&scope, &image, 3, "2"))?;
        let changed = repo.commit("V=2")?;
        sync(&repo, &changed)?;
        runs(&scope, 3, &pinned(&digest_b))?;
        ready()?;
        let requests = manifest_requests(&registry)? - before;
        println!("registry manifest requests for a rollout of 3 replicas: {requests}");
        assert!(
            requests <= 3,
            "{requests} manifest requests for one rollout"
        );

        // `rollback --release 1`: A (release 1 had 2 replicas).
        cli(
            &data_dir,
            &[
                "rollback",
                &format!("{scope}/web"),
                "--release",
                &release_1.to_string(),
            ],
        )?;
        runs(&scope, 2, &pinned(&digest_a))?;
        cli(&data_dir, &["unpin", &format!("{scope}/web")])?;
        runs(&scope, 3, &pinned(&digest_b))?;
        // `git revert` of the spec change: the first spec's release ran A, so A.
        let reverted = repo.revert(&changed)?;
        sync(&repo, &reverted)?;
        runs(&scope, 3, &pinned(&digest_a))?;
        assert_ne!(first, reverted);
        Ok(())
    };
    let result = scenario();
    logs.2 = result.is_err();
    if let Some(agent) = agent {
        agent.stop()?;
    }
    result
}

/// How a refused case signs its image's digest.
type SignAs<'a> = Box<dyn Fn(&str) -> TestResult + 'a>;

#[test]
#[ignore = "needs a Docker engine and Debian's docker-registry: scripts/test runs it"]
fn i48_only_a_digest_signed_by_a_trusted_key_runs() -> TestResult {
    let scope = unique("sg");
    let _guard = DockerGuard::new(&scope);
    let registry = Distribution::start("bot", "s3cret-pw")?;
    let host = registry.host();
    let name = format!("{scope}/app");
    let signer = Signer::new(7)?;
    let stranger = Signer::new(9)?;
    let dir = tempfile::tempdir()?;
    let key_file = dir.path().join("cosign.pub");
    std::fs::write(&key_file, signer.public_pem())?;
    let push_registry = cosign::Registry {
        host: &host,
        username: "bot",
        password: "s3cret-pw",
    };
    // v1: signed by the trusted key.
    let v1 = format!("{host}/{name}:v1");
    let digest_1 = push(&registry, &v1, "1")?;
    let repository = format!("{host}/{name}");
    let payload_1 = cosign::payload(&repository, &digest_1);
    push_registry.push_signatures(
        &name,
        &digest_1,
        &[(payload_1.clone(), signer.sign(&payload_1))],
    )?;
    let repo = TempRepo::new()?;
    repo.write("registry.hcl", &registry_block(&host))?;
    repo.write("app.hcl", &app(&scope, &v1, 2, "1"))?;
    repo.commit("v1")?;
    let (data_dir, log) = (dir.path().join("data"), dir.path().join("agent.log"));
    let listen_port = free_port()?;
    let listen = format!("127.0.0.1:{listen_port}");
    let rule = format!("{host}/{scope}/*={}", key_file.display());
    let args = [
        "--repo",
        &repo.url(),
        "--listen",
        &listen,
        "--allow-url-host",
        "127.0.0.1",
        "--require-signature",
        &rule,
    ];
    let mut logs = Logs(&log, registry.log(), false);
    let agent = start_agent(&data_dir, &log, &args)?;
    let scenario = || -> TestResult {
        let signed = runs(&scope, 2, &format!("{repository}@{digest_1}"))?;
        // Each refused case: a new image (its own digest), signed as the case says.
        let cases: Vec<(&str, SignAs<'_>, &str)> = vec![
            (
                "unsigned",
                Box::new(|_: &str| Ok(())),
                "no cosign signature",
            ),
            (
                "another key",
                Box::new(|digest: &str| {
                    let payload = cosign::payload(&repository, digest);
                    push_registry.push_signatures(
                        &name,
                        digest,
                        &[(payload.clone(), stranger.sign(&payload))],
                    )
                }),
                "verify under none of the trusted keys",
            ),
            (
                "a replayed signature",
                Box::new(|digest: &str| {
                    push_registry.push_signatures(
                        &name,
                        digest,
                        &[(payload_1.clone(), signer.sign(&payload_1))],
                    )
                }),
                "names another image",
            ),
            (
                "a tampered payload",
                Box::new(|digest: &str| {
                    let payload = cosign::payload(&repository, digest);
                    let signature = signer.sign(&payload);
                    let mut tampered = payload.clone();
                    tampered.extend_from_slice(b" ");
                    push_registry.push_signatures(&name, digest, &[(tampered, signature)])
                }),
                "verify under none of the trusted keys",
            ),
        ];
        for (index, (case, sign, reason)) in cases.iter().enumerate() {
            let tag = format!("{host}/{name}:bad{index}");
            let digest = push(&registry, &tag, &format!("bad {index}"))?;
            sign(&digest)?;
            repo.write("app.hcl", &app(&scope, &tag, 2, &format!("bad{index}")))?;
            let sha = repo.commit(case)?;
            let body = serde_json::json!({ "ref": "refs/heads/main", "after": sha }).to_string();
            crate::sources_docker::post_hook(
                &listen,
                "/hooks/git?wait=true",
                &[],
                body.as_bytes(),
            )?;
            let refused = wait_until(LIMIT, &format!("{case} refused"), || {
                let status = status(&data_dir).ok()?;
                let web = resource(&status, "web").clone();
                let about_this = web["message"]
                    .as_str()
                    .is_some_and(|message| message.contains(&tag));
                (web["reason"] == "Unverified" && about_this).then_some(web)
            })?;
            assert!(
                refused["message"]
                    .as_str()
                    .is_some_and(|message| message.contains(reason)),
                "{case}: {refused:#}"
            );
            // Nothing of the refused release was created; the signed replicas run on.
            assert_eq!(running_images(&scope)?, signed, "{case}");
        }
        let metrics = crate::support::http::get_blocking(&listen, "/metrics")?.1;
        for reason in ["no_signature", "untrusted_key", "other_digest"] {
            assert!(
                metrics.contains(&format!(
                    "voodu_image_refusals_total{{reason=\"{reason}\"}}"
                )),
                "{reason}: {metrics}"
            );
        }
        // Back to the signed spec: it runs (its verification remembered).
        repo.write("app.hcl", &app(&scope, &v1, 2, "1"))?;
        let sha = repo.commit("back to v1")?;
        let body = serde_json::json!({ "ref": "refs/heads/main", "after": sha }).to_string();
        crate::sources_docker::post_hook(&listen, "/hooks/git?wait=true", &[], body.as_bytes())?;
        wait_until(LIMIT, "the signed release Ready again", || {
            let status = status(&data_dir).ok()?;
            (resource(&status, "web")["phase"] == "Ready").then_some(())
        })?;
        Ok(())
    };
    let result = scenario();
    logs.2 = result.is_err();
    agent.stop()?;
    result
}
