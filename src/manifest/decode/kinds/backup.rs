//! A statefulset's `backup {}` block (an extension: voodu has none): restic's repository and
//! password file, the schedule (a cronjob's grammar and time zone), the mode and its
//! commands, verification, timeout and `keep {}`.
//!
//! Invariant: every field is checked here, at the line that breaks it; the host policy on the
//! repository and password file (host paths) is `manifest::policy`'s, and the check that a
//! `stop`/`live` backup has a `volume_claim` to read is the statefulset's.

use super::super::reader::{DecodeCx, Reader};
use super::super::values;
use super::checks::{check_at_most, check_items};
use crate::manifest::spec::backup::{REPOSITORY_BACKENDS, backend_of};
use crate::manifest::spec::bounds::{
    MAX_BACKUP_KEEP, MAX_BACKUP_TIMEOUT, MIN_BACKUP_TIMEOUT, show_duration,
};
use crate::manifest::spec::schedule::{check_schedule, parse_timezone};
use crate::manifest::spec::{Backup, BackupMode, Keep};
use crate::model::parse_go_duration;

/// Whose `backup` block it is.
pub(super) enum Owner<'a> {
    /// A statefulset: its claims are backed up (`volume` is refused).
    Statefulset,
    /// A deployment, with its `volumes` entries: `volume` names one of its named volumes
    /// (required unless the mode is `exec`, whose dump is the backup).
    Deployment { volumes: &'a [String] },
}

/// The `backup` block of a statefulset's or deployment's body `r`, if it has one (a second
/// one is refused).
pub(super) fn backup(
    cx: &mut DecodeCx<'_>,
    r: &mut Reader<'_>,
    owner: Owner<'_>,
) -> Option<Backup> {
    let block = r.block(cx, "backup")?;
    let mut b = r.nested(block, "");
    let volume = b.string(cx, "volume").unwrap_or_default();
    let repository = repository(cx, &mut b);
    let password_file = b.required_string(cx, "password_file").unwrap_or_default();
    if !password_file.is_empty() && !password_file.starts_with('/') {
        cx.error(
            b.span_of("password_file"),
            format!("`backup.password_file` must be an absolute host path, got {password_file:?}: write e.g. \"/etc/voodu/restic.pass\""),
        );
    }
    for (field, value) in [
        ("repository", &repository),
        ("password_file", &password_file),
    ] {
        if let Err(problem) = values::one_line(value) {
            cx.error(b.span_of(field), format!("`backup.{field}` {problem}"));
        }
    }
    let (schedule, timezone) = schedule(cx, &mut b);
    let mode_text = b.string(cx, "mode").unwrap_or_default();
    let mode = match mode_text.as_str() {
        "" | "stop" => BackupMode::Stop,
        "exec" => BackupMode::Exec,
        "live" => BackupMode::Live,
        other => {
            cx.error(
                b.span_of("mode"),
                format!("`backup.mode` {other:?} is not a backup mode: write \"stop\" (the default), \"exec\" or \"live\""),
            );
            BackupMode::Stop
        }
    };
    // An unknown mode is reported once, not again through its commands.
    let mode_known = matches!(mode_text.as_str(), "" | "stop" | "exec" | "live");
    let [mut command, mut restore_command] = [Vec::new(), Vec::new()];
    for (field, slot, what) in [
        (
            "command",
            &mut command,
            "the command whose stdout is the backup, like [\"pg_dump\", \"-Fc\", \"app\"]",
        ),
        (
            "restore_command",
            &mut restore_command,
            "the command that reads the backup on stdin, like [\"pg_restore\", \"-d\", \"app\"]",
        ),
    ] {
        let written = b.strings(cx, field);
        let lacks = b.lacks(field, &written);
        *slot = written.unwrap_or_default();
        check_items(cx, &b, field, slot, values::argument);
        if mode == BackupMode::Exec && lacks {
            cx.error(
                b.anchor.clone(),
                format!("backup with mode = \"exec\" needs `backup.{field}`: {what}"),
            );
        } else if mode != BackupMode::Exec && mode_known && b.span_of(field).is_some() {
            cx.error(
                b.span_of(field),
                format!("`backup.{field}` is for mode = \"exec\" only: remove it, or set mode = \"exec\""),
            );
        }
    }
    let before_release = b.bool(cx, "before_release").unwrap_or_default();
    let verify = b.string(cx, "verify").unwrap_or_default();
    if !matches!(verify.as_str(), "" | "daily" | "weekly") {
        cx.error(
            b.span_of("verify"),
            format!("`backup.verify` {verify:?} is not a period: write \"daily\" or \"weekly\", or leave it out"),
        );
    }
    let timeout = timeout(cx, &mut b);
    let keep = keep(cx, &mut b);
    match owner {
        Owner::Statefulset if !volume.is_empty() => cx.error(
            b.span_of("volume"),
            "`backup.volume` is for a deployment's named volume: a statefulset's backup reads its volume_claims; remove it",
        ),
        Owner::Statefulset => {}
        Owner::Deployment { volumes } => {
            let named: Vec<&str> = volumes
                .iter()
                .map(|entry| crate::model::policy::bind_source_text(entry))
                .filter(|source| !source.is_empty() && !source.starts_with('/'))
                .collect();
            if volume.is_empty() && mode != BackupMode::Exec && mode_known {
                cx.error(
                    b.anchor.clone(),
                    format!(
                        "a deployment's backup needs `backup.volume`, the named volume it backs up{}",
                        if named.is_empty() {
                            " (mount one with volumes = [\"data:/path\"]), or mode = \"exec\"".to_owned()
                        } else {
                            format!(": one of {}", named.join(", "))
                        }
                    ),
                );
            } else if !volume.is_empty() && !named.contains(&volume.as_str()) {
                cx.error(
                    b.span_of("volume"),
                    format!(
                        "`backup.volume` {volume:?} is not a named volume this deployment mounts: mount it with volumes = [\"{volume}:/path\"]{}",
                        if named.is_empty() {
                            String::new()
                        } else {
                            format!(", or name one of {}", named.join(", "))
                        }
                    ),
                );
            }
        }
    }
    b.finish(cx);
    Some(Backup {
        repository,
        password_file,
        schedule,
        timezone,
        mode,
        command,
        restore_command,
        before_release,
        verify,
        timeout,
        keep,
        volume,
    })
}

/// `repository`: restic's `-r`, a backend prefix or an absolute local path.
fn repository(cx: &mut DecodeCx<'_>, b: &mut Reader<'_>) -> String {
    let repository = b.required_string(cx, "repository").unwrap_or_default();
    if repository.is_empty() {
        return repository;
    }
    if repository.starts_with('-') {
        cx.error(
            b.span_of("repository"),
            format!("`backup.repository` {repository:?} starts with `-`, which restic would read as an option: write an absolute path or a backend URL"),
        );
    } else if backend_of(&repository).is_none() && !repository.starts_with('/') {
        cx.error(
            b.span_of("repository"),
            format!(
                "`backup.repository` {repository:?} is neither an absolute local path nor a restic backend: write e.g. \"/srv/backups/db\", or start it with one of {}",
                REPOSITORY_BACKENDS.iter().map(|backend| format!("{backend}:")).collect::<Vec<_>>().join(" ")
            ),
        );
    }
    repository
}

/// `schedule` and `timezone`, checked as a cronjob's.
fn schedule(cx: &mut DecodeCx<'_>, b: &mut Reader<'_>) -> (String, String) {
    let schedule = b.string(cx, "schedule").unwrap_or_default();
    if !schedule.is_empty()
        && let Err(problem) = check_schedule(&schedule)
    {
        cx.error(
            b.span_of("schedule"),
            format!("`backup.schedule` {schedule:?}: {problem}"),
        );
    }
    let timezone = b.string(cx, "timezone").unwrap_or_default();
    if let Err(problem) = parse_timezone(&timezone) {
        cx.error(
            b.span_of("timezone"),
            format!("`backup.timezone` {problem}"),
        );
    } else if !timezone.is_empty() && schedule.is_empty() && b.span_of("schedule").is_none() {
        cx.error(
            b.span_of("timezone"),
            "`backup.timezone` without a `schedule` means nothing: add a schedule, or remove it",
        );
    }
    (schedule, timezone)
}

/// `timeout`: a Go duration from 1s to 24h.
fn timeout(cx: &mut DecodeCx<'_>, b: &mut Reader<'_>) -> String {
    let Some(text) = b.string(cx, "timeout") else {
        return String::new();
    };
    match parse_go_duration(&text) {
        None => cx.error(
            b.span_of("timeout"),
            format!("`backup.timeout` {text:?} is not a duration (want e.g. \"30m\", \"1h\", \"1h30m\")"),
        ),
        Some(duration) if duration > MAX_BACKUP_TIMEOUT => cx.error(
            b.span_of("timeout"),
            format!(
                "`backup.timeout` {text:?} is above the limit of {}: write a shorter duration",
                show_duration(MAX_BACKUP_TIMEOUT)
            ),
        ),
        Some(duration) if duration < MIN_BACKUP_TIMEOUT => cx.error(
            b.span_of("timeout"),
            format!(
                "`backup.timeout` {text:?} is below {}: write a longer duration, or leave it out for 1h",
                show_duration(MIN_BACKUP_TIMEOUT)
            ),
        ),
        Some(_) => {}
    }
    text
}

/// `keep { last daily weekly monthly }`, each 0..=1000.
fn keep(cx: &mut DecodeCx<'_>, b: &mut Reader<'_>) -> Option<Keep> {
    let block = b.block(cx, "keep")?;
    let mut k = b.nested(block, "");
    let mut keep = Keep::default();
    for (field, slot) in [
        ("last", &mut keep.last),
        ("daily", &mut keep.daily),
        ("weekly", &mut keep.weekly),
        ("monthly", &mut keep.monthly),
    ] {
        let Some(count) = k.int(cx, field) else {
            continue;
        };
        let name = k.field(field);
        if count < 0 {
            cx.error(
                k.span_of(field),
                format!("`{name}` must not be negative, got {count}"),
            );
            continue;
        }
        check_at_most(
            cx,
            k.span_of(field),
            &name,
            count,
            MAX_BACKUP_KEEP,
            "snapshots kept: keep fewer",
        );
        *slot = u32::try_from(count.min(MAX_BACKUP_KEEP)).unwrap_or_default();
    }
    k.finish(cx);
    Some(keep)
}
