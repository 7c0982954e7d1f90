//! The agent's own containers, held in memory: listed once, then kept current by their events
//! and by the agent's own writes, so a pass reads its resource's containers without asking
//! the engine to walk every container on the host (a label filter makes moby copy and test
//! each one; an id is looked up in its index).
//!
//! `Informer` wraps the runtime the agent drives and answers the same verbs:
//! - a list of the agent's whole scope (`voodu.agent=<id>`, the drift resync's list) goes to
//!   the engine and replaces what is held;
//! - a narrower list of that scope (one resource's containers) is answered from what is
//!   held, after re-reading, by id, the containers of that answer's labels that something
//!   touched since they were last read;
//! - the agent's container events come from one engine stream that the informer reads: it
//!   marks the container of each event that can change a listing (not an exec or a health
//!   check run) touched before it hands the event on, so a pass an event queues reads after
//!   the mark;
//! - create, start, stop, remove and wait mark their container touched when they return;
//! - everything else passes through (`forward!`).
//!
//! Invariants: a list never answers from a read older than an event it was handed or a
//! write that returned before it began (a list waits for another's read of a container its
//! answer could hold, and a read cut short leaves its containers touched); once the
//! event stream broke or ended, what is held is dropped as the next list opens a new stream,
//! and that list reads everything again;
//! with container events off (`--no-container-events`) nothing is held and every list goes to
//! the engine.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use futures_util::StreamExt as _;
use tokio::sync::broadcast;

use super::forward::forward;
use super::{
    Container, ContainerSpec, Containers, Error, Event, Events, Result, Runtime, Swarm, labels,
};

/// Events a slow subscriber may fall behind by before it is told it missed some (and
/// resyncs, as after a broken stream).
const SUBSCRIBER_BACKLOG: usize = 1024;

/// Labels, as a container carries them.
type Labels = BTreeMap<String, String>;

/// The agent's containers, in memory; see the module's documentation.
pub struct Informer<R> {
    inner: Arc<R>,
    agent: String,
    enabled: bool,
    shared: Arc<Shared>,
    /// One list of the whole scope at a time (the first, a resync's, one after a break).
    relisting: tokio::sync::Mutex<()>,
}

struct Shared {
    state: Mutex<State>,
    /// Each event the stream brought, after its container was marked; `None` when it broke.
    heard: broadcast::Sender<Option<Event>>,
    /// Told when a read of touched containers ends.
    read: tokio::sync::Notify,
}

/// When a container was touched (`State::touches` then), and its labels if known.
type Touch = (u64, Option<Labels>);

#[derive(Default)]
struct State {
    /// Every container of the agent, by id, as read while the current stream was open;
    /// `None` before the first list and once a new stream opened.
    held: Option<BTreeMap<String, Container>>,
    /// Containers touched since they were last read (an event carries their labels, a create
    /// names them; a start, stop, remove or wait leaves them to what is held).
    touched: BTreeMap<String, Touch>,
    /// Touched containers a list is reading anew: a list whose answer could hold one waits
    /// for that read instead of answering with what was held before.
    reading: BTreeMap<String, Touch>,
    touches: u64,
    /// Counts the streams opened; `streaming`: the last one is open.
    generation: u64,
    streaming: bool,
    pump: Option<tokio::task::AbortHandle>,
}

impl State {
    /// Whether a touched container could be in `filter`'s answer: its labels, if known
    /// (from the touch or from what is held), are selected by it.
    fn could_hold(&self, filter: &[(&str, &str)], id: &str, labels: Option<&Labels>) -> bool {
        labels
            .or_else(|| Some(&self.held.as_ref()?.get(id)?.labels))
            .is_none_or(|labels| selects(filter, labels))
    }
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn touch(&self, id: &str, labels: Option<Labels>) {
        let mut state = self.lock();
        state.touches += 1;
        let at = state.touches;
        let entry = state.touched.entry(id.to_owned()).or_default();
        entry.0 = at;
        if labels.is_some() {
            entry.1 = labels;
        }
    }
}

/// Touched containers taken for a read; dropped unread (an error, a cancelled list), they are
/// touched again, so the next list reads them.
struct Reading<'a> {
    shared: &'a Shared,
    taken: Vec<(String, Touch)>,
}

impl Reading<'_> {
    /// Ends the read with what the engine said of the taken containers.
    fn done(mut self, fresh: Vec<Container>, agent: &str) {
        let taken = std::mem::take(&mut self.taken);
        let mut state = self.shared.lock();
        for (id, _) in &taken {
            state.reading.remove(id);
        }
        if let Some(held) = &mut state.held {
            for (id, _) in &taken {
                held.remove(id);
            }
            for container in fresh {
                if container.label(labels::AGENT) == Some(agent) {
                    held.insert(container.id.clone(), container);
                }
            }
        }
        drop(state);
        self.shared.read.notify_waiters();
    }
}

impl Drop for Reading<'_> {
    fn drop(&mut self) {
        if self.taken.is_empty() {
            return;
        }
        let mut state = self.shared.lock();
        for (id, touch) in self.taken.drain(..) {
            state.reading.remove(&id);
            // Touched again meanwhile: that touch is the newer.
            state.touched.entry(id).or_insert(touch);
        }
        drop(state);
        self.shared.read.notify_waiters();
    }
}

impl<R: Runtime> Informer<R> {
    /// Holds the containers labelled `voodu.agent=<agent>` when `enabled` (container events
    /// on); else passes everything through.
    pub fn new(inner: Arc<R>, agent: &str, enabled: bool) -> Informer<R> {
        Informer {
            inner,
            agent: agent.to_owned(),
            enabled,
            shared: Arc::new(Shared {
                state: Mutex::new(State::default()),
                heard: broadcast::channel(SUBSCRIBER_BACKLOG).0,
                read: tokio::sync::Notify::new(),
            }),
            relisting: tokio::sync::Mutex::new(()),
        }
    }

    fn scope(&self) -> [(&str, &str); 1] {
        [(labels::AGENT, self.agent.as_str())]
    }

    /// Whether `filter` asks for the agent's containers (and so can be answered from memory).
    fn within_scope(&self, filter: &[(&str, &str)]) -> bool {
        self.enabled && filter.contains(&(labels::AGENT, self.agent.as_str()))
    }

    /// The open stream's generation, opening one if none is.
    fn stream(&self) -> u64 {
        let mut state = self.shared.lock();
        if !state.streaming {
            state.generation += 1;
            state.streaming = true;
            // What the last stream missed is not known: everything is read again.
            state.held = None;
            // Opened here; the engine replays from the start of this second at the first poll,
            // so a list made after this sees nothing the stream then misses.
            let events = self.inner.events(&self.scope());
            // The last pump has ended: only its end sets `streaming` back.
            let task = tokio::spawn(pump(events, Arc::clone(&self.shared), state.generation));
            state.pump = Some(task.abort_handle());
        }
        state.generation
    }

    /// Lists the whole scope from the engine and holds it, if the stream of `generation` is
    /// still open; touches from before the list began are settled by it.
    async fn relist(&self, generation: u64) -> Result<Vec<Container>> {
        let before = self.shared.lock().touches;
        let all = self.inner.list(&self.scope()).await?;
        let mut state = self.shared.lock();
        if state.streaming && state.generation == generation {
            state.held = Some(crate::model::map_of(
                all.iter()
                    .map(|container| (container.id.clone(), container.clone())),
            ));
            state.touched.retain(|_, (at, _)| *at > before);
        }
        Ok(all)
    }

    /// Takes the touched containers `filter`'s answer could hold, once no other list is
    /// reading one of them.
    async fn take_touched(&self, filter: &[(&str, &str)]) -> Reading<'_> {
        loop {
            let read = self.shared.read.notified();
            tokio::pin!(read);
            read.as_mut().enable();
            {
                let mut state = self.shared.lock();
                let busy = state
                    .reading
                    .iter()
                    .any(|(id, (_, labels))| state.could_hold(filter, id, labels.as_ref()));
                if !busy {
                    let wanted: Vec<String> = state
                        .touched
                        .iter()
                        .filter(|(id, (_, labels))| state.could_hold(filter, id, labels.as_ref()))
                        .map(|(id, _)| id.clone())
                        .collect();
                    let mut taken = Vec::with_capacity(wanted.len());
                    for id in wanted {
                        if let Some(touch) = state.touched.remove(&id) {
                            state.reading.insert(id.clone(), touch.clone());
                            taken.push((id, touch));
                        }
                    }
                    return Reading {
                        shared: &self.shared,
                        taken,
                    };
                }
            }
            read.await;
        }
    }

    /// Answers `filter` (within scope, narrower than it) from memory.
    async fn list_held(&self, filter: &[(&str, &str)]) -> Result<Vec<Container>> {
        let generation = self.stream();
        if self.shared.lock().held.is_none() {
            let _one = self.relisting.lock().await;
            if self.shared.lock().held.is_none() {
                let all = self.relist(generation).await?;
                if self.shared.lock().held.is_none() {
                    // The stream broke meanwhile: this answer is the engine's; nothing is held.
                    return Ok(all
                        .into_iter()
                        .filter(|container| selects(filter, &container.labels))
                        .collect());
                }
            }
        }
        let reading = self.take_touched(filter).await;
        if !reading.taken.is_empty() {
            let ids: Vec<String> = reading.taken.iter().map(|(id, _)| id.clone()).collect();
            let fresh = self.inner.list_by_id(&ids).await?;
            reading.done(fresh, &self.agent);
        }
        let answer = self.shared.lock().held.as_ref().map(|held| {
            held.values()
                .filter(|container| selects(filter, &container.labels))
                .cloned()
                .collect()
        });
        match answer {
            Some(answer) => Ok(answer),
            // A new stream opened meanwhile.
            None => self.inner.list(filter).await,
        }
    }
}

impl<R> Drop for Informer<R> {
    fn drop(&mut self) {
        if let Some(pump) = self.shared.lock().pump.take() {
            pump.abort();
        }
    }
}

/// Whether `labels` hold every `(key, value)` of `filter`.
fn selects(filter: &[(&str, &str)], labels: &Labels) -> bool {
    filter
        .iter()
        .all(|(key, value)| labels.get(*key).map(String::as_str) == Some(*value))
}

/// Container event actions that leave what a list shows (name, image, labels, state) as it
/// was: an exec probe's runs, a health check's, a log attach. Any other action, one not
/// known here too, has its container read anew.
const UNLISTED_ACTIONS: &[&str] = &[
    "attach",
    "detach",
    "resize",
    "top",
    "export",
    "commit",
    "copy",
    "archive-path",
    "extract-to-dir",
];

fn changes_listing(action: &str) -> bool {
    // `exec_create: sh -c …`, `health_status: healthy`: the engine appends details.
    let verb = action.split(':').next().unwrap_or(action).trim();
    !(UNLISTED_ACTIONS.contains(&verb) || verb.starts_with("exec_") || verb == "health_status")
}

/// Reads the agent's container events until the stream breaks or ends: marks each one's
/// container touched, then hands the event on.
async fn pump(mut events: Events, shared: Arc<Shared>, generation: u64) {
    while let Some(event) = events.next().await {
        match event {
            Ok(event) => {
                if changes_listing(&event.action) {
                    shared.touch(&event.id, Some(event.labels.clone()));
                }
                // No subscriber is fine.
                let _ = shared.heard.send(Some(event));
            }
            Err(error) => {
                tracing::debug!(%error, "container events interrupted; what is held is dropped");
                break;
            }
        }
    }
    {
        let mut state = shared.lock();
        if state.generation == generation {
            // What is held is dropped when the next stream opens (`stream`).
            state.streaming = false;
        }
    }
    let _ = shared.heard.send(None);
}

impl<R: Runtime> Containers for Informer<R> {
    forward!(
        inner: list_by_id, ensure_network, inspect, logs, log_stream, exec, exec_piped, volume_path, ensure_volume, list_volumes,
        remove_volume, image_present, image_info, pull, cpu_percent, connect_network,
        remove_network
    );

    async fn list(&self, filter: &[(&str, &str)]) -> Result<Vec<Container>> {
        if !self.within_scope(filter) {
            return self.inner.list(filter).await;
        }
        if filter.len() == 1 {
            // The whole scope: from the engine, and held from now on.
            let generation = self.stream();
            let _one = self.relisting.lock().await;
            return self.relist(generation).await;
        }
        self.list_held(filter).await
    }

    async fn create(&self, spec: &ContainerSpec) -> Result<String> {
        let id = self.inner.create(spec).await?;
        self.shared.touch(&id, Some(spec.labels.clone()));
        Ok(id)
    }

    async fn start(&self, id: &str) -> Result<()> {
        let result = self.inner.start(id).await;
        self.shared.touch(id, None);
        result
    }

    async fn remove(&self, id: &str) -> Result<()> {
        let result = self.inner.remove(id).await;
        self.shared.touch(id, None);
        result
    }

    async fn stop(&self, id: &str, grace: Duration) -> Result<()> {
        let result = self.inner.stop(id, grace).await;
        self.shared.touch(id, None);
        result
    }

    async fn wait(&self, id: &str) -> Result<i64> {
        let result = self.inner.wait(id).await;
        self.shared.touch(id, None);
        result
    }

    fn events(&self, filter: &[(&str, &str)]) -> Events {
        if !(self.within_scope(filter) && filter.len() == 1) {
            return self.inner.events(filter);
        }
        // Subscribed before the stream is opened, so its end is not missed.
        let heard = self.shared.heard.subscribe();
        self.stream();
        Box::pin(futures_util::stream::unfold(
            heard,
            |mut heard| async move {
                let item = match heard.recv().await {
                    Ok(Some(event)) => Ok(event),
                    Ok(None) => Err(Error::Unavailable {
                        message: "the container event stream was interrupted".to_owned(),
                    }),
                    Err(broadcast::error::RecvError::Lagged(missed)) => Err(Error::Unavailable {
                        message: format!("fell {missed} container events behind"),
                    }),
                    Err(broadcast::error::RecvError::Closed) => return None,
                };
                Some((item, heard))
            },
        ))
    }
}

impl<R: Runtime> Swarm for Informer<R> {
    forward!(
        inner: swarm_node, list_nodes, ensure_overlay, list_services, create_service,
        update_service, remove_service, list_tasks, task_logs, create_config, list_configs,
        remove_config
    );
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::runtime::{ContainerState, FakeRuntime};

    type TestResult = std::result::Result<(), Box<dyn std::error::Error>>;

    const AGENT: &str = "agent-1";
    const SCOPE: [(&str, &str); 1] = [(labels::AGENT, AGENT)];

    fn replica(name: &str, resource: &str) -> ContainerSpec {
        ContainerSpec {
            name: name.to_owned(),
            image: "img".to_owned(),
            command: Some(vec!["sleep".to_owned(), "300".to_owned()]),
            labels: BTreeMap::from([
                (labels::AGENT.to_owned(), AGENT.to_owned()),
                (labels::NAME.to_owned(), resource.to_owned()),
            ]),
            ..ContainerSpec::default()
        }
    }

    /// The names and states of `resource`'s containers, as `runtime` lists them.
    async fn seen(runtime: &impl Runtime, resource: &str) -> Result<Vec<(String, ContainerState)>> {
        let mut seen: Vec<_> = runtime
            .list(&[(labels::AGENT, AGENT), (labels::NAME, resource)])
            .await?
            .into_iter()
            .map(|container| (container.name, container.state))
            .collect();
        seen.sort_unstable_by(|a, b| a.0.cmp(&b.0));
        Ok(seen)
    }

    /// The engine calls made so far that start with `verb ` (`list`, `list_by_id`).
    fn calls(fake: &FakeRuntime, verb: &str) -> Vec<String> {
        let prefix = format!("{verb} ");
        fake.calls()
            .into_iter()
            .filter(|call| call.starts_with(&prefix))
            .collect()
    }

    /// Waits (bounded) for `action` of container `id` on `events`.
    async fn heard(events: &mut Events, id: &str, action: &str) -> TestResult {
        let wait = Duration::from_secs(5);
        loop {
            let event = tokio::time::timeout(wait, events.next())
                .await
                .map_err(|_| format!("no {action} of {id} within {wait:?}"))?
                .ok_or("the event stream ended")??;
            if event.id == id && event.action == action {
                return Ok(());
            }
        }
    }

    #[tokio::test]
    async fn a_resource_s_containers_come_from_memory_and_what_the_agent_touched_is_read_by_id()
    -> TestResult {
        let fake = Arc::new(FakeRuntime::new());
        let informer = Informer::new(Arc::clone(&fake), AGENT, true);
        // As the agent starts: one list of everything it owns (none yet).
        assert_eq!(informer.list(&SCOPE).await?, []);
        let web = informer.create(&replica("web-1", "web")).await?;
        informer.start(&web).await?;
        let db = informer.create(&replica("db-1", "db")).await?;

        let web_seen = vec![("web-1".to_owned(), ContainerState::Running)];
        let db_seen = vec![("db-1".to_owned(), ContainerState::Created)];
        assert_eq!(seen(&informer, "web").await?, web_seen);
        assert_eq!(seen(&informer, "db").await?, db_seen);
        // No list of the agent's scope beyond the first; each resource's touched containers
        // by id, each once.
        assert_eq!(calls(&fake, "list"), ["list voodu.agent=agent-1"]);
        assert_eq!(
            calls(&fake, "list_by_id"),
            [format!("list_by_id {web}"), format!("list_by_id {db}")]
        );
        // Nothing touched since: no engine call at all, and the same answer as the engine's.
        let before = fake.calls().len();
        assert_eq!(seen(&informer, "web").await?, web_seen);
        assert_eq!(fake.calls().len(), before);
        assert_eq!(seen(fake.as_ref(), "web").await?, web_seen);

        // The whole scope (the drift resync's list) is the engine's every time.
        assert_eq!(informer.list(&SCOPE).await?.len(), 2);
        assert_eq!(
            calls(&fake, "list"),
            [
                "list voodu.agent=agent-1",
                // This test's own, from the fake directly.
                "list voodu.agent=agent-1,voodu.name=web",
                "list voodu.agent=agent-1"
            ]
        );
        assert_eq!(calls(&fake, "list_by_id").len(), 2);
        Ok(())
    }

    #[tokio::test]
    async fn what_another_client_did_is_seen_once_its_event_was_handed_on() -> TestResult {
        let fake = Arc::new(FakeRuntime::new());
        let informer = Informer::new(Arc::clone(&fake), AGENT, true);
        let mut events = informer.events(&SCOPE);
        let web = informer.create(&replica("web-1", "web")).await?;
        informer.start(&web).await?;
        assert_eq!(
            seen(&informer, "web").await?,
            [("web-1".to_owned(), ContainerState::Running)]
        );

        // Not through the informer: the container exits, then is removed, then another one
        // is made, as by hand.
        fake.exit(&web);
        heard(&mut events, &web, "die").await?;
        assert_eq!(
            seen(&informer, "web").await?,
            [("web-1".to_owned(), ContainerState::Exited)]
        );
        fake.remove(&web).await?;
        heard(&mut events, &web, "destroy").await?;
        assert_eq!(seen(&informer, "web").await?, []);
        let other = fake.create(&replica("web-2", "web")).await?;
        heard(&mut events, &other, "create").await?;
        assert_eq!(
            seen(&informer, "web").await?,
            [("web-2".to_owned(), ContainerState::Created)]
        );
        assert_eq!(calls(&fake, "list"), ["list voodu.agent=agent-1"]);
        Ok(())
    }

    #[tokio::test]
    async fn a_broken_event_stream_drops_what_is_held_and_the_next_list_reads_everything()
    -> TestResult {
        let fake = Arc::new(FakeRuntime::new());
        let informer = Informer::new(Arc::clone(&fake), AGENT, true);
        let mut events = informer.events(&SCOPE);
        informer.create(&replica("web-1", "web")).await?;
        assert_eq!(seen(&informer, "web").await?.len(), 1);

        fake.interrupt_events();
        loop {
            match tokio::time::timeout(Duration::from_secs(5), events.next()).await? {
                Some(Ok(_)) => {}
                Some(Err(Error::Unavailable { .. })) => break,
                other => return Err(format!("expected the stream to break: {other:?}").into()),
            }
        }
        // Made while nobody heard: only a list of everything finds it.
        fake.create(&replica("web-2", "web")).await?;
        assert_eq!(
            seen(&informer, "web").await?,
            [
                ("web-1".to_owned(), ContainerState::Created),
                ("web-2".to_owned(), ContainerState::Created)
            ]
        );
        assert_eq!(calls(&fake, "list").len(), 2);
        Ok(())
    }

    #[tokio::test]
    async fn a_read_that_failed_leaves_its_containers_for_the_next_list() -> TestResult {
        let fake = Arc::new(FakeRuntime::new());
        let informer = Informer::new(Arc::clone(&fake), AGENT, true);
        informer.list(&SCOPE).await?;
        let web = informer.create(&replica("web-1", "web")).await?;
        fake.inject(
            "list_by_id",
            crate::runtime::fake::Fault::Fail(Error::Unavailable {
                message: "engine busy".to_owned(),
            }),
        );
        assert!(seen(&informer, "web").await.is_err());
        assert_eq!(
            seen(&informer, "web").await?,
            [("web-1".to_owned(), ContainerState::Created)]
        );
        assert_eq!(
            calls(&fake, "list_by_id"),
            [format!("list_by_id {web}"), format!("list_by_id {web}")]
        );
        Ok(())
    }

    #[tokio::test(start_paused = true)]
    async fn a_list_waits_for_another_s_read_of_a_container_it_could_hold() -> TestResult {
        let fake = Arc::new(FakeRuntime::new());
        let informer = Informer::new(Arc::clone(&fake), AGENT, true);
        informer.list(&SCOPE).await?;
        informer.create(&replica("web-1", "web")).await?;
        informer.create(&replica("db-1", "db")).await?;
        // Their `create` events touch them again: let the pump take those first.
        for _ in 0..3 {
            tokio::task::yield_now().await;
        }
        fake.set_read_latency(Duration::from_secs(1));
        // The first takes web-1 to read it; the second must not answer before that read ends,
        // and the third (another resource) reads db-1 meanwhile, without waiting for it.
        let start = tokio::time::Instant::now();
        let third = async {
            let answer = seen(&informer, "db").await;
            (answer, start.elapsed())
        };
        let (first, second, (third, third_took)) =
            tokio::join!(seen(&informer, "web"), seen(&informer, "web"), third);
        let web = vec![("web-1".to_owned(), ContainerState::Created)];
        assert_eq!((first?, second?), (web.clone(), web));
        assert_eq!(third?, [("db-1".to_owned(), ContainerState::Created)]);
        assert_eq!(third_took, Duration::from_secs(1));
        assert_eq!(calls(&fake, "list_by_id").len(), 2);
        Ok(())
    }

    #[test]
    fn only_actions_that_can_change_a_listing_touch_a_container() {
        for action in [
            "create", "start", "restart", "die", "stop", "kill", "destroy", "rename",
        ] {
            assert!(changes_listing(action), "{action}");
        }
        for action in [
            "exec_create: sh -c true",
            "exec_die",
            "health_status: healthy",
            "attach",
        ] {
            assert!(!changes_listing(action), "{action}");
        }
    }

    #[tokio::test]
    async fn with_container_events_off_every_list_goes_to_the_engine() -> TestResult {
        let fake = Arc::new(FakeRuntime::new());
        let informer = Informer::new(Arc::clone(&fake), AGENT, false);
        informer.create(&replica("web-1", "web")).await?;
        seen(&informer, "web").await?;
        seen(&informer, "web").await?;
        assert_eq!(
            calls(&fake, "list"),
            [
                "list voodu.agent=agent-1,voodu.name=web",
                "list voodu.agent=agent-1,voodu.name=web"
            ]
        );
        Ok(())
    }
}
