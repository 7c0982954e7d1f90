//! Host policy in the manifest stage: every value a commit writes judged by the rules of
//! `model::policy`, on its final form (asset references resolved under the agent's asset
//! directory, paths normalised), and each refusal located at the attribute that asks for it.
//!
//! Invariant: pure. This check gives `path:line:col`; the guarantee is the gate at the sink
//! (`runtime::guard`), which judges the request sent to the engine with the same rules, and the
//! sync stage, which may look at the host, checks bind sources again with their symlinks
//! resolved.

use std::collections::BTreeMap;

use super::decode::Resource;
use super::diagnostic::Diagnostic;
use super::interpolate::Reference;
use super::spec::{Backup, Container, Spec};
use crate::model::policy::{Caps, OwnedPaths, bind_source_text, normalize_path};
use crate::model::scopes::Seal;
use crate::model::{DockerOptions, resolve_asset_refs};

pub use crate::model::policy::Policy;

/// The service's data dir (`StateDirectory=voodu-agent`), also the one `validate` and tests
/// judge asset paths under when the policy names none.
pub const DEFAULT_DATA_DIR: &str = "/var/lib/voodu-agent";

/// Every refusal of `resource` under `policy`. `locations` maps a field (`volumes`,
/// `init "name".docker_options`) to where it is written; the block's origin stands in for a
/// field without one (a macro's generated values). `references` are the resource's
/// `${asset…}`/`${ref…}` references, each where it is written: with a seal (`--sources`),
/// each must point into a scope of the resource's own source.
pub(crate) fn check(
    policy: &Policy,
    resource: &Resource,
    locations: &BTreeMap<String, Diagnostic>,
    references: &[(Reference, Diagnostic)],
) -> Vec<Diagnostic> {
    let mut refusals = Vec::new();
    let mut refuse = |field: &str, message: String| {
        let at = locations.get(field).unwrap_or(&resource.origin);
        refusals.push(Diagnostic {
            message,
            ..at.clone()
        });
    };
    if let Some(seal) = &policy.seal {
        check_sealed(seal, &owned_paths(policy), resource, &mut refuse);
    }
    if !policy.seal_only {
        for (field, url) in webhook_urls(&resource.spec) {
            if let Some(refusal) = webhook_refusal(policy, url) {
                refuse(field, refusal);
            }
        }
    }
    if !policy.seal_only
        && let Some(backup) = resource.spec.backup()
    {
        check_backup(policy, backup, &mut refuse);
    }
    if !policy.seal_only && !policy.caps.is_empty() {
        check_caps(&policy.caps, resource, &mut refuse);
    }
    let mut refusals_of_references = Vec::new();
    if let Some(seal) = &policy.seal {
        for (reference, at) in references {
            if let Reference::Asset { scope, name, key } = reference {
                let scope = scope.as_deref().unwrap_or("");
                let what = format!(
                    "asset ${{asset.{}}}",
                    Reference::asset_ref(Some(scope).filter(|s| !s.is_empty()), name, key)
                );
                if let Some(refusal) = seal.refusal(&what, scope) {
                    refusals_of_references.push(Diagnostic {
                        message: refusal,
                        ..at.clone()
                    });
                }
            }
            if let Reference::Dependency {
                kind,
                scope: Some(scope),
                name,
                ..
            } = reference
                && let Some(refusal) = seal.refusal(
                    &format!("depends_on.resources: {kind}/{scope}/{name}"),
                    scope,
                )
            {
                refusals_of_references.push(Diagnostic {
                    message: refusal,
                    ..at.clone()
                });
            }
        }
    }
    let container = match resource.spec.container() {
        Some(container) if !policy.seal_only => container,
        _ => {
            refusals.extend(refusals_of_references);
            return refusals;
        }
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
    refusals.extend(refusals_of_references);
    refusals
}

/// `resource`'s replicas and its container's limits against `caps` (a branch preview's),
/// refused at `replicas` and at the `resources` block; a container without a limit gets the
/// cap at the sink (`runtime::guard`).
fn check_caps(caps: &Caps, resource: &Resource, refuse: &mut impl FnMut(&str, String)) {
    let replicas = match &resource.spec {
        Spec::Deployment(spec) => Some(spec.n_replicas()),
        Spec::Statefulset(spec) => Some(spec.n_replicas()),
        _ => None,
    };
    if let Some(refusal) = replicas.and_then(|n| caps.replicas_refusal(n)) {
        refuse("replicas", refusal);
    }
    // The autoscaler scales within `autoscale.max`: that is the count the cap bounds.
    if let Spec::Deployment(spec) = &resource.spec
        && let Some(autoscale) = &spec.autoscale
        && let Some(refusal) = usize::try_from(autoscale.max)
            .ok()
            .and_then(|max| caps.replicas_refusal(max))
    {
        refuse("autoscale", format!("autoscale.max: {refusal}"));
    }
    let Some(limits) = resource
        .spec
        .container()
        .and_then(|container| container.resources.as_ref())
        .and_then(|resources| resources.limits.as_ref())
    else {
        return;
    };
    if let Some(refusal) =
        crate::model::parse_memory(&limits.memory).and_then(|n| caps.memory_refusal(n))
    {
        refuse("resources", refusal);
    }
    if let Some(refusal) = crate::model::parse_cpus(&limits.cpu).and_then(|n| caps.cpus_refusal(n))
    {
        refuse("resources", refusal);
    }
}

/// What `resource` points at beyond its key, judged against `seal`: config buckets
/// (`env_from = ["scope/name"]`), asset files bound by path, the agent's claims (`voodu-…`
/// volumes), other sources' networks, and proxy-wide ingress settings (the TLS `ask`, which
/// only the source owning `""` may set). Named volumes and published ports are judged where
/// first-come claims are recorded (the store), ingress hosts too.
fn check_sealed(
    seal: &Seal,
    owned: &OwnedPaths,
    resource: &Resource,
    refuse: &mut impl FnMut(&str, String),
) {
    if let Spec::Ingress(ingress) = &resource.spec
        && let Some(tls) = &ingress.tls
        && tls.on_demand
        && !tls.ask.is_empty()
        && let Some(refusal) = seal.refusal("the proxy-wide on-demand TLS `ask` endpoint", "")
    {
        refuse(
            "tls",
            format!(
                "{refusal}; declare it in the repository that owns the unscoped resources (\"\")"
            ),
        );
    }
    let Some(container) = resource.spec.container() else {
        return;
    };
    for reference in &container.env_from {
        if let Some((scope, _)) = reference.split_once('/')
            && let Some(refusal) = seal.refusal(&format!("config bucket {reference}"), scope)
        {
            refuse("env_from", refusal);
        }
    }
    for volume in &container.volumes {
        if let Some(refusal) = sealed_volume_refusal(seal, owned, volume) {
            refuse("volumes", refusal);
        }
    }
    let named = (!container.network.is_empty()).then_some(&container.network);
    for network in named.into_iter().chain(&container.networks) {
        if let Some(owner) = seal.ownership.network_owner(network)
            && owner != seal.source
        {
            refuse(
                if container.networks.contains(network) {
                    "networks"
                } else {
                    "network"
                },
                crate::model::scopes::foreign(
                    &format!("network {network}"),
                    &seal.source,
                    Some(&owner),
                ),
            );
        }
    }
}

/// Why `volume` (a `volumes` entry) points at what another source holds: an asset file of a
/// scope it does not own (in its final form: references resolved, `..` folded), or a claim
/// volume (`voodu-<scope>-…`) of another source's statefulset. Symlinks are the sync stage's
/// and the sink's to resolve.
pub(crate) fn sealed_volume_refusal(
    seal: &Seal,
    owned: &OwnedPaths,
    volume: &str,
) -> Option<String> {
    match final_bind_source(volume, owned) {
        Some(source) => seal.bind_refusal(&source, owned),
        None => {
            let name = bind_source_text(volume);
            let rest = name.strip_prefix(CLAIM_PREFIX)?;
            let owner = seal.ownership.owner_of_derived(rest);
            (!seal.owns_derived(rest)).then(|| {
                crate::model::scopes::foreign(
                    &format!("volume {name} (named like a statefulset's claim, voodu-<scope>-<name>-<claim>-<ordinal>)"),
                    &seal.source,
                    owner,
                )
            })
        }
    }
}

/// The webhook URLs of `spec` (`on_deploy`, `on_probe`), each with its block's field name.
fn webhook_urls(spec: &Spec) -> Vec<(&'static str, &str)> {
    let (on_deploy, on_probe) = match spec {
        Spec::Deployment(spec) => (spec.on_deploy.as_ref(), spec.on_probe.as_ref()),
        Spec::Statefulset(spec) => (None, spec.on_probe.as_ref()),
        _ => (None, None),
    };
    let deploys = on_deploy
        .into_iter()
        .flat_map(|on| on.success.iter().chain(&on.failure))
        .map(|target| ("on_deploy", target.url.as_str()));
    let probes = on_probe
        .into_iter()
        .flat_map(|on| on.failure.iter().chain(&on.recovery))
        .map(|target| ("on_probe", target.url.as_str()));
    deploys.chain(probes).collect()
}

/// Why a webhook may not be sent to `url` as written: a scheme other than http(s), or an
/// address host the `url()` rules refuse (`--allow-url-host`). A host name is judged on the
/// addresses it resolves to when the webhook is sent.
fn webhook_refusal(policy: &Policy, url: &str) -> Option<String> {
    let Some((scheme, rest)) = url.split_once("://") else {
        return Some(format!(
            "webhook url {url:?}: write an http:// or https:// URL"
        ));
    };
    if !matches!(scheme.to_ascii_lowercase().as_str(), "http" | "https") {
        return Some(format!(
            "webhook url {url:?}: only http:// and https:// URLs are sent"
        ));
    }
    let authority = rest.split(['/', '?', '#']).next().unwrap_or_default();
    let host_port = authority
        .rsplit_once('@')
        .map_or(authority, |(_, host)| host);
    let host = match host_port.strip_prefix('[') {
        Some(bracketed) => bracketed
            .split_once(']')
            .map_or(bracketed, |(host, _)| host),
        None => host_port
            .rsplit_once(':')
            .map_or(host_port, |(host, _)| host),
    };
    let address = host.parse::<std::net::IpAddr>().ok()?;
    let hosts = crate::model::url_hosts::UrlHosts::parse(&policy.allow_url_host).ok()?;
    hosts
        .refusal(host, address)
        .map(|refusal| format!("webhook url {url:?}: {refusal}"))
}

/// A statefulset's `backup {}` names host paths the agent reads and writes for it: a local
/// `repository` (restic writes there) and the `password_file` (read). Each is judged as a bind
/// mount's host source, in its normalised form, so a manifest reaches no host path through a
/// backup that it could not bind.
fn check_backup(policy: &Policy, backup: &Backup, refuse: &mut impl FnMut(&str, String)) {
    let owned = owned_paths(policy);
    let repository = backup
        .is_local()
        .then_some(("backup.repository", backup.repository.as_str()));
    let password_file = ("backup.password_file", backup.password_file.as_str());
    for (field, path) in repository.into_iter().chain([password_file]) {
        // A path that is not absolute is reported by the decoder.
        if let Some(source) = normalize_path(path)
            && let Some(refusal) = policy.host_bind_refusal(&source, &owned)
        {
            refuse(
                field,
                format!(
                    "`{field}` {path:?} is a host path, judged as a bind mount's source: {refusal}"
                ),
            );
        }
    }
}

/// What the names of statefulset claims start with (`voodu-<scope>-<name>-<claim>-<n>`): only
/// the agent creates such volumes, for the source owning the scope.
pub(crate) const CLAIM_PREFIX: &str = "voodu-";

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

    /// A statefulset's backup names host paths: a local repository and the password file
    /// pass the bind-root rules, each refused where it is written; a remote repository is no
    /// host path.
    #[test]
    fn backup_host_paths_are_judged_as_bind_sources() {
        let statefulset = |repository: &str, password_file: &str| {
            format!(
                "statefulset \"s\" \"db\" {{\n  image = \"busybox\"\n  volume_claim \"data\" {{ mount_path = \"/data\" }}\n  backup {{\n    repository    = \"{repository}\"\n    password_file = \"{password_file}\"\n  }}\n}}\n"
            )
        };
        let srv = with(|p| p.allow_bind_root = vec!["/srv/backups".into()]);
        let rows: &[(String, Policy, &[&str])] = &[
            (
                statefulset("/srv/backups/db", "/srv/backups/db.pass"),
                srv.clone(),
                &[],
            ),
            (
                statefulset("s3:s3.amazonaws.com/db", "/srv/backups/db.pass"),
                srv.clone(),
                &[],
            ),
            (
                statefulset("/srv/backups/../voodu/db", "/etc/voodu/restic.pass"),
                srv.clone(),
                &[
                    "m/app.hcl:5:5: `backup.repository` \"/srv/backups/../voodu/db\" is a host path, judged as a bind mount's source: bind mount of /srv/voodu/db (under /srv/voodu: the agent's own data dir (state.db, secrets)) is refused by the host policy; start the agent with --allow-bind-root /srv/voodu/db to allow it",
                    "m/app.hcl:6:5: `backup.password_file` \"/etc/voodu/restic.pass\" is a host path, judged as a bind mount's source: bind mount of /etc/voodu/restic.pass (under /etc: a system directory) is refused by the host policy; start the agent with --allow-bind-root /etc/voodu/restic.pass to allow it",
                ],
            ),
            (
                statefulset("/srv/backups/db", "/etc/voodu/restic.pass"),
                with(|p| p.allow_bind_root = vec!["/srv/backups".into(), "/etc/voodu".into()]),
                &[],
            ),
            (
                statefulset("/mnt/backups", "/srv/backups/db.pass"),
                srv.clone(),
                &[
                    "m/app.hcl:5:5: `backup.repository` \"/mnt/backups\" is a host path, judged as a bind mount's source: bind mount of /mnt/backups is outside the host policy's bind roots (/srv/backups); start the agent with --allow-bind-root /mnt/backups to allow it",
                ],
            ),
        ];
        for (text, policy, expected) in rows {
            assert_eq!(load(text, policy), *expected, "{text}");
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

    #[test]
    fn webhook_addresses_the_url_rules_refuse_are_refused_where_written() {
        let hook = |url: &str| {
            format!("  on_deploy {{\n    success {{\n      url = \"{url}\"\n    }}\n  }}")
        };
        check(
            &hook("http://127.0.0.1:9/admin"),
            &with(|_| {}),
            &[
                "m/app.hcl:3:3: webhook url \"http://127.0.0.1:9/admin\": 127.0.0.1 is a loopback address; start the agent with --allow-url-host 127.0.0.1 to allow it",
            ],
        );
        check(
            &hook("http://127.0.0.1:9/admin"),
            &with(|p| p.allow_url_host = vec!["127.0.0.1".into()]),
            &[],
        );
        check(
            &hook("http://user@[::1]:80/"),
            &with(|_| {}),
            &[
                "m/app.hcl:3:3: webhook url \"http://user@[::1]:80/\": ::1 is a loopback address; start the agent with --allow-url-host ::1 to allow it",
            ],
        );
        check(
            &hook("file:///etc/passwd"),
            &with(|_| {}),
            &[
                "m/app.hcl:3:3: webhook url \"file:///etc/passwd\": only http:// and https:// URLs are sent",
            ],
        );
        // A name is judged on what it resolves to when the webhook is sent.
        check(&hook("https://hooks.example.com/x"), &with(|_| {}), &[]);
    }

    #[test]
    fn a_sealed_source_points_only_into_its_own_scopes() -> Result<(), String> {
        use crate::model::scopes::{Ownership, ScopePattern, Seal};
        let ownership = std::sync::Arc::new(
            Ownership::new(vec![
                (
                    "shop".to_owned(),
                    vec![ScopePattern::parse("shop").map_err(|error| error.to_string())?],
                ),
                (
                    "blog".to_owned(),
                    vec![ScopePattern::parse("s").map_err(|error| error.to_string())?],
                ),
            ])
            .map_err(|error| error.to_string())?,
        );
        let sealed = |edit: fn(&mut Policy)| {
            let mut policy = with(edit);
            policy.seal = Some(Seal::new("blog", ownership.clone()));
            policy
        };
        let owner = "belongs to source `shop`, not to source `blog`: a source's resources point only at what its own scopes hold";
        let rows: Vec<(&str, Vec<String>)> = vec![
            (r#"  env_from = ["shop/web"]"#, vec![format!("m/app.hcl:3:3: config bucket shop/web {owner}")]),
            (r#"  env_from = ["s/web", "web"]"#, vec![]),
            (
                r#"  volumes = ["/srv/voodu/assets/shop/cfg/k:/x"]"#,
                vec![format!("m/app.hcl:3:3: asset file /srv/voodu/assets/shop/cfg/k {owner}")],
            ),
            (r#"  volumes = ["/srv/voodu/assets/s/cfg/k:/x"]"#, vec![]),
            (
                r#"  volumes = ["voodu-shop-db-data-0:/x"]"#,
                vec![format!("m/app.hcl:3:3: volume voodu-shop-db-data-0 (named like a statefulset's claim, voodu-<scope>-<name>-<claim>-<ordinal>) {owner}")],
            ),
            (r#"  volumes = ["voodu-s-db-data-0:/x", "mine:/y"]"#, vec![]),
            // A dependency on another source's resource: refused there (not also as
            // undeclared, which it is in this source's commit).
            (
                r#"  depends_on { resources = ["statefulset/shop/db"] }"#,
                vec![format!("m/app.hcl:3:29: depends_on.resources: statefulset/shop/db {owner}")],
            ),
            (
                r#"  networks = ["voodu0-shop"]"#,
                vec![
                    format!("m/app.hcl:3:3: network voodu0-shop {owner}"),
                    "m/app.hcl:3:3: network \"voodu0-shop\" is refused by the host policy (allowed: voodu0); start the agent with --allow-network voodu0-shop to allow it".to_owned(),
                ],
            ),
        ];
        for (fields, expected) in rows {
            let expected: Vec<&str> = expected.iter().map(String::as_str).collect();
            check(fields, &sealed(|_| {}), &expected);
        }
        Ok(())
    }
}
