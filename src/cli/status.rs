//! `voodu-agent status`: what the agent last saw, applied and rejected, and each resource's
//! state and pin, read from state.db (read-only, so it works while the agent runs). The JSON
//! is `http::status::build`'s, the same document `GET /status` returns.

use std::path::Path;
use std::process::ExitCode;

use anyhow::Context as _;
use clap::Args;

use super::time;
use crate::http::detail::DetailView;
use crate::http::status::{CommitOutcome, CommitView, StatusView, build};
use crate::model::text::{Esc, escape};

#[derive(Debug, Args)]
pub(super) struct StatusArgs {
    /// Print JSON instead of a table.
    #[arg(long)]
    json: bool,
}

pub(super) fn run(data_dir: &Path, args: &StatusArgs) -> anyhow::Result<ExitCode> {
    let store = super::open_store(data_dir, super::Access::ReadOnly)?;
    let view = build(&store).context("cannot read agent state")?;
    super::print_view(args.json, &view, print_table)
}

/// The deploy triggers: what each applied, what it holds, why it never fires.
fn print_triggers(view: &StatusView) {
    if view.triggers.is_empty() {
        return;
    }
    println!("\ntriggers (.voodu/*.yml)");
    for trigger in &view.triggers {
        let applied = trigger.applied.as_ref().map_or_else(
            || "nothing applied yet".to_owned(),
            |applied| {
                format!(
                    "applied {} @ {}",
                    Esc(&applied.apply_file),
                    &applied.commit[..applied.commit.len().min(12)]
                )
            },
        );
        match (&trigger.inactive_reason, &trigger.held) {
            (Some(reason), _) => println!(
                "  {:<16} {:<28} NEVER FIRES here: {}",
                Esc(&trigger.name),
                Esc(&trigger.file),
                Esc(reason)
            ),
            (None, Some(held)) => println!(
                "  {:<16} {:<28} {applied}; HELD {} since {}{} (deploy: manual): `{}`",
                Esc(&trigger.name),
                Esc(&trigger.file),
                Esc(&held.commit[..held.commit.len().min(12)]),
                time(held.since),
                if held.approved {
                    ", approved: applying at the next sync"
                } else {
                    ""
                },
                Esc(&held.approve_with)
            ),
            (None, None) => println!(
                "  {:<16} {:<28} {applied}",
                Esc(&trigger.name),
                Esc(&trigger.file)
            ),
        }
    }
}

/// Image automation: a line per followed image with a newer tag, a failing scan, a scan that
/// left tags out or a failed commit (`voodu-agent images` lists them all).
fn print_images(view: &StatusView) {
    let notable: Vec<_> = view
        .images
        .iter()
        .filter(|image| {
            image.update_available
                || image.scan_error.is_some()
                || image.scan_note.is_some()
                || image.commit_error.is_some()
        })
        .collect();
    if view.images.is_empty() {
        return;
    }
    println!(
        "
images: {} followed, {} with a newer tag (`voodu-agent images` lists them)",
        view.images.len(),
        view.images
            .iter()
            .filter(|image| image.update_available)
            .count()
    );
    for image in notable {
        let newer = image.latest_tag.as_deref().map_or_else(
            || "current".to_owned(),
            |tag| format!("NEWER {} available ({})", escape(tag), escape(&image.mode)),
        );
        let commit = super::images::commit_text(image);
        println!(
            "  {:<32} {} {newer}; scan {}{}",
            escape(&image.resource),
            escape(&image.image),
            super::images::scan_text(image),
            if commit.is_empty() {
                String::new()
            } else {
                format!("; {commit}")
            }
        );
    }
}

/// The freezes in force, and each commit a deploy window or a freeze holds.
fn print_holds(view: &StatusView) {
    for freeze in &view.freezes {
        let target = match freeze.source.as_str() {
            "*" => "every source".to_owned(),
            "" => "the repository".to_owned(),
            name => format!("source {}", escape(name)),
        };
        println!(
            "{:<14} {target} until {}: {}",
            "FROZEN",
            freeze.until.map_or_else(
                || "`voodu-agent unfreeze`".to_owned(),
                crate::manifest::window::rfc3339
            ),
            escape(&freeze.reason)
        );
    }
    let held = view.held.iter().map(|held| (None, held)).chain(
        view.sources
            .iter()
            .filter_map(|source| Some((Some(&source.name), source.held.as_ref()?))),
    );
    for (source, held) in held {
        println!(
            "{:<14} {}{} held until {} (since {}): {}{}",
            "HELD",
            source.map_or_else(String::new, |name| format!("source {}: ", escape(name))),
            Esc(&held.commit[..held.commit.len().min(12)]),
            held.until_text.as_deref().unwrap_or("no opening ahead"),
            time(held.since),
            escape(&held.reason),
            if held.released_by.is_some() {
                "; approved --now: applying at the next sync".to_owned()
            } else {
                format!(
                    "; the last applied commit keeps running (`voodu-agent approve --now {}` applies it now)",
                    Esc(&held.commit[..held.commit.len().min(12)])
                )
            }
        );
    }
}

/// With `--sources`: a line per source (its last applied and seen commits, its fetch), then
/// each source's rejected latest commit with its problems.
fn print_sources(view: &StatusView) {
    if view.sources.is_empty() {
        return;
    }
    println!();
    println!(
        "{:<16} {:<10} {:<22} {:<22} {:<14} FETCH",
        "SOURCE", "BRANCH", "LAST APPLIED", "LAST SEEN", "SCOPES"
    );
    let short = |commit: &Option<CommitView>| {
        commit.as_ref().map_or_else(
            || "-".to_owned(),
            |commit| {
                format!(
                    "{} ({})",
                    &commit.sha[..commit.sha.len().min(12)],
                    commit.outcome.as_str()
                )
            },
        )
    };
    for source in &view.sources {
        let fetch = match &source.fetch {
            Some(fetch) => match (&fetch.error, fetch.failing_since) {
                (Some(error), since) => format!(
                    "FAILING since {}: {}",
                    since.map_or_else(|| "?".to_owned(), time),
                    escape(error)
                ),
                (None, _) => format!("ok at {}", time(fetch.checked_at)),
            },
            None => "-".to_owned(),
        };
        println!(
            "{:<16} {:<10} {:<22} {:<22} {:<14} {fetch}",
            escape(&source.name),
            escape(&source.branch),
            escape(&short(&source.last_applied)),
            escape(&short(&source.last_seen)),
            escape(&source.scopes.join(",")),
        );
    }
    for source in &view.sources {
        let Some(rejected) = &source.last_rejected else {
            continue;
        };
        let is_latest = source.last_seen.as_ref().is_some_and(|seen| {
            seen.sha == rejected.sha && seen.outcome == CommitOutcome::Rejected
        });
        if is_latest {
            println!(
                "\nsource {}: the latest commit was rejected; the host keeps running what it applied last:",
                escape(&source.name)
            );
            for error in &rejected.errors {
                println!("  {}", escape(&error.to_string()));
            }
        }
    }
}

/// Branch previews: a line per preview (its state, branch, commit, hosts, scopes, when its
/// ttl removes it), and why one is refused or rejected.
fn print_previews(view: &StatusView) {
    if view.previews.is_empty() {
        return;
    }
    println!(
        "\n{:<24} {:<8} {:<24} {:<12} {:<20} {:<30} {:<18} HOSTS",
        "PREVIEW", "STATE", "BRANCH", "COMMIT", "PUSHED", "SCOPES", "EXPIRES"
    );
    for preview in &view.previews {
        let name = if preview.source.is_empty() {
            preview.slug.clone()
        } else {
            format!("{}#{}", preview.source, preview.slug)
        };
        println!(
            "{:<24} {:<8} {:<24} {:<12} {:<20} {:<30} {:<18} {}",
            escape(&name),
            escape(&preview.state),
            escape(&preview.branch),
            escape(&preview.commit[..preview.commit.len().min(12)]),
            time(preview.pushed),
            escape(&preview.scopes),
            if preview.state == "live" {
                time(preview.expires)
            } else {
                "-".to_owned()
            },
            escape(&preview.hosts),
        );
        if !preview.message.is_empty() {
            println!("  {}", escape(&preview.message));
        }
    }
}

fn print_table(view: &StatusView) {
    print_health(view);
    print_holds(view);
    print_commit_notes(view);
    print_triggers(view);
    print_sources(view);
    print_previews(view);
    print_images(view);
    print_maintenance(view);
    print_rollouts(view);
    println!();
    print_resources(view);
    print_release_notes(view);
}

/// Progressive rollouts (`canary {}` / `blue_green {}`): step, share, pause, last analysis.
fn print_rollouts(view: &StatusView) {
    if view.rollouts.is_empty() {
        return;
    }
    println!("\nrollouts (canary / blue-green; `voodu-agent promote|abort SCOPE/NAME`)");
    for row in &view.rollouts {
        let at = match row.step_text() {
            Some(step) => format!("{step} at {} %", row.share),
            None => format!("{} % of the traffic", row.share),
        };
        let mut line = format!(
            "  deployment/{}/{} {} release {}: {}, {at} ({} canary replica(s))",
            Esc(&row.scope),
            Esc(&row.name),
            Esc(&row.strategy),
            Esc(&row.release_text()),
            row.phase,
            row.canary_replicas
        );
        match (row.paused_until, row.phase) {
            (Some(until), "promoted") => {
                line.push_str(&format!(", old release kept until {}", time(until)));
            }
            (Some(until), "paused" | "progressing") => {
                line.push_str(&format!(", paused until {}", time(until)));
            }
            _ => {}
        }
        if row.verdict.is_empty() {
            line.push_str(", not analysed yet");
        } else {
            line.push_str(&format!(", last analysis {}", Esc(&row.verdict)));
            let values = row.analysis_text();
            if !values.is_empty() {
                line.push_str(&format!(" ({})", Esc(&values)));
            }
        }
        if row.promote_requested {
            line.push_str(", promote requested");
        }
        if row.abort_requested {
            line.push_str(", abort requested");
        }
        println!("{line}");
    }
}

/// The deployments in maintenance (`maintenance`).
fn print_maintenance(view: &StatusView) {
    if view.maintenance.is_empty() {
        return;
    }
    println!("\nmaintenance (ingress answers 503 with a page; replicas keep running)");
    for row in &view.maintenance {
        println!(
            "  deployment/{}/{} since {} by {}, Retry-After {}s: {}",
            Esc(&row.scope),
            Esc(&row.name),
            time(row.since),
            Esc(row.actor.as_deref().unwrap_or(&row.origin)),
            row.retry_after,
            Esc(&row.message)
        );
    }
}

/// The host, the runtime, the last commits, and how the fetch, the engine and the
/// notification sinks fare.
fn print_health(view: &StatusView) {
    let line = |label: &str, commit: &Option<CommitView>| match commit {
        Some(commit) => println!(
            "{label:<14} {} ({})",
            Esc(&commit.sha[..commit.sha.len().min(12)]),
            Esc(commit.outcome.as_str())
        ),
        None => println!("{label:<14} -"),
    };
    match &view.host {
        Some(host) if view.host_labels.is_empty() => println!("{:<14} {}", "host", Esc(host)),
        Some(host) => println!(
            "{:<14} {} (labels {})",
            "host",
            Esc(host),
            Esc(&view.host_labels.join(", "))
        ),
        None => println!("{:<14} - (applies every host's manifests)", "host"),
    }
    if view.runtime.as_deref() == Some("swarm") {
        println!(
            "{:<14} swarm (workloads are Docker Swarm services)",
            "runtime"
        );
    }
    line("last seen", &view.last_seen);
    line("last applied", &view.last_applied);
    line("last rejected", &view.last_rejected);
    match &view.fetch {
        Some(fetch) => match (&fetch.error, fetch.failing_since) {
            (Some(error), since) => println!(
                "{:<14} FAILING since {}: {}",
                "fetch",
                since.map_or_else(|| "?".to_owned(), time),
                Esc(error)
            ),
            (None, _) => println!("{:<14} ok at {}", "fetch", time(fetch.checked_at)),
        },
        None => println!("{:<14} -", "fetch"),
    }
    match &view.engine {
        Some(engine) => match (&engine.error, engine.unreachable_since) {
            (Some(error), since) => println!(
                "{:<14} UNREACHABLE since {}: {}\n{:<14} (resource phases below are as last seen, not live)",
                "engine",
                since.map_or_else(|| "?".to_owned(), time),
                Esc(error),
                ""
            ),
            (None, _) => println!("{:<14} reachable at {}", "engine", time(engine.checked_at)),
        },
        None => println!("{:<14} -", "engine"),
    }
    for sink in &view.notify {
        let error = if sink.last_error.is_empty() || sink.last_error_at < sink.last_success {
            String::new()
        } else {
            format!(
                ", FAILING since {}: {}",
                sink.last_error_at.map_or_else(|| "?".to_owned(), time),
                Esc(&sink.last_error)
            )
        };
        println!(
            "{:<14} {}: {} delivered, {} waiting, {} dropped, last success {}{error}",
            "notify",
            Esc(&sink.name),
            sink.delivered,
            sink.backlog,
            sink.dropped,
            sink.last_success.map_or_else(|| "never".to_owned(), time),
        );
    }
}

/// The applied commit's warnings, and the latest commit's errors when it was rejected.
fn print_commit_notes(view: &StatusView) {
    if let Some(applied) = &view.last_applied
        && !applied.warnings.is_empty()
    {
        println!("\nthe applied commit has warnings:");
        for warning in &applied.warnings {
            println!("  {}", escape(&warning.to_string()));
        }
    }
    if let Some(rejected) = &view.last_rejected {
        let is_latest = view
            .last_seen
            .as_ref()
            // The same SHA applied since (under a looser policy, say) is not rejected.
            .is_some_and(|seen| {
                seen.sha == rejected.sha && seen.outcome == CommitOutcome::Rejected
            });
        if is_latest {
            println!(
                "\nthe latest commit was rejected; the host keeps running the last applied one:"
            );
            for error in &rejected.errors {
                println!("  {}", escape(&error.to_string()));
            }
        }
    }
}

/// One line per resource (with its source when the agent follows several).
fn print_resources(view: &StatusView) {
    let several = !view.sources.is_empty();
    if several {
        println!(
            "{:<36} {:<12} {:>7} {:>7} {:>5}  {:<12} {:<12} {:<8} MESSAGE",
            "RESOURCE", "SOURCE", "DESIRED", "RUNNING", "READY", "PHASE", "HASH", "RELEASE"
        );
    } else {
        println!(
            "{:<36} {:>7} {:>7} {:>5}  {:<12} {:<12} {:<8} MESSAGE",
            "RESOURCE", "DESIRED", "RUNNING", "READY", "PHASE", "HASH", "RELEASE"
        );
    }
    for resource in &view.resources {
        let key = if resource.scope.is_empty() {
            format!("{}/{}", resource.kind, resource.name)
        } else {
            format!("{}/{}/{}", resource.kind, resource.scope, resource.name)
        };
        let key = escape(&key);
        let release = resource.release.as_ref().map_or_else(
            || "-".to_owned(),
            |release| {
                format!(
                    "{}@{}",
                    release.id,
                    &release.commit[..release.commit.len().min(7)]
                )
            },
        );
        // Replicated kinds publish readiness; an autoscaled count is marked `*`.
        let ready = resource
            .detail
            .as_ref()
            .and_then(DetailView::ready_replicas)
            .map_or_else(|| "-".to_owned(), |ready| ready.to_string());
        let desired = if resource
            .detail
            .as_ref()
            .and_then(DetailView::autoscaled_replicas)
            .is_some()
        {
            format!("{}*", resource.desired_replicas)
        } else {
            resource.desired_replicas.to_string()
        };
        let source = if several {
            format!("{:<12} ", escape(resource.source.as_deref().unwrap_or("-")))
        } else {
            String::new()
        };
        println!(
            "{key:<36} {source}{desired:>7} {:>7} {ready:>5}  {:<12} {:<12} {:<8} {}",
            resource.running_replicas,
            resource.phase,
            Esc(&resource.spec_hash[..resource.spec_hash.len().min(12)]),
            Esc(&release),
            Esc(&resource.message)
        );
    }
}

/// Below the table: autoscaled counts, tags that moved since a release resolved them, and
/// pinned resources.
fn print_release_notes(view: &StatusView) {
    if view.resources.iter().any(|resource| {
        resource
            .detail
            .as_ref()
            .and_then(DetailView::autoscaled_replicas)
            .is_some()
    }) {
        println!("\n* replicas set by the autoscaler (not in git)");
    }
    // What each resource's release runs as, and tags that moved since it resolved them.
    for resource in &view.resources {
        let Some(release) = &resource.release else {
            continue;
        };
        let key = format!("{}/{}/{}", resource.kind, resource.scope, resource.name);
        for moved in &release.images.moved {
            println!(
                "
{}: tag {} moved: release #{} runs {}, the registry now names {} (`voodu-agent redeploy {}/{}` runs it; a commit changing the resource does too)",
                Esc(&key),
                Esc(&moved.image),
                release.id,
                Esc(crate::model::image_policy::short_digest(&moved.recorded)),
                Esc(crate::model::image_policy::short_digest(&moved.current)),
                Esc(&resource.scope),
                Esc(&resource.name)
            );
        }
    }
    // Backups: the last one, the last verify, a run in flight.
    for resource in &view.resources {
        let Some(backup) = &resource.backup else {
            continue;
        };
        let key = format!("{}/{}/{}", resource.kind, resource.scope, resource.name);
        let run = |run: &crate::http::status::DataRunView| {
            format!(
                "#{} {} {}{}{}",
                run.id,
                run.state,
                run.ended_at
                    .map(crate::base::rfc3339_seconds)
                    .unwrap_or_default(),
                if run.bytes > 0 {
                    format!(" ({} bytes)", run.bytes)
                } else {
                    String::new()
                },
                if run.message.is_empty() {
                    String::new()
                } else {
                    format!(": {}", run.message)
                }
            )
        };
        let mut parts = Vec::new();
        if let Some(last) = &backup.last {
            parts.push(format!("last backup {}", run(last)));
        }
        if let Some(good) = &backup.last_good {
            parts.push(format!("last good {}", run(good)));
        }
        if let Some(verify) = &backup.last_verify {
            parts.push(format!("last verify {}", run(verify)));
        }
        if let Some(flight) = &backup.in_flight {
            parts.push(format!("{} {} in progress", flight.what, run(flight)));
        }
        println!("\n{}: {}", Esc(&key), Esc(&parts.join("; ")));
    }
    for resource in &view.resources {
        let Some(pin) = &resource.pin else {
            continue;
        };
        let git = match (&pin.git_commit, pin.git_differs) {
            (Some(commit), true) => format!(
                "git now differs (its version is from commit {})",
                &commit[..commit.len().min(12)]
            ),
            (None, true) => "git no longer declares it".to_owned(),
            (_, false) => "git declares the same spec".to_owned(),
        };
        println!(
            "\n{}/{}/{} is PINNED to commit {} (release #{}): auto-sync is paused for it; {}.\n  `voodu-agent unpin {}/{}` hands it back to git; so does the next commit that changes it.",
            resource.kind,
            Esc(&resource.scope),
            Esc(&resource.name),
            Esc(&pin.commit[..pin.commit.len().min(12)]),
            pin.release_id,
            Esc(&git),
            Esc(&resource.scope),
            Esc(&resource.name)
        );
    }
}
