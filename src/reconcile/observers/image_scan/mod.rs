//! Image automation's scanner (issue 27): every resource with `image_update` follows its
//! image's repository; each repository is scanned (registry API v2, `assets::registry`) once
//! per interval, the shortest its followers ask for, however many follow it; each follower's
//! policy then picks its newer tag, stored for `status`, `images` and `/metrics`; in `commit`
//! mode the bumps go to the `ImageCommitter` the agent wires in (git is not this stage's).
//!
//! Scans run beside the scanner's loop, each its own task, at most [`SCAN_CONCURRENCY`] at
//! once, each within the registry client's whole-scan deadline (`registry::SCAN_DEADLINE`);
//! each records its outcome as it ends, and its followers are decided then. So a registry
//! that trickles (a byte a second, within every deadline) holds one slot for at most that
//! deadline: the other repositories are scanned and decided on time, and their interval is
//! not stretched by it. A deadline alone would not do that: scans one after another would
//! still wait out each slow registry's whole deadline, one after the other.
//!
//! The loop wakes only when something is due: the soonest next scan, digest ask or tag look
//! (one `What::Image` entry on the timer, set anew after each look, [`next_look`]), a scan's
//! end, a registry's push notification, or a change of the desired state (a commit may follow
//! a new image).
//!
//! Invariants: the task waits only in the one timer (`What::Image`) and on its scans; a
//! repository has at most one scan in flight; a registry's Retry-After (a 429 or 503) is
//! honoured by the schedule (stored as the scan's `not_before`); a scan's failure keeps the
//! last good tags; a listing cut by a bound says so beside the scan (`note`); a bump is handed
//! over once per chosen tag (a failed or conflicting commit is tried again after the
//! repository's next scan, never forced).

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

pub(crate) mod committer;

pub use committer::{Bump, CommitError, CommitResult, ImageCommitter};

use crate::assets::registry::{self, Credentials, Scanner};
use crate::manifest::spec::{ImageUpdate, MIN_IMAGE_SCAN_INTERVAL, Spec};
use crate::model::{ResourceKey, split_image};
use crate::reconcile::run::timer::What;
use crate::reconcile::{context::Ctx, context::blocking, handlers::images};
use crate::runtime::Runtime;
use crate::store::{ImageScan, ImageUpdateRow, Store, next_scan};

/// Most repository scans in flight at once.
const SCAN_CONCURRENCY: usize = 4;

/// A resource following its image.
#[derive(Debug, Clone)]
struct Follower {
    key: ResourceKey,
    source: String,
    image: String,
    repository: String,
    tag: String,
    /// The digest the image is pinned to after its tag (`name:tag@sha256:…`), if any.
    digest: Option<String>,
    update: ImageUpdate,
}

impl Follower {
    /// Whether it follows its tag's digest (`policy = "digest"`) rather than newer tags.
    fn follows_digest(&self) -> bool {
        self.update
            .policy()
            .is_ok_and(|policy| policy.follows_digest())
    }
}

/// Runs until `shutdown`: a look at once, then when the next scan, ask or tag look is due
/// ([`next_look`]), as each scan ends, on a push notification and when the desired state
/// changes; each look starts the scans that are due (room allowing) and decides.
pub(crate) async fn run<R: Runtime>(
    ctx: Arc<Ctx<R>>,
    committer: Option<Arc<dyn ImageCommitter>>,
    pushes: crate::reconcile::run::wake::RegistryPushes,
    shutdown: CancellationToken,
) {
    let client = match registry::client(&ctx.options.registry_access) {
        Ok(client) => client,
        Err(error) => {
            tracing::error!(%error, "image automation is off: no HTTP client");
            return;
        }
    };
    let mut wake = ctx.timer.sleep(What::Image, Duration::ZERO);
    let mut desired = ctx.store.subscribe();
    let mut scans = Scans::default();
    let mut tags = TagWatch::default();
    loop {
        let scanned = tokio::select! {
            () = &mut wake => None,
            // A commit was applied (or a resource rolled back): what is followed may change.
            Ok(()) = desired.changed() => None,
            Some(repository) = scans.next() => Some(repository),
            // A registry said repositories were pushed to: their scans and tag looks are due
            // now.
            pushed = pushes.next() => {
                tags.pushed(&pushed);
                scans.forced.extend(pushed);
                None
            }
            () = shutdown.cancelled() => {
                scans.tasks.shutdown().await;
                return;
            }
        };
        // The second look at what a notification named (`PUSH_RECHECK`).
        let again = tags.recheck_due();
        scans.forced.extend(again.iter().cloned());
        tags.due.extend(again);
        tags.look(&ctx, &client).await;
        let wait = match pass(
            &ctx,
            &client,
            &mut scans,
            &tags,
            committer.as_deref(),
            scanned.as_deref(),
        )
        .await
        {
            Ok(wait) => wait,
            Err(error) => {
                tracing::warn!(%error, "image automation pass failed; next look");
                MIN_IMAGE_SCAN_INTERVAL
            }
        };
        tracing::trace!(?wait, "image automation: next look");
        wake = ctx.timer.sleep(What::Image, wait);
    }
}

/// How long until the next look: the soonest of `due` (when each followed repository that is
/// not being scanned is due again, unix seconds; one already due waits for a slot, and the
/// scan whose end frees it wakes the loop), `asks` (how long until each digest follower's
/// next ask) and the next tag look, at `now`. Never zero (no spinning) and never more than
/// [`TAG_LOOK_INTERVAL`].
fn next_look(due: &[i64], asks: &[Duration], tag_look: Duration, now: i64) -> Duration {
    let scans = due
        .iter()
        .filter(|due| **due > now)
        .map(|due| Duration::from_secs(u64::try_from(due - now).unwrap_or(u64::MAX)));
    scans
        .chain(asks.iter().copied())
        .chain([tag_look])
        .min()
        .unwrap_or(TAG_LOOK_INTERVAL)
        .clamp(Duration::from_secs(1), TAG_LOOK_INTERVAL)
}

/// How often a running release's tags are looked at for a move.
const TAG_LOOK_INTERVAL: Duration = Duration::from_secs(5 * 60);

/// How long after a registry's push notification the repositories it named are looked at
/// (and scanned) once more. A registry may notify before the tag moves: distribution's (Debian's
/// `docker-registry`) sends a manifest's push event once the manifest is stored and writes
/// the tag after it, so the look made at once can still read the old digest (seen in CI: the
/// notification 30 ms before the push's answer, the look's read between the two).
const PUSH_RECHECK: Duration = Duration::from_secs(2);

/// Watches the tags running releases resolved: what each names at its registry now, recorded
/// for `status` (a tag that moved), told once per move (`image.tag_moved`).
#[derive(Default)]
struct TagWatch {
    last: Option<tokio::time::Instant>,
    /// Repositories a registry notification made due before the interval.
    due: std::collections::BTreeSet<String>,
    /// Repositories a notification named, due again at `recheck_at` (`PUSH_RECHECK`).
    recheck: std::collections::BTreeSet<String>,
    recheck_at: Option<tokio::time::Instant>,
}

impl TagWatch {
    /// How long until the next periodic look or the next second look (a look that could not
    /// read the store is tried again after the shortest scan interval).
    fn next(&self) -> Duration {
        let now = tokio::time::Instant::now();
        let periodic = self.last.map_or(MIN_IMAGE_SCAN_INTERVAL, |last| {
            (last + TAG_LOOK_INTERVAL).saturating_duration_since(now)
        });
        self.recheck_at.map_or(periodic, |at| {
            periodic.min(at.saturating_duration_since(now))
        })
    }

    /// A registry notification named `pushed`: due now, and once more `PUSH_RECHECK` after
    /// the last notification (at most `MAX_PUSHED` repositories held for it, the wake queue's
    /// bound).
    fn pushed(&mut self, pushed: &std::collections::BTreeSet<String>) {
        self.due.extend(pushed.iter().cloned());
        for repository in pushed {
            if self.recheck.len() >= crate::reconcile::run::wake::MAX_PUSHED {
                break;
            }
            self.recheck.insert(repository.clone());
        }
        self.recheck_at = Some(tokio::time::Instant::now() + PUSH_RECHECK);
    }

    /// The repositories whose second look is due now, taken.
    fn recheck_due(&mut self) -> std::collections::BTreeSet<String> {
        match self.recheck_at {
            Some(at) if at <= tokio::time::Instant::now() => {
                self.recheck_at = None;
                std::mem::take(&mut self.recheck)
            }
            _ => std::collections::BTreeSet::new(),
        }
    }

    async fn look<R: Runtime>(&mut self, ctx: &Ctx<R>, client: &Scanner) {
        let now = tokio::time::Instant::now();
        let periodic = self
            .last
            .is_none_or(|last| now.duration_since(last) >= TAG_LOOK_INTERVAL);
        if !periodic && self.due.is_empty() {
            return;
        }
        let running = match blocking(&ctx.store, Store::running_images).await {
            Ok(running) => running,
            Err(error) => {
                tracing::warn!(%error, "cannot read the running releases' images");
                return;
            }
        };
        let due = std::mem::take(&mut self.due);
        if periodic {
            self.last = Some(now);
        }
        let mut looked = std::collections::BTreeSet::new();
        for (key, image, runs) in running {
            let repository = crate::model::image_policy::repository_of(&image);
            let Some((_, recorded)) = crate::model::image_policy::split_digest(&runs) else {
                continue;
            };
            let Some((_, tag)) = split_image(&image) else {
                continue;
            };
            if !(periodic || due.contains(repository)) || !looked.insert(image.clone()) {
                continue;
            }
            let credentials = credentials_for(ctx, &key, &image).await.ok().flatten();
            let current =
                match registry::manifest(client, repository, tag, credentials.as_ref()).await {
                    Ok(Some(manifest)) => manifest.digest,
                    Ok(None) => continue,
                    Err(error) => {
                        tracing::debug!(image, %error, "cannot look at a running tag");
                        continue;
                    }
                };
            let (tagged, digest) = (image.clone(), current.clone());
            let before = blocking(&ctx.store, move |store| {
                store.record_tag_digest(&tagged, &digest)
            })
            .await
            .ok()
            .flatten();
            if current != recorded && before.as_deref() != Some(current.as_str()) {
                tracing::warn!(%key, image, recorded, current, "a running release's tag moved");
                let (resource, message, data) = (
                    key.to_string(),
                    format!("{image} now names {current}; release runs {recorded}"),
                    serde_json::json!({ "image": image, "recorded": recorded, "current": current }),
                );
                let _ = blocking(&ctx.store, move |store| {
                    store.record_event("image.tag_moved", &resource, &message, data)
                })
                .await;
            }
        }
    }
}

/// The scans in flight, by task.
#[derive(Default)]
struct Scans {
    tasks: tokio::task::JoinSet<String>,
    repositories: HashMap<tokio::task::Id, String>,
    /// Repositories due now whatever their interval (a registry notification named them).
    forced: std::collections::BTreeSet<String>,
    /// What each tag a digest follower follows named when last asked, and when.
    named: BTreeMap<String, (String, tokio::time::Instant)>,
}

impl Scans {
    fn is_scanning(&self, repository: &str) -> bool {
        self.repositories
            .values()
            .any(|scanning| scanning == repository)
    }

    fn has_room(&self) -> bool {
        self.repositories.len() < SCAN_CONCURRENCY
    }

    /// Scans `repository` on its own task, which records the outcome in `store`.
    fn start(
        &mut self,
        store: Arc<Store>,
        client: Scanner,
        repository: String,
        credentials: Result<Option<Credentials>, String>,
    ) {
        let task = self
            .tasks
            .spawn(scan(store, client, repository.clone(), credentials));
        self.repositories.insert(task.id(), repository);
    }

    /// The repository whose scan ended next (its outcome recorded); `None` when none runs.
    async fn next(&mut self) -> Option<String> {
        let (id, ended) = match self.tasks.join_next_with_id().await? {
            Ok((id, _)) => (id, None),
            Err(error) => (error.id(), Some(error)),
        };
        let repository = self.repositories.remove(&id)?;
        if let Some(error) = ended {
            tracing::error!(repository, %error, "an image repository scan ended abnormally");
        }
        Some(repository)
    }
}

/// Lists the tags of `repository` and records the outcome (the tags and what was left out,
/// or the error and how long the registry asked to be left alone).
async fn scan(
    store: Arc<Store>,
    client: Scanner,
    repository: String,
    credentials: Result<Option<Credentials>, String>,
) -> String {
    let outcome = match credentials {
        Ok(credentials) => registry::list_tags(&client, &repository, credentials.as_ref())
            .await
            .map_err(|error| {
                let wait = error
                    .retry_after()
                    .map_or(0, |wait| i64::try_from(wait.as_secs()).unwrap_or(i64::MAX));
                (error.to_string(), wait)
            }),
        Err(error) => Err((error, 0)),
    };
    match &outcome {
        Ok(listing) => {
            tracing::debug!(
                repository,
                n_tags = listing.tags.len(),
                note = listing.note,
                "scanned an image repository"
            );
        }
        Err((error, _)) => {
            tracing::warn!(repository, %error, "cannot scan an image repository")
        }
    }
    let at = crate::store::now_unix();
    let scanned = repository.clone();
    let recorded = blocking(&store, move |store| match outcome {
        Ok(listing) => store.record_image_scan(&scanned, Ok((&listing.tags, &listing.note)), 0, at),
        Err((error, wait)) => {
            store.record_image_scan(&scanned, Err(&error), at.saturating_add(wait), at)
        }
    })
    .await;
    if let Err(error) = recorded {
        tracing::warn!(repository, %error, "cannot record an image repository scan");
    }
    repository
}

/// One look: start the scans that are due, decide over what is stored, hand commit-mode bumps
/// over. `scanned`: the repository whose scan just ended (a failed commit of its followers is
/// tried again). Returns how long until the next look is due ([`next_look`]).
async fn pass<R: Runtime>(
    ctx: &Ctx<R>,
    client: &Scanner,
    scans: &mut Scans,
    tags: &TagWatch,
    committer: Option<&dyn ImageCommitter>,
    scanned: Option<&str>,
) -> crate::reconcile::error::Result<Duration> {
    let followers = blocking(&ctx.store, followers).await?;
    let stored = blocking(&ctx.store, Store::image_scans).await?;
    let mut by_repository: BTreeMap<String, Vec<&Follower>> = BTreeMap::new();
    ask_named_digests(ctx, client, scans, &followers).await;
    let named: BTreeMap<String, String> = crate::model::map_of(
        scans
            .named
            .iter()
            .map(|(reference, (digest, _))| (reference.clone(), digest.clone())),
    );
    for follower in followers
        .iter()
        .filter(|follower| !follower.follows_digest())
    {
        by_repository
            .entry(follower.repository.clone())
            .or_default()
            .push(follower);
    }
    let now = crate::store::now_unix();
    start_due_scans(ctx, client, scans, &by_repository, &stored, now).await;
    let scanned_now: Vec<String> = scanned.map(str::to_owned).into_iter().collect();
    let followed: Vec<String> = by_repository.keys().cloned().collect();
    let (stored, previous) = blocking(&ctx.store, move |store| {
        store.retain_image_scans(&followed)?;
        Ok((store.image_scans()?, store.image_updates()?))
    })
    .await?;
    let rows: Vec<ImageUpdateRow> = followers
        .iter()
        .map(|follower| decide(follower, &stored, &named, now))
        .collect();
    let bumps = bumps_of(&followers, &rows, &previous, &scanned_now);
    blocking(&ctx.store, move |store| store.record_image_updates(&rows)).await?;
    if let Some(committer) = committer {
        commit_bumps(ctx, committer, bumps).await?;
    }
    let due: Vec<i64> = by_repository
        .iter()
        .filter(|(repository, _)| !scans.is_scanning(repository))
        .filter_map(|(repository, following)| {
            let last = stored.iter().find(|scan| &scan.repository == repository);
            next_scan(last, interval_secs(following))
        })
        .collect();
    let asked_now = tokio::time::Instant::now();
    let asks: Vec<Duration> = followers
        .iter()
        .filter(|follower| follower.follows_digest())
        .map(|follower| {
            let reference = format!("{}:{}", follower.repository, follower.tag);
            match scans.named.get(&reference) {
                Some((_, at)) => {
                    (*at + follower.update.interval()).saturating_duration_since(asked_now)
                }
                // Not answered yet (the registry failed): asked again after the shortest
                // interval.
                None => MIN_IMAGE_SCAN_INTERVAL,
            }
        })
        .collect();
    Ok(next_look(
        &due,
        &asks,
        tags.next(),
        crate::store::now_unix(),
    ))
}

/// The shortest interval of a repository's followers, in seconds.
fn interval_secs(following: &[&Follower]) -> i64 {
    let interval = following
        .iter()
        .map(|follower| follower.update.interval())
        .min()
        .unwrap_or(MIN_IMAGE_SCAN_INTERVAL);
    i64::try_from(interval.as_secs()).unwrap_or(i64::MAX)
}

/// Asks the registry what the tags digest followers follow name now (one manifest request
/// each, within its request deadline), for those due: forced, or not asked within their
/// interval.
async fn ask_named_digests<R: Runtime>(
    ctx: &Ctx<R>,
    client: &Scanner,
    scans: &mut Scans,
    followers: &[Follower],
) {
    // What the tags digest followers follow name now (asked of the registry, one manifest
    // request each, within its request deadline).
    let asked_at = tokio::time::Instant::now();
    for follower in followers
        .iter()
        .filter(|follower| follower.follows_digest())
    {
        let reference = format!("{}:{}", follower.repository, follower.tag);
        let due = scans.forced.contains(&follower.repository)
            || scans
                .named
                .get(&reference)
                .is_none_or(|(_, at)| asked_at.duration_since(*at) >= follower.update.interval());
        if !due {
            continue;
        }
        let credentials = credentials_for(ctx, &follower.key, &reference)
            .await
            .ok()
            .flatten();
        match registry::manifest(
            client,
            &follower.repository,
            &follower.tag,
            credentials.as_ref(),
        )
        .await
        {
            Ok(Some(manifest)) => {
                scans.named.insert(reference, (manifest.digest, asked_at));
            }
            Ok(None) => tracing::warn!(image = reference, "the registry has no such tag"),
            Err(error) => {
                tracing::warn!(image = reference, %error, "cannot ask the registry what the tag names")
            }
        }
    }
}

/// Starts a tag scan of each followed repository that is due (forced, or its last scan older
/// than the shortest interval of its followers) and not being scanned, while slots are free.
async fn start_due_scans<R: Runtime>(
    ctx: &Ctx<R>,
    client: &Scanner,
    scans: &mut Scans,
    by_repository: &BTreeMap<String, Vec<&Follower>>,
    stored: &[ImageScan],
    now: i64,
) {
    for (repository, following) in by_repository {
        if !scans.has_room() {
            // The rest wait for a slot: the next scan to end looks again.
            break;
        }
        let interval = interval_secs(following);
        let last = stored.iter().find(|scan| &scan.repository == repository);
        let forced = scans.forced.contains(repository);
        if scans.is_scanning(repository)
            || (!forced && next_scan(last, interval).is_some_and(|due| due > now))
        {
            continue;
        }
        scans.forced.remove(repository);
        let credentials = credentials_for(ctx, &following[0].key, &following[0].image)
            .await
            .map_err(|error| error.to_string());
        scans.start(
            ctx.store.clone(),
            client.clone(),
            repository.clone(),
            credentials,
        );
    }
}

/// The bumps to commit: a follower that commits, with a newer tag, not already handed over
/// (committed, or failed to commit and its repository not scanned again since).
fn bumps_of(
    followers: &[Follower],
    rows: &[ImageUpdateRow],
    previous: &[ImageUpdateRow],
    scanned_now: &[String],
) -> Vec<Bump> {
    followers
        .iter()
        .zip(rows)
        .filter(|(follower, row)| {
            let previous = previous.iter().find(|previous| previous.key == row.key);
            let handed_over = previous.is_some_and(|previous| {
                previous.latest == row.latest
                    && (!previous.commit_sha.is_empty()
                        || (!previous.commit_error.is_empty()
                            && !scanned_now.contains(&follower.repository)))
            });
            follower.update.commits() && !row.latest.is_empty() && !handed_over
        })
        .map(|(follower, row)| Bump {
            key: follower.key.clone(),
            source: follower.source.clone(),
            repository: follower.repository.clone(),
            from_tag: match &follower.digest {
                Some(digest) => format!("{}@{digest}", follower.tag),
                None => follower.tag.clone(),
            },
            to_tag: row.latest.clone(),
            push_branch: follower.update.push_branch.clone(),
        })
        .collect()
}

/// Commits `bumps`, one commit per source and target branch, and records each outcome.
async fn commit_bumps<R: Runtime>(
    ctx: &Ctx<R>,
    committer: &dyn ImageCommitter,
    bumps: Vec<Bump>,
) -> crate::reconcile::error::Result<()> {
    let mut by_branch: BTreeMap<(String, String), Vec<Bump>> = BTreeMap::new();
    for bump in bumps {
        by_branch
            .entry((bump.source.clone(), bump.push_branch.clone()))
            .or_default()
            .push(bump);
    }
    for (_, bumps) in by_branch {
        let keys: Vec<ResourceKey> = bumps.iter().map(|bump| bump.key.clone()).collect();
        let message = commit_message(&bumps);
        let outcome = committer.commit(bumps).await;
        match &outcome {
            Ok(sha) => tracing::info!(commit = %sha, %message, "committed image updates"),
            Err(error) => tracing::warn!(%error, %message, "cannot commit image updates"),
        }
        let outcome = outcome.map_err(|error| error.to_string());
        blocking(&ctx.store, move |store| {
            store.record_image_commit(&keys, outcome.as_ref().map_err(String::as_str), &message)
        })
        .await?;
    }
    Ok(())
}

/// The commit message for `bumps`: a subject, then one line per change
/// (`shop/web: app:1.4.2 → app:1.4.3`).
pub fn commit_message(bumps: &[Bump]) -> String {
    let mut message = if bumps.len() == 1 {
        format!("Update {} to {}", bumps[0].repository, bumps[0].to_tag)
    } else {
        format!("Update {} images", bumps.len())
    };
    message.push_str("\n\n");
    for bump in bumps {
        message.push_str(&format!(
            "{}/{}: {}:{} → {}:{}\n",
            bump.key.scope,
            bump.key.name,
            bump.repository,
            bump.from_tag,
            bump.repository,
            bump.to_tag
        ));
    }
    message
}

/// The decision of one follower over the stored scans.
fn decide(
    follower: &Follower,
    scans: &[ImageScan],
    named: &BTreeMap<String, String>,
    now: i64,
) -> ImageUpdateRow {
    let latest = if follower.follows_digest() {
        // `tag@sha256:…` when the tag names another digest than git pins.
        named
            .get(&format!("{}:{}", follower.repository, follower.tag))
            .filter(|digest| follower.digest.as_deref() != Some(digest.as_str()))
            .map(|digest| format!("{}@{digest}", follower.tag))
            .unwrap_or_default()
    } else {
        match (
            follower.update.policy(),
            scans
                .iter()
                .find(|scan| scan.repository == follower.repository),
        ) {
            (Ok(policy), Some(scan)) => policy
                .update(&follower.tag, &scan.tags)
                .unwrap_or_default()
                .to_owned(),
            _ => String::new(),
        }
    };
    ImageUpdateRow {
        key: follower.key.clone(),
        image: follower.image.clone(),
        repository: follower.repository.clone(),
        policy: describe(&follower.update),
        mode: if follower.update.commits() {
            "commit"
        } else {
            "report"
        }
        .to_owned(),
        latest,
        checked_at: now,
        commit_sha: String::new(),
        commit_error: String::new(),
    }
}

/// `semver ~1.4`, `numerical /^main-([0-9]+)$/ → $1`, …
fn describe(update: &ImageUpdate) -> String {
    let mut text = if update.policy.is_empty() {
        "semver".to_owned()
    } else {
        update.policy.clone()
    };
    if !update.range.is_empty() {
        text.push(' ');
        text.push_str(&update.range);
    }
    if !update.filter.is_empty() {
        text.push_str(&format!(" /{}/", update.filter));
    }
    if !update.extract.is_empty() {
        text.push_str(&format!(" → {}", update.extract));
    }
    text
}

/// Every resource with `image_update` whose image names a tag.
fn followers(store: &Store) -> crate::store::Result<Vec<Follower>> {
    let mut out = Vec::new();
    let sources = store.sources_of_desired()?;
    for desired in store.desired_all()? {
        let container = match &desired.spec {
            Spec::Deployment(spec) => &spec.container,
            Spec::Statefulset(spec) => &spec.container,
            Spec::Job(spec) => &spec.container,
            Spec::Cronjob(spec) => &spec.job.container,
            _ => continue,
        };
        let Some(update) = &container.image_update else {
            continue;
        };
        let (reference, digest) = match container.image.split_once('@') {
            Some((reference, digest)) => (reference, Some(digest.to_owned())),
            None => (container.image.as_str(), None),
        };
        let Some((repository, tag)) = split_image(reference) else {
            continue;
        };
        out.push(Follower {
            source: sources.get(&desired.key).cloned().unwrap_or_default(),
            key: desired.key.clone(),
            image: container.image.clone(),
            repository: repository.to_owned(),
            tag: tag.to_owned(),
            digest,
            update: update.clone(),
        });
    }
    Ok(out)
}

/// The basic credentials of the `registry` block for `image`'s host (a token, or a helper's).
async fn credentials_for<R: Runtime>(
    ctx: &Ctx<R>,
    key: &ResourceKey,
    image: &str,
) -> crate::reconcile::error::Result<Option<Credentials>> {
    Ok(images::auth_for(ctx, key, image)
        .await?
        .filter(|auth| !auth.password.is_empty() || !auth.username.is_empty())
        .map(|auth| Credentials {
            username: auth.username,
            secret: auth.password,
        }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::Kind;

    /// A notification's repositories are due at once and once more `PUSH_RECHECK` later (the
    /// registry may notify before the tag moves), and the loop's next wake is then.
    #[tokio::test(start_paused = true)]
    async fn a_pushed_repository_is_looked_at_now_and_once_more_after_the_recheck() {
        let pushed = std::collections::BTreeSet::from(["registry.test/app".to_owned()]);
        let mut tags = TagWatch {
            last: Some(tokio::time::Instant::now()),
            ..TagWatch::default()
        };
        assert_eq!(tags.next(), TAG_LOOK_INTERVAL);
        tags.pushed(&pushed);
        assert_eq!(tags.due, pushed);
        assert!(tags.recheck_due().is_empty(), "not yet");
        assert_eq!(tags.next(), PUSH_RECHECK);
        tokio::time::advance(PUSH_RECHECK).await;
        assert_eq!(tags.recheck_due(), pushed);
        assert!(tags.recheck_due().is_empty(), "once");
        assert_eq!(tags.next(), TAG_LOOK_INTERVAL - PUSH_RECHECK);
    }

    /// The scanner sleeps until a scan is due, not every `MIN_IMAGE_SCAN_INTERVAL`: one
    /// repository followed every hour and scanned a minute ago wakes it in 59 minutes (capped
    /// by the tag look), not in 10 s.
    #[test]
    fn the_next_look_is_when_something_is_due() {
        let now = 1_000_000;
        let minutes = |n: u64| Duration::from_secs(n * 60);
        // Scanned a minute ago, hourly: the tag look (in 5 min) comes first.
        assert_eq!(
            next_look(&[now + 59 * 60], &[], minutes(5), now),
            minutes(5)
        );
        // The tag look just happened: the scan is due in 59 min, capped at the tag look's
        // interval (5 min): never the 10 s tick of before.
        assert_eq!(
            next_look(&[now + 59 * 60], &[], TAG_LOOK_INTERVAL, now),
            TAG_LOOK_INTERVAL
        );
        // Several repositories: the soonest; a digest ask sooner still wins.
        assert_eq!(
            next_look(&[now + 120, now + 45], &[], TAG_LOOK_INTERVAL, now),
            Duration::from_secs(45)
        );
        assert_eq!(
            next_look(
                &[now + 45],
                &[Duration::from_secs(20)],
                TAG_LOOK_INTERVAL,
                now
            ),
            Duration::from_secs(20)
        );
        // A repository due already waits for a slot (a running scan's end wakes the loop):
        // it does not make the loop spin.
        assert_eq!(
            next_look(&[now - 5, now + 300], &[], TAG_LOOK_INTERVAL, now),
            TAG_LOOK_INTERVAL
        );
        // Nothing followed: the tag look only.
        assert_eq!(next_look(&[], &[], minutes(3), now), minutes(3));
        // Never zero.
        assert_eq!(
            next_look(&[], &[Duration::ZERO], Duration::ZERO, now),
            Duration::from_secs(1)
        );
    }

    #[test]
    fn commit_messages_list_every_change() {
        let bump = |name: &str, from: &str, to: &str| Bump {
            key: ResourceKey::new(Kind::Deployment, "shop", name),
            source: String::new(),
            repository: "app".into(),
            from_tag: from.into(),
            to_tag: to.into(),
            push_branch: String::new(),
        };
        assert_eq!(
            commit_message(&[bump("web", "1.4.2", "1.4.3")]),
            "Update app to 1.4.3\n\nshop/web: app:1.4.2 → app:1.4.3\n"
        );
        assert_eq!(
            commit_message(&[bump("web", "1.4.2", "1.4.3"), bump("api", "1", "2")]),
            "Update 2 images\n\nshop/web: app:1.4.2 → app:1.4.3\nshop/api: app:1 → app:2\n"
        );
    }
}
