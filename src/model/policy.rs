//! Host policy: what a commit may ask of the host, set by whoever runs the agent (flags or a
//! policy file), never by the repository, and the rules that judge one value against it.
//!
//! Anyone who can push can run containers, so by default nothing that gives the host away is
//! allowed: bind mounts (none outside `--allow-bind-root` roots, and the Docker socket, `/`,
//! system directories, the engine's and the agent's own data even under a root unless named
//! exactly), privileged containers, the host's network, pid and ipc namespaces, devices and
//! GPUs, capabilities beyond Docker's default set, security options other than
//! `no-new-privileges`, log drivers that ship output off the container's files, networks other
//! than voodu's own `voodu0`, and mounting a volume the agent did not create.
//!
//! The rules live here, in the vocabulary layer, because two places apply them: the manifest
//! stage (`manifest::policy`, on the values as written, for `path:line:col`) and the sink
//! (`runtime::guard`, on the final request sent to the engine: interpolated, normalised,
//! symlinks resolved), which is the guarantee.
//!
//! Invariant: pure. Every refusal names the setting that would allow it.

use serde::{Deserialize, Serialize};

use super::DockerOptions;

pub(crate) use super::DEFAULT_NETWORK;
use super::host_paths::is_within;
pub use super::host_paths::{ASSETS_DIR, OwnedPaths};
pub(crate) use super::host_paths::{bind_source_text, normalize_path, resolve_on_host};

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
    /// `--log-driver` values beside the ones that keep output on this host's disk
    /// (`json-file`, `local`, `journald`, `none`); `*` for any.
    pub allow_log_driver: Vec<String>,
    /// Volumes the agent did not create (no `createdby=voodu` label) that may still be
    /// mounted as a statefulset's claim: their data is taken over deliberately.
    pub adopt_volume: Vec<String>,
    /// Hosts `url()` may fetch from, and image registry scans reach (never link-local for
    /// those), although they are internal (loopback, link-local, private…): host names, IP
    /// addresses or CIDRs (`url_hosts`).
    pub allow_url_host: Vec<String>,
    /// Repositories whose images run only with a valid cosign signature of their digest, and
    /// the public keys (PEM files) that sign them (`--require-signature PATTERN=KEYFILE`).
    pub require_signature: Vec<SignatureRule>,
    /// The agent's data dir (state.db, secrets, assets): protected like a system directory.
    /// Set by the agent, not by the policy file.
    #[serde(skip)]
    pub data_dir: Option<String>,
    /// The source whose commits are judged and what it owns (`--sources`): a reference to
    /// what another source's scopes hold is refused. Set by the agent per source, not by the
    /// policy file.
    #[serde(skip)]
    pub seal: Option<super::scopes::Seal>,
    /// Only the seal is judged, not the host rules (`validate --sources` without a policy:
    /// the format and what the source may point at).
    #[serde(skip)]
    pub seal_only: bool,
    /// Resource caps (a branch preview's, `previews { max_replicas, memory, cpus }`). Set by
    /// the agent per source, not by the policy file.
    #[serde(skip)]
    pub caps: Caps,
}

/// Resource caps on what a source's commits may ask (a branch preview's): above one is
/// refused; a container without a limit gets the cap at the sink (`runtime::guard`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Caps {
    /// Most replicas of one deployment or statefulset.
    pub max_replicas: Option<usize>,
    /// Most memory of one container, in bytes.
    pub memory: Option<i64>,
    /// Most CPU of one container, in nano-CPUs (10⁹ per core).
    pub cpus: Option<i64>,
}

impl Caps {
    /// Whether no cap is set.
    pub fn is_empty(&self) -> bool {
        *self == Caps::default()
    }

    /// Why `replicas` is above the cap, when it is.
    pub fn replicas_refusal(&self, replicas: usize) -> Option<String> {
        let cap = self.max_replicas?;
        (replicas > cap).then(|| {
            format!("replicas {replicas} is above the previews' cap (max_replicas = {cap}): write at most {cap}")
        })
    }

    /// Why a container's memory limit (bytes) is above the cap, when it is.
    pub fn memory_refusal(&self, memory: i64) -> Option<String> {
        let cap = self.memory?;
        (memory > cap).then(|| {
            format!("memory limit of {memory} bytes is above the previews' cap ({cap} bytes): write at most that")
        })
    }

    /// Why a container's CPU limit (nano-CPUs) is above the cap, when it is.
    pub fn cpus_refusal(&self, nanos: i64) -> Option<String> {
        let cap = self.cpus?;
        (nanos > cap).then(|| {
            format!(
                "cpu limit of {} cores is above the previews' cap ({} cores): write at most that",
                nanos as f64 / 1e9,
                cap as f64 / 1e9
            )
        })
    }
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

/// Log drivers that keep a container's output on this host (its files or its journal):
/// every other one ships it to an address the driver's options name (syslog, gelf, fluentd,
/// splunk, awslogs…), the host's loopback services among them.
const LOCAL_LOG_DRIVERS: &[&str] = &["json-file", "local", "journald", "none"];

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

/// Images of repositories matching `repositories` (`registry.example/team/app`, a prefix
/// `registry.example/team/*`, or `*`) run only when their digest carries a cosign signature
/// by one of `keys` (paths to PEM public keys).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SignatureRule {
    pub repositories: String,
    pub keys: Vec<String>,
}

/// Why a `--require-signature` value is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SignatureRuleError {
    #[error(
        "--require-signature {text:?}: write PATTERN=KEYFILE, e.g. registry.example/team/*=/etc/voodu-agent/cosign.pub"
    )]
    NotPatternEqualsKeyFile { text: String },
    #[error("--require-signature {text:?}: both a repository pattern and a key file are needed")]
    Incomplete { text: String },
}

impl SignatureRule {
    /// `PATTERN=KEYFILE[,KEYFILE…]`, as the flag takes it.
    pub fn parse(text: &str) -> Result<SignatureRule, SignatureRuleError> {
        let (repositories, keys) =
            text.split_once('=')
                .ok_or_else(|| SignatureRuleError::NotPatternEqualsKeyFile {
                    text: text.to_owned(),
                })?;
        let keys: Vec<String> = keys
            .split(':')
            .filter(|key| !key.is_empty())
            .map(str::to_owned)
            .collect();
        if repositories.is_empty() || keys.is_empty() {
            return Err(SignatureRuleError::Incomplete {
                text: text.to_owned(),
            });
        }
        Ok(SignatureRule {
            repositories: repositories.to_owned(),
            keys,
        })
    }

    /// Whether the rule covers `repository` (an image's name without tag or digest).
    pub fn covers(&self, repository: &str) -> bool {
        match self.repositories.strip_suffix('*') {
            Some(prefix) => repository.starts_with(prefix),
            None => self.repositories == repository,
        }
    }
}

impl Policy {
    /// The signature rule that covers `repository`, the first one listed.
    pub fn signature_rule(&self, repository: &str) -> Option<&SignatureRule> {
        self.require_signature
            .iter()
            .find(|rule| rule.covers(repository))
    }

    /// A policy that judges only what `seal`'s source may point at, not the host rules.
    pub fn seal_only(seal: super::scopes::Seal) -> Policy {
        Policy {
            seal: Some(seal),
            seal_only: true,
            ..Policy::default()
        }
    }

    /// This policy narrowed by `other` (a branch preview's policy): only what both allow
    /// (a bind root of `other` within one of this policy's; `ALL`/`*` stands for the other's
    /// list), every signature rule of both; the data dir, seal and caps stay this policy's.
    /// A preview's policy can only make the agent's stricter, never looser.
    pub fn narrowed(&self, other: &Policy) -> Policy {
        fn both(mine: &[String], theirs: &[String], any: Option<&str>) -> Vec<String> {
            let all = |list: &[String]| {
                any.is_some_and(|any| list.iter().any(|item| item.eq_ignore_ascii_case(any)))
            };
            if all(mine) {
                theirs.to_vec()
            } else if all(theirs) {
                mine.to_vec()
            } else {
                mine.iter()
                    .filter(|item| theirs.contains(item))
                    .cloned()
                    .collect()
            }
        }
        let within = |root: &String| {
            let root = root.trim_end_matches('/');
            self.allow_bind_root.iter().any(|mine| {
                let mine = mine.trim_end_matches('/');
                root == mine || root.starts_with(&format!("{mine}/"))
            })
        };
        let mut require_signature = self.require_signature.clone();
        require_signature.extend(other.require_signature.iter().cloned());
        Policy {
            allow_privileged: self.allow_privileged && other.allow_privileged,
            allow_host_network: self.allow_host_network && other.allow_host_network,
            allow_host_pid: self.allow_host_pid && other.allow_host_pid,
            allow_host_ipc: self.allow_host_ipc && other.allow_host_ipc,
            allow_devices: self.allow_devices && other.allow_devices,
            allow_cap: both(&self.allow_cap, &other.allow_cap, Some("ALL")),
            allow_bind_root: other
                .allow_bind_root
                .iter()
                .filter(|root| within(root))
                .cloned()
                .collect(),
            allow_network: both(&self.allow_network, &other.allow_network, None),
            allow_security_opt: both(&self.allow_security_opt, &other.allow_security_opt, None),
            allow_log_driver: both(&self.allow_log_driver, &other.allow_log_driver, Some("*")),
            adopt_volume: both(&self.adopt_volume, &other.adopt_volume, None),
            allow_url_host: both(&self.allow_url_host, &other.allow_url_host, None),
            require_signature,
            data_dir: self.data_dir.clone(),
            seal: self.seal.clone(),
            seal_only: self.seal_only,
            caps: self.caps,
        }
    }

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
        self.allow_log_driver.extend(other.allow_log_driver);
        self.adopt_volume.extend(other.adopt_volume);
        self.allow_url_host.extend(other.allow_url_host);
        self.require_signature.extend(other.require_signature);
        if other.data_dir.is_some() {
            self.data_dir = other.data_dir;
        }
    }

    /// Why the policy itself is unusable (a relative bind root, a malformed url host), if it is.
    pub(crate) fn problems(&self) -> Vec<String> {
        let mut problems: Vec<String> = self
            .allow_bind_root
            .iter()
            .filter(|root| !root.starts_with('/'))
            .map(|root| format!("--allow-bind-root {root:?} must be an absolute path"))
            .collect();
        problems.extend(
            super::url_hosts::UrlHosts::parse(&self.allow_url_host)
                .err()
                .map(|error| error.to_string()),
        );
        problems.extend(
            self.require_signature
                .iter()
                .flat_map(|rule| &rule.keys)
                .filter(|key| !key.starts_with('/'))
                .map(|key| {
                    format!("--require-signature key file {key:?} must be an absolute path")
                }),
        );
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
    pub(crate) fn bind_refusal(&self, source: &str) -> Option<String> {
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

    /// Why a bind of `source`, in its final form (asset references resolved, absolute,
    /// normalised, and at the sink with its symlinks resolved), is refused, or `None`: the
    /// agent's own files in `owned` are allowed, everything else is judged by `bind_refusal`.
    pub(crate) fn host_bind_refusal(&self, source: &str, owned: &OwnedPaths) -> Option<String> {
        if owned.holds(source) {
            return None;
        }
        self.bind_refusal(source)
    }

    /// Why a bind of `folded` (absolute, folded as Docker folds it) is refused once `resolve`
    /// has followed its symlinks on the host, or `None`; a path `resolve` cannot follow is
    /// refused. The sink's gate and the sync stage judge host binds with this one rule.
    pub(crate) fn resolved_bind_refusal<E: std::fmt::Display>(
        &self,
        folded: &str,
        owned: &OwnedPaths,
        resolve: impl FnOnce(&str) -> Result<String, E>,
    ) -> Option<String> {
        match resolve(folded) {
            Ok(resolved) => self.host_bind_refusal(&resolved, owned).map(|refusal| {
                if resolved == folded {
                    refusal
                } else {
                    format!("bind mount of {folded} resolves to {resolved} on this host: {refusal}")
                }
            }),
            Err(why) => Some(format!(
                "bind mount of {folded} is refused by the host policy: {why}"
            )),
        }
    }

    /// Why `network_mode = mode` is refused (`host`, `container:…`), or `None`.
    pub(crate) fn network_mode_refusal(&self, mode: &str) -> Option<String> {
        match mode {
            "" | "none" | "bridge" | "default" => None,
            "host" if self.allow_host_network => None,
            "host" => Some("host networking (network_mode = \"host\") is refused by the host policy; start the agent with --allow-host-network to allow it".to_owned()),
            other => self.network_refusal(other),
        }
    }

    /// Why joining `network` is refused, or `None`.
    pub(crate) fn network_refusal(&self, network: &str) -> Option<String> {
        if network == "host" {
            return (!self.allow_host_network).then(|| {
                "network \"host\" is the host's network stack: refused by the host policy; start the agent with --allow-host-network to allow it".to_owned()
            });
        }
        if self.network_allowed(network) {
            return None;
        }
        let mut allowed = vec![DEFAULT_NETWORK.to_owned()];
        allowed.extend(self.allow_network.iter().cloned());
        Some(format!(
            "network {network:?} is refused by the host policy (allowed: {}); start the agent with --allow-network {network} to allow it",
            allowed.join(", ")
        ))
    }

    /// Why adding capability `cap` (written through `via`) is refused, or `None`.
    pub(crate) fn cap_refusal(&self, cap: &str, via: &str) -> Option<String> {
        let cap = normalize_cap(cap);
        (!self.cap_allowed(&cap)).then(|| format!(
            "capability {cap} ({via}) is refused by the host policy; start the agent with --allow-cap {cap} to allow it"
        ))
    }

    /// Why a `--log-driver` is refused, or `None`.
    pub(crate) fn log_driver_refusal(&self, driver: &str) -> Option<String> {
        let driver = driver.trim();
        let allowed = LOCAL_LOG_DRIVERS.contains(&driver)
            || self
                .allow_log_driver
                .iter()
                .any(|allowed| allowed == "*" || allowed == driver);
        (!allowed).then(|| format!(
            "log driver {driver:?} sends the container's output off this host's log files (to an address its --log-opt names, the host's own services among them) and is refused by the host policy (allowed: {}); start the agent with --allow-log-driver {driver} to allow it",
            LOCAL_LOG_DRIVERS.join(", ")
        ))
    }

    /// Why mounting the existing volume `name`, which the agent did not create, is refused,
    /// or `None` when the host adopts it.
    pub(crate) fn foreign_volume_refusal(&self, name: &str) -> Option<String> {
        (!self.adopt_volume.iter().any(|adopted| adopted == name)).then(|| format!(
            "volume {name} already exists and was not created by voodu (no createdby=voodu label): the agent does not mount data it did not make; remove it (docker volume rm {name}) for a fresh one, or, only if you know who wrote it, start the agent with --adopt-volume {name} to hand its data to the resource mounting it (whoever could create a volume of that name chose what it holds: another tenant of this engine, another source)"
        ))
    }

    /// Every refusal of a parsed `docker_options` list, in the order written.
    pub(crate) fn options_refusals(&self, options: &DockerOptions) -> Vec<String> {
        let mut refusals = Vec::new();
        if options.privileged && !self.allow_privileged {
            refusals.push("privileged containers are refused by the host policy; start the agent with --allow-privileged to allow them".to_owned());
        }
        for (flag, value, allowed, setting) in [
            (
                "--pid",
                &options.pid,
                self.allow_host_pid,
                "--allow-host-pid",
            ),
            (
                "--ipc",
                &options.ipc,
                self.allow_host_ipc,
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
                refusals.push(format!(
                    "{what} is refused by the host policy; start the agent with {setting} to allow it"
                ));
            }
        }
        if !self.allow_devices {
            for device in &options.devices {
                refusals.push(format!(
                    "host devices (--device {device}) are refused by the host policy; start the agent with --allow-devices to allow them"
                ));
            }
            if let Some(count) = options.gpus {
                let shown = if count < 0 {
                    "all".to_owned()
                } else {
                    count.to_string()
                };
                refusals.push(format!(
                    "GPUs (--gpus {shown}) are refused by the host policy; start the agent with --allow-devices to allow them"
                ));
            }
        }
        refusals.extend(
            options
                .cap_add
                .iter()
                .filter_map(|cap| self.cap_refusal(cap, "--cap-add")),
        );
        for option in &options.security_opt {
            let option = normalize_security_opt(option);
            if !self.security_opt_allowed(&option) {
                refusals.push(format!(
                    "security option {option:?} is refused by the host policy; start the agent with --allow-security-opt {option} to allow it"
                ));
            }
        }
        if let Some(driver) = &options.log_driver {
            refusals.extend(self.log_driver_refusal(driver));
        }
        refusals
    }
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

    #[test]
    fn a_previews_policy_only_narrows_the_agents() {
        let strings = |items: &[&str]| items.iter().map(|s| (*s).to_owned()).collect::<Vec<_>>();
        let agent = Policy {
            allow_privileged: true,
            allow_cap: strings(&["ALL"]),
            allow_bind_root: strings(&["/srv"]),
            allow_network: strings(&["metrics"]),
            data_dir: Some("/var/lib/voodu-agent".to_owned()),
            ..Policy::default()
        };
        let preview = Policy {
            allow_host_network: true,
            allow_cap: strings(&["NET_ADMIN"]),
            allow_bind_root: strings(&["/srv/previews", "/etc"]),
            allow_network: strings(&["metrics", "prod-db"]),
            ..Policy::default()
        };
        let narrowed = agent.narrowed(&preview);
        // Neither allows both flags; the preview's host network is not the agent's.
        assert!(!narrowed.allow_privileged && !narrowed.allow_host_network);
        assert_eq!(narrowed.allow_cap, ["NET_ADMIN"]);
        // A root inside the agent's stays, one outside goes.
        assert_eq!(narrowed.allow_bind_root, ["/srv/previews"]);
        assert_eq!(narrowed.allow_network, ["metrics"]);
        assert_eq!(narrowed.data_dir.as_deref(), Some("/var/lib/voodu-agent"));
        assert!(narrowed.bind_refusal("/srv/other").is_some());
        assert!(agent.bind_refusal("/srv/other").is_none());
        // Narrowing by an empty policy is default-deny.
        assert!(agent.narrowed(&Policy::default()).allow_cap.is_empty());
    }

    #[test]
    fn caps_refuse_what_is_above_them() {
        let caps = Caps {
            max_replicas: Some(2),
            memory: Some(256 << 20),
            cpus: Some(500_000_000),
        };
        assert!(caps.replicas_refusal(2).is_none());
        assert!(
            caps.replicas_refusal(3)
                .is_some_and(|m| m.contains("max_replicas = 2"))
        );
        assert!(caps.memory_refusal(256 << 20).is_none());
        assert!(caps.memory_refusal((256 << 20) + 1).is_some());
        assert!(caps.cpus_refusal(1_000_000_000).is_some());
        assert!(Caps::default().is_empty() && Caps::default().replicas_refusal(99).is_none());
    }

    #[test]
    fn log_drivers_that_ship_output_elsewhere_are_refused_unless_named() {
        let deny = Policy::default();
        for local in ["json-file", "local", "journald", "none"] {
            assert_eq!(deny.log_driver_refusal(local), None, "{local}");
        }
        for remote in ["syslog", "gelf", "fluentd", "splunk", "awslogs", "gcplogs"] {
            let refusal = deny.log_driver_refusal(remote);
            assert!(
                refusal.as_deref().is_some_and(|text| text
                    .contains(&format!("start the agent with --allow-log-driver {remote}"))),
                "{remote}: {refusal:?}"
            );
        }
        let allowing = Policy {
            allow_log_driver: vec!["syslog".to_owned()],
            ..Policy::default()
        };
        assert_eq!(allowing.log_driver_refusal("syslog"), None);
        assert!(allowing.log_driver_refusal("gelf").is_some());
    }

    #[test]
    fn network_modes_other_than_bridge_and_none_are_judged_as_networks() {
        let deny = Policy::default();
        assert_eq!(deny.network_mode_refusal(""), None);
        assert_eq!(deny.network_mode_refusal("none"), None);
        assert!(deny.network_mode_refusal("host").is_some());
        assert!(
            deny.network_mode_refusal("container:db")
                .is_some_and(|text| text.contains("--allow-network container:db"))
        );
    }

    #[test]
    fn a_foreign_volume_is_refused_unless_adopted_by_name() {
        let deny = Policy::default();
        let refusal = deny.foreign_volume_refusal("voodu-shop-db-data-0");
        assert!(
            refusal
                .as_deref()
                .is_some_and(|text| text.contains("--adopt-volume voodu-shop-db-data-0")
                    && text.contains("docker volume rm voodu-shop-db-data-0")),
            "{refusal:?}"
        );
        let adopting = Policy {
            adopt_volume: vec!["voodu-shop-db-data-0".to_owned()],
            ..Policy::default()
        };
        assert_eq!(
            adopting.foreign_volume_refusal("voodu-shop-db-data-0"),
            None
        );
    }
}
