//! `deployment` (and the deployment half of `app`): the container and workload fields, plus
//! `post_deploy`, `keep_releases`, `release {}`, `autoscale {}`, `on_deploy {}` and the
//! rollout strategy (`canary {}` / `blue_green {}`).

use hcl::edit::Span;
use hcl::edit::structure::Block;

use super::super::reader::{DecodeCx, Reader};
use super::super::{Specs, plugin_blocks, scoped, values};
use super::Decoder;
use super::backup::{Owner, backup};
use super::checks::{check_at_most, check_items};
use super::container::container;
use super::workload::{targets, workload};
use crate::manifest::spec::bounds::{MAX_HISTORY, MAX_REPLICAS, MAX_TIMEOUT};
use crate::manifest::spec::{Autoscale, DeploymentSpec, OnDeploy, ReleaseHooks, Spec};
use crate::model::Kind;

pub(in crate::manifest::decode) fn deployment(
    cx: &mut DecodeCx<'_>,
    r: &mut Reader<'_>,
) -> DeploymentSpec {
    let container = container(cx, r);
    let workload = workload(cx, r, container.network_mode.is_empty(), "deployment");
    let mut spec = DeploymentSpec {
        container,
        replicas: workload.replicas,
        ports: workload.ports,
        restart: workload.restart,
        health_check: workload.health_check,
        post_deploy: r.strings(cx, "post_deploy").unwrap_or_default(),
        keep_releases: r.int(cx, "keep_releases").unwrap_or_default(),
        inits: workload.inits,
        probes: workload.probes.map(Box::new),
        on_probe: workload.on_probe,
        drain: workload.drain,
        ..DeploymentSpec::default()
    };
    if spec.health_check.is_empty() {
        spec.health_check = "/".to_owned();
    }
    check_items(cx, r, "post_deploy", &spec.post_deploy, values::argument);
    let volumes = spec.container.volumes.clone();
    spec.backup = backup(cx, r, Owner::Deployment { volumes: &volumes }).map(Box::new);
    spec.strategy = super::rollout::strategy(cx, r).map(Box::new);
    if spec.keep_releases < 0 {
        cx.error(
            r.span_of("keep_releases"),
            format!(
                "`keep_releases` must not be negative, got {}",
                spec.keep_releases
            ),
        );
    }
    check_at_most(
        cx,
        r.span_of("keep_releases"),
        "keep_releases",
        spec.keep_releases,
        MAX_HISTORY,
        "releases kept per deployment: keep fewer",
    );
    spec.release = release(cx, r);
    if let Some(autoscale) = autoscale(cx, r) {
        if spec.replicas.is_some() {
            cx.error(
                r.span_of("replicas"),
                "replicas and autoscale are mutually exclusive — use min/max instead",
            );
        } else if autoscale.min > 0 {
            spec.replicas = Some(autoscale.min);
        }
        spec.autoscale = Some(autoscale);
    }
    if let Some(block) = r.block(cx, "on_deploy") {
        let mut o = r.nested(block, "");
        spec.on_deploy = Some(OnDeploy {
            success: targets(cx, &mut o, "success"),
            failure: targets(cx, &mut o, "failure"),
        });
        o.finish(cx);
    }
    spec
}

/// `release { command pre_command post_command timeout }`: the release hooks.
fn release(cx: &mut DecodeCx<'_>, r: &mut Reader<'_>) -> Option<ReleaseHooks> {
    let block = r.block(cx, "release")?;
    let mut rel = r.nested(block, "");
    let hooks = ReleaseHooks {
        command: rel.strings(cx, "command").unwrap_or_default(),
        pre_command: rel.strings(cx, "pre_command").unwrap_or_default(),
        post_command: rel.strings(cx, "post_command").unwrap_or_default(),
        timeout: rel.duration(cx, "timeout", MAX_TIMEOUT).unwrap_or_default(),
    };
    check_items(cx, &rel, "command", &hooks.command, values::argument);
    check_items(
        cx,
        &rel,
        "pre_command",
        &hooks.pre_command,
        values::argument,
    );
    check_items(
        cx,
        &rel,
        "post_command",
        &hooks.post_command,
        values::argument,
    );
    rel.finish(cx);
    Some(hooks)
}

/// `autoscale { min max cpu_target cooldown_up cooldown_down }`, each bound checked.
fn autoscale(cx: &mut DecodeCx<'_>, r: &mut Reader<'_>) -> Option<Autoscale> {
    let block = r.block(cx, "autoscale")?;
    let mut a = r.nested(block, "");
    let autoscale = Autoscale {
        min: a.int(cx, "min").unwrap_or_default(),
        max: a.int(cx, "max").unwrap_or_default(),
        cpu_target: a.int(cx, "cpu_target").unwrap_or_default(),
        cooldown_up: a
            .duration(cx, "cooldown_up", MAX_TIMEOUT)
            .unwrap_or_default(),
        cooldown_down: a
            .duration(cx, "cooldown_down", MAX_TIMEOUT)
            .unwrap_or_default(),
    };
    let anchor = block.ident.span();
    if autoscale.min < 1 {
        cx.error(
            a.span_of("min").or(anchor.clone()),
            format!("autoscale.min must be >= 1 (got {})", autoscale.min),
        );
    }
    if autoscale.max < autoscale.min {
        cx.error(
            a.span_of("max").or(anchor.clone()),
            format!(
                "autoscale.max ({}) must be >= autoscale.min ({})",
                autoscale.max, autoscale.min
            ),
        );
    }
    for (field, value) in [("min", autoscale.min), ("max", autoscale.max)] {
        check_at_most(
            cx,
            a.span_of(field),
            &a.field(field),
            value,
            MAX_REPLICAS,
            "replicas per resource on one host: lower it, or spread the load over more hosts",
        );
    }
    if !(1..=100).contains(&autoscale.cpu_target) {
        cx.error(
            a.span_of("cpu_target").or(anchor),
            format!(
                "autoscale.cpu_target must be in (0, 100], got {}",
                autoscale.cpu_target
            ),
        );
    }
    a.finish(cx);
    Some(autoscale)
}

/// `deployment "scope" "name" { … }`.
impl Decoder for DeploymentSpec {
    fn decode(cx: &mut DecodeCx<'_>, block: &Block) -> Option<Specs> {
        let (scope, name, mut reader) = scoped(cx, block)?;
        let mut spec = deployment(cx, &mut reader);
        spec.plugin_blocks = plugin_blocks::carry(cx, reader);
        Some(vec![(
            Kind::Deployment,
            scope,
            name,
            Spec::Deployment(spec),
        )])
    }
}
