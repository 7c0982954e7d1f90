//! Host policy: what a commit may ask of the host, set by whoever runs the agent (flags or a
//! policy file), never by the repository.
//!
//! Anyone who can push can run containers, so by default nothing that gives the host away is
//! allowed: bind mounts (none outside `--allow-bind-root` roots, and the Docker socket, `/`,
//! system directories, the engine's and the agent's own data even under a root unless named
//! exactly), privileged containers, the host's network, pid and ipc namespaces, devices and
//! GPUs, capabilities beyond Docker's default set, security options other than
//! `no-new-privileges`, and networks other than voodu's own `voodu0`.
//!
//! Invariant: pure. `check` reads only the decoded spec, where its fields were written, and the
//! policy; every refusal is located at the attribute that asks for it and names the setting
//! that would allow it. Bind sources are compared lexically (`.`, `..` and `//` folded); the
//! sync stage, which may look at the host, checks them again with their symlinks resolved.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::decode::Resource;
use super::diagnostic::Diagnostic;
use super::spec::{Container, DEFAULT_NETWORK, Spec};
use crate::model::DockerOptions;

/// What the host allows beyond its default-deny baseline. The policy file (JSON) uses the
/// flags' names as keys: `{"allow-host-network": true, "allow-cap": ["NET_ADMIN"]}`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields, rename_all = "kebab-case")]
pub struct Policy {
    /// `--privileged`.
    pub allow_privileged: bool,
    /// `network_mode = "host"`, or a network named `host`.
    pub allow_host_network: bool,
    /// `--pid=host` or `--pid=container:…`.
    pub allow_host_pid: bool,
    /// `--ipc=host` or `--ipc=container:…`.
    pub allow_host_ipc: bool,
    /// `--device` and `--gpus`.
    pub allow_devices: bool,
    /// Capabilities `cap_add`/`--cap-add` may add beyond Docker's default set (`ALL` allows
    /// every one).
    pub allow_cap: Vec<String>,
    /// Host directories (or files) bind mounts may come from.
    pub allow_bind_root: Vec<String>,
    /// Networks beside `voodu0` a container may join.
    pub allow_network: Vec<String>,
    /// `--security-opt` values beside `no-new-privileges`.
    pub allow_security_opt: Vec<String>,
    /// Hosts `url()` may fetch from although they are internal (loopback, link-local,
    /// private…): host names, IP addresses or CIDRs (`url_hosts`).
    pub allow_url_host: Vec<String>,
    /// The agent's data dir (state.db, secrets, assets): protected like a system directory.
    /// Set by the agent, not by the policy file.
    #[serde(skip)]
    pub data_dir: Option<String>,
}

/// Capabilities Docker grants every container: adding one changes nothing.
const DEFAULT_CAPS: &[&str] = &[
    "AUDIT_WRITE",
    "CHOWN",
    "DAC_OVERRIDE",
    "FOWNER",
    "FSETID",
    "KILL",
    "MKNOD",
    "NET_BIND_SERVICE",
    "NET_RAW",
    "SETFCAP",
    "SETGID",
    "SETPCAP",
    "SETUID",
    "SYS_CHROOT",
];

/// Security options that only restrict the container.
const SAFE_SECURITY_OPTS: &[&str] = &[
    "no-new-privileges",
    "no-new-privileges=true",
    "no-new-privileges=false",
];

/// Host paths that give the host away, and why.
const SENSITIVE: &[(&str, &str)] = &[
    ("/", "the host's root filesystem"),
    ("/etc", "a system directory"),
    ("/proc", "a system directory"),
    ("/sys", "a system directory"),
    ("/dev", "the host's devices"),
    ("/boot", "a system directory"),
    ("/root", "root's home directory"),
    ("/usr", "a system directory"),
    ("/bin", "a system directory"),
    ("/sbin", "a system directory"),
    ("/lib", "a system directory"),
    ("/lib32", "a system directory"),
    ("/lib64", "a system directory"),
    ("/libx32", "a system directory"),
    ("/run", "runtime sockets, the Docker socket among them"),
    ("/var/run", "runtime sockets, the Docker socket among them"),
    ("/var/lib/docker", "the Docker engine's data"),
    ("/var/lib/containerd", "the container runtime's data"),
];

impl Policy {
    /// Adds `other`'s allowances to this policy (flags on top of a policy file).
    pub fn merge(&mut self, other: Policy) {
        self.allow_privileged |= other.allow_privileged;
        self.allow_host_network |= other.allow_host_network;
        self.allow_host_pid |= other.allow_host_pid;
        self.allow_host_ipc |= other.allow_host_ipc;
        self.allow_devices |= other.allow_devices;
        self.allow_cap.extend(other.allow_cap);
        self.allow_bind_root.extend(other.allow_bind_root);
        self.allow_network.extend(other.allow_network);
        self.allow_security_opt.extend(other.allow_security_opt);
        self.allow_url_host.extend(other.allow_url_host);
        if other.data_dir.is_some() {
            self.data_dir = other.data_dir;
        }
    }

    /// Why the policy itself is unusable (a relative bind root, a malformed url host), if it is.
    pub fn problems(&self) -> Vec<String> {
        let mut problems: Vec<String> = self
            .allow_bind_root
            .iter()
            .filter(|root| !root.starts_with('/'))
            .map(|root| format!("--allow-bind-root {root:?} must be an absolute path"))
            .collect();
        problems.extend(super::UrlHosts::parse(&self.allow_url_host).err());
        problems
    }

    fn cap_allowed(&self, cap: &str) -> bool {
        DEFAULT_CAPS.contains(&cap)
            || self
                .allow_cap
                .iter()
                .map(|allowed| normalize_cap(allowed))
                .any(|allowed| allowed == "ALL" || allowed == cap)
    }

    fn security_opt_allowed(&self, option: &str) -> bool {
        SAFE_SECURITY_OPTS.contains(&option)
            || self
                .allow_security_opt
                .iter()
                .any(|allowed| allowed == "*" || normalize_security_opt(allowed) == option)
    }

    fn network_allowed(&self, network: &str) -> bool {
        network == DEFAULT_NETWORK
            || self
                .allow_network
                .iter()
                .any(|allowed| allowed == "*" || allowed == network)
    }

    /// Why a bind of `source` (absolute, normalised) is refused, or `None` when allowed.
    pub fn bind_refusal(&self, source: &str) -> Option<String> {
        let mut sensitive: Vec<(String, &str)> = SENSITIVE
            .iter()
            .map(|(path, why)| ((*path).to_owned(), *why))
            .collect();
        if let Some(data_dir) = self.data_dir.as_deref().and_then(normalize_path) {
            sensitive.push((data_dir, "the agent's own data dir (state.db, secrets)"));
        }
        let roots: Vec<String> = self
            .allow_bind_root
            .iter()
            .filter_map(|root| normalize_path(root))
            .collect();
        // A sensitive path the source lies in needs a root at or below it; a sensitive path
        // inside the source needs the source itself named as a root.
        let allowed_by = |root: &str| {
            is_within(source, root)
                && sensitive.iter().all(|(path, _)| {
                    if is_within(source, path) {
                        is_within(root, path)
                    } else if is_within(path, source) {
                        root == source
                    } else {
                        true
                    }
                })
        };
        if roots.iter().any(|root| allowed_by(root)) {
            return None;
        }
        // The path itself, else the innermost sensitive path holding it, else the first one
        // it holds.
        let touched = sensitive
            .iter()
            .find(|(path, _)| path == source)
            .or_else(|| {
                sensitive
                    .iter()
                    .filter(|(path, _)| path != "/" && is_within(source, path))
                    .max_by_key(|(path, _)| path.len())
            })
            .or_else(|| sensitive.iter().find(|(path, _)| is_within(path, source)));
        let fix = format!("start the agent with --allow-bind-root {source} to allow it");
        Some(match touched {
            Some((path, why)) if path == source => {
                format!("bind mount of {source} ({why}) is refused by the host policy; {fix}")
            }
            Some((path, why)) if is_within(source, path) => format!(
                "bind mount of {source} (under {path}: {why}) is refused by the host policy; {fix}"
            ),
            Some((path, why)) => format!(
                "bind mount of {source} (it holds {path}: {why}) is refused by the host policy; {fix}"
            ),
            None if roots.is_empty() => format!(
                "bind mount of {source} is refused by the host policy (no bind roots are allowed); {fix}"
            ),
            None => format!(
                "bind mount of {source} is outside the host policy's bind roots ({}); {fix}",
                roots.join(", ")
            ),
        })
    }
}

/// Every refusal of `resource` under `policy`. `locations` maps a field (`volumes`,
/// `init "name".docker_options`) to where it is written; the block's origin stands in for a
/// field without one (a macro's generated values).
pub(crate) fn check(
    policy: &Policy,
    resource: &Resource,
    locations: &BTreeMap<String, Diagnostic>,
) -> Vec<Diagnostic> {
    let mut refusals = Vec::new();
    let mut refuse = |field: &str, message: String| {
        let at = locations.get(field).unwrap_or(&resource.origin);
        refusals.push(Diagnostic {
            message,
            ..at.clone()
        });
    };
    let Some(container) = resource.spec.container() else {
        return refusals;
    };
    check_container(policy, container, &mut refuse);
    let inits = match &resource.spec {
        Spec::Deployment(spec) => spec.inits.as_slice(),
        Spec::Statefulset(spec) => spec.inits.as_slice(),
        _ => &[],
    };
    for init in inits {
        let field = format!("init {:?}.docker_options", init.name);
        check_docker_options(policy, &init.docker_options, &mut |message| {
            refuse(&field, message)
        });
    }
    refusals
}

fn check_container(policy: &Policy, container: &Container, refuse: &mut impl FnMut(&str, String)) {
    for volume in &container.volumes {
        if let Some(source) = bind_source(volume)
            && let Some(refusal) = policy.bind_refusal(&source)
        {
            refuse("volumes", refusal);
        }
    }
    if container.network_mode == "host" && !policy.allow_host_network {
        refuse(
            "network_mode",
            "host networking (network_mode = \"host\") is refused by the host policy; start the agent with --allow-host-network to allow it".to_owned(),
        );
    }
    let named = (!container.network.is_empty()).then_some(("network", &container.network));
    let listed = container
        .networks
        .iter()
        .map(|network| ("networks", network));
    for (field, network) in named.into_iter().chain(listed) {
        if network == "host" {
            if !policy.allow_host_network {
                refuse(
                    field,
                    "network \"host\" is the host's network stack: refused by the host policy; start the agent with --allow-host-network to allow it".to_owned(),
                );
            }
        } else if !policy.network_allowed(network) {
            let mut allowed = vec![DEFAULT_NETWORK.to_owned()];
            allowed.extend(policy.allow_network.iter().cloned());
            refuse(
                field,
                format!(
                    "network {network:?} is refused by the host policy (allowed: {}); start the agent with --allow-network {network} to allow it",
                    allowed.join(", ")
                ),
            );
        }
    }
    for cap in &container.cap_add {
        check_cap(policy, cap, "cap_add", &mut |message| {
            refuse("cap_add", message)
        });
    }
    check_docker_options(policy, &container.docker_options, &mut |message| {
        refuse("docker_options", message)
    });
}

fn check_cap(policy: &Policy, cap: &str, via: &str, refuse: &mut impl FnMut(String)) {
    let cap = normalize_cap(cap);
    if !policy.cap_allowed(&cap) {
        refuse(format!(
            "capability {cap} ({via}) is refused by the host policy; start the agent with --allow-cap {cap} to allow it"
        ));
    }
}

fn check_docker_options(policy: &Policy, items: &[String], refuse: &mut impl FnMut(String)) {
    // Options that do not parse are reported by the decoder.
    let Ok(options) = DockerOptions::parse(items) else {
        return;
    };
    if options.privileged && !policy.allow_privileged {
        refuse("privileged containers are refused by the host policy; start the agent with --allow-privileged to allow them".to_owned());
    }
    for (flag, value, allowed, setting) in [
        (
            "--pid",
            &options.pid,
            policy.allow_host_pid,
            "--allow-host-pid",
        ),
        (
            "--ipc",
            &options.ipc,
            policy.allow_host_ipc,
            "--allow-host-ipc",
        ),
    ] {
        let namespace = &flag[2..];
        let what = match value.as_deref() {
            Some("host") => format!("the host's {namespace} namespace ({flag}=host)"),
            Some(other) if other.starts_with("container:") => {
                format!("another container's {namespace} namespace ({flag}={other})")
            }
            _ => continue,
        };
        if !allowed {
            refuse(format!(
                "{what} is refused by the host policy; start the agent with {setting} to allow it"
            ));
        }
    }
    if !policy.allow_devices {
        for device in &options.devices {
            refuse(format!(
                "host devices (--device {device}) are refused by the host policy; start the agent with --allow-devices to allow them"
            ));
        }
        if let Some(count) = options.gpus {
            let shown = if count < 0 {
                "all".to_owned()
            } else {
                count.to_string()
            };
            refuse(format!(
                "GPUs (--gpus {shown}) are refused by the host policy; start the agent with --allow-devices to allow them"
            ));
        }
    }
    for cap in &options.cap_add {
        check_cap(policy, cap, "--cap-add", refuse);
    }
    for option in &options.security_opt {
        let option = normalize_security_opt(option);
        if !policy.security_opt_allowed(&option) {
            refuse(format!(
                "security option {option:?} is refused by the host policy; start the agent with --allow-security-opt {option} to allow it"
            ));
        }
    }
}

/// The host path a `volumes` entry binds, normalised; `None` for a named volume or an asset
/// file (`${asset.…}`, which the agent resolves under its own asset directory).
pub fn bind_source(volume: &str) -> Option<String> {
    let source = volume.split(':').next().unwrap_or_default();
    let is_asset = source.starts_with("${asset.")
        && source.ends_with('}')
        && source.matches('}').count() == 1
        && !source.contains('/');
    if is_asset || !source.starts_with('/') {
        return None;
    }
    normalize_path(source)
}

/// `/a//b/./c/../d/` → `/a/b/d`; `None` for a relative path.
fn normalize_path(path: &str) -> Option<String> {
    if !path.starts_with('/') {
        return None;
    }
    let mut parts: Vec<&str> = Vec::new();
    for part in path.split('/') {
        match part {
            "" | "." => {}
            ".." => {
                parts.pop();
            }
            other => parts.push(other),
        }
    }
    Some(format!("/{}", parts.join("/")))
}

/// Whether `path` is `dir` or lies under it (both normalised).
fn is_within(path: &str, dir: &str) -> bool {
    dir == "/"
        || path == dir
        || path
            .strip_prefix(dir)
            .is_some_and(|rest| rest.starts_with('/'))
}

/// `cap_sys_admin` → `SYS_ADMIN`, as Docker reads it.
fn normalize_cap(cap: &str) -> String {
    let upper = cap.trim().to_ascii_uppercase();
    upper
        .strip_prefix("CAP_")
        .map_or_else(|| upper.clone(), ToOwned::to_owned)
}

/// `seccomp:unconfined` → `seccomp=unconfined`, as Docker accepts both.
fn normalize_security_opt(option: &str) -> String {
    let option = option.trim();
    if option.contains('=') {
        option.to_owned()
    } else {
        option.replacen(':', "=", 1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::manifest::{LoadOptions, load_with_policy};

    fn load(text: &str, policy: &Policy) -> Vec<String> {
        let snapshot = crate::manifest::tests::snapshot(&[("m/app.hcl", text)]);
        match load_with_policy(&snapshot, &LoadOptions::standalone(), Some(policy)) {
            Ok(_) => Vec::new(),
            Err(diagnostics) => diagnostics.0.iter().map(ToString::to_string).collect(),
        }
    }

    /// `fields` go inside `deployment "s" "web" { image = "busybox" … }`, from line 3.
    fn check(fields: &str, policy: &Policy, expected: &[&str]) {
        let text = format!("deployment \"s\" \"web\" {{\n  image = \"busybox\"\n{fields}\n}}\n");
        assert_eq!(load(&text, policy), expected, "{fields}");
    }

    fn with(edit: impl FnOnce(&mut Policy)) -> Policy {
        let mut policy = Policy {
            data_dir: Some("/srv/voodu".to_owned()),
            ..Policy::default()
        };
        edit(&mut policy);
        policy
    }

    #[test]
    fn refusals_name_the_setting_that_allows_them() {
        let deny = with(|_| {});
        let rows: &[(&str, Policy, &[&str])] = &[
            // Bind mounts.
            (
                r#"  volumes = ["/srv/app:/app"]"#,
                deny.clone(),
                &[
                    "m/app.hcl:3:3: bind mount of /srv/app is refused by the host policy (no bind roots are allowed); start the agent with --allow-bind-root /srv/app to allow it",
                ],
            ),
            (
                r#"  volumes = ["/srv/app/data:/app"]"#,
                with(|p| p.allow_bind_root = vec!["/srv/app".into()]),
                &[],
            ),
            (
                r#"  volumes = ["/srv/app/../other:/app"]"#,
                with(|p| p.allow_bind_root = vec!["/srv/app".into()]),
                &[
                    "m/app.hcl:3:3: bind mount of /srv/other is outside the host policy's bind roots (/srv/app); start the agent with --allow-bind-root /srv/other to allow it",
                ],
            ),
            (
                r#"  volumes = ["/var/run/docker.sock:/var/run/docker.sock"]"#,
                with(|p| p.allow_bind_root = vec!["/".into()]),
                &[
                    "m/app.hcl:3:3: bind mount of /var/run/docker.sock (under /var/run: runtime sockets, the Docker socket among them) is refused by the host policy; start the agent with --allow-bind-root /var/run/docker.sock to allow it",
                ],
            ),
            (
                r#"  volumes = ["/var/run/docker.sock:/var/run/docker.sock"]"#,
                with(|p| p.allow_bind_root = vec!["/var/run/docker.sock".into()]),
                &[],
            ),
            (
                r#"  volumes = ["/:/host:ro"]"#,
                with(|p| p.allow_bind_root = vec!["/srv".into()]),
                &[
                    "m/app.hcl:3:3: bind mount of / (the host's root filesystem) is refused by the host policy; start the agent with --allow-bind-root / to allow it",
                ],
            ),
            (
                r#"  volumes = ["//etc/./:/etc2"]"#,
                with(|p| p.allow_bind_root = vec!["/".into()]),
                &[
                    "m/app.hcl:3:3: bind mount of /etc (a system directory) is refused by the host policy; start the agent with --allow-bind-root /etc to allow it",
                ],
            ),
            (
                r#"  volumes = ["/srv:/srv"]"#,
                with(|p| p.allow_bind_root = vec!["/srv".into()]),
                &[],
            ),
            (
                r#"  volumes = ["/srv/voodu/state.db:/db"]"#,
                with(|p| p.allow_bind_root = vec!["/srv".into()]),
                &[
                    "m/app.hcl:3:3: bind mount of /srv/voodu/state.db (under /srv/voodu: the agent's own data dir (state.db, secrets)) is refused by the host policy; start the agent with --allow-bind-root /srv/voodu/state.db to allow it",
                ],
            ),
            (
                r#"  volumes = ["/var:/v"]"#,
                with(|p| p.allow_bind_root = vec!["/".into()]),
                &[
                    "m/app.hcl:3:3: bind mount of /var (it holds /var/run: runtime sockets, the Docker socket among them) is refused by the host policy; start the agent with --allow-bind-root /var to allow it",
                ],
            ),
            (
                r#"  volumes = ["data:/data", "cache:/cache:ro"]"#,
                deny.clone(),
                &[],
            ),
            // Namespaces, privileges, devices.
            (
                r#"  network_mode = "host""#,
                deny.clone(),
                &[
                    "m/app.hcl:3:3: host networking (network_mode = \"host\") is refused by the host policy; start the agent with --allow-host-network to allow it",
                ],
            ),
            (
                r#"  network_mode = "host""#,
                with(|p| p.allow_host_network = true),
                &[],
            ),
            (
                r#"  networks = ["host"]"#,
                deny.clone(),
                &[
                    "m/app.hcl:3:3: network \"host\" is the host's network stack: refused by the host policy; start the agent with --allow-host-network to allow it",
                ],
            ),
            (
                r#"  networks = ["voodu0", "backend"]"#,
                deny.clone(),
                &[
                    "m/app.hcl:3:3: network \"backend\" is refused by the host policy (allowed: voodu0); start the agent with --allow-network backend to allow it",
                ],
            ),
            (
                r#"  network = "backend""#,
                with(|p| p.allow_network = vec!["backend".into()]),
                &[],
            ),
            (
                r#"  docker_options = ["--privileged"]"#,
                deny.clone(),
                &[
                    "m/app.hcl:3:3: privileged containers are refused by the host policy; start the agent with --allow-privileged to allow them",
                ],
            ),
            (
                r#"  docker_options = ["--privileged"]"#,
                with(|p| p.allow_privileged = true),
                &[],
            ),
            (
                r#"  docker_options = ["--pid=host", "--ipc", "container:db"]"#,
                deny.clone(),
                &[
                    "m/app.hcl:3:3: the host's pid namespace (--pid=host) is refused by the host policy; start the agent with --allow-host-pid to allow it",
                    "m/app.hcl:3:3: another container's ipc namespace (--ipc=container:db) is refused by the host policy; start the agent with --allow-host-ipc to allow it",
                ],
            ),
            (
                r#"  docker_options = ["--pid=host", "--ipc=host"]"#,
                with(|p| {
                    p.allow_host_pid = true;
                    p.allow_host_ipc = true;
                }),
                &[],
            ),
            (
                r#"  docker_options = ["--device=/dev/sda", "--gpus", "all"]"#,
                deny.clone(),
                &[
                    "m/app.hcl:3:3: host devices (--device /dev/sda) are refused by the host policy; start the agent with --allow-devices to allow them",
                    "m/app.hcl:3:3: GPUs (--gpus all) are refused by the host policy; start the agent with --allow-devices to allow them",
                ],
            ),
            (
                r#"  docker_options = ["--device=/dev/fuse"]"#,
                with(|p| p.allow_devices = true),
                &[],
            ),
            // Capabilities.
            (
                r#"  cap_add = ["SYS_ADMIN", "CHOWN", "cap_net_raw"]"#,
                deny.clone(),
                &[
                    "m/app.hcl:3:3: capability SYS_ADMIN (cap_add) is refused by the host policy; start the agent with --allow-cap SYS_ADMIN to allow it",
                ],
            ),
            (
                r#"  docker_options = ["--cap-add=ALL"]"#,
                with(|p| p.allow_cap = vec!["SYS_ADMIN".into()]),
                &[
                    "m/app.hcl:3:3: capability ALL (--cap-add) is refused by the host policy; start the agent with --allow-cap ALL to allow it",
                ],
            ),
            (
                r#"  cap_add = ["sys_admin"]"#,
                with(|p| p.allow_cap = vec!["CAP_SYS_ADMIN".into()]),
                &[],
            ),
            // Security options.
            (
                r#"  docker_options = ["--security-opt", "seccomp:unconfined", "--security-opt=apparmor=unconfined", "--security-opt=label=disable", "--security-opt=systempaths=unconfined", "--security-opt=no-new-privileges"]"#,
                deny.clone(),
                &[
                    "m/app.hcl:3:3: security option \"seccomp=unconfined\" is refused by the host policy; start the agent with --allow-security-opt seccomp=unconfined to allow it",
                    "m/app.hcl:3:3: security option \"apparmor=unconfined\" is refused by the host policy; start the agent with --allow-security-opt apparmor=unconfined to allow it",
                    "m/app.hcl:3:3: security option \"label=disable\" is refused by the host policy; start the agent with --allow-security-opt label=disable to allow it",
                    "m/app.hcl:3:3: security option \"systempaths=unconfined\" is refused by the host policy; start the agent with --allow-security-opt systempaths=unconfined to allow it",
                ],
            ),
            (
                r#"  docker_options = ["--security-opt=seccomp=unconfined"]"#,
                with(|p| p.allow_security_opt = vec!["seccomp:unconfined".into()]),
                &[],
            ),
            // Init containers are checked where their options are written.
            (
                "  init \"migrate\" {\n    command = [\"true\"]\n    docker_options = [\"--privileged\"]\n  }",
                deny.clone(),
                &[
                    "m/app.hcl:5:5: privileged containers are refused by the host policy; start the agent with --allow-privileged to allow them",
                ],
            ),
        ];
        for (fields, policy, expected) in rows {
            check(fields, policy, expected);
        }
    }

    #[test]
    fn every_kind_with_containers_is_checked_and_assets_may_be_bound() {
        let deny = Policy::default();
        let text = r#"
asset "s" "cfg" {
  conf = "x"
}
job "s" "once" {
  image   = "busybox"
  volumes = ["${asset.s.cfg.conf}:/etc/app.conf:ro", "/etc/passwd:/p"]
}
cronjob "s" "tick" {
  schedule     = "@daily"
  image        = "busybox"
  network_mode = "host"
}
statefulset "s" "db" {
  image   = "busybox"
  cap_add = ["NET_ADMIN"]
}
"#;
        assert_eq!(
            load(text, &deny),
            [
                "m/app.hcl:7:3: bind mount of /etc/passwd (under /etc: a system directory) is refused by the host policy; start the agent with --allow-bind-root /etc/passwd to allow it",
                "m/app.hcl:12:3: host networking (network_mode = \"host\") is refused by the host policy; start the agent with --allow-host-network to allow it",
                "m/app.hcl:16:3: capability NET_ADMIN (cap_add) is refused by the host policy; start the agent with --allow-cap NET_ADMIN to allow it",
            ]
        );
    }

    #[test]
    fn the_policy_file_uses_the_flags_names() -> Result<(), serde_json::Error> {
        let policy: Policy = serde_json::from_str(
            r#"{"allow-host-network": true, "allow-cap": ["NET_ADMIN"], "allow-bind-root": ["/srv"]}"#,
        )?;
        assert!(policy.allow_host_network && !policy.allow_privileged);
        assert_eq!(policy.allow_cap, ["NET_ADMIN"]);
        assert!(serde_json::from_str::<Policy>(r#"{"allow-everything": true}"#).is_err());
        Ok(())
    }
}
