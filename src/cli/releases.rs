//! `voodu-agent releases SCOPE/NAME`: a resource's rollouts, newest first, each keyed to its
//! commit, with phase, spec hash, times and message; read-only, from state.db. The JSON is
//! `http::status::build_releases`'s, the same document `GET /releases/{scope}/{name}` returns.

use std::path::Path;
use std::process::ExitCode;
use std::time::Duration;

use clap::Args;

use super::time;
use crate::http::status::{ReleasesView, build_releases, resolve};

#[derive(Debug, Args)]
pub(super) struct ReleasesArgs {
    /// The resource: SCOPE/NAME, or KIND/SCOPE/NAME when several kinds share the name.
    #[arg(value_name = "SCOPE/NAME")]
    resource: String,
    /// Print JSON (with each release's spec snapshot) instead of a table.
    #[arg(long)]
    json: bool,
}

pub(super) fn run(data_dir: &Path, args: &ReleasesArgs) -> anyhow::Result<ExitCode> {
    let store = super::open_store(data_dir, super::Access::ReadOnly)?;
    let key = resolve(&store, &args.resource)?;
    let view = build_releases(&store, &key)?;
    super::print_view(args.json, &view, print_table)
}

fn short(text: &str) -> &str {
    text.get(..12).unwrap_or(text)
}

fn print_table(view: &ReleasesView) {
    use crate::model::text::Esc;
    println!("{}/{}/{}", view.kind, Esc(&view.scope), Esc(&view.name));
    if let Some(pin) = &view.pin {
        println!(
            "PINNED to commit {} (release #{}) since {}: auto-sync paused{}",
            Esc(short(&pin.commit)),
            pin.release_id,
            time(pin.pinned_at),
            if pin.git_differs {
                "; git now declares something else"
            } else {
                ""
            }
        );
    }
    println!();
    println!(
        "{:>5}  {:<12}  {:<12}  {:<14}  {:<11}  {:<20}  {:>8}  MESSAGE",
        "ID", "COMMIT", "HASH", "DIGEST", "PHASE", "STARTED", "TOOK"
    );
    for release in &view.releases {
        let took = release.finished_at.map_or_else(
            || "-".to_owned(),
            |finished| {
                humantime::format_duration(Duration::from_secs(
                    u64::try_from(finished - release.started_at).unwrap_or(0),
                ))
                .to_string()
            },
        );
        println!(
            "{:>5}  {:<12}  {:<12}  {:<14}  {:<11}  {:<20}  {:>8}  {}",
            release.id,
            Esc(short(&release.commit)),
            Esc(short(&release.spec_hash)),
            Esc(&release.images.short()),
            Esc(release.phase),
            time(release.started_at),
            took,
            Esc(&release.message)
        );
    }
    if view.releases.is_empty() {
        println!("(no releases recorded)");
    }
}
