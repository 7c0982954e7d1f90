//! `cronjob`: a schedule, its time zone and concurrency policy, and the job fields flat at
//! its root.

use hcl::edit::structure::Block;

use super::super::reader::{DecodeCx, Reader};
use super::super::{Specs, scoped};
use super::Decoder;
use super::job::job_fields;
use crate::manifest::spec::schedule::check_schedule;
use crate::manifest::spec::{CronjobSpec, Spec};
use crate::model::Kind;

fn cronjob(cx: &mut DecodeCx<'_>, r: &mut Reader<'_>) -> CronjobSpec {
    let schedule = r.required_string(cx, "schedule").unwrap_or_default();
    if !schedule.is_empty()
        && let Err(problem) = check_schedule(&schedule)
    {
        cx.error(
            r.span_of("schedule"),
            format!("`schedule` {schedule:?}: {problem}"),
        );
    }
    let timezone = r.string(cx, "timezone").unwrap_or_default();
    if let Err(problem) = crate::manifest::spec::schedule::parse_timezone(&timezone) {
        cx.error(r.span_of("timezone"), format!("`timezone` {problem}"));
    }
    let suspend = r.bool(cx, "suspend").unwrap_or_default();
    let concurrency_policy = r.string(cx, "concurrency_policy").unwrap_or_default();
    match concurrency_policy.as_str() {
        "" | "Allow" | "Forbid" => {}
        "Replace" => cx.error(
            r.span_of("concurrency_policy"),
            "concurrency_policy \"Replace\" is not implemented by voodu: use \"Forbid\" or \"Allow\"",
        ),
        other => cx.error(
            r.span_of("concurrency_policy"),
            format!("concurrency_policy {other:?} must be \"Allow\" or \"Forbid\" (case-sensitive)"),
        ),
    }
    let mut job = job_fields(cx, r);
    let successful_history_limit = std::mem::take(&mut job.successful_history_limit);
    let failed_history_limit = std::mem::take(&mut job.failed_history_limit);
    CronjobSpec {
        schedule,
        job,
        concurrency_policy,
        timezone,
        suspend,
        successful_history_limit,
        failed_history_limit,
    }
}

/// `cronjob "scope" "name" { … }`.
impl Decoder for CronjobSpec {
    fn decode(cx: &mut DecodeCx<'_>, block: &Block) -> Option<Specs> {
        let (scope, name, mut reader) = scoped(cx, block)?;
        let spec = cronjob(cx, &mut reader);
        reader.finish(cx);
        Some(vec![(Kind::Cronjob, scope, name, Spec::Cronjob(spec))])
    }
}
