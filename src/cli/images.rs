//! `voodu-agent images`: each resource's `image_update` policy, the tag it runs, the newer tag
//! its policy found, its mode and its repository's last scan; read-only, from state.db. The
//! JSON is `http::images::build`'s, the `images` of the status document.

use std::path::Path;
use std::process::ExitCode;

use anyhow::Context as _;
use clap::Args;

use super::time;
use crate::http::images::{ImageView, build};
use crate::model::text::Esc;

#[derive(Debug, Args)]
pub(super) struct ImagesArgs {
    /// Print JSON instead of a table.
    #[arg(long)]
    json: bool,
}

pub(super) fn run(data_dir: &Path, args: &ImagesArgs) -> anyhow::Result<ExitCode> {
    let store = super::open_store(data_dir, super::Access::ReadOnly)?;
    let views = build(&store).context("cannot read agent state")?;
    super::print_view(args.json, views.as_slice(), print_table)
}

/// The scan column: when, the error while scans fail, and what of the registry's listing was
/// left out.
pub(super) fn scan_text(view: &ImageView) -> String {
    let text = match (&view.scan_error, view.scanned_at) {
        (Some(error), Some(at)) => format!("FAILING at {}: {}", time(at), Esc(error)),
        (None, Some(at)) => format!("ok at {}", time(at)),
        _ => "not scanned yet".to_owned(),
    };
    match &view.scan_note {
        Some(note) => format!("{text} ({})", Esc(note)),
        None => text,
    }
}

/// The commit column (commit mode): the pushed commit or why not.
pub(super) fn commit_text(view: &ImageView) -> String {
    match (&view.commit, &view.commit_error) {
        (_, Some(error)) => format!("commit failed: {}", Esc(error)),
        (Some(commit), None) => format!("committed {}", Esc(&commit[..commit.len().min(12)])),
        (None, None) => String::new(),
    }
}

fn print_table(views: &[ImageView]) {
    if views.is_empty() {
        println!("(no resource has an image_update block)");
        return;
    }
    println!(
        "{:<32} {:<36} {:<20} {:<10} {:<10} {:<6} SCAN",
        "RESOURCE", "IMAGE", "POLICY", "CURRENT", "LATEST", "MODE"
    );
    for view in views {
        let extra = commit_text(view);
        println!(
            "{:<32} {:<36} {:<20} {:<10} {:<10} {:<6} {}{}",
            Esc(&view.resource).to_string(),
            Esc(&view.repository).to_string(),
            Esc(&view.policy).to_string(),
            Esc(&view.current_tag).to_string(),
            view.latest_tag
                .as_deref()
                .map_or_else(|| "-".to_owned(), |tag| Esc(tag).to_string()),
            Esc(&view.mode).to_string(),
            scan_text(view),
            if extra.is_empty() {
                String::new()
            } else {
                format!("; {extra}")
            }
        );
    }
}
