//! The Docker gate and guard.
//!
//! Docker tests are `#[ignore]`d with the reason "needs a Docker engine": plain `cargo test`
//! reports them as ignored, never as passed; `scripts/test` (and CI) runs them with
//! `--include-ignored` and fails when an engine is missing. Each Docker test uses a
//! unique `voodu.scope`; `DockerGuard` removes every container with that scope on drop, then
//! every volume with that scope (statefulset claims, which the agent never removes), also
//! when the test fails.

use std::process::Command;

/// The locally built image tests run (scripts/docker-setup builds it).
pub fn test_image() -> String {
    std::env::var("VOODU_TEST_IMAGE").unwrap_or_else(|_| "voodu-busybox:latest".to_owned())
}

/// Removes every container, then every volume, labelled `voodu.scope=<scope>` when dropped.
pub struct DockerGuard {
    pub scope: String,
}

impl DockerGuard {
    pub fn new(scope: &str) -> DockerGuard {
        DockerGuard {
            scope: scope.to_owned(),
        }
    }
}

impl Drop for DockerGuard {
    fn drop(&mut self) {
        let listed = Command::new("docker")
            .args([
                "ps",
                "-aq",
                "--filter",
                &format!("label=voodu.scope={}", self.scope),
            ])
            .output();
        if let Ok(output) = listed {
            let ids: Vec<String> = String::from_utf8_lossy(&output.stdout)
                .split_whitespace()
                .map(ToOwned::to_owned)
                .collect();
            if !ids.is_empty() {
                let _ = Command::new("docker")
                    .arg("rm")
                    .arg("-f")
                    .args(&ids)
                    .output();
            }
        }
        let volumes = Command::new("docker")
            .args([
                "volume",
                "ls",
                "-q",
                "--filter",
                &format!("label=voodu.scope={}", self.scope),
            ])
            .output();
        if let Ok(output) = volumes {
            let names: Vec<String> = String::from_utf8_lossy(&output.stdout)
                .split_whitespace()
                .map(ToOwned::to_owned)
                .collect();
            if !names.is_empty() {
                let _ = Command::new("docker")
                    .args(["volume", "rm", "-f"])
                    .args(&names)
                    .output();
            }
        }
    }
}
