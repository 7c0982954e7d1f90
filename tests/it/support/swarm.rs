//! `SwarmGuard`: a single-node swarm on the shared test engine, for the Docker Swarm tests.
//!
//! The engine is shared with every other Docker test (CI runs them in one process, two at a
//! time) and with other processes: a guard takes an exclusive `flock` on one lock file, so
//! two swarm tests never init or leave at once, whichever process runs them; inits the swarm
//! (`docker swarm init --advertise-addr 127.0.0.1`) only when the engine is in none; and on
//! drop removes the services and configs labelled with its scope, then leaves the swarm only
//! if it initialised it. Ordinary container tests keep working while the engine is a swarm
//! member (`contract.rs` checks that under a guard).

use std::os::fd::AsRawFd as _;
use std::process::Command;

use super::TestResult;

/// The lock file every swarm test of every process takes.
const LOCK_FILE: &str = "/tmp/voodu-agent-swarm-tests.lock";

pub struct SwarmGuard {
    pub scope: String,
    initialised: bool,
    /// Holds the lock until dropped (closing the file releases it).
    _lock: std::fs::File,
}

/// `docker swarm …` (or any docker command): stdout, or an error with stderr.
pub fn docker(args: &[&str]) -> TestResult<String> {
    let output = Command::new("docker").args(args).output()?;
    if !output.status.success() {
        return Err(format!(
            "docker {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&output.stderr).trim()
        )
        .into());
    }
    Ok(String::from_utf8(output.stdout)?.trim().to_owned())
}

/// The engine's swarm state: `inactive`, `active`, `pending`, `error`, `locked`.
pub fn swarm_state() -> TestResult<String> {
    docker(&["info", "--format", "{{.Swarm.LocalNodeState}}"])
}

impl SwarmGuard {
    /// Waits for the lock, then makes the engine a single-node swarm manager if it is in no
    /// swarm.
    pub fn new(scope: &str) -> TestResult<SwarmGuard> {
        let lock = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(LOCK_FILE)?;
        // SAFETY: flock on a descriptor this function owns; blocks until the lock is free.
        let locked = unsafe { libc::flock(lock.as_raw_fd(), libc::LOCK_EX) };
        if locked != 0 {
            return Err(format!(
                "cannot lock {LOCK_FILE}: {}",
                std::io::Error::last_os_error()
            )
            .into());
        }
        let state = swarm_state()?;
        let initialised = match state.as_str() {
            "inactive" => {
                docker(&["swarm", "init", "--advertise-addr", "127.0.0.1"])?;
                true
            }
            "active" => false,
            other => return Err(format!("the engine's swarm is {other}; cannot test on it").into()),
        };
        Ok(SwarmGuard {
            scope: scope.to_owned(),
            initialised,
            _lock: lock,
        })
    }
}

impl Drop for SwarmGuard {
    fn drop(&mut self) {
        let filter = format!("label=voodu.scope={}", self.scope);
        for (list, remove) in [
            (["service", "ls", "-q"], ["service", "rm"]),
            (["config", "ls", "-q"], ["config", "rm"]),
        ] {
            let ids = docker(&[list[0], list[1], list[2], "--filter", &filter]).unwrap_or_default();
            let ids: Vec<&str> = ids.split_whitespace().collect();
            if !ids.is_empty() {
                let mut args = vec![remove[0], remove[1]];
                args.extend(ids);
                let _ = docker(&args);
            }
        }
        if self.initialised {
            let _ = docker(&["swarm", "leave", "--force"]);
        }
    }
}
