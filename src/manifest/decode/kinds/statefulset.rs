//! `statefulset`: the container and workload fields, plus its `volume_claim` blocks; and a
//! macro's statefulset (`postgres`, `redis`).

use std::collections::BTreeMap;

use hcl::edit::Span;
use hcl::edit::structure::Block;

use super::super::reader::{DecodeCx, Reader, labels};
use super::super::{Specs, plugin_blocks, scoped, values};
use super::Decoder;
use super::backup::{Owner, backup};
use super::checks::truncated;
use super::container::container;
use super::workload::workload;
use crate::manifest::interpolate::is_ref_segment;
use crate::manifest::spec::bounds::MAX_VOLUME_SIZE;
use crate::manifest::spec::{BackupMode, Spec, StatefulsetSpec, VolumeClaim};
use crate::model::Kind;

fn statefulset(cx: &mut DecodeCx<'_>, r: &mut Reader<'_>) -> StatefulsetSpec {
    let container = container(cx, r);
    let workload = workload(cx, r, container.network_mode.is_empty(), "statefulset");
    let mut claims: Vec<VolumeClaim> = Vec::new();
    for block in r.blocks("volume_claim") {
        let label = labels(cx, block);
        let [(name, span)] = label.as_slice() else {
            cx.error(
                block.ident.span(),
                "`volume_claim` needs one label, its name: write `volume_claim \"data\" { mount_path = \"/data\" }`",
            );
            continue;
        };
        if !is_ref_segment(name) {
            cx.error(
                span.clone(),
                format!("volume_claim {name:?}: a claim name uses letters, digits, `_` and `-`"),
            );
        }
        if let Some(problem) = crate::model::names::too_long(
            name,
            crate::model::names::MAX_CLAIM,
            "part of the Docker volume `voodu-<scope>-<name>-<claim>-<n>`",
        ) {
            cx.error(
                span.clone(),
                format!("volume_claim {:?}… {problem}", truncated(name)),
            );
        }
        if claims.iter().any(|claim| &claim.name == name) {
            cx.error(span.clone(), format!("duplicate volume_claim {name:?}"));
        }
        let mut v = r.nested(block, name);
        let mount_path = v.required_string(cx, "mount_path").unwrap_or_default();
        if !mount_path.is_empty() && !mount_path.starts_with('/') {
            cx.error(
                v.span_of("mount_path"),
                format!("volume_claim {name:?}: mount_path must be absolute, got {mount_path:?}"),
            );
        }
        let size = v.string(cx, "size").unwrap_or_default();
        if !size.is_empty() {
            match crate::model::parse_memory(&size) {
                None => cx.error(
                    v.span_of("size"),
                    format!("volume_claim {name:?}: size {size:?} is not a size: write a number with Ki Mi Gi Ti (1024-based) or K M G T (1000-based), like \"20Gi\""),
                ),
                Some(bytes) if bytes > MAX_VOLUME_SIZE => cx.error(
                    v.span_of("size"),
                    format!("volume_claim {name:?}: size {size:?} is above the limit of 1024Ti: write a smaller size"),
                ),
                Some(_) => {}
            }
        }
        if let Err(problem) = values::one_line(&mount_path) {
            cx.error(
                v.span_of("mount_path"),
                format!("volume_claim {name:?}: mount_path {problem}"),
            );
        }
        v.finish(cx);
        claims.push(VolumeClaim {
            name: name.clone(),
            mount_path,
            size,
        });
    }
    let backup = backup(cx, r, Owner::Statefulset);
    r.refuse(
        &[
            "post_deploy",
            "keep_releases",
            "release",
            "autoscale",
            "on_deploy",
        ],
        "it is a deployment field; statefulsets have no release hooks, autoscaling or on_deploy",
    );
    StatefulsetSpec {
        container,
        replicas: workload.replicas,
        ports: workload.ports,
        restart: workload.restart,
        health_check: workload.health_check,
        volume_claims: claims,
        inits: workload.inits,
        probes: workload.probes.map(Box::new),
        on_probe: workload.on_probe,
        drain: workload.drain,
        backup: backup.map(Box::new),
        plugin_blocks: Vec::new(),
        expanded_from: None,
        asset_digests: BTreeMap::new(),
    }
}

/// A macro's statefulset: the statefulset fields, without the build-mode default (a macro's
/// image defaults to the plugin's).
pub(in crate::manifest) fn statefulset_for_macro(
    cx: &mut DecodeCx<'_>,
    reader: &mut Reader<'_>,
) -> StatefulsetSpec {
    let mut spec = statefulset(cx, reader);
    if spec.container.image.is_empty() && reader.span_of("build").is_none() {
        spec.container.build = None;
    }
    spec
}

/// `statefulset "scope" "name" { … }`.
impl Decoder for StatefulsetSpec {
    fn decode(cx: &mut DecodeCx<'_>, block: &Block) -> Option<Specs> {
        let (scope, name, mut reader) = scoped(cx, block)?;
        let mut spec = statefulset(cx, &mut reader);
        // A macro adds its own claim; a plain statefulset must declare one for a backup that
        // reads the claims' volumes.
        if spec
            .backup
            .as_ref()
            .is_some_and(|backup| backup.mode != BackupMode::Exec)
            && spec.volume_claims.is_empty()
        {
            cx.error(
                reader.span_of("backup"),
                "nothing to back up: declare a volume_claim or use mode = \"exec\"",
            );
        }
        spec.plugin_blocks = plugin_blocks::carry(cx, reader);
        Some(vec![(
            Kind::Statefulset,
            scope,
            name,
            Spec::Statefulset(spec),
        )])
    }
}
