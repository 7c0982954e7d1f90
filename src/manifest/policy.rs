//! Host policy in the manifest stage: every value a commit writes judged by the rules of
//! `model::policy`, on its final form (asset references resolved under the agent's asset
//! directory, paths normalised), and each refusal located at the attribute that asks for it.
//!
//! Invariant: pure. This check gives `path:line:col`; the guarantee is the gate at the sink
//! (`runtime::gate`), which judges the request sent to the engine with the same rules, and the
//! sync stage, which may look at the host, checks bind sources again with their symlinks
//! resolved.

use std::collections::BTreeMap;

use super::decode::Resource;
use super::diagnostic::Diagnostic;
use super::spec::{Container, Spec};
use crate::model::policy::{OwnedPaths, bind_source_text, normalize_path};
use crate::model::{DockerOptions, resolve_asset_refs};

pub use crate::model::policy::Policy;

/// The service's data dir (`StateDirectory=voodu-agent`), also the one `validate` and tests
/// judge asset paths under when the policy names none.
pub const DEFAULT_DATA_DIR: &str = "/var/lib/voodu-agent";

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
    let owned = owned_paths(policy);
    for volume in &container.volumes {
        if let Some(source) = final_bind_source(volume, &owned)
            && let Some(refusal) = policy.host_bind_refusal(&source, &owned)
        {
            refuse("volumes", refusal);
        }
    }
    refuse_all(
        "network_mode",
        policy.network_mode_refusal(&container.network_mode),
        refuse,
    );
    let named = (!container.network.is_empty()).then_some(("network", &container.network));
    let listed = container
        .networks
        .iter()
        .map(|network| ("networks", network));
    for (field, network) in named.into_iter().chain(listed) {
        refuse_all(field, policy.network_refusal(network), refuse);
    }
    for cap in &container.cap_add {
        refuse_all("cap_add", policy.cap_refusal(cap, "cap_add"), refuse);
    }
    check_docker_options(policy, &container.docker_options, &mut |message| {
        refuse("docker_options", message)
    });
}

fn refuse_all(
    field: &str,
    refusals: impl IntoIterator<Item = String>,
    refuse: &mut impl FnMut(&str, String),
) {
    for refusal in refusals {
        refuse(field, refusal);
    }
}

fn check_docker_options(policy: &Policy, items: &[String], refuse: &mut impl FnMut(String)) {
    // Options that do not parse are reported by the decoder.
    let Ok(options) = DockerOptions::parse(items) else {
        return;
    };
    for refusal in policy.options_refusals(&options) {
        refuse(refusal);
    }
}

/// The agent's own paths under the data dir the policy protects (or the default one).
fn owned_paths(policy: &Policy) -> OwnedPaths {
    OwnedPaths::for_data_dir(policy.data_dir.as_deref().unwrap_or(DEFAULT_DATA_DIR))
}

/// The host path a `volumes` entry binds in its final form: `${asset.…}` references resolved
/// under the agent's asset directory, then normalised (`.`, `..`, `//` folded); `None` for a
/// named volume (a source that is not an absolute path once resolved).
fn final_bind_source(volume: &str, owned: &OwnedPaths) -> Option<String> {
    let root = owned.assets_root.as_deref().unwrap_or(DEFAULT_DATA_DIR);
    let resolved = resolve_asset_refs(volume, std::path::Path::new(root));
    normalize_path(bind_source_text(&resolved))
}

/// The host path a `volumes` entry binds, in its final form for the agent whose data dir is
/// `data_dir` (see `final_bind_source`); `None` for a named volume.
pub fn bind_source(volume: &str, data_dir: &str) -> Option<String> {
    final_bind_source(volume, &OwnedPaths::for_data_dir(data_dir))
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
    fn bind_sources_are_judged_in_their_final_form() {
        let deny = with(|_| {});
        let text = |volume: &str| {
            format!(
                "asset \"s\" \"a\" {{\n  k = \"x\"\n}}\ndeployment \"s\" \"web\" {{\n  image   = \"busybox\"\n  volumes = [\"{volume}\"]\n}}\n"
            )
        };
        let rows: &[(&str, &[&str])] = &[
            // The asset file itself: the agent's own file, allowed.
            ("${asset.s.a.k}:/etc/app.conf:ro", &[]),
            // Walked out of the asset directory into the host's /etc.
            (
                "${asset.s.a.k}/../../../../../../../../etc:/x",
                &[
                    "m/app.hcl:6:3: bind mount of /etc (a system directory) is refused by the host policy; start the agent with --allow-bind-root /etc to allow it",
                ],
            ),
            // Into the agent's own data dir (state.db, secrets).
            (
                "${asset.s.a.k}/../../../../state.db:/db",
                &[
                    "m/app.hcl:6:3: bind mount of /srv/voodu/state.db (under /srv/voodu: the agent's own data dir (state.db, secrets)) is refused by the host policy; start the agent with --allow-bind-root /srv/voodu/state.db to allow it",
                ],
            ),
            // A directory of asset files is not a file the agent mounts.
            (
                "${asset.s.a.k}/..:/assets",
                &[
                    "m/app.hcl:6:3: bind mount of /srv/voodu/assets/s/a (under /srv/voodu: the agent's own data dir (state.db, secrets)) is refused by the host policy; start the agent with --allow-bind-root /srv/voodu/assets/s/a to allow it",
                ],
            ),
            // The Docker socket through the same walk.
            (
                "${asset.s.a.k}/../../../../../../var/run/docker.sock:/var/run/docker.sock",
                &[
                    "m/app.hcl:6:3: bind mount of /var/run/docker.sock (under /var/run: runtime sockets, the Docker socket among them) is refused by the host policy; start the agent with --allow-bind-root /var/run/docker.sock to allow it",
                ],
            ),
        ];
        for (volume, expected) in rows {
            assert_eq!(load(&text(volume), &deny), *expected, "{volume}");
        }
    }

    #[test]
    fn log_drivers_that_ship_output_off_the_host_are_refused() {
        check(
            r#"  docker_options = ["--log-driver=syslog", "--log-opt=syslog-address=tcp://127.0.0.1:5140"]"#,
            &with(|_| {}),
            &[
                "m/app.hcl:3:3: log driver \"syslog\" sends the container's output off this host's log files (to an address its --log-opt names, the host's own services among them) and is refused by the host policy (allowed: json-file, local, journald, none); start the agent with --allow-log-driver syslog to allow it",
            ],
        );
        check(
            r#"  docker_options = ["--log-driver", "local", "--log-opt", "max-size=10m"]"#,
            &with(|_| {}),
            &[],
        );
        check(
            r#"  docker_options = ["--log-driver=gelf"]"#,
            &with(|p| p.allow_log_driver = vec!["gelf".into()]),
            &[],
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
