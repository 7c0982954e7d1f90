//! Test fixtures: real git repos in temp dirs, the Docker gate and guard, the in-process
//! `TestAgent`, and HTTP helpers (client, metrics parser).

#![allow(dead_code, unreachable_pub)]

pub mod agent;
pub mod docker;
pub mod harness;
pub mod http;
pub mod registry;
pub mod repo;

pub use agent::{TestAgent, TestAgentOptions};
pub use docker::{DockerGuard, test_image};
pub use harness::Harness;
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

/// A unique, DNS- and container-name-safe token for scopes and names.
pub fn unique(prefix: &str) -> String {
    format!("{prefix}{}", voodu_agent::model::random_hex(4))
}
