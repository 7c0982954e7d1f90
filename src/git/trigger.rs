//! Sync triggers: poll ticks, webhook nudges and filesystem events of a local repository,
//! merged into one coalescing request channel that the sync loop drains one fetch at a time.
//!
//! Invariants:
//! - one fetch per new SHA: a request naming a commit that a fetch started after an earlier
//!   request for it already covers (in flight or done) starts nothing; requests that arrive
//!   while a fetch is pending join it; so a burst of any size costs at most one fetch in
//!   flight plus one pending;
//! - memory is bounded whatever the request rate: the channel is a flag plus at most
//!   `COVERED_LIMIT` remembered SHAs, never a queue of requests;
//! - a fetch that fails forgets the SHAs it covered, so the next request for them fetches
//!   again;
//! - every request gets a `Ticket`: the generation of the fetch that answers it, which
//!   `SyncRequests::fetched` waits for (a watch channel, no polling).

use std::collections::{HashMap, HashSet, VecDeque};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::{Notify, watch};
use tokio_util::sync::CancellationToken;

use crate::model::CommitSha;

/// How many fetched SHAs are remembered for coalescing (and waiting SHAs per pending fetch).
const COVERED_LIMIT: usize = 1024;

/// Why a sync was asked for: every reason gets the same fetch; the fetch remembers the most
/// specific reason among the requests it answers (a push over a poll tick), for the
/// activity log.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum SyncReason {
    /// The poll interval elapsed.
    Poll,
    /// A git host's webhook reported a push.
    Webhook,
    /// The refs of the local repository changed on disk.
    LocalChange,
    /// A `voodu-agent` command on this host (`sync`, or the nudge of `rollback`, `approve`…).
    Cli,
    /// Another client of the webhook endpoint (a CI script's generic signed request).
    Http,
}

impl SyncReason {
    /// Which reason a fetch answering several keeps: the most specific.
    fn rank(self) -> u8 {
        match self {
            SyncReason::Poll => 0,
            SyncReason::LocalChange => 1,
            SyncReason::Webhook | SyncReason::Cli | SyncReason::Http => 2,
        }
    }
}

/// A request to fetch now, optionally naming the commit the requester expects.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct SyncRequest {
    pub(crate) reason: SyncReason,
    pub(crate) commit: Option<CommitSha>,
    /// Who asked, where known (a webhook's pusher, the user of a command): untrusted text,
    /// made safe where it is kept.
    pub(crate) actor: Option<String>,
}

/// Why a fetch runs: the most specific reason among its requests, and that request's actor.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct RequestOrigin {
    pub(crate) reason: SyncReason,
    pub(crate) actor: Option<String>,
}

/// Which fetch answers a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Ticket {
    /// The generation (1-based count of fetches started) of the answering fetch.
    pub(crate) generation: u64,
    /// True when the request started no fetch of its own: an earlier request's fetch
    /// (pending, in flight or done) covers it.
    pub(crate) coalesced: bool,
}

/// The end of one fetch: the branch tip it saw, or why it failed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct FetchReport {
    pub(crate) generation: u64,
    pub(crate) result: Result<CommitSha, String>,
}

#[derive(Default)]
struct State {
    /// A fetch was asked for and has not started yet.
    pending: bool,
    /// Fetches started so far.
    started: u64,
    /// SHAs named by requests the pending fetch answers.
    waiting: HashSet<CommitSha>,
    /// SHA → generation of the fetch that covers it, oldest first in `covered_order`.
    covered: HashMap<CommitSha, u64>,
    covered_order: VecDeque<CommitSha>,
    /// Why the pending fetch runs, and why the last started one did.
    pending_origin: Option<RequestOrigin>,
    started_origin: Option<RequestOrigin>,
}

impl State {
    fn cover(&mut self, commit: CommitSha, generation: u64) {
        if self.covered.insert(commit.clone(), generation).is_none() {
            self.covered_order.push_back(commit);
            while self.covered_order.len() > COVERED_LIMIT {
                if let Some(oldest) = self.covered_order.pop_front() {
                    self.covered.remove(&oldest);
                }
            }
        }
    }
}

struct Shared {
    state: Mutex<State>,
    wake: Notify,
    done: watch::Sender<Option<FetchReport>>,
}

impl Shared {
    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        crate::base::lock(&self.state)
    }
}

/// The sending side: cheap to clone, held by the poller, the HTTP side and the fs watcher.
#[derive(Clone)]
pub struct SyncRequests {
    shared: Arc<Shared>,
}

/// The receiving side, owned by the sync loop.
pub struct SyncRequestReceiver {
    shared: Arc<Shared>,
}

/// A new, empty channel.
pub fn channel() -> (SyncRequests, SyncRequestReceiver) {
    let (done, _) = watch::channel(None);
    let shared = Arc::new(Shared {
        state: Mutex::new(State::default()),
        wake: Notify::new(),
        done,
    });
    (
        SyncRequests {
            shared: shared.clone(),
        },
        SyncRequestReceiver { shared },
    )
}

impl SyncRequests {
    /// Asks for a fetch; returns at once with the ticket of the fetch that will answer.
    pub(crate) fn request(&self, request: SyncRequest) -> Ticket {
        let mut state = self.shared.lock();
        if let Some(commit) = &request.commit
            && let Some(generation) = state.covered.get(commit)
        {
            return Ticket {
                generation: *generation,
                coalesced: true,
            };
        }
        let coalesced = state.pending;
        state.pending = true;
        let outranks = state
            .pending_origin
            .as_ref()
            .is_none_or(|origin| request.reason.rank() >= origin.reason.rank());
        if outranks {
            state.pending_origin = Some(RequestOrigin {
                reason: request.reason,
                actor: request.actor.clone(),
            });
        }
        if let Some(commit) = request.commit
            && state.waiting.len() < COVERED_LIMIT
        {
            state.waiting.insert(commit);
        }
        let ticket = Ticket {
            generation: state.started + 1,
            coalesced,
        };
        drop(state);
        if !coalesced {
            tracing::debug!(reason = ?request.reason, "sync requested");
            self.shared.wake.notify_one();
        }
        ticket
    }

    /// Waits until the fetch of `ticket` (or a later one, which covers it too) has ended,
    /// and returns how the latest one ended.
    pub(crate) async fn fetched(&self, ticket: Ticket) -> FetchReport {
        let mut done = self.shared.done.subscribe();
        loop {
            if let Some(report) = done.borrow_and_update().as_ref()
                && report.generation >= ticket.generation
            {
                return report.clone();
            }
            if done.changed().await.is_err() {
                // Unreachable while `self` holds the sender; wait forever rather than lie.
                std::future::pending::<()>().await;
            }
        }
    }

    /// Fetches started so far.
    pub fn fetches_started(&self) -> u64 {
        self.shared.lock().started
    }
}

impl SyncRequestReceiver {
    /// Waits for a request, then marks a fetch as started and returns its generation. The
    /// caller runs the fetch and reports its end with `finish`.
    pub(crate) async fn next(&mut self) -> u64 {
        let shared = self.shared.clone();
        loop {
            let notified = shared.wake.notified();
            if let Some(generation) = self.try_next() {
                return generation;
            }
            notified.await;
        }
    }

    /// `next` without waiting: starts the pending fetch if a request asked for one, else
    /// `None`. (Requests are recorded before `request` returns, so a test that has seen the
    /// answers of its requests knows at once whether any asked for a fetch.)
    pub fn try_next(&mut self) -> Option<u64> {
        let mut state = self.shared.lock();
        if !state.pending {
            return None;
        }
        state.pending = false;
        state.started += 1;
        state.started_origin = state.pending_origin.take();
        let generation = state.started;
        let waiting: Vec<CommitSha> = state.waiting.drain().collect();
        for commit in waiting {
            state.cover(commit, generation);
        }
        Some(generation)
    }

    /// Why the last fetch `next` started runs (a poll when nothing said otherwise).
    pub(crate) fn started_origin(&self) -> RequestOrigin {
        self.shared
            .lock()
            .started_origin
            .clone()
            .unwrap_or(RequestOrigin {
                reason: SyncReason::Poll,
                actor: None,
            })
    }

    /// Reports the end of fetch `generation`: the tip it saw, or the error.
    pub fn finish(&self, generation: u64, result: Result<CommitSha, String>) {
        {
            let mut state = self.shared.lock();
            match &result {
                Ok(tip) => state.cover(tip.clone(), generation),
                Err(_) => {
                    let state = &mut *state;
                    state
                        .covered
                        .retain(|_, covered_by| *covered_by != generation);
                    let covered = &state.covered;
                    state
                        .covered_order
                        .retain(|commit| covered.contains_key(commit));
                }
            }
        }
        self.shared
            .done
            .send_replace(Some(FetchReport { generation, result }));
    }
}

/// Asks for a sync at once and then every `interval`, `phase` (under `interval`) into each,
/// until shutdown. Sources polled at the same interval get phases spread across it
/// ([`poll_phase`]): their polls take turns on one blocking thread instead of all starting
/// together, each on its own.
pub(crate) async fn poll(
    requests: SyncRequests,
    (interval, phase): (Duration, Duration),
    shutdown: CancellationToken,
) {
    let request = || {
        requests.request(SyncRequest {
            reason: SyncReason::Poll,
            commit: None,
            actor: None,
        })
    };
    request();
    let first = if phase.is_zero() || phase >= interval {
        interval
    } else {
        phase
    };
    let mut ticker = tokio::time::interval_at(tokio::time::Instant::now() + first, interval);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = ticker.tick() => {}
            () = shutdown.cancelled() => return,
        }
        request();
    }
}

/// The phase of the `index`th of `count` sources polled every `interval`: spread evenly
/// across it.
pub(crate) fn poll_phase(interval: Duration, index: usize, count: usize) -> Duration {
    let count = u32::try_from(count.max(1)).unwrap_or(u32::MAX);
    let index = u32::try_from(index).unwrap_or(0) % count;
    interval / count * index
}

/// Watches the refs of a local repository; dropping it stops the watch.
pub(crate) struct LocalWatch {
    _watcher: notify::RecommendedWatcher,
    git_dir: PathBuf,
}

impl LocalWatch {
    /// The git directory watched (`.git` of a working repository, or a bare repository).
    pub(crate) fn git_dir(&self) -> &Path {
        &self.git_dir
    }
}

/// The git directory holding the branches of `url` when it names a repository on this
/// machine: a plain path or a `file://` URL, pointing at a working repository (`.git/`), a
/// linked worktree (a `.git` file; its branches live in the main repository's directory) or
/// a bare repository.
pub(crate) fn local_git_dir(url: &str) -> Option<PathBuf> {
    let path = match url.strip_prefix("file://") {
        Some(path) => PathBuf::from(path),
        None if url.contains("://") => return None,
        None => PathBuf::from(url),
    };
    let dot_git = path.join(".git");
    if dot_git.join("refs").is_dir() {
        return Some(dot_git);
    }
    if dot_git.is_file() {
        // `gitdir: <dir>` and, in that dir, `commondir` naming the shared one (both may be
        // relative).
        let text = std::fs::read_to_string(&dot_git).ok()?;
        let git_dir = path.join(text.trim().strip_prefix("gitdir:")?.trim());
        let common = match std::fs::read_to_string(git_dir.join("commondir")) {
            Ok(common) => git_dir.join(common.trim()),
            Err(_) => git_dir,
        };
        return common.join("refs").is_dir().then_some(common);
    }
    (path.join("refs").is_dir() && path.join("HEAD").is_file()).then_some(path)
}

/// Starts watching the refs of the local repository at `git_dir`: any change of a branch,
/// `packed-refs` or `HEAD` asks for a sync at once. Git writes a ref through `<ref>.lock` and
/// a rename, so lock files themselves are ignored.
pub(crate) fn watch_local_repo(
    git_dir: &Path,
    requests: SyncRequests,
) -> notify::Result<LocalWatch> {
    use notify::Watcher as _;
    let refs = git_dir.join("refs");
    let git_dir_for_events = git_dir.to_owned();
    let mut watcher =
        notify::recommended_watcher(move |event: notify::Result<notify::Event>| match event {
            Ok(event) if is_ref_change(&git_dir_for_events, &event) => {
                requests.request(SyncRequest {
                    reason: SyncReason::LocalChange,
                    commit: None,
                    actor: None,
                });
            }
            Ok(_) => {}
            Err(error) => tracing::warn!(%error, "watching the local repository failed"),
        })?;
    watcher.watch(&refs, notify::RecursiveMode::Recursive)?;
    watcher.watch(git_dir, notify::RecursiveMode::NonRecursive)?;
    Ok(LocalWatch {
        _watcher: watcher,
        git_dir: git_dir.to_owned(),
    })
}

fn is_ref_change(git_dir: &Path, event: &notify::Event) -> bool {
    if matches!(event.kind, notify::EventKind::Access(_)) {
        return false;
    }
    event.paths.iter().any(|path| {
        let Ok(relative) = path.strip_prefix(git_dir) else {
            return false;
        };
        let is_lock = path
            .extension()
            .is_some_and(|extension| extension == "lock");
        !is_lock
            && (relative.starts_with("refs")
                || relative == Path::new("packed-refs")
                || relative == Path::new("HEAD"))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sha(n: u32) -> CommitSha {
        CommitSha::new(format!("{n:040x}"))
    }

    fn webhook(n: u32) -> SyncRequest {
        SyncRequest {
            reason: SyncReason::Webhook,
            commit: Some(sha(n)),
            actor: None,
        }
    }

    /// A source's polls: at once, then `phase` into each interval; phases spread evenly.
    #[tokio::test(start_paused = true)]
    async fn polls_start_at_once_then_keep_their_phase() {
        let (requests, mut receiver) = channel();
        let shutdown = CancellationToken::new();
        let start = tokio::time::Instant::now();
        let (interval, phase) = (Duration::from_secs(10), Duration::from_secs(3));
        let task = tokio::spawn(poll(requests, (interval, phase), shutdown.clone()));
        let mut asked = Vec::new();
        for _ in 0..3 {
            let generation = receiver.next().await;
            asked.push(start.elapsed());
            receiver.finish(generation, Ok(sha(1)));
        }
        assert_eq!(
            asked,
            [0, 3, 13].map(Duration::from_secs),
            "at once, then at the phase"
        );
        shutdown.cancel();
        assert!(task.await.is_ok());
        let second = Duration::from_secs(1);
        let phases: Vec<Duration> = [0, 1, 50, 99]
            .iter()
            .map(|&index| poll_phase(second, index, 100))
            .collect();
        assert_eq!(phases, [0, 10, 500, 990].map(Duration::from_millis));
        assert_eq!(poll_phase(second, 0, 1), Duration::ZERO);
        assert_eq!(poll_phase(second, 3, 0), Duration::ZERO);
    }

    #[tokio::test]
    async fn requests_before_a_fetch_starts_join_it() {
        let (requests, mut receiver) = channel();
        let first = requests.request(webhook(1));
        let second = requests.request(webhook(2));
        let poll = requests.request(SyncRequest {
            reason: SyncReason::Poll,
            commit: None,
            actor: None,
        });
        assert_eq!(
            (first.coalesced, second.coalesced, poll.coalesced),
            (false, true, true)
        );
        assert_eq!(receiver.next().await, 1);
        assert!([first, second, poll].iter().all(|t| t.generation == 1));
        // Both named SHAs are covered by fetch 1 now: asking again starts nothing.
        let again = requests.request(webhook(2));
        assert_eq!(
            again,
            Ticket {
                generation: 1,
                coalesced: true
            }
        );
        assert!(!requests.shared.lock().pending);
    }

    #[tokio::test]
    async fn a_new_sha_during_a_fetch_gets_exactly_one_more_fetch() {
        let (requests, mut receiver) = channel();
        requests.request(webhook(1));
        let generation = receiver.next().await;
        // While fetch 1 runs, a burst names a SHA it may not see.
        let tickets: Vec<Ticket> = (0..1000).map(|_| requests.request(webhook(2))).collect();
        assert!(!tickets[0].coalesced);
        assert!(tickets[1..].iter().all(|ticket| ticket.coalesced));
        assert!(tickets.iter().all(|ticket| ticket.generation == 2));
        receiver.finish(generation, Ok(sha(1)));
        assert_eq!(receiver.next().await, 2);
        receiver.finish(2, Ok(sha(2)));
        assert_eq!(requests.fetches_started(), 2);
        // The tip a fetch saw counts as covered too.
        assert!(requests.request(webhook(2)).coalesced);
        assert!(!requests.shared.lock().pending);
    }

    #[tokio::test]
    async fn a_fetch_keeps_the_most_specific_reason_of_its_requests() {
        let (requests, mut receiver) = channel();
        let ask = |reason, actor: Option<&str>| {
            requests.request(SyncRequest {
                reason,
                commit: None,
                actor: actor.map(ToOwned::to_owned),
            })
        };
        ask(SyncReason::Poll, None);
        ask(SyncReason::Webhook, Some("octocat"));
        ask(SyncReason::Poll, None);
        ask(SyncReason::LocalChange, None);
        receiver.next().await;
        assert_eq!(
            receiver.started_origin(),
            RequestOrigin {
                reason: SyncReason::Webhook,
                actor: Some("octocat".into())
            }
        );
        ask(SyncReason::Poll, None);
        receiver.next().await;
        assert_eq!(receiver.started_origin().reason, SyncReason::Poll);
        // The latest of equally specific requests names the actor.
        ask(SyncReason::Webhook, Some("a"));
        ask(SyncReason::Cli, Some("root"));
        receiver.next().await;
        assert_eq!(receiver.started_origin().actor.as_deref(), Some("root"));
    }

    #[tokio::test]
    async fn a_failed_fetch_forgets_what_it_covered() {
        let (requests, mut receiver) = channel();
        requests.request(webhook(1));
        let generation = receiver.next().await;
        receiver.finish(generation, Err("network down".into()));
        let retry = requests.request(webhook(1));
        assert_eq!(
            retry,
            Ticket {
                generation: 2,
                coalesced: false
            }
        );
    }

    #[tokio::test]
    async fn fetched_waits_for_the_tickets_fetch_and_reports_its_end() {
        let (requests, mut receiver) = channel();
        let ticket = requests.request(webhook(7));
        let waiter = tokio::spawn({
            let requests = requests.clone();
            async move { requests.fetched(ticket).await }
        });
        let generation = receiver.next().await;
        tokio::task::yield_now().await;
        assert!(!waiter.is_finished(), "the fetch has not ended yet");
        receiver.finish(generation, Ok(sha(7)));
        let report = waiter.await.expect("waiter task");
        assert_eq!(report.result, Ok(sha(7)));
        assert_eq!(report.generation, 1);
        // A ticket for a finished fetch is answered at once.
        assert_eq!(requests.fetched(ticket).await.generation, 1);
    }

    #[tokio::test]
    async fn remembered_shas_are_bounded() {
        let (requests, mut receiver) = channel();
        for round in 0..3u32 {
            for n in 0..2000 {
                requests.request(webhook(round * 10_000 + n));
            }
            let generation = receiver.next().await;
            receiver.finish(generation, Ok(sha(round)));
        }
        let state = requests.shared.lock();
        assert!(state.covered.len() <= COVERED_LIMIT);
        assert_eq!(state.covered.len(), state.covered_order.len());
        assert!(state.waiting.is_empty());
    }

    /// The sync loop's side of the channel: takes each fetch, lets the senders run a little
    /// (the fetch "takes time"), and reports the branch tip in `tip` as what it saw.
    async fn sync_loop(mut receiver: SyncRequestReceiver, tip: Arc<Mutex<CommitSha>>) {
        loop {
            let generation = receiver.next().await;
            for _ in 0..10 {
                tokio::task::yield_now().await;
            }
            let seen = tip.lock().expect("tip lock").clone();
            receiver.finish(generation, Ok(seen));
        }
    }

    /// `senders` concurrent tasks send `count` webhooks naming `shas` in turn (as the HTTP
    /// side does for each push it accepts); returns every ticket, and the most SHAs any
    /// sender ever saw waiting on the pending fetch.
    async fn flood(
        requests: &SyncRequests,
        shas: &[CommitSha],
        count: usize,
        senders: usize,
    ) -> (Vec<Ticket>, usize) {
        let tasks: Vec<_> = (0..senders)
            .map(|sender| {
                let requests = requests.clone();
                let shas = shas.to_vec();
                tokio::spawn(async move {
                    let mut tickets = Vec::new();
                    let mut most_waiting = 0;
                    for index in (sender..count).step_by(senders) {
                        tickets.push(requests.request(SyncRequest {
                            reason: SyncReason::Webhook,
                            commit: Some(shas[index % shas.len()].clone()),
                            actor: None,
                        }));
                        most_waiting = most_waiting.max(requests.shared.lock().waiting.len());
                        tokio::task::yield_now().await;
                    }
                    (tickets, most_waiting)
                })
            })
            .collect();
        let mut tickets = Vec::new();
        let mut most_waiting = 0;
        for task in tasks {
            let (sent, waiting) = task.await.expect("sender task");
            tickets.extend(sent);
            most_waiting = most_waiting.max(waiting);
        }
        (tickets, most_waiting)
    }

    /// Moved down from the HTTP suite's 12,000-request flood (the HTTP side maps each
    /// webhook to one `request`; `http::a_handful_of_webhooks_for_a_new_commit_fetch_once`
    /// keeps the path through the router): 10,000 webhooks for three new commits, from 200
    /// concurrent senders while the sync loop fetches, are all answered and cost at most one
    /// fetch per SHA, with at most three requests starting one; what waits on the pending
    /// fetch stays bounded by the SHAs named, never a queue of requests; then 2,000 more for
    /// one further commit cost exactly one fetch.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_flood_of_webhooks_fetches_once_per_sha() {
        let (requests, receiver) = channel();
        let shas: Vec<CommitSha> = (2..=4).map(sha).collect();
        let tip = Arc::new(Mutex::new(sha(4)));
        let sync = tokio::spawn(sync_loop(receiver, tip.clone()));

        let (tickets, most_waiting) = flood(&requests, &shas, 10_000, 200).await;
        assert_eq!(tickets.len(), 10_000);
        let last = tickets
            .iter()
            .copied()
            .max_by_key(|ticket| ticket.generation)
            .expect("tickets");
        let report = requests.fetched(last).await;
        assert_eq!(report.result, Ok(sha(4)), "the tip is fetched");
        let fetches = requests.fetches_started();
        assert!(
            (1..=3).contains(&fetches),
            "{fetches} fetches for 3 new SHAs"
        );
        let accepted = tickets.iter().filter(|ticket| !ticket.coalesced).count();
        assert!(accepted <= 3, "{accepted} requests started a fetch");
        assert!(most_waiting <= shas.len(), "{most_waiting} SHAs waiting");
        {
            let state = requests.shared.lock();
            assert!(!state.pending && state.waiting.is_empty());
            assert!(state.covered.len() <= shas.len() && state.covered_order.len() <= shas.len());
        }

        *tip.lock().expect("tip lock") = sha(5);
        let (tickets, _) = flood(&requests, &[sha(5)], 2_000, 200).await;
        assert_eq!(tickets.len(), 2_000);
        assert_eq!(
            tickets.iter().filter(|ticket| !ticket.coalesced).count(),
            1,
            "one request starts the fetch"
        );
        assert!(
            tickets
                .iter()
                .all(|ticket| ticket.generation == fetches + 1)
        );
        assert_eq!(requests.fetched(tickets[0]).await.result, Ok(sha(5)));
        assert_eq!(
            requests.fetches_started() - fetches,
            1,
            "one fetch for one SHA"
        );
        sync.abort();
    }

    #[test]
    fn only_ref_changes_outside_lock_files_count() {
        let git_dir = Path::new("/r/.git");
        let event = |path: &str| {
            notify::Event::new(notify::EventKind::Create(notify::event::CreateKind::File))
                .add_path(PathBuf::from(path))
        };
        assert!(is_ref_change(git_dir, &event("/r/.git/refs/heads/main")));
        assert!(is_ref_change(git_dir, &event("/r/.git/packed-refs")));
        assert!(!is_ref_change(
            git_dir,
            &event("/r/.git/refs/heads/main.lock")
        ));
        assert!(!is_ref_change(git_dir, &event("/r/.git/index")));
        assert!(!is_ref_change(git_dir, &event("/r/web.hcl")));
    }

    #[test]
    fn local_git_dirs_are_found_for_paths_and_file_urls_only() -> std::io::Result<()> {
        let dir = tempfile::tempdir()?;
        let work = dir.path().join("work");
        std::fs::create_dir_all(work.join(".git/refs"))?;
        let bare = dir.path().join("bare.git");
        std::fs::create_dir_all(bare.join("refs"))?;
        std::fs::write(bare.join("HEAD"), "ref: refs/heads/main\n")?;
        assert_eq!(
            local_git_dir(&work.display().to_string()),
            Some(work.join(".git"))
        );
        assert_eq!(
            local_git_dir(&format!("file://{}", bare.display())),
            Some(bare.clone())
        );
        // A linked worktree: `.git` is a file; branches live in the main repository.
        let linked = dir.path().join("linked");
        std::fs::create_dir_all(work.join(".git/worktrees/linked"))?;
        std::fs::write(work.join(".git/worktrees/linked/commondir"), "../..\n")?;
        std::fs::create_dir_all(&linked)?;
        std::fs::write(
            linked.join(".git"),
            format!("gitdir: {}\n", work.join(".git/worktrees/linked").display()),
        )?;
        let found =
            local_git_dir(&linked.display().to_string()).ok_or(std::io::ErrorKind::NotFound)?;
        assert_eq!(found.canonicalize()?, work.join(".git").canonicalize()?);
        assert_eq!(local_git_dir("https://example.invalid/repo.git"), None);
        assert_eq!(local_git_dir(&dir.path().display().to_string()), None);
        Ok(())
    }
}
