//! `job`: the container fields and a run's timeout and history; `cronjob` shares them.

use std::collections::BTreeMap;

use hcl::edit::structure::Block;

use super::super::reader::{DecodeCx, Reader};
use super::super::{Specs, scoped};
use super::Decoder;
use super::checks::check_at_most;
use super::container::container;
use crate::manifest::spec::bounds::{MAX_HISTORY, MAX_TIMEOUT};
use crate::manifest::spec::{JobSpec, Spec};
use crate::model::Kind;

/// The job fields (shared by `job` and, flat at its root, `cronjob`).
pub(super) fn job_fields(cx: &mut DecodeCx<'_>, r: &mut Reader<'_>) -> JobSpec {
    let container = container(cx, r);
    let mut spec = JobSpec {
        container,
        timeout: r.duration(cx, "timeout", MAX_TIMEOUT).unwrap_or_default(),
        successful_history_limit: r.int(cx, "successful_history_limit").unwrap_or_default(),
        failed_history_limit: r.int(cx, "failed_history_limit").unwrap_or_default(),
        asset_digests: BTreeMap::new(),
    };
    r.refuse(
        &[
            "replicas",
            "ports",
            "restart",
            "health_check",
            "probes",
            "init",
            "autoscale",
            "release",
            "on_deploy",
            "on_probe",
            "volume_claim",
        ],
        "jobs run to completion once; that field is for long-running workloads",
    );
    for (field, slot) in [
        (
            "successful_history_limit",
            &mut spec.successful_history_limit,
        ),
        ("failed_history_limit", &mut spec.failed_history_limit),
    ] {
        if *slot < 0 {
            cx.error(
                r.span_of(field),
                format!("`{field}` must not be negative, got {slot} (0 means the default)"),
            );
            *slot = 0;
        }
        check_at_most(
            cx,
            r.span_of(field),
            field,
            *slot,
            MAX_HISTORY,
            "runs kept per job: keep fewer",
        );
    }
    spec
}

fn job(cx: &mut DecodeCx<'_>, r: &mut Reader<'_>) -> JobSpec {
    job_fields(cx, r)
}

/// `job "scope" "name" { … }`.
impl Decoder for JobSpec {
    fn decode(cx: &mut DecodeCx<'_>, block: &Block) -> Option<Specs> {
        let (scope, name, mut reader) = scoped(cx, block)?;
        let spec = job(cx, &mut reader);
        reader.finish(cx);
        Some(vec![(Kind::Job, scope, name, Spec::Job(spec))])
    }
}
