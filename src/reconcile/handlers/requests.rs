//! The create requests a manifest's resources would send to the engine, built by the one
//! function the handlers build them with (`handlers::container::build`), and judged by the
//! host policy's rules at the sink (`runtime::guard`) before any is sent: `plan` and
//! `validate --policy` run the rules the agent runs, on the requests it would send.
//!
//! Invariant: pure. Bind sources are judged as written once resolved and folded (no host is
//! looked at: the sync stage and the sink resolve symlinks where they run).

use std::path::Path;

use crate::manifest::spec::{Container, Spec};
use crate::manifest::{Diagnostic, Manifest, Resource};
use crate::model::policy::OwnedPaths;
use crate::model::scopes::Ownership;
use crate::reconcile::handlers::container::{BuildError, Identity, Launch, build, on_own_network};
use crate::runtime::{ContainerSpec, Rules};

/// Every container request of `resource` as far as the host policy is concerned: its main
/// container and each init container (which runs with the pod's volumes and networks and
/// its own `docker_options`), on its source's network under `ownership`. A spec that cannot
/// become a container is an error.
pub fn container_requests(
    resource: &Resource,
    assets_root: &Path,
    ownership: &Ownership,
) -> Vec<Result<ContainerSpec, BuildError>> {
    let Some(container) = resource.spec.container() else {
        return Vec::new();
    };
    let key = &resource.key;
    let identity = Identity {
        name: format!("{}.plan", key.app_id()),
        kind: key.kind,
        role: key.kind.as_str().to_owned(),
        name_label: key.name.clone(),
        replica_id: "plan".to_owned(),
        ordinal: None,
        spec_hash: None,
        release_id: None,
        aliases: Vec::new(),
    };
    let build_one = |container: &Container, name: String| {
        let identity = Identity {
            name,
            ..identity.clone()
        };
        build(
            key,
            "plan",
            assets_root,
            "",
            &identity,
            container,
            &Launch::default(),
        )
        .map(|mut spec| {
            spec.networks = on_own_network(spec.networks, &ownership.network_of(&key.scope));
            spec
        })
    };
    let mut requests = vec![build_one(container, identity.name.clone())];
    let inits = match &resource.spec {
        Spec::Deployment(spec) => spec.inits.as_slice(),
        Spec::Statefulset(spec) => spec.inits.as_slice(),
        _ => &[],
    };
    for init in inits.iter().filter(|init| !init.docker_options.is_empty()) {
        let mut init_container = container.clone();
        init_container.docker_options = init.docker_options.clone();
        requests.push(build_one(
            &init_container,
            format!("{}-init-{}.plan", key.app_id(), init.name),
        ));
    }
    requests
}

/// What the sink would refuse of `manifest`'s requests, located at each resource's block. A
/// manifest the manifest stage accepted under the same policy has none: a refusal here is a
/// value that walked around that check, and the sink would stop it.
fn sink_refusals(
    manifest: &Manifest,
    rules: &Rules,
    assets_root: &Path,
    ownership: &Ownership,
) -> Vec<Diagnostic> {
    let mut refusals = Vec::new();
    for resource in &manifest.resources {
        for request in container_requests(resource, assets_root, ownership) {
            let Ok(request) = request else {
                // The manifest stage reports a spec that cannot be built.
                continue;
            };
            for message in rules.refusals(&request, false, &|path| Ok(path.to_owned())) {
                refusals.push(Diagnostic {
                    message: format!("the request to the engine is refused at the sink: {message}"),
                    ..resource.origin.clone()
                });
            }
        }
    }
    refusals
}

/// `sink_refusals` under `policy`, for the agent whose data dir the policy protects (its
/// asset files are the agent's own).
pub(crate) fn sink_refusals_under(
    manifest: &Manifest,
    policy: &crate::model::Policy,
) -> Vec<Diagnostic> {
    let data_dir = policy
        .data_dir
        .clone()
        .unwrap_or_else(|| crate::manifest::DEFAULT_DATA_DIR.to_owned());
    let owned = OwnedPaths::for_data_dir(&data_dir);
    let assets_root = Path::new(&data_dir).join(crate::model::policy::ASSETS_DIR);
    // As one source of several (`--sources`), the rules seals them from each other too.
    let ownership = policy.seal.as_ref().map_or_else(
        || std::sync::Arc::new(Ownership::single()),
        |seal| seal.ownership.clone(),
    );
    let rules = Rules::new(policy.clone(), owned).sealing(ownership.clone());
    sink_refusals(manifest, &rules, &assets_root, &ownership)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::manifest::{LoadOptions, load};
    use crate::model::Policy;

    #[test]
    fn plan_and_validate_judge_the_requests_the_agent_would_send() -> Result<(), String> {
        let text = r#"asset "s" "a" {
  k = "x"
}
deployment "s" "web" {
  image   = "busybox"
  volumes = ["${asset.s.a.k}/../../../../../../etc:/x"]
  init "migrate" {
    command        = ["true"]
    docker_options = ["--log-driver=gelf"]
  }
}
"#;
        let snapshot = crate::manifest::tests::snapshot(&[("m/app.hcl", text)]);
        // Loaded without a policy (the format alone), then judged as the sink would.
        let manifest = load(&snapshot, &LoadOptions::standalone())
            .map_err(|diagnostics| diagnostics.to_string())?;
        let policy = Policy {
            data_dir: Some("/srv/voodu".to_owned()),
            ..Policy::default()
        };
        let refusals: Vec<String> = sink_refusals_under(&manifest, &policy)
            .iter()
            .map(ToString::to_string)
            .collect();
        assert_eq!(
            refusals,
            [
                "m/app.hcl:4:1: the request to the engine is refused at the sink: bind mount of /etc (a system directory) is refused by the host policy; start the agent with --allow-bind-root /etc to allow it",
                "m/app.hcl:4:1: the request to the engine is refused at the sink: bind mount of /etc (a system directory) is refused by the host policy; start the agent with --allow-bind-root /etc to allow it",
                "m/app.hcl:4:1: the request to the engine is refused at the sink: log driver \"gelf\" sends the container's output off this host's log files (to an address its --log-opt names, the host's own services among them) and is refused by the host policy (allowed: json-file, local, journald, none); start the agent with --allow-log-driver gelf to allow it",
            ]
        );
        Ok(())
    }
}
