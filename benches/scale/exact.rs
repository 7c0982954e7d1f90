//! Issue 48's figures in the first-deploy bench: what resolving each release's image to its
//! digest and verifying its signature costs.
//!
//! The image is the test image pushed to Debian's `docker-registry` (htpasswd, on loopback)
//! and signed as `cosign sign --key` stores signatures. The two sides deploy the same N × M
//! replicas of it from one commit, the image removed from the host before each run so both
//! pull it once:
//! - **on**: this agent with `--require-signature` for the repository: each release resolves
//!   the tag to its manifest digest, the digest's signature is verified once (then remembered),
//!   every replica is created from the digest;
//! - **off**: `VOODU_BENCH_EXACT_OFF`, an agent without resolution (the previous release:
//!   `scripts/previous-release` builds it), creating replicas from the tag.
//!
//! The sides alternate, `VOODU_BENCH_ROUNDS` rounds each; medians and their ratio are printed,
//! with the registry's requests per side from its access log (the agent's own, by its
//! user agent, and the engine's), and the requests of one more rollout: a 10-replica
//! deployment under a fresh agent.

use std::time::Duration;

use bollard::Docker;

use super::sides::{Setup, Shape, through_agent};
use crate::support::cosign::{self, Signer};
use crate::support::distribution::Distribution;
use crate::support::{self, Result};

const USER: &str = "bench";
const PASSWORD: &str = "bench-pw";
const REPOSITORY: &str = "voodu-bench/app";

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Side {
    On,
    Off,
}

/// The registry's requests over a run, counted from its access log.
#[derive(Debug, Default, Clone, Copy)]
struct Requests {
    /// The agent's manifest requests for the image (not its signature).
    agent_manifests: usize,
    /// Requests for the signature manifest (`sha256-<hex>.sig`).
    signature_manifests: usize,
    /// The agent's blob reads (the signature payloads).
    agent_blobs: usize,
    /// The engine's manifest requests (its pull).
    engine_manifests: usize,
    /// `401` answers among them: a client's first request, before it sends its credentials
    /// (the agent and the engine alike); not counted in the figures above.
    challenges: usize,
}

impl Requests {
    fn since(registry: &Distribution, skip: usize) -> Result<Requests> {
        let log = std::fs::read_to_string(registry.log())?;
        let mut requests = Requests::default();
        for line in log.lines().skip(skip) {
            // Access log lines only: `"GET /v2/… HTTP/1.1" 200 … "user agent"`.
            let Some(request) = line.split('"').nth(1) else {
                continue;
            };
            if !request.contains(" /v2/") {
                continue;
            }
            let status = line
                .split('"')
                .nth(2)
                .and_then(|rest| rest.split_whitespace().next());
            if status == Some("401") {
                requests.challenges += 1;
                continue;
            }
            let agent = line.contains("voodu-agent/");
            let signature = request.contains("/manifests/sha256-") && request.contains(".sig");
            if signature {
                requests.signature_manifests += 1;
            } else if request.contains("/manifests/") {
                if agent {
                    requests.agent_manifests += 1;
                } else {
                    requests.engine_manifests += 1;
                }
            } else if agent && request.contains("/blobs/") {
                requests.agent_blobs += 1;
            }
        }
        Ok(requests)
    }
}

fn log_lines(registry: &Distribution) -> Result<usize> {
    Ok(std::fs::read_to_string(registry.log())?.lines().count())
}

/// Builds the bench image from `base`, pushes it as `<host>/voodu-bench/app:stable`, removes
/// it from the host; its manifest digest.
fn push(registry: &Distribution, base: &str, image: &str) -> Result<String> {
    let context = tempfile::tempdir()?;
    std::fs::write(
        context.path().join("Dockerfile"),
        format!("FROM {base}\nLABEL voodu.bench=exact\n"),
    )?;
    let context_path = support::path_str(context.path())?.to_owned();
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
    forget(registry, image, &digest);
    Ok(digest)
}

/// Removes the host's copy of the image (by tag and by digest), so the next side pulls it.
fn forget(registry: &Distribution, image: &str, digest: &str) {
    let repository = image.rsplit_once(':').map_or(image, |(name, _)| name);
    // Absent names fail; that is the state wanted.
    let _ = registry.docker(&["rmi", "-f", image], None);
    let _ = registry.docker(&["rmi", "-f", &format!("{repository}@{digest}")], None);
}

/// The registry with the signed image, and the key that verifies it.
struct Prepared {
    registry: Distribution,
    image: String,
    digest: String,
    key: std::path::PathBuf,
    _keys: tempfile::TempDir,
}

/// Starts the registry, pushes the image built from `base` and signs its digest (blocking:
/// the signature helper's client is reqwest's blocking one).
fn prepare(base: &str) -> Result<Prepared> {
    let registry = Distribution::start(USER, PASSWORD)?;
    let host = registry.host();
    let image = format!("{host}/{REPOSITORY}:stable");
    let digest = push(&registry, base, &image)?;
    let signer = Signer::new(1)?;
    let payload = cosign::payload(&format!("{host}/{REPOSITORY}"), &digest);
    cosign::Registry {
        host: &host,
        username: USER,
        password: PASSWORD,
    }
    .push_signatures(
        REPOSITORY,
        &digest,
        &[(payload.clone(), signer.sign(&payload))],
    )?;
    let keys = tempfile::tempdir()?;
    let key = keys.path().join("cosign.pub");
    std::fs::write(&key, signer.public_pem())?;
    Ok(Prepared {
        registry,
        image,
        digest,
        key,
        _keys: keys,
    })
}

/// Runs the comparison; `off` is the agent binary without resolution.
pub(crate) async fn compare(docker: &Docker, base: &str, shape: &Shape, off: &str) -> Result {
    let base_image = base.to_owned();
    let prepared = tokio::task::spawn_blocking(move || prepare(&base_image)).await??;
    let (registry, image, digest, key) = (
        &prepared.registry,
        &prepared.image,
        &prepared.digest,
        &prepared.key,
    );
    let host = registry.host();
    let registry_block = format!(
        "registry \"bench\" {{\n  url      = \"{host}\"\n  username = \"{USER}\"\n  token    = \"{PASSWORD}\"\n}}\n"
    );
    let files = vec![("registry.hcl".to_owned(), registry_block)];
    let loopback = ["--allow-url-host".to_owned(), "127.0.0.1".to_owned()];
    let setup = |side: Side| match side {
        Side::On => Setup {
            bin: None,
            args: loopback
                .iter()
                .cloned()
                .chain([
                    "--require-signature".to_owned(),
                    format!("{host}/voodu-bench/*={}", key.display()),
                ])
                .collect(),
            files: files.clone(),
            probe: 0,
        },
        Side::Off => Setup {
            bin: Some(off.to_owned()),
            args: loopback.to_vec(),
            files: files.clone(),
            probe: 0,
        },
    };
    println!(
        "exact: {} deployments x {} replicas of {image} ({digest}); on: this agent, resolving and verifying; off: {off}; {} rounds per side, alternated",
        shape.deployments, shape.replicas, shape.rounds
    );
    let mut on = Vec::new();
    let mut off_runs = Vec::new();
    let mut requests_on = Vec::new();
    let mut requests_off = Vec::new();
    for round in 0..shape.rounds {
        let order = if round % 2 == 0 {
            [Side::On, Side::Off]
        } else {
            [Side::Off, Side::On]
        };
        for side in order {
            forget(registry, image, digest);
            let settled = support::settle(Duration::from_secs(120)).await?;
            let skip = log_lines(registry)?;
            let figures = through_agent(docker, image, shape, false, &setup(side)).await?;
            let requests = Requests::since(registry, skip)?;
            println!(
                "round {}, {side:?} (machine quiet after {:.1} s): {} running after {:.1} s; registry: agent {} manifest, {} signature manifest, {} blob requests; engine {} manifest requests; {} 401 challenges",
                round + 1,
                settled.as_secs_f64(),
                shape.containers(),
                figures.running.as_secs_f64(),
                requests.agent_manifests,
                requests.signature_manifests,
                requests.agent_blobs,
                requests.engine_manifests,
                requests.challenges,
            );
            match side {
                Side::On => {
                    on.push(figures.running);
                    requests_on.push(requests);
                }
                Side::Off => {
                    off_runs.push(figures.running);
                    requests_off.push(requests);
                }
            }
        }
    }

    // One more rollout under a fresh agent (nothing verified yet): a 10-replica deployment.
    forget(registry, image, digest);
    let ten = Shape {
        deployments: 1,
        replicas: 10,
        ..*shape
    };
    let skip = log_lines(registry)?;
    through_agent(docker, image, &ten, false, &setup(Side::On)).await?;
    let rollout = Requests::since(registry, skip)?;

    let median_on = support::median(&mut on);
    let median_off = support::median(&mut off_runs);
    let runs = |values: &[Duration]| {
        values
            .iter()
            .map(|value| format!("{:.1}", value.as_secs_f64()))
            .collect::<Vec<_>>()
            .join(", ")
    };
    println!();
    println!("runs (s): on {}; off {}", runs(&on), runs(&off_runs));
    let first = |requests: &[Requests]| requests.first().copied().unwrap_or_default();
    let (first_on, first_off) = (first(&requests_on), first(&requests_off));
    println!(
        "| figure (medians of {} rounds per side, alternated) | measured | goal |",
        shape.rounds
    );
    println!("|---|---|---|");
    println!(
        "| {} replicas ({} deployments) running from a registry image, resolution and signature verification on / off | {:.1} s / {:.1} s = {:.3} | ≤ 1.02 |",
        shape.containers(),
        shape.deployments,
        median_on.as_secs_f64(),
        median_off.as_secs_f64(),
        median_on.as_secs_f64() / median_off.as_secs_f64()
    );
    println!(
        "| registry requests for the {} rollouts, on (first round): the agent's manifest / signature manifest / blob; the engine's manifest | {} / {} / {}; {} | the engine's pull resolves (one manifest per release), one signature lookup |",
        shape.deployments,
        first_on.agent_manifests,
        first_on.signature_manifests,
        first_on.agent_blobs,
        first_on.engine_manifests
    );
    println!(
        "| the same, off (first round) | {} / {} / {}; {} | |",
        first_off.agent_manifests,
        first_off.signature_manifests,
        first_off.agent_blobs,
        first_off.engine_manifests
    );
    println!(
        "| one rollout of a 10-replica deployment, fresh agent: the agent's manifest / signature manifest / blob; the engine's manifest | {} / {} / {}; {} | 0 / 1 / 1; the engine's one pull, as off |",
        rollout.agent_manifests,
        rollout.signature_manifests,
        rollout.agent_blobs,
        rollout.engine_manifests
    );
    if !support::measuring() {
        println!("(smoke run of the bench; these figures are not a measurement)");
    }
    Ok(())
}
