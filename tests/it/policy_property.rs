//! Issue 23: a seeded property test of the host policy end to end. It generates manifests
//! whose bind sources mix `${asset…}` references, `..`, `.`, `//`, system directories, the
//! agent's data dir and symlinks planted under an allowed root (one to `/etc`), and whose
//! `docker_options`, networks and capabilities mix allowed and forbidden values; runs each
//! through load (the manifest stage, under the policy) → the requests the handlers would send
//! (`reconcile::requests`) → the sink (`Guarded` over the fake runtime, symlinks resolved on
//! this host); and checks every request that reached the engine against an independent
//! oracle of the policy. No accepted request may violate it.
//!
//! `VOODU_POLICY_SEED` and `VOODU_POLICY_CASES` choose the run (the seed is printed).

use std::path::{Path, PathBuf};
use std::sync::Arc;

use voodu_agent::manifest::{self, LoadOptions};
use voodu_agent::model::policy::{ASSETS_DIR, OwnedPaths};
use voodu_agent::model::scopes::Ownership;
use voodu_agent::model::{CommitSha, Policy, Snapshot, SourceFile};
use voodu_agent::reconcile::requests::container_requests;
use voodu_agent::runtime::{ContainerSpec, Containers, Error, FakeRuntime, Guarded, Rules};

use crate::support::TestResult;

/// xorshift64*: small, seeded, the same sequence everywhere.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    fn below(&mut self, n: usize) -> usize {
        usize::try_from(self.next() % n as u64).unwrap_or(0)
    }

    fn pick<'a>(&mut self, items: &[&'a str]) -> &'a str {
        items[self.below(items.len())]
    }
}

/// The host the cases run against: a data dir, an allowed bind root holding a plain
/// directory and symlinks (to `/etc`, to the data dir, to a directory inside the root, and one
/// leading nowhere).
struct Host {
    _dir: tempfile::TempDir,
    data: String,
    root: String,
}

impl Host {
    fn new() -> TestResult<Host> {
        let dir = tempfile::tempdir()?;
        let base = std::fs::canonicalize(dir.path())?;
        let data = base.join("data");
        let root = base.join("srv");
        std::fs::create_dir_all(data.join(ASSETS_DIR).join("s").join("a"))?;
        std::fs::write(data.join(ASSETS_DIR).join("s").join("a").join("k"), "x")?;
        std::fs::create_dir_all(root.join("app"))?;
        std::os::unix::fs::symlink("/etc", root.join("etc-link"))?;
        std::os::unix::fs::symlink(&data, root.join("data-link"))?;
        std::os::unix::fs::symlink(root.join("app"), root.join("app-link"))?;
        std::os::unix::fs::symlink(root.join("gone"), root.join("dangling"))?;
        let text = |path: PathBuf| path.display().to_string();
        Ok(Host {
            _dir: dir,
            data: text(data),
            root: text(root),
        })
    }
}

fn bind(rng: &mut Rng, host: &Host) -> String {
    let start = match rng.below(8) {
        0..=2 => "${asset.s.a.k}".to_owned(),
        3 | 4 => host.root.clone(),
        5 => host.data.clone(),
        6 => "/".to_owned(),
        _ => rng
            .pick(&["pgdata", "cache", "/var/run", "/srv"])
            .to_owned(),
    };
    let mut path = start;
    let segments = if rng.below(3) == 0 { 0 } else { rng.below(6) };
    for _ in 0..segments {
        let segment = rng.pick(&[
            "..",
            "..",
            "..",
            ".",
            "",
            "etc",
            "shadow",
            "var",
            "run",
            "docker.sock",
            "srv",
            "app",
            "app-link",
            "etc-link",
            "data-link",
            "dangling",
            "assets",
            "state.db",
            "s",
            "a",
            "k",
            "proc",
            "new",
        ]);
        path.push('/');
        path.push_str(segment);
    }
    let target = rng.pick(&[":/x", ":/x:ro", ":/data:rw"]);
    format!("{path}{target}")
}

fn case(rng: &mut Rng, host: &Host) -> String {
    let volumes: Vec<String> = (0..1 + rng.below(2))
        .map(|_| format!("{:?}", bind(rng, host)).replace("\\u{0}", ""))
        .collect();
    let options: Vec<String> = (0..rng.below(3))
        .map(|_| {
            format!(
                "{:?}",
                rng.pick(&[
                    "--read-only",
                    "--shm-size=64m",
                    "--log-opt=max-size=1m",
                    "--log-driver=json-file",
                    "--cap-add=chown",
                    "--security-opt=no-new-privileges",
                    "--privileged",
                    "--log-driver=syslog",
                    "--log-driver=gelf",
                    "--log-driver=json-file",
                    "--log-driver=local",
                    "--log-opt=max-size=1m",
                    "--cap-add=SYS_ADMIN",
                    "--cap-add=chown",
                    "--security-opt=seccomp=unconfined",
                    "--security-opt=no-new-privileges",
                    "--pid=host",
                    "--ipc=host",
                    "--device=/dev/sda",
                    "--read-only",
                    "--shm-size=64m",
                ])
            )
        })
        .collect();
    let network = match rng.below(10) {
        0 => "  network_mode = \"host\"\n".to_owned(),
        1 => "  networks = [\"bridge\"]\n".to_owned(),
        2 => "  networks = [\"voodu0\", \"host\"]\n".to_owned(),
        _ => String::new(),
    };
    let caps = match rng.below(6) {
        0 => "  cap_add = [\"NET_ADMIN\"]\n",
        1 => "  cap_add = [\"KILL\"]\n",
        _ => "",
    };
    let init = if rng.below(4) == 0 {
        format!(
            "  init \"i\" {{\n    command = [\"true\"]\n    docker_options = [{}]\n  }}\n",
            rng.pick(&[
                "\"--privileged\"",
                "\"--read-only\"",
                "\"--log-driver=fluentd\""
            ])
        )
    } else {
        String::new()
    };
    format!(
        "asset \"s\" \"a\" {{\n  k = \"x\"\n}}\n\ndeployment \"s\" \"web\" {{\n  image = \"busybox\"\n  volumes = [{}]\n  docker_options = [{}]\n{network}{caps}{init}}}\n",
        volumes.join(", "),
        options.join(", ")
    )
}

/// The oracle: whether `request` respects `policy` (default-deny, plus at most bind roots),
/// written from the README's rules, not from the guard's code.
fn violation(request: &ContainerSpec, policy: &Policy, host: &Host) -> Option<String> {
    const SENSITIVE: &[&str] = &[
        "/etc",
        "/proc",
        "/sys",
        "/dev",
        "/boot",
        "/root",
        "/usr",
        "/bin",
        "/sbin",
        "/lib",
        "/lib32",
        "/lib64",
        "/libx32",
        "/run",
        "/var/run",
        "/var/lib/docker",
        "/var/lib/containerd",
    ];
    let under = |path: &Path, dir: &str| path.starts_with(dir);
    for bind in &request.binds {
        let source = bind.split(':').next().unwrap_or_default();
        if !source.starts_with('/') {
            continue;
        }
        // Fold as Docker does (lexically), then follow links as the kernel does.
        let mut folded = PathBuf::from("/");
        for part in Path::new(source).components() {
            match part {
                std::path::Component::ParentDir => {
                    folded.pop();
                }
                std::path::Component::Normal(name) => folded.push(name),
                _ => {}
            }
        }
        let mut real = None;
        let mut probe = folded.clone();
        let mut rest = Vec::new();
        while real.is_none() {
            if let Ok(found) = std::fs::canonicalize(&probe) {
                let mut path = found;
                path.extend(rest.iter().rev());
                real = Some(path);
            } else {
                rest.push(probe.file_name()?.to_owned());
                probe.pop();
            }
        }
        let real = real?;
        let asset_file = real.parent().and_then(Path::parent).and_then(Path::parent)
            == Some(Path::new(&host.data).join(ASSETS_DIR).as_path());
        if asset_file {
            continue;
        }
        let in_root = policy.allow_bind_root.iter().any(|root| under(&real, root));
        if !in_root || real == Path::new("/") || under(&real, &host.data) {
            return Some(format!("bind of {} (really {})", source, real.display()));
        }
        if SENSITIVE.iter().any(|dir| under(&real, dir)) {
            return Some(format!("bind of {source} into {}", real.display()));
        }
    }
    let options = &request.options;
    let default_caps = ["CHOWN", "KILL", "SETUID", "SETGID", "NET_BIND_SERVICE"];
    let bad_cap = request
        .cap_add
        .iter()
        .chain(&options.cap_add)
        .any(|cap| !default_caps.contains(&cap.to_ascii_uppercase().as_str()));
    let bad_log = options
        .log_driver
        .as_deref()
        .is_some_and(|driver| !["json-file", "local", "journald", "none"].contains(&driver));
    let bad_network = request.network_mode == "host"
        || request.networks.iter().any(|network| network != "voodu0");
    let bad_security = options
        .security_opt
        .iter()
        .any(|option| !option.starts_with("no-new-privileges"));
    let namespaces = [&options.pid, &options.ipc]
        .iter()
        .any(|value| value.is_some());
    (options.privileged
        || bad_cap
        || bad_log
        || bad_network
        || bad_security
        || namespaces
        || !options.devices.is_empty())
    .then(|| {
        format!(
            "options {options:?}, network {:?} {:?}, caps {:?}",
            request.network_mode, request.networks, request.cap_add
        )
    })
}

#[tokio::test]
async fn i23_no_accepted_request_violates_the_default_policy() -> TestResult {
    let seed = std::env::var("VOODU_POLICY_SEED")
        .ok()
        .and_then(|seed| seed.parse().ok())
        .unwrap_or(0x5EED_2023_u64);
    let cases: usize = std::env::var("VOODU_POLICY_CASES")
        .ok()
        .and_then(|cases| cases.parse().ok())
        .unwrap_or(2000);
    let host = Host::new()?;
    let mut rng = Rng(seed | 1);
    let policies = [
        Policy {
            data_dir: Some(host.data.clone()),
            ..Policy::default()
        },
        Policy {
            data_dir: Some(host.data.clone()),
            allow_bind_root: vec![host.root.clone()],
            ..Policy::default()
        },
    ];
    let (mut loaded, mut sent, mut refused_at_sink, mut violations) = (0, 0, 0, Vec::new());
    for index in 0..cases {
        let policy = &policies[index % policies.len()];
        let text = case(&mut rng, &host);
        let snapshot = Snapshot {
            commit: CommitSha::new("0".repeat(40)),
            files: vec![SourceFile {
                path: "m/app.hcl".to_owned(),
                contents: text.clone().into_bytes(),
            }],
            refused: Vec::new(),
        };
        let Ok(manifest) =
            manifest::load_with_policy(&snapshot, &LoadOptions::standalone(), Some(policy))
        else {
            continue;
        };
        loaded += 1;
        let fake = Arc::new(FakeRuntime::new());
        let guarded = Guarded::new(
            Arc::clone(&fake),
            Rules::new(policy.clone(), OwnedPaths::for_data_dir(&host.data)),
        );
        guarded.ensure_network("voodu0").await?;
        let assets_root = Path::new(&host.data).join(ASSETS_DIR);
        for resource in &manifest.resources {
            for request in container_requests(resource, &assets_root, &Ownership::single()) {
                let request = request?;
                match guarded.create(&request).await {
                    Ok(_) => {
                        sent += 1;
                        if let Some(why) = violation(&request, policy, &host) {
                            violations.push(format!("{why}\n{text}"));
                        }
                    }
                    Err(Error::Refused { .. }) => refused_at_sink += 1,
                    Err(other) => return Err(format!("{other}\n{text}").into()),
                }
            }
        }
    }
    println!(
        "policy property: seed {seed:#x}, {cases} cases, {loaded} accepted by the manifest stage, {sent} requests sent, {refused_at_sink} refused at the sink (symlinks the manifest stage cannot see), {} violations",
        violations.len()
    );
    assert!(
        violations.is_empty(),
        "{} violations, first:\n{}",
        violations.len(),
        violations[0]
    );
    // The generator reaches both sides of the policy.
    assert!(
        sent > 100 && loaded < cases,
        "{sent} sent, {loaded}/{cases} accepted"
    );
    Ok(())
}
