//! The dashboard's pages and live documents, built from the status and release documents
//! (`super::super::status`: the same views `status --json` prints) and the rollout samples.
//!
//! Invariants: each page's live parts are computed once, by a `*_live` function that both
//! the first render and the event stream use, so a live update never shows something the
//! page would not; every store text goes through `Esc`/`UrlPart` (see `html.rs`).

use std::fmt::Write as _;

use serde::Serialize;

use super::diff::{self, Line};
use super::html::{Esc, UrlPart, badge, duration, phase_class, short, time};
use super::plot::{self, ReadyPlot, ReleaseBar, Sample};
use crate::http::detail::DetailView;
use crate::http::status::{CommitView, ImagesView, ReleasesView, ResourceView, StatusView};

/// `KIND/SCOPE/NAME` of a resource view.
pub(super) fn key_text(resource: &ResourceView) -> String {
    format!("{}/{}/{}", resource.kind, resource.scope, resource.name)
}

/// The resource page's path.
pub(super) fn resource_href(resource: &ResourceView) -> String {
    format!(
        "/ui/resource/{}/{}/{}",
        UrlPart(&resource.kind),
        UrlPart(&resource.scope),
        UrlPart(&resource.name)
    )
}

/// A resource's line of the overview, as shown and as sent live.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub(super) struct Row {
    pub(super) key: String,
    pub(super) phase: String,
    pub(super) phase_class: &'static str,
    /// `ready/desired` (or `running/desired` for the kinds without readiness).
    pub(super) ready: String,
    pub(super) release: String,
    pub(super) pin: String,
    pub(super) message: String,
}

fn row(resource: &ResourceView) -> Row {
    Row {
        key: key_text(resource),
        phase: resource.phase.to_owned(),
        phase_class: phase_class(resource.phase),
        ready: ready_text(resource),
        release: resource
            .release
            .as_ref()
            .map_or_else(String::new, |release| {
                format!(
                    "#{} {} {}",
                    release.id,
                    short(&release.commit),
                    release.phase
                )
            }),
        pin: resource.pin.as_ref().map_or_else(String::new, |pin| {
            format!("pinned to {}", short(&pin.commit))
        }),
        message: resource.message.clone(),
    }
}

fn ready_text(resource: &ResourceView) -> String {
    match resource
        .detail
        .as_ref()
        .and_then(DetailView::ready_replicas)
    {
        Some(ready) => format!("{ready}/{}", resource.desired_replicas),
        None if resource.desired_replicas > 0 => format!(
            "{}/{} running",
            resource.running_replicas, resource.desired_replicas
        ),
        None => "—".to_owned(),
    }
}

/// The last rejected commit, with every problem's location.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub(super) struct Rejected {
    pub(super) sha: String,
    pub(super) seen_at: String,
    /// True when no commit was applied after it: the host runs the last applied one.
    pub(super) current: bool,
    /// `(path:line:col, message)`.
    pub(super) problems: Vec<(String, String)>,
}

fn rejected(view: &StatusView) -> Option<Rejected> {
    let commit = view.last_rejected.as_ref()?;
    let current = view
        .last_applied
        .as_ref()
        .is_none_or(|applied| applied.seen_at <= commit.seen_at);
    let mut problems: Vec<(String, String)> = commit
        .diagnostics
        .iter()
        .map(|diagnostic| {
            (
                format!("{}:{}:{}", diagnostic.path, diagnostic.line, diagnostic.col),
                diagnostic.message.clone(),
            )
        })
        .collect();
    if problems.is_empty() {
        problems = commit
            .errors
            .iter()
            .map(|error| (String::new(), error.clone()))
            .collect();
    }
    Some(Rejected {
        sha: commit.sha.clone(),
        seen_at: time(commit.seen_at),
        current,
        problems,
    })
}

/// How many resources are in one phase.
#[derive(Debug, Serialize)]
pub(super) struct PhaseCount {
    pub(super) phase: String,
    pub(super) class: &'static str,
    pub(super) count: usize,
}

/// The overview's live document.
#[derive(Debug, Serialize)]
pub(super) struct OverviewLive {
    pub(super) rows: Vec<Row>,
    pub(super) phases: Vec<PhaseCount>,
    pub(super) rejected: Option<Rejected>,
    pub(super) applied: String,
    pub(super) fetch: String,
    pub(super) fetch_class: &'static str,
    pub(super) engine: String,
    pub(super) engine_class: &'static str,
    /// The Images table's changing cells, by resource.
    pub(super) images: Vec<ImageRow>,
    /// The Sources table's changing cells, by source.
    pub(super) sources: Vec<SourceRow>,
}

/// One row of the Images table, live: its newer tag and last scan.
#[derive(Debug, Serialize)]
pub(super) struct ImageRow {
    pub(super) key: String,
    pub(super) latest: String,
    pub(super) scan: String,
}

/// One row of the Sources table, live: its applied commit and fetch.
#[derive(Debug, Serialize)]
pub(super) struct SourceRow {
    pub(super) name: String,
    pub(super) applied: String,
    pub(super) fetch: String,
    pub(super) fetch_class: &'static str,
}

fn image_row(image: &crate::http::images::ImageView) -> ImageRow {
    let scan = match (&image.scan_error, image.scanned_at) {
        (Some(error), Some(at)) => format!("failing at {}: {error}", time(at)),
        (None, Some(at)) => format!("ok at {}", time(at)),
        _ => "not yet".to_owned(),
    };
    ImageRow {
        key: image.resource.clone(),
        latest: image.latest_tag.clone().unwrap_or_else(|| "-".to_owned()),
        scan,
    }
}

fn source_row(source: &crate::http::status::SourceView) -> SourceRow {
    let (fetch, fetch_class) = match &source.fetch {
        None => ("not yet".to_owned(), "none"),
        Some(fetch) => match &fetch.error {
            Some(error) => (format!("failing: {error}"), "bad"),
            None => ("ok".to_owned(), "good"),
        },
    };
    SourceRow {
        name: source.name.clone(),
        applied: commit_line(source.last_applied.as_ref()),
        fetch,
        fetch_class,
    }
}

pub(super) fn overview_live(view: &StatusView) -> OverviewLive {
    let (fetch, fetch_class) = match &view.fetch {
        None => ("not yet".to_owned(), "none"),
        Some(fetch) => match &fetch.error {
            Some(error) => (format!("failing: {error}"), "bad"),
            None => ("ok".to_owned(), "good"),
        },
    };
    let (engine, engine_class) = match &view.engine {
        None => ("not checked yet".to_owned(), "none"),
        Some(engine) => match &engine.error {
            Some(error) => (format!("unreachable: {error}"), "bad"),
            None => ("reachable".to_owned(), "good"),
        },
    };
    let mut by_phase: std::collections::BTreeMap<&str, usize> = Default::default();
    for resource in &view.resources {
        *by_phase.entry(resource.phase).or_default() += 1;
    }
    OverviewLive {
        rows: view.resources.iter().map(row).collect(),
        phases: by_phase
            .into_iter()
            .map(|(phase, count)| PhaseCount {
                phase: phase.to_owned(),
                class: phase_class(phase),
                count,
            })
            .collect(),
        rejected: rejected(view),
        applied: commit_line(view.last_applied.as_ref()),
        fetch,
        fetch_class,
        engine,
        engine_class,
        images: view.images.iter().map(image_row).collect(),
        sources: view.sources.iter().map(source_row).collect(),
    }
}

fn commit_line(commit: Option<&CommitView>) -> String {
    commit.map_or_else(
        || "none yet".to_owned(),
        |commit| format!("{} at {}", short(&commit.sha), time(commit.seen_at)),
    )
}

/// The overview page: the agent's state, the last rejected commit, every resource, and the
/// activity of the last day.
/// With `--sources`, `source` shows only that source's resources (the others stay in the
/// page, hidden, so the live view still knows every row).
pub(super) fn overview_html(view: &StatusView, activity: &str, source: Option<&str>) -> String {
    let live = overview_live(view);
    let mut out = String::new();
    out.push_str("<section class=\"cards\">");
    card(&mut out, "Applied commit", "applied", &live.applied, "none");
    card(&mut out, "Fetch", "fetch", &live.fetch, live.fetch_class);
    card(
        &mut out,
        "Engine",
        "engine",
        &live.engine,
        live.engine_class,
    );
    let _ = write!(
        out,
        "<div class=\"card\"><h3>Resources</h3><p class=\"big\" id=\"n-resources\">{}</p><p id=\"phase-counts\">",
        view.resources.len()
    );
    for count in &live.phases {
        let _ = write!(
            out,
            "<span class=\"count\">{} {}</span> ",
            badge(&count.phase),
            count.count
        );
    }
    out.push_str("</p></div></section>\n");
    rejected_html(&mut out, live.rejected.as_ref());
    sources_html(&mut out, view, source);
    out.push_str("<section><h2>Resources</h2>\n<p class=\"notice\" id=\"changed\" hidden>Resources were added or removed: <a href=\"/ui\">reload</a></p>\n");
    if view.resources.is_empty() {
        out.push_str("<p class=\"muted\">No resource yet: the agent has not applied a commit that declares one.</p>");
    } else {
        let several = !view.sources.is_empty();
        out.push_str("<table class=\"resources\"><thead><tr><th>Resource</th>");
        if several {
            out.push_str("<th>Source</th>");
        }
        out.push_str("<th>Phase</th><th>Ready</th><th>Release</th><th>Pin</th><th>Message</th></tr></thead><tbody>\n");
        for (resource, row) in view.resources.iter().zip(&live.rows) {
            let owner = resource.source.as_deref().unwrap_or("");
            let hidden = source.is_some_and(|wanted| wanted != owner);
            let source_cell = if several {
                format!(
                    "<td><a href=\"/ui?source={}\">{}</a></td>",
                    UrlPart(owner),
                    Esc(if owner.is_empty() { "-" } else { owner })
                )
            } else {
                String::new()
            };
            let _ = write!(
                out,
                "<tr data-key=\"{}\"{}><td><span class=\"kind\">{}</span> <a href=\"{}\">{}/{}</a></td>{source_cell}<td data-field=\"phase\">{}</td><td class=\"num\" data-field=\"ready\">{}</td><td data-field=\"release\">{}</td><td data-field=\"pin\">{}</td><td class=\"message\" data-field=\"message\">{}</td></tr>",
                Esc(&row.key),
                if hidden { " hidden" } else { "" },
                Esc(&resource.kind),
                Esc(&resource_href(resource)),
                Esc(&resource.scope),
                Esc(&resource.name),
                badge(&row.phase),
                Esc(&row.ready),
                Esc(&row.release),
                Esc(&row.pin),
                Esc(&row.message)
            );
        }
        out.push_str("</tbody></table>");
    }
    out.push_str("</section>\n");
    images_html(&mut out, view);
    maintenance_html(&mut out, view);
    previews_html(&mut out, view);
    out.push_str(activity);
    out
}

/// Image automation (`image_update`): each followed image, its newer tag and last scan (live:
/// `OverviewLive::images`).
fn images_html(out: &mut String, view: &StatusView) {
    if view.images.is_empty() {
        return;
    }
    out.push_str("<section><h2>Images</h2>\n<table class=\"images\"><thead><tr><th>Resource</th><th>Image</th><th>Policy</th><th>Newer tag</th><th>Mode</th><th>Last scan</th></tr></thead><tbody>\n");
    for image in &view.images {
        let row = image_row(image);
        let _ = write!(
            out,
            "<tr data-image=\"{}\"><td>{}</td><td>{}</td><td>{}</td><td data-field=\"latest\">{}</td><td>{}</td><td class=\"message\" data-field=\"scan\">{}</td></tr>",
            Esc(&image.resource),
            Esc(&image.resource),
            Esc(&image.image),
            Esc(&image.policy),
            Esc(&row.latest),
            Esc(&image.mode),
            Esc(&row.scan)
        );
    }
    out.push_str("</tbody></table></section>\n");
}

/// The deployments in maintenance (`voodu-agent maintenance`), as of the page load.
fn maintenance_html(out: &mut String, view: &StatusView) {
    if view.maintenance.is_empty() {
        return;
    }
    out.push_str("<section><h2>Maintenance</h2>\n<p>The ingress answers 503 with a maintenance page; the replicas keep running.</p><table class=\"maintenance\"><thead><tr><th>Deployment</th><th>Since</th><th>By</th><th>Retry-After</th><th>Message</th></tr></thead><tbody>\n");
    for row in &view.maintenance {
        let _ = write!(
            out,
            "<tr><td>{}/{}</td><td>{}</td><td>{}</td><td class=\"num\">{}s</td><td class=\"message\">{}</td></tr>",
            Esc(&row.scope),
            Esc(&row.name),
            time(row.since),
            Esc(row.actor.as_deref().unwrap_or(&row.origin)),
            row.retry_after,
            Esc(&row.message)
        );
    }
    out.push_str("</tbody></table></section>\n");
}

/// Branch previews: each with its state, branch, commit, hosts (links), scopes and expiry, and
/// why one is refused, as of the page load.
fn previews_html(out: &mut String, view: &StatusView) {
    if view.previews.is_empty() {
        return;
    }
    out.push_str("<section><h2>Previews</h2>\n<table class=\"previews\"><thead><tr><th>Preview</th><th>State</th><th>Branch</th><th>Commit</th><th>Hosts</th><th>Scopes</th><th>Expires</th><th>Note</th></tr></thead><tbody>\n");
    for preview in &view.previews {
        let hosts: Vec<String> = preview
            .hosts
            .split(',')
            .filter(|host| !host.is_empty())
            .map(|host| format!("<a href=\"https://{}/\">{}</a>", UrlPart(host), Esc(host)))
            .collect();
        let expires = if preview.state == "live" {
            time(preview.expires)
        } else {
            "-".to_owned()
        };
        let _ = write!(
            out,
            "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td class=\"message\">{}</td></tr>",
            Esc(&preview.slug),
            Esc(&preview.state),
            Esc(&preview.branch),
            Esc(short(&preview.commit)),
            hosts.join(" "),
            Esc(&preview.scopes),
            Esc(&expires),
            Esc(&preview.message)
        );
    }
    out.push_str("</tbody></table></section>\n");
}

/// With `--sources`: one row per source (its branch, applied commit, fetch and scopes), each
/// name a filter of the resources below.
fn sources_html(out: &mut String, view: &StatusView, selected: Option<&str>) {
    if view.sources.is_empty() {
        return;
    }
    out.push_str("<section><h2>Sources</h2><table class=\"sources\"><thead><tr><th>Source</th><th>Branch</th><th>Applied commit</th><th>Fetch</th><th>Scopes</th></tr></thead><tbody>\n");
    for source in &view.sources {
        let row = source_row(source);
        let _ = write!(
            out,
            "<tr data-source=\"{}\"{}><td><a href=\"/ui?source={}\">{}</a></td><td>{}</td><td data-field=\"applied\">{}</td><td class=\"state {}\" data-field=\"fetch\">{}</td><td>{}</td></tr>",
            Esc(&source.name),
            if selected == Some(source.name.as_str()) {
                " class=\"selected\""
            } else {
                ""
            },
            UrlPart(&source.name),
            Esc(&source.name),
            Esc(&source.branch),
            Esc(&row.applied),
            Esc(row.fetch_class),
            Esc(&row.fetch),
            Esc(&source.scopes.join(", "))
        );
    }
    out.push_str("</tbody></table>");
    if selected.is_some() {
        out.push_str("<p><a href=\"/ui\">show every source's resources</a></p>");
    }
    out.push_str("</section>\n");
}

fn card(out: &mut String, title: &str, id: &str, text: &str, class: &str) {
    let _ = write!(
        out,
        "<div class=\"card\"><h3>{}</h3><p class=\"state {}\" id=\"{}\">{}</p></div>",
        Esc(title),
        Esc(class),
        Esc(id),
        Esc(text)
    );
}

fn rejected_html(out: &mut String, rejected: Option<&Rejected>) {
    let hidden = if rejected.is_some() { "" } else { " hidden" };
    let _ = write!(
        out,
        "<section class=\"rejected\" id=\"rejected\"{hidden}><h2>Rejected commit <code id=\"rejected-sha\">{}</code></h2><p id=\"rejected-note\">{}</p><ul class=\"problems\" id=\"rejected-problems\">",
        Esc(rejected.map_or("", |rejected| short(&rejected.sha))),
        Esc(&rejected.map_or_else(String::new, rejected_note))
    );
    for (location, message) in rejected.map_or(&[][..], |rejected| &rejected.problems[..]) {
        let _ = write!(
            out,
            "<li><code class=\"loc\">{}</code> {}</li>",
            Esc(location),
            Esc(message)
        );
    }
    out.push_str("</ul></section>\n");
}

/// What the rejection means for the host; also sent live.
pub(super) fn rejected_note(rejected: &Rejected) -> String {
    if rejected.current {
        format!(
            "Seen {}; nothing of it was applied: the host keeps running the last applied commit. Fix these and push:",
            rejected.seen_at
        )
    } else {
        format!(
            "Seen {}; a later commit was applied since. Its problems were:",
            rejected.seen_at
        )
    }
}

/// One container of a resource, as shown and as sent live.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub(super) struct Container {
    pub(super) name: String,
    pub(super) state: String,
    pub(super) ready: bool,
    pub(super) reason: String,
    /// `current` (of the spec being rolled out) or `old`.
    pub(super) version: &'static str,
}

fn containers(resource: &ResourceView) -> Vec<Container> {
    let version = |current: bool| if current { "current" } else { "old" };
    match &resource.detail {
        Some(DetailView::Deployment(detail)) => detail
            .replicas
            .iter()
            .map(|replica| Container {
                name: replica.name.clone(),
                state: replica.state.clone(),
                ready: replica.ready,
                reason: replica.reason.clone(),
                version: version(replica.current),
            })
            .collect(),
        Some(DetailView::Statefulset(detail)) => detail
            .pods
            .iter()
            .map(|pod| Container {
                name: pod.name.clone(),
                state: pod.state.clone(),
                ready: pod.ready,
                reason: pod.reason.clone(),
                version: version(pod.current),
            })
            .collect(),
        _ => Vec::new(),
    }
}

/// A resource page's live document.
#[derive(Debug, Serialize)]
pub(super) struct ResourceLive {
    pub(super) phase: String,
    pub(super) phase_class: &'static str,
    pub(super) message: String,
    pub(super) ready: String,
    pub(super) release: String,
    pub(super) containers: Vec<Container>,
    /// The ready replicas of the current release; `None` for kinds without readiness.
    pub(super) plot: Option<ReadyPlot>,
    pub(super) plot_title: String,
    /// The ids of the releases listed, newest first (a new one asks for a reload).
    pub(super) release_ids: Vec<i64>,
    /// A deployment's progressive rollout (`rollout.rs`); set by the caller, which reads it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(super) rollout: Option<super::rollout::RolloutLive>,
}

/// The samples the page plots: those of the resource's current release.
#[derive(Debug, Default)]
pub(super) struct Samples {
    pub(super) release_id: Option<i64>,
    pub(super) points: Vec<Sample>,
}

pub(super) fn resource_live(
    resource: &ResourceView,
    releases: &ReleasesView,
    samples: &Samples,
    now_ms: i64,
) -> ResourceLive {
    let row = row(resource);
    let current = resource.release.as_ref();
    let release_record =
        current.and_then(|current| releases.releases.iter().find(|r| r.id == current.id));
    let has_readiness = resource
        .detail
        .as_ref()
        .and_then(DetailView::ready_replicas)
        .is_some();
    let points: &[Sample] = match (current, samples.release_id) {
        (Some(current), Some(sampled)) if current.id == sampled => &samples.points,
        _ => &[],
    };
    let plot = has_readiness.then(|| {
        let start_ms = release_record.map_or(now_ms, |release| release.started_at * 1000);
        let end_ms = release_record
            .and_then(|release| release.finished_at)
            .map_or(now_ms, |finished| (finished * 1000).max(start_ms));
        plot::ready_plot(points, start_ms, end_ms)
    });
    let plot_title = match current {
        Some(current) => format!(
            "Ready replicas during release #{} ({})",
            current.id, current.phase
        ),
        None => "Ready replicas".to_owned(),
    };
    ResourceLive {
        phase: row.phase,
        phase_class: row.phase_class,
        message: row.message,
        ready: row.ready,
        release: row.release,
        containers: containers(resource),
        plot,
        plot_title,
        release_ids: releases.releases.iter().map(|release| release.id).collect(),
        rollout: None,
    }
}

/// The resource page: state, `after_cards` (a deployment's progressive rollout), rollout
/// plot, containers, releases with their timeline and the compare form.
pub(super) fn resource_html(
    resource: &ResourceView,
    releases: &ReleasesView,
    samples: &Samples,
    now_ms: i64,
    after_cards: &str,
) -> String {
    let live = resource_live(resource, releases, samples, now_ms);
    let mut out = String::new();
    let _ = write!(
        out,
        "<h1><span class=\"kind\">{}</span> {}/{} <span id=\"phase\">{}</span></h1>\n<p class=\"message\" id=\"message\">{}</p>\n<p class=\"notice\" id=\"changed\" hidden>A new release started: <a href=\"{}\">reload</a></p>\n",
        Esc(&resource.kind),
        Esc(&resource.scope),
        Esc(&resource.name),
        badge(&live.phase),
        Esc(&live.message),
        Esc(&resource_href(resource))
    );
    out.push_str("<section class=\"cards\">");
    card(&mut out, "Ready", "ready", &live.ready, "none");
    card(&mut out, "Release", "release", &live.release, "none");
    card(
        &mut out,
        "Spec hash",
        "spec-hash",
        short(&resource.spec_hash),
        "none",
    );
    let pin = resource.pin.as_ref().map_or_else(
        || "not pinned: follows git".to_owned(),
        |pin| {
            format!(
                "pinned to {} since {}{}",
                short(&pin.commit),
                time(pin.pinned_at),
                if pin.git_differs {
                    "; git declares something else"
                } else {
                    ""
                }
            )
        },
    );
    card(&mut out, "Pin", "pin", &pin, "none");
    out.push_str("</section>\n");
    out.push_str(after_cards);
    let _ = write!(
        out,
        "<div class=\"ids\" id=\"release-ids\" data-ids=\"{}\" hidden></div>",
        Esc(&ids_text(&live.release_ids))
    );
    if let Some(plot) = &live.plot {
        let _ = write!(
            out,
            "<section><h2 id=\"plot-title\">{}</h2><p class=\"caption\" id=\"plot-caption\">{}</p>{}<p class=\"legend\"><span class=\"key ready\"></span> ready <span class=\"key desired\"></span> wanted</p></section>",
            Esc(&live.plot_title),
            Esc(&plot.caption),
            plot::ready_svg(plot)
        );
    }
    if !live.containers.is_empty() || live.plot.is_some() {
        out.push_str("<section><h2>Containers</h2><table class=\"containers\"><thead><tr><th>Name</th><th>State</th><th>Ready</th><th>Why</th><th>Version</th></tr></thead><tbody id=\"containers\">");
        for container in &live.containers {
            container_row(&mut out, container);
        }
        out.push_str("</tbody></table></section>\n");
    }
    releases_html(&mut out, resource, releases, now_ms / 1000);
    out
}

fn ids_text(ids: &[i64]) -> String {
    ids.iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join(",")
}

fn container_row(out: &mut String, container: &Container) {
    let _ = write!(
        out,
        "<tr><td><code>{}</code></td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
        Esc(&container.name),
        Esc(&container.state),
        if container.ready {
            "<span class=\"badge good\">ready</span>"
        } else {
            "<span class=\"badge bad\">not ready</span>"
        },
        Esc(&container.reason),
        Esc(container.version)
    );
}

fn releases_html(out: &mut String, resource: &ResourceView, releases: &ReleasesView, now: i64) {
    out.push_str("<section><h2>Releases</h2>");
    let bars: Vec<ReleaseBar> = releases
        .releases
        .iter()
        .map(|release| ReleaseBar {
            id: release.id,
            commit: release.commit.clone(),
            phase: release.phase.to_owned(),
            started_at: release.started_at,
            finished_at: release.finished_at,
        })
        .collect();
    out.push_str(&plot::releases_timeline(&bars, now));
    if releases.releases.is_empty() {
        out.push_str("</section>\n");
        return;
    }
    out.push_str("<table class=\"releases\"><thead><tr><th>#</th><th>Commit</th><th>Phase</th><th>Images</th><th>Started</th><th>Took</th><th>Message</th></tr></thead><tbody>");
    for release in &releases.releases {
        let took = release.finished_at.map_or_else(
            || format!("{} so far", duration(now - release.started_at)),
            |end| duration(end - release.started_at),
        );
        let _ = write!(
            out,
            "<tr><td>{}</td><td><code>{}</code></td><td>{}</td><td><code>{}</code></td><td>{}</td><td>{}</td><td class=\"message\">{}</td></tr>",
            release.id,
            Esc(short(&release.commit)),
            badge(release.phase),
            Esc(&release.images.short()),
            Esc(&time(release.started_at)),
            Esc(&took),
            Esc(&release.message)
        );
    }
    out.push_str("</tbody></table>");
    if releases.releases.len() >= 2 {
        let _ = write!(
            out,
            "<form class=\"compare\" method=\"get\" action=\"{}/diff\"><label>Compare release <select name=\"from\">",
            Esc(&resource_href(resource))
        );
        release_options(out, releases, 1);
        out.push_str("</select></label> <label>with <select name=\"to\">");
        release_options(out, releases, 0);
        out.push_str(
            "</select></label> <button type=\"submit\">Show the difference</button></form>",
        );
    }
    out.push_str("</section>\n");
}

/// The `<option>`s of the compare form, one a release, the one at `selected` selected.
fn release_options(out: &mut String, releases: &ReleasesView, selected: usize) {
    for (index, release) in releases.releases.iter().enumerate() {
        let selected = if index == selected { " selected" } else { "" };
        let _ = write!(
            out,
            "<option value=\"{}\"{selected}>#{} {}</option>",
            release.id,
            release.id,
            Esc(short(&release.commit))
        );
    }
}

/// The difference between the snapshots of releases `from` and `to`; `None` when either is
/// not among the resource's releases.
pub(super) fn diff_html(
    resource: &ResourceView,
    releases: &ReleasesView,
    from: i64,
    to: i64,
) -> Option<String> {
    let find = |id: i64| releases.releases.iter().find(|release| release.id == id);
    let (old, new) = (find(from)?, find(to)?);
    let pretty = |value: &serde_json::Value| {
        serde_json::to_string_pretty(value).unwrap_or_else(|_| value.to_string())
    };
    let (old_text, new_text) = (pretty(&old.snapshot), pretty(&new.snapshot));
    let lines = diff::lines(&old_text, &new_text);
    let n_changed = lines
        .iter()
        .filter(|line| !matches!(line, Line::Same(_)))
        .count();
    let mut out = String::new();
    let _ = write!(
        out,
        "<h1><span class=\"kind\">{}</span> <a href=\"{}\">{}/{}</a>: release #{} → #{}</h1>\n<p>Spec of release #{} (commit <code>{}</code>, {}) against release #{} (commit <code>{}</code>, {}): {}.</p>\n",
        Esc(&resource.kind),
        Esc(&resource_href(resource)),
        Esc(&resource.scope),
        Esc(&resource.name),
        old.id,
        new.id,
        old.id,
        Esc(short(&old.commit)),
        Esc(old.phase),
        new.id,
        Esc(short(&new.commit)),
        Esc(new.phase),
        if n_changed == 0 {
            "the same spec".to_owned()
        } else {
            format!("{n_changed} line(s) differ")
        }
    );
    images_diff(&mut out, (old.id, &old.images), (new.id, &new.images));
    out.push_str("<pre class=\"diff\">");
    for line in &lines {
        let (class, sign, text) = match line {
            Line::Same(text) => ("same", ' ', text),
            Line::Removed(text) => ("del", '-', text),
            Line::Added(text) => ("add", '+', text),
        };
        let _ = writeln!(out, "<span class=\"{class}\">{sign} {}</span>", Esc(text));
    }
    out.push_str("</pre>\n");
    Some(out)
}

/// What each image ran as in the two releases: the same bytes, other bytes (a spec change, a
/// redeploy, a tag that moved between them), or not known (a release from before digests).
fn images_diff(out: &mut String, old: (i64, &ImagesView), new: (i64, &ImagesView)) {
    let runs = |view: &ImagesView, image: &str| -> String {
        if !view.resolved {
            return "digest unknown".to_owned();
        }
        view.images
            .iter()
            .find(|found| found.image == image)
            .map_or_else(|| "not named".to_owned(), |found| found.runs.clone())
    };
    let mut names: Vec<&str> = old
        .1
        .images
        .iter()
        .chain(&new.1.images)
        .map(|image| image.image.as_str())
        .collect();
    names.sort_unstable();
    names.dedup();
    if names.is_empty() {
        return;
    }
    let mut changed = 0;
    let mut rows = String::new();
    for name in &names {
        let (before, after) = (runs(old.1, name), runs(new.1, name));
        let same = old.1.resolved && new.1.resolved && before == after;
        if !same {
            changed += 1;
        }
        let _ = write!(
            rows,
            "<tr class=\"{}\"><td><code>{}</code></td><td><code>{}</code></td><td><code>{}</code></td><td>{}</td></tr>",
            if same { "same" } else { "changed" },
            Esc(name),
            Esc(&before),
            Esc(&after),
            if same {
                "the same bytes"
            } else if old.1.resolved && new.1.resolved {
                "other bytes"
            } else {
                "not known"
            }
        );
    }
    let _ = writeln!(
        out,
        "<section><h2>Images</h2><p id=\"images-summary\">{}</p><table class=\"images-diff\"><thead><tr><th>Image</th><th>#{} ran</th><th>#{} ran</th><th></th></tr></thead><tbody>{rows}</tbody></table></section>",
        if changed == 0 {
            "Every image runs the same bytes.".to_owned()
        } else {
            format!("{changed} image(s) run other bytes, or bytes not known.")
        },
        old.0,
        new.0,
    );
}
