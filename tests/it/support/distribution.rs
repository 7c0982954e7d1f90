//! A real image registry for Docker tests: Debian's `docker-registry` (the CNCF distribution
//! registry, `/usr/bin/docker-registry`) run on `127.0.0.1:<free port>` with htpasswd auth
//! (bcrypt, from `htpasswd -Bbn`), storage in a temp dir; killed on drop. Images are pushed to
//! it with the `docker` CLI under a private `DOCKER_CONFIG`, so the login never touches the
//! user's own docker config. `scripts/docker-setup` installs the package (and apache2-utils).
//! `benches/scale.rs` includes this file too (its `support` gives `TestResult`, `get` and
//! `wait_until`).

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use super::{TestResult, get, wait_until};

pub const REGISTRY_BIN: &str = "/usr/bin/docker-registry";

/// The registry process and its files.
pub struct Distribution {
    child: Option<Child>,
    dir: tempfile::TempDir,
    port: u16,
    pub username: String,
    pub password: String,
}

impl Distribution {
    /// Starts the registry with one user; fails with what to install when the package is
    /// missing.
    pub fn start(username: &str, password: &str) -> TestResult<Distribution> {
        Distribution::start_notifying(username, password, None)
    }

    /// `start`, with the registry's notifications (`notifications: endpoints:`) posted to
    /// `notify` (`url`, bearer token) as the distribution registry sends them.
    pub fn start_notifying(
        username: &str,
        password: &str,
        notify: Option<(&str, &str)>,
    ) -> TestResult<Distribution> {
        if !Path::new(REGISTRY_BIN).exists() {
            return Err(format!(
                "{REGISTRY_BIN} is missing: `apt-get install docker-registry apache2-utils` (scripts/docker-setup does)"
            )
            .into());
        }
        let dir = tempfile::tempdir()?;
        let htpasswd = Command::new("htpasswd")
            .args(["-Bbn", username, password])
            .output()
            .map_err(|error| format!("htpasswd (apache2-utils): {error}"))?;
        if !htpasswd.status.success() {
            return Err(format!(
                "htpasswd failed: {}",
                String::from_utf8_lossy(&htpasswd.stderr)
            )
            .into());
        }
        std::fs::write(dir.path().join("htpasswd"), &htpasswd.stdout)?;
        std::fs::create_dir(dir.path().join("data"))?;
        std::fs::create_dir(dir.path().join("docker-config"))?;
        let port = TcpListener::bind("127.0.0.1:0")?.local_addr()?.port();
        let mut config = format!(
            "version: 0.1\nlog:\n  level: info\n  accesslog:\n    disabled: false\nstorage:\n  filesystem:\n    rootdirectory: {data}\n  delete:\n    enabled: true\nhttp:\n  addr: 127.0.0.1:{port}\n  secret: {secret}\nauth:\n  htpasswd:\n    realm: voodu-test\n    path: {htpasswd}\n",
            data = dir.path().join("data").display(),
            secret = voodu_agent::model::random_hex(16),
            htpasswd = dir.path().join("htpasswd").display(),
        );
        if let Some((url, token)) = notify {
            config.push_str(&format!(
                "notifications:\n  endpoints:\n    - name: voodu-agent\n      url: {url}\n      headers:\n        Authorization: [Bearer {token}]\n      timeout: 2s\n      threshold: 3\n      backoff: 1s\n      ignore:\n        actions: [pull]\n"
            ));
        }
        let config_path = dir.path().join("config.yml");
        std::fs::write(&config_path, config)?;
        let log = std::fs::File::create(dir.path().join("registry.log"))?;
        let child = Command::new(REGISTRY_BIN)
            .arg("serve")
            .arg(&config_path)
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .spawn()?;
        let mut registry = Distribution {
            child: Some(child),
            dir,
            port,
            username: username.to_owned(),
            password: password.to_owned(),
        };
        let address = format!("127.0.0.1:{port}");
        wait_until(Duration::from_secs(30), "docker-registry to answer", || {
            let (status, _) = get(&address, "/v2/").ok()?;
            (status == 401).then_some(())
        })
        .inspect_err(|_| registry.stop())?;
        registry.docker(
            &[
                "login",
                "--username",
                username,
                "--password-stdin",
                &registry.host(),
            ],
            Some(password),
        )?;
        Ok(registry)
    }

    /// `127.0.0.1:<port>`, as image names write the registry.
    pub fn host(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    /// The registry's own log (its access log included).
    pub fn log(&self) -> PathBuf {
        self.dir.path().join("registry.log")
    }

    /// Runs `docker` with this registry's private client config (its login); stdout.
    pub fn docker(&self, args: &[&str], stdin: Option<&str>) -> TestResult<String> {
        let mut command = Command::new("docker");
        command
            .args(args)
            .env("DOCKER_CONFIG", self.dir.path().join("docker-config"))
            .env("DOCKER_BUILDKIT", "0")
            .stdin(if stdin.is_some() {
                Stdio::piped()
            } else {
                Stdio::null()
            })
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let mut child = command.spawn()?;
        if let Some(text) = stdin {
            use std::io::Write as _;
            child
                .stdin
                .take()
                .ok_or("no stdin")?
                .write_all(text.as_bytes())?;
        }
        let output = child.wait_with_output()?;
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

    /// Builds `<host>/<repository>:<tag>` from `base` plus a file `/version` holding `tag`
    /// (so each tag is its own image), pushes it, and removes it from the host again (the
    /// agent must pull it).
    pub fn push_version(&self, base: &str, repository: &str, tag: &str) -> TestResult<String> {
        let context = tempfile::tempdir()?;
        std::fs::write(context.path().join("version"), tag)?;
        std::fs::write(
            context.path().join("Dockerfile"),
            format!("FROM {base}\nCOPY version /version\n"),
        )?;
        let reference = format!("{}/{repository}:{tag}", self.host());
        let context_path = context.path().display().to_string();
        self.docker(&["build", "-q", "-t", &reference, &context_path], None)?;
        self.docker(&["push", "-q", &reference], None)?;
        self.docker(&["rmi", "-f", &reference], None)?;
        Ok(reference)
    }

    /// Stops the registry (an unreachable registry from then on).
    pub fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

impl Drop for Distribution {
    fn drop(&mut self) {
        self.stop();
    }
}
