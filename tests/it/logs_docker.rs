//! Issue 53, acceptance 2: `voodu-agent logs -f` against the real binary on a real engine.
//! Across a rolling update the new replicas join the stream and the old ones leave (busybox
//! replicas printing their version in a loop); and a client reading a log stream one byte a
//! second is cut by the agent while the agent's memory stays bounded although the container
//! it reads writes megabytes a second; with the agent stopped, `logs` reads the engine.

use std::io::{BufRead as _, BufReader, Read as _, Write as _};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::e2e_docker::AGENT;
use crate::sources_docker::{Agent, LogOnFailure, status};
use crate::support::{DockerGuard, TempRepo, TestResult, test_image, unique, wait_until};

const LIMIT: Duration = Duration::from_secs(120);

/// A deployment of two replicas printing `version <v> <hostname>` twice a second.
fn versioned(scope: &str, version: &str) -> String {
    format!(
        r#"deployment "{scope}" "web" {{
  image    = "{image}"
  command  = ["sh", "-c", "while true; do echo \"version $V $(hostname)\"; sleep 0.5; done"]
  replicas = 2
  env      = {{ V = "{version}" }}
}}
"#,
        image = test_image()
    )
}

/// A deployment printing numbered 1 KB lines (`<n> 000…`), 200 of them every 50 ms.
fn fast(scope: &str) -> String {
    format!(
        r#"deployment "{scope}" "fast" {{
  image    = "{image}"
  command  = ["sh", "-c", "L=$(printf '%01000d' 0); n=0; while true; do i=0; while [ $i -lt 200 ]; do n=$((n+1)); echo \"$n $L\"; i=$((i+1)); done; sleep 0.05; done"]
  replicas = 1
}}
"#,
        image = test_image()
    )
}

/// `voodu-agent logs ARGS` running, its stdout lines collected as they come.
struct Following {
    child: Child,
    lines: Arc<Mutex<Vec<String>>>,
}

impl Following {
    fn start(data_dir: &Path, args: &[&str]) -> TestResult<Following> {
        let mut child = Command::new(AGENT)
            .arg("logs")
            .args(args)
            .arg("--data-dir")
            .arg(data_dir)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()?;
        let stdout = child.stdout.take().ok_or("no stdout")?;
        let lines = Arc::new(Mutex::new(Vec::new()));
        let sink = lines.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                sink.lock().map(|mut lines| lines.push(line)).ok();
            }
        });
        Ok(Following { child, lines })
    }

    fn lines(&self) -> Vec<String> {
        self.lines
            .lock()
            .map(|lines| lines.clone())
            .unwrap_or_default()
    }
}

impl Drop for Following {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The container names (the prefixes) that printed `version <v>`.
fn printers(lines: &[String], version: &str) -> std::collections::BTreeSet<String> {
    let wanted = format!("version {version} ");
    lines
        .iter()
        .filter_map(|line| {
            let (source, text) = line.split_once(" | ")?;
            text.starts_with(&wanted).then(|| source.to_owned())
        })
        .collect()
}

/// `VmRSS` (or another `Vm…` field) of process `pid`, in KiB.
fn vm_kib(pid: u32, field: &str) -> TestResult<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    let line = status
        .lines()
        .find(|line| line.starts_with(&format!("{field}:")))
        .ok_or_else(|| format!("no {field} in /proc/{pid}/status"))?;
    Ok(line.split_whitespace().nth(1).ok_or("no value")?.parse()?)
}

/// The state (`/proc/net/tcp` code: 01 established) of the TCP connection from local port
/// `local` to remote port `remote`; `None` when the kernel holds no such socket.
fn tcp_state(local: u16, remote: u16) -> Option<String> {
    let wanted = (format!(":{local:04X}"), format!(":{remote:04X}"));
    ["/proc/net/tcp", "/proc/net/tcp6"]
        .iter()
        .find_map(|table| {
            let text = std::fs::read_to_string(table).ok()?;
            text.lines().skip(1).find_map(|row| {
                let fields: Vec<&str> = row.split_whitespace().collect();
                let (local_address, remote_address, state) =
                    (fields.get(1)?, fields.get(2)?, fields.get(3)?);
                (local_address.ends_with(&wanted.0) && remote_address.ends_with(&wanted.1))
                    .then(|| (*state).to_owned())
            })
        })
}

/// The bytes the fast printer `container` wrote so far (at least 1000 a line: its last
/// line's number, times 1000; the engine's own log file rotates, its size tells nothing).
fn printed_bytes(container: &str) -> TestResult<u64> {
    let output = Command::new("docker")
        .args(["logs", "--tail", "1", container])
        .output()?;
    let text = String::from_utf8(output.stdout)?;
    let number: u64 = text
        .split_whitespace()
        .next()
        .ok_or("the printer printed nothing")?
        .parse()?;
    Ok(number * 1000)
}

#[test]
#[ignore = "needs a Docker engine: scripts/test runs it (cargo test -- --include-ignored)"]
fn i53_logs_follow_a_rolling_update_and_a_slow_client_is_cut_with_bounded_memory() -> TestResult {
    let scope = unique("logs");
    let _guard = DockerGuard::new(&scope);
    let repo = TempRepo::new()?;
    repo.write("web.hcl", &versioned(&scope, "one"))?;
    repo.write("fast.hcl", &fast(&scope))?;
    let first = repo.commit("v1")?;
    let dir = tempfile::tempdir()?;
    let (data_dir, log) = (dir.path().join("data"), dir.path().join("agent.log"));
    let url = repo.url();
    let agent = Agent::start(&data_dir, &log, &["--repo", &url])?;
    let _failed = LogOnFailure(&log, false);
    wait_until(LIMIT, "the first commit applied", || {
        (status(&data_dir).ok()?["last_applied"]["sha"] == first.as_str()).then_some(())
    })?;

    // Both replicas of version one, interleaved in one stream, each named.
    let following = Following::start(&data_dir, &[&format!("{scope}/web"), "-f", "--tail", "5"])?;
    let old = wait_until(LIMIT, "both replicas of version one in the stream", || {
        let old = printers(&following.lines(), "one");
        (old.len() == 2).then_some(old)
    })?;

    // A rolling update: the new replicas join, the old ones leave.
    repo.write("web.hcl", &versioned(&scope, "two"))?;
    let second = repo.commit("v2")?;
    let nudged = Command::new(AGENT)
        .args(["sync", "--data-dir"])
        .arg(&data_dir)
        .output()?;
    assert!(nudged.status.success(), "{nudged:?}");
    let new = wait_until(LIMIT, "both replicas of version two in the stream", || {
        let new = printers(&following.lines(), "two");
        (new.len() == 2).then_some(new)
    })?;
    assert!(
        new.is_disjoint(&old),
        "new containers: {new:?}, old: {old:?}"
    );
    wait_until(LIMIT, "the old replicas left the stream", || {
        let lines = following.lines();
        old.iter()
            .all(|name| lines.contains(&format!("-- {name} left")))
            .then_some(())
    })?;
    let lines = following.lines();
    for name in &new {
        assert!(
            lines.contains(&format!("-- {name} joined")),
            "{name}: {lines:#?}"
        );
    }
    for name in &old {
        let left = lines
            .iter()
            .position(|line| line == &format!("-- {name} left"))
            .ok_or("no left note")?;
        assert!(
            !lines[left..]
                .iter()
                .any(|line| line.starts_with(&format!("{name} | "))),
            "{name} printed after it left: {lines:#?}"
        );
    }
    assert_eq!(
        status(&data_dir)?["last_applied"]["sha"],
        second.as_str(),
        "the update was applied"
    );
    drop(following);

    // A client reading one byte a second. Its connection is cut by the agent, and the
    // agent's resident memory grows less than BOUND meanwhile, although the container it
    // streams writes more than twice BOUND in that time (measured below): an agent that
    // buffered what the client does not take would grow by about what the container wrote.
    const BOUND_KIB: u64 = 24 * 1024;
    let fast_container = wait_until(LIMIT, "the fast printer running", || {
        let output = Command::new("docker")
            .args([
                "ps",
                "-q",
                "--filter",
                &format!("label=voodu.scope={scope}"),
            ])
            .args(["--filter", "label=voodu.name=fast"])
            .output()
            .ok()?;
        let id = String::from_utf8(output.stdout).ok()?.trim().to_owned();
        (!id.is_empty()).then_some(id)
    })?;
    let store = voodu_agent::store::Store::open_read_only(&data_dir.join("state.db"))?;
    let address = store.meta("http_addr")?.ok_or("no http address recorded")?;
    let agent_port: u16 = address.rsplit(':').next().ok_or("no port")?.parse()?;
    // Warm: one full-speed stream read to its end first, so the allocator's pools exist.
    {
        let mut warm = std::net::TcpStream::connect(("127.0.0.1", agent_port))?;
        write!(
            warm,
            "GET /logs/{scope}/fast?tail=2000 HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
        )?;
        let mut sink = Vec::new();
        warm.read_to_end(&mut sink)?;
    }
    let pid = agent.pid();
    let rss_before = vm_kib(pid, "VmRSS")?;
    let written_before = printed_bytes(&fast_container)?;
    let mut slow = std::net::TcpStream::connect(("127.0.0.1", agent_port))?;
    let client_port = slow.local_addr()?.port();
    write!(
        slow,
        "GET /logs/{scope}/fast?follow=true HTTP/1.1\r\nHost: x\r\n\r\n"
    )?;
    slow.set_read_timeout(Some(Duration::from_secs(2)))?;
    let started = Instant::now();
    let mut rss_peak = rss_before;
    let mut byte = [0u8; 1];
    let cut = loop {
        let _ = slow.read(&mut byte);
        rss_peak = rss_peak.max(vm_kib(pid, "VmRSS")?);
        // The agent closed its side: its socket left ESTABLISHED (FIN_WAIT, or gone).
        if tcp_state(agent_port, client_port).is_none_or(|state| state != "01") {
            break started.elapsed();
        }
        assert!(
            started.elapsed() < LIMIT,
            "the agent did not cut a client reading 1 byte a second within {LIMIT:?}"
        );
        std::thread::sleep(Duration::from_secs(1));
    };
    let written = printed_bytes(&fast_container)? - written_before;
    let grown = rss_peak.saturating_sub(rss_before);
    eprintln!(
        "slow client cut after {cut:?}; the container wrote {} KiB meanwhile; agent RSS {rss_before} KiB, peak {rss_peak} KiB",
        written / 1024
    );
    assert!(
        written / 1024 > 2 * BOUND_KIB,
        "the container wrote only {} KiB while the client was slow: the bound would not tell buffering from none",
        written / 1024
    );
    assert!(
        grown < BOUND_KIB,
        "the agent's RSS grew by {grown} KiB (bound {BOUND_KIB} KiB) while a client read 1 byte a second"
    );
    // And the agent still serves.
    assert!(status(&data_dir).is_ok());
    drop(slow);
    agent.stop()?;

    // With no agent answering, `logs` reads the engine itself, through the same code.
    let offline = Command::new(AGENT)
        .args(["logs", &format!("{scope}/web"), "--tail", "1"])
        .args(["--agent", "127.0.0.1:9", "--data-dir"])
        .arg(&data_dir)
        .output()?;
    assert!(offline.status.success(), "{offline:?}");
    let lines: Vec<String> = String::from_utf8(offline.stdout)?
        .lines()
        .map(str::to_owned)
        .collect();
    assert_eq!(printers(&lines, "two"), new, "{lines:#?}");
    Ok(())
}
