//! Test fixtures: real git repos in temp dirs, the Docker gate and guard, the in-process
//! `TestAgent`, HTTP helpers (client, metrics parser), and the canary tests' replicas,
//! Prometheus and steady client (`canary`).

#![allow(dead_code, unreachable_pub)]

pub mod agent;
pub mod canary;
pub mod cosign;
pub mod distribution;
pub mod docker;
pub mod harness;
pub mod http;
pub mod registry;
pub mod repo;
pub mod signing;
pub mod sops;
pub mod swarm;

pub use agent::{TestAgent, TestAgentOptions};
pub use docker::{DockerGuard, test_image};
pub use harness::Harness;
pub use http::get_blocking as get;
pub use repo::TempRepo;

use std::time::{Duration, Instant};

/// Result type of tests: `?` instead of `unwrap`.
pub type TestResult<T = ()> = Result<T, Box<dyn std::error::Error + Send + Sync>>;

/// Polls `check` (on wall-clock time) until it returns `Some`, or fails after `limit` with
/// `what`. A liveness bound, not a performance assertion.
pub fn wait_until<T>(
    limit: Duration,
    what: &str,
    mut check: impl FnMut() -> Option<T>,
) -> TestResult<T> {
    let start = Instant::now();
    loop {
        if let Some(value) = check() {
            return Ok(value);
        }
        if start.elapsed() > limit {
            return Err(format!("timed out after {limit:?} waiting for {what}").into());
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// The async `wait_until`: polls `check` every `step` of tokio time (virtual under paused
/// time) until it returns `Some`, or fails after `limit` of wall-clock time with `what`. A
/// liveness bound, not a performance assertion; callers add what they saw with `map_err`.
pub async fn until<T>(
    limit: Duration,
    step: Duration,
    what: &str,
    mut check: impl FnMut() -> TestResult<Option<T>>,
) -> TestResult<T> {
    let start = Instant::now();
    loop {
        if let Some(value) = check()? {
            return Ok(value);
        }
        if start.elapsed() > limit {
            return Err(format!("timed out after {limit:?} waiting for {what}").into());
        }
        tokio::time::sleep(step).await;
    }
}

/// Where voodu's example corpus is: `VOODU_CORPUS_DIR` as the build saw it (build.rs), else
/// `../shared/corpus` beside the checkout.
pub fn corpus_root() -> std::path::PathBuf {
    option_env!("VOODU_CORPUS_DIR").map_or_else(
        || std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../shared/corpus"),
        std::path::PathBuf::from,
    )
}

/// A unique, DNS- and container-name-safe token for scopes and names.
pub fn unique(prefix: &str) -> String {
    format!("{prefix}{}", voodu_agent::model::random_hex(4))
}

/// A state.db in `data_dir` whose applied commit (`sha_char` × 40) declares one deployment,
/// `s/web`: what the CLI tests read without an agent.
pub fn state_with_one_deployment(data_dir: &std::path::Path, sha_char: &str) -> TestResult {
    use voodu_agent::manifest;
    use voodu_agent::model::{CommitSha, Snapshot, SourceFile};
    let store = voodu_agent::store::Store::open(&data_dir.join("state.db"))?;
    let commit = CommitSha::new(sha_char.repeat(40));
    let snapshot = Snapshot {
        commit: commit.clone(),
        files: vec![SourceFile {
            path: "web.hcl".into(),
            contents: b"deployment \"s\" \"web\" {\n  image = \"busybox\"\n}\n".to_vec(),
        }],
        refused: Vec::new(),
    };
    store.apply_commit(
        &commit,
        &manifest::load(&snapshot, &manifest::LoadOptions::standalone())?,
    )?;
    Ok(())
}
